"""The comparison's statistics against values computed elsewhere: R's Welch and paired tests of the sleep data,
SciPy's ttest_rel, Holm's worked example (R's p.adjust), G*Power's and R's power.t.test sample sizes (unpaired and
paired), TOST through SciPy's one-sided tests of shifted data; which test a comparison uses and why."""
import math

import pytest
from scipy import stats as sps

from interlayer.compare.stats import (
    compare_to_baseline,
    detectable_difference,
    holm,
    holm_alphas,
    mean_std,
    paired,
    power,
    ratio_range,
    seeds_needed,
    welch,
)

# R: t.test(extra ~ group, data = sleep) -> t = -1.8608, df = 17.776, p-value = 0.07939,
# 95 percent confidence interval: -3.3654832  0.2054832
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_welch_matches_r_on_the_sleep_data():
    test = welch(SLEEP_1, SLEEP_2)
    assert test.delta / test.se == pytest.approx(-1.8608, abs=5e-5)
    assert test.df == pytest.approx(17.776, abs=5e-4)
    assert test.p_two_sided() == pytest.approx(0.07939, abs=5e-6)
    low, high = test.interval()
    assert low == pytest.approx(-3.3654832, abs=5e-8) and high == pytest.approx(0.2054832, abs=5e-8)
    # unequal seeds: SciPy's own Welch test (its t, Welch-Satterthwaite df and p) on a 3-against-7 sample
    a, b = [2.31, 2.27, 2.40], [2.05, 2.21, 2.18, 2.02, 2.11, 2.30, 2.09]
    reference, uneven = sps.ttest_ind(a, b, equal_var=False), welch(a, b)
    assert uneven.delta / uneven.se == pytest.approx(reference.statistic, rel=1e-12)
    assert uneven.df == pytest.approx(reference.df, rel=1e-12)
    assert uneven.p_two_sided() == pytest.approx(reference.pvalue, rel=1e-9)
    assert mean_std([1.0]) == (1.0, None) and mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))


def test_holm_matches_the_worked_example():
    # Holm-Bonferroni's worked example (p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05: H4 and H1 rejected, then stop);
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") -> 0.03 0.06 0.06 0.02
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == []


def test_tost_equals_two_one_sided_welch_tests_of_shifted_data():
    test = welch(SLEEP_1, SLEEP_2)
    for margin in (1.0, 2.0, 3.0, 3.1, 4.0):
        shifted = [x + margin for x in SLEEP_1]  # H0: delta <= -margin  <=>  mean(a + margin) <= mean(b)
        lower = sps.ttest_ind(shifted, SLEEP_2, equal_var=False, alternative="greater").pvalue
        upper = sps.ttest_ind([x - margin for x in SLEEP_1], SLEEP_2, equal_var=False, alternative="less").pvalue
        assert test.p_equivalence(margin) == pytest.approx(max(lower, upper), rel=1e-9)
        # equivalent at 0.05 exactly when the 90% interval lies inside the margin
        low, high = test.interval(0.90)
        assert (test.p_equivalence(margin) < 0.05) == (-margin < low and high < margin)
    assert test.p_equivalence(3.1) < 0.05 < test.p_equivalence(3.0)  # the 90% interval is [-3.052, -0.108]


def _power_by_hand(d: float, n: int) -> float:
    """Two-sided two-sample t power from the noncentral t's distribution function directly (not sf)."""
    df, nc = 2 * n - 2, d * math.sqrt(n / 2)
    critical = sps.t.isf(0.025, df)
    return 1 - sps.nct.cdf(critical, df, nc) + sps.nct.cdf(-critical, df, nc)


def test_power_and_sample_sizes_match_g_power():
    # G*Power, t tests - means: difference between two independent means, two tails, alpha 0.05, power 0.80:
    # d = 0.8 -> 26 per group, d = 0.5 -> 64 per group (actual power 0.8014596), d = 0.2 -> 394 per group
    assert seeds_needed(0.5, 1.0) == 64 and seeds_needed(0.8, 1.0) == 26 and seeds_needed(0.2, 1.0) == 394
    assert seeds_needed(1.0, 2.0) == 64  # only the ratio to the spread matters
    assert power(0.5, 1.0, 64) == pytest.approx(0.8014596, abs=5e-8)
    for d, n in ((0.5, 64), (1.5, 3), (2.0, 5), (0.3, 10)):
        assert power(d, 1.0, n) == pytest.approx(_power_by_hand(d, n), abs=1e-9)
    # the detectable difference is where the power reaches 0.8, and scales with the spread
    for n in (3, 5, 64):
        assert _power_by_hand(detectable_difference(1.0, n), n) == pytest.approx(0.8, abs=1e-7)
    assert detectable_difference(0.1, 5) == pytest.approx(0.1 * detectable_difference(1.0, 5))
    assert 0.49 < detectable_difference(1.0, 64) < 0.5


