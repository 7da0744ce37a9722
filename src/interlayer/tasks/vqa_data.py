"""What the VQA task reads (:mod:`interlayer.tasks.vqa`): its data settings (:class:`VQAData`, ``data.*``), the
vocabularies built on the training split, the images as MCAN reads them (Sort-of-CLEVR's pixels or object regions,
the region features of VQA v2 / CLEVR / GQA) and the encoded splits; the publishers' files themselves are read by
:mod:`interlayer.data.vqa_formats`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, get_args

import numpy as np
import torch
from torch import Tensor

from ..config_io import check_choices
from ..data import sort_of_clevr as soc
from ..data.vqa_formats import (
    FeatureStore,
    VQAItem,
    check_images,
    open_features,
    read_clevr,
    read_gqa,
    read_vqa2,
    tokenize_question,
)
from ..errors import ConfigError, DataError
from .vqa_metrics import SAMPLES, soft_scores

Dataset = Literal["sort_of_clevr", "vqa2", "clevr", "gqa"]
DATASETS: tuple[str, ...] = get_args(Dataset)
SortOfClevrImages = Literal["pixels", "objects"]
SPECIALS = ("<pad>", "<unk>")
PAD, UNK = 0, 1
# The publishers' file names inside --data-dir: (train questions, train annotations, test questions, test
# annotations, train features, test features); annotations only for VQA v2.
DEFAULT_FILES: dict[str, tuple[str, str, str, str, str, str]] = {
    "vqa2": ("v2_OpenEnded_mscoco_train2014_questions.json", "v2_mscoco_train2014_annotations.json",
             "v2_OpenEnded_mscoco_val2014_questions.json", "v2_mscoco_val2014_annotations.json", "train2014",
             "val2014"),
    "clevr": ("questions/CLEVR_train_questions.json", "", "questions/CLEVR_val_questions.json", "",
              "train_features.h5", "val_features.h5"),
    "gqa": ("train_balanced_questions.json", "", "testdev_balanced_questions.json", "", "features", "features"),
}
FILE_KEYS = ("train_questions", "train_annotations", "test_questions", "test_annotations", "train_features",
             "test_features")


@dataclass
class VQAData:
    """Which data set, where, and how it is batched (``--set data.KEY=VALUE``)."""

    dataset: Dataset = "sort_of_clevr"
    dir: str = ""  # vqa2 / clevr / gqa: the folder holding the files below
    train_questions: str = ""  # file names inside ``dir`` (or full paths); empty: the publisher's name
    train_annotations: str = ""
    test_questions: str = ""
    test_annotations: str = ""
    train_features: str = ""  # a folder of .npz, a .tsv, or one .npz/.h5 array file
    test_features: str = ""
    feature_dim: int = 2048  # size of a region feature (bottom-up attention: 2048; CLEVR's ResNet-101 grid: 1024)
    max_regions: int = 100  # regions kept per image (bottom-up attention: 10-100)
    min_answer_count: int = 9  # answers seen this often in training form the vocabulary (VQA v2: 3,129)
    max_question_len: int = 14  # words (MCAN)
    valid_fraction: float = 0.05  # share of the training images held out for validation (path data sets)
    split_seed: int = 0
    release_seed: int = 0  # Sort-of-CLEVR: the release (another seed is another data set)
    train_size: int = 10_000  # Sort-of-CLEVR questions per split
    valid_size: int = 1_000
    test_size: int = 1_000
    batch_size: int = 64  # questions per step (MCAN)
    # Sort-of-CLEVR's images as MCAN reads them: "pixels" through the RN's CNN stem, trained end to end, or
    # "objects": one region per object (its 11 x 11 window and centre), as a perfect detector's regions
    image_features: SortOfClevrImages = "pixels"
    pavpu_samples: int = SAMPLES  # attention-weight samples per test question (Crossformer Sec. 3.2: 20)

    def validate(self) -> None:
        check_choices(self, "data.")
        if self.dataset != "sort_of_clevr" and self.image_features != "pixels":
            raise ConfigError(f"data.image_features={self.image_features} chooses how Sort-of-CLEVR's images are read; "
                              f"{self.dataset} is read from its region-feature files: leave it at 'pixels'")
        if self.dataset != "sort_of_clevr" and not self.dir:
            raise ConfigError(f"data.dataset={self.dataset} is read from a folder: give --data-dir DIR (or "
                              "data.dir) holding the publisher's files")
        for key in ("feature_dim", "max_regions", "min_answer_count", "max_question_len", "train_size",
                    "valid_size", "test_size", "batch_size", "pavpu_samples"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a positive number")
        for key in ("release_seed", "split_seed"):  # numpy's generators take no negative seed
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}={getattr(self, key)} must not be negative (a seed of numpy's "
                                  "generators: 0, 1, 2, ...)")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction={self.valid_fraction} must lie strictly between 0 and 1")
        if self.pavpu_samples < 2:
            raise ConfigError(f"data.pavpu_samples={self.pavpu_samples}: the t-test needs at least 2 samples")

    def file(self, key: str) -> Path:
        name = getattr(self, key) or DEFAULT_FILES[self.dataset][FILE_KEYS.index(key)]
        path = Path(self.dir) / name
        if not path.exists():
            raise DataError(f"{path}: no such file or folder; set data.{key} to the {key.replace('_', ' ')} of "
                            f"{self.dataset}")
        return path


# -- splits ---------------------------------------------------------------------------------------------------
@dataclass
class Vocab:
    """The question words and the answers of a VQA data set (built on the training split, saved with the run), and
    their indices."""

    words: list[str]
    answers: list[str]
    word_index: dict[str, int] = field(init=False)
    answer_index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.word_index = {w: i for i, w in enumerate(self.words)}
        self.answer_index = {a: i for i, a in enumerate(self.answers)}


class PixelImages:
    """Sort-of-CLEVR: uint8 images in memory, read as floats in [0, 1]."""

    def __init__(self, images: np.ndarray) -> None:
        self.images = torch.from_numpy(images)

    def batch(self, keys: Sequence[str]) -> tuple[Tensor, Optional[Tensor]]:
        return self.images[[int(k) for k in keys]].float().div_(255.0), None

    def picture(self, key: str) -> np.ndarray:
        return self.images[int(key)].permute(1, 2, 0).numpy()


class ObjectImages(PixelImages):
    """Sort-of-CLEVR as object regions (:func:`~interlayer.data.sort_of_clevr.object_features`), six per image,
    none padded; the pixels are kept for the attention picture, the centres to mark each region on it."""

    def __init__(self, made: soc.SortOfClevr) -> None:
        super().__init__(made.images)
        self.features = torch.from_numpy(soc.object_features(made))

    def batch(self, keys: Sequence[str]) -> tuple[Tensor, Optional[Tensor]]:
        return self.features[[int(k) for k in keys]], None

    def region_centres(self, key: str) -> np.ndarray:
        """(6, 2) pixel centres (x, y) of the image's regions, in their row order."""
        return (self.features[int(key), :, -2:].numpy() + 1.0) / 2.0 * (soc.IMAGE_SIZE - 1)


