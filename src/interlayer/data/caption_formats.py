"""COCO captions with Karpathy's splits and RefCOCO / RefCOCO+ referring expressions, read strictly; the one-time
conversion of the official RefCOCO files into the layout read here.

* **COCO captions, Karpathy splits** (Karpathy & Fei-Fei 2015; the file every captioning paper trains on,
  ``dataset_coco.json``): ``{"images": [{"split": "train" | "restval" | "val" | "test", "cocoid": 391895,
  "sentences": [{"raw": "A man ...", "tokens": [...]}, ...], ...}]}``. ``restval`` joins ``train`` (113,287 training
  images, 5,000 validation, 5,000 test: the usual reading). An image is keyed by its ``cocoid`` (else ``imgid``),
  which finds its region file (:mod:`interlayer.data.region_features`). A sentence's ``raw`` text is used (the
  metrics tokenize it as coco-caption does); ``tokens`` joined by spaces where ``raw`` is missing.
* **RefCOCO / RefCOCO+** (Yu et al. 2016): the layout of the REC code that reads them from region features
  (MCN's and SimREC's ``anns/refcoco.json``): ``{"train": [{"iid": 581857, "bbox": [x, y, w, h], "refs": ["the
  lady with the blue shirt", ...]}, ...], "val": [...], "testA": [...], "testB": [...]}``, the box in COCO's
  pixels (x, y of the top left corner, width, height). RefCOCOg has ``val`` and ``test``.
* **Conversion** (:func:`convert_refer`, ``interlayer convert-refer``): the official release is
  ``refs(unc).p``, a Python pickle of ``[{"ref_id", "ann_id", "image_id", "split", "sentences": [{"sent", "raw",
  "tokens"}], ...}]``, and ``instances.json``, COCO's annotations (``{"annotations": [{"id", "bbox", ...}]}``).
  The pickle is read by an unpickler that refuses every global (:class:`NoGlobalsUnpickler`): the file is plain
  lists, dicts, strings and numbers, which need none, and a file that names any class or function is refused
  before anything of it runs. The output is the JSON layout above, written once.

Each error names the file and the record (``images[12].sentences[3]``, ``testA[40]``) and what was expected.
"""
from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ..errors import DataError
from ..fileio import json_field, read_json, write_atomic

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "valid", "test": "test"}
REFER_SPLITS = ("train", "val", "testA", "testB", "test")
MAX_PICKLE_BYTES = 1 << 30  # refs(unc).p of RefCOCO is 30 MB; a larger "pickle" is not one of these files


@dataclass
class CaptionImage:
    """One image of a captioning data set: its key (the region file's) and reference captions as written."""

    image: str
    captions: list[str]


@dataclass
class Referral:
    """One referred object: its image's key, its box (x1, y1, x2, y2 in pixels) and its expressions."""

    image: str
    box: tuple[float, float, float, float]
    expressions: list[str]


def _field(record: Any, key: str, kind: Union[type, tuple[type, ...]], where: str) -> Any:
    return json_field(record, key, kind, where, DataError)


# -- COCO captions, Karpathy splits ---------------------------------------------------------------------------
def read_karpathy(path: Path) -> dict[str, list[CaptionImage]]:
    """``dataset_coco.json`` (module docstring) as ``{"train": [...], "valid": [...], "test": [...]}``."""
    data = read_json(path, DataError)
    images = data.get("images")
    if not isinstance(images, list) or not images:
        raise DataError(f"{path}: expected a JSON object with a non-empty list 'images' (Karpathy's "
                        "dataset_coco.json)")
    out: dict[str, list[CaptionImage]] = {"train": [], "valid": [], "test": []}
    seen: dict[str, int] = {}
    for i, record in enumerate(images):
        where = f"{path}: images[{i}]"
        split = _field(record, "split", str, where)
        if split not in KARPATHY_SPLITS:
            raise DataError(f"{where}: split {split!r} is none of {', '.join(KARPATHY_SPLITS)}")
        key = record.get("cocoid", record.get("imgid")) if isinstance(record, Mapping) else None
        if not isinstance(key, (int, str)) or isinstance(key, bool):
            raise DataError(f"{where}: needs an image id 'cocoid' (or 'imgid'), a number")
        key = str(key)
        if key in seen:
            raise DataError(f"{where}: image {key} again (first at images[{seen[key]}])")
        seen[key] = i
        sentences = _field(record, "sentences", list, where)
        captions = []
        for j, sentence in enumerate(sentences):
            spot = f"{where}.sentences[{j}]"
            if isinstance(sentence, Mapping) and isinstance(sentence.get("raw"), str):
                captions.append(sentence["raw"])
            else:
                tokens = _field(sentence, "tokens", list, spot)
                if not all(isinstance(t, str) for t in tokens):
                    raise DataError(f"{spot}: 'tokens' must be a list of strings")
                captions.append(" ".join(tokens))
            if not captions[-1].strip():
                raise DataError(f"{spot}: an empty caption")
        if not captions:
            raise DataError(f"{where}: image {key} has no sentences")
        out[KARPATHY_SPLITS[split]].append(CaptionImage(key, captions))
    for split, items in out.items():
        if not items:
            raise DataError(f"{path}: no {split} images (Karpathy's splits: train/restval, val, test)")
    return out


