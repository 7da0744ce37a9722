"""Image classification: ``interlayer train image`` (any labelled image set) and ``interlayer train fashion_mnist``.

PA Table 3 (CNN / Conv-Transformer / PA-Conv-Transformer on CIFAR), PA Table 4 (AA-ResNets on ImageNet) and LW
Table IX (Swin-T vs LW-Transformer on CIFAR-100 / ImageNet) compare architectures at equal training recipes. The
project ships Fashion-MNIST (10 classes of 28 x 28 grey clothing images, 60,000 / 10,000), so the comparisons run
on it at CPU scale; CIFAR-10/100 and any image folder a user has are read the same way.

* Data (``data.dir``, ``data.format``): IDX files (MNIST, Fashion-MNIST: the four files under their publisher's
  names, ``.gz`` or not), CIFAR-10/100's binary version, an ``.npz`` (Keras's ``x_train`` ... names) or an
  ImageFolder (``train/CLASS/*``, ``test/CLASS/*``, decoded with Pillow): :mod:`interlayer.data.image_formats`;
  ``auto`` tells them apart by their files. The default is a class-balanced 3,000 / 1,000 Fashion-MNIST subset
  bundled with the package (``SOURCE.md`` says how it was drawn). Every problem in a file raises ``DataError``
  naming the file. Classes are named by ``data.class_names``, else by the data (CIFAR's meta files, the folders,
  the ``.npz``'s ``class_names``), else (IDX) by their numbers; ``fashion_mnist`` names Fashion-MNIST's ten.
* Splits: a class-balanced ``valid_fraction`` (default 10%, i.e. 6,000 of 60,000, as PA App. A holds out 5,000 of
  CIFAR's 50,000) of the training split is held out for model selection with a fixed ``split_seed``, so runs with
  different seeds see the same validation images; the test split is scored once, at the end, by the best model.
* Normalisation: the training split's per-channel mean and std, stored in the model config (``pixel_mean``,
  ``pixel_std``) so a saved model scores raw pixels.
* Augmentation: none by default (a 12-epoch budget gains less from it than it loses in convergence). ``augment``
  offers padded random crops and horizontal flips; Swin's recipe (Sec. 4.1, after DeiT) is there option by option:
  ``resized_crop``, ``randaugment`` (ops per image; Swin: 2 at magnitude 9), ``erasing`` (Swin: 0.25), ``mixup``
  (0.8) and ``cutmix`` (1.0), with label smoothing in ``train.label_smoothing`` and stochastic depth in the Swin
  model (``drop_path``): :mod:`interlayer.data.image_augment`. Each batch draws from a generator seeded from
  (seed, epoch), so resumed runs see the same augmented images.
"""
from __future__ import annotations

import argparse
import dataclasses
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
from ..data.image_augment import crop_flip, mix, rand_augment, random_erasing, random_resized_crop
from ..data.image_formats import Format, class_names, detect_format, folder_classes, read_split
from ..data.parallel import resolve_path
from ..errors import ConfigError, DataError
from ..fileio import read_json, write_atomic
from ..models.aa_resnet import AAResNetConfig
from ..models.registry import get_config, list_models, load_pretrained
from ..models.swin import SwinConfig
from ..models.vision import VisionConfig
from ..pretrained.finetune import VISION_FINE_TUNING_DEFAULTS, vision_finetune_config
from ..pretrained.hf_load import load_checkpoint
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import SampleInput, TaskSpec
from .metrics import confusion_matrix, format_report, percent_correct, percent_correct_tensor, summary

BUNDLED = "bundled:fashion-mnist"
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]
EVAL_BATCH = 1000
# The image model families the tasks build: config class -> registry family
IMAGE_FAMILIES: dict[type, str] = {VisionConfig: "image", SwinConfig: "swin", AAResNetConfig: "aa_resnet"}


