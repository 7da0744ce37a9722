"""The training engine shared by every task: optimisation, logging, checkpoints, resumption."""
from .config import TrainConfig
from .engine import Trainer

__all__ = ["TrainConfig", "Trainer"]
