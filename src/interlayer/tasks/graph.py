"""Transductive node classification on Cora and Citeseer: GAT and its Crossformer adaptations (Crossformer Sec. 3.3,
Table 5, App. A.3), trained full-batch on the shared engine.

Recipe (GAT paper Sec. 3.3, which Crossformer App. A.3 follows; GAT's official code where the text is silent):

* one batch per epoch: the whole graph; the loss is the cross-entropy of the 140 (Cora) / 120 (Citeseer) training
  nodes; features row-normalised (``data.normalize_features``, the official ``preprocess_features``);
* Adam, lr 0.005, betas (0.9, 0.999), constant rate, no warm-up, no clipping, no label smoothing; L2 5e-4 as
  Adam's ``weight_decay`` on every parameter (the official ``l2_loss`` term: its gradient ``5e-4 * w`` is what
  Adam's coupled weight decay adds; the official name filter excludes no variable, so biases are decayed too);
* up to 100,000 epochs with patience 100 under GAT's rule (:meth:`NodeClassificationTask.is_improvement`);
* the test accuracy of ``best/`` is reported (percent, like the paper's tables).

**Model selection**, as the official code: the patience resets when the validation accuracy is >= its best so
far *or* the validation loss is <= its lowest so far (the two bests kept separately, :meth:`is_improvement`), and
the model is saved only when both hold (:meth:`is_best`); the last saved epoch is tested.

Runs: ``interlayer train cora`` (``citeseer``), presets ``gat_cora``, ``gat_cora_crossformer_kq``,
``gat_cora_crossformer_ffn`` and their ``citeseer`` twins (``docs/classification-graph.md``).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds, count_parameters
from ..core.losses import label_smoothed_nll, total_loss
from ..data.parallel import resolve_path
from ..data.planetoid import PlanetoidGraph, load_planetoid
from ..errors import ConfigError
from ..fileio import write_atomic
from ..models.gat import MODEL_TYPE, GATConfig, with_self_loops
from ..models.registry import get_config, load_pretrained
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import TaskSpec
from .metrics import accuracy, confusion_matrix, format_report, percent_correct


@dataclass
class GraphData:
    """``source``: a ``.npz`` (``interlayer.data.planetoid.save_npz``) or the prefix ``DIR/ind.NAME`` of the raw
    Planetoid files; ``bundled:planetoid/NAME.npz`` is shipped with interlayer."""

    source: str = ""
    normalize_features: bool = True  # divide each feature row by its sum (GAT's and Kipf's preprocessing)

    def validate(self) -> None:
        if not self.source:
            raise ConfigError("data.source is empty: give a .npz file or a raw Planetoid prefix such as "
                              "/path/to/planetoid/ind.cora")


@dataclass
class CoraData(GraphData):
    source: str = "bundled:planetoid/cora.npz"


@dataclass
class CiteseerData(GraphData):
    source: str = "bundled:planetoid/citeseer.npz"


@dataclass
class GraphBatch:
    """The nodes whose labels enter the loss; the whole graph is the input (transductive, full-batch)."""

    nodes: Tensor


class NodeClassificationTask:
    """Transductive node classification (module docstring): the whole graph is every batch's input, the loss is the
    cross-entropy of the training nodes, and validation is the accuracy on the validation nodes."""

    device = torch.device("cpu")  # the engine sets the training device (Task.device)
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, name: str, data: GraphData, train: TrainConfig) -> None:
        data.validate()
        self.name, self.data, self.train_cfg = name, data, train
        self.graph = load_planetoid(data.source)
        self.inputs = GraphInputs(self.graph, data.normalize_features)

    def data_files(self) -> list[tuple[str, Path]]:
        """The ``.npz``, or the raw Planetoid files of the prefix by their suffix (the run's data fingerprint)."""
        path = resolve_path(self.data.source)
        if path.suffix == ".npz":
            return [("graph", path)]
        return sorted((p.name[len(path.name) + 1:], p) for p in path.parent.glob(f"{path.name}.*") if p.is_file())

    def model_fields(self) -> dict[str, Any]:
        """The data decides the input width and the number of classes."""
        return {"in_features": self.graph.num_features, "num_classes": self.graph.num_classes}

    def train_batches(self, epoch: int, seed: int) -> list[GraphBatch]:
        return [GraphBatch(self.inputs.split("train"))]

    def prepare(self, batch: GraphBatch) -> tuple[Tensor, Tensor]:
        """The training nodes and their labels, indexed on the host where the labels are kept (nodes moved to a GPU
        first could not index them); the engine moves both."""
        return batch.nodes, self.inputs.labels[batch.nodes]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor], int]:
        nodes, labels = move(batch, module_device(model))
        smoothing = self.train_cfg.label_smoothing
        loss, logs = total_loss(self.inputs.run(model),
                                lambda logits: label_smoothed_nll(logits[nodes], labels, smoothing))
        return loss, logs, len(nodes)

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        return self.inputs.score(model, "valid")

    @staticmethod
    def is_improvement(metrics: dict[str, float], best: dict[str, float]) -> bool:
        """GAT's early-stopping rule (official ``execute_cora.py``): the validation accuracy is at least the best
        so far *or* the validation loss at most the lowest so far, each best kept on its own (ties count).

        The two running bests are recorded in ``metrics`` as ``best_accuracy`` / ``best_nll`` when the epoch
        improves: the engine keeps an improving epoch's metrics as ``best_metrics`` (checkpointed, so the rule
        survives a resume), and the bests change only on improving epochs.
        """
        best_accuracy = best.get("best_accuracy", best["accuracy"])
        best_nll = best.get("best_nll", best["nll"])
        improved = metrics["accuracy"] >= best_accuracy or metrics["nll"] <= best_nll
        if improved:
            metrics["best_accuracy"] = max(metrics["accuracy"], best_accuracy)
            metrics["best_nll"] = min(metrics["nll"], best_nll)
        return improved

    @staticmethod
    def is_best(metrics: dict[str, float], best: dict[str, float]) -> bool:
        """GAT's saving rule (official ``execute_cora.py``): the validation accuracy at least its best so far *and*
        the loss at most its lowest so far; ``best/`` is the last such epoch."""
        return (metrics["accuracy"] >= best.get("best_accuracy", best["accuracy"])
                and metrics["nll"] <= best.get("best_nll", best["nll"]))

    def save_assets(self, directory: Path) -> None:
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        write_atomic(directory / "task.json", json.dumps({"task": self.name, "graph": self.graph.name,
                                                         "nodes": self.graph.num_nodes,
                                                         "edges": self.graph.num_edges}))


