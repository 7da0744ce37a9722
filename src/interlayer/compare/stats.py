"""Seed statistics for the comparison: each variant against the baseline, as a reviewer would ask for it.

For one metric, every variant's seeds are compared with the baseline's seeds (:func:`compare_to_baseline`); the
values come keyed by seed, because a seed is shared across variants.

* **Which test.** A seed fixes two things in every variant's run: the data order (the tasks draw batches from
  generators seeded by the run's seed and the epoch alone, e.g. the language model's ``train_batches``) and the
  random stream the model is initialised from (``torch.manual_seed(seed)`` before building,
  ``experiment.initial_model``), so two variants get the same initial value for every tensor created before their
  constructions first differ (on the README's main job, Crossformer-SG shares all 36 of the baseline's tensors,
  Crossformer-KQ 33, PA 18, LW-1x 12). Runs with the same seed are therefore *paired* (common random numbers), and
  when a variant ran exactly the baseline's seeds the **primary test is the paired t-test** of the per-seed
  differences ``variant - baseline``: their mean, its 95% interval (t with n - 1 degrees of freedom) and the
  two-sided p. What the seed shares moves both runs of a pair alike and cancels in the difference, so the paired
  test is the more powerful one whenever the pairs correlate, and it is exact whatever the correlation. **Welch's
  unpaired test** (unequal variances, Welch-Satterthwaite degrees of freedom) is kept as the unpaired check, and
  is the primary test of a variant whose seeds differ from the baseline's (a run missing on either side), which
  the report says. Both assume roughly normal results over seeds.
* **Holm's correction** of the primary p-values across the variants of one comparison (the family: every variant
  with enough seeds against the one baseline), so that four comparisons do not buy four chances at p < 0.05; the
  Welch check gets its own correction over the same family.
* **Equivalence** (two one-sided tests, TOST, of the primary test: paired or Welch) against a margin the user
  gives (``--margin``, absolute, in the metric's own units: nats for a loss, points for a percentage): equivalent
  when the difference is shown to lie inside ``(-margin, +margin)``, i.e. the 90% interval lies inside the margin;
  the TOST p-values get their own Holm correction across the variants.
* **Power at the alpha the verdict uses, prospective only.** Holm's step-down compares the variant with the r-th
  smallest p (r from 0) with ``alpha / (m - r)``; the smallest difference the comparison could have detected with
  power 0.8, and the seeds per variant that a *stated* difference needs (``--effect``, the smallest difference of
  interest, else the ``--margin``), are computed at that alpha. Never for the difference observed: power computed
  from the observed difference (post-hoc power) is a restatement of the p-value and plans nothing, so without a
  stated difference an undecided verdict names no seeds. Both are computed for the design of the primary test: the
  one-sample t-test of the differences with their standard deviation (paired), or the equal-variance two-sample
  t-test with equal seeds per side and the pooled standard deviation (Welch's fallback: the textbook and G*Power
  calculation). Powers come from the noncentral t distribution.

The verdict: **better** or **worse** when the Holm-corrected p of the primary test is below 0.05; else
**equivalent** when the Holm-corrected TOST p is below 0.05; else **undecided** (with the seeds a stated difference
needs). Below 3
seeds on either side there is no verdict (one or two seeds say nothing about the spread that a test can trust); the
numbers are still shown. SciPy's ``stats`` computes the t and noncentral t distributions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.8
MIN_SEEDS_FOR_VERDICT = 3
MAX_SEEDS_PLANNED = 1000  # seeds_needed gives up beyond this (the difference is too small to chase)

Verdict = Literal["better", "worse", "equivalent", "undecided", "no verdict"]
TestName = Literal["paired", "welch"]
TEST_TITLES = {"paired": "paired t-test", "welch": "Welch's t-test"}


def rule(margin: Optional[float], effect: Optional[float] = None) -> str:
    """The decision rule in one sentence, for every report."""
    equivalence = (f"else equivalent when two one-sided tests of the same kind (TOST, Holm-corrected) show "
                   f"|Δ| < {margin:g} (the --margin, in the metric's units)" if margin is not None else
                   "no equivalence test (give --margin to test 'no worse than the baseline')")
    stated = effect if effect is not None else margin
    planned = (f"with the seeds per variant that detect a difference of {stated:g} (the "
               f"{'--effect' if effect is not None else '--margin'}, stated before the runs) with power {POWER} at "
               "the alpha of the variant's Holm step" if stated is not None else
               "naming no seeds to run: seeds are planned for a stated difference (--effect), never for the one "
               "observed")
    return (f"Δ = variant mean - baseline mean over seeds with its 95% interval, from the paired t-test of the "
            f"per-seed differences when the variant ran exactly the baseline's seeds, else from Welch's unpaired "
            f"t-test (which is also shown as a check); better/worse when that test's two-sided p, Holm-corrected "
            f"across the variants, is below {ALPHA}; {equivalence}; otherwise undecided, {planned}. No verdict below "
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
class TStatistic:
    """A t statistic of the difference ``delta``: Welch's two-sample one or the paired one (:func:`welch`,
    :func:`paired`)."""

    delta: float
    se: float  # standard error of delta
    df: float  # degrees of freedom (Welch-Satterthwaite, or pairs - 1)

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


def welch(a: Sequence[float], b: Sequence[float]) -> TStatistic:
    """Welch's unpaired test of ``mean(a) - mean(b)``."""
    mean_a, std_a = mean_std(a)
    mean_b, std_b = mean_std(b)
    if std_a is None or std_b is None:
        raise ValueError("Welch's t-test needs at least two values per group")
    va, vb = std_a ** 2 / len(a), std_b ** 2 / len(b)
    if va + vb == 0.0:
        return TStatistic(mean_a - mean_b, 0.0, float(len(a) + len(b) - 2))
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return TStatistic(mean_a - mean_b, math.sqrt(va + vb), df)


