"""``compare --sizes``: the scaling sweep, planned. Every variant trains at several sizes and seeds (:mod:`.sweep`
runs it), and the report fits each variant's loss against its training compute and states each method's compute
multiplier (:mod:`.scaling_report`).

A sweep is one comparison directory whose variants are the (variant, size) cells, named ``VARIANT@SIZE``
(``muddformer@d_model64``): each size is planned exactly as ``compare`` plans a comparison (the size's fields are a
global ``--set`` of that size, so a named method variant adapts to the size's model as it would to any base
model: LW's groups, CLA's layer groups), and the cells are then trained by compare's own runners, locally
(``--jobs``) or as cluster jobs (``--launcher submitit``), with its ``compare.json``: the same command resumes a
sweep, skips its finished runs, and may grow it by seeds, variants or sizes; anything else is refused.

**The size rule** (``--sizes KEY=V1,V2,...``, repeatable, every key with the same number of values: the i-th size
takes the i-th value of each) sets model fields or ``train.*`` settings per size. When ``d_model`` changes and
``d_ffn`` is not given, ``d_ffn`` keeps the base model's ratio to ``d_model`` (4x for the presets), so a width sweep
scales the whole block; give ``--sizes d_ffn=...`` to choose otherwise. The heads stay as they are (head width grows).

**The budget per size**: ``--budget-steps`` or ``--budget-tokens`` give every size and variant the same steps or
tokens (compute then grows with the size); ``--tokens-per-parameter R`` gives each size the FLOPs the baseline
needs for ``R`` tokens per parameter (Hoffmann et al. 2022 find about 20 compute-optimal) and every variant of the
size those FLOPs (equal compute at each size, each variant's steps from its own cost per step, :mod:`.budget`).
One FLOP budget for every size is refused: all points would sit at one compute, with no curve to fit.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

from ..config_io import parse_value
from ..errors import ConfigError
from ..experiment import split_overrides, with_defaults
from ..models.registry import get_config
from .plan import Plan, PlannedVariant, Settings, build_plan, get_spec, set_steps
from .scaling_fit import MIN_SIZES
from .variants import check_global_sets

Axis = Literal["flops", "seconds"]
CELL = "{variant}@{size}"
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
# the fields a width sweep carries along (the followers keep their ratio to the leader unless given)
FOLLOWERS = {"d_model": ("d_ffn",)}


@dataclass(frozen=True)
class Size:
    """One size of a sweep: its label (part of the run names) and its settings (model fields, ``train.*``)."""

    label: str
    sets: dict[str, Any]


@dataclass(frozen=True)
class SweepOptions:
    """The sweep's choices beside the comparison's :class:`~interlayer.compare.plan.Settings`: the sizes (as given;
    the followers are added when planned), the budget rule, the size to extrapolate to, the compute axis."""

    sizes: list[Size]
    tokens_per_parameter: Optional[float] = None
    extrapolate: Optional[Size] = None
    axis: Axis = "flops"


def _label(pairs: Sequence[tuple[str, Any]]) -> str:
    return "_".join(_LABEL_CHARS.sub("-", f"{key}{value}") for key, value in pairs)


def _check_key(key: str, flag: str) -> None:
    if not key or key.startswith("data."):
        raise ConfigError(f"{flag} {key or '(empty)'}=...: a size sets model fields or train.* settings (d_model, "
                          "enc_layers, train.lr); every size reads the same data")
    check_global_sets({key: ""})


def parse_sizes(entries: Sequence[str]) -> list[Size]:
    """``--sizes KEY=V1,V2,...`` entries -> the sizes, in order: every key with the same number of values, at
    least :data:`~interlayer.compare.scaling_fit.MIN_SIZES`, no size twice."""
    rule: dict[str, list[Any]] = {}
    for entry in entries:
        key, sep, values = entry.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise ConfigError(f"--sizes expects KEY=V1,V2,... (e.g. --sizes d_model=64,96,128,192), got {entry!r}")
        _check_key(key, "--sizes")
        if key in rule:
            raise ConfigError(f"--sizes gives {key} twice; give each key once, with one value per size")
        rule[key] = [parse_value(v.strip(), f"--sizes {key}") for v in values.split(",")]
    counts = {key: len(values) for key, values in rule.items()}
    if len(set(counts.values())) > 1:
        raise ConfigError(f"--sizes keys give different numbers of values ({counts}); the i-th size takes the i-th "
                          "value of every key, so give each key one value per size")
    count = next(iter(counts.values()), 0)
    if count < MIN_SIZES:
        raise ConfigError(f"--sizes gives {count} size(s); a scaling fit (three parameters: E, A, alpha) needs at "
                          f"least {MIN_SIZES}")
    sizes = [Size(_label([(k, v[i]) for k, v in rule.items()]), {k: v[i] for k, v in rule.items()})
             for i in range(count)]
    labels = [s.label for s in sizes]
    if len(set(labels)) < len(labels):
        raise ConfigError(f"--sizes gives the same size twice ({', '.join(labels)})")
    return sizes


def parse_size(entries: Sequence[str]) -> Size:
    """``--extrapolate KEY=VALUE`` entries -> one size."""
    pairs = []
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not value.strip() or "," in value:
            raise ConfigError(f"--extrapolate expects KEY=VALUE, one value (e.g. --extrapolate d_model=512), got "
                              f"{entry!r}")
        _check_key(key.strip(), "--extrapolate")
        pairs.append((key.strip(), parse_value(value.strip(), f"--extrapolate {key.strip()}")))
    return Size(_label(pairs), dict(pairs))


def with_followers(size: Size, settings: Settings) -> Size:
    """``size`` with the fields that follow a given one (:data:`FOLLOWERS`) at the base model's ratio, unless the
    size or the global ``--set`` gives them."""
    spec = get_spec(settings.task)
    model_sets = split_overrides(with_defaults(spec, settings.sets))[0]
    base = None
    extra: dict[str, Any] = {}
    for leader, followers in FOLLOWERS.items():
        for follower in followers:
            if leader not in size.sets or follower in size.sets or follower in model_sets:
                continue
            base = base or get_config(settings.preset, **model_sets)
            old_leader, old_follower = getattr(base, leader, None), getattr(base, follower, None)
            if isinstance(old_leader, int) and isinstance(old_follower, int) and old_leader > 0:
                extra[follower] = round(size.sets[leader] * old_follower / old_leader)
    return Size(size.label, {**size.sets, **extra})


def cell_name(variant: str, size: str) -> str:
    return CELL.format(variant=variant, size=size)


@dataclass
class Sweep:
    """A sweep resolved before anything trains: ``plan`` holds every (variant, size) cell (what the runners train);
    ``sizes`` (with their followers) and, per size, the plan of its cells (``size_plans``, baseline
    ``BASELINE@SIZE``, for the per-size comparisons); ``extrapolated``: the variants counted at the extrapolation
    size (never trained)."""

    settings: Settings
    options: SweepOptions
    sizes: list[Size]
    plan: Plan
    size_plans: dict[str, Plan]
    variants: list[str]
    extrapolated: Optional[Plan] = None
    extrapolated_size: Optional[Size] = None

    def cell(self, variant: str, size: str) -> PlannedVariant:
        return self.plan.variant(cell_name(variant, size))


def _check(settings: Settings, options: SweepOptions) -> None:
    if settings.budget_flops is not None:
        raise ConfigError("--budget-flops with --sizes would give every size the same compute, so the points would "
                          "sit at one compute with no curve to fit; use --tokens-per-parameter (equal FLOPs per size, "
                          "growing with it) or --budget-steps / --budget-tokens")
    other = [flag for flag, value in (("--budget-steps", settings.sets.get("train.max_steps")),
                                      ("--budget-minutes", settings.budget_minutes),
                                      ("--budget-tokens", settings.budget_tokens)) if value is not None]
    if options.tokens_per_parameter is not None:
        if not (math.isfinite(options.tokens_per_parameter) and options.tokens_per_parameter > 0):
            raise ConfigError(f"--tokens-per-parameter={options.tokens_per_parameter} must be a positive number")
        if other:
            raise ConfigError(f"--tokens-per-parameter decides each size's budget; {' and '.join(other)} would "
                              "contradict it: give one budget")
    for size in options.sizes:
        clash = sorted(set(size.sets) & set(settings.sets))
        if clash:
            raise ConfigError(f"--sizes and --set both give {', '.join(clash)}; a swept key is set by --sizes alone")
    if options.extrapolate is not None:
        if options.axis == "seconds":
            raise ConfigError("--extrapolate needs the FLOPs axis: a size that did not train has no measured time "
                              "(drop --scaling-axis seconds)")
        if settings.budget_minutes is not None:
            raise ConfigError("--extrapolate needs a budget in steps, tokens or tokens per parameter: under "
                              "--budget-minutes the compute a size would reach is unknown until it trains")
        unknown = sorted(set(options.extrapolate.sets) - {k for s in options.sizes for k in s.sets})
        if unknown:
            raise ConfigError(f"--extrapolate sets {', '.join(unknown)}, which --sizes does not vary; extrapolate "
                              "along the swept keys")


def _size_plan(settings: Settings, size: Size, options: SweepOptions, processes: int) -> Plan:
    """The comparison at one size, its cells named ``VARIANT@SIZE`` and, with ``--tokens-per-parameter``, each
    given the baseline's FLOPs for that many tokens per parameter."""
    plan = build_plan(dataclasses.replace(settings, sets={**settings.sets, **size.sets}), processes)
    base = plan.variant(settings.baseline)
    if options.tokens_per_parameter is not None:
        if base.step is None:
            raise ConfigError(f"--tokens-per-parameter needs a task whose optimiser steps read the same number of "
                              f"tokens (lm); task {settings.task!r} batches vary in length")
        flops = options.tokens_per_parameter * base.parameters * base.step.flops / base.step.tokens
        set_steps(plan.variants, "flops", flops, settings.task)
    cells = [dataclasses.replace(v, variant=dataclasses.replace(v.variant, name=cell_name(v.variant.name, size.label)))
             for v in plan.variants]
    return Plan(dataclasses.replace(plan.settings, baseline=cell_name(settings.baseline, size.label)), plan.spec,
                plan.task, cells)


