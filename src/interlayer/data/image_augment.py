"""Training augmentations of uint8 image batches ``(B, C, H, W)``, each drawn from a seeded ``torch.Generator`` (so a
resumed run sees the same images): the small-budget ones (padded random crops, horizontal flips) and the ones Swin's
recipe names (Liu et al. Sec. 4.1, after DeiT: RandomResizedCrop, RandAugment, random erasing, Mixup and CutMix;
stochastic depth and label smoothing live in the model and the loss).

Where a choice is timm's (the library Swin's code trains with), it is named; the ops work on tensors, not PIL images,
so they match timm's in kind and range, not bit for bit:

* :func:`random_resized_crop`: area in [0.08, 1] of the image, aspect ratio log-uniform in [3/4, 4/3], ten tries
  then the centre crop (torchvision's rule), resized back bilinearly.
* :func:`rand_augment`: ``ops`` operations per image drawn from timm's "increasing" set (``rand-m9-mstd0.5-inc1``:
  AutoContrast, Equalize, Invert, Rotate, Posterize, Solarize, SolarizeAdd, Color, Contrast, Brightness,
  Sharpness, ShearX/Y, TranslateX/Y), each applied with probability 1/2 at magnitude ``N(m, std)`` clipped to [0,
  10]; geometric ops fill with grey 128.
* :func:`random_erasing`: with probability ``p`` one rectangle of 2-33% of the area (aspect ratio log-uniform in
  [0.3, 3.3]) is filled with random bytes (timm's "pixel" mode draws normal values after normalisation; these are
  drawn before it, in pixel units).
* :func:`mix`: Mixup (``lam ~ Beta(a, a)``, images blended) or CutMix (a box of area ``1 - lam`` pasted, ``lam``
  corrected to the box), one of them per batch (each with probability 1/2 when both are on, timm's switch), each
  image with the batch's reversed order (timm's pairing); the loss is ``lam L(y) + (1 - lam) L(y_pair)``.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

FILL = 128.0  # timm's fill of the pixels geometric ops uncover


def _uniform(generator: torch.Generator, low: float = 0.0, high: float = 1.0) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


def crop_flip(images: Tensor, mode: str, padding: int, generator: torch.Generator) -> Tensor:
    """Random crops after zero padding (``crop`` in ``mode``) and/or horizontal flips (``flip``, probability 1/2)."""
    b, c, h, w = images.shape
    if "crop" in mode and padding:
        padded = F.pad(images, (padding, padding, padding, padding))
        dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
        dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
        rows = (dy[:, None] + torch.arange(h))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w))[:, None, None, :]
        images = padded[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
    if "flip" in mode:
        flip = torch.rand(b, generator=generator) < 0.5
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    return images


def random_resized_crop(images: Tensor, generator: torch.Generator, scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Tensor:
    """Each image cropped to a random area and aspect ratio, resized back to its size (bilinear)."""
    _, _, h, w = images.shape
    out = torch.empty_like(images)
    for i, image in enumerate(images):
        top, left, height, width = _crop_box(h, w, generator, scale, ratio)
        crop = image[None, :, top:top + height, left:left + width].float()
        out[i] = F.interpolate(crop, size=(h, w), mode="bilinear", align_corners=False)[0].round().clamp(0, 255)
    return out


def _crop_box(h: int, w: int, generator: torch.Generator, scale: tuple[float, float], ratio: tuple[float, float]
              ) -> tuple[int, int, int, int]:
    for _ in range(10):
        area = h * w * _uniform(generator, *scale)
        aspect = math.exp(_uniform(generator, math.log(ratio[0]), math.log(ratio[1])))
        width, height = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < width <= w and 0 < height <= h:
            top = int(torch.randint(0, h - height + 1, (), generator=generator))
            left = int(torch.randint(0, w - width + 1, (), generator=generator))
            return top, left, height, width
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side


# -- RandAugment --------------------------------------------------------------------------------------------------
def _grey(x: Tensor) -> Tensor:
    """Luma ``(1, H, W)`` of a ``(C, H, W)`` float image (ITU-R 601, PIL's "L"); a grey image is its own."""
    if x.shape[0] == 1:
        return x
    return (0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2])[None]


