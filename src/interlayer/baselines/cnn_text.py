"""Kept for compatibility: the text CNN is :mod:`interlayer.models.cnn_text`."""
from ..models.cnn_text import MODEL_TYPE, CNNTextClassifier, CNNTextConfig

__all__ = ["MODEL_TYPE", "CNNTextClassifier", "CNNTextConfig"]
