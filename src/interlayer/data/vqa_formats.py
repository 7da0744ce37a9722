"""VQA v2, CLEVR and GQA as their publishers ship them, read strictly; image features in the usual formats.

Questions (each error names the file and the record):

* **VQA v2** (Goyal et al. 2017): ``v2_OpenEnded_mscoco_<split>_questions.json`` (``{"questions": [{"image_id",
  "question", "question_id"}]}``) and ``v2_mscoco_<split>_annotations.json`` (``{"annotations": [{"question_id",
  "question_type", "answer_type", "multiple_choice_answer", "answers": [10 x {"answer", ...}]}]}``); every
  question needs its annotation with the 10 human answers.
* **CLEVR** (Johnson et al. 2017): ``CLEVR_<split>_questions.json`` (``{"questions": [{"image_index", "question",
  "answer", "program"?}]}``); the question type is the program's last function (count, exist, query_color, ...).
* **GQA** (Hudson & Manning 2019): ``<split>_balanced_questions.json`` (``{question_id: {"imageId", "question",
  "answer", "types": {"structural", ...}}}``); the question type is the structural type (query, verify, ...).

Image features (:func:`open_features`), each image an array (regions, feature_dim):

* a **folder of ``.npz`` files**, one per image, with the array under ``x`` (MCAN's bottom-up-attention files
  ``COCO_train2014_000000000009.jpg.npz``, which store it as (2048, regions): transposed when the first axis is
  ``feature_dim``) or ``features``; an image is found by its file name without extensions, or for names ending in
  digits by the number (COCO's zero-padded ids), so ``9`` finds ``COCO_train2014_000000000009.jpg.npz``;
* the **bottom-up-attention ``.tsv``** (Anderson et al. 2018): one line per image, tab-separated ``image_id,
  image_w, image_h, num_boxes, boxes, features`` with the arrays as base64 float32; indexed once by byte offset,
  decoded on demand;
* one **``.npz`` / ``.h5`` array file** (CLEVR's precomputed ResNet grids, Johnson et al.'s ``extract_features.py``):
  ``features`` of shape (images, channels, H, W) (a grid: H x W regions of ``channels``) or (images, regions, dim),
  indexed by CLEVR's ``image_index``; ``.h5`` needs ``h5py``, which interlayer does not depend on.

Answers are normalised as the official VQA evaluation does (:func:`normalize_answer`); the answer vocabulary keeps
the normalised training labels (VQA: ``multiple_choice_answer``) seen at least ``min_count`` times, 9 giving the
3,129 answers of MCAN and the papers (Teney et al. 2018's setting).
"""
from __future__ import annotations

import base64
import binascii
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from ..errors import DataError
from ..fileio import json_field, read_json

# -- the official VQA answer normalisation (vqaEval.py of the VQA API, Antol et al. 2015) ------------------------
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?",
               "!")
