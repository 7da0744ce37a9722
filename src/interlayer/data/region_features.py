"""Region features with their boxes, as captioning and referring-expression models read them.

A detector's export for one image is its regions' features, their boxes and the image size: the ``.npz`` files of
bottom-up attention (Anderson et al. 2018) as its PyTorch re-implementations write them (``x``: (regions, 2048),
or MCAN's transposed (2048, regions); ``bbox``: (regions, 4) as x1, y1, x2, y2 in pixels; ``image_w``,
``image_h``; ``num_bbox`` ignored), one file per image in a folder, found by name as the VQA reader finds them
(:class:`~interlayer.data.vqa_formats.NpzDirectory`: ``COCO_val2014_000000391895.jpg.npz`` answers to image
``391895``). Every file is read strictly: the feature array's shape and values as for VQA, a box array of the same
number of rows with finite, ordered corners inside the image (a pixel of slack for rounding), positive image sizes.

A model reads each box as ``(x1/W, y1/H, x2/W, y2/H, area/(W H))`` (:meth:`Regions.box_features`). An image keeps
its first ``max_regions`` regions (detectors list them by confidence), which are then put in raster order of their
box centres (top to bottom, left to right): the order of the generated scenes, so that a convolution over a region
stack's attention map (Predictive Attention) mixes regions that are near in the image.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..fileio import confined
from .vqa_formats import NpzDirectory, as_regions

BOX_SLACK = 1.0  # pixels a box may reach past the image border (detectors round outwards)


@dataclass
class Regions:
    """One image's regions: features (R, F) float32, boxes (R, 4) x1, y1, x2, y2 in pixels, the image size."""

    features: np.ndarray
    boxes: np.ndarray
    width: float
    height: float

    def box_features(self) -> np.ndarray:
        """(R, 5): x1/W, y1/H, x2/W, y2/H, area/(W H)."""
        scale = np.array([self.width, self.height, self.width, self.height], dtype=np.float32)
        corners = self.boxes / scale
        area = (corners[:, 2] - corners[:, 0]) * (corners[:, 3] - corners[:, 1])
        return np.concatenate([corners, area[:, None]], axis=1).astype(np.float32)

    def ordered(self, max_regions: int) -> "Regions":
        """The first ``max_regions`` regions in raster order of their box centres (module docstring)."""
        boxes, features = self.boxes[:max_regions], self.features[:max_regions]
        order = np.lexsort((boxes[:, 0] + boxes[:, 2], boxes[:, 1] + boxes[:, 3]))
        return Regions(features[order], boxes[order], self.width, self.height)


class RegionStore(Protocol):
    """Regions by image key."""

    def __contains__(self, key: str) -> bool: ...

    def regions(self, key: str) -> Regions: ...


class MemoryRegions:
    """Regions held in memory (the generated scenes)."""

    def __init__(self, regions: dict[str, Regions]) -> None:
        self.items = regions

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def regions(self, key: str) -> Regions:
        return self.items[key]


def check_boxes(boxes: np.ndarray, count: int, width: float, height: float, where: str) -> np.ndarray:
    """``boxes`` as (count, 4) float32 x1 <= x2, y1 <= y2 inside the image (with :data:`BOX_SLACK`), or a
    :class:`DataError` naming ``where``."""
    if boxes.ndim != 2 or boxes.shape != (count, 4):
        raise DataError(f"{where}: bbox of shape {boxes.shape}; expected ({count}, 4) (x1, y1, x2, y2 per region, "
                        "as many rows as features)")
    if not np.issubdtype(boxes.dtype, np.number) or not np.isfinite(boxes).all():
        raise DataError(f"{where}: bbox holds values that are not finite numbers")
    boxes = boxes.astype(np.float32)
    bad = np.flatnonzero((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1]) | (boxes[:, :2] < -BOX_SLACK).any(1)
                         | (boxes[:, 2] > width + BOX_SLACK) | (boxes[:, 3] > height + BOX_SLACK))
    if len(bad):
        raise DataError(f"{where}: box {int(bad[0])} {boxes[bad[0]].tolist()} is not x1 <= x2, y1 <= y2 inside the "
                        f"{width:g} x {height:g} image ({len(bad)} such boxes)")
    return boxes


def _scalar(data: np.lib.npyio.NpzFile, names: Sequence[str], where: str) -> float:
    name = next((n for n in names if n in data.files), None)
    if name is None:
        raise DataError(f"{where}: no image size {' / '.join(names)} (found {data.files}); the boxes are normalised "
                        "by it")
    value = np.asarray(data[name])
    if value.size != 1 or not np.issubdtype(value.dtype, np.number) or not np.isfinite(value).all() or value <= 0:
        raise DataError(f"{where}: {name}={value.tolist()!r} must be one positive number")
    return float(value.reshape(()))


class NpzRegions(NpzDirectory):
    """A folder of bottom-up-attention ``.npz`` files, each read with its boxes and image size (module docstring)."""

    def regions(self, key: str) -> Regions:
        path = confined(self.paths[key], self.folder, DataError)
        where = str(self.paths[key])
        try:
            with np.load(path, allow_pickle=False) as data:
                name = next((k for k in ("x", "features") if k in data.files), None)
                if name is None or "bbox" not in data.files:
                    raise DataError(f"{where}: needs the arrays 'x' (or 'features') and 'bbox' (found {data.files})")
                features = as_regions(data[name], self.feature_dim, where)
                width = _scalar(data, ("image_w", "image_width"), where)
                height = _scalar(data, ("image_h", "image_height"), where)
                boxes = check_boxes(np.asarray(data["bbox"]), len(features), width, height, where)
        except (OSError, ValueError) as err:
            if isinstance(err, DataError):
                raise
            raise DataError(f"{where}: not a readable .npz file ({err})") from None
        return Regions(features, boxes, width, height)


def open_regions(folder: Path, feature_dim: int) -> NpzRegions:
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; region features are a folder of .npz files (x, bbox, image_w, "
                        "image_h per image)")
    return NpzRegions(folder, feature_dim)


def check_regions(keys: Sequence[str], store: RegionStore, source: str) -> None:
    """Every image has regions, each file read once and checked, before anything is built (as the VQA reader's
    ``check_images``); errors name the file and the image."""
    for key in keys:
        if key not in store:
            raise DataError(f"{source}: image {key} has no region features in the feature folder")
    for key in dict.fromkeys(keys):
        store.regions(key)


def region_batch(images: Sequence[Regions], max_regions: int) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """(features (B, R, F), box features (B, R, 5), padding (B, R) True at padding or None when every image has R
    regions) of images each ordered and cut to ``max_regions``."""
    kept = [image.ordered(max_regions) for image in images]
    count = max(len(r.features) for r in kept)
    features = torch.zeros(len(kept), count, kept[0].features.shape[1])
    boxes = torch.zeros(len(kept), count, 5)
    padding = torch.ones(len(kept), count, dtype=torch.bool)
    for i, regions in enumerate(kept):
        n = len(regions.features)
        features[i, :n] = torch.from_numpy(regions.features)
        boxes[i, :n] = torch.from_numpy(regions.box_features())
        padding[i, :n] = False
    return features, boxes, padding if bool(padding.any()) else None
