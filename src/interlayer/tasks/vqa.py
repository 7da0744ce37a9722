"""Visual question answering with MCAN (Yu et al. 2019):
``interlayer train vqa --dataset sort_of_clevr|vqa2|clevr|gqa``.

The setting of LW-Transformer Sec. IV (MCAN on VQA2.0, GQA, CLEVR) and Crossformer Sec. 3.2 / App. A.2 (a
four-layer MCAN on VQA-v2, clean and noisy, with PAvPU); the model is :mod:`interlayer.models.mcan`.

* **Data** (:mod:`.vqa_data`). ``sort_of_clevr`` (default) is generated here (:mod:`interlayer.data.sort_of_clevr`:
  10,000 / 1,000 / 1,000 questions from release seed 0); its 75 x 75 pixels go to MCAN's CNN stem, trained end to
  end (``image_input="pixels"``), scaled to [0, 1] as in Santoro et al.'s code, or with
  ``data.image_features=objects`` each image is its six object regions (window and centre, as a perfect detector's
  boxes), read as region features like VQA v2's. ``vqa2``, ``clevr`` and ``gqa`` are read from ``--data-dir`` in
  their publishers' formats with precomputed region features (:mod:`interlayer.data.vqa_formats`). The training
  file is split by image into training and validation (``valid_fraction``, fixed ``split_seed``); the test split is
  the official validation set for VQA v2 and CLEVR (whose test answers are not public; Crossformer App. A.2
  evaluates on VQA v2 val too) and test-dev for GQA.
* **Training.** Sigmoid outputs and binary cross-entropy on soft scores (MCAN; Teney et al. 2018): an answer's
  target is its official VQA accuracy, 0.3 per agreeing annotator up to 1 (one-hot for the single-answer sets),
  summed over the answers and averaged over the questions. MCAN's recipe: Adam (0.9, 0.98), batch 64, learning
  rate ``min(2.5e-5 * epoch, 1e-4)`` then x0.2 every 2 epochs after epoch 10, 13 epochs; here a linear warm-up and
  decay (``train.*``) stand in for the epoch-wise steps.
* **Evaluation** (:func:`score`): accuracy (VQA v2: the official VQA accuracy) overall and per question type
  (Sort-of-CLEVR: also relational / non-relational), and PAvPU from 20 passes with attention dropout on
  (:mod:`.vqa_metrics`; ``model.mc_attention``: Monte-Carlo dropout of the attention weights is the sampling of
  attention weights a deterministic-attention model offers, Fan et al.'s stochastic attention being a different
  model). ``noise_std`` adds Gaussian noise (mean 0, variance ``noise_std^2``, Crossformer Sec. 3.2: variance 1) to the
  region features where MCAN projects them to ``d_model``: the input features, or for pixels the CNN stem's output cells
  (the "image features" MCAN's attention reads), never the pixels; drawn once per question, the same in all 21 passes
  (handed to ``MCAN.forward`` as ``feature_noise``). ``finish`` scores the test split clean and with noise 1.0 and draws
  ``attention.png``: a test image, its question and answers, and MCAN's attention over the image regions.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from ..accounting import count_madds, count_parameters
from ..data import sort_of_clevr as soc
from ..data.vqa_formats import (
    VQAItem,
    answer_vocabulary,
    normalize_answer,
    word_vocabulary,
)
from ..errors import ConfigError, DataError
from ..fileio import read_json, write_atomic
from ..models.mcan import MODEL_TYPE, MCANConfig
from ..models.registry import get_config, load_pretrained
from ..tables import format_table
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import TaskSpec
from .vqa_data import (
    DATASETS,
    PAD,
    SPECIALS,
    Split,
    Vocab,
    VQAData,
    held_out,
    load_test_split,
    make_split,
    read_items,
    region_images,
    sort_of_clevr_split,
)
from .vqa_metrics import SAMPLES, PAvPU, by_type, certainty, vqa_accuracy

TASK_NAME = "vqa"
EVAL_BATCH = 256
NOISE_STD = 1.0  # Crossformer Sec. 3.2: Gaussian noise of mean 0 and variance 1


# -- scoring --------------------------------------------------------------------------------------------------
def item_scores(items: Sequence[VQAItem], predicted: Sequence[str], dataset: str) -> np.ndarray:
    """Per question 0..1: the official VQA accuracy (VQA v2) or whether the answer is right."""
    if dataset == "vqa2":
        return np.array([vqa_accuracy(p, item.answers) for item, p in zip(items, predicted)])
    return np.array([float(normalize_answer(p) == item.label) for item, p in zip(items, predicted)])


def accurate(items: Sequence[VQAItem], predicted: Sequence[str], dataset: str) -> np.ndarray:
    """PAvPU's "accurate": right (single answer), or on VQA v2 fully right, min(#humans / 3, 1) = 1: at least 3 of
    the 10 humans gave the answer (the metric's own notion of a correct answer)."""
    if dataset == "vqa2":
        return np.array([sum(normalize_answer(a) == normalize_answer(p) for a in item.answers) >= 3
                         for item, p in zip(items, predicted)])
    return item_scores(items, predicted, dataset) == 1.0


@torch.no_grad()
def score(model: nn.Module, split: Split, vocab: Vocab, dataset: str, *, noise_std: float = 0.0,
          samples: int = SAMPLES, seed: int = 0, batch_size: int = EVAL_BATCH) -> dict[str, Any]:
    """Accuracy (percent) overall, per question type and (Sort-of-CLEVR) relational / non-relational; the BCE;
    the predictions and region attention of the deterministic model; PAvPU from ``samples`` passes with attention
    dropout on (0: none). ``noise_std``: Gaussian noise on the region features (module docstring), drawn from
    ``seed`` once per batch and read by the deterministic pass and every sample."""
    model.eval()
    device = module_device(model)
    predicted: list[int] = []
    attention: list[Tensor] = []
    bce = 0.0
    pavpu = PAvPU()
    samples = samples if model.config.attn_dropout > 0 else 0  # nothing to sample without attention dropout
    noise_generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(split), batch_size):
            rows = range(start, min(start + batch_size, len(split)))
            question, question_padding, image, image_padding = move(split.inputs(rows), device)
            # drawn once per batch on the CPU (the same numbers on any device), read by all 1 + samples passes
            noise = (noise_std * torch.randn(model.region_feature_shape(image), generator=noise_generator)
                     ).to(device) if noise_std else 0.0
            output = model(question, question_padding, image, image_padding, feature_noise=noise)
            logits = output.logits.float()
            bce += float(F.binary_cross_entropy_with_logits(
                logits, split.target_matrix(rows, len(vocab.answers)).to(device), reduction="sum"))
            predicted += logits.argmax(-1).tolist()
            attention += list(output.region_attention.float().cpu())
            if samples:
                model.mc_attention(True)
                try:
                    probs = torch.stack([torch.sigmoid(model(question, question_padding, image, image_padding,
                                                             feature_noise=noise).logits.float()).cpu()
                                         for _ in range(samples)])
                finally:
                    model.mc_attention(False)
                choice, certain = certainty(probs.numpy())
                pavpu.add(accurate([split.items[r] for r in rows], [vocab.answers[c] for c in choice], dataset),
                          certain)
    answers = [vocab.answers[p] for p in predicted]
    scores = item_scores(split.items, answers, dataset)
    types = [item.question_type for item in split.items]
    metrics: dict[str, Any] = {"accuracy": 100.0 * float(scores.mean()), "bce": bce / len(split),
                               "per_type": by_type(scores, types), "predicted": answers, "attention": attention}
    if dataset == "sort_of_clevr":
        relational = np.array([t in soc.RELATIONAL for t in types])
        metrics["accuracy_relational"] = 100.0 * float(scores[relational].mean())
        metrics["accuracy_non_relational"] = 100.0 * float(scores[~relational].mean())
    if samples:
        metrics["pavpu"] = pavpu.value
        metrics["pavpu_counts"] = asdict(pavpu)
    return metrics