@dataclass
class ImageData:
    """Where the images are, how the training split is divided, batched and augmented (``data.KEY``)."""

    dir: str = BUNDLED  # a folder (or an .npz file); bundled:fashion-mnist is the 3,000 / 1,000 subset
    format: Literal["auto", "idx", "cifar", "npz", "folder"] = "auto"  # auto: told apart by the files there
    train_images: str = "train-images-idx3-ubyte"  # IDX: names inside ``dir`` (".gz" is tried too), or full paths
    train_labels: str = "train-labels-idx1-ubyte"
    test_images: str = "t10k-images-idx3-ubyte"
    test_labels: str = "t10k-labels-idx1-ubyte"
    cifar_labels: Literal["fine", "coarse"] = "fine"  # CIFAR-100's 100 classes, or its 20 superclasses
    image_size: list[int] = field(default_factory=list)  # folder: resize every image to [height, width]
    valid_fraction: float = 0.1  # class-balanced share of the training split held out for validation
    split_seed: int = 0  # fixed, so every run of a comparison validates on the same images
    batch_size: int = 128  # images per training step
    augment: Literal["none", "flip", "crop", "crop_flip"] = "none"
    crop_padding: int = 2  # pixels of zero padding before a random crop (translations up to +-crop_padding)
    resized_crop: bool = False  # RandomResizedCrop: area 8-100%, aspect 3/4-4/3, resized back (Swin's recipe)
    randaugment: int = 0  # RandAugment operations per image (Swin: 2); 0: off
    randaugment_magnitude: float = 9.0  # of 10, with a standard deviation of 0.5 per operation (Swin: m9-mstd0.5)
    erasing: float = 0.0  # Random Erasing's probability per image (Swin: 0.25)
    mixup: float = 0.0  # Mixup's Beta alpha (Swin: 0.8); 0: off
    cutmix: float = 0.0  # CutMix's Beta alpha (Swin: 1.0); with mixup on too, one of the two per batch
    class_names: list[str] = field(default_factory=list)  # empty: the data's names, or the classes' numbers
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
        if self.class_names and len(self.class_names) < 2:
            raise ConfigError(f"data.class_names={self.class_names} must name at least 2 classes (or none: the "
                              "data's names)")
        if self.image_size and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ConfigError(f"data.image_size={self.image_size} must be [height, width] in pixels, or [] (the "
                              "images' own size)")
        if self.randaugment < 0 or not 0.0 <= self.randaugment_magnitude <= 10.0:
            raise ConfigError(f"data.randaugment={self.randaugment} must be >= 0 operations and "
                              f"data.randaugment_magnitude={self.randaugment_magnitude} in [0, 10]")
        if not 0.0 <= self.erasing <= 1.0 or self.mixup < 0 or self.cutmix < 0:
            raise ConfigError(f"data.erasing={self.erasing} must be a probability and data.mixup={self.mixup}, "
                              f"data.cutmix={self.cutmix} Beta alphas >= 0 (0: off)")

    def folder(self) -> Path:
        return resolve_path(self.dir)

    def resolved_format(self) -> Format:
        return detect_format(self.folder(), self.train_images) if self.format == "auto" else self.format

    def path(self, name: str) -> Path:
        """``name`` inside ``dir`` (absolute names are used as they are), as given or with ``.gz`` added."""
        base = self.folder() / name
        for candidate in (base, base.with_name(base.name + ".gz")):
            if candidate.is_file():
                return candidate
        raise DataError(f"{base}: no such file (nor {base.name}.gz); set data.dir to the folder holding the IDX "
                        f"files, or data.{_field_of(self, name)} to the file")

    def split(self, split: Literal["train", "test"]) -> tuple[Tensor, Tensor]:
        """uint8 images (N, C, H, W) and int64 labels of ``split``."""
        names = (self.train_images, self.train_labels) if split == "train" else (self.test_images, self.test_labels)
        fmt = self.resolved_format()
        idx_files = (self.path(names[0]), self.path(names[1])) if fmt == "idx" else (Path(), Path())
        classes = folder_classes(self.folder()) if fmt == "folder" else ()
        images, labels = read_split(fmt, self.folder(), split, idx_files=idx_files, classes=classes,
                                    cifar_labels=self.cifar_labels, size=self.image_size or None)
        return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels)

    def names(self, labels: Tensor) -> list[str]:
        """The classes' names: ``class_names``, else the data's, else (IDX) the bundled set's or the numbers up to the
        largest training label."""
        if self.class_names:
            return list(self.class_names)
        given = class_names(self.resolved_format(), self.folder(), self.cifar_labels)
        if given:
            return given
        if self.dir == BUNDLED:
            return list(FASHION_MNIST_CLASSES)
        return [str(i) for i in range(max(int(labels.max()) + 1, 2))]


@dataclass
class FashionMNISTData(ImageData):
    """:class:`ImageData` whose classes are Fashion-MNIST's ten unless named otherwise."""

    class_names: list[str] = field(default_factory=lambda: list(FASHION_MNIST_CLASSES))


def _field_of(data: ImageData, name: str) -> str:
    return next(key for key in ("train_images", "train_labels", "test_images", "test_labels")
                if getattr(data, key) == name)


