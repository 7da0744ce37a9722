"""Referring expression comprehension: ``interlayer train rec`` (the setting of LW-Transformer Sec. IV-A to IV-C and
Table VII: RefCOCO and RefCOCO+, accuracy at IoU >= 0.5 on val, testA and testB); docs/rec.md.

* **Data.** ``scenes`` (default) is generated here (:mod:`interlayer.data.scenes`: 4,000 training scenes, 500
  validation scenes, 500 each of testA and testB, about 1.5 referred objects and 3 expressions each); ``refcoco``
  reads the converted RefCOCO / RefCOCO+ JSON and a folder of bottom-up region features from ``--data-dir``
  (:mod:`interlayer.data.caption_formats`; ``interlayer convert-refer`` makes the JSON from the official
  ``refs(unc).p`` and ``instances.json``), every file checked before anything is built.
* **Model** (:class:`~interlayer.models.regions.Grounder`): one score per region proposal and a box offset. Each
  (object, expression) pair is an example; its class is the proposal that overlaps the referred box most (IoU),
  trained by cross-entropy over the image's proposals, and the offset from that proposal's box to the referred one
  (Faster R-CNN's ``(dx, dy, log dw, log dh)``) by a smooth L1 loss of weight ``data.box_loss_weight`` (0: no
  regression).
* **Accuracy**: the predicted box (the best-scored proposal, moved by its offset) is right when its IoU with the
  referred box is at least 0.5; in percent, per split. ``results.json`` also holds the two floors a model must
  clear: a random proposal (the expected accuracy, exactly) and the largest proposal.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds, count_parameters
from ..config_io import check_choices
from ..data import scenes
from ..data.bpe import PAD_ID, UNK_ID
from ..data.caption_formats import convert_refer, read_refer
from ..data.region_features import MemoryRegions, Regions, RegionStore, check_regions, open_regions, region_batch
from ..errors import ConfigError, DataError
from ..fileio import read_json, write_atomic
from ..models.registry import load_pretrained
from ..tables import format_table
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import TaskCommand, TaskSpec
from .caption_metrics import ptb_tokenize
from .region_tasks import region_fields, region_model, saved_words

TASK_NAME = "rec"
Dataset = Literal["scenes", "refcoco"]
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
IOU_THRESHOLD = 0.5
EVAL_BATCH = 256


@dataclass
class RECData:
    """Which data and how it is batched (``--set data.KEY=VALUE``)."""

    dataset: Dataset = "scenes"
    dir: str = ""  # refcoco: the folder of file and features
    file: str = "refcoco.json"  # refcoco: the converted expressions (interlayer convert-refer)
    features: str = "features"  # refcoco: the folder of .npz region files
    feature_dim: int = 2048
    max_regions: int = 100
    min_word_count: int = 1
    max_words: int = 15  # expressions are cut to this many tokens (MCN, SimREC: 15)
    release_seed: int = 0  # scenes
    train_size: int = 4000  # scenes per split
    valid_size: int = 500
    test_size: int = 500  # scenes of testA, and of testB
    batch_size: int = 64  # expressions per step
    box_loss_weight: float = 1.0

    def validate(self) -> None:
        check_choices(self, "data.")
        if self.dataset == "refcoco" and not self.dir:
            raise ConfigError("data.dataset=refcoco is read from a folder: give --data-dir DIR holding the converted "
                              "refcoco.json and the region features")
        for key in ("feature_dim", "max_regions", "min_word_count", "max_words", "train_size", "valid_size",
                    "test_size", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a positive number")
        if self.release_seed < 0 or not 0 <= self.box_loss_weight < float("inf"):
            raise ConfigError("data.release_seed and data.box_loss_weight must be finite numbers, not negative")

    def path(self, name: str) -> Path:
        value = getattr(self, name)
        path = Path(value) if os.path.isabs(value) else Path(self.dir) / value
        if not path.exists():
            raise DataError(f"{path}: no such file or folder; set data.{name}")
        return path


@dataclass
class RECExample:
    image: str
    expression: str
    box: np.ndarray  # (4,) x1, y1, x2, y2 of the referred object


@dataclass
class RECSplit:
    examples: list[RECExample]
    store: RegionStore
    max_regions: int

    def regions(self, key: str) -> Regions:
        return self.store.regions(key).ordered(self.max_regions)


def scene_referrals(data: RECData, split: Literal["train", "valid", "testA", "testB"]) -> RECSplit:
    size = {"train": data.train_size, "valid": data.valid_size}.get(split, data.test_size)
    made = scenes.generate(size, data.release_seed, split)
    regions, examples = {}, []
    for i, scene in enumerate(made):
        key = f"{split}-{i}"
        regions[key] = Regions(scene.features, scene.boxes, float(scenes.IMAGE_SIZE), float(scenes.IMAGE_SIZE))
        examples += [RECExample(key, e.text, np.array(scene.objects[e.target].box, dtype=np.float32))
                     for e in scene.expressions]
    return RECSplit(examples, MemoryRegions(regions), data.max_regions)


def refer_splits(data: RECData) -> dict[str, RECSplit]:
    """The converted RefCOCO file's splits over one feature folder, every image's regions read and checked."""
    referrals = read_refer(data.path("file"))
    store = open_regions(data.path("features"), data.feature_dim)
    out = {}
    for split, items in referrals.items():
        check_regions([r.image for r in items], store, f"{data.path('file')} ({split})")
        out[split] = RECSplit([RECExample(r.image, e, np.array(r.box, dtype=np.float32)) for r in items
                               for e in r.expressions], store, data.max_regions)
    if "val" not in out:
        raise DataError(f"{data.path('file')}: no 'val' split to validate on")
    return out


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of (..., 4) boxes, broadcast."""
    return scenes.iou(a.astype(np.float64), b.astype(np.float64))


