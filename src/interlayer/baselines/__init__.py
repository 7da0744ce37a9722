"""Kept for compatibility: the text CNN and GAT are :mod:`interlayer.models.cnn_text` and
:mod:`interlayer.models.gat`."""
from ..models.cnn_text import CNNTextClassifier, CNNTextConfig
from ..models.gat import GAT, GATConfig

__all__ = ["CNNTextClassifier", "CNNTextConfig", "GAT", "GATConfig"]
