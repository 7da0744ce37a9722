"""Image classification on IDX data (Fashion-MNIST, MNIST): a stand-in for the papers' CIFAR / ImageNet results.

PA Table 3 (CNN / Conv-Transformer / PA-Conv-Transformer on CIFAR) and LW Table IX (Swin-T vs LW-Transformer on
CIFAR-100 / ImageNet) compare architectures at equal training recipes; the project ships no CIFAR or ImageNet, so
the same comparisons run here on Fashion-MNIST (10 classes of 28 x 28 grey clothing images, 60,000 / 10,000).

* Data: ``data.dir`` holds the four IDX files under their publisher's names (``train-images-idx3-ubyte[.gz]``
  ...); the default is a class-balanced 3,000 / 1,000 subset bundled with the package (``SOURCE.md`` says how it
  was drawn), ``--set data.dir=/path/to/fashion-mnist`` reads the full set, and MNIST's files work the same way
  (set ``data.class_names`` to the digits). Every problem in a file raises ``DataError`` naming file and offset.
* Splits: a class-balanced ``valid_fraction`` (default 10%, i.e. 6,000 of 60,000, as PA App. A holds out 5,000 of
  CIFAR's 50,000) of the training file is held out for model selection with a fixed ``split_seed``, so runs with
  different seeds see the same validation images; the test file is scored once, at the end, by the best model.
* Normalisation: the training split's per-channel mean and std, stored in the model config (``pixel_mean``,
  ``pixel_std``) so a saved model scores raw pixels.
* Augmentation: none by default. The papers' CIFAR recipes (cutout, RandAugment, mixup, 300-630 epochs) do not
  transfer to a 12-epoch budget, where augmentation slows convergence more than it helps; random crops and
  horizontal flips are common for Fashion-MNIST but not standard (and flips are wrong for digits). ``augment``
  offers ``flip``, ``crop`` (zero-pad by ``crop_padding``, random window) and ``crop_flip``, drawn from a
  generator seeded per batch from (seed, epoch), so resumed runs see the same augmented images.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds, count_parameters
from ..config_io import check_choices
from ..core.losses import label_smoothed_nll, total_loss
from ..data.idx import read_labelled_images, write_idx
from ..data.parallel import resolve_path
from ..errors import ConfigError, DataError
from ..fileio import read_json, write_atomic
from ..models.registry import get_config, load_pretrained
from ..models.vision import VisionConfig
from ..pretrained.finetune import VISION_FINE_TUNING_DEFAULTS, vision_finetune_config
from ..pretrained.hf import load_checkpoint
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import SampleInput, TaskSpec
from .metrics import confusion_matrix, format_report, percent_correct, percent_correct_tensor, summary

TASK_NAME = "fashion_mnist"
BUNDLED = "bundled:fashion-mnist"
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]
EVAL_BATCH = 1000


@dataclass
class ImageData:
    """Where the IDX files are, how the training file is split, and how images are batched (``data.KEY``)."""

    dir: str = BUNDLED  # a folder with the four files, or bundled:fashion-mnist (the 3,000 / 1,000 subset)
    train_images: str = "train-images-idx3-ubyte"  # names inside ``dir`` (".gz" is tried too), or full paths
    train_labels: str = "train-labels-idx1-ubyte"
    test_images: str = "t10k-images-idx3-ubyte"
    test_labels: str = "t10k-labels-idx1-ubyte"
    valid_fraction: float = 0.1  # class-balanced share of the training file held out for validation
    split_seed: int = 0  # fixed, so every run of a comparison validates on the same images
    batch_size: int = 128  # images per training step
    augment: Literal["none", "flip", "crop", "crop_flip"] = "none"
    crop_padding: int = 2  # pixels of zero padding before a random crop (translations up to +-crop_padding)
    class_names: list[str] = field(default_factory=lambda: list(FASHION_MNIST_CLASSES))
    # A Hugging Face ViT folder to fine-tune (interlayer.pretrained.finetune); empty: train from scratch
    pretrained: str = ""

    def validate(self) -> None:
        check_choices(self, "data.")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction={self.valid_fraction} must lie strictly between 0 and 1 (the "
                              "engine validates every epoch)")
        if self.batch_size < 1:
            raise ConfigError(f"data.batch_size={self.batch_size} must be a positive number of images")
        if self.crop_padding < 0:
            raise ConfigError(f"data.crop_padding={self.crop_padding} must not be negative")
        if len(self.class_names) < 2:
            raise ConfigError(f"data.class_names={self.class_names} must name at least 2 classes")

    def folder(self) -> Path:
        return resolve_path(self.dir)

    def path(self, name: str) -> Path:
        """``name`` inside ``dir`` (absolute names are used as they are), as given or with ``.gz`` added."""
        base = self.folder() / name
        for candidate in (base, base.with_name(base.name + ".gz")):
            if candidate.is_file():
                return candidate
        raise DataError(f"{base}: no such file (nor {base.name}.gz); set data.dir to the folder holding the IDX "
                        f"files, or data.{_field_of(self, name)} to the file")


def _field_of(data: ImageData, name: str) -> str:
    return next(key for key in ("train_images", "train_labels", "test_images", "test_labels")
                if getattr(data, key) == name)


def load_split(images_path: Path, labels_path: Path, num_classes: int) -> tuple[Tensor, Tensor]:
    """uint8 images (N, C, H, W) and int64 labels, every label checked to be a valid class index."""
    images, labels = read_labelled_images(images_path, labels_path)
    if len(labels) == 0:
        raise DataError(f"{labels_path}: the file holds no examples")
    if labels.max() >= num_classes:
        first = int(np.argmax(labels >= num_classes))
        raise DataError(f"{labels_path}: example {first} has label {int(labels[first])}, but there are "
                        f"{num_classes} classes (0..{num_classes - 1}); set data.class_names to name them all")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels)


def stratified_split(labels: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """(train, valid) indices: ``round(fraction * n_c)`` random examples of every class ``c`` go to valid."""
    rng = np.random.RandomState(seed)
    train, valid = [], []
    values = labels.numpy()
    for c in np.unique(values):
        members = rng.permutation(np.flatnonzero(values == c))
        n_valid = int(round(fraction * len(members)))
        valid.append(members[:n_valid])
        train.append(members[n_valid:])
    return torch.from_numpy(np.sort(np.concatenate(train))), torch.from_numpy(np.sort(np.concatenate(valid)))


def channel_stats(images: Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images in ``[0, 1]`` units (float64 sums: 47M pixels)."""
    x = images.double().div_(255.0).transpose(0, 1).reshape(images.shape[1], -1)
    return x.mean(1).tolist(), x.std(1).tolist()