def paired(a: Sequence[float], b: Sequence[float]) -> TStatistic:
    """The paired test of ``a[i] - b[i]`` (the same seed at the same index): the one-sample t-test of the
    differences, ``n - 1`` degrees of freedom (R's ``t.test(a, b, paired=TRUE)``, SciPy's ``ttest_rel``)."""
    if len(a) != len(b):
        raise ValueError(f"a paired test needs one value per side for every pair, got {len(a)} and {len(b)}")
    differences = [x - y for x, y in zip(a, b)]
    mean, std = mean_std(differences)
    if std is None:
        raise ValueError("the paired t-test needs at least two pairs")
    return TStatistic(mean, std / math.sqrt(len(differences)), float(len(differences) - 1))


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


def holm_alphas(p_values: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The level Holm's procedure tests each p-value at, in the order given: ``alpha / (m - r)`` for the r-th
    smallest (from 0; ties in the order given). The first step is Bonferroni's ``alpha / m``, the last ``alpha``."""
    m = len(p_values)
    levels = [0.0] * m
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        levels[index] = alpha / (m - rank)
    return levels


def _design(sd: float, n: int, is_paired: bool) -> tuple[int, float]:
    """Degrees of freedom and standard error of the difference for ``n`` seeds per variant: the one-sample test of
    ``n`` differences of spread ``sd``, or the two-sample test of ``n`` per side at the pooled spread ``sd``."""
    return (n - 1, sd / math.sqrt(n)) if is_paired else (2 * n - 2, sd * math.sqrt(2.0 / n))


def power(difference: float, sd: float, n: int, alpha: float = ALPHA, is_paired: bool = False) -> float:
    """Power of the two-sided t-test with ``n`` seeds per variant to detect ``difference``: P(|T| > t_crit) for T
    noncentral t with noncentrality ``difference / se``. Unpaired: the equal-variance two-sample test, ``2n - 2``
    degrees of freedom, ``se = sd sqrt(2 / n)`` with ``sd`` the seeds' standard deviation; paired: the one-sample
    test of the differences, ``n - 1`` degrees of freedom, ``se = sd / sqrt(n)`` with ``sd`` the differences'
    standard deviation (R's ``power.t.test(type="paired")``, G*Power's matched pairs)."""
    df, se = _design(sd, n, is_paired)
    noncentrality = abs(difference) / se
    critical = stats.t.ppf(1 - alpha / 2, df)
    # the lower tail P(T < -t_crit) as P(T > t_crit) at -noncentrality: SciPy's cdf there can return NaN
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality))


def detectable_difference(sd: float, n: int, target_power: float = POWER, alpha: float = ALPHA,
                          is_paired: bool = False) -> float:
    """The smallest difference found with power ``target_power`` at ``n`` seeds per variant, spread ``sd`` and
    level ``alpha`` (:func:`power`'s designs)."""
    if sd == 0.0:
        return 0.0
    scale = _design(sd, n, is_paired)[1]  # the difference's standard error
    high = 20 * scale  # enough at alpha 0.05; a small Holm step with few degrees of freedom needs more
    while power(high, sd, n, alpha, is_paired) < target_power:
        high *= 4
    return float(optimize.brentq(lambda d: power(d, sd, n, alpha, is_paired) - target_power, 1e-9 * scale, high,
                                 xtol=1e-12 * scale))


def seeds_needed(difference: float, sd: float, target_power: float = POWER, alpha: float = ALPHA,
                 is_paired: bool = False) -> Optional[int]:
    """Seeds per variant for power ``target_power`` against ``difference`` at level ``alpha``; None beyond
    :data:`MAX_SEEDS_PLANNED`."""
    if sd == 0.0:
        return 2
    if difference == 0.0:
        return None
    n = 2
    while power(difference, sd, n, alpha, is_paired) < target_power:
        n += 1
        if n > MAX_SEEDS_PLANNED:
            return None
    return n


