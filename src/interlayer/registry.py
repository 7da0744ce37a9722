"""Kept for compatibility: the registry of every named model is :mod:`interlayer.models.registry` (and
:func:`interlayer.create_model`, :func:`interlayer.get_config`, :func:`interlayer.list_models`).

``PRESETS`` and ``list_presets`` keep their old meaning: the Transformer presets only.
"""
from __future__ import annotations

from .models.registry import Preset, create_model, get_config, list_models, presets

PRESETS: dict[str, Preset] = presets("transformer")


def list_presets() -> list[str]:
    """The Transformer presets' names (``list_models(family="transformer")``)."""
    return list_models(family="transformer")


__all__ = ["PRESETS", "Preset", "create_model", "get_config", "list_presets"]
