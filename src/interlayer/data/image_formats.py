"""Labelled image sets in their standard pickle-free forms, read strictly into ``(N, C, H, W)`` uint8 arrays.

* ``idx``: MNIST / Fashion-MNIST's IDX files (:mod:`interlayer.data.idx`).
* ``cifar``: the "binary version" of CIFAR-10 (``data_batch_1..5.bin``, ``test_batch.bin``, ``batches.meta.txt``:
  records of 1 label byte + 3,072 pixel bytes) and CIFAR-100 (``train.bin``, ``test.bin``,
  ``fine_label_names.txt``, ``coarse_label_names.txt``: 2 label bytes, coarse then fine, + 3,072), each image
  channel-major, rows in order (Krizhevsky 2009, the data set's page). The Python versions are pickles, which
  interlayer never reads.
* ``npz``: one ``.npz`` with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (Keras's names; images ``(N, H, W)``,
  ``(N, H, W, C)`` or ``(N, C, H, W)`` uint8, labels integers) and optionally ``class_names`` (strings), read
  with ``allow_pickle=False``, so an array of objects is refused.
* ``folder``: an ImageFolder layout, ``DIR/train/CLASS/*.png`` (or ``.jpg``, ``.jpeg``, ``.bmp``, ``.gif``, ``.webp``,
  ``.ppm``, ``.pgm``, ``.tif``, ``.tiff``) and ``DIR/test/CLASS/*`` (``val/`` if there is no ``test/``), classes
  named by the training split's folders in sorted order (torchvision's ``ImageFolder`` rule). Decoded with Pillow
  (the optional dependency of ``pip install interlayer[image]``); every file is read through
  :func:`~interlayer.fileio.confined` (no link leads out of ``DIR``). Grey images stay one channel unless some image
  of the set has colour (then every image is RGB); sizes must agree unless ``size`` resizes them (bilinear).

Every problem raises :class:`DataError` naming the file (and record or offset) and what would be valid.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Literal, Optional, Sequence

import numpy as np

from ..errors import DataError
from ..fileio import confined
from .idx import read_labelled_images

Format = Literal["idx", "cifar", "npz", "folder"]
Split = Literal["train", "test"]
CIFAR10_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_PIXELS = 3 * 32 * 32
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff")
NPZ_KEYS = {"train": ("x_train", "y_train"), "test": ("x_test", "y_test")}


def detect_format(path: Path, idx_train_images: str) -> Format:
    """The format of the data at ``path`` (a folder, or an ``.npz`` file): the first layout whose files are there."""
    if path.is_file() and path.suffix == ".npz":
        return "npz"
    if not path.is_dir():
        raise DataError(f"{path}: no such folder (nor an .npz file); set data.dir to the data's folder")
    if any((path / name).is_file() for name in (idx_train_images, idx_train_images + ".gz")):
        return "idx"
    if (path / CIFAR10_TRAIN[0]).is_file() or (path / "train.bin").is_file():
        return "cifar"
    if (path / "train").is_dir():
        return "folder"
    if len(list(path.glob("*.npz"))) == 1:
        return "npz"
    raise DataError(f"{path}: cannot tell the format: no IDX training file ({idx_train_images}[.gz]), no CIFAR "
                    f"binary batches ({CIFAR10_TRAIN[0]} or train.bin), no train/ folder and not one .npz file; "
                    "set data.format")


# -- CIFAR binary -------------------------------------------------------------------------------------------------
def cifar_files(root: Path, split: Split) -> tuple[list[Path], int]:
    """The binary batches of ``split`` and the label bytes per record (1: CIFAR-10, 2: CIFAR-100)."""
    if (root / "train.bin").is_file():
        return [root / ("train.bin" if split == "train" else "test.bin")], 2
    return [root / name for name in (CIFAR10_TRAIN if split == "train" else ("test_batch.bin",))], 1


def read_cifar(root: Path, split: Split, labels: Literal["fine", "coarse"] = "fine"
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(N, 3, 32, 32)`` uint8 images and int64 labels of a CIFAR binary split (CIFAR-100: ``fine`` or
    ``coarse``)."""
    files, label_bytes = cifar_files(root, split)
    if label_bytes == 1 and labels == "coarse":
        raise DataError(f"{root}: CIFAR-10 has one set of labels; data.cifar_labels='coarse' is CIFAR-100's")
    record = label_bytes + CIFAR_PIXELS
    images, targets = [], []
    for path in files:
        data = np.frombuffer(confined(path, root, DataError).read_bytes(), dtype=np.uint8)
        if len(data) == 0 or len(data) % record:
            raise DataError(f"{path}: {len(data)} bytes is not a whole number of {record}-byte records ({label_bytes}"
                            f" label byte(s) + {CIFAR_PIXELS} pixels); the file is truncated or not CIFAR's binary "
                            "version")
        rows = data.reshape(-1, record)
        images.append(rows[:, label_bytes:].reshape(-1, 3, 32, 32))
        targets.append(rows[:, label_bytes - 1 if labels == "fine" else 0].astype(np.int64))
    return np.concatenate(images), np.concatenate(targets)