ARTICLES = ("a", "an", "the")
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
# A subset of the official table's contractions written without the apostrophe (the ones VQA answers use most);
# the full table has about 170 entries, mostly rare forms such as "wouldnt've".
CONTRACTIONS = {"aint": "ain't", "arent": "aren't", "cant": "can't", "couldnt": "couldn't", "didnt": "didn't",
                "doesnt": "doesn't", "dont": "don't", "hadnt": "hadn't", "hasnt": "hasn't", "havent": "haven't",
                "hes": "he's", "im": "i'm", "isnt": "isn't", "itll": "it'll", "ive": "i've", "lets": "let's",
                "shes": "she's", "shouldnt": "shouldn't", "thats": "that's", "theres": "there's",
                "theyre": "they're", "wasnt": "wasn't", "werent": "weren't", "whats": "what's", "wont": "won't",
                "wouldnt": "wouldn't", "youre": "you're", "youve": "you've"}
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")  # the official pattern, its "(?!<=" typo included


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``: a punctuation mark next to a space, or any mark in a text with a
    thousands comma, is deleted, any other is replaced by a space; periods not followed by a digit are deleted."""
    out = text
    for mark in PUNCTUATION:
        if (mark + " " in text or " " + mark in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD_STRIP.sub("", out)


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower case, number words to digits, articles dropped, contractions
    given their apostrophe."""
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    return " ".join(CONTRACTIONS.get(word, word) for word in words if word not in ARTICLES)


def normalize_answer(text: str) -> str:
    """An answer as the official evaluation compares a prediction: whitespace, punctuation, then digits/articles."""
    return process_digit_article(process_punctuation(text.replace("\n", " ").replace("\t", " ").strip()))


def tokenize_question(text: str) -> list[str]:
    """MCAN's question tokenizer: lower case, ``.,'!?"()*#:;`` removed, ``-`` and ``/`` split words."""
    return re.sub(r"([.,'!?\"()*#:;])", "", text.lower()).replace("-", " ").replace("/", " ").split()


# -- questions --------------------------------------------------------------------------------------------------
@dataclass
class VQAItem:
    """One question: its image's key in the feature store, the human answers (10 for VQA v2, one otherwise, as
    written), the training label (normalised) and the type the metrics group by."""

    question_id: str
    image: str
    question: str
    answers: list[str]
    label: str
    question_type: str = ""


def _field(record: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    return json_field(record, key, kind, where, DataError)


def _records(path: Path, key: str) -> list[Any]:
    data = read_json(path, DataError)
    if not isinstance(data.get(key), list):
        raise DataError(f"{path}: expected a JSON object with a list {key!r} (the publisher's layout)")
    if not data[key]:
        raise DataError(f"{path}: {key!r} is empty")
    return data[key]


def read_vqa2(questions_path: Path, annotations_path: Path) -> list[VQAItem]:
    """VQA v2 questions with their annotations (10 answers each)."""
    annotations: dict[int, dict[str, Any]] = {}
    for i, record in enumerate(_records(annotations_path, "annotations")):
        where = f"{annotations_path}: annotation {i}"
        qid = _field(record, "question_id", int, where)
        where = f"{annotations_path}: annotation {i} (question_id {qid})"
        answers = _field(record, "answers", list, where)
        if len(answers) != 10:
            raise DataError(f"{where}: {len(answers)} answers; VQA v2 has 10 per question")
        texts = [_field(a, "answer", str, f"{where}, answer {j}") for j, a in enumerate(answers)]
        annotations[qid] = {"answers": texts, "label": _field(record, "multiple_choice_answer", str, where),
                            "type": _field(record, "question_type", str, where)}
    items = []
    for i, record in enumerate(_records(questions_path, "questions")):
        where = f"{questions_path}: question {i}"
        qid = _field(record, "question_id", int, where)
        image = _field(record, "image_id", int, where)
        text = _field(record, "question", str, where)
        if qid not in annotations:
            raise DataError(f"{where} (question_id {qid}) has no annotation in {annotations_path}")
        note = annotations[qid]
        items.append(VQAItem(str(qid), str(image), text, note["answers"], normalize_answer(note["label"]),
                             note["type"]))
    return items


def _json_object(record: Any, where: str) -> dict[str, Any]:
    """``record`` when it is a JSON object; otherwise the error naming the file and record."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__} {record!r:.60}")
    return record


def _single_answer_item(record: dict[str, Any], question_id: str, image_field: tuple[str, type], where: str,
                        question_type: str) -> VQAItem:
    """A question of a one-answer set (CLEVR, GQA): its image (``image_field``: the key and its type), words
    and answer, read strictly; the answer is both the one human answer and the normalised label."""
    image = _field(record, image_field[0], image_field[1], where)
    text = _field(record, "question", str, where)
    answer = _field(record, "answer", str, where)
    return VQAItem(question_id, str(image), text, [answer], normalize_answer(answer), question_type)


def read_clevr(questions_path: Path) -> list[VQAItem]:
    """CLEVR questions with answers (the test split's have none and cannot be scored)."""
    items = []
    for i, record in enumerate(_records(questions_path, "questions")):
        where = f"{questions_path}: question {i}"
        record = _json_object(record, where)
        program = record.get("program") or [{}]
        last = program[-1] if isinstance(program, list) and isinstance(program[-1], dict) else {}
        items.append(_single_answer_item(record, str(record.get("question_index", i)), ("image_index", int), where,
                                         str(last.get("function", last.get("type", "")))))
    return items


def read_gqa(questions_path: Path) -> list[VQAItem]:
    """GQA balanced questions (a mapping from question id to record)."""
    data = read_json(questions_path, DataError)
    if not data:
        raise DataError(f"{questions_path}: no questions")
    items = []
    for qid, record in data.items():
        where = f"{questions_path}: question {qid}"
        record = _json_object(record, where)
        types = record.get("types") if isinstance(record.get("types"), dict) else {}
        items.append(_single_answer_item(record, str(qid), ("imageId", str), where, str(types.get("structural", ""))))
    return items


# -- vocabularies -----------------------------------------------------------------------------------------------
def answer_vocabulary(items: Iterable[VQAItem], min_count: int) -> list[str]:
    """Training labels seen at least ``min_count`` times, most frequent first (ties alphabetical)."""
    counts = Counter(item.label for item in items)
    kept = [answer for answer, n in counts.items() if n >= min_count]
    if not kept:
        raise DataError(f"no training answer occurs {min_count} times (data.min_answer_count); lower it")
    return sorted(kept, key=lambda answer: (-counts[answer], answer))


def word_vocabulary(items: Iterable[VQAItem], specials: Sequence[str]) -> list[str]:
    """``specials`` then every word of the training questions, most frequent first (ties alphabetical)."""
    counts = Counter(word for item in items for word in tokenize_question(item.question))
    return list(specials) + sorted((w for w in counts if w not in specials), key=lambda w: (-counts[w], w))


# -- image features ---------------------------------------------------------------------------------------------
class FeatureStore(Protocol):
    """Region features by image key: ``store[key]`` is a float32 array (regions, feature_dim)."""

    def __contains__(self, key: str) -> bool: ...

    def __getitem__(self, key: str) -> np.ndarray: ...


def as_regions(array: np.ndarray, feature_dim: int, where: str) -> np.ndarray:
    """(regions, feature_dim) float32 from (regions, dim) or MCAN's transposed (dim, regions)."""
    if array.ndim != 2:
        raise DataError(f"{where}: features of shape {array.shape}; expected (regions, {feature_dim})")
    if array.shape[1] != feature_dim and array.shape[0] == feature_dim:
        array = array.T
    if array.shape[1] != feature_dim:
        raise DataError(f"{where}: features of shape {array.shape}, but data.feature_dim={feature_dim}; set it to "
                        "the features' size")
    if array.shape[0] == 0:
        raise DataError(f"{where}: no regions (features of shape {array.shape}); an image needs at least one")
    if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
        raise DataError(f"{where}: features of type {array.dtype}; expected real numbers (float32)")
    if not np.isfinite(array).all():
        raise DataError(f"{where}: the features hold non-finite values")
    return np.ascontiguousarray(array, dtype=np.float32)


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class NpzDirectory:
    """One ``.npz`` per image in a folder (see the module docstring for the names it finds)."""

    def __init__(self, folder: Path, feature_dim: int) -> None:
        self.folder, self.feature_dim = folder, feature_dim
        self.paths: dict[str, Path] = {}
        for path in sorted(folder.glob("*.npz")):
            stem = path.name[:-len(".npz")]
            for suffix in _IMAGE_SUFFIXES:
                stem = stem.removesuffix(suffix)
            if stem in self.paths and self.paths[stem].name[:-len(".npz")].startswith(stem):
                raise DataError(f"{folder}: {self.paths[stem].name} and {path.name} are both the features of image "
                                f"{stem}; keep one")
            self.paths[stem] = path
            digits = re.search(r"(\d+)$", stem)
            if digits:
                self.paths.setdefault(str(int(digits.group(1))), path)
        if not self.paths:
            raise DataError(f"{folder}: no .npz feature files")

    def __contains__(self, key: str) -> bool:
        return key in self.paths

    def __getitem__(self, key: str) -> np.ndarray:
        path = self.paths[key]
        try:
            with np.load(path, allow_pickle=False) as data:
                name = next((k for k in ("x", "features") if k in data.files), None)
                if name is None:
                    raise DataError(f"{path}: no array 'x' or 'features' (found {data.files})")
                array = data[name]
        except (OSError, ValueError) as err:
            raise DataError(f"{path}: not a readable .npz file ({err})") from None
        return as_regions(array, self.feature_dim, str(path))


class TsvFeatures:
    """The bottom-up-attention ``.tsv``: ``image_id, image_w, image_h, num_boxes, boxes, features`` per line."""

    FIELDS = 6

    def __init__(self, path: Path, feature_dim: int) -> None:
        self.path, self.feature_dim = path, feature_dim
        self.offsets: dict[str, tuple[int, int]] = {}  # image id -> (byte offset, line number)
        offset = 0
        with path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                key = line.split(b"\t", 1)[0].decode("ascii", "replace").strip()
                if key in self.offsets:  # the last line would win silently
                    raise DataError(f"{path}:{number}: image id {key} again (first at line "
                                    f"{self.offsets[key][1]}); every image has one line")
                if key:
                    self.offsets[key] = (offset, number)
                offset += len(line)
        if not self.offsets:
            raise DataError(f"{path}: no lines")

    def __contains__(self, key: str) -> bool:
        return key in self.offsets

    def __getitem__(self, key: str) -> np.ndarray:
        offset, number = self.offsets[key]
        where = f"{self.path}:{number}"
        with self.path.open("rb") as handle:
            handle.seek(offset)
            fields = handle.readline().rstrip(b"\r\n").split(b"\t")
        if len(fields) != self.FIELDS:
            raise DataError(f"{where}: {len(fields)} tab-separated fields; expected {self.FIELDS} (image_id, "
                            "image_w, image_h, num_boxes, boxes, features)")
        try:
            boxes = int(fields[3])
            flat = np.frombuffer(base64.b64decode(fields[5], validate=True), dtype=np.float32)
        except (ValueError, binascii.Error) as err:
            raise DataError(f"{where}: num_boxes or the base64 features cannot be read ({err})") from None
        if boxes <= 0 or flat.size != boxes * self.feature_dim:
            raise DataError(f"{where}: {flat.size} feature values for num_boxes={boxes} and data.feature_dim="
                            f"{self.feature_dim} (expected {boxes * self.feature_dim})")
        return as_regions(flat.reshape(boxes, self.feature_dim), self.feature_dim, where)


def _load_h5(path: Path) -> Any:
    try:
        import h5py
    except ImportError:
        raise DataError(f"{path}: reading .h5 needs the h5py package (pip install h5py), or convert the file to "
                        ".npz with the same 'features' array") from None
    return h5py.File(path, "r")["features"]


class ArrayFeatures:
    """One array of all images' features, (images, C, H, W) grids or (images, regions, dim), by image index."""

    def __init__(self, path: Path, feature_dim: int) -> None:
        self.path, self.feature_dim = path, feature_dim
        if path.suffix in (".h5", ".hdf5"):
            self.array = _load_h5(path)
        else:
            try:
                with np.load(path, allow_pickle=False) as data:
                    if "features" not in data.files:
                        raise DataError(f"{path}: no array 'features' (found {data.files})")
                    self.array = data["features"]
            except (OSError, ValueError) as err:
                raise DataError(f"{path}: not a readable .npz file ({err})") from None
        if len(self.array.shape) not in (3, 4):
            raise DataError(f"{path}: 'features' of shape {self.array.shape}; expected (images, C, H, W) or "
                            "(images, regions, dim)")

    def __contains__(self, key: str) -> bool:
        return key.isdigit() and int(key) < self.array.shape[0]

    def __getitem__(self, key: str) -> np.ndarray:
        array = np.asarray(self.array[int(key)])
        if array.ndim == 3:  # a grid (C, H, W): one region per cell
            array = array.reshape(array.shape[0], -1).T
        return as_regions(array, self.feature_dim, f"{self.path}: image {key}")


def open_features(path: Path, feature_dim: int) -> FeatureStore:
    """The store for a folder of ``.npz``, a ``.tsv``, or one ``.npz`` / ``.h5`` array file."""
    if path.is_dir():
        return NpzDirectory(path, feature_dim)
    if not path.is_file():
        raise DataError(f"{path}: no such feature file or folder")
    if path.suffix == ".tsv":
        return TsvFeatures(path, feature_dim)
    if path.suffix in (".npz", ".h5", ".hdf5"):
        return ArrayFeatures(path, feature_dim)
    raise DataError(f"{path}: unknown feature format; expected a folder of .npz files, a .tsv, or a .npz/.h5 file")


def check_images(items: Sequence[VQAItem], store: FeatureStore, source: str) -> None:
    """Every question's image has features, and every image's features are read once and checked (shape, real
    numbers, finite values: :func:`as_regions`), before training instead of when a batch first draws them: a NaN
    at image 177 stopped a run at step 5, and a short run that never drew it "finished". One image at a time, so
    that VQA v2's features need no more memory than one image's; errors name the file and record."""
    for item in items:
        if item.image not in store:
            raise DataError(f"{source}: question {item.question_id} asks about image {item.image}, which has no "
                            "features in the feature store")
    for image in dict.fromkeys(item.image for item in items):
        store[image]


