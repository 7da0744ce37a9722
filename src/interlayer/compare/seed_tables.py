"""The report's per-seed tables: every run with its own figures, and the per-seed differences to the baseline that
the paired t-test is computed from, so a reader can redo the primary test from the report alone.

Values get at least :data:`SEED_DECIMALS` decimals (the task's own when it fixes more): a per-seed difference of a
few hundredths of a nat is lost in the two decimals that a value above 1 gets elsewhere.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .plan import Plan
from .records import VariantSummary
from .stats import mean_std

SEED_DECIMALS = 3
RUN_HEADERS = ["run", "status", "epochs", "steps", "train min", "stop reason", "best valid", "test"]


def seed_places(plan: Plan) -> int:
    return max(SEED_DECIMALS, plan.task.decimals or 0)


def _number(value: Any, places: int, sign: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value:+.{places}f}" if sign else f"{value:.{places}f}"


def run_rows(plan: Plan, summaries: Sequence[VariantSummary]) -> list[list[str]]:
    """One row per run: its state, epochs, steps, training minutes, why it stopped, its best validation metric and
    its test metric (:func:`seed_places` decimals)."""
    places = seed_places(plan)
    rows = []
    for s in summaries:
        for r in s.runs:
            res = r.results
            rows.append([r.name, r.state + (f": {r.detail}" if r.detail else ""), str(res.get("epochs", "–")),
                         str(res.get("steps", "–")), _number(res.get("train_minutes"), 2),
                         str(res.get("stop_reason", "–")), _number(r.best_valid, places),
                         _number(res.get(f"test_{plan.task.metric}"), places)])
    return rows


def seed_differences(summary: VariantSummary, baseline: VariantSummary) -> dict[int, float]:
    """``variant - baseline`` of the test metric for every seed both finished: the paired test's data."""
    base = baseline.test_by_seed
    return {seed: value - base[seed] for seed, value in summary.test_by_seed.items() if seed in base}


def difference_headers(plan: Plan, summaries: Sequence[VariantSummary]) -> list[str]:
    base = plan.settings.baseline
    return ["seed", f"{base} test {plan.task.metric}",
            *(f"{s.name} - {base}" for s in summaries if s.name != base)]


def difference_rows(plan: Plan, summaries: Sequence[VariantSummary]) -> list[list[str]]:
    """One row per seed: the baseline's test metric and each variant's difference to it (– where either run has not
    finished); then their mean and sample standard deviation over the seeds (the paired test's Δ and the spread its
    interval, p and power come from)."""
    places = seed_places(plan)
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    columns = [base.test_by_seed, *(seed_differences(s, base) for s in summaries if s is not base)]
    rows = [[str(seed), *(_number(column.get(seed), places, sign=i > 0) for i, column in enumerate(columns))]
            for seed in plan.settings.seeds]
    for label, index in (("mean", 0), ("sd", 1)):
        stats: list[Optional[float]] = [mean_std(list(column.values()))[index] for column in columns]
        rows.append([label, *(_number(v, places, sign=i > 0 and label == "mean") for i, v in enumerate(stats))])
    return rows