def cifar_class_names(root: Path, labels: Literal["fine", "coarse"] = "fine") -> list[str]:
    """The names in ``batches.meta.txt`` (CIFAR-10) or ``{fine,coarse}_label_names.txt`` (CIFAR-100), if present."""
    name = "batches.meta.txt" if (root / CIFAR10_TRAIN[0]).is_file() else f"{labels}_label_names.txt"
    path = root / name
    if not path.is_file():
        return []
    return [line.strip() for line in confined(path, root, DataError).read_text("utf-8").splitlines() if line.strip()]


# -- .npz ---------------------------------------------------------------------------------------------------------
def npz_path(path: Path) -> Path:
    return path if path.suffix == ".npz" else next(iter(sorted(path.glob("*.npz"))), path / "data.npz")


def _npz_arrays(path: Path, keys: Sequence[str], optional: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """The arrays ``keys`` (each required) and ``optional`` (where present) of an ``.npz``, without pickles."""
    try:
        with np.load(confined(path, path.parent, DataError), allow_pickle=False) as archive:
            missing = [key for key in keys if key not in archive.files]
            if missing:
                raise DataError(f"{path}: no array {missing[0]!r}; an image .npz holds x_train, y_train, x_test, "
                                f"y_test (and optionally class_names); it has {sorted(archive.files)}")
            return {key: archive[key] for key in [*keys, *optional] if key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:  # object arrays, damaged archives
        raise DataError(f"{path}: cannot read it as a numpy .npz without pickles ({err})") from None


def read_npz(path: Path, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, C, H, W)`` uint8 and int64 labels of one split of an ``.npz`` (``path``: the file, or the folder
    holding it)."""
    path = npz_path(path)
    image_key, label_key = NPZ_KEYS[split]
    arrays = _npz_arrays(path, (image_key, label_key))
    images = channels_first(arrays[image_key], f"{path}[{image_key}]")
    return images, checked_labels(arrays[label_key], len(images), f"{path}[{label_key}]")


def npz_class_names(path: Path) -> list[str]:
    names = _npz_arrays(npz_path(path), (), ("class_names",)).get("class_names")
    return [] if names is None else [str(name) for name in names]


def channels_first(images: np.ndarray, source: str) -> np.ndarray:
    """``(N, H, W)``, ``(N, H, W, C)`` or ``(N, C, H, W)`` uint8 (C in 1, 3) as ``(N, C, H, W)``."""
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataError(f"{source}: expected uint8 images of shape (N, H, W), (N, H, W, C) or (N, C, H, W), got "
                        f"{images.dtype} of shape {images.shape}")
    if images.ndim == 3:
        return images[:, None]
    if images.shape[-1] in (1, 3) and images.shape[1] not in (1, 3):
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    if images.shape[1] in (1, 3):
        return images
    raise DataError(f"{source}: images of shape {images.shape} have neither 1 nor 3 channels first or last")


def checked_labels(labels: np.ndarray, count: int, source: str) -> np.ndarray:
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != count:
        raise DataError(f"{source}: expected {count} integer labels of shape ({count},), got {labels.dtype} of shape "
                        f"{labels.shape}")
    if len(labels) and labels.min() < 0:
        raise DataError(f"{source}: label {int(labels.min())} of example {int(np.argmin(labels))} is negative")
    return labels.astype(np.int64)


# -- ImageFolder --------------------------------------------------------------------------------------------------
def folder_split(root: Path, split: Split) -> Path:
    if split == "train":
        return root / "train"
    return root / "test" if (root / "test").is_dir() else root / "val"


def folder_classes(root: Path) -> list[str]:
    train = folder_split(root, "train")
    if not train.is_dir():
        raise DataError(f"{root}: no train/ folder; an ImageFolder layout is DIR/train/CLASS/IMAGE and "
                        "DIR/test/CLASS/IMAGE")
    classes = sorted(p.name for p in train.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise DataError(f"{train}: found {len(classes)} class folder(s); classification needs at least 2")
    return classes


def read_folder(root: Path, split: Split, classes: Sequence[str], size: Optional[Sequence[int]] = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every image of ``root/split/CLASS/`` for the given ``classes`` (a class folder the training split lacks is
    refused), decoded with Pillow: ``(N, C, H, W)`` uint8 and int64 labels."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise DataError("reading an ImageFolder needs Pillow: pip install 'interlayer[image]' (or pillow)") from None
    base = folder_split(root, split)
    if not base.is_dir():
        raise DataError(f"{root}: no {base.name}/ folder for the {split} split")
    unknown = sorted({p.name for p in base.iterdir() if p.is_dir()} - set(classes))
    if unknown:
        raise DataError(f"{base}: class folder(s) {unknown} are not among the training split's classes "
                        f"{list(classes)}")
    decoded, labels = [], []
    for label, name in enumerate(classes):
        folder = base / name
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
        for path in files:
            try:
                with Image.open(confined(path, root, DataError)) as image:
                    image.load()
                    grey = image.mode in ("1", "L", "I", "I;16", "F")
                    image = image.convert("L" if grey else "RGB")
                    if size:
                        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                    decoded.append((path, np.asarray(image, dtype=np.uint8)))
            except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as err:
                raise DataError(f"{path}: not a readable image ({err})") from None
            labels.append(label)
    if not decoded:
        raise DataError(f"{base}: no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders")
    first_path, first = decoded[0]
    for path, array in decoded:
        if array.shape[:2] != first.shape[:2]:
            raise DataError(f"{path}: {array.shape[1]}x{array.shape[0]} pixels, but {first_path} has "
                            f"{first.shape[1]}x{first.shape[0]}; set data.image_size=[HEIGHT, WIDTH] to resize "
                            "them all")
    colour = any(array.ndim == 3 for _, array in decoded)
    arrays = [np.repeat(a[..., None], 3, -1) if colour and a.ndim == 2 else a for _, a in decoded]
    return channels_first(np.stack(arrays), str(base)), np.asarray(labels, dtype=np.int64)


def read_split(fmt: Format, root: Path, split: Split, *, idx_files: tuple[Path, Path], classes: Sequence[str] = (),
               cifar_labels: Literal["fine", "coarse"] = "fine", size: Optional[Sequence[int]] = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """One split of the data at ``root`` in format ``fmt``: ``(N, C, H, W)`` uint8 images, int64 labels.
    ``idx_files`` are the (images, labels) files of the split when the format is IDX; ``classes`` the class folders
    of an ImageFolder."""
    if fmt == "idx":
        return read_labelled_images(*idx_files)
    if fmt == "cifar":
        return read_cifar(root, split, cifar_labels)
    if fmt == "npz":
        return read_npz(root, split)
    return read_folder(root, split, classes, size)


def class_names(fmt: Format, root: Path, cifar_labels: Literal["fine", "coarse"] = "fine") -> list[str]:
    """The names the data gives its classes (in label order), or [] where it gives none (IDX)."""
    if fmt == "cifar":
        return cifar_class_names(root, cifar_labels)
    if fmt == "npz":
        return npz_class_names(root)
    if fmt == "folder":
        return folder_classes(root)
    return []