class GraphInputs:
    """A graph as tensors (sparse features, edges, labels, splits) and the model's scores on it."""

    def __init__(self, graph: PlanetoidGraph, normalize: bool) -> None:
        self.graph = graph
        self.features = graph.features(normalize)
        self.edges = torch.from_numpy(graph.edges)
        self.labels = torch.from_numpy(graph.labels)
        self._splits = {split: torch.from_numpy(getattr(graph, split)) for split in ("train", "valid", "test")}
        self.edges = with_self_loops(self.edges, graph.num_nodes)  # once: the model is told (GAT.forward)
        self._on: tuple[torch.device, Tensor, Tensor] = (self.features.device, self.features, self.edges)

    def split(self, name: str) -> Tensor:
        return self._splits[name]

    def run(self, model: nn.Module) -> Any:
        """The model over the whole graph, on the model's device (the graph is copied there once and kept)."""
        device = module_device(model)
        if self._on[0] != device:
            self._on = (device, move(self.features, device), move(self.edges, device))
        return model(self._on[1], self._on[2], self_loops=True)

    def check(self, model: nn.Module, source: str) -> None:
        cfg = model.config
        if (cfg.in_features, cfg.num_classes) != (self.graph.num_features, self.graph.num_classes):
            raise ConfigError(f"{source} has {self.graph.num_features} features and {self.graph.num_classes} "
                              f"classes, but the model expects {cfg.in_features} and {cfg.num_classes}")

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str) -> tuple[Tensor, Tensor]:
        """(class scores, gold labels) of the split's nodes, in evaluation mode (no dropout)."""
        model.eval()
        nodes = self.split(split)
        return self.run(model).logits[move(nodes, module_device(model))].float().cpu(), self.labels[nodes]

    def score(self, model: nn.Module, split: str) -> dict[str, float]:
        """Accuracy in percent and mean cross-entropy (GAT's two early-stopping quantities)."""
        logits, gold = self.predict(model, split)
        return {"accuracy": percent_correct(logits, gold), "nll": float(F.cross_entropy(logits.float(), gold))}


