"""The scaling fits (compare/scaling_fit.py) on synthetic curves with known E, A and alpha: the fit recovers them, the
profile intervals hold their level over repeated simulations (and the bootstrap over seeds that they replace does
not), the compute multipliers of methods whose worth is known, and the fits the data do not support say so.

The synthetic sweeps have the shape of the measured example in docs/compare.md: 4 sizes, 3 seeds, the compute
doubling from size to size, and seed noise of 0.03 nats (the seed spread of the bundled Shakespeare LM: 0.033 at
2,000 steps, docs/compare.md)."""
import math

import numpy as np
import pytest

from interlayer.compare.scaling_fit import (
    ALPHAS,
    LACK_OF_FIT_LEVEL,
    extrapolated_multiplier,
    fit_power_law,
    measured_multiplier,
    pooled_sd,
    prediction_band,
    profile_rss,
)

TRUTH = (1.5, 1.0, 0.4)  # E, A at C0, alpha
C0 = 1e12
SIZES = np.array([1.0, 2.0, 4.0, 8.0]) * C0
SEEDS = 3
NOISE = 0.03
GROUPS = np.repeat(np.arange(len(SIZES)), SEEDS)


def curve(compute, truth=TRUTH, shift=1.0):
    """The true loss at ``compute``; ``shift``: the method reaches the baseline's loss of ``shift`` x its compute
    (its compute multiplier)."""
    e, a, alpha = truth
    return e + a * (shift * np.asarray(compute) / C0) ** (-alpha)


def sweep(rng, shift=1.0, cost=1.0, noise=NOISE):
    """One variant's runs: (compute, loss) of every seed at every size; ``cost``: its compute per step relative
    to the baseline's (same steps, so its compute at a size is ``cost`` x the baseline's)."""
    x = np.repeat(SIZES * cost, SEEDS)
    return x, curve(x, shift=shift) + noise * rng.standard_normal(x.shape)


def test_the_fit_recovers_known_parameters():
    x = np.repeat(SIZES, SEEDS)
    exact = fit_power_law(x, curve(x), GROUPS, scale=C0)
    assert exact.E == pytest.approx(TRUTH[0], abs=1e-5) and exact.A == pytest.approx(TRUTH[1], abs=1e-5)
    assert exact.alpha == pytest.approx(TRUTH[2], abs=1e-5) and exact.supported
    noisy = fit_power_law(*sweep(np.random.default_rng(0)), GROUPS, scale=C0)
    assert noisy.alpha_interval.contains(TRUTH[2]) and noisy.alpha_interval.contains(noisy.alpha)
    assert noisy.residual_sd == pytest.approx(NOISE, rel=0.5) and noisy.pure_error_sd == pytest.approx(NOISE, rel=0.5)
    assert noisy.lack_of_fit_p > LACK_OF_FIT_LEVEL and noisy.supported
    assert noisy.compute_for(float(noisy.predict(3 * C0))) == pytest.approx(3 * C0, rel=1e-9)
    assert math.isinf(noisy.compute_for(noisy.E - 0.01))  # below the fitted floor: never reached


def test_the_closed_form_profile_is_the_least_squares_fit_at_each_exponent():
    rng = np.random.default_rng(1)
    x, y = sweep(rng)
    u = x / C0
    rss, e, a = profile_rss(u, y, 0.0, ALPHAS[::50])
    for i, alpha in enumerate(ALPHAS[::50]):
        design = np.stack([np.ones_like(u), u ** -alpha], axis=1)
        (e_ls, a_ls), *_ = np.linalg.lstsq(design, y, rcond=None)
        if e_ls >= 0:  # the floor is not binding: the plain least-squares solution
            assert (e[0, i], a[0, i]) == pytest.approx((e_ls, a_ls), rel=1e-6, abs=1e-9)
            assert rss[0, i] == pytest.approx(((y - design @ [e_ls, a_ls]) ** 2).sum(), rel=1e-6, abs=1e-12)


def test_multipliers_of_methods_whose_worth_is_known():
    """A method that reaches the baseline's loss at half its compute (and costs 5% more per step) is worth 2x, one
    that needs twice the compute 0.5x, an identical one is undistinguishable from 1x."""
    rng = np.random.default_rng(2)
    base = fit_power_law(*sweep(rng, noise=0.005), GROUPS, scale=C0)
    for shift, verdict in ((2.0, "better"), (0.5, "worse")):
        x, y = sweep(rng, shift=shift, cost=1.05, noise=0.005)
        m = measured_multiplier(base, y[-SEEDS:], float(x[-1]), pooled_sd(y, GROUPS))
        assert m.value == pytest.approx(shift, rel=0.25) and m.interval.contains(shift) and m.verdict == verdict
        method = fit_power_law(x, y, GROUPS, scale=C0)
        far = extrapolated_multiplier(base, method, 32 * C0)
        assert far.extrapolated and far.interval.contains(shift)
    x, y = sweep(rng, noise=0.005)
    same = measured_multiplier(base, y[-SEEDS:], float(x[-1]), pooled_sd(y, GROUPS))
    assert same.verdict == "undecided" and same.interval.contains(1.0)


