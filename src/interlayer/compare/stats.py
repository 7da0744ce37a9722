"""Seed statistics for the comparison table: mean, sample standard deviation, and whether a difference to the
baseline is larger than the seeds' own scatter.

The rule (stated in every report):

* **3 or more seeds on both sides: Welch's t-test** (unequal variances), two-sided, significant at p < 0.05. The
  p-value comes from the Student t distribution through the regularised incomplete beta function (no SciPy).
* **2 seeds: the spread rule** ``|mean_a - mean_b| > sqrt(s_a^2 + s_b^2)``: the difference exceeds the standard
  deviation of the difference of two single runs. With one degree of freedom per side a t-test has almost no
  power, so this is a heuristic, not a test, and the report says so.
* **1 seed on either side: no verdict.**
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

ALPHA = 0.05
MIN_SEEDS_FOR_TEST = 3
RULE = (f"Welch's t-test, two-sided, p < {ALPHA} when both variants have at least {MIN_SEEDS_FOR_TEST} seeds; "
        "with 2 seeds the spread rule |Δ| > sqrt(s_a² + s_b²) (a heuristic, too few seeds for a test); no verdict "
        "with 1 seed. s is the sample standard deviation over seeds.")


def mean_std(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    """Mean and sample standard deviation (n - 1); None where undefined (no values; one value for the std)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Lentz's continued fraction for the incomplete beta function (Numerical Recipes, ``betacf``)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < eps:
            break
    return result


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularised incomplete beta function, for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom: ``I_{df/(df+t^2)}(df/2, 1/2)``."""
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test for equal means (Welch-Satterthwaite degrees of freedom)."""
    mean_a, std_a = mean_std(a)
    mean_b, std_b = mean_std(b)
    if std_a is None or std_b is None:
        raise ValueError("Welch's t-test needs at least two values per group")
    va, vb = std_a ** 2 / len(a), std_b ** 2 / len(b)
    if va + vb == 0.0:
        return 1.0 if mean_a == mean_b else 0.0
    t = (mean_a - mean_b) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return t_two_sided_p(t, df)


@dataclass(frozen=True)
class Difference:
    delta: Optional[float]  # mean(variant) - mean(baseline)
    exceeds: Optional[bool]  # None: no verdict
    verdict: str  # for the table: "yes (p=0.012)", "no (spread 0.84)", "n/a (1 seed)"


def difference(variant: Sequence[float], baseline: Sequence[float]) -> Difference:
    """The variant's mean minus the baseline's, and whether it exceeds the seed spread (see :data:`RULE`)."""
    mean_v, std_v = mean_std(variant)
    mean_b, std_b = mean_std(baseline)
    if mean_v is None or mean_b is None:
        return Difference(None, None, "n/a (no finished run)")
    delta = mean_v - mean_b
    if std_v is None or std_b is None:
        return Difference(delta, None, "n/a (1 seed)")
    if min(len(variant), len(baseline)) >= MIN_SEEDS_FOR_TEST:
        p = welch_p(variant, baseline)
        return Difference(delta, p < ALPHA, f"{'yes' if p < ALPHA else 'no'} (Welch p={p:.3f})")
    spread = math.sqrt(std_v ** 2 + std_b ** 2)
    exceeds = abs(delta) > spread
    return Difference(delta, exceeds, f"{'yes' if exceeds else 'no'} (spread {spread:.3g})")