SUMMARY_KEYS = ("accuracy", "accuracy_relational", "accuracy_non_relational", "pavpu")


def format_report(clean: dict[str, Any], noisy: Optional[dict[str, Any]], source: str) -> str:
    """The metrics as a table (clean, and with noise when scored), then accuracy per question type."""
    columns = [("clean", clean)] + ([(f"noise std {noisy['noise_std']}", noisy)] if noisy else [])
    rows = [[key] + [f"{m[key]:.2f}" if key in m else "–" for _, m in columns] for key in SUMMARY_KEYS
            if key in clean]
    types = [[kind] + [f"{m['per_type'].get(kind, 0.0):.2f}" for _, m in columns] for kind in clean["per_type"]]
    parts = [f"VQA metrics (percent) on {source}", format_table(["metric"] + [c for c, _ in columns], rows)]
    if types:
        parts.append("accuracy per question type\n" + format_table(["type"] + [c for c, _ in columns], types))
    return "\n\n".join(parts)


def attention_picture(split: Split, index: int, metrics: dict[str, Any], path: Path) -> Path:
    """A test image with MCAN's attention over its regions (the image AttFlat weights: over the grid cells, or
    circles on Sort-of-CLEVR's object regions; region-feature data sets have no pixels here: a bar chart), and the
    question, answer and prediction."""
    item = split.items[index]
    weights = metrics["attention"][index].numpy()
    image = split.images.picture(item.image)
    fig = Figure(figsize=(7.0, 4.0), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2)
    side = int(round(np.sqrt(len(weights))))
    if image is not None and hasattr(split.images, "region_centres"):
        left.imshow(image)
        left.set_title("image")
        right.imshow(image)
        xs, ys = split.images.region_centres(item.image).T
        right.scatter(xs, ys, s=2000 * weights, facecolors="none", edgecolors="black", linewidths=2)
        for x, y, w in zip(xs, ys, weights):
            right.annotate(f"{w:.2f}", (x, y), xytext=(0, 9), textcoords="offset points", ha="center", fontsize=7)
        right.set_title("attention over the object regions")
    elif image is not None and side * side == len(weights):
        left.imshow(image)
        left.set_title("image")
        right.imshow(image)
        right.imshow(weights.reshape(side, side), cmap="inferno", alpha=0.6, interpolation="nearest",
                     extent=(0, image.shape[1], image.shape[0], 0))
        right.set_title(f"attention over the {side} x {side} grid")
    else:
        left.axis("off")
        right.bar(np.arange(len(weights)), weights)
        right.set_xlabel("region")
        right.set_title("attention over the regions")
    if image is not None:
        for axis in (left, right):
            axis.set_xticks([])
            axis.set_yticks([])
    fig.suptitle(f"Q: {item.question}\nanswer: {item.label}   predicted: {metrics['predicted'][index]}", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


# -- the task -------------------------------------------------------------------------------------------------
class VQATask:
    """Training and scoring MCAN on question answering (module docstring): questions and answers encoded with the run's
    vocabularies, images as features or pixels, the answer cross-entropy, and validation by accuracy; at the end the
    test split is scored clean and noisy, with PAvPU."""

    device = torch.device("cpu")
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, data: VQAData, train: TrainConfig) -> None:
        data.validate()
        self.data, self.train_cfg = data, train
        if data.dataset == "sort_of_clevr":
            self.vocab = Vocab(list(SPECIALS) + list(soc.WORDS), list(soc.ANSWERS))
            parts = {name: sort_of_clevr_split(data, name) for name in ("train", "valid")}
        else:
            items = read_items(data, "train")
            train_items, valid_items = held_out(items, data.valid_fraction, data.split_seed)
            self.vocab = Vocab(word_vocabulary(train_items, SPECIALS),
                               answer_vocabulary(train_items, data.min_answer_count))
            images = region_images(data, "train", items)
            parts = {"train": (train_items, images), "valid": (valid_items, images)}
        self.train_set, self.valid_set = (make_split(items, images, self.vocab, data.max_question_len, data.dataset)
                                          for items, images in parts.values())

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """The test metrics beside accuracy in a comparison's table."""
        split = ("accuracy_relational", "accuracy_non_relational") if self.data.dataset == "sort_of_clevr" else ()
        return split + ("pavpu", "noisy_accuracy") + tuple(f"noisy_{k}" for k in split) + ("noisy_pavpu",)

    def model_fields(self) -> dict[str, Any]:
        sort_of_clevr = self.data.dataset == "sort_of_clevr"
        fields = {"vocab_size": len(self.vocab.words), "num_answers": len(self.vocab.answers),
                  "max_question_len": self.data.max_question_len, "pad_id": PAD}
        if sort_of_clevr and self.data.image_features == "objects":
            return {**fields, "image_input": "features", "feature_dim": soc.OBJECT_FEATURE_DIM,
                    "max_regions": len(soc.COLOURS)}
        if sort_of_clevr:  # the RN's stem: 24 channels (Santoro et al. 2017), over 75 x 75 RGB
            return {**fields, "image_input": "pixels", "feature_dim": 24, "image_size": soc.IMAGE_SIZE,
                    "image_channels": 3}
        return {**fields, "image_input": "features", "feature_dim": self.data.feature_dim,
                "max_regions": self.data.max_regions}

    def check_inputs(self, model: nn.Module) -> None:
        """Before training: the test split's questions and region features too (the training and validation
        features were checked when the task was made), read and checked once (``check_images``); kept for the
        final scoring, which then reads them no second time."""
        if self.data.dataset != "sort_of_clevr":
            self.test_split = load_test_split(self.data, self.vocab)

    def madds_lengths(self) -> tuple[list[int], str]:
        """The MAdds column's lengths: the mean training question (MCAN's ``madds(question_len)``)."""
        length = round(float(self.train_set.questions.ne(PAD).sum(1).float().mean()))
        return [length], f"mean training question of {length} words, one image"

    def train_batches(self, epoch: int, seed: int) -> list[Tensor]:
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        return list(torch.randperm(len(self.train_set), generator=generator).split(self.data.batch_size))

    def prepare(self, batch: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
        """The model's inputs for the batch's rows and their soft answer targets, built on the host."""
        rows = batch.tolist()
        return self.train_set.inputs(rows), self.train_set.target_matrix(rows, len(self.vocab.answers))

    def loss(self, model: nn.Module, batch: tuple[tuple[Tensor, ...], Tensor]
             ) -> tuple[Tensor, dict[str, Tensor], int]:
        inputs, target = move(batch, module_device(model))
        output = model(*inputs)
        logits = output.logits.float()
        bce = F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(target)
        total = bce
        logs = {"bce": bce.detach()}
        for name, value in output.aux_losses.items():
            total = total + value
            logs[name] = value.detach()
        logs["loss"] = total.detach()
        logs["score"] = 100.0 * target.gather(1, logits.argmax(-1, keepdim=True)).mean()
        return total, logs, len(target)

    def validate(self, model: nn.Module) -> dict[str, float]:
        metrics = score(model, self.valid_set, self.vocab, self.data.dataset, samples=0)
        return {k: v for k, v in metrics.items() if isinstance(v, float)}

    def save_assets(self, directory: Path) -> None:
        directory = Path(directory)
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        write_atomic(directory / "task.json", json.dumps({
            "task": TASK_NAME, "dataset": self.data.dataset, "words": self.vocab.words,
            "answers": self.vocab.answers, "train_size": len(self.train_set), "valid_size": len(self.valid_set)}))


# MCAN's recipe (Yu et al. 2019; Crossformer App. A.2): Adam (0.9, 0.98), base lr 1e-4 for batches of 64, 13
# epochs; a linear warm-up over 5% of the steps and a linear decay stand in for the epoch-wise warm-up and steps.
TRAIN_DEFAULTS: dict[str, Any] = dict(lr=1e-4, betas=[0.9, 0.98], schedule="linear", warmup_steps=0,
                                      warmup_fraction=0.05, weight_decay=0.0, label_smoothing=0.0, clip_norm=0.0,
                                      max_epochs=13, patience=0, keep_last=1, average_last=0, log_interval=50)

class VQASpec(TaskSpec):
    """Visual question answering with MCAN: BCE on soft scores, VQA accuracy, PAvPU, clean and noisy features."""

    name = TASK_NAME
    description = ("visual question answering with MCAN (default: Sort-of-CLEVR, generated; VQA v2, CLEVR, GQA with "
                   "--dataset and --data-dir)")
    default_preset = "mcan_4layer"
    data_class = VQAData
    train_defaults = TRAIN_DEFAULTS

    def finish(self, task: VQATask, run_dir: Path, state: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Score ``best/`` on the test split, clean and with noise of variance 1 (Crossformer Sec. 3.2); write
        ``test_report.txt`` and ``attention.png``."""
        model = load_pretrained(run_dir / "best", task.device)
        split = getattr(task, "test_split", None) or load_test_split(task.data, task.vocab)
        start = time.perf_counter()
        kwargs = dict(samples=task.data.pavpu_samples, seed=task.train_cfg.seed)
        clean = score(model, split, task.vocab, task.data.dataset, **kwargs)
        noisy = score(model, split, task.vocab, task.data.dataset, noise_std=NOISE_STD, **kwargs)
        noisy["noise_std"] = NOISE_STD
        seconds = time.perf_counter() - start
        write_atomic(run_dir / "test_report.txt", format_report(clean, noisy, f"{task.data.dataset} test") + "\n")
        attention_picture(split, 0, clean, run_dir / "attention.png")
        results: dict[str, Any] = {f"test_{k}": v for k, v in clean.items() if isinstance(v, (float, dict))
                                   and k != "pavpu_counts"}
        results.update({f"test_noisy_{k}": v for k, v in noisy.items() if isinstance(v, float) and k != "noise_std"})
        results.update(test_pavpu_counts=clean["pavpu_counts"], test_noisy_pavpu_counts=noisy["pavpu_counts"],
                       test_report="test_report.txt", attention_picture="attention.png", test_seconds=seconds,
                       parameters=count_parameters(model),
                       madds_per_question=count_madds(model, *task.madds_lengths()[0]))
        return results

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """``interlayer evaluate`` for VQA: the run's test split (``--data DIR``: the same files in another folder),
        clean, and with ``--noise-std`` (default 0: clean only) Gaussian noise on the image features, drawn from the
        run's seed (``train_config.json``), so that ``--noise-std 1.0`` repeats the run's own noisy figures."""
        directory = Path(directory)
        data = self.saved_data(directory)
        info = read_json(directory / "task.json", DataError, within=directory)
        if args.data:
            data.dir = args.data
        vocab = Vocab(info["words"], info["answers"])
        model = load_pretrained(directory, getattr(args, "device", None))
        noise = float(getattr(args, "noise_std", 0.0) or 0.0)
        if not 0 <= noise < math.inf:  # NaN fails every comparison
            raise ConfigError(f"--noise-std {noise} must be a finite number, not negative")
        split = load_test_split(data, vocab)
        # the run's seed, as ``finish`` used it: the same noise and attention samples, so the same figures
        train_config = directory / "train_config.json"
        seed = (int(read_json(train_config, DataError, within=directory).get("seed", TrainConfig.seed))
                if os.path.lexists(train_config) else TrainConfig.seed)
        clean = score(model, split, vocab, data.dataset, samples=data.pavpu_samples, seed=seed)
        noisy = (score(model, split, vocab, data.dataset, noise_std=noise, samples=data.pavpu_samples, seed=seed)
                 if noise else None)
        if noisy is not None:
            noisy["noise_std"] = noise
        return format_report(clean, noisy, f"{data.dataset} test ({data.dir or 'generated'})")

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: VQATask) -> MCANConfig:
        """An MCAN preset (or config file) with the fields the data decides, then the user's overrides; region
        features fix the input width, so an override of it is refused here rather than at the first batch."""
        fields = task.model_fields()
        config = get_config(get_config(preset, family=MODEL_TYPE, **fields), family=MODEL_TYPE, **model_sets)
        if fields["image_input"] == "features":
            for key in ("image_input", "feature_dim"):
                if getattr(config, key) != fields[key]:
                    raise ConfigError(f"{key}={getattr(config, key)}: this data gives region features of "
                                      f"{fields['feature_dim']} values (image_input='features'); drop the override"
                                      " (VQA v2 / CLEVR / GQA: set data.feature_dim to the files' width)")
        else:  # pixels: the stem's width (feature_dim) is the model's; the picture's shape is the data's
            for key in ("image_input", "image_size", "image_channels"):
                if getattr(config, key) != fields[key]:
                    raise ConfigError(f"{key}={getattr(config, key)!r}: Sort-of-CLEVR's pictures are "
                                      f"{fields['image_channels']} x {fields['image_size']} x "
                                      f"{fields['image_size']} pixels (image_input='pixels'), which the model must "
                                      f"read as they are; drop the override")
        return config

    def make_task(self, data: VQAData, train: TrainConfig, run_dir: Optional[Path]) -> VQATask:
        """Nothing to reload on resume: vocabularies and splits are recomputed from the data and its seeds."""
        return VQATask(data, train)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dataset", choices=DATASETS,
                            help="sort_of_clevr (default; generated here) or a data set read from --data-dir; "
                                 "same as --set data.dataset=NAME")
        parser.add_argument("--data-dir", metavar="PATH",
                            help="folder of the vqa2 / clevr / gqa files (docs/vqa.md); same as --set data.dir=PATH")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        keys = {"data.dataset": args.dataset, "data.dir": args.data_dir}
        return {key: value for key, value in keys.items() if value}, {}