def plan_sweep(settings: Settings, options: SweepOptions, processes: int = 1) -> Sweep:
    """Check the sweep and resolve every cell (and the extrapolation size's models) before anything trains."""
    _check(settings, options)
    if options.axis == "flops" and get_spec(settings.task).name != "lm":
        raise ConfigError(f"a scaling sweep on the FLOPs axis needs a task whose steps read a fixed number of tokens "
                          f"(lm); task {settings.task!r} has none: use --scaling-axis seconds")
    sizes = [with_followers(size, settings) for size in options.sizes]
    size_plans = {size.label: _size_plan(settings, size, options, processes) for size in sizes}
    cells = [cell for plan in size_plans.values() for cell in plan.variants]
    first = next(iter(size_plans.values()))
    combined = Plan(dataclasses.replace(settings, variants=[c.variant.name for c in cells]), first.spec, first.task,
                    cells)
    variants = [v.variant.name.rpartition("@")[0] for v in first.variants]
    sweep = Sweep(settings, options, sizes, combined, size_plans, variants)
    if options.extrapolate is not None:
        size = with_followers(Size(options.extrapolate.label, {**options.sizes[-1].sets,
                                                               **options.extrapolate.sets}), settings)
        sweep.extrapolated_size = size
        sweep.extrapolated = _size_plan(settings, size, options, processes)
    return sweep
