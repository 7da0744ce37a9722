"""The compute table of a comparison's report: each variant's FLOPs and tokens per optimiser step and, per run, the
steps it took, the FLOPs and tokens they make and its measured training time (:mod:`.budget` has the accounting);
and a compute budget in the report's words."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .budget import flops_text
from .plan import Plan, Settings
from .records import VariantSummary


def budget_text(settings: Settings) -> Optional[str]:
    """The budget in the report's words for a compute budget; None for the other budgets."""
    if settings.budget_flops is not None:
        return (f"{flops_text(settings.budget_flops)} training FLOPs per run (6 x multiply-adds per token, attention "
                "included), as whole optimiser steps")
    if settings.budget_tokens is not None:
        return f"{settings.budget_tokens:,} training tokens per run, as whole optimiser steps"
    return None


COMPUTE_HEADERS = ["variant", "FLOPs per step", "tokens per step", "steps per run", "training FLOPs per run",
                   "x baseline FLOPs", "tokens per run", "training s per run (measured)"]


def _spread(values: list[float], text: Any) -> str:
    if not values:
        return "–"
    low, high = min(values), max(values)
    return text(low) if low == high else f"{text(low)}-{text(high)}"


def compute_rows(plan: Plan, summaries: Sequence[VariantSummary]) -> list[list[str]]:
    """The compute table (:data:`COMPUTE_HEADERS`): per variant its cost of a step, and over its finished runs the
    steps taken, the FLOPs and tokens they make and the measured training seconds (lowest-highest over seeds);
    empty when the task's steps have no fixed size."""
    base = plan.variant(plan.settings.baseline)
    if any(s.planned.step is None for s in summaries) or base.step is None:
        return []
    rows = []
    base_flops = [r.results["steps"] * base.step.flops for s in summaries if s.name == base.variant.name
                  for r in s.finished() if isinstance(r.results.get("steps"), int)]
    for s in summaries:
        step = s.planned.step
        steps = [r.results["steps"] for r in s.finished() if isinstance(r.results.get("steps"), int)]
        seconds = [60 * r.results["train_minutes"] for r in s.finished()
                   if isinstance(r.results.get("train_minutes"), (int, float))]
        flops = [n * step.flops for n in steps]
        ratio = (sum(flops) / len(flops)) / (sum(base_flops) / len(base_flops)) if flops and base_flops else None
        rows.append([s.name, flops_text(step.flops), f"{step.tokens:,}", _spread(steps, lambda v: f"{v:,}"),
                     _spread(flops, flops_text), "–" if ratio is None else f"{ratio:.4f}",
                     _spread([n * step.tokens for n in steps], lambda v: f"{v:,}"),
                     _spread(seconds, lambda v: f"{v:.0f}")])
    return rows


COMPUTE_NOTE = ("Compute: training FLOPs = 6 x the multiply-adds of the forward pass over the step's tokens (2 FLOPs "
                "per multiply-add, the backward pass twice the forward; attention's T x T products and every method's "
                "own modules included, as `interlayer models` counts them), times the steps a run took; equal FLOPs "
                "are not equal time for a method bound by memory traffic, hence the measured seconds (which depend "
                "on the machine and its load).")