def report(source: str, logits: Tensor, gold: Tensor, num_classes: int) -> str:
    """Accuracy, per-class precision/recall/F1 and the confusion matrix (rows gold, columns predicted)."""
    matrix = confusion_matrix(gold, logits.argmax(-1), num_classes)
    return format_report(f"{source}: {len(gold)} test nodes, accuracy {accuracy(matrix):.2f}", matrix,
                         [str(c) for c in range(num_classes)])


# GAT Sec. 3.3 / Crossformer App. A.3; log and epoch checkpoints every epoch (an epoch is one step), keep one.
# One thread: the per-op work (~13k edges) is too small for intra-op threads to pay; run seeds in parallel.
TRAIN_DEFAULTS: dict[str, Any] = dict(lr=0.005, schedule="constant", warmup_steps=0, betas=[0.9, 0.999],
                                      adam_eps=1e-8, weight_decay=5e-4, label_smoothing=0.0, clip_norm=0.0,
                                      max_epochs=100_000, patience=100, keep_last=1, average_last=0, log_interval=1,
                                      threads=1)


class NodeClassificationSpec(TaskSpec):
    """Transductive node classification on a Planetoid graph with GAT (Crossformer Table 5); one subclass per
    graph."""

    train_defaults = TRAIN_DEFAULTS

    def make_task(self, data: GraphData, train: TrainConfig, run_dir: Optional[Path]) -> NodeClassificationTask:
        return NodeClassificationTask(self.name, data, train)  # nothing to reload on resume: the data decide all

    def finish(self, task: NodeClassificationTask, run_dir: Path, state: Any, options: dict[str, Any]
               ) -> dict[str, Any]:
        """Score ``best/`` once on the test nodes."""
        model = load_pretrained(run_dir / "best", task.device).eval()
        test, valid = task.inputs.score(model, "test"), task.inputs.score(model, "valid")
        graph = task.graph
        return {"test_accuracy": test["accuracy"], "test_nll": test["nll"], "valid_accuracy": valid["accuracy"],
                "valid_nll": valid["nll"], "test_nodes": len(graph.test), "parameters": count_parameters(model),
                "madds": count_madds(model, graph.num_nodes, graph.num_edges)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--graph", metavar="PATH", help="a .npz graph or a raw Planetoid prefix DIR/ind.NAME "
                                                            "(default: the bundled copy)")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        return ({"data.source": args.graph} if args.graph else {}), {}

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """The saved model on the test nodes of ``--data`` (default: the run's graph)."""
        model = load_pretrained(directory, getattr(args, "device", None)).eval()
        data = self.saved_data(directory)
        source = args.data or data.source
        inputs = GraphInputs(load_planetoid(source), data.normalize_features)
        inputs.check(model, source)
        logits, gold = inputs.predict(model, "test")
        return report(source, logits, gold, model.config.num_classes)

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: NodeClassificationTask) -> GATConfig:
        """A GAT preset or config file, then the data's fields (input width, classes), then the user's ``--set``."""
        return get_config(preset, family=MODEL_TYPE, **task.model_fields(), **model_sets)



class CoraSpec(NodeClassificationSpec):
    name = "cora"
    description = "Cora node classification, 7 classes, 140/500/1000 nodes (Crossformer Table 5; bundled)"
    default_preset = "gat_cora"
    data_class = CoraData


class CiteseerSpec(NodeClassificationSpec):
    name = "citeseer"
    description = "Citeseer node classification, 6 classes, 120/500/1000 nodes (Crossformer Table 5; bundled)"
    default_preset = "gat_citeseer"
    data_class = CiteseerData