def ratio_range(values: Mapping[int, float], baseline: Mapping[int, float]) -> Optional[tuple[float, float]]:
    """The lowest and highest per-seed ratio ``values[s] / baseline[s]`` over the seeds both have (a measured
    throughput's spread relative to the baseline's, seed by seed: runs with the same seed ran alike); None without
    a common seed."""
    ratios = [values[s] / baseline[s] for s in values if s in baseline and baseline[s]]
    return (min(ratios), max(ratios)) if ratios else None


@dataclass(frozen=True)
class Comparison:
    """One variant against the baseline (see the module docstring for each figure)."""

    n: int  # the variant's seeds
    n_baseline: int
    delta: Optional[float]  # mean(variant) - mean(baseline); None without a finished run on either side
    interval: Optional[tuple[float, float]] = None  # 95% interval of delta, from the primary test
    p: Optional[float] = None  # the primary test's two-sided p, uncorrected
    p_holm: Optional[float] = None
    p_equivalence_holm: Optional[float] = None  # TOST of the primary test, Holm-corrected; None without a margin
    detectable: Optional[float] = None  # smallest |delta| detectable at power 0.8, these seeds and spread, ``alpha``
    target: Optional[float] = None  # the stated difference the seeds plan is for (--effect, else --margin)
    seeds_for_target: Optional[int] = None  # seeds per variant that detect ``target`` at power 0.8 and ``alpha``
    verdict: Verdict = "no verdict"
    reason: str = ""  # why no verdict, or what to run for one
    test: Optional[TestName] = None  # the primary test: paired (the same seeds on both sides) or Welch
    test_note: str = ""  # why that test
    welch_p: Optional[float] = None  # the unpaired check: Welch's two-sided p, uncorrected
    welch_p_holm: Optional[float] = None  # ... Holm-corrected over the same family
    alpha: Optional[float] = None  # the level of the variant's Holm step, at which power and seeds are planned

    @property
    def words(self) -> str:
        """The verdict as the table shows it: the word and its reason."""
        return f"{self.verdict} ({self.reason})" if self.reason else self.verdict


def _undecided_reason(n: int, needed: Optional[int], target: Optional[float], alpha: float) -> str:
    level = f"power {POWER} at α = {alpha:.3g}"
    if target is None:
        return "no difference stated to plan seeds for (--effect)"
    if needed is None:
        return f"a difference of {target:.3g} needs more than {MAX_SEEDS_PLANNED} seeds"
    if needed <= n:  # the seeds had the power, but chance left the test short of its level
        return f"{n} seeds detect {target:.3g} with {level}, yet neither test reached its level"
    return f"run {needed - n} more seed(s) per variant to detect {target:.3g} with {level}"


def _seeds(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, sorted(seeds)))


def choose_test(seeds: Sequence[int], baseline_seeds: Sequence[int]) -> tuple[TestName, str]:
    """The primary test of a variant whose finished runs have ``seeds`` against a baseline with
    ``baseline_seeds``, and why: paired exactly when both sets are equal (and hold two seeds or more)."""
    own, base = set(seeds), set(baseline_seeds)
    if own == base and len(own) >= 2:
        return "paired", f"paired over seeds {_seeds(own)}: every seed ran on both sides"
    missing = [f"seed(s) {_seeds(sorted(side - other))} of {name} have no run of {other_name}"
               for side, other, name, other_name in ((base, own, "the baseline", "this variant"),
                                                     (own, base, "this variant", "the baseline")) if side - other]
    return "welch", "Welch's unpaired test: " + ("; ".join(missing) if missing else "fewer than two pairs")


def _primary(test: TestName, values: Mapping[int, float], baseline: Mapping[int, float]) -> TStatistic:
    if test == "paired":
        order = sorted(values)
        return paired([values[s] for s in order], [baseline[s] for s in order])
    return welch(list(values.values()), list(baseline.values()))


def _planning_sd(test: TestName, values: Mapping[int, float], baseline: Mapping[int, float]) -> float:
    """The spread power is planned with: the differences' standard deviation (paired), or the pooled standard
    deviation of the two sides (Welch's fallback, planned as equal seeds per side)."""
    if test == "paired":
        return mean_std([values[s] - baseline[s] for s in values])[1] or 0.0
    return math.sqrt((mean_std(list(values.values()))[1] ** 2 + mean_std(list(baseline.values()))[1] ** 2) / 2)


