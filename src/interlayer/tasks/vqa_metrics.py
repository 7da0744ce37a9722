"""VQA metrics: the official VQA accuracy, plain accuracy by question type, and PAvPU.

* **VQA accuracy** (Antol et al. 2015; the VQA API's ``vqaEval.py``): an answer's accuracy against 10 human answers
  is ``min(#humans that said it / 3, 1)`` averaged over the 10 subsets of 9 humans, so 1, 2, 3, 4+ agreeing humans
  give 0.3, 0.6, 0.9, 1.0. As the official code: the human answers are stripped of punctuation only when they are
  not all equal, the prediction is normalised fully (punctuation, number words, articles, contractions).
* **Plain accuracy** for CLEVR, GQA and Sort-of-CLEVR (one answer per question), also per question type (and, for
  Sort-of-CLEVR, relational / non-relational).
* **PAvPU** (patch accuracy vs patch uncertainty; Mukhoti & Gal 2018, Eq. 3, with Fan et al. 2020's hypothesis
  test, which Crossformer Sec. 3.2 / Table 4 follows): ``(n_ac + n_iu) / (n_ac + n_au + n_ic + n_iu)`` over the
  questions, *a*ccurate or *i*naccurate by the answer, *c*ertain or *u*ncertain by a test on ``S`` (20) stochastic
  forward passes: the predicted answer is the arg-max of the mean probability; the prediction is certain when a
  two-sample t-test (Student's, pooled variance, two-sided, ``2S - 2`` degrees of freedom) rejects equal means of
  the sampled probabilities of the top-1 and top-2 answers at p < 0.05 (Fan et al.: "we test whether the
  difference between the probabilities of the first and second highest classes are statistically significant with
  a two sample t-test"). Passes that all agree (no stochasticity, or saturated probabilities) have zero variance:
  unequal means are then certain (p = 0), equal ones uncertain (p = 1).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..data.vqa_formats import normalize_answer, process_punctuation

CERTAINTY_P_VALUE = 0.05  # Crossformer Sec. 3.2, Fan et al. 2020
SAMPLES = 20  # attention-weight samples per question (Crossformer Sec. 3.2)


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """The official accuracy (0..1) of ``prediction`` against the human ``answers`` (leave-one-out mean)."""
    humans = [a.replace("\n", " ").replace("\t", " ").strip() for a in answers]
    predicted = prediction.replace("\n", " ").replace("\t", " ").strip()
    if len(set(humans)) > 1:
        humans = [process_punctuation(a) for a in humans]
        predicted = normalize_answer(predicted)
    scores = [min(1.0, sum(other == predicted for j, other in enumerate(humans) if j != i) / 3)
              for i in range(len(humans))]
    return sum(scores) / len(scores)


def soft_scores(answers: Sequence[str], vocabulary: dict[str, int]) -> dict[int, float]:
    """Training targets (MCAN's ``get_score``: 0.3 per agreeing human up to 1) of the vocabulary's answers that the
    humans gave: the official accuracy of each normalised answer, so the loss aims at what the metric rewards."""
    normalised = [normalize_answer(a) for a in answers]
    return {vocabulary[a]: min(1.0, 0.3 * normalised.count(a)) if len(normalised) > 1 else 1.0
            for a in set(normalised) if a in vocabulary}


def by_type(scores: Sequence[float], types: Sequence[str]) -> dict[str, float]:
    """Mean score in percent per question type (types that are empty strings are left out)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for score, kind in zip(scores, types):
        if kind:
            groups[kind].append(score)
    return {kind: 100.0 * float(sum(v)) / len(v) for kind, v in sorted(groups.items())}


# -- the t-test -----------------------------------------------------------------------------------------------
def _beta_continued_fraction(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' ``betacf``)."""
    tiny, h = 1e-300, np.ones_like(x)
    c = np.ones_like(x)
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + numerator * d
            d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1.0 + numerator / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            step = d * c
            h = h * step
        if np.all(np.abs(step - 1.0) < 1e-13):
            break
    return h


def regularized_beta(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """``I_x(a, b)`` elementwise for ``x`` in [0, 1]."""
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    inner = (x > 0) & (x < 1)
    safe = np.where(inner, x, 0.5)
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * np.log(safe) + b * np.log1p(-safe))
    front = np.exp(log_front)
    direct = safe < (a + 1.0) / (a + b + 2.0)
    value = np.where(direct, front * _beta_continued_fraction(a, b, safe) / a,
                     1.0 - front * _beta_continued_fraction(b, a, 1.0 - safe) / b)
    return np.where(inner, value, x)


def student_t_two_sided(t: np.ndarray, df: float) -> np.ndarray:
    """Two-sided p-value ``P(|T| >= |t|)`` of Student's t with ``df`` degrees of freedom: ``I_{df/(df+t^2)}(df/2,
    1/2)``; infinite ``|t|`` gives 0."""
    t = np.asarray(t, dtype=np.float64)
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def t_test_p_values(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two-sided p-values of Student's two-sample t-test (pooled variance) of ``a[:, i]`` against ``b[:, i]``
    (samples along axis 0). Zero variance: p = 0 for unequal means, 1 for equal ones."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n, m = a.shape[0], b.shape[0]
    df = n + m - 2
    pooled = ((n - 1) * a.var(0, ddof=1) + (m - 1) * b.var(0, ddof=1)) / df
    gap = a.mean(0) - b.mean(0)
    spread = np.sqrt(pooled * (1.0 / n + 1.0 / m))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(spread > 0, gap / np.where(spread > 0, spread, 1.0), np.where(gap != 0, np.inf, 0.0))
    return student_t_two_sided(t, df)


# -- PAvPU ----------------------------------------------------------------------------------------------------
def certainty(samples: np.ndarray, threshold: float = CERTAINTY_P_VALUE) -> tuple[np.ndarray, np.ndarray]:
    """(predicted answer, certain) per question from answer probabilities ``samples`` (S, N, answers)."""
    mean = samples.mean(0)
    order = np.argsort(-mean, axis=1, kind="stable")[:, :2]
    rows = np.arange(samples.shape[1])
    top1, top2 = samples[:, rows, order[:, 0]], samples[:, rows, order[:, 1]]
    return order[:, 0], t_test_p_values(top1, top2) < threshold


@dataclass
class PAvPU:
    accurate_certain: int = 0
    accurate_uncertain: int = 0
    inaccurate_certain: int = 0
    inaccurate_uncertain: int = 0

    def add(self, accurate: np.ndarray, certain: np.ndarray) -> None:
        accurate, certain = np.asarray(accurate, dtype=bool), np.asarray(certain, dtype=bool)
        self.accurate_certain += int((accurate & certain).sum())
        self.accurate_uncertain += int((accurate & ~certain).sum())
        self.inaccurate_certain += int((~accurate & certain).sum())
        self.inaccurate_uncertain += int((~accurate & ~certain).sum())

    @property
    def value(self) -> float:
        """PAvPU in percent."""
        total = self.accurate_certain + self.accurate_uncertain + self.inaccurate_certain + self.inaccurate_uncertain
        return 100.0 * (self.accurate_certain + self.inaccurate_uncertain) / max(total, 1)
