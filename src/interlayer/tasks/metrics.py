"""Classification metrics shared by the text, image and graph tasks: one confusion matrix and what it yields.

Every score is a percentage computed from integer counts (so 161/200 reads 80.5, not float32's
80.50000071525574), and a score whose denominator is zero (a class never predicted, or absent from the split) is
0 rather than NaN, as scikit-learn's ``zero_division=0``. Precision, recall and F1 are per class (no averaging:
each task says which figure it reports, e.g. MRPC's F1 of the paraphrase class, the GLUE convention).
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import torch
from torch import Tensor

from ..tables import format_table

Labels = Union[Sequence[int], Tensor]


def confusion_matrix(gold: Labels, predicted: Labels, num_classes: int) -> list[list[int]]:
    """``matrix[g][p]``: the examples of gold class ``g`` predicted as ``p``; labels outside ``0..num_classes-1``
    raise :class:`ValueError`."""
    gold_ids, predicted_ids = _ids(gold), _ids(predicted)
    if gold_ids.shape != predicted_ids.shape:
        raise ValueError(f"{len(gold_ids)} gold labels but {len(predicted_ids)} predictions")
    for name, ids in (("gold", gold_ids), ("predicted", predicted_ids)):
        if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) < num_classes:
            raise ValueError(f"{name} labels span {int(ids.min())}..{int(ids.max())}, outside the "
                             f"{num_classes} classes 0..{num_classes - 1}")
    counts = torch.bincount(gold_ids * num_classes + predicted_ids, minlength=num_classes * num_classes)
    return counts.view(num_classes, num_classes).tolist()


def percent_correct(logits: Tensor, labels: Tensor) -> float:
    """Accuracy in percent of ``logits.argmax(-1)`` against ``labels``, from the integer count."""
    return 100.0 * int((logits.argmax(-1) == labels).sum()) / len(labels)


def percent_correct_tensor(logits: Tensor, labels: Tensor) -> Tensor:
    """:func:`percent_correct` as a 0-dim tensor on the logits' device, for a training step's logs (read later,
    with the step's other terms, instead of waiting for the device here)."""
    return (logits.argmax(-1) == labels).sum().double() * (100.0 / len(labels))


def accuracy(matrix: list[list[int]]) -> float:
    """Percent of the examples on the diagonal (0 for an empty matrix)."""
    total = sum(map(sum, matrix))
    return 100.0 * sum(matrix[k][k] for k in range(len(matrix))) / total if total else 0.0


def per_class_scores(matrix: list[list[int]]) -> list[dict[str, float]]:
    """Precision, recall and F1 (percent; 0 where undefined) and the gold count (``support``) of every class."""
    scores = []
    for k in range(len(matrix)):
        hits = matrix[k][k]
        predicted = sum(row[k] for row in matrix)
        support = sum(matrix[k])
        precision = 100.0 * hits / predicted if predicted else 0.0
        recall = 100.0 * hits / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        scores.append({"precision": precision, "recall": recall, "f1": f1, "support": support})
    return scores


def summary(matrix: list[list[int]], names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, the counts behind it, the per-class scores by class name and the matrix: a run's results.json."""
    correct = sum(matrix[k][k] for k in range(len(matrix)))
    return {"accuracy": accuracy(matrix), "correct": correct, "total": sum(map(sum, matrix)),
            "per_class": dict(zip(names, per_class_scores(matrix), strict=True)), "confusion": matrix}


def format_report(head: str, matrix: list[list[int]], names: Sequence[str], *, index_columns: bool = False) -> str:
    """``head``, a per-class table (precision, recall, F1 in percent, support) and the confusion matrix (rows gold,
    columns predicted). ``index_columns`` heads the matrix's columns with class indices (rows then read
    ``gold i NAME``), for class names too long to head ten columns (Fashion-MNIST's)."""
    rows = [[name, f"{s['precision']:.2f}", f"{s['recall']:.2f}", f"{s['f1']:.2f}", s["support"]]
            for name, s in zip(names, per_class_scores(matrix), strict=True)]
    columns = [str(i) for i in range(len(names))] if index_columns else list(names)
    gold = [f"{i} {name}" if index_columns else name for i, name in enumerate(names)]
    confusion = [[f"gold {label}", *counts] for label, counts in zip(gold, matrix, strict=True)]
    return "\n\n".join([head, format_table(["class", "precision %", "recall %", "F1 %", "support"], rows),
                        "confusion matrix (rows: gold class, columns: predicted class)\n"
                        + format_table(["", *(f"pred {c}" for c in columns)], confusion)])


def _ids(labels: Labels) -> Tensor:
    return torch.as_tensor(labels, dtype=torch.long, device="cpu").flatten()