# What a seed shares between the variants of a comparison, stated precisely for the reports (the counts: above)
SEED_SHARES = ("A seed fixes every variant's data order and the random stream its model is initialised from, so "
               "two variants start from the same values in every tensor created before their constructions first "
               "differ (all of them where a method adds no tensor and draws nothing extra, e.g. Crossformer-SG; those "
               "up to its first change otherwise, e.g. half of them for PA on the main job); runs with the same seed "
               "are paired.")


def test_lines(comparisons: Mapping[str, Comparison]) -> list[str]:
    """Which test each comparison used and why: one sentence for the paired ones, one per Welch fallback."""
    tested = {name: c for name, c in comparisons.items() if c.test is not None}
    pairs = [name for name, c in tested.items() if c.test == "paired"]
    lines = []
    if pairs:
        lines.append(f"Primary test: the paired t-test of the per-seed differences for {', '.join(pairs)} "
                     f"({tested[pairs[0]].test_note}; runs with the same seed share the data order and the initial "
                     "values of the tensors their architectures share, so what the pair shares cancels in the "
                     "difference); Welch's unpaired test is shown beside it as the check.")
    lines += [f"{name}: {c.test_note}." for name, c in tested.items() if c.test == "welch"]
    return lines


def compare_to_baseline(variants: Mapping[str, Mapping[int, float]], baseline: Mapping[int, float],
                        higher_is_better: bool, margin: Optional[float] = None,
                        effect: Optional[float] = None) -> dict[str, Comparison]:
    """Every variant's :class:`Comparison` with the baseline; the values are keyed by seed. Holm's correction runs
    over the variants that have at least :data:`MIN_SEEDS_FOR_VERDICT` seeds (as does the baseline). ``effect``: the
    smallest difference of interest, stated before the runs, that an undecided verdict plans seeds for (else the
    ``margin``; with neither, no seeds are planned)."""
    if margin is not None and not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    if effect is not None and not effect > 0:
        raise ValueError(f"the effect to plan seeds for must be positive, got {effect}")
    base_mean = mean_std(list(baseline.values()))[0]
    partial: dict[str, Comparison] = {}
    tests: dict[str, tuple[TestName, str, TStatistic, TStatistic]] = {}
    for name, values in variants.items():
        mean = mean_std(list(values.values()))[0]
        n, nb = len(values), len(baseline)
        test, note = choose_test(list(values), list(baseline))
        if mean is None or base_mean is None:
            partial[name] = Comparison(n, nb, None, reason="no finished run on one side")
            continue
        if min(n, nb) < MIN_SEEDS_FOR_VERDICT:  # the interval only, from two seeds on; with one, no test ran
            ran = min(n, nb) >= 2
            interval = _primary(test, values, baseline).interval() if ran else None
            partial[name] = Comparison(n, nb, mean - base_mean, interval, test=test if ran else None,
                                       test_note=note if ran else "", reason=(
                f"{min(n, nb)} seed(s); a verdict needs at least {MIN_SEEDS_FOR_VERDICT} per variant"))
            continue
        tests[name] = (test, note, _primary(test, values, baseline),
                       welch(list(values.values()), list(baseline.values())))
    names = list(tests)
    primary_p = [tests[k][2].p_two_sided() for k in names]
    p_holm = dict(zip(names, holm(primary_p)))
    alphas = dict(zip(names, holm_alphas(primary_p)))
    welch_holm = dict(zip(names, holm([tests[k][3].p_two_sided() for k in names])))
    p_equiv = dict(zip(names, holm([tests[k][2].p_equivalence(margin) for k in names]))) if margin is not None else {}
    out = {}
    for name, values in variants.items():
        if name not in tests:
            out[name] = partial[name]
            continue
        test, note, statistic, check = tests[name]
        is_paired = test == "paired"
        sd = _planning_sd(test, values, baseline)
        n_planned = min(len(values), len(baseline))
        target = effect if effect is not None else margin  # stated before the runs; never the observed delta
        alpha = alphas[name]
        needed = None if target is None else seeds_needed(target, sd, alpha=alpha, is_paired=is_paired)
        if p_holm[name] < ALPHA:
            verdict: Verdict = "better" if (statistic.delta > 0) == higher_is_better else "worse"
            reason = f"Holm p={p_holm[name]:.3g}"
        elif margin is not None and p_equiv[name] < ALPHA:
            verdict, reason = "equivalent", f"within ±{margin:g}, TOST Holm p={p_equiv[name]:.3g}"
        else:
            verdict, reason = "undecided", _undecided_reason(n_planned, needed, target, alpha)
        out[name] = Comparison(len(values), len(baseline), statistic.delta, statistic.interval(),
                               statistic.p_two_sided(), p_holm[name], p_equiv.get(name),
                               detectable_difference(sd, n_planned, alpha=alpha, is_paired=is_paired), target,
                               needed, verdict, reason, test, note, check.p_two_sided(), welch_holm[name], alpha)
    return out
