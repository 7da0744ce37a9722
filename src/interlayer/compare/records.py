"""What every run of a comparison did, read back from its directory: the run records and each variant's summary.

A run is read from ``results.json`` (finished; a damaged one counts as unfinished), ``status.json`` (failed or
cancelled), ``run.json`` (started), ``valid.csv`` (its learning curve and best validation metric), ``train.csv``
(its throughput, the mean of the logged windows) and ``compare_memory.json`` (its peak memory growth), so a summary
can be made at any time, also of an interrupted comparison. A variant's summary holds its runs, the finished runs'
test metric by seed and its comparison with the baseline (:mod:`interlayer.compare.stats`); the report
(:mod:`.report`), the pictures (:mod:`.pictures`), the exports (:mod:`.exports`) and the ``--select`` choices
(:mod:`.selection`) read these.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import DamagedResults
from .child import MEMORY_FILE, read_results
from .plan import Plan, PlannedVariant
from .runner import RUNS, STATUS_FILE, run_name
from .stats import Comparison, compare_to_baseline, mean_std

# The metric's unit, for the axes and the --margin (absolute, in these units); tasks report accuracy in percent.
METRIC_UNITS = {"loss": "nats per token", "accuracy": "%", "bleu": "BLEU points"}


def metric_label(metric: str) -> str:
    unit = METRIC_UNITS.get(metric)
    return f"{metric} ({unit})" if unit else metric


@dataclass
class RunRecord:
    """What one run of a comparison did, read back from its directory: its state, results, learning curve, best
    validation metric, throughput and peak memory growth."""

    variant: str
    seed: int
    run_dir: Path
    state: str  # finished | interrupted | failed | cancelled (a cluster job) | not started
    results: dict[str, Any] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (training minutes, validation metric)
    best_valid: Optional[float] = None
    speed: Optional[float] = None
    memory: Optional[float] = None  # MiB, growth of ru_maxrss
    detail: str = ""

    @property
    def name(self) -> str:
        return run_name(self.variant, self.seed)


@dataclass
class VariantSummary:
    """One variant over its seeds: the runs, the finished runs' test metric by seed (the statistics pair seeds), the
    best validation metrics, throughputs and peak memory, and its comparison with the baseline."""

    planned: PlannedVariant
    runs: list[RunRecord]
    test_by_seed: dict[int, float]  # the finished runs' test metric, by seed (the statistics pair seeds)
    valid: list[float]
    speeds: dict[int, float]  # each run's measured throughput (the mean of its logged windows), by seed
    memory: Optional[float]
    comparison: Optional[Comparison] = None  # against the baseline; None for the baseline itself
    extra: dict[str, list[float]] = field(default_factory=dict)  # secondary test metrics (MRPC's F1, chrF)

    @property
    def name(self) -> str:
        return self.planned.variant.name

    @property
    def test(self) -> list[float]:
        return list(self.test_by_seed.values())

    @property
    def speed(self) -> Optional[float]:
        """The mean throughput over the runs that logged one."""
        return mean_std(list(self.speeds.values()))[0]

    def finished(self) -> list[RunRecord]:
        return [r for r in self.runs if r.state == "finished"]


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def _number(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def csv_curve(path: Path, x_key: str, y_key: str) -> list[tuple[float, float]]:
    points = []
    for row in _read_csv(path):
        x, y = _number(row.get(x_key)), _number(row.get(y_key))
        if x is not None and y is not None:
            points.append((x, y))
    return points


def curve_axis(plan: Plan) -> tuple[str, str]:
    """The learning curves' x (a ``valid.csv`` column, an axis label): training minutes under a time budget,
    optimiser steps otherwise, which do not depend on the machine's load."""
    if plan.settings.budget_minutes:
        return "elapsed_min", "training minutes (validation excluded)"
    return "step", "optimiser steps"


def read_run(plan: Plan, output: Path, variant: str, seed: int, status: dict[str, Any]) -> RunRecord:
    """The record of one run (``variant``, ``seed``) from its directory under ``output`` and the comparison's
    ``status.json`` entries (``status``): finished (its ``results.json``; a damaged one counts as unfinished), failed or
    cancelled, interrupted (started, not finished) or not started; its learning curve on the plan's x axis, best
    validation metric, mean throughput and peak memory growth."""
    run_dir = output / RUNS / run_name(variant, seed)
    record = RunRecord(variant, seed, run_dir, "not started")
    metric, higher = plan.task.metric, plan.task.higher_is_better
    record.curve = csv_curve(run_dir / "valid.csv", curve_axis(plan)[0], metric)
    if record.curve:
        values = [y for _, y in record.curve]
        record.best_valid = max(values) if higher else min(values)
    speeds = [s for s in (_number(r.get("units_per_s")) for r in _read_csv(run_dir / "train.csv")) if s is not None]
    record.speed = sum(speeds) / len(speeds) if speeds else None
    if (run_dir / MEMORY_FILE).is_file():
        record.memory = max(s["peak_rss_growth_mb"] for s in json.loads((run_dir / MEMORY_FILE).read_text()))
    try:
        results = read_results(run_dir)
    except DamagedResults as err:
        results, record.detail = None, (f"{err}; counted as unfinished: the same compare command scores it "
                                        "again")
    if results is not None:
        record.state, record.results = "finished", results
    elif status.get(record.name, {}).get("status") in ("failed", "cancelled"):
        record.state, record.detail = status[record.name]["status"], status[record.name].get("detail", "")
    elif (run_dir / "run.json").is_file():
        record.state = "interrupted"
    return record


def extra_metrics(plan: Plan) -> tuple[str, ...]:
    """The task's secondary test metrics, reported beside its main one (e.g. MRPC's F1, translation's chrF)."""
    return plan.task.extra_metrics


def _test_values(runs: list[RunRecord], metric: str) -> dict[int, float]:
    return {r.seed: float(r.results[f"test_{metric}"]) for r in runs
            if isinstance(r.results.get(f"test_{metric}"), (int, float))}


def summarize(plan: Plan, output: Path, margin: Optional[float] = None,
              effect: Optional[float] = None) -> list[VariantSummary]:
    """Every variant's :class:`VariantSummary`, in the plan's order, read from ``output``, with each variant compared to
    the baseline on the finished runs' test metric (``margin``: the equivalence margin; ``effect``: the difference
    seeds are planned for; :mod:`interlayer.compare.stats`)."""
    status_path = output / STATUS_FILE
    status = json.loads(status_path.read_text()) if status_path.is_file() else {}
    summaries = []
    for planned in plan.variants:
        runs = [read_run(plan, output, planned.variant.name, seed, status) for seed in plan.settings.seeds]
        done = [r for r in runs if r.state == "finished"]
        valid = [r.best_valid for r in done if r.best_valid is not None]
        memories = [r.memory for r in runs if r.memory is not None]
        summaries.append(VariantSummary(planned, runs, _test_values(done, plan.task.metric), valid,
                                        {r.seed: r.speed for r in runs if r.speed is not None},
                                        max(memories) if memories else None,
                                        extra={m: list(_test_values(done, m).values()) for m in extra_metrics(plan)}))
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    comparisons = compare_to_baseline({s.name: s.test_by_seed for s in summaries if s is not base},
                                      base.test_by_seed, plan.task.higher_is_better, margin, effect)
    for summary in summaries:
        summary.comparison = comparisons.get(summary.name)
    return summaries