class RegionImages:
    """Region features from a store, padded to the batch's most regions (at most ``max_regions``)."""

    def __init__(self, store: FeatureStore, max_regions: int) -> None:
        self.store, self.max_regions = store, max_regions

    def batch(self, keys: Sequence[str]) -> tuple[Tensor, Optional[Tensor]]:
        """The regions of the images ``keys`` as one zero-padded ``(B, R, feature_dim)`` tensor and its padding mask
        (True at padding)."""
        arrays = [self.store[k][:self.max_regions] for k in keys]
        regions = max(len(a) for a in arrays)
        features = torch.zeros(len(arrays), regions, arrays[0].shape[1])
        padding = torch.ones(len(arrays), regions, dtype=torch.bool)
        for i, array in enumerate(arrays):
            features[i, :len(array)] = torch.from_numpy(array)
            padding[i, :len(array)] = False
        return features, padding

    def picture(self, key: str) -> None:
        return None


@dataclass
class Split:
    """One split of a VQA data set, encoded: its items, the questions as padded word ids, each question's soft answer
    scores (VQA accuracy's min(#humans / 3, 1)) and the images (pixels or region features)."""

    items: list[VQAItem]
    questions: Tensor  # (N, max_question_len) word ids, PAD after the question
    targets: list[dict[int, float]]  # soft scores by answer index
    images: Any  # PixelImages | RegionImages

    def __len__(self) -> int:
        return len(self.items)

    def inputs(self, rows: Sequence[int]) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """(question, question_padding, image, image_padding) of ``rows`` as MCAN reads them."""
        question = self.questions[list(rows)]
        image, image_padding = self.images.batch([self.items[r].image for r in rows])
        return question, question.eq(PAD), image, image_padding

    def target_matrix(self, rows: Sequence[int], num_answers: int) -> Tensor:
        target = torch.zeros(len(rows), num_answers)
        for i, r in enumerate(rows):
            for answer, value in self.targets[r].items():
                target[i, answer] = value
        return target


