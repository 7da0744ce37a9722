"""The scaling sweep's runs read back and analysed: every finished run's compute and test metric, each variant's
power-law fit, each method's compute multipliers against the baseline (measured and extrapolated), and the per-size
comparisons at equal budget (compare's own, :mod:`.stats`). :mod:`.scaling_report` writes them.

The fitted quantity is each finished run's test metric (of its ``best/`` model, as compare's table), oriented so
that lower is better (a higher-is-better metric is fitted negated, without a floor); the compute of a run is its
steps times its variant's FLOPs per step (:mod:`.budget`), or its measured training seconds
(``--scaling-axis seconds``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .budget import run_train_config
from .plan import PlannedVariant
from .records import VariantSummary, summarize
from .scaling import Size, Sweep, cell_name
from .scaling_fit import (
    MIN_SIZES,
    Multiplier,
    PowerLawFit,
    extrapolated_multiplier,
    fit_power_law,
    measured_multiplier,
    pooled_sd,
)


@dataclass
class Cell:
    """One variant at one size: its plan, its runs (``summary``), and the compute ``x`` and fitted metric ``y`` of
    each finished run; ``multiplier``: the method's against the baseline there."""

    variant: str
    size: Size
    index: int
    planned: PlannedVariant
    summary: VariantSummary
    x: np.ndarray
    y: np.ndarray
    multiplier: Optional[Multiplier] = None


@dataclass
class Curve:
    """One variant across the sizes: its cells, its fit (None below three sizes), the seeds' spread within a size,
    and its multiplier at the extrapolated size."""

    variant: str
    cells: list[Cell]
    fit: Optional[PowerLawFit] = None
    noise: tuple[Optional[float], int] = (None, 0)  # the seeds' pooled spread within sizes, its degrees of freedom
    extrapolated: Optional[Multiplier] = None
    extrapolated_compute: Optional[float] = None
    notes: list[str] = field(default_factory=list)


def run_compute(planned: PlannedVariant, results: dict[str, Any], axis: str) -> Optional[float]:
    """A finished run's compute: steps x FLOPs per step, or its measured training seconds."""
    if axis == "seconds":
        minutes = results.get("train_minutes")
        return 60.0 * minutes if isinstance(minutes, (int, float)) else None
    steps = results.get("steps")
    return float(steps) * planned.step.flops if isinstance(steps, int) and planned.step is not None else None


def sign_of(sweep: Sweep) -> float:
    """-1 where the task's metric is higher-is-better (fitted negated), else 1."""
    return -1.0 if sweep.plan.task.higher_is_better else 1.0


def analyse(sweep: Sweep, output: Path, margin: Optional[float] = None
            ) -> tuple[list[Curve], dict[str, list[VariantSummary]]]:
    """Read every run, fit every variant, and compute each method's multipliers (module docstring); also the
    per-size summaries with their comparisons at equal budget."""
    axis, sign, metric = sweep.options.axis, sign_of(sweep), f"test_{sweep.plan.task.metric}"
    by_size = {label: summarize(plan, output, margin) for label, plan in sweep.size_plans.items()}
    curves = {name: Curve(name, []) for name in sweep.variants}
    for index, size in enumerate(sweep.sizes):
        for summary in by_size[size.label]:
            variant = summary.name.rpartition("@")[0]
            points = [(run_compute(summary.planned, r.results, axis), r.results.get(metric))
                      for r in summary.finished()]
            points = [(x, sign * y) for x, y in points if x is not None and isinstance(y, (int, float))]
            curves[variant].cells.append(Cell(variant, size, index, summary.planned, summary,
                                              np.array([p[0] for p in points]), np.array([p[1] for p in points])))
    xs = [float(x) for c in curves.values() for cell in c.cells for x in cell.x]
    scale = min(xs) if xs else 1.0
    floor = None if sweep.plan.task.higher_is_better else 0.0
    for curve in curves.values():
        cells = [c for c in curve.cells if len(c.y)]
        if len(cells) < MIN_SIZES:
            curve.notes.append(f"{len(cells)} size(s) with finished runs: a fit needs {MIN_SIZES}")
            continue
        x, y = np.concatenate([c.x for c in cells]), np.concatenate([c.y for c in cells])
        groups = np.concatenate([np.full(len(c.y), c.index) for c in cells])
        curve.fit = fit_power_law(x, y, groups, scale=scale, floor=floor)
        curve.noise = pooled_sd(y, groups)
    base = curves[sweep.settings.baseline]
    for curve in curves.values():
        if curve is base or base.fit is None:
            continue
        for cell in curve.cells:
            if len(cell.y):
                cell.multiplier = measured_multiplier(base.fit, cell.y, float(cell.x.mean()), curve.noise)
        if sweep.extrapolated is not None and curve.fit is not None:
            planned = sweep.extrapolated.variant(cell_name(curve.variant, sweep.extrapolated_size.label))
            steps = run_train_config(sweep.plan.spec, planned.sets).max_steps
            if steps and planned.step is not None:
                curve.extrapolated_compute = steps * planned.step.flops
                curve.extrapolated = extrapolated_multiplier(base.fit, curve.fit, curve.extrapolated_compute)
    return list(curves.values()), by_size
