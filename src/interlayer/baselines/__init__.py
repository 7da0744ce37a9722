"""Non-Transformer baselines of the papers' tables. Importing this package registers their model types with
:func:`interlayer.checkpoint.load_pretrained`."""
from .cnn_text import CNNTextClassifier, CNNTextConfig
from .gat import GAT, GATConfig

__all__ = ["CNNTextClassifier", "CNNTextConfig", "GAT", "GATConfig"]