def augment(images: Tensor, mode: str, padding: int, generator: torch.Generator) -> Tensor:
    """Random crops after zero padding and/or horizontal flips (probability 1/2) of uint8 images (B, C, H, W)."""
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


@dataclass
class ImageBatch:
    index: Tensor  # rows of the training split
    seed: int  # seeds this batch's augmentation

    def __len__(self) -> int:
        return len(self.index)


@torch.no_grad()
def predict(model: nn.Module, images: Tensor, batch_size: int = EVAL_BATCH) -> Tensor:
    """Logits (N, classes) in eval mode, in chunks on the model's device; returned on the CPU."""
    model.eval()
    device = module_device(model)
    return torch.cat([model(move(images[i:i + batch_size], device)).logits.float().cpu()
                      for i in range(0, len(images), batch_size)])


class ImageTask:
    """Training and validation splits in memory as uint8 tensors; batches are index lists plus a seed."""

    device = torch.device("cpu")  # the engine sets the training device (Task.device)
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, data: ImageData, train: TrainConfig) -> None:
        data.validate()
        self.data, self.train_cfg = data, train
        images, labels = load_split(data.path(data.train_images), data.path(data.train_labels),
                                    len(data.class_names))
        train_index, valid_index = stratified_split(labels, data.valid_fraction, data.split_seed)
        if len(valid_index) == 0 or len(train_index) == 0:
            raise DataError(f"{data.path(data.train_labels)}: data.valid_fraction={data.valid_fraction} of "
                            f"{len(labels)} examples leaves {len(train_index)} for training and {len(valid_index)} "
                            "for validation; both need some (raise or lower the fraction)")
        self.train_images, self.train_labels = images[train_index], labels[train_index]
        self.valid_images, self.valid_labels = images[valid_index], labels[valid_index]
        self.pixel_mean, self.pixel_std = channel_stats(self.train_images)

    def data_files(self) -> list[tuple[str, Path]]:
        """The four IDX files, by the setting that names them (the run's data fingerprint: experiment.py)."""
        keys = ("train_images", "train_labels", "test_images", "test_labels")
        return [(key, self.data.path(getattr(self.data, key))) for key in keys]

    def model_fields(self) -> dict[str, Any]:
        """The image geometry, the training split's statistics and the number of classes."""
        _, channels, height, width = self.train_images.shape
        return {"image_height": height, "image_width": width, "channels": channels, "pixel_mean": self.pixel_mean,
                "pixel_std": self.pixel_std, "num_classes": len(self.data.class_names)}

    def train_batches(self, epoch: int, seed: int) -> list[ImageBatch]:
        """A permutation of the training split and per-batch augmentation seeds, both from (seed, epoch) only."""
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(len(self.train_labels), generator=generator)
        chunks = order.split(self.data.batch_size)
        seeds = torch.randint(0, 2 ** 62, (len(chunks),), generator=generator).tolist()
        return [ImageBatch(index=chunk, seed=s) for chunk, s in zip(chunks, seeds)]

    def batch_images(self, batch: ImageBatch) -> tuple[Tensor, Tensor]:
        images, labels = self.train_images[batch.index], self.train_labels[batch.index]
        if self.data.augment != "none":
            generator = torch.Generator().manual_seed(batch.seed)
            images = augment(images, self.data.augment, self.data.crop_padding, generator)
        return images, labels

    def prepare(self, batch: ImageBatch) -> tuple[Tensor, Tensor]:
        """The batch's images (augmented on the CPU) and labels; the engine moves them to the device."""
        return self.batch_images(batch)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor], int]:
        images, labels = move(batch, module_device(model))
        output = model(images)
        smoothing = self.train_cfg.label_smoothing
        loss, logs = total_loss(output, lambda logits: label_smoothed_nll(logits, labels, smoothing))
        logs["accuracy"] = percent_correct_tensor(output.logits, labels)
        return loss, logs, len(labels)

    def validate(self, model: nn.Module) -> dict[str, float]:
        logits = predict(model, self.valid_images)
        return {"accuracy": percent_correct(logits, self.valid_labels),
                "nll": float(F.cross_entropy(logits, self.valid_labels))}

    def save_assets(self, directory: Path) -> None:
        directory = Path(directory)
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        write_atomic(directory / "task.json", json.dumps({
            "task": TASK_NAME, "class_names": self.data.class_names, "train_size": len(self.train_labels),
            "valid_size": len(self.valid_labels), "pixel_mean": self.pixel_mean, "pixel_std": self.pixel_std}))