def load_split(images_path: Path, labels_path: Path, num_classes: int) -> tuple[Tensor, Tensor]:
    """uint8 images (N, C, H, W) and int64 labels of an IDX pair, every label checked to be a valid class index."""
    images, labels = read_labelled_images(images_path, labels_path)
    return check_class_labels(torch.from_numpy(images.copy()), torch.from_numpy(labels), num_classes, str(labels_path))


def check_class_labels(images: Tensor, labels: Tensor, num_classes: int, source: str) -> tuple[Tensor, Tensor]:
    """``(images, labels)`` once every label is known to be a class index below ``num_classes``."""
    if len(labels) == 0:
        raise DataError(f"{source}: the file holds no examples")
    if int(labels.max()) >= num_classes:
        first = int(torch.argmax((labels >= num_classes).int()))
        raise DataError(f"{source}: example {first} has label {int(labels[first])}, but there are "
                        f"{num_classes} classes (0..{num_classes - 1}); set data.class_names to name them all")
    return images, labels


def split_source(data: ImageData, split: Literal["train", "test"]) -> str:
    """Where ``data``'s ``split`` is read from, for messages: its IDX labels file, or the folder (or .npz)."""
    if data.resolved_format() == "idx":
        return str(data.path(data.train_labels if split == "train" else data.test_labels))
    return f"{data.folder()} ({split} split)"


def load_test(data: ImageData, num_classes: int) -> tuple[Tensor, Tensor]:
    """The test split of ``data``, its labels checked to be below ``num_classes``."""
    images, labels = data.split("test")
    return check_class_labels(images, labels, num_classes, split_source(data, "test"))


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

    def __init__(self, data: ImageData, train: TrainConfig, task_name: str = "image") -> None:
        data.validate()
        self.data, self.train_cfg, self.task_name = data, train, task_name
        images, labels = data.split("train")
        if len(labels) == 0:
            raise DataError(f"{split_source(data, 'train')}: the training split holds no examples")
        self.class_names = data.names(labels)
        images, labels = check_class_labels(images, labels, len(self.class_names), split_source(data, "train"))
        train_index, valid_index = stratified_split(labels, data.valid_fraction, data.split_seed)
        if len(valid_index) == 0 or len(train_index) == 0:
            raise DataError(f"{split_source(data, 'train')}: data.valid_fraction={data.valid_fraction} of "
                            f"{len(labels)} examples leaves {len(train_index)} for training and {len(valid_index)} "
                            "for validation; both need some (raise or lower the fraction)")
        self.train_images, self.train_labels = images[train_index], labels[train_index]
        self.valid_images, self.valid_labels = images[valid_index], labels[valid_index]
        self.pixel_mean, self.pixel_std = channel_stats(self.train_images)

    def data_files(self) -> list[tuple[str, Path]]:
        """The files the run reads (the run's data fingerprint: experiment.py): the four IDX files, by the setting
        that names them; for CIFAR binaries, ``.npz`` files and image folders, every file under ``data.dir``, by its
        name inside it."""
        if self.data.resolved_format() != "idx":
            folder = self.data.folder()
            return [(str(path.relative_to(folder)), path) for path in sorted(folder.rglob("*")) if path.is_file()]
        keys = ("train_images", "train_labels", "test_images", "test_labels")
        return [(key, self.data.path(getattr(self.data, key))) for key in keys]

    def model_fields(self) -> dict[str, Any]:
        """The image geometry, the training split's statistics and the number of classes."""
        _, channels, height, width = self.train_images.shape
        return {"image_height": height, "image_width": width, "channels": channels, "pixel_mean": self.pixel_mean,
                "pixel_std": self.pixel_std, "num_classes": len(self.class_names)}

    def train_batches(self, epoch: int, seed: int) -> list[ImageBatch]:
        """A permutation of the training split and per-batch augmentation seeds, both from (seed, epoch) only."""
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(len(self.train_labels), generator=generator)
        chunks = order.split(self.data.batch_size)
        seeds = torch.randint(0, 2 ** 62, (len(chunks),), generator=generator).tolist()
        return [ImageBatch(index=chunk, seed=s) for chunk, s in zip(chunks, seeds)]

    def batch_images(self, batch: ImageBatch) -> tuple[Tensor, Tensor, Optional[tuple[Tensor, Tensor]]]:
        """The batch's images through the augmentations that are on, in timm's order (resized crop, crop/flip,
        RandAugment, erasing, then Mixup/CutMix), its labels, and the mix's paired labels and weight (or None)."""
        data = self.data
        images, labels = self.train_images[batch.index], self.train_labels[batch.index]
        generator = torch.Generator().manual_seed(batch.seed)
        if data.resized_crop:
            images = random_resized_crop(images, generator)
        if data.augment != "none":
            images = crop_flip(images, data.augment, data.crop_padding, generator)
        if data.randaugment:
            images = rand_augment(images, generator, data.randaugment, data.randaugment_magnitude)
        if data.erasing:
            images = random_erasing(images, generator, data.erasing)
        images, mixed = mix(images, labels, batch.seed, data.mixup, data.cutmix)
        return images, labels, mixed

    def prepare(self, batch: ImageBatch) -> tuple[Tensor, Tensor, Optional[tuple[Tensor, Tensor]]]:
        """The batch's images (augmented on the CPU) and labels; the engine moves them to the device."""
        return self.batch_images(batch)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor, Optional[tuple[Tensor, Tensor]]]
             ) -> tuple[Tensor, dict[str, Tensor], int]:
        """Label-smoothed NLL; under Mixup/CutMix ``lam L(y) + (1 - lam) L(y_pair)`` (accuracy against ``y``)."""
        images, labels, mixed = move(batch, module_device(model))
        output = model(images)
        smoothing = self.train_cfg.label_smoothing

        def exit_loss(logits: Tensor) -> tuple[Tensor, Tensor]:
            loss, nll = label_smoothed_nll(logits, labels, smoothing)
            if mixed is None:
                return loss, nll
            paired, lam = mixed
            other, other_nll = label_smoothed_nll(logits, paired, smoothing)
            return torch.lerp(other, loss, lam), torch.lerp(other_nll, nll, lam)

        loss, logs = total_loss(output, exit_loss)
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
            "task": self.task_name, "class_names": self.class_names, "train_size": len(self.train_labels),
            "valid_size": len(self.valid_labels), "pixel_mean": self.pixel_mean, "pixel_std": self.pixel_std}))


