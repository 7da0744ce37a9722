"""Sort-of-CLEVR (Santoro et al. 2017, "A simple neural network module for relational reasoning", Sec. 4.1): a
relational VQA set made here, deterministically, from a seed.

Each image is 75 x 75 RGB on a white background with six objects, one of each colour (red, green, blue, orange,
gray, yellow), each a square (11 x 11 pixels) or a circle (radius 5) at a random centre, placed so that no two
centres are closer than 10 pixels, the geometry and the drawing rules of the authors' generator
(``sort_of_clevr_generator.py``: ``size = 5``, ``randint(size, img_size - size)`` centres, rejection of centres
closer than ``2 * size``). Its questions are those of the original, written as words instead of the original's
11-bit one-hot codes (so the model reads a sentence, as on VQA):

* non-relational: *what is the shape of the red object ?* (rectangle / circle), *is the red object on the left ?*
  (centre x < 37.5), *is the red object at the top ?* (centre y < 37.5);
* relational: *what is the shape of the object closest to the red object ?*, *... furthest from the red object ?*
  (Euclidean distance between centres; ties go to the first colour in the order above, as ``argmin`` does in the
  original), *how many objects have the same shape as the red object ?* (1-6, the object itself included).

Answers are the original's ten: yes, no, rectangle, circle, 1..6 (squares are answered "rectangle" as there).

Where it differs: the original draws 10 relational and 10 non-relational questions for each of 9,800 training
images (196,000 questions); the release here is 10,000 / 1,000 / 1,000 questions (train / valid / test), two per
image (one relational, one non-relational, the sub-type of each uniform), so 5,000 / 500 / 500 images: for a
few-minute CPU budget a question per fresh image teaches more than twenty per image. Drawing is exact pixel
arithmetic (a pixel belongs to a circle when its distance to the centre is at most 5) instead of OpenCV's
anti-aliasing-free raster, which differs on a few boundary pixels. Each split has its own random stream
(``numpy.random.default_rng([seed, split])``), so the test set does not change when the training size does;
``tests/test_vqa_data.py`` pins a checksum of the first items, so the release cannot drift.

**Object regions** (:func:`object_features`): besides the pixels, each image can be read as its six objects, the
way MCAN reads VQA v2 through a detector's bottom-up-attention regions: one region per object, its feature the
object's 11 x 11 RGB window (what a perfect detector's box holds, neighbours' pixels included where objects
touch), scaled to [0, 1], with the box centre in [-1, 1] appended: ``3 * 11 * 11 + 2 = 365`` values. The regions
of an image are in a random order of their own (``default_rng([seed, split, 1])``), as a detector's are: MCAN has
no region positions and is invariant to that order, but another model must not find the colour by its index.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

IMAGE_SIZE = 75
OBJECT_SIZE = 5  # half the side of a square, the radius of a circle (the original's ``size``)
COLOURS = ("red", "green", "blue", "orange", "gray", "yellow")
RGB = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 156, 0), (128, 128, 128), (255, 255, 0)],
               dtype=np.uint8)
SHAPES = ("rectangle", "circle")
ANSWERS = ("yes", "no", "rectangle", "circle", "1", "2", "3", "4", "5", "6")
NON_RELATIONAL = ("shape", "left", "top")
RELATIONAL = ("closest", "furthest", "count")
SPLITS = {"train": 0, "valid": 1, "test": 2}
TEMPLATES = {
    "shape": "what is the shape of the {c} object ?",
    "left": "is the {c} object on the left ?",
    "top": "is the {c} object at the top ?",
    "closest": "what is the shape of the object closest to the {c} object ?",
    "furthest": "what is the shape of the object furthest from the {c} object ?",
    "count": "how many objects have the same shape as the {c} object ?",
}
# Every word the questions use, in a fixed order: the vocabulary does not depend on the data.
WORDS = tuple(dict.fromkeys(word for template in TEMPLATES.values()
                            for word in template.replace("{c}", COLOURS[0]).split() if word != COLOURS[0])) + COLOURS
_OFFSETS = np.arange(-OBJECT_SIZE, OBJECT_SIZE + 1)
# the pixels of a square and of a circle (distance to the centre at most OBJECT_SIZE) in their 11 x 11 window
_MASKS = (np.ones((2 * OBJECT_SIZE + 1,) * 2, dtype=bool),
          _OFFSETS[:, None] ** 2 + _OFFSETS[None, :] ** 2 <= OBJECT_SIZE ** 2)


@dataclass
class SortOfClevr:
    """One split: ``images`` uint8 (N_images, 3, 75, 75) and per question its image, words, answer and type."""

    images: np.ndarray
    image_index: np.ndarray  # (N,) int64: the question's image
    questions: list[str]
    answers: np.ndarray  # (N,) int64 index into ANSWERS
    kinds: list[str]  # a key of TEMPLATES
    relational: np.ndarray  # (N,) bool
    centres: np.ndarray  # (N_images, 6, 2) int64 (x, y) pixel centres, in the order of COLOURS
    shapes: np.ndarray  # (N_images, 6) int64: 0 square, 1 circle, in the order of COLOURS
    split: Literal["train", "valid", "test"]
    seed: int

    def __len__(self) -> int:
        return len(self.questions)


def place_objects(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Centres (6, 2) as (x, y) pixels and shapes (6,) (0 square, 1 circle), one object per colour."""
    centres: list[tuple[int, int]] = []
    while len(centres) < len(COLOURS):
        x, y = (int(v) for v in rng.integers(OBJECT_SIZE, IMAGE_SIZE - OBJECT_SIZE, size=2))
        if all((x - cx) ** 2 + (y - cy) ** 2 >= (2 * OBJECT_SIZE) ** 2 for cx, cy in centres):
            centres.append((x, y))
    return np.array(centres, dtype=np.int64), rng.integers(0, 2, size=len(COLOURS))


