"""The classification metrics every classification task reports (tasks/metrics.py), against hand-computed values.

The example: ten examples of five classes; class 3 is never predicted right and class 4 never occurs, so the
zero-denominator cases (precision of a never-predicted class, recall of an absent one) are exercised. By hand:

    gold \\ pred   0  1  2  3  4        precision        recall          F1              support
    0             2  1  0  0  0        2/4 = 50         2/3 = 66.67     2PR/(P+R) = 400/7  3
    1             0  1  1  0  0        1/2 = 50         1/2 = 50        50              2
    2             1  0  3  0  0        3/4 = 75         3/4 = 75        75              4
    3             1  0  0  0  0        0 (0/0)          0/1 = 0         0               1
    4             0  0  0  0  0        0 (0/0)          0 (0/0)         0               0

and accuracy (2 + 1 + 3) / 10 = 60.
"""
from pathlib import Path

import pytest
import torch

from interlayer.tasks.graph import report as graph_report
from interlayer.tasks.metrics import (
    accuracy,
    confusion_matrix,
    format_report,
    per_class_scores,
    percent_correct,
    summary,
)
from interlayer.tasks.text_classification import MRPCSpec, metrics, report

GOLD = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]
PREDICTED = [0, 1, 0, 1, 2, 2, 2, 0, 2, 0]
MATRIX = [[2, 1, 0, 0, 0], [0, 1, 1, 0, 0], [1, 0, 3, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
BY_HAND = [(50.0, 200 / 3, 400 / 7, 3), (50.0, 50.0, 50.0, 2), (75.0, 75.0, 75.0, 4), (0.0, 0.0, 0.0, 1),
           (0.0, 0.0, 0.0, 0)]


def test_confusion_matrix_rows_are_gold_and_columns_predicted_from_lists_or_tensors():
    assert confusion_matrix(GOLD, PREDICTED, 5) == MATRIX
    assert confusion_matrix(torch.tensor(GOLD), torch.tensor(PREDICTED), 5) == MATRIX
    with pytest.raises(ValueError, match="predicted labels span 0..5, outside the 5 classes 0..4"):
        confusion_matrix(GOLD, PREDICTED[:-1] + [5], 5)
    with pytest.raises(ValueError, match="10 gold labels but 9 predictions"):
        confusion_matrix(GOLD, PREDICTED[:-1], 5)


def test_accuracy_and_per_class_scores_match_the_hand_computed_table():
    assert accuracy(MATRIX) == 60.0
    scores = per_class_scores(MATRIX)
    assert [(s["precision"], s["recall"], s["f1"], s["support"]) for s in scores] == \
        [pytest.approx(row) for row in BY_HAND]


def test_percent_correct_is_exact_from_the_count():
    labels = torch.zeros(200, dtype=torch.long)
    logits = torch.zeros(200, 2)
    logits[:39, 1] = 1.0  # 161 of 200 right
    assert percent_correct(logits, labels) == 80.5  # exactly: float32's mean gives 80.50000071525574


def test_summary_keys_the_scores_by_class_name():
    out = summary(MATRIX, list("abcde"))
    assert (out["accuracy"], out["correct"], out["total"], out["confusion"]) == (60.0, 6, 10, MATRIX)
    assert out["per_class"]["a"] == {"precision": 50.0, "recall": pytest.approx(200 / 3),
                                     "f1": pytest.approx(400 / 7), "support": 3}


def test_the_report_prints_the_table_and_the_matrix():
    text = format_report("head", MATRIX, list("abcde"))
    assert "| a     | 50.00       | 66.67    | 57.14 | 3       |" in text
    assert "| gold c | 1      | 0      | 3      | 0      | 0      |" in text
    indexed = format_report("head", MATRIX, list("abcde"), index_columns=True)
    assert "| gold 2 c | 1      | 0      | 3" in indexed and "| pred 4 |" in indexed


def test_each_task_reports_through_the_shared_helper():
    """Text (MRPC's F1 of the paraphrase class) and graph reports read the same numbers."""
    gold, predicted = [1, 1, 1, 0, 0], [1, 1, 0, 0, 1]
    assert metrics(gold, predicted, 2, f1_class=1) == {"accuracy": 60.0, "f1": pytest.approx(200 / 3)}
    assert "f1" not in metrics(gold, predicted, 2, f1_class=None)
    text = report(MRPCSpec(), Path("x.tsv"), gold, predicted)
    assert "accuracy 60.00  F1 (paraphrase) 66.67" in text and "| gold paraphrase     | 1" in text
    logits = torch.nn.functional.one_hot(torch.tensor(PREDICTED), 5).float()
    graph = graph_report("cora", logits, torch.tensor(GOLD), 5)
    assert "cora: 10 test nodes, accuracy 60.00" in graph and "| 0     | 50.00       | 66.67    | 57.14" in graph


def test_the_scores_agree_with_scikit_learn():
    metrics_module = pytest.importorskip("sklearn.metrics")
    precision, recall, f1, support = metrics_module.precision_recall_fscore_support(
        GOLD, PREDICTED, labels=list(range(5)), zero_division=0)
    ours = per_class_scores(confusion_matrix(GOLD, PREDICTED, 5))
    assert [s["precision"] for s in ours] == pytest.approx(list(100 * precision))
    assert [s["recall"] for s in ours] == pytest.approx(list(100 * recall))
    assert [s["f1"] for s in ours] == pytest.approx(list(100 * f1))
    assert [s["support"] for s in ours] == list(support)