def seeded(values, first=1):
    """Values keyed by seed, seeds first, first + 1, ..."""
    return {first + i: v for i, v in enumerate(values)}


def unpaired(values):
    """Seeds the baseline (seeds 1, 2, ...) never ran, so the comparison falls back to Welch's test."""
    return seeded(values, first=101)


def test_verdicts_holm_equivalence_and_the_seed_floor():
    base = seeded([2.00, 2.02, 1.98, 2.01, 1.99])
    lists = {"worse": [2.20, 2.22, 2.18, 2.21, 2.19], "same": [2.001, 2.021, 1.981, 2.011, 1.991],
             "two_seeds": [1.0, 1.1], "one_seed": [1.5]}
    variants = {name: unpaired(values) for name, values in lists.items()}
    out = compare_to_baseline(variants, base, higher_is_better=False, margin=0.05)
    assert {c.test for n, c in out.items() if n != "one_seed"} == {"welch"} and out["one_seed"].test is None
    assert out["worse"].verdict == "worse" and out["worse"].delta == pytest.approx(0.2)
    assert out["same"].verdict == "equivalent" and "within ±0.05" in out["same"].reason
    # Holm runs over the two tested variants only: the smaller p is doubled
    raw = [out["worse"].p, out["same"].p]
    assert [out["worse"].p_holm, out["same"].p_holm] == pytest.approx(holm(raw))
    assert out["worse"].p_holm == pytest.approx(2 * out["worse"].p)
    # and its own Holm over the equivalence tests
    tost = [welch(lists[k], list(base.values())).p_equivalence(0.05) for k in ("worse", "same")]
    assert [out["worse"].p_equivalence_holm, out["same"].p_equivalence_holm] == pytest.approx(holm(tost))
    assert out["same"].p_equivalence_holm == pytest.approx(2 * tost[1])
    # below 3 seeds: the numbers, no verdict, and why (Welch's interval: seeds 101-102 have no baseline pair)
    two = out["two_seeds"]
    assert two.verdict == "no verdict" and two.p is None and two.delta == pytest.approx(-0.95)
    assert two.interval is not None and two.reason == "2 seed(s); a verdict needs at least 3 per variant"
    assert out["one_seed"].verdict == "no verdict" and out["one_seed"].interval is None
    # higher is better flips the words
    flipped = compare_to_baseline({"worse": variants["worse"]}, base, higher_is_better=True)
    assert flipped["worse"].verdict == "better"
    # without a margin, no equivalence: undecided, and no seeds planned for the difference observed (post-hoc power)
    near_values = unpaired([2.01, 2.03, 1.99, 2.02, 2.00])
    plain = compare_to_baseline({"same": variants["same"], "near": near_values}, base, False)
    assert plain["same"].verdict == "undecided" and plain["near"].verdict == "undecided"
    assert plain["near"].seeds_for_target is None and plain["near"].target is None
    assert plain["near"].reason == "no difference stated to plan seeds for (--effect)"
    # a stated smallest effect of interest (--effect 0.01): the seeds that detect it
    plain = compare_to_baseline({"same": variants["same"], "near": near_values}, base, False, effect=0.01)
    near = plain["near"]
    sd = math.sqrt((mean_std([2.01, 2.03, 1.99, 2.02, 2.00])[1] ** 2 + mean_std(list(base.values()))[1] ** 2) / 2)
    # planned at the level of each variant's Holm step: near has the smaller p, so it is tested at 0.05 / 2
    assert near.alpha == 0.025 and plain["same"].alpha == 0.05
    assert near.target == 0.01 and near.seeds_for_target == seeds_needed(0.01, sd, alpha=0.025)
    assert f"run {near.seeds_for_target - 5} more" in near.reason and "α = 0.025" in near.reason
    assert near.detectable == pytest.approx(detectable_difference(sd, 5, alpha=0.025))
    assert near.detectable > detectable_difference(sd, 5)  # a stricter level needs a larger difference
    # seeds that already had the power: said so, not "run 0 more"
    big = compare_to_baseline({"v": unpaired([2.0, 2.2, 1.8])}, seeded([1.9, 2.1, 2.3]), False, margin=5.0)["v"]
    assert big.verdict == "equivalent"
    # Δ half the margin, which 3 seeds detect (0.32 > 3.07 sd): neither the difference nor the equivalence shows
    short = compare_to_baseline({"v": unpaired([2.06, 2.16, 2.26])}, seeded([1.9, 2.0, 2.1]), False, margin=0.32)["v"]
    assert short.verdict == "undecided" and short.seeds_for_target == 3, short
    assert short.reason == "3 seeds detect 0.32 with power 0.8 at α = 0.05, yet neither test reached its level"