def _blend(x: Tensor, other: Tensor, factor: float) -> Tensor:
    return (other + factor * (x - other)).clamp(0, 255)


def _affine(x: Tensor, matrix: list[float]) -> Tensor:
    """``x`` resampled through the 2 x 3 ``matrix`` in normalised coordinates (output -> input), grey fill."""
    theta = torch.tensor(matrix, dtype=x.dtype).view(1, 2, 3)
    grid = F.affine_grid(theta, [1, *x.shape], align_corners=False)
    return F.grid_sample(x[None] - FILL, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0] + FILL


def _equalize(x: Tensor) -> Tensor:
    """Per-channel histogram equalisation (each channel's cumulative histogram stretched over 0..255)."""
    out = torch.empty_like(x)
    for c, channel in enumerate(x.round().long()):
        counts = torch.bincount(channel.flatten(), minlength=256).cumsum(0).float()
        first = counts[counts > 0][0]
        if counts[-1] == first:  # one grey level: nothing to spread
            out[c] = channel.float()
            continue
        lut = ((counts - first) / (counts[-1] - first) * 255).clamp(0, 255).round()
        out[c] = lut[channel]
    return out


def _sharpness(x: Tensor, factor: float) -> Tensor:
    """PIL's SHARPEN blend: the interior blurred by [[1,1,1],[1,5,1],[1,1,1]]/13, the border kept."""
    kernel = torch.tensor([[1.0, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13
    blurred = F.conv2d(x[:, None], kernel.view(1, 1, 3, 3), padding=1)[:, 0]
    smooth = x.clone()
    smooth[:, 1:-1, 1:-1] = blurred[:, 1:-1, 1:-1]
    return _blend(x, smooth, factor)


def _signed(value: float, generator: torch.Generator) -> float:
    return value if _uniform(generator) < 0.5 else -value


def _ops() -> dict[str, Callable[[Tensor, float, torch.Generator], Tensor]]:
    """timm's increasing set, each ``op(image, magnitude / 10, generator)`` on a float ``(C, H, W)`` in [0, 255]."""
    def enhance(blend_with: Callable[[Tensor], Tensor]) -> Callable[[Tensor, float, torch.Generator], Tensor]:
        return lambda x, m, g: _blend(x, blend_with(x), 1.0 + _signed(0.9 * m, g))

    def translate(axis: int) -> Callable[[Tensor, float, torch.Generator], Tensor]:
        def op(x: Tensor, m: float, g: torch.Generator) -> Tensor:
            shift = 2 * _signed(0.45 * m, g)  # a fraction of the size; normalised coordinates span 2
            return _affine(x, [1, 0, shift, 0, 1, 0] if axis else [1, 0, 0, 0, 1, shift])
        return op

    def shear(axis: int) -> Callable[[Tensor, float, torch.Generator], Tensor]:
        def op(x: Tensor, m: float, g: torch.Generator) -> Tensor:
            s = _signed(0.3 * m, g) * x.shape[1 if axis else 2] / x.shape[2 if axis else 1]
            return _affine(x, [1, s, 0, 0, 1, 0] if axis else [1, 0, 0, s, 1, 0])
        return op

    def rotate(x: Tensor, m: float, g: torch.Generator) -> Tensor:
        angle = math.radians(_signed(30 * m, g))
        aspect = x.shape[1] / x.shape[2]
        cos, sin = math.cos(angle), math.sin(angle)
        return _affine(x, [cos, -sin * aspect, 0, sin / aspect, cos, 0])

    def posterize(x: Tensor, m: float, g: torch.Generator) -> Tensor:
        bits = 4 - int(m * 4)
        return (x.round().long() & (0xFF << (8 - max(bits, 1)) & 0xFF)).float()

    def autocontrast(x: Tensor, m: float, g: torch.Generator) -> Tensor:
        low, high = x.amin(dim=(1, 2), keepdim=True), x.amax(dim=(1, 2), keepdim=True)
        return torch.where(high > low, (x - low) * 255 / (high - low).clamp_min(1e-6), x)

    return {
        "AutoContrast": autocontrast,
        "Equalize": lambda x, m, g: _equalize(x),
        "Invert": lambda x, m, g: 255 - x,
        "Rotate": rotate,
        "Posterize": posterize,
        "Solarize": lambda x, m, g: torch.where(x >= 256 - int(m * 256), 255 - x, x),
        "SolarizeAdd": lambda x, m, g: torch.where(x < 128, (x + int(m * 110)).clamp(max=255), x),
        "Color": enhance(lambda x: _grey(x).expand_as(x)),
        "Contrast": enhance(lambda x: _grey(x).mean().expand_as(x)),
        "Brightness": enhance(torch.zeros_like),
        "Sharpness": lambda x, m, g: _sharpness(x, 1.0 + _signed(0.9 * m, g)),
        "ShearX": shear(0), "ShearY": shear(1), "TranslateX": translate(1), "TranslateY": translate(0),
    }


RAND_OPS = _ops()


def rand_augment(images: Tensor, generator: torch.Generator, ops: int = 2, magnitude: float = 9.0,
                 std: float = 0.5) -> Tensor:
    """RandAugment (Cubuk et al. 2020) as timm's ``rand-m{magnitude}-mstd{std}-inc1`` draws it, per image."""
    names = list(RAND_OPS)
    out = torch.empty_like(images)
    for i, image in enumerate(images):
        x = image.float()
        for _ in range(ops):
            op = names[int(torch.randint(0, len(names), (), generator=generator))]
            if _uniform(generator) >= 0.5:
                continue
            m = magnitude + std * float(torch.randn((), generator=generator)) if std else magnitude
            x = RAND_OPS[op](x, min(max(m, 0.0), 10.0) / 10.0, generator).clamp(0, 255)
        out[i] = x.round().to(images.dtype)
    return out


def random_erasing(images: Tensor, generator: torch.Generator, probability: float) -> Tensor:
    """Random Erasing (Zhong et al. 2020): per image, with ``probability``, one box of random bytes."""
    out = images.clone()
    _, c, h, w = images.shape
    for i in range(len(images)):
        if _uniform(generator) >= probability:
            continue
        for _ in range(10):
            area = h * w * _uniform(generator, 0.02, 1 / 3)
            aspect = math.exp(_uniform(generator, math.log(0.3), math.log(1 / 0.3)))
            height, width = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < height < h and 0 < width < w:
                top = int(torch.randint(0, h - height + 1, (), generator=generator))
                left = int(torch.randint(0, w - width + 1, (), generator=generator))
                out[i, :, top:top + height, left:left + width] = torch.randint(
                    0, 256, (c, height, width), generator=generator, dtype=images.dtype)
                break
    return out


def mix(images: Tensor, labels: Tensor, seed: int, mixup: float, cutmix: float
        ) -> tuple[Tensor, Optional[tuple[Tensor, Tensor]]]:
    """Mixup (``mixup``: Beta's alpha) or CutMix (``cutmix``) of the batch with its reverse; 0 turns one off. Returns
    the images and ``(paired labels, lam)`` (``lam`` a 0-dim tensor), or None when neither is on."""
    if not (mixup or cutmix):
        return images, None
    rng = np.random.RandomState(seed % 2 ** 32)
    use_cutmix = bool(cutmix) and (not mixup or rng.rand() < 0.5)
    lam = float(rng.beta(cutmix, cutmix) if use_cutmix else rng.beta(mixup, mixup))
    paired = images.flip(0)
    if use_cutmix:
        _, _, h, w = images.shape
        cut_h, cut_w = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = rng.randint(h), rng.randint(w)
        top, bottom = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, h)
        left, right = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, w)
        images = images.clone()
        images[:, :, top:bottom, left:right] = paired[:, :, top:bottom, left:right]
        lam = 1.0 - (bottom - top) * (right - left) / (h * w)
    else:
        images = (lam * images.float() + (1 - lam) * paired.float()).round().to(images.dtype)
    return images, (labels.flip(0), torch.tensor(lam))
