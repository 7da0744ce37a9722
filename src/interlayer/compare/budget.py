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
from typing import Any, Literal, Optional

from ..config_io import dataclass_from_dict
from ..errors import ConfigError
from ..experiment import split_overrides, with_defaults
from ..tasks import TaskSpec
from ..training.config import TrainConfig

Unit = Literal["flops", "tokens"]

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


def run_train_config(spec: TaskSpec, sets: dict[str, Any]) -> TrainConfig:
    """The training settings a run with the ``--set`` keys ``sets`` gets: the task's defaults, then ``sets``."""
    _, train_sets, _ = split_overrides(with_defaults(spec, sets))
    return dataclass_from_dict(TrainConfig, {**spec.train_defaults, **train_sets}, "train.")


def step_shape(task: Any, train: TrainConfig, madds: int, lengths: list[int], processes: int
               ) -> Optional[StepShape]:
    """The tokens and FLOPs of one optimiser step of a run with the training settings ``train`` over ``processes``
    data-parallel ranks, for a model of ``madds`` multiply-adds per forward pass at ``lengths``; None for a task
    whose steps read a varying number of tokens (no ``step_blocks``)."""
    step_blocks = getattr(task, "step_blocks", None)
    if step_blocks is None:
        return None
    blocks, length = step_blocks(train, processes)
    if lengths != [length]:  # the MAdds column is counted at one block; anything else is a bug here
        raise RuntimeError(f"MAdds counted at {lengths}, but a step reads blocks of {length} tokens")
    return StepShape(blocks * length, float(FLOPS_PER_MADD * madds * blocks))


def whole_steps(unit: Unit, amount: float, step: Optional[StepShape], variant: str, task: str) -> int:
    """``floor(amount / the variant's FLOPs (or tokens) per step)``: the whole steps a budget buys; refused for a
    task without fixed steps and for a budget below one step."""
    flag = f"--budget-{unit}"
    if step is None:
        raise ConfigError(f"{flag} needs a task whose optimiser steps read the same number of tokens (lm); task "
                          f"{task!r} batches vary in length, so use --budget-steps or --budget-minutes")
    per_step = step.flops if unit == "flops" else step.tokens
    steps = math.floor(amount / per_step)
    if steps < 1:
        raise ConfigError(f"{flag}={amount:g} buys no optimiser step of variant {variant!r}: one step trains "
                          f"{per_step:.4g} {'FLOPs' if unit == 'flops' else 'tokens'}; give at least that")
    return steps


def flops_text(value: float) -> str:
    """``1.23e13``: three significant digits and a plain exponent."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)))
    return f"{value / 10 ** exponent:.2f}e{exponent}"
