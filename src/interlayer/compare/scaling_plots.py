"""The scaling sweep's figures, drawn with matplotlib's object API like :mod:`.plots` (a ``Figure`` saved as a PNG
of fixed pixels; pyplot's global state is never touched). Each function takes plain numbers, so it is testable
without training:

* **loss against compute**: every run as a point, each size's mean as a marker, each variant's fitted
  ``E + A (C / C0)^-alpha`` as a line with its pointwise 95% band (dashed where it extrapolates), and beneath, the
  residuals of every run from its variant's fit;
* **compute multiplier against size**: each method's multiplier at every measured size with its 95% interval
  (an open end drawn to the axis' edge with an arrow), at the extrapolated size as a hollow marker, and 1x marked.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .plots import Picture, _figure, _save

CURVES_SIZE = (9.0, 7.5)
MULTIPLIER_SIZE = (8.0, 4.8)


@dataclass
class CurveSeries:
    """One variant's points and fit for :func:`loss_vs_compute`: runs (``x``, ``y``), size means, the fitted line
    and band on ``grid`` (None where the fit is not drawn), ``measured_until``: the largest measured compute."""

    name: str
    x: Sequence[float]
    y: Sequence[float]
    mean_x: Sequence[float]
    mean_y: Sequence[float]
    grid: Optional[np.ndarray] = None
    line: Optional[np.ndarray] = None
    band: Optional[tuple[np.ndarray, np.ndarray]] = None
    residuals: Sequence[float] = field(default_factory=list)
    measured_until: float = math.inf
    supported: bool = True


def loss_vs_compute(series: Sequence[CurveSeries], metric: str, axis: str, baseline: str, path: Path,
                    caption: str) -> Optional[Picture]:
    """The loss of every run against its compute (log x), each variant's fit and band, and the residuals beneath."""
    if not any(len(s.x) for s in series):
        return None
    fig = _figure(*CURVES_SIZE)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for s in series:
        if not len(s.x):
            continue
        dots = top.scatter(s.x, s.y, s=12, alpha=0.45)
        color = dots.get_facecolor()[0]
        label = s.name + ("" if s.supported else " (fit not supported)")
        top.plot(s.mean_x, s.mean_y, linestyle="none", marker="D" if s.name == baseline else "o", markersize=6,
                 color=color, label=label)
        if s.grid is not None and s.line is not None:
            inside = s.grid <= s.measured_until * (1 + 1e-9)
            style = "-" if s.supported else ":"
            top.plot(s.grid[inside], s.line[inside], style, color=color, linewidth=2.2 if s.name == baseline else 1.5)
            if (~inside).any():
                top.plot(s.grid[~inside], s.line[~inside], "--", color=color, linewidth=1.2)
            if s.band is not None:
                top.fill_between(s.grid, s.band[0], s.band[1], color=color, alpha=0.15, linewidth=0)
        if len(s.residuals):
            bottom.scatter(s.x, s.residuals, s=12, color=color, alpha=0.7)
    top.set_xscale("log")
    top.set_ylabel(f"test {metric}")
    top.grid(alpha=0.3, which="both")
    top.legend(fontsize=8)
    top.set_title(f"Test {metric} against training {axis}: runs, size means, fits with 95% bands")
    bottom.axhline(0.0, color="black", linewidth=0.8)
    bottom.set_xlabel(f"training {axis} per run (log scale)")
    bottom.set_ylabel("residual")
    bottom.grid(alpha=0.3, which="both")
    return _save(fig, path, "Loss against compute", caption)


@dataclass
class MultiplierPoint:
    """A method's multiplier at one size: its compute, value and interval (ends may be open: None or infinite)."""

    method: str
    size: str
    compute: float
    value: float
    low: Optional[float]
    high: Optional[float]
    extrapolated: bool = False


def multipliers(points: Sequence[MultiplierPoint], axis: str, path: Path, caption: str) -> Optional[Picture]:
    """Each method's compute multiplier (log y) against its compute at each size, with the 95% intervals."""
    drawable = [p for p in points if math.isfinite(p.value) and p.value > 0 or p.low is not None]
    if not drawable:
        return None
    fig = _figure(*MULTIPLIER_SIZE)
    ax = fig.add_subplot()
    finite = [v for p in drawable for v in (p.value, p.low, p.high) if v is not None and math.isfinite(v) and v > 0]
    y_low, y_high = min(finite + [1.0]) / 1.5, max(finite + [1.0]) * 1.5
    for i, method in enumerate(dict.fromkeys(p.method for p in drawable)):
        color = f"C{i}"
        mine = [p for p in drawable if p.method == method]
        for extrapolated in (False, True):
            chosen = [p for p in mine if p.extrapolated == extrapolated]
            if not chosen:
                continue
            x = [p.compute for p in chosen]
            y = [min(max(p.value, y_low), y_high) if math.isfinite(p.value) else y_high for p in chosen]
            lows = [max(y_i - (p.low if p.low is not None else y_low), 0.0) for y_i, p in zip(y, chosen)]
            highs = [max((min(p.high, y_high) if p.high is not None and math.isfinite(p.high) else y_high) - y_i, 0.0)
                     for y_i, p in zip(y, chosen)]
            ax.errorbar(x, y, yerr=[lows, highs], fmt="o" if not extrapolated else "s", color=color, capsize=4,
                        markerfacecolor=color if not extrapolated else "white",
                        label=f"{method}" + (" (extrapolated)" if extrapolated else ""),
                        linestyle="-" if not extrapolated else "none")
            for x_i, p in zip(x, chosen):
                if p.high is None or not math.isfinite(p.high) or p.high > y_high:
                    ax.annotate("", xy=(x_i, y_high), xytext=(x_i, y_high / 1.25),
                                arrowprops={"arrowstyle": "->", "color": color})
    ax.axhline(1.0, color="black", linewidth=0.9, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(y_low, y_high)
    ax.set_xlabel(f"the method's training {axis} per run (log scale)")
    ax.set_ylabel("compute multiplier (x baseline)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Compute multiplier against size (95% intervals; above 1x: worth more than its compute)",
                 fontsize=10)
    return _save(fig, path, "Compute multiplier against size", caption)


__all__ = ["CurveSeries", "MultiplierPoint", "loss_vs_compute", "multipliers"]
