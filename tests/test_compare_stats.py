"""The comparison's statistics against values computed elsewhere: R's Welch test of the sleep data, Holm's worked
example (R's p.adjust), G*Power's sample sizes, and TOST through SciPy's one-sided Welch test of shifted data."""
import math

import pytest
from scipy import stats as sps

from interlayer.compare.stats import (compare_to_baseline, detectable_difference, holm, mean_std, power,
                                      seeds_needed, welch)

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


def test_verdicts_holm_equivalence_and_the_seed_floor():
    base = [2.00, 2.02, 1.98, 2.01, 1.99]
    variants = {"worse": [2.20, 2.22, 2.18, 2.21, 2.19], "same": [2.001, 2.021, 1.981, 2.011, 1.991],
                "two_seeds": [1.0, 1.1], "one_seed": [1.5]}
    out = compare_to_baseline(variants, base, higher_is_better=False, margin=0.05)
    assert out["worse"].verdict == "worse" and out["worse"].delta == pytest.approx(0.2)
    assert out["same"].verdict == "equivalent" and "within ±0.05" in out["same"].reason
    # Holm runs over the two tested variants only: the smaller p is doubled
    raw = [out["worse"].p, out["same"].p]
    assert [out["worse"].p_holm, out["same"].p_holm] == pytest.approx(holm(raw))
    assert out["worse"].p_holm == pytest.approx(2 * out["worse"].p)
    # and its own Holm over the equivalence tests
    tost = [welch(variants[k], base).p_equivalence(0.05) for k in ("worse", "same")]
    assert [out["worse"].p_equivalence_holm, out["same"].p_equivalence_holm] == pytest.approx(holm(tost))
    assert out["same"].p_equivalence_holm == pytest.approx(2 * tost[1])
    # below 3 seeds: the numbers, no verdict, and why
    two = out["two_seeds"]
    assert two.verdict == "no verdict" and two.p is None and two.delta == pytest.approx(-0.95)
    assert two.interval is not None and two.reason == "2 seed(s); a verdict needs at least 3 per variant"
    assert out["one_seed"].verdict == "no verdict" and out["one_seed"].interval is None
    # higher is better flips the words
    flipped = compare_to_baseline({"worse": variants["worse"]}, base, higher_is_better=True)
    assert flipped["worse"].verdict == "better"
    # without a margin, no equivalence: undecided, with the seeds that detect the observed difference
    plain = compare_to_baseline({"same": variants["same"], "near": [2.01, 2.03, 1.99, 2.02, 2.00]}, base, False)
    near = plain["near"]
    assert plain["same"].verdict == "undecided" and near.verdict == "undecided"
    sd = math.sqrt((mean_std([2.01, 2.03, 1.99, 2.02, 2.00])[1] ** 2 + mean_std(base)[1] ** 2) / 2)
    assert near.seeds_for_target == seeds_needed(0.01, sd) and f"run {near.seeds_for_target - 5} more" in near.reason
    assert near.detectable == pytest.approx(detectable_difference(sd, 5))
    # seeds that already had the power: said so, not "run 0 more"
    big = compare_to_baseline({"v": [2.0, 2.2, 1.8]}, [1.9, 2.1, 2.3], False, margin=5.0)["v"]
    assert big.verdict == "equivalent"
    # Δ half the margin, which 3 seeds detect (0.32 > 3.07 sd): neither the difference nor the equivalence shows
    short = compare_to_baseline({"v": [2.06, 2.16, 2.26]}, [1.9, 2.0, 2.1], False, margin=0.32)["v"]
    assert short.verdict == "undecided" and short.seeds_for_target == 3, short
    assert short.reason == "3 seeds detect 0.32 with power 0.8, yet neither test reached p < 0.05"


def test_a_bad_margin_is_refused():
    with pytest.raises(ValueError, match="margin must be positive"):
        compare_to_baseline({"a": [1, 2, 3]}, [1, 2, 3], False, margin=0.0)