# -- RefCOCO ---------------------------------------------------------------------------------------------------
def _box(value: Any, where: str) -> tuple[float, float, float, float]:
    """A COCO box [x, y, w, h] as (x1, y1, x2, y2)."""
    if (not isinstance(value, list) or len(value) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise DataError(f"{where}: 'bbox' must be [x, y, width, height] (four numbers), got {value!r:.80}")
    x, y, w, h = (float(v) for v in value)
    if not all(map(lambda v: v == v and abs(v) != float("inf"), (x, y, w, h))) or w <= 0 or h <= 0:
        raise DataError(f"{where}: 'bbox' {value} needs finite numbers and a positive width and height")
    return x, y, x + w, y + h


def read_refer(path: Path) -> dict[str, list[Referral]]:
    """A RefCOCO JSON in the layout of the module docstring, by split (``train``, ``val``, ``testA``, ``testB``;
    ``test`` for RefCOCOg)."""
    data = read_json(path, DataError)
    unknown = sorted(set(data) - set(REFER_SPLITS))
    if unknown or "train" not in data:
        raise DataError(f"{path}: expected a JSON object of splits ({', '.join(REFER_SPLITS)}) with 'train' among "
                        f"them; got keys {sorted(data)} (convert the official refs(unc).p with `interlayer "
                        "convert-refer`)")
    out: dict[str, list[Referral]] = {}
    for split, records in data.items():
        if not isinstance(records, list) or not records:
            raise DataError(f"{path}: split {split!r} must be a non-empty list of referred objects")
        items = []
        for i, record in enumerate(records):
            where = f"{path}: {split}[{i}]"
            image = _field(record, "iid", (int, str), where)
            refs = _field(record, "refs", list, where)
            if not refs or not all(isinstance(r, str) and r.strip() for r in refs):
                raise DataError(f"{where}: 'refs' must be a non-empty list of non-empty expressions")
            items.append(Referral(str(image), _box(_field(record, "bbox", list, where), where), list(refs)))
        out[split] = items
    return out


class NoGlobalsUnpickler(pickle.Unpickler):
    """An unpickler that builds only what needs no global: lists, dicts, tuples, strings, numbers. Any class or
    function the file names is refused, so nothing in the file can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise DataError(f"{self.source}: the pickle names {module}.{name}; refs files hold plain lists and dicts, so "
                        "a pickle that needs a class or function is refused (it could run code)")

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        super().__init__(file, encoding="latin1")
        self.source = source


def read_refs_pickle(path: Path) -> list[dict[str, Any]]:
    """The list of refs in ``refs(unc).p`` (module docstring), unpickled without any global."""
    size = path.stat().st_size
    if size > MAX_PICKLE_BYTES:
        raise DataError(f"{path}: {size:,} bytes is larger than any refs file ({MAX_PICKLE_BYTES:,}); not read")
    try:
        with path.open("rb") as handle:
            refs = NoGlobalsUnpickler(handle, str(path)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not a readable refs pickle ({type(err).__name__}: {err})") from None
    if not isinstance(refs, list) or not refs:
        raise DataError(f"{path}: expected a non-empty list of refs, got {type(refs).__name__}")
    return refs


def convert_refer(refs_path: Path, instances_path: Path, output: Path) -> dict[str, int]:
    """Write ``output``, the JSON layout :func:`read_refer` reads, from the official ``refs(unc).p`` and
    ``instances.json``; returns the referred objects written per split. Nothing is written unless every record
    converts."""
    refs = read_refs_pickle(refs_path)
    instances = read_json(instances_path, DataError)
    annotations = instances.get("annotations")
    if not isinstance(annotations, list):
        raise DataError(f"{instances_path}: expected COCO's annotations, a JSON object with a list 'annotations'")
    boxes = {}
    for i, ann in enumerate(annotations):
        where = f"{instances_path}: annotations[{i}]"
        boxes[_field(ann, "id", int, where)] = _field(ann, "bbox", list, where)
    out: dict[str, list[dict[str, Any]]] = {}
    for i, ref in enumerate(refs):
        where = f"{refs_path}: ref {i}"
        split = _field(ref, "split", str, where)
        if split not in REFER_SPLITS:
            raise DataError(f"{where}: split {split!r} is none of {', '.join(REFER_SPLITS)}")
        ann_id = _field(ref, "ann_id", int, where)
        if ann_id not in boxes:
            raise DataError(f"{where}: ann_id {ann_id} is not among {instances_path}'s annotations")
        sentences = _field(ref, "sentences", list, where)
        texts = [_field(s, "sent", str, f"{where}, sentence {j}") for j, s in enumerate(sentences)]
        if not texts or not all(text.strip() for text in texts):
            raise DataError(f"{where}: needs at least one sentence, and no empty one")
        _box(boxes[ann_id], f"{instances_path}: annotation {ann_id}")
        out.setdefault(split, []).append({"iid": _field(ref, "image_id", int, where), "bbox": boxes[ann_id],
                                          "refs": texts, "ref_id": ref.get("ref_id")})
    write_atomic(output, json.dumps(out))
    return {split: len(items) for split, items in out.items()}
