"""What every run of a comparison did, read back from its directory: the run records and each variant's summary.

A run is read from ``results.json`` (finished; a damaged one counts as unfinished), ``status.json`` (failed or
cancelled), ``run.json`` (started), ``valid.csv`` (its learning curve and best validation metric), ``train.csv``
(its throughput, the mean of the logged windows) and ``compare_memory.json`` (its peak memory growth), so a summary
can be made at any time, also of an interrupted comparison. Every file is checked as it is read (:mod:`.readback`):
one edited or damaged is refused naming it, never averaged in. A variant's summary holds its runs, the finished runs'
test metric by seed and its comparison with the baseline (:mod:`interlayer.compare.stats`); the report
(:mod:`.report`), the pictures (:mod:`.pictures`), the exports (:mod:`.exports`) and the ``--select`` choices
(:mod:`.selection`) read these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import DamagedResults
from .child import MEMORY_FILE, RESULTS_FILE, read_results
from .plan import Plan, PlannedVariant
from .readback import check_score, metric_range, read_columns, read_memory, read_status
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


def csv_curve(path: Path, x_key: str, y_key: str) -> list[tuple[float, float]]:
    """The points of a learning curve: ``x_key`` (steps or minutes, at least 0) and ``y_key`` (a metric, in its
    range) of every row of the CSV log ``path`` that has both (:func:`~interlayer.compare.readback.read_columns`)."""
    rows = read_columns(path, {x_key: (0.0, float("inf")), y_key: metric_range(y_key)})
    return [(row[x_key], row[y_key]) for row in rows if x_key in row and y_key in row]


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
    rows = read_columns(run_dir / "train.csv", {"units_per_s": (0.0, float("inf"))})
    speeds = [row["units_per_s"] for row in rows if "units_per_s" in row]
    record.speed = sum(speeds) / len(speeds) if speeds else None
    memory = read_memory(run_dir / MEMORY_FILE)
    record.memory = max(s["peak_rss_growth_mb"] for s in memory) if memory else None
    try:
        results = read_results(run_dir)
    except DamagedResults as err:
        results, record.detail = None, (f"{err}; counted as unfinished: the same compare command scores it "
                                        "again")
    if results is not None:
        for scored in (metric, *extra_metrics(plan)):  # a score outside its metric's range is refused, not averaged
            check_score(results, scored, run_dir / RESULTS_FILE, required=scored == metric)
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
    status = read_status(output / STATUS_FILE)
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
