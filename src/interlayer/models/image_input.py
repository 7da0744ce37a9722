"""What every image model of interlayer shares at its input: the pixels' geometry checked, and their normalisation.

The ViT and Conv-Transformer (:mod:`interlayer.models.vision`), Swin (:mod:`interlayer.models.swin`) and the
attention-augmented ResNets (:mod:`interlayer.models.aa_resnet`) all read ``(B, C, H, W)`` images, uint8 (0..255) or
floats in ``[0, 1]``, and normalise them inside the model with the per-channel ``pixel_mean`` / ``pixel_std`` of
their config (the training split's statistics, filled in by the image task), so a saved model scores raw images
without any other asset.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..core.outputs import one_of
from ..errors import ConfigError


def check_pixels(cfg: Any) -> None:
    """Raise :class:`ConfigError` naming the key of the first geometry or normalisation setting of ``cfg`` (fields
    ``image_height``, ``image_width``, ``channels``, ``pixel_mean``, ``pixel_std``) that cannot work."""
    for key in ("image_height", "image_width", "channels"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{key}={getattr(cfg, key)} must be a positive integer")
    for key in ("pixel_mean", "pixel_std"):
        if len(getattr(cfg, key)) != cfg.channels:
            raise ConfigError(f"{key}={getattr(cfg, key)} needs one value per channel (channels={cfg.channels})")
    if any(s <= 0 for s in cfg.pixel_std):
        raise ConfigError(f"pixel_std={cfg.pixel_std} must be positive")


class PixelNorm(nn.Module):
    """``(x - mean) / std`` per channel, after mapping uint8 pixels to ``[0, 1]``; constants from the config."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        return (x - self.mean) / self.std


def image_input(cfg: Any, images: Optional[Tensor], pixel_values: Optional[Tensor]) -> Tensor:
    """The images given under interlayer's name or Hugging Face's, checked to be ``(B, channels, image_height,
    image_width)`` of ``cfg`` (a :class:`ValueError` naming both shapes otherwise)."""
    images = one_of(images, pixel_values, "images", "pixel_values")
    expected = (cfg.channels, cfg.image_height, cfg.image_width)
    if images.dim() != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(f"expected images of shape (B, {', '.join(map(str, expected))}), got {tuple(images.shape)}")
    return images