def test_a_loss_below_the_baselines_floor_is_an_infinite_multiplier_open_upwards():
    rng = np.random.default_rng(3)
    base = fit_power_law(*sweep(rng, noise=0.005), GROUPS, scale=C0)
    losses = np.full(SEEDS, base.E - 0.2) + 0.005 * rng.standard_normal(SEEDS)
    m = measured_multiplier(base, losses, 8 * C0, (0.005, 8))
    assert math.isinf(m.value) and m.interval.open_high and math.isinf(m.interval.high) and m.verdict == "better"


def test_fits_the_data_do_not_support_say_so():
    rng = np.random.default_rng(4)
    x, y = sweep(rng)
    two = fit_power_law(x[:2 * SEEDS], y[:2 * SEEDS], GROUPS[:2 * SEEDS], scale=C0)
    assert not two.supported and "2 size(s) finished" in two.problems[0]
    rising = y + np.repeat([0.0, 0.0, 0.0, 0.5], SEEDS)
    assert any("not monotone" in p for p in fit_power_law(x, rising, GROUPS, scale=C0).problems)
    kinked = curve(x) + np.repeat([0.0, -0.06, 0.06, 0.0], SEEDS) + 0.003 * rng.standard_normal(x.shape)
    kink = fit_power_law(x, kinked, GROUPS, scale=C0)
    assert kink.lack_of_fit_p < LACK_OF_FIT_LEVEL and any("lack-of-fit" in p for p in kink.problems)
    one_seed = fit_power_law(SIZES, curve(SIZES) + 0.01 * rng.standard_normal(4), np.arange(4), scale=C0)
    assert one_seed.pure_error_sd is None and one_seed.lack_of_fit_p is None  # nothing to test the shape against
    m = measured_multiplier(kink, y[-SEEDS:], 8 * C0, (0.03, 8))
    assert m.verdict == "unsupported" and "the baseline's fit is not supported" in m.problems[0]
    one = measured_multiplier(fit_power_law(x, y, GROUPS, scale=C0), y[-1:], 8 * C0, (None, 0))
    assert one.verdict == "unsupported" and "one seed per size" in one.problems[0]


def test_the_band_holds_the_fitted_line_and_widens_beyond_the_data():
    fit = fit_power_law(*sweep(np.random.default_rng(5)), GROUPS, scale=C0)
    computes = np.array([2 * C0, 8 * C0, 200 * C0])
    low, high = prediction_band(fit, computes)
    line = fit.predict(computes)
    assert np.all(low <= line) and np.all(line <= high)
    assert high[2] - low[2] > high[1] - low[1] > 0  # an extrapolation is less certain


def _coverage(simulations=200, seed=0):
    """How often the 95% intervals hold the truth: alpha, the multiplier at the largest measured size, and at an
    extrapolated size (4x beyond), for a method worth 1.5x that costs 5% more per step."""
    rng = np.random.default_rng(seed)
    hits = {"alpha": 0, "measured": 0, "extrapolated": 0}
    for _ in range(simulations):
        base = fit_power_law(*sweep(rng), GROUPS, scale=C0)
        x, y = sweep(rng, shift=1.5, cost=1.05)
        method = fit_power_law(x, y, GROUPS, scale=C0)
        hits["alpha"] += base.alpha_interval.contains(TRUTH[2])
        measured = measured_multiplier(base, y[-SEEDS:], float(x[-1]), pooled_sd(y, GROUPS))
        hits["measured"] += measured.interval.contains(1.5)
        hits["extrapolated"] += extrapolated_multiplier(base, method, 32 * 1.05 * C0).interval.contains(1.5)
    return {key: value / simulations for key, value in hits.items()}


@pytest.mark.slow
def test_the_intervals_cover_the_truth_in_90_to_98_percent_of_200_simulations():
    """The issue's bar, on 4 sizes x 3 seeds with the bundled LM's seed noise (measured: alpha 0.95, the multiplier
    0.96 at the largest size and 0.95 extrapolated; docs/compare.md)."""
    coverage = _coverage()
    assert all(0.90 <= value <= 0.98 for value in coverage.values()), coverage


@pytest.mark.slow
def test_a_bootstrap_over_three_seeds_undercovers_which_is_why_the_intervals_are_profiles():
    """The reading the issue proposed first: resample the seeds within each size and refit. With 3 seeds a resample
    takes one of 10 sets of values and underestimates their spread, so its 95% percentile interval for alpha holds
    the truth far less often (0.86 here); the profile intervals above hold their level."""
    rng = np.random.default_rng(0)
    hits, simulations, resamples = 0, 200, 400
    index = np.arange(len(SIZES) * SEEDS).reshape(len(SIZES), SEEDS)
    for _ in range(simulations):
        x, y = sweep(rng)
        picks = np.take_along_axis(np.broadcast_to(index, (resamples, *index.shape)),
                                   rng.integers(0, SEEDS, (resamples, *index.shape)), 2).reshape(resamples, -1)
        rss = profile_rss(x / C0, y[picks], 0.0)[0]
        low, high = np.quantile(ALPHAS[rss.argmin(1)], [0.025, 0.975])
        hits += low <= TRUTH[2] <= high
    assert hits / simulations < 0.90
