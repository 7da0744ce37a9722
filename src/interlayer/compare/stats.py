"""Seed statistics for the comparison: each variant against the baseline, as a reviewer would ask for it.

For one metric, every variant's seeds are compared with the baseline's seeds (:func:`compare_to_baseline`):

* **the difference** ``mean(variant) - mean(baseline)`` with its **95% confidence interval** from Welch's t
  (unequal variances, Welch-Satterthwaite degrees of freedom), and the two-sided **Welch p-value**. Welch's test
  assumes independent, roughly normal seed results. Seeds give every variant the same *data order* (the tasks
  draw batches from generators seeded by the run's seed, e.g. the language model's ``train_batches`` by seed and
  epoch), but not the same initial weights, since the architectures differ; a paired test would therefore be
  admissible, but Welch is used because it needs no pairing (a variant with a missing seed keeps its others) and
  assumes nothing about how strongly the seeds' results correlate across variants.
* **Holm's correction** of the p-values across the variants of one comparison (the family: every variant with
  enough seeds against the one baseline), so that four comparisons do not buy four chances at p < 0.05.
* **Equivalence** (two one-sided tests, TOST) against a margin the user gives (``--margin``, absolute, in the
  metric's own units: nats for a loss, points for a percentage): equivalent when the difference is shown to lie
  inside ``(-margin, +margin)``, i.e. the 90% Welch interval lies inside the margin; the TOST p-values get their
  own Holm correction across the variants.
* **Power**: the smallest difference the comparison could have detected with power 0.8 at its seeds and the
  spread observed (the pooled standard deviation), and the seeds per variant that a given difference (the margin
  when one is given, else the difference observed) needs. Planning uses the equal-variance two-sample t-test with
  equal seeds per side (the textbook and G*Power calculation), its power from the noncentral t distribution.

The verdict: **better** or **worse** when the Holm-corrected Welch p is below 0.05; else **equivalent** when the
Holm-corrected TOST p is below 0.05; else **undecided**, with the seeds to run. Below 3 seeds on either side there
is no verdict (one or two seeds say nothing about the spread that a test can trust); the numbers are still shown.
SciPy's ``stats`` computes the t and noncentral t distributions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.8
MIN_SEEDS_FOR_VERDICT = 3
MAX_SEEDS_PLANNED = 1000  # seeds_needed gives up beyond this (the difference is too small to chase)

Verdict = Literal["better", "worse", "equivalent", "undecided", "no verdict"]


def rule(margin: Optional[float]) -> str:
    """The decision rule in one sentence, for every report."""
    equivalence = (f"else equivalent when two one-sided Welch tests (TOST, Holm-corrected) show |Δ| < {margin:g} "
                   "(the --margin, in the metric's units)" if margin is not None else
                   "no equivalence test (give --margin to test 'no worse than the baseline')")
    return (f"Δ = variant mean - baseline mean over seeds with a 95% Welch confidence interval; better/worse when "
            f"Welch's two-sided p, Holm-corrected across the variants, is below {ALPHA}; {equivalence}; otherwise "
            f"undecided, with the seeds per variant that detect the difference at power {POWER}. No verdict below "
            f"{MIN_SEEDS_FOR_VERDICT} seeds per variant: fewer cannot estimate the seed spread a test relies on.")


def mean_std(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    """Mean and sample standard deviation (n - 1); None where undefined (no values; one value for the std)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclass(frozen=True)
class Welch:
    """Welch's two-sample t statistics of ``mean(a) - mean(b)``."""

    delta: float
    se: float  # standard error of delta
    df: float  # Welch-Satterthwaite degrees of freedom

    def interval(self, level: float = 1 - ALPHA) -> tuple[float, float]:
        half = float(stats.t.ppf(0.5 + level / 2, self.df)) * self.se
        return self.delta - half, self.delta + half

    def p_two_sided(self) -> float:
        if self.se == 0.0:
            return 1.0 if self.delta == 0.0 else 0.0
        return float(2 * stats.t.sf(abs(self.delta) / self.se, self.df))

    def p_equivalence(self, margin: float) -> float:
        """TOST: the larger p of H0 Δ <= -margin and H0 Δ >= +margin (each one-sided); small means |Δ| < margin."""
        if self.se == 0.0:
            return 0.0 if abs(self.delta) < margin else 1.0
        lower = stats.t.sf((self.delta + margin) / self.se, self.df)
        upper = stats.t.cdf((self.delta - margin) / self.se, self.df)
        return float(max(lower, upper))


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    mean_a, std_a = mean_std(a)
    mean_b, std_b = mean_std(b)
    if std_a is None or std_b is None:
        raise ValueError("Welch's t-test needs at least two values per group")
    va, vb = std_a ** 2 / len(a), std_b ** 2 / len(b)
    if va + vb == 0.0:
        return Welch(mean_a - mean_b, 0.0, float(len(a) + len(b) - 2))
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return Welch(mean_a - mean_b, math.sqrt(va + vb), df)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sort ascending, multiply the i-th smallest (from 0)
    by ``m - i``, carry the running maximum, cap at 1 (R's ``p.adjust(p, "holm")``)."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def power(difference: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided equal-variance two-sample t-test with ``n`` seeds per side to detect ``difference``
    when the seeds' standard deviation is ``sd``: P(|T| > t_crit) for T noncentral t with ``2n - 2`` degrees of
    freedom and noncentrality ``difference / (sd * sqrt(2 / n))``."""
    df = 2 * n - 2
    noncentrality = abs(difference) / (sd * math.sqrt(2.0 / n))
    critical = stats.t.ppf(1 - alpha / 2, df)
    # the lower tail P(T < -t_crit) as P(T > t_crit) at -noncentrality: SciPy's cdf there can return NaN
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality))


def detectable_difference(sd: float, n: int, target_power: float = POWER) -> float:
    """The smallest difference found with power ``target_power`` at ``n`` seeds per side and spread ``sd``."""
    if sd == 0.0:
        return 0.0
    scale = sd * math.sqrt(2.0 / n)  # the difference's standard error; power exceeds 0.99 at 20 of them
    return float(optimize.brentq(lambda d: power(d, sd, n) - target_power, 1e-9 * scale, 20 * scale,
                                 xtol=1e-12 * scale))


def seeds_needed(difference: float, sd: float, target_power: float = POWER) -> Optional[int]:
    """Seeds per side for power ``target_power`` against ``difference``; None beyond :data:`MAX_SEEDS_PLANNED`."""
    if sd == 0.0:
        return 2
    if difference == 0.0:
        return None
    n = 2
    while power(difference, sd, n) < target_power:
        n += 1
        if n > MAX_SEEDS_PLANNED:
            return None
    return n


@dataclass(frozen=True)
class Comparison:
    """One variant against the baseline (see the module docstring for each figure)."""

    n: int  # the variant's seeds
    n_baseline: int
    delta: Optional[float]  # mean(variant) - mean(baseline); None without a finished run on either side
    interval: Optional[tuple[float, float]] = None  # 95% Welch interval of delta
    p: Optional[float] = None  # Welch, two-sided, uncorrected
    p_holm: Optional[float] = None
    p_equivalence_holm: Optional[float] = None  # TOST, Holm-corrected; None without a margin
    detectable: Optional[float] = None  # smallest |delta| detectable at power 0.8 with these seeds and spread
    target: Optional[float] = None  # the difference the seeds plan is for (the margin, else |delta|)
    seeds_for_target: Optional[int] = None  # seeds per variant that detect ``target`` at power 0.8
    verdict: Verdict = "no verdict"
    reason: str = ""  # why no verdict, or what to run for one

    @property
    def words(self) -> str:
        """The verdict as the table shows it: the word and its reason."""
        return f"{self.verdict} ({self.reason})" if self.reason else self.verdict


def _undecided_reason(n: int, needed: Optional[int], target: float) -> str:
    if target == 0.0:
        return "no difference observed; give --margin to test equivalence"
    if needed is None:
        return f"a difference of {target:.3g} needs more than {MAX_SEEDS_PLANNED} seeds"
    if needed <= n:  # the seeds had the power, but Holm's correction or chance left the test short of 0.05
        return f"{n} seeds detect {target:.3g} with power {POWER}, yet neither test reached p < {ALPHA}"
    return f"run {needed - n} more seed(s) per variant to detect {target:.3g} at power {POWER}"


def compare_to_baseline(variants: dict[str, Sequence[float]], baseline: Sequence[float], higher_is_better: bool,
                        margin: Optional[float] = None) -> dict[str, Comparison]:
    """Every variant's :class:`Comparison` with the baseline's values; Holm's correction runs over the variants
    that have at least :data:`MIN_SEEDS_FOR_VERDICT` seeds (as does the baseline)."""
    if margin is not None and not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    base_mean, base_std = mean_std(baseline)
    partial: dict[str, Comparison] = {}
    tests: dict[str, Welch] = {}
    for name, values in variants.items():
        mean, std = mean_std(values)
        n, nb = len(values), len(baseline)
        if mean is None or base_mean is None:
            partial[name] = Comparison(n, nb, None, reason="no finished run on one side")
            continue
        if min(n, nb) < MIN_SEEDS_FOR_VERDICT:
            interval = welch(values, baseline).interval() if std is not None and base_std is not None else None
            partial[name] = Comparison(n, nb, mean - base_mean, interval, reason=(
                f"{min(n, nb)} seed(s); a verdict needs at least {MIN_SEEDS_FOR_VERDICT} per variant"))
            continue
        tests[name] = welch(values, baseline)
    names = list(tests)
    p_holm = dict(zip(names, holm([tests[k].p_two_sided() for k in names])))
    p_equiv = dict(zip(names, holm([tests[k].p_equivalence(margin) for k in names]))) if margin is not None else {}
    out = {}
    for name, values in variants.items():
        if name not in tests:
            out[name] = partial[name]
            continue
        test, n = tests[name], len(values)
        sd = math.sqrt((mean_std(values)[1] ** 2 + base_std ** 2) / 2)  # pooled, as planned for equal seeds
        n_planned = min(n, len(baseline))
        target = margin if margin is not None else abs(test.delta)
        needed = seeds_needed(target, sd)
        if p_holm[name] < ALPHA:
            verdict: Verdict = "better" if (test.delta > 0) == higher_is_better else "worse"
            reason = f"Holm p={p_holm[name]:.3g}"
        elif margin is not None and p_equiv[name] < ALPHA:
            verdict, reason = "equivalent", f"within ±{margin:g}, TOST Holm p={p_equiv[name]:.3g}"
        else:
            verdict, reason = "undecided", _undecided_reason(n_planned, needed, target)
        out[name] = Comparison(n, len(baseline), test.delta, test.interval(), test.p_two_sided(), p_holm[name],
                               p_equiv.get(name), detectable_difference(sd, n_planned), target, needed, verdict,
                               reason)
    return out
