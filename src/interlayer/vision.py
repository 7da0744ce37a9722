"""Kept for compatibility: the image models are :mod:`interlayer.models.vision`."""
from .models.vision import (BACKBONES, VISION_FIELDS, VISION_PRESETS, ConvMixer, ImageClassifier, VisionConfig,
                            build_vision_model, create_vision_model, get_vision_config, vision_config_from_dict)

__all__ = ["BACKBONES", "VISION_FIELDS", "VISION_PRESETS", "ConvMixer", "ImageClassifier", "VisionConfig",
           "build_vision_model", "create_vision_model", "get_vision_config", "vision_config_from_dict"]
