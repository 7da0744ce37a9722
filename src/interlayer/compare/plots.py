"""The comparison's figures, drawn with matplotlib's object API (``Figure`` + Agg; pyplot's global state and
backend are never touched), each saved as a PNG of a fixed pixel size (``inches x DPI``).

* learning curves: the validation metric against training minutes, one line per variant (the mean over seeds,
  validation by validation, with the seeds' min-max band);
* cost bars: parameters, MAdds, training throughput (the mean over seeds, with error bars of one standard
  deviation over the seeds) and peak memory per variant;
* Crossformer-SG: the soft-guidance regulariser (the ``crossformer_sg`` column of ``train.csv``, alpha applied)
  against the training step, per SG variant (log scale where it spans a decade);
* PA attention maps (PA Fig. 2 / Fig. 8 style): for the task's sample input, each predicting encoder layer's
  combined map (the softmax of Eq. 4's mixed logits), the CNN-predicted and the layer's own self-attention map,
  beside the baseline's map of the same layer when the baseline has one; every map is the mean over heads, two
  maps to a line with the tokens as tick labels large enough to read (whitespace shown as visible signs);
* MPT soft connections (MPT Fig. 5 style): the learned ``alpha_kj`` of Eq. 6, outer layer k against inner layer j.

Each drawing function takes plain numbers or arrays, so it is testable without training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

DPI = 100
CURVE_SIZE = (8.0, 4.5)
COST_SIZE = (11.0, 6.5)
SG_SIZE = (8.0, 4.5)
MAP_CELL = (5.6, 5.2)  # one attention map with its colour bar, in inches
MAP_AXIS = (4.2, 4.2)  # about the map's own square in a cell (inches): what the tick labels share
MAP_COLUMNS = 2
TICK_FONT = 8  # points: 11 pixels at DPI 100
TICK_SPACING = 1.15  # tick labels at least this many font heights apart
SOFT_CELL = (3.8, 3.4)


@dataclass(frozen=True)
class Picture:
    """A figure written to ``path``, with the title and caption the report shows and its size in pixels."""

    path: Path
    title: str
    caption: str
    size: tuple[int, int]  # (width, height) in pixels


def _save(fig: Figure, path: Path, title: str, caption: str) -> Picture:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    width, height = fig.get_size_inches()
    return Picture(path, title, caption, (round(width * DPI), round(height * DPI)))


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> Optional[tuple[np.ndarray, ...]]:
    """(x, mean y, min y, max y) over the seeds' curves, point by point: the i-th validation (or log line) of
    every seed is averaged, x included, for the points every seed has. Seeds validate at nearly the same times
    under one budget, and unlike interpolation on a common x grid this never extrapolates a seed's curve
    before its first point. Seeds without a point are left out; None when no seed has one."""
    curves = [list(c) for c in curves if len(c)]
    n = min((len(c) for c in curves), default=0)
    if n == 0:
        return None
    points = np.array([c[:n] for c in curves], dtype=float)  # (seeds, n, 2)
    y = points[:, :, 1]
    return points[:, :, 0].mean(0), y.mean(0), y.min(0), y.max(0)


def _mean_lines(ax: Any, series: dict[str, list[list[tuple[float, float]]]],
                style: Callable[[str, list[list[tuple[float, float]]]], dict[str, Any]]) -> int:
    """Each variant's mean curve (:func:`mean_curve`) with its seeds' min-max band, in ``style(name, curves)``;
    returns how many were drawn (a variant with no point is left out)."""
    drawn = 0
    for name, curves in series.items():
        mean = mean_curve(curves)
        if mean is None:
            continue
        x, y, low, high = mean
        line, = ax.plot(x, y, marker="o", markersize=3, **style(name, curves))
        if len(curves) > 1:
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        drawn += 1
    return drawn


def learning_curves(series: dict[str, list[list[tuple[float, float]]]], metric: str, baseline: str,
                    path: Path, x_label: str = "training minutes (validation excluded)") -> Optional[Picture]:
    """``series``: variant -> one (x, validation metric) curve per seed; x is what ``x_label`` says (training
    minutes, or optimiser steps)."""
    fig = _figure(*CURVE_SIZE)
    ax = fig.add_subplot()
    if not _mean_lines(ax, series, lambda name, curves: dict(
            linewidth=2.4 if name == baseline else 1.6, label=f"{name} ({len([c for c in curves if c])} seed(s))")):
        return None
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"validation {metric}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Validation {metric} during training (mean over seeds; band: min-max)")
    return _save(fig, path, "Learning curves",
                 f"Validation {metric} against {x_label}: the i-th validation of every seed averaged (its x "
                 "too), for the validations all seeds have; the band spans the seeds' minimum and maximum.")


def cost_bars(names: Sequence[str], panels: Sequence[tuple], baseline: str, path: Path) -> Picture:
    """One bar chart per ``(title, y-axis unit, value per variant)``, or ``(title, unit, values, spreads)`` where
    the value is a mean over seeds: the spreads (one sample standard deviation per variant, None where fewer than
    two seeds measured it) are drawn as error bars. A missing value is drawn as 'n/a'."""
    fig = _figure(*COST_SIZE)
    axes = fig.subplots(2, 2).ravel()
    colors = ["tab:orange" if name == baseline else "tab:blue" for name in names]
    for ax, panel in zip(axes, panels):
        title, unit, values, spreads = (*panel, None)[:4]
        heights = [v if v is not None else 0.0 for v in values]
        errors = [0.0 if spreads is None or spreads[i] is None else spreads[i] for i in range(len(values))]
        bars = ax.bar(range(len(names)), heights, color=colors)
        if any(errors):
            ax.errorbar(range(len(names)), heights, yerr=errors, fmt="none", ecolor="black", capsize=4,
                        linewidth=1)
        top = max(h + e for h, e in zip(heights, errors)) if any(heights) else 1.0
        for bar, value, error in zip(bars, values, errors):
            text = "n/a" if value is None else _short(value) + (f" ± {_short(error)}" if error else "")
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + error + 0.01 * top, text, ha="center",
                    va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_ylim(0, top * 1.15)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    spread = any(len(panel) > 3 and panel[3] is not None for panel in panels)
    return _save(fig, path, "Size and cost", "Parameters, MAdds of one forward pass, training throughput and peak "
                 "memory per variant (the baseline in orange)" + ("; measured throughput as the mean over seeds "
                 "with error bars of ± one sample standard deviation over the seeds" if spread else "") + ".")


def _short(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def sg_curves(series: dict[str, list[list[tuple[float, float]]]], path: Path) -> Optional[Picture]:
    """``series``: variant -> one (step, crossformer_sg) curve per seed."""
    fig = _figure(*SG_SIZE)
    ax = fig.add_subplot()
    if not _mean_lines(ax, series, lambda name, curves: dict(label=name)):
        return None
    values = [v for curves in series.values() for c in curves for _, v in c]
    if min(values) > 0 and max(values) > 10 * min(values):  # a log axis only where it spans a decade
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("alpha * L_reg (Crossformer Eq. 1)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Crossformer-SG regulariser during training (mean over seeds)")
    return _save(fig, path, "Crossformer-SG regulariser", "The soft-guidance term added to the loss (Crossformer "
                 "Eq. 1-2, alpha included), as logged in train.csv, mean over seeds.")


# How a token that prints nothing shows as a tick label (DejaVu Sans, matplotlib's default font, has each glyph)
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "⏎"}


def token_label(token: str) -> str:
    """A token as a readable tick label: spaces, line breaks and tabs as visible signs, other control characters as
    ``·``, and an empty token as ``∅``."""
    text = "".join(_VISIBLE.get(ch, "·" if not ch.isprintable() else ch) for ch in token)
    return text or "∅"


def _token_ticks(ax: Any, labels: Sequence[str], axis_inches: tuple[float, float]) -> None:
    """Label the map's rows and columns with the tokens at :data:`TICK_FONT` points, every k-th token where the
    axis has less than :data:`TICK_SPACING` font heights per token (so labels never overlap). Tokens of one
    character stand upright below the map; longer ones are turned to read upwards."""
    n = len(labels)
    font_inches = TICK_FONT / 72
    upright = max(len(label) for label in labels) <= 1
    for axis, length in ((ax.xaxis, axis_inches[0]), (ax.yaxis, axis_inches[1])):
        step = max(1, math.ceil(n * TICK_SPACING * font_inches / length))
        ticks = list(range(0, n, step))
        rotation = 90 if axis is ax.xaxis and not upright else 0
        axis.set_ticks(ticks, [labels[i] for i in ticks], fontsize=TICK_FONT, rotation=rotation)
    ax.tick_params(length=2, pad=1)


def attention_maps(rows: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]], tokens: Sequence[str],
                   title: str, path: Path, caption: str) -> Picture:
    """A grid of (T, T) maps: ``rows`` = (row label, [(column title, map), ...]), each row's maps set
    :data:`MAP_COLUMNS` to a line (so the figure stays narrow enough to be shown at full size, where its token
    labels are readable), every map with its colour bar and the tokens as tick labels (:func:`_token_ticks`)."""
    panels = [(f"{row_label}: {column}", matrix) for row_label, maps in rows for column, matrix in maps]
    lines_per_row = [math.ceil(len(maps) / MAP_COLUMNS) for _, maps in rows]
    n_cols = min(MAP_COLUMNS, max(len(maps) for _, maps in rows))
    fig = _figure(MAP_CELL[0] * n_cols, MAP_CELL[1] * sum(lines_per_row) + 0.4)
    axes = np.atleast_2d(fig.subplots(sum(lines_per_row), n_cols, squeeze=False))
    slots, line = [], 0
    for (_, maps), count in zip(rows, lines_per_row):  # each row of maps starts on a line of its own
        slots += [axes[line + i // n_cols, i % n_cols] for i in range(len(maps))]
        line += count
    for ax in axes.ravel():
        ax.set_visible(any(ax is slot for slot in slots))
    labels = [token_label(token) for token in tokens]
    for ax, (panel_title, matrix) in zip(slots, panels):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=max(float(matrix.max()), 1e-9))
        fig.colorbar(image, ax=ax, shrink=0.8, label="attention probability")
        ax.set_title(panel_title, fontsize=9)
        if len(labels) == matrix.shape[-1]:
            _token_ticks(ax, labels, MAP_AXIS)
            ax.set_xlabel("key", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
        else:
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("query position", fontsize=8)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path, title, caption)


def soft_connections(panels: Sequence[tuple[str, np.ndarray]], title: str, path: Path) -> Picture:
    """MPT Fig. 5: each panel an (N, N) matrix, row k = outer layer, column j = inner layer, values annotated."""
    fig = _figure(SOFT_CELL[0] * len(panels), SOFT_CELL[1])
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)).ravel()
    for ax, (label, weights) in zip(axes, panels):
        n = weights.shape[0]
        image = ax.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0)
        if n <= 12:
            for k in range(n):
                for j in range(n):
                    ax.text(j, k, f"{weights[k, j]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if weights[k, j] > 0.5 else "black")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xlabel("inner layer j (earlier pass)", fontsize=8)
        ax.set_ylabel("outer layer k (next pass)", fontsize=8)
        ax.set_title(label, fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path, title, "Soft connection weights alpha_kj = softmax_j(w_kj) of MPT Eq. 6 after "
                 "training: how much inner layer j feeds outer layer k (MPT Fig. 5).")