def score(model: nn.Module, images: Tensor, labels: Tensor, names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, NLL, per-class precision/recall/F1 and the confusion matrix of ``model`` on a labelled split."""
    num_classes = model.config.encoder.num_classes
    if int(labels.max()) >= num_classes:
        raise DataError(f"the labels go up to {int(labels.max())} but the model has {num_classes} classes")
    if len(names) != num_classes:
        names = [str(i) for i in range(num_classes)]
    logits = predict(model, images)
    return {**summary(confusion_matrix(labels, logits.argmax(-1), num_classes), names),
            "nll": float(F.cross_entropy(logits, labels))}


def report(metrics: dict[str, Any], source: str) -> str:
    """:func:`score`'s accuracy with its counts, the per-class table and the confusion matrix, as text."""
    head = f"accuracy {metrics['accuracy']:.2f}% ({metrics['correct']}/{metrics['total']}) on {source}"
    return format_report(head, metrics["confusion"], list(metrics["per_class"]), index_columns=True)


def _evaluation_files(data: ImageData, given: Optional[str]) -> tuple[Path, Path]:
    if given is None:
        return data.path(data.test_images), data.path(data.test_labels)
    path = Path(given)
    if path.is_dir():
        folder = ImageData(**{**asdict(data), "dir": str(path)})
        return folder.path(data.test_images), folder.path(data.test_labels)
    if "images-idx3" not in path.name:
        raise DataError(f"{path}: cannot tell where its labels are; pass the folder holding the test files, or "
                        "an images file named like *images-idx3-ubyte[.gz] with *labels-idx1-ubyte[.gz] beside it")
    labels = path.with_name(path.name.replace("images-idx3", "labels-idx1"))
    plain = labels.with_name(labels.name.removesuffix(".gz"))
    for candidate in (labels, plain, plain.with_name(plain.name + ".gz")):
        if candidate.is_file():
            return path, candidate
    raise DataError(f"{path}: its labels file {labels.name} (or {plain.name}[.gz]) is not beside it")


def write_balanced_subset(source: ImageData, out_dir: Path, train_per_class: int, test_per_class: int,
                          seed: int = 0) -> None:
    """Draw the bundled subset: ``n`` random images per class of each file (sorted, so file order is kept),
    written under the publisher's names with gzip. ``SOURCE.md`` records the call that made the shipped one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    for images_name, labels_name, per_class in ((source.train_images, source.train_labels, train_per_class),
                                                (source.test_images, source.test_labels, test_per_class)):
        images, labels = read_labelled_images(source.path(images_name), source.path(labels_name))
        keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:per_class]
                                       for c in np.unique(labels)]))
        write_idx(out_dir / f"{images_name}.gz", images[keep, 0] if images.shape[1] == 1 else images[keep])
        write_idx(out_dir / f"{labels_name}.gz", labels[keep].astype(np.uint8))


# Swin/DeiT-style recipe scaled to a 20-minute, 2-core budget (docs/classification-image.md): Adam without weight
# decay (12 epochs of 54,000 images leave little to regularise), lr 2e-3 for batches of 128 images (1e-3 and 4e-3
# were slightly worse in short probes), 200 warm-up steps (4% of the 5,064 steps on the full set; short enough that
# the bundled subset's 264 steps still decay), linear decay to 0, label smoothing 0.1, 12 epochs. AdamW and a cosine
# decay are options (train.optimizer, train.schedule).
TRAIN_DEFAULTS: dict[str, Any] = dict(lr=2e-3, schedule="linear", warmup_steps=200, betas=[0.9, 0.999],
                                      weight_decay=0.0, label_smoothing=0.1, clip_norm=1.0, max_epochs=12,
                                      patience=0, keep_last=1, average_last=0, log_interval=50)


class ImageClassificationSpec(TaskSpec):
    """Image classification on IDX files (Fashion-MNIST, MNIST): a ViT or convolutional Transformer from scratch, or a
    fine-tuned Hugging Face ViT."""

    name = TASK_NAME
    description = ("image classification, 28x28 grey (default: bundled Fashion-MNIST subset; the full set or MNIST "
                   "with --data-dir PATH)")
    default_preset = "vit_fashion_mnist"
    data_class = ImageData
    train_defaults = TRAIN_DEFAULTS

    def make_task(self, data: ImageData, train: TrainConfig, run_dir: Optional[Path]) -> ImageTask:
        """Nothing to reload on resume: the split and the statistics are recomputed from the data and split_seed."""
        return ImageTask(data, train)

    def finish(self, task: ImageTask, run_dir: Path, state: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Score ``best/`` once on the test file; the report with the confusion matrix goes to ``test_report.txt``."""
        model = load_pretrained(run_dir / "best", task.device)
        data = task.data
        images, labels = load_split(data.path(data.test_images), data.path(data.test_labels), len(data.class_names))
        start = time.perf_counter()
        metrics = score(model, images, labels, data.class_names)
        seconds = time.perf_counter() - start
        write_atomic(run_dir / "test_report.txt", report(metrics, str(data.path(data.test_images))) + "\n")
        return {"test_accuracy": metrics["accuracy"], "test_nll": metrics["nll"],
                "test_per_class": metrics["per_class"], "test_report": "test_report.txt", "test_seconds": seconds,
                "parameters": count_parameters(model), "madds_per_image": count_madds(model, model.config.tokens)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data-dir", metavar="PATH",
                            help="folder with the IDX files, e.g. the full Fashion-MNIST or MNIST (default: the "
                                 "bundled 3,000 / 1,000 Fashion-MNIST subset); same as --set data.dir=PATH")
        parser.add_argument("--pretrained", metavar="DIR",
                            help="fine-tune this Hugging Face ViT folder (images repeated to 3 channels and resized to "
                                 "its size); same as --set data.pretrained=DIR")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        keys = {"data.dir": args.data_dir, "data.pretrained": args.pretrained}
        return {key: value for key, value in keys.items() if value}, {}

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """``interlayer evaluate`` for images: ``--data`` is a folder (its test files) or an images file with its
        labels file beside it (``...images-idx3...`` -> ``...labels-idx1...``); default the run's test files."""
        directory = Path(directory)
        data = self.saved_data(directory)
        names = read_json(directory / "task.json", DataError, within=directory).get("class_names", data.class_names)
        model = load_pretrained(directory, getattr(args, "device", None))
        images_path, labels_path = _evaluation_files(data, args.data)
        images, labels = load_split(images_path, labels_path, model.config.encoder.num_classes)
        cfg = model.config
        expected = (cfg.channels, cfg.image_height, cfg.image_width)
        if tuple(images.shape[1:]) != expected:
            raise DataError(f"{images_path}: images of shape {tuple(images.shape[1:])} (channels, height, width), but "
                            f"the model reads {expected}")
        return report(score(model, images, labels, names), str(images_path))

    def sample_input(self, task: ImageTask) -> SampleInput:
        """The first validation image as model input, for attention-map pictures. No token labels: an image's tokens
        (patches, grid cells, a CLS token) depend on the model, not the data, and 49 cells are too many to label."""
        return (task.valid_images[:1],), {}, []

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: ImageTask) -> VisionConfig:
        """The preset (or a .json/.yaml image-model config) with the data's fields, then the user's overrides. A
        fine-tuning run (``data.pretrained``) takes the checkpoint's ViT, reading the data's images through
        ``input_size`` with the checkpoint's own normalisation."""
        if task.data.pretrained:
            if preset != self.default_preset:
                raise ConfigError(f"--preset {preset} cannot be combined with data.pretrained={task.data.pretrained}: "
                                  "the checkpoint decides the architecture; add a method with --set instead")
            fields = task.model_fields()
            size = [fields["channels"], fields["image_height"], fields["image_width"]]
            return vision_finetune_config(Path(task.data.pretrained), fields["num_classes"], size, model_sets)
        return get_config(get_config(preset, family="image", **task.model_fields()), family="image", **model_sets)

    def defaults_for(self, sets: dict[str, Any]) -> dict[str, Any]:
        """The fine-tuning recipe as the defaults of a run with ``data.pretrained`` (the user's ``--set`` wins)."""
        return dict(VISION_FINE_TUNING_DEFAULTS) if sets.get("data.pretrained") else {}

    def initialise(self, model: nn.Module, task: ImageTask) -> None:
        """A fresh fine-tuning run's model, just built from the seed: load the ViT checkpoint over it (the head and
        what methods add keep their seeded initialisation)."""
        if task.data.pretrained:
            load_checkpoint(model, Path(task.data.pretrained))
