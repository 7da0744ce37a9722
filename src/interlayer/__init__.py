"""interlayer: four published ways of making Transformer layers work together or cost less, on one core.

Start with :func:`create_model` (a preset name or config plus overrides), :func:`count_parameters` and
:func:`count_madds`; :func:`save_pretrained` / :func:`load_pretrained` keep the config and tied weights (also as
``model.save_pretrained`` / ``ModelClass.from_pretrained``); :func:`from_hf` / :func:`to_hf` bring Hugging Face
BERT, ELECTRA, RoBERTa, DistilBERT and ViT models in and back out.
"""
from .accounting import count_madds, count_parameters
from .build import build_model
from .checkpoint import CheckpointError, load_pretrained, save_pretrained
from .config import ModelConfig, apply_overrides, config_from_dict
from .core.config import ConfigError
from .registry import PRESETS, create_model, get_config, list_presets

from . import baselines, vision  # noqa: E402,F401  (register the CNN, GAT and image model types with load_pretrained)
from .models import mcan  # noqa: E402,F401  (register the MCAN model type with load_pretrained)
from .pretrained import from_hf, to_hf  # noqa: E402

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "ModelConfig", "PRESETS", "apply_overrides", "build_model",
           "config_from_dict", "count_madds", "count_parameters", "create_model", "from_hf", "get_config",
           "list_presets", "load_pretrained", "save_pretrained", "to_hf"]