def to_deltas(boxes: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Faster R-CNN's (dx, dy, log dw, log dh) from ``boxes`` to ``target``, (N, 4) each."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    tw, th = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    cx, cy = boxes[:, 0] + w / 2, boxes[:, 1] + h / 2
    tx, ty = target[:, 0] + tw / 2, target[:, 1] + th / 2
    w, h = np.maximum(w, 1e-3), np.maximum(h, 1e-3)
    return np.stack([(tx - cx) / w, (ty - cy) / h, np.log(np.maximum(tw, 1e-3) / w),
                     np.log(np.maximum(th, 1e-3) / h)], 1).astype(np.float32)


def from_deltas(boxes: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """The inverse of :func:`to_deltas` (the log sizes clipped at log(1000 / 16), as Faster R-CNN does)."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    cx, cy = boxes[:, 0] + w / 2, boxes[:, 1] + h / 2
    dw, dh = (np.minimum(deltas[:, k], np.log(1000 / 16)) for k in (2, 3))
    x, y, nw, nh = cx + deltas[:, 0] * w, cy + deltas[:, 1] * h, w * np.exp(dw), h * np.exp(dh)
    return np.stack([x - nw / 2, y - nh / 2, x + nw / 2, y + nh / 2], 1)


@dataclass
class RECBatch:
    tokens: Tensor  # (B, T)
    features: Tensor
    boxes: Tensor
    padding: Optional[Tensor]
    target: Tensor  # (B,) the proposal that overlaps the referred box most
    deltas: Tensor  # (B, 4) from that proposal to the referred box


class RECTask:
    """Training a grounder on (object, expression) pairs and validating it by accuracy (module docstring)."""

    device = torch.device("cpu")
    metric = "accuracy"
    higher_is_better = True
    extra_metrics = ("accuracy_testA", "accuracy_testB", "baseline_random", "baseline_largest")

    def __init__(self, data: RECData, train: TrainConfig, vocab: Optional[list[str]] = None, *,
                 tests_only: bool = False) -> None:
        """``tests_only`` (with the run's ``vocab``): the test splits alone, for ``interlayer evaluate``."""
        data.validate()
        self.data, self.train_cfg = data, train
        if tests_only and vocab is not None:
            self._tests, self.vocab = None, vocab
            self.index = {w: i for i, w in enumerate(self.vocab)}
            if data.dataset != "scenes":
                self._tests = {k: v for k, v in refer_splits(data).items() if k not in ("train", "val")}
            return
        if data.dataset == "scenes":
            self.train_split, self.valid_split = scene_referrals(data, "train"), scene_referrals(data, "valid")
            self._tests: Optional[dict[str, RECSplit]] = None
        else:
            splits = refer_splits(data)
            self.train_split, self.valid_split = splits["train"], splits["val"]
            self._tests = {k: v for k, v in splits.items() if k not in ("train", "val")}
        counts: dict[str, int] = {}
        for example in self.train_split.examples:
            for word in ptb_tokenize(example.expression).split():
                counts[word] = counts.get(word, 0) + 1
        kept = sorted((w for w, n in counts.items() if n >= data.min_word_count), key=lambda w: (-counts[w], w))
        self.vocab = vocab or list(SPECIALS) + kept
        self.index = {w: i for i, w in enumerate(self.vocab)}

    def test_splits(self) -> dict[str, RECSplit]:
        if self._tests is None:
            self._tests = {name: scene_referrals(self.data, name) for name in ("testA", "testB")}
        return self._tests

    def model_fields(self) -> dict[str, Any]:
        return region_fields(self.data, len(self.vocab))

    def madds_lengths(self) -> tuple[list[int], str]:
        sample = self.train_split.examples[:500]
        words = round(sum(len(self.encode(e.expression)) for e in sample) / len(sample))
        regions = round(sum(len(self.train_split.regions(e.image).boxes) for e in sample) / len(sample))
        return [words, regions], f"mean training expression ({words} words) and image ({regions} regions)"

    def encode(self, text: str) -> list[int]:
        ids = [self.index.get(w, UNK_ID) for w in ptb_tokenize(text).split()][:self.data.max_words]
        return ids or [UNK_ID]

    def batch(self, split: RECSplit, rows: Sequence[int]) -> tuple[RECBatch, list[np.ndarray]]:
        """The model's inputs and targets for ``rows`` of ``split``, and each example's proposal boxes (pixels)."""
        examples = [split.examples[r] for r in rows]
        images = [split.regions(e.image) for e in examples]
        features, boxes, padding = region_batch(images, split.max_regions)
        tokens = [self.encode(e.expression) for e in examples]
        ids = torch.full((len(tokens), max(map(len, tokens))), PAD_ID, dtype=torch.long)
        for i, row in enumerate(tokens):
            ids[i, :len(row)] = torch.tensor(row)
        targets = [int(np.argmax(box_iou(image.boxes, e.box[None]))) for image, e in zip(images, examples)]
        deltas = np.concatenate([to_deltas(image.boxes[t][None], e.box[None])
                                 for image, e, t in zip(images, examples, targets)])
        return (RECBatch(ids, features, boxes, padding, torch.tensor(targets), torch.from_numpy(deltas)),
                [image.boxes for image in images])

    def train_batches(self, epoch: int, seed: int) -> list[list[int]]:
        order = torch.randperm(len(self.train_split.examples),
                               generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        return [chunk.tolist() for chunk in order.split(self.data.batch_size)]

    def prepare(self, rows: list[int]) -> RECBatch:
        return self.batch(self.train_split, rows)[0]

    def loss(self, model: nn.Module, batch: RECBatch) -> tuple[Tensor, dict[str, Tensor], int]:
        batch = move(batch, module_device(model))
        output = model(batch.tokens, batch.features, batch.boxes, batch.padding)
        scores = output.scores.float()
        ce = F.cross_entropy(scores, batch.target)
        total, logs = ce, {"ce": ce.detach()}
        if output.offsets is not None and self.data.box_loss_weight:
            chosen = output.offsets.float()[torch.arange(len(batch.target)), batch.target]
            box = F.smooth_l1_loss(chosen, batch.deltas)
            total = total + self.data.box_loss_weight * box
            logs["box"] = box.detach()
        for name, value in output.aux_losses.items():
            total = total + value
            logs[name] = value.detach()
        logs["loss"] = total.detach()
        logs["score"] = 100.0 * scores.argmax(-1).eq(batch.target).float().mean()
        return total, logs, len(batch.target)

    def validate(self, model: nn.Module) -> dict[str, float]:
        return {"accuracy": rec_accuracy(model, self, self.valid_split)}

    def save_assets(self, directory: Path) -> None:
        directory = Path(directory)
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        write_atomic(directory / "task.json", json.dumps({"task": TASK_NAME, "words": self.vocab,
                                                          "train_examples": len(self.train_split.examples)}))


@torch.no_grad()
def predicted_boxes(model: nn.Module, task: RECTask, split: RECSplit) -> np.ndarray:
    """(N, 4): each example's predicted box, the best-scored proposal moved by its offset (if the model has one)."""
    model.eval()
    device = module_device(model)
    out = []
    for start in range(0, len(split.examples), EVAL_BATCH):
        batch, proposals = task.batch(split, range(start, min(start + EVAL_BATCH, len(split.examples))))
        batch = move(batch, device)
        output = model(batch.tokens, batch.features, batch.boxes, batch.padding)
        chosen = output.scores.argmax(-1).cpu().numpy()
        boxes = np.stack([p[c] for p, c in zip(proposals, chosen)])
        if output.offsets is not None and task.data.box_loss_weight:
            deltas = output.offsets.float()[torch.arange(len(chosen)), torch.from_numpy(chosen).to(device)]
            boxes = from_deltas(boxes, deltas.cpu().numpy())
        out.append(boxes)
    return np.concatenate(out)


def rec_accuracy(model: nn.Module, task: RECTask, split: RECSplit) -> float:
    """Percent of examples whose predicted box overlaps the referred one by IoU >= 0.5."""
    truth = np.stack([e.box for e in split.examples])
    return 100.0 * float((box_iou(predicted_boxes(model, task, split), truth) >= IOU_THRESHOLD).mean())


def baselines(split: RECSplit) -> dict[str, float]:
    """The floors (percent): a random proposal (the expected accuracy, exactly) and the largest proposal."""
    random, largest = [], []
    for example in split.examples:
        boxes = split.regions(example.image).boxes
        hits = box_iou(boxes, example.box[None]) >= IOU_THRESHOLD
        random.append(hits.mean())
        largest.append(hits[int(np.argmax((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))])
    return {"baseline_random": 100.0 * float(np.mean(random)), "baseline_largest": 100.0 * float(np.mean(largest))}


TRAIN_DEFAULTS: dict[str, Any] = dict(lr=5e-4, betas=[0.9, 0.98], schedule="linear", warmup_steps=0,
                                      warmup_fraction=0.05, label_smoothing=0.0, clip_norm=1.0, max_epochs=10,
                                      patience=0, keep_last=1, average_last=0, log_interval=50)


def _convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--refs", required=True, help="the official refs(unc).p (RefCOCO, RefCOCO+)")
    parser.add_argument("--instances", required=True, help="its instances.json (COCO's annotations)")
    parser.add_argument("--output", required=True, help="the JSON to write (train rec --set data.file=...)")


def _convert(args: argparse.Namespace, argv: Sequence[str]) -> None:
    counts = convert_refer(Path(args.refs), Path(args.instances), Path(args.output))
    shown = ", ".join(f"{split} {n:,}" for split, n in counts.items())
    print(f"wrote {args.output}: {shown} referred objects; train with: interlayer train rec --dataset refcoco "
          f"--data-dir DIR --set data.file={args.output}")


class RECSpec(TaskSpec):
    """Referring expression comprehension over region proposals: a score and a box offset per region."""

    name = TASK_NAME
    description = ("referring expression comprehension over region features (default: generated scenes; RefCOCO / "
                   "RefCOCO+ with --data-dir)")
    default_preset = "rec_transformer_small"
    data_class = RECData
    train_defaults = TRAIN_DEFAULTS

    def make_task(self, data: RECData, train: TrainConfig, run_dir: Optional[Path]) -> RECTask:
        return RECTask(data, train, saved_words(run_dir))

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: RECTask) -> Any:
        return region_model(preset, model_sets, task.model_fields(), "rec",
                            "REC needs head=rec (e.g. rec_transformer_small)")

    def scores(self, model: nn.Module, task: RECTask) -> dict[str, Any]:
        """Accuracy per test split and over all of them, and the baselines over all of them."""
        tests = task.test_splits()
        out: dict[str, Any] = {}
        hits = total = 0.0
        for name, split in tests.items():
            out[f"accuracy_{name}"] = rec_accuracy(model, task, split)
            hits += out[f"accuracy_{name}"] * len(split.examples)
            total += len(split.examples)
            out.update({f"{k}_{name}": v for k, v in baselines(split).items()})
        out["accuracy"] = hits / total
        for kind in ("baseline_random", "baseline_largest"):
            out[kind] = sum(out[f"{kind}_{n}"] * len(s.examples) for n, s in tests.items()) / total
        return out

    def finish(self, task: RECTask, run_dir: Path, state: Any, options: dict[str, Any]) -> dict[str, Any]:
        model = load_pretrained(run_dir / "best", task.device)
        start = time.perf_counter()
        scores = self.scores(model, task)
        write_atomic(run_dir / "test_report.txt", format_report(scores, f"{task.data.dataset} tests") + "\n")
        results = {f"test_{k}": v for k, v in scores.items()}
        results.update({k: v for k, v in scores.items() if k.startswith("baseline_")})
        results.update(test_seconds=time.perf_counter() - start, test_report="test_report.txt",
                       parameters=count_parameters(model),
                       madds_per_expression=count_madds(model, *task.madds_lengths()[0]))
        return results

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        directory = Path(directory)
        data = self.saved_data(directory)
        if args.data:
            data.dir = args.data
        words = read_json(directory / "task.json", DataError, within=directory)["words"]
        task = RECTask(data, TrainConfig(), words, tests_only=True)
        model = load_pretrained(directory, getattr(args, "device", None))
        return format_report(self.scores(model, task), f"{data.dataset} tests ({data.dir or 'generated'})")

    def commands(self) -> dict[str, TaskCommand]:
        return {"convert-refer": TaskCommand(
            "convert the official RefCOCO files (refs(unc).p, instances.json) into the JSON train rec reads",
            "Read refs(unc).p with an unpickler that refuses every global (nothing in it can run) and COCO's "
            "instances.json, and write {split: [{iid, bbox, refs}]} (docs/rec.md).", _convert_arguments, _convert)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dataset", choices=get_args(Dataset),
                            help="scenes (default; generated here) or refcoco (the converted JSON and region "
                                 "features from --data-dir); same as --set data.dataset=NAME")
        parser.add_argument("--data-dir", metavar="PATH", help="refcoco: the folder holding refcoco.json and "
                                                               "features/ (docs/rec.md)")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        keys = {"data.dataset": args.dataset, "data.dir": args.data_dir}
        return {key: value for key, value in keys.items() if value}, {}


def format_report(scores: dict[str, Any], source: str) -> str:
    splits = sorted({k[len("accuracy_"):] for k in scores if k.startswith("accuracy_")})
    rows = [[name] + [f"{scores[f'{kind}_{name}']:.2f}" for kind in ("accuracy", "baseline_random",
                                                                    "baseline_largest")] for name in splits]
    rows.append(["all"] + [f"{scores[kind]:.2f}" for kind in ("accuracy", "baseline_random", "baseline_largest")])
    return (f"REC accuracy (percent, IoU >= 0.5) on {source}\n\n"
            + format_table(["split", "model", "random proposal", "largest proposal"], rows))