def score(model: nn.Module, images: Tensor, labels: Tensor, names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, NLL, per-class precision/recall/F1 and the confusion matrix of ``model`` on a labelled split."""
    num_classes = model.config.num_classes
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


def _evaluation_split(data: ImageData, given: Optional[str], num_classes: int) -> tuple[Tensor, Tensor, str]:
    """The test images and labels ``interlayer evaluate`` scores: the run's test split, or ``given``: a folder (or
    .npz) laid out as the run's data, or (IDX) an images file whose labels file lies beside it."""
    if given is None:
        images, labels = load_test(data, num_classes)
        return images, labels, split_source(data, "test")
    path = Path(given)
    if path.is_dir() or data.resolved_format() != "idx":
        other = dataclasses.replace(data, dir=str(path))
        images, labels = load_test(other, num_classes)
        return images, labels, split_source(other, "test")
    if "images-idx3" not in path.name:
        raise DataError(f"{path}: cannot tell where its labels are; pass the folder holding the test files, or "
                        "an images file named like *images-idx3-ubyte[.gz] with *labels-idx1-ubyte[.gz] beside it")
    labels_path = path.with_name(path.name.replace("images-idx3", "labels-idx1"))
    plain = labels_path.with_name(labels_path.name.removesuffix(".gz"))
    for candidate in (labels_path, plain, plain.with_name(plain.name + ".gz")):
        if candidate.is_file():
            images, labels = load_split(path, candidate, num_classes)
            return images, labels, str(path)
    raise DataError(f"{path}: its labels file {labels_path.name} (or {plain.name}[.gz]) is not beside it")


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
    """Image classification: a ViT, a (PA-)Conv-Transformer, a Swin (LW-Swin) or an (PA-)AA-ResNet from scratch, or a
    fine-tuned Hugging Face ViT, on any labelled image set (:class:`ImageData`)."""

    name = "image"
    description = ("image classification: IDX (MNIST, Fashion-MNIST), CIFAR-10/100 binary, .npz or an ImageFolder "
                   "(default: the bundled Fashion-MNIST subset; --data-dir PATH)")
    default_preset = "vit_fashion_mnist"
    data_class = ImageData
    train_defaults = TRAIN_DEFAULTS

    def make_task(self, data: ImageData, train: TrainConfig, run_dir: Optional[Path]) -> ImageTask:
        """Nothing to reload on resume: the split and the statistics are recomputed from the data and split_seed."""
        return ImageTask(data, train, self.name)

    def finish(self, task: ImageTask, run_dir: Path, state: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Score ``best/`` once on the test split; the report with the confusion matrix goes to ``test_report.txt``."""
        model = load_pretrained(run_dir / "best", task.device)
        images, labels = load_test(task.data, len(task.class_names))
        start = time.perf_counter()
        metrics = score(model, images, labels, task.class_names)
        seconds = time.perf_counter() - start
        write_atomic(run_dir / "test_report.txt", report(metrics, split_source(task.data, "test")) + "\n")
        return {"test_accuracy": metrics["accuracy"], "test_nll": metrics["nll"],
                "test_per_class": metrics["per_class"], "test_report": "test_report.txt", "test_seconds": seconds,
                "parameters": count_parameters(model), "madds_per_image": count_madds(model, model.config.tokens)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data-dir", metavar="PATH",
                            help="the data's folder (IDX files, CIFAR binary batches, an ImageFolder) or .npz file "
                                 "(default: the bundled 3,000 / 1,000 Fashion-MNIST subset); same as --set "
                                 "data.dir=PATH")
        parser.add_argument("--pretrained", metavar="DIR",
                            help="fine-tune this Hugging Face ViT folder (images repeated to 3 channels and resized to "
                                 "its size); same as --set data.pretrained=DIR")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        keys = {"data.dir": args.data_dir, "data.pretrained": args.pretrained}
        return {key: value for key, value in keys.items() if value}, {}

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """``interlayer evaluate`` for images: ``--data`` is a folder (or .npz) laid out as the run's data (its test
        split), or an IDX images file with its labels file beside it (``...images-idx3...`` ->
        ``...labels-idx1...``); default the run's test split."""
        directory = Path(directory)
        data = self.saved_data(directory)
        model = load_pretrained(directory, getattr(args, "device", None))
        cfg = model.config
        names = read_json(directory / "task.json", DataError, within=directory).get("class_names") or []
        images, labels, source = _evaluation_split(data, args.data, cfg.num_classes)
        expected = (cfg.channels, cfg.image_height, cfg.image_width)
        if tuple(images.shape[1:]) != expected:
            raise DataError(f"{source}: images of shape {tuple(images.shape[1:])} (channels, height, width), but "
                            f"the model reads {expected}")
        return report(score(model, images, labels, names), source)

    def sample_input(self, task: ImageTask) -> SampleInput:
        """The first validation image as model input, for attention-map pictures. No token labels: an image's tokens
        (patches, grid cells, a CLS token) depend on the model, not the data, and 49 cells are too many to label."""
        return (task.valid_images[:1],), {}, []

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: ImageTask) -> Any:
        """The preset (or a .json/.yaml config) of an image family (:data:`IMAGE_FAMILIES`: ViT / Conv-Transformer,
        Swin, AA-ResNet) with the data's fields, then the user's overrides. A fine-tuning run (``data.pretrained``)
        takes the checkpoint's ViT, reading the data's images through ``input_size`` with the checkpoint's own
        normalisation."""
        if task.data.pretrained:
            if preset != self.default_preset:
                raise ConfigError(f"--preset {preset} cannot be combined with data.pretrained={task.data.pretrained}: "
                                  "the checkpoint decides the architecture; add a method with --set instead")
            fields = task.model_fields()
            size = [fields["channels"], fields["image_height"], fields["image_width"]]
            return vision_finetune_config(Path(task.data.pretrained), fields["num_classes"], size, model_sets)
        # one override, so a setting the data's geometry needs (Swin's padding) may come with it
        return get_config(preset, family=image_family(preset), **{**task.model_fields(), **model_sets})

    def defaults_for(self, sets: dict[str, Any]) -> dict[str, Any]:
        """The fine-tuning recipe as the defaults of a run with ``data.pretrained`` (the user's ``--set`` wins)."""
        return dict(VISION_FINE_TUNING_DEFAULTS) if sets.get("data.pretrained") else {}

    def initialise(self, model: nn.Module, task: ImageTask) -> None:
        """A fresh fine-tuning run's model, just built from the seed: load the ViT checkpoint over it (the head and
        what methods add keep their seeded initialisation)."""
        if task.data.pretrained:
            load_checkpoint(model, Path(task.data.pretrained))


class FashionMNISTSpec(ImageClassificationSpec):
    """The image task with Fashion-MNIST's class names by default (its runs and commands predate ``image``)."""

    name = "fashion_mnist"
    description = ("image classification as `image`, its classes named as Fashion-MNIST's (default: the bundled "
                   "subset; the full set with --data-dir PATH)")
    data_class = FashionMNISTData


def image_family(preset: str) -> str:
    """The registry family of an image preset name or config file (a ViT's by default), refusing other models."""
    cfg = get_config(preset)
    family = IMAGE_FAMILIES.get(type(cfg))
    if family is None:
        names = ", ".join(name for family in IMAGE_FAMILIES.values() for name in list_models(family=family))
        raise ConfigError(f"{preset!r} is not an image model; image presets: {names} (or a .json/.yaml config file)")
    return family