def test_a_bad_margin_is_refused():
    with pytest.raises(ValueError, match="margin must be positive"):
        compare_to_baseline({"a": seeded([1, 2, 3])}, seeded([1, 2, 3]), False, margin=0.0)


# R: t.test(extra ~ group, data = sleep, paired = TRUE) -> t = -4.0621, df = 9, p-value = 0.002833,
# 95 percent confidence interval: -2.4598858 -0.7001142, mean difference -1.58 (the sleep data are paired by ID,
# in the order above)
def test_paired_test_matches_r_and_scipy():
    test = paired(SLEEP_1, SLEEP_2)
    assert test.delta == pytest.approx(-1.58) and test.df == 9
    assert test.delta / test.se == pytest.approx(-4.0621, abs=5e-5)
    assert test.p_two_sided() == pytest.approx(0.002833, abs=5e-7)
    low, high = test.interval()
    assert low == pytest.approx(-2.4598858, abs=5e-8) and high == pytest.approx(-0.7001142, abs=5e-8)
    # SciPy's ttest_rel on the README's main job (PA's and the baseline's test losses, seeds 1-3: differences
    # -0.128, -0.123, -0.088): p 0.012 paired, where Welch's test of the same numbers gives 0.027
    pa, base = [1.793, 1.800, 1.870], [1.921, 1.923, 1.958]
    reference, ours = sps.ttest_rel(pa, base), paired(pa, base)
    assert ours.delta / ours.se == pytest.approx(reference.statistic, rel=1e-12) and ours.df == reference.df == 2
    assert ours.p_two_sided() == pytest.approx(reference.pvalue, rel=1e-9) == pytest.approx(0.01217, abs=5e-6)
    assert welch(pa, base).p_two_sided() == pytest.approx(sps.ttest_ind(pa, base, equal_var=False).pvalue)
    assert welch(pa, base).p_two_sided() > 2 * ours.p_two_sided()
    with pytest.raises(ValueError, match="one value per side for every pair"):
        paired([1.0, 2.0], [1.0])


def test_paired_tost_equals_two_one_sided_paired_tests_of_shifted_data():
    test = paired(SLEEP_1, SLEEP_2)
    for margin in (1.0, 2.0, 2.5, 3.0):
        lower = sps.ttest_rel([x + margin for x in SLEEP_1], SLEEP_2, alternative="greater").pvalue
        upper = sps.ttest_rel([x - margin for x in SLEEP_1], SLEEP_2, alternative="less").pvalue
        assert test.p_equivalence(margin) == pytest.approx(max(lower, upper), rel=1e-9)
        low, high = test.interval(0.90)
        assert (test.p_equivalence(margin) < 0.05) == (-margin < low and high < margin)


