"""Budgets in compute: ``compare --budget-flops F`` and ``--budget-tokens N`` as each variant's optimiser steps.

A method that costs more per step (PA, hyper-connections, MUDDFormer) or less (LW, CLA) is compared with the
baseline at unequal compute under a budget of steps or minutes. A compute budget gives every variant the same
training FLOPs instead (or the same tokens): the task must read the same number of tokens in every optimiser step
(the language model: ``train.max_tokens // data.block_size`` blocks of ``data.block_size`` tokens, ``update_freq``
times per process, :meth:`~interlayer.tasks.language_modeling.LanguageModelingTask.step_blocks`), so that a budget is
a whole number of steps for each variant:

* **training FLOPs of a step** = :data:`FLOPS_PER_MADD` x the multiply-adds of the forward pass over the step's
  blocks, from the project's own accounting (:func:`~interlayer.accounting.count_madds`: every matrix product and
  convolution, attention's ``T x T`` products and each method's own modules included; 2 FLOPs per multiply-add, and
  the backward pass twice the forward: the convention of Kaplan et al. 2020 and of
  :func:`~interlayer.accounting.step_cost`);
* **steps** = ``floor(budget / FLOPs per step)``: the largest number of whole steps within the budget, so every
  variant's FLOPs lie within one of its own steps below the budget (``floor(budget / tokens per step)`` for tokens).

The steps reach each run as its ``train.max_steps`` (the schedule decays over them, as under ``--budget-steps``).
The report's compute table states each variant's FLOPs and tokens per step and, per run, the steps, FLOPs, tokens
and measured training time, since equal FLOPs are not equal cost for a method bound by memory traffic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence

from ..config_io import dataclass_from_dict
from ..errors import ConfigError, VariantError
from ..experiment import split_overrides, with_defaults
from ..tasks import TaskSpec
from ..training.config import TrainConfig

if TYPE_CHECKING:
    from .plan import Plan, PlannedVariant, Settings
    from .records import VariantSummary

# 2 FLOPs per multiply-add, times 3: the forward pass and the backward's two products (inputs' and weights' gradients)
FLOPS_PER_MADD = 6


@dataclass(frozen=True)
class StepShape:
    """What one optimiser step of a variant trains on: its tokens (all processes) and its training FLOPs."""

    tokens: int
    flops: float


def check_budgets(budget_minutes: Optional[float], budget_steps: Optional[int], budget_flops: Optional[float],
                  budget_tokens: Optional[int], sets: dict[str, Any]) -> None:
    """A compute budget (FLOPs or tokens) alone, positive and finite: it decides ``train.max_steps`` itself, which
    a step or time budget would contradict (those two may still be given together: whichever ends first)."""
    given = [name for name, value in (("--budget-minutes", budget_minutes), ("--budget-steps", budget_steps),
                                      ("--budget-flops", budget_flops), ("--budget-tokens", budget_tokens))
             if value is not None]
    if len(given) > 1 and (budget_flops is not None or budget_tokens is not None):
        raise ConfigError(f"{' and '.join(given)} are given together; a compute budget (FLOPs or tokens per run) "
                          "decides each run's steps alone")
    for flag, value, unit in (("--budget-flops", budget_flops, "FLOPs"), ("--budget-tokens", budget_tokens, "tokens")):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag}={value:g} must be a positive number (training {unit} per run)")
        if value is not None and "train.max_steps" in sets:
            raise ConfigError(f"{flag} decides each run's optimiser steps (train.max_steps); --set "
                              f"train.max_steps={sets['train.max_steps']} would contradict it: give one of the two")


def run_train_config(spec: TaskSpec, planned: "PlannedVariant") -> TrainConfig:
    """The training settings the variant's runs get: the task's defaults, then its ``--set`` and own keys."""
    _, train_sets, _ = split_overrides(with_defaults(spec, planned.sets))
    return dataclass_from_dict(TrainConfig, {**spec.train_defaults, **train_sets}, "train.")


def step_shape(spec: TaskSpec, task: Any, planned: "PlannedVariant", processes: int) -> Optional[StepShape]:
    """The variant's tokens and FLOPs per optimiser step with ``processes`` data-parallel ranks per run; None for a
    task whose steps read a varying number of tokens (no ``step_blocks``)."""
    step_blocks = getattr(task, "step_blocks", None)
    if step_blocks is None:
        return None
    blocks, length = step_blocks(run_train_config(spec, planned), processes)
    if planned.lengths != [length]:  # the MAdds column is counted at one block; anything else is a bug here
        raise RuntimeError(f"variant {planned.variant.name!r}: MAdds counted at {planned.lengths}, a step reads "
                           f"blocks of {length} tokens")
    return StepShape(blocks * length, float(FLOPS_PER_MADD * planned.madds * blocks))


def apply_budget(settings: "Settings", spec: TaskSpec, task: Any, planned: Sequence["PlannedVariant"],
                 processes: int) -> None:
    """Record each variant's :class:`StepShape` and, under a compute budget, set its ``train.max_steps`` to the
    whole steps the budget buys (module docstring)."""
    for variant in planned:
        variant.step = step_shape(spec, task, variant, processes)
    if settings.budget_flops is not None:
        set_steps(planned, "flops", settings.budget_flops, spec.name)
    elif settings.budget_tokens is not None:
        set_steps(planned, "tokens", settings.budget_tokens, spec.name)


def set_steps(planned: Sequence["PlannedVariant"], unit: Literal["flops", "tokens"], amount: float, task: str
              ) -> None:
    """Give every variant ``train.max_steps = floor(amount / its FLOPs (or tokens) per step)``; a variant that
    sets its own step limit, a task without fixed steps and a budget below one step are refused."""
    flag = f"--budget-{unit}"
    for variant in planned:
        name = variant.variant.name
        if variant.step is None:
            raise ConfigError(f"{flag} needs a task whose optimiser steps read the same number of tokens (lm); "
                              f"task {task!r} batches vary in length, so use --budget-steps or --budget-minutes")
        if "train.max_steps" in variant.own:
            raise VariantError(f"variant {name!r} sets train.max_steps, which {flag} decides for every variant")
        per_step = variant.step.flops if unit == "flops" else variant.step.tokens
        steps = math.floor(amount / per_step)
        if steps < 1:
            raise ConfigError(f"{flag}={amount:g} buys no optimiser step of variant {name!r}: one step trains "
                              f"{per_step:.4g} {'FLOPs' if unit == 'flops' else 'tokens'}; give at least that")
        variant.sets["train.max_steps"] = steps


def budget_text(settings: "Settings") -> Optional[str]:
    """The budget in the report's words for a compute budget; None for the other budgets."""
    if settings.budget_flops is not None:
        return (f"{flops_text(settings.budget_flops)} training FLOPs per run (6 x multiply-adds per token, attention "
                "included), as whole optimiser steps")
    if settings.budget_tokens is not None:
        return f"{settings.budget_tokens:,} training tokens per run, as whole optimiser steps"
    return None


def flops_text(value: float) -> str:
    """``1.23e13``: three significant digits and a plain exponent."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)))
    return f"{value / 10 ** exponent:.2f}e{exponent}"


COMPUTE_HEADERS = ["variant", "FLOPs per step", "tokens per step", "steps per run", "training FLOPs per run",
                   "x baseline FLOPs", "tokens per run", "training s per run (measured)"]


def _spread(values: list[float], text: Any) -> str:
    if not values:
        return "–"
    low, high = min(values), max(values)
    return text(low) if low == high else f"{text(low)}-{text(high)}"


def compute_rows(plan: "Plan", summaries: Sequence["VariantSummary"]) -> list[list[str]]:
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
