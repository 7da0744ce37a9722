"""Scaling-law fits and compute multipliers with intervals that hold their level on a few sizes and seeds.

Each variant's final loss ``L`` against its training compute ``C`` (FLOPs, or measured seconds) is fitted as
``L(C) = E + A (C / C0)^(-alpha)`` by least squares over every run (each seed a point), with ``E >= floor`` (0 for a
loss: a cross-entropy cannot fall below zero) and ``C0`` a fixed reference compute, so that ``A`` is the loss above
``E`` at ``C0``. The fit is a *variable projection*: for a fixed ``alpha`` the model is linear in ``E`` and ``A``, so
their least-squares values and the residual sum of squares ``RSS(alpha)`` are closed forms, and ``alpha`` is found on
a fine logarithmic grid (:data:`ALPHAS`), then polished by a bounded scalar search. Everything below is built from
these closed forms, which is why thousands of fits (the coverage simulation) take seconds.

**Intervals are profile-likelihood intervals** (Bates and Watts, *Nonlinear Regression Analysis*, 1988, ch. 6):
the values of a quantity whose best constrained fit raises the RSS, scaled by the residual variance, by less than
the 95% point of ``F(1, df)``: ``df = n - 3`` for ``alpha``; for a multiplier, whose profile adds two terms each
scaled by its own estimated variance, the two estimates' degrees of freedom together (this calibration held its level
in the simulations; the baseline's alone made the intervals a little too wide, 97.5-98%). Bootstrapping seeds within
each size, the reading the issue proposed first, undercovers with 3 seeds per size (a resample of three values
underestimates their spread and takes at most ten distinct values): on synthetic curves (4 sizes, 3 seeds) its 95%
intervals for ``alpha`` held the truth in 86% of 200 simulations, the profile intervals in 95-96%
(``tests/test_scaling_fit.py``; docs/compare.md).

* ``alpha``: the profile of ``RSS(alpha)``.
* **Compute multiplier** of a method at its compute ``C_m`` where its loss is ``l``: the compute the baseline needs
  for ``l``, ``C_b = C0 (A_b / (l - E_b))^(1 / alpha_b)``, over ``C_m``; infinite when ``l <= E_b`` (the baseline's
  fitted floor). Its interval profiles the joint likelihood of the baseline's runs and the method's: for a
  candidate multiplier ``M``, the best baseline curve that passes through the method's loss at ``M C_m``. At a
  measured size the method's loss is the mean of its seeds there (their pooled within-size variance scales it); at
  an extrapolated size it is the method's own fitted curve at ``C_m``, profiled the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import optimize, stats

LEVEL = 0.95
ALPHAS = np.exp(np.linspace(math.log(1e-3), math.log(4.0), 400))  # the exponents a fit may take
MULTIPLIER_RANGE = (1e-3, 1e3)  # an interval reaching either end is open there
MIN_SIZES = 3  # three parameters: fewer sizes cannot determine them
# The lack-of-fit test rejects the power law below this p: 1%, so that an exact power law is called unsupported in
# one sweep of a hundred per fit (a multiplier needs two fits), while the intervals, scaled by the residual variance,
# already widen for a smaller misfit.
LACK_OF_FIT_LEVEL = 0.01
TINY = 1e-300  # a residual variance of exactly 0 (a perfect fit) is taken as this


@dataclass(frozen=True)
class Interval:
    """A confidence interval; ``open_low`` / ``open_high``: the data do not bound it on that side within the range
    searched (its end is then that range's end, or infinity)."""

    low: float
    high: float
    open_low: bool = False
    open_high: bool = False

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def bounded(self) -> bool:
        return not (self.open_low or self.open_high)


def _sums(x: np.ndarray, y: np.ndarray, alphas: np.ndarray) -> dict[str, np.ndarray]:
    """The sums every closed form below needs, one per exponent: ``z = x^-alpha`` against ``y``. ``y`` may hold
    several data sets as rows (B, n), the sums then have shape (B, G) where they involve ``y``."""
    z = x[None, :] ** (-alphas[:, None])  # (G, n)
    y = np.atleast_2d(y)
    return {"n": np.float64(x.shape[0]), "Sy": y.sum(1)[:, None], "Syy": (y * y).sum(1)[:, None],
            "Sz": z.sum(1)[None, :], "Szz": (z * z).sum(1)[None, :], "Syz": y @ z.T}


def profile_rss(x: np.ndarray, y: np.ndarray, floor: Optional[float], alphas: np.ndarray = ALPHAS
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every exponent of ``alphas``: the least-squares ``E`` (at least ``floor`` unless None) and ``A`` of
    ``y = E + A x^-alpha``, and the residual sum of squares. ``y`` (n,) or (B, n); results (B, G)."""
    s = _sums(x, y, alphas)
    n = s["n"]
    szz = s["Szz"] - s["Sz"] ** 2 / n
    szy = s["Syz"] - s["Sy"] * s["Sz"] / n
    a = szy / szz
    e = (s["Sy"] - a * s["Sz"]) / n
    rss = s["Syy"] - s["Sy"] ** 2 / n - szy ** 2 / szz
    if floor is not None:  # E pinned at the floor where the free fit goes below it
        yz = s["Syz"] - floor * s["Sz"]
        a_floor = yz / s["Szz"]
        rss_floor = s["Syy"] - 2 * floor * s["Sy"] + n * floor ** 2 - yz ** 2 / s["Szz"]
        below = e < floor
        a, e, rss = np.where(below, a_floor, a), np.where(below, floor, e), np.where(below, rss_floor, rss)
    return np.maximum(rss, 0.0), e, a


def pinned_rss(sums: dict[str, np.ndarray], x0: np.ndarray, level: np.ndarray, floor: Optional[float],
               alphas: np.ndarray = ALPHAS) -> np.ndarray:
    """The least RSS of ``E + A x^-alpha`` over ``E`` (at least ``floor``) and ``A`` when the curve must pass
    through ``(x0, level)``, for every exponent: shape ``broadcast(x0, level) + (G,)``. ``sums`` are
    :func:`_sums` of one data set."""
    x0, level = np.asarray(x0, dtype=float)[..., None], np.asarray(level, dtype=float)[..., None]
    sy, syy, sz, szz, syz = (sums[k][0] for k in ("Sy", "Syy", "Sz", "Szz", "Syz"))
    n = sums["n"]
    z0 = x0 ** (-alphas)
    s1 = syz - level * sz - z0 * sy + n * level * z0  # sum (y - level)(z - z0)
    q = szz - 2 * z0 * sz + n * z0 ** 2  # sum (z - z0)^2
    rss = syy - 2 * level * sy + n * level ** 2 - s1 ** 2 / q
    if floor is not None:  # the constrained optimum below the floor: E = floor, A fixed by the pin
        e = level - s1 / q * z0
        a = (level - floor) / z0
        rss_floor = syy - 2 * floor * sy + n * floor ** 2 - 2 * a * (syz - floor * sz) + a ** 2 * szz
        rss = np.where(e < floor, rss_floor, rss)
    return np.maximum(rss, 0.0)


@dataclass(frozen=True)
class PowerLawFit:
    """``L(C) = E + A (C / scale)^(-alpha)`` fitted to the runs ``x``, ``y`` (``groups``: each run's size index),
    with the interval of ``alpha``, the spread of the residuals and of the seeds, and ``problems``: why the data do
    not support the fit (empty when they do)."""

    E: float
    A: float
    alpha: float
    scale: float
    floor: Optional[float]
    alpha_interval: Interval
    rss: float
    n: int
    sizes: int
    residual_sd: Optional[float]  # sqrt(RSS / (n - 3))
    pure_error_sd: Optional[float]  # pooled sd of the seeds at each size (None with one seed per size)
    lack_of_fit_p: Optional[float]  # F-test of the means' residuals against the seeds' spread (needs 4+ sizes)
    problems: tuple[str, ...]
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    groups: np.ndarray = field(repr=False)

    @property
    def supported(self) -> bool:
        return not self.problems

    @property
    def df(self) -> int:
        return self.n - 3

    def predict(self, compute: np.ndarray | float) -> np.ndarray:
        return self.E + self.A * (np.asarray(compute, dtype=float) / self.scale) ** (-self.alpha)

    def compute_for(self, loss: float) -> float:
        """The compute at which the curve reaches ``loss``; infinite at or below its floor ``E``."""
        if loss <= self.E or self.A <= 0:
            return math.inf
        return self.scale * (self.A / (loss - self.E)) ** (1.0 / self.alpha)

    def residuals(self) -> np.ndarray:
        return self.y - self.predict(self.x)


def _threshold(df: int) -> float:
    """The rise of the scaled RSS that bounds a profile interval: the 95% point of F(1, df)."""
    return float(stats.f.ppf(LEVEL, 1, df))


def _interval(grid: np.ndarray, excess: np.ndarray, refine: Optional[Callable[[float], float]] = None
              ) -> Interval:
    """Where ``excess`` (a profile minus its threshold, on the increasing ``grid``) is at most 0. Each end lies
    between two grid points: linearly interpolated there, or found by ``refine`` (the excess as a function) with
    Brent's method. Open where the grid's end is still inside."""
    inside = np.flatnonzero(excess <= 0)
    if inside.size == 0:  # the minimum fell between grid points, or beyond the grid's end (then open there)
        best = int(np.argmin(excess))
        return Interval(float(grid[best]), float(grid[best]), open_low=best == 0, open_high=best == len(grid) - 1)
    first, last = int(inside[0]), int(inside[-1])

    def end(i: int, j: int) -> float:  # excess[i] <= 0 < excess[j]
        if refine is not None:
            return float(optimize.brentq(refine, grid[min(i, j)], grid[max(i, j)], xtol=1e-5))
        t = excess[i] / (excess[i] - excess[j])
        return float(grid[i] + t * (grid[j] - grid[i]))

    low = float(grid[0]) if first == 0 else end(first, first - 1)
    high = float(grid[-1]) if last == len(grid) - 1 else end(last, last + 1)
    return Interval(low, high, open_low=first == 0, open_high=last == len(grid) - 1)


def pooled_sd(y: np.ndarray, groups: np.ndarray) -> tuple[Optional[float], int]:
    """The pooled standard deviation of ``y`` within its groups (the seeds' spread at each size) and its degrees
    of freedom; None without a group of two."""
    ss, df = 0.0, 0
    for g in np.unique(groups):
        values = y[groups == g]
        ss += float(((values - values.mean()) ** 2).sum())
        df += len(values) - 1
    return (math.sqrt(ss / df), df) if df > 0 else (None, 0)


def _monotone_problem(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> Optional[str]:
    """Whether the mean loss falls with compute from size to size (by more than the seeds' noise allows to be
    chance): a curve that rises between two sizes is no power law."""
    order = sorted(np.unique(groups), key=lambda g: x[groups == g].mean())
    means = [float(y[groups == g].mean()) for g in order]
    sd, _ = pooled_sd(y, groups)
    counts = [int((groups == g).sum()) for g in order]
    for i in range(len(means) - 1):
        rise = means[i + 1] - means[i]
        noise = 2 * sd * math.sqrt(1 / counts[i] + 1 / counts[i + 1]) if sd else 0.0
        if rise > noise:
            return (f"the loss rises from size {i + 1} to size {i + 2} ({means[i]:.4g} -> {means[i + 1]:.4g}) by "
                    "more than the seeds' spread explains: the curve is not monotone, so no power law describes it")
    return None


def fit_power_law(x: Sequence[float], y: Sequence[float], groups: Sequence[int], *, scale: float,
                  floor: Optional[float] = 0.0) -> PowerLawFit:
    """Fit ``y = E + A (x / scale)^-alpha`` to every run (``groups``: the size of each), with ``alpha``'s profile
    interval and the checks a reader needs before trusting it (module docstring)."""
    x, y, groups = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(groups)
    u = x / scale
    sizes = len(np.unique(groups))
    problems: list[str] = []
    if sizes < MIN_SIZES:
        problems.append(f"{sizes} size(s) finished: a curve of three parameters needs at least {MIN_SIZES}")
    rss, e, a = (v[0] for v in profile_rss(u, y, floor))
    best = int(np.argmin(rss))
    alpha = float(ALPHAS[best])
    if 0 < best < len(ALPHAS) - 1:  # polish between the neighbouring grid points

        def objective(log_alpha: float) -> float:
            return float(profile_rss(u, y, floor, np.array([math.exp(log_alpha)]))[0][0, 0])

        found = optimize.minimize_scalar(objective, bounds=(math.log(ALPHAS[best - 1]), math.log(ALPHAS[best + 1])),
                                         method="bounded", options={"xatol": 1e-6})
        if found.fun <= rss[best]:
            alpha = math.exp(found.x)
    rss_best, e_best, a_best = (float(v[0, 0]) for v in profile_rss(u, y, floor, np.array([alpha])))
    n = len(y)
    df = n - 3
    pure, pure_df = pooled_sd(y, groups)
    lack_p = None
    if df > 0:
        s2 = max(rss_best / df, TINY)
        interval = _interval(np.log(ALPHAS), (rss - rss_best) / s2 - _threshold(df))
        alpha_interval = Interval(math.exp(interval.low), math.exp(interval.high), interval.open_low,
                                  interval.open_high)
        lof_df = sizes - 3
        if pure and lof_df > 0:  # seeds that agree exactly (no spread) leave nothing to test against
            lack = max(rss_best - pure ** 2 * pure_df, 0.0) / lof_df
            lack_p = float(stats.f.sf(lack / pure ** 2, lof_df, pure_df))
    else:
        alpha_interval = Interval(float(ALPHAS[0]), float(ALPHAS[-1]), True, True)
    if sizes >= MIN_SIZES:
        monotone = _monotone_problem(u, y, groups)
        if monotone:
            problems.append(monotone)
        elif a_best <= 0:
            problems.append("the fitted curve does not fall with compute (A <= 0)")
        if lack_p is not None and lack_p < LACK_OF_FIT_LEVEL:
            problems.append(f"the power law misses the size means by more than the seeds' spread explains "
                            f"(lack-of-fit F-test p = {lack_p:.3g})")
        if df <= 0:
            problems.append(f"{n} runs leave no degree of freedom for the noise (3 parameters): run more seeds")
    return PowerLawFit(e_best, a_best, alpha, scale, floor, alpha_interval, rss_best, n, sizes,
                       math.sqrt(rss_best / df) if df > 0 else None, pure, lack_p, tuple(problems), x, y, groups)


@dataclass(frozen=True)
class Multiplier:
    """A method's compute multiplier against the baseline at the method's compute ``compute``: ``value`` (infinite
    when the baseline's fitted floor lies above the method's loss), its interval (None where it cannot be
    computed), ``extrapolated`` when the method's loss there comes from its fitted curve, not from runs."""

    compute: float
    loss: float
    value: float
    interval: Optional[Interval]
    extrapolated: bool
    problems: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        """``better`` (the interval lies above 1x), ``worse`` (below), ``undecided`` (it spans 1x) or
        ``unsupported`` (no interval: the fits or the seeds do not allow one)."""
        if self.interval is None or self.problems:
            return "unsupported"
        if self.interval.low > 1.0:
            return "better"
        if self.interval.high < 1.0:
            return "worse"
        return "undecided"


def _plausible_alphas(fit: PowerLawFit) -> np.ndarray:
    """The exponents whose own profile is within the threshold (and a margin) of the best: a curve through any
    point with another exponent fits worse than that alone, so the profiles of the multipliers need no others."""
    rss = profile_rss(fit.x / fit.scale, fit.y, fit.floor)[0][0]
    kept = ALPHAS[(rss - fit.rss) / max(fit.rss / fit.df, TINY) <= _threshold(fit.df) + 1.0]
    return kept if kept.size else np.array([fit.alpha])


def _profile_interval(base: PowerLawFit, method: np.ndarray, levels: np.ndarray, compute: float, estimate: float,
                      df: int) -> Interval:
    """The multipliers ``M`` whose best joint fit (the baseline's curve through ``(M compute, level)`` plus the
    method's scaled term ``method`` at each ``level``) is worse than the best by less than the threshold; searched
    on a logarithmic grid over :data:`MULTIPLIER_RANGE`, each end then found by Brent's method."""
    alphas = _plausible_alphas(base)
    sums = _sums(base.x / base.scale, base.y, alphas)
    s2 = max(base.rss / base.df, TINY)
    threshold = _threshold(df)

    def deviance(log_m: np.ndarray) -> np.ndarray:
        x0 = np.exp(np.asarray(log_m, dtype=float))[..., None] * compute / base.scale
        rss = pinned_rss(sums, x0, levels, base.floor, alphas).min(-1)
        return (rss / s2 + method).min(-1)

    low, high = (math.log(v) for v in MULTIPLIER_RANGE)
    grid = np.linspace(low, high, 61)
    if math.isfinite(estimate) and estimate > 0:
        grid = np.unique(np.append(grid, np.clip(math.log(estimate), low, high)))
    values = deviance(grid)
    best = min(float(values.min()), base.rss / s2 + float(method.min()))
    found = _interval(grid, values - best - threshold, lambda v: float(deviance(v)) - best - threshold)
    return Interval(math.exp(found.low), math.inf if found.open_high else math.exp(found.high),
                    found.open_low, found.open_high)


def measured_multiplier(base: PowerLawFit, losses: Sequence[float], compute: float,
                        noise: tuple[Optional[float], int]) -> Multiplier:
    """The method's multiplier at a measured size: its seeds' ``losses`` at ``compute``; ``noise``: the method's
    pooled within-size seed spread and its degrees of freedom (:func:`pooled_sd`; None with one seed per size:
    no interval)."""
    losses = np.asarray(losses, dtype=float)
    mean = float(losses.mean())
    value = base.compute_for(mean) / compute
    noise_sd, noise_df = noise
    problems = tuple(f"the baseline's fit is not supported: {p}" for p in base.problems)
    if noise_sd is None or noise_sd <= 0:
        problems += ("one seed per size: the method's spread over seeds is unknown",)
    if noise_sd is None or noise_sd <= 0 or base.df <= 0:
        return Multiplier(compute, mean, value, None, False, problems)
    count = len(losses)
    reach = 1.5 * noise_sd * math.sqrt((_threshold(base.df) + 4) / count)  # beyond it the term alone excludes
    low = mean - reach if base.floor is None else max(mean - reach, base.floor)
    levels = np.linspace(low, mean + reach, 121)
    interval = _profile_interval(base, count * (mean - levels) ** 2 / noise_sd ** 2, levels, compute, value,
                                 base.df + noise_df)
    return Multiplier(compute, mean, value, interval, False, problems)


def extrapolated_multiplier(base: PowerLawFit, method: PowerLawFit, compute: float) -> Multiplier:
    """The multiplier at a compute the method did not run: its loss there is its fitted curve's, profiled."""
    loss = float(method.predict(compute))
    value = base.compute_for(loss) / compute
    problems = tuple(f"the baseline's fit is not supported: {p}" for p in base.problems) + tuple(
        f"the method's fit is not supported: {p}" for p in method.problems)
    if base.df <= 0 or method.df <= 0:
        return Multiplier(compute, loss, value, None, True, problems)
    alphas = _plausible_alphas(method)
    sums = _sums(method.x / method.scale, method.y, alphas)
    s2 = max(method.rss / method.df, TINY)

    def term(levels: np.ndarray) -> np.ndarray:
        return (pinned_rss(sums, compute / method.scale, levels, method.floor, alphas).min(-1) - method.rss) / s2

    # the method's losses at ``compute`` its runs do not exclude, with room: a wide coarse look, then a fine grid
    spread = max(float(np.ptp(method.y)), 1e-6)
    bottom = loss - 10 * spread if method.floor is None else max(loss - 10 * spread, method.floor)
    coarse = np.linspace(bottom, loss + 10 * spread, 401)
    kept = coarse[term(coarse) <= 2 * _threshold(base.df) + 10]
    levels = np.linspace(kept.min(), kept.max(), 161) if kept.size > 1 else coarse
    interval = _profile_interval(base, term(levels), levels, compute, value, base.df + method.df)
    return Multiplier(compute, loss, value, interval, True, problems)


def prediction_band(fit: PowerLawFit, computes: np.ndarray, count: int = 161, exponents: int = 100
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The pointwise 95% profile interval of the fitted curve at each of ``computes``: the losses a curve through
    that point can reach while fitting the runs within the threshold (the band drawn around the fitted line; for
    drawing, so ``count`` levels and at most ``exponents`` of the plausible exponents)."""
    computes = np.asarray(computes, dtype=float)
    if fit.df <= 0:
        return np.full(computes.shape, np.nan), np.full(computes.shape, np.nan)
    alphas = _plausible_alphas(fit)
    alphas = alphas[np.unique(np.linspace(0, len(alphas) - 1, min(exponents, len(alphas))).round().astype(int))]
    sums = _sums(fit.x / fit.scale, fit.y, alphas)
    s2 = max(fit.rss / fit.df, TINY)
    center = fit.predict(computes)
    reach = 3 * max(float(np.ptp(fit.y)), 10 * (fit.residual_sd or 0.0), 1e-6)
    low = center - reach if fit.floor is None else np.maximum(center - reach, fit.floor)
    levels = low[:, None] + (center + reach - low)[:, None] * np.linspace(0.0, 1.0, count)[None, :]
    excess = (pinned_rss(sums, (computes / fit.scale)[:, None], levels, fit.floor, alphas).min(-1) - fit.rss) / s2
    inside = np.where(excess <= _threshold(fit.df), levels, np.nan)
    return np.nanmin(inside, axis=1), np.nanmax(inside, axis=1)