def draw(centres: np.ndarray, shapes: np.ndarray) -> np.ndarray:
    """The image, (3, 75, 75) uint8: white, each object filled in its colour, later colours on top. An object lies
    wholly inside the image (centres are at least ``OBJECT_SIZE`` from the border), so it is an 11 x 11 window."""
    image = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 255, dtype=np.uint8)
    for colour, ((x, y), shape) in enumerate(zip(centres, shapes)):
        window = image[y - OBJECT_SIZE:y + OBJECT_SIZE + 1, x - OBJECT_SIZE:x + OBJECT_SIZE + 1]
        window[_MASKS[shape]] = RGB[colour]
    return image.transpose(2, 0, 1)


def answer(kind: str, colour: int, centres: np.ndarray, shapes: np.ndarray) -> int:
    """The index into ANSWERS of question ``kind`` about object ``colour``."""
    if kind == "shape":
        return ANSWERS.index(SHAPES[shapes[colour]])
    if kind == "left":
        return ANSWERS.index("yes" if centres[colour, 0] < IMAGE_SIZE / 2 else "no")
    if kind == "top":
        return ANSWERS.index("yes" if centres[colour, 1] < IMAGE_SIZE / 2 else "no")
    if kind == "count":
        return ANSWERS.index(str(int((shapes == shapes[colour]).sum())))
    distances = ((centres - centres[colour]) ** 2).sum(1).astype(np.float64)
    if kind == "closest":
        distances[colour] = np.inf
        return ANSWERS.index(SHAPES[shapes[int(np.argmin(distances))]])
    distances[colour] = -np.inf
    return ANSWERS.index(SHAPES[shapes[int(np.argmax(distances))]])


def generate(size: int, seed: int, split: Literal["train", "valid", "test"]) -> SortOfClevr:
    """``size`` questions (two per image: non-relational first, then relational; an odd size ends with a
    non-relational one) of ``split`` from release ``seed``."""
    rng = np.random.default_rng([seed, SPLITS[split]])
    n_images = (size + 1) // 2
    images = np.empty((n_images, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    all_centres = np.empty((n_images, len(COLOURS), 2), dtype=np.int64)
    all_shapes = np.empty((n_images, len(COLOURS)), dtype=np.int64)
    image_index, questions, answers, kinds, relational = [], [], [], [], []
    for i in range(n_images):
        centres, shapes = place_objects(rng)
        images[i] = draw(centres, shapes)
        all_centres[i], all_shapes[i] = centres, shapes
        for group, is_relational in ((NON_RELATIONAL, False), (RELATIONAL, True)):
            if len(questions) == size:
                break
            kind = group[int(rng.integers(len(group)))]
            colour = int(rng.integers(len(COLOURS)))
            image_index.append(i)
            questions.append(TEMPLATES[kind].format(c=COLOURS[colour]))
            answers.append(answer(kind, colour, centres, shapes))
            kinds.append(kind)
            relational.append(is_relational)
    return SortOfClevr(images, np.array(image_index, dtype=np.int64), questions, np.array(answers, dtype=np.int64),
                       kinds, np.array(relational, dtype=bool), all_centres, all_shapes, split, seed)


OBJECT_FEATURE_DIM = 3 * (2 * OBJECT_SIZE + 1) ** 2 + 2


def object_features(data: SortOfClevr) -> np.ndarray:
    """The images as object regions (module docstring): float32 ``(N_images, 6, 365)``, each row an object's
    11 x 11 RGB window in [0, 1] (channel, row, column order) and its centre (x, y) in [-1, 1]; the six rows of
    an image in a random order drawn from ``default_rng([seed, split, 1])``, the same for every call."""
    rng = np.random.default_rng([data.seed, SPLITS[data.split], 1])
    n_images, n_objects = data.centres.shape[:2]
    features = np.empty((n_images, n_objects, OBJECT_FEATURE_DIM), dtype=np.float32)
    for i in range(n_images):
        for row, colour in enumerate(rng.permutation(n_objects)):
            x, y = data.centres[i, colour]
            window = data.images[i, :, y - OBJECT_SIZE:y + OBJECT_SIZE + 1, x - OBJECT_SIZE:x + OBJECT_SIZE + 1]
            features[i, row, :-2] = window.reshape(-1) / 255.0
            features[i, row, -2:] = data.centres[i, colour] / (IMAGE_SIZE - 1) * 2.0 - 1.0
    return features


def checksum(data: SortOfClevr, count: int) -> str:
    """SHA-256 (first 16 hex digits) of the first ``count`` questions: their images, words and answers."""
    digest = hashlib.sha256()
    for i in range(min(count, len(data))):
        digest.update(data.images[data.image_index[i]].tobytes())
        digest.update(f"{data.questions[i]}|{ANSWERS[data.answers[i]]}".encode())
    return digest.hexdigest()[:16]

