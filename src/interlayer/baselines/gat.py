"""Kept for compatibility: GAT is :mod:`interlayer.models.gat`, its presets :mod:`interlayer.papers.crossformer`."""
from ..models.gat import GAT, SHARING, GATConfig, GATLayer, create_gat, gat_config, with_self_loops
from ..papers.crossformer import GAT_PRESETS

__all__ = ["GAT", "GAT_PRESETS", "GATConfig", "GATLayer", "SHARING", "create_gat", "gat_config",
           "with_self_loops"]