def make_split(items: list[VQAItem], images: Any, vocab: Vocab, max_len: int, dataset: str) -> Split:
    questions = torch.full((len(items), max_len), PAD, dtype=torch.long)
    for i, item in enumerate(items):
        ids = [vocab.word_index.get(w, UNK) for w in tokenize_question(item.question)][:max_len]
        if not ids:
            raise DataError(f"{dataset}: question {item.question_id} has no words: {item.question!r}")
        questions[i, :len(ids)] = torch.tensor(ids)
    return Split(items, questions, [soft_scores(item.answers, vocab.answer_index) for item in items], images)


def sort_of_clevr_split(data: VQAData, split: Literal["train", "valid", "test"]) -> tuple[list[VQAItem], Any]:
    size = {"train": data.train_size, "valid": data.valid_size, "test": data.test_size}[split]
    made = soc.generate(size, data.release_seed, split)
    items = [VQAItem(f"{split}-{i}", str(int(made.image_index[i])), q, [soc.ANSWERS[a]], soc.ANSWERS[a], kind)
             for i, (q, a, kind) in enumerate(zip(made.questions, made.answers, made.kinds))]
    return items, ObjectImages(made) if data.image_features == "objects" else PixelImages(made.images)


def read_items(data: VQAData, part: Literal["train", "test"]) -> list[VQAItem]:
    questions = data.file(f"{part}_questions")
    if data.dataset == "vqa2":
        return read_vqa2(questions, data.file(f"{part}_annotations"))
    return read_clevr(questions) if data.dataset == "clevr" else read_gqa(questions)


def held_out(items: list[VQAItem], fraction: float, seed: int) -> tuple[list[VQAItem], list[VQAItem]]:
    """(train, valid): the questions of a random ``fraction`` of the images go to validation."""
    images = sorted({item.image for item in items})
    rng = np.random.RandomState(seed)
    valid_images = set(rng.permutation(images)[:max(1, int(round(fraction * len(images))))].tolist())
    train = [item for item in items if item.image not in valid_images]
    if not train:
        raise DataError(f"data.valid_fraction={fraction} of {len(images)} images leaves none for training")
    return train, [item for item in items if item.image in valid_images]


def region_images(data: VQAData, part: Literal["train", "test"], items: Sequence[VQAItem]) -> RegionImages:
    store = open_features(data.file(f"{part}_features"), data.feature_dim)
    check_images(items, store, str(data.file(f"{part}_questions")))
    return RegionImages(store, data.max_regions)


def load_test_split(data: VQAData, vocab: Vocab) -> Split:
    if data.dataset == "sort_of_clevr":
        items, images = sort_of_clevr_split(data, "test")
    else:
        items = read_items(data, "test")
        images = region_images(data, "test", items)
    return make_split(items, images, vocab, data.max_question_len, data.dataset)