def test_paired_power_matches_r_and_g_power():
    # R: power.t.test(delta = 0.5, sd = 1, power = 0.8, type = "paired") -> n = 33.36713 pairs; G*Power, means:
    # difference between two dependent means (matched pairs), dz = 0.5, two tails, alpha 0.05, power 0.8 -> total
    # sample size 34, actual power 0.8077775
    assert seeds_needed(0.5, 1.0, is_paired=True) == 34
    assert power(0.5, 1.0, 34, is_paired=True) == pytest.approx(0.8077775, abs=5e-8)
    assert power(0.5, 1.0, 33, is_paired=True) < 0.8
    for n in (3, 5, 34):  # the noncentral t of the one-sample test, written out
        df, nc = n - 1, 0.7 * math.sqrt(n)
        critical = sps.t.isf(0.025, df)
        by_hand = 1 - sps.nct.cdf(critical, df, nc) + sps.nct.cdf(-critical, df, nc)
        assert power(0.7, 1.0, n, is_paired=True) == pytest.approx(by_hand, abs=1e-9)
        assert power(detectable_difference(1.0, n, is_paired=True), 1.0, n, is_paired=True) == pytest.approx(0.8)
    # at a Holm step's level: a stricter alpha needs more seeds and a larger difference
    assert seeds_needed(0.5, 1.0, alpha=0.0125, is_paired=True) > 34
    assert detectable_difference(1.0, 3, alpha=0.0125, is_paired=True) > detectable_difference(1.0, 3, is_paired=True)
    # very small levels with few degrees of freedom still find their difference
    assert power(detectable_difference(1.0, 2, alpha=0.004, is_paired=True), 1.0, 2, 0.004, True) == \
        pytest.approx(0.8)


def test_holm_steps_give_each_variant_its_level():
    # the worked example: sorted 0.005, 0.01, 0.03, 0.04 are tested at 0.05/4, 0.05/3, 0.05/2, 0.05
    assert holm_alphas([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.05 / 3, 0.05, 0.05 / 2, 0.05 / 4])
    assert holm_alphas([]) == [] and holm_alphas([0.2]) == [0.05]


def test_the_paired_test_is_primary_where_the_seeds_match_and_welch_where_one_is_missing():
    base = seeded([1.921, 1.923, 1.958])
    out = compare_to_baseline({"pa": seeded([1.793, 1.800, 1.870]), "lw": seeded([1.93, 1.92, 1.96, 1.95]),
                               "kq": {1: 1.90, 2: 1.85}}, base, higher_is_better=False)
    pa = out["pa"]
    assert pa.test == "paired" and pa.test_note == "paired over seeds 1, 2, 3: every seed ran on both sides"
    assert pa.p == pytest.approx(sps.ttest_rel([1.793, 1.800, 1.870], list(base.values())).pvalue)
    assert pa.welch_p == pytest.approx(sps.ttest_ind([1.793, 1.800, 1.870], list(base.values()),
                                                     equal_var=False).pvalue)
    # the family is pa and lw (kq has 2 seeds): Holm doubles pa's p, which stays below 0.05 only paired
    assert pa.p_holm == pytest.approx(2 * pa.p) and pa.verdict == "better"
    assert pa.welch_p_holm == pytest.approx(min(1.0, 2 * pa.welch_p)) and pa.welch_p_holm > 0.05
    sd = mean_std([v - base[s] for s, v in seeded([1.793, 1.800, 1.870]).items()])[1]
    assert pa.alpha == 0.025 and pa.detectable == pytest.approx(detectable_difference(sd, 3, alpha=0.025,
                                                                                     is_paired=True))
    lw = out["lw"]  # seed 4 has no baseline run: Welch's test over all seeds, and the report is told why
    assert lw.test == "welch" and lw.test_note == ("Welch's unpaired test: seed(s) 4 of this variant have no run of "
                                                   "the baseline")
    assert lw.p == lw.welch_p == pytest.approx(sps.ttest_ind(list(seeded([1.93, 1.92, 1.96, 1.95]).values()),
                                                             list(base.values()), equal_var=False).pvalue)
    kq = out["kq"]  # seed 3 missing, 2 seeds: no verdict, Welch's interval, and why
    assert kq.verdict == "no verdict" and kq.test == "welch" and "seed(s) 3 of the baseline have no run" in kq.test_note
    assert kq.interval == pytest.approx(welch([1.90, 1.85], list(base.values())).interval())
    two = compare_to_baseline({"v": seeded([1.90, 1.85])}, seeded([1.92, 1.93]), False)["v"]
    assert two.test == "paired" and two.interval == pytest.approx(paired([1.90, 1.85], [1.92, 1.93]).interval())


def test_throughput_ratios_are_taken_seed_by_seed():
    assert ratio_range({1: 100.0, 2: 180.0, 3: 50.0}, {1: 200.0, 2: 200.0}) == (0.5, 0.9)
    assert ratio_range({3: 1.0}, {1: 1.0}) is None
