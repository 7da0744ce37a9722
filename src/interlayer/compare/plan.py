"""A comparison's plan: the settings, every variant resolved against the task, and the ``compare.json`` that
lets the same command continue a directory, or a grown one (more seeds, more variants), and refuses one made with
other settings.

Resolving builds the task once in this process (for the fields the data decides: vocabulary, classes, image
geometry), resolves every variant's model config exactly as ``interlayer train`` would, builds the model and
counts its parameters and MAdds. Any variant that cannot apply to the task therefore fails here, before anything
trains, with the error naming the variant.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Callable, Optional

import torch

from .. import __version__
from ..accounting import count_madds, count_parameters
from ..config_io import dataclass_from_dict, parse_value
from ..errors import ConfigError, VariantError
from ..experiment import split_overrides, with_defaults
from ..fileio import write_json
from ..methods.base import VariantContext
from ..models.registry import config_family
from ..papers import task_settings
from ..tasks import TaskSpec, task_specs
from ..training.config import TrainConfig
from .budget import StepShape, Unit, run_train_config, step_shape, whole_steps
from .readback import read_comparison
from .variants import Variant, parse_variant, variant_overrides

COMPARE_FILE = "compare.json"
FORMAT = 1


@dataclass
class Settings:
    """Everything that decides what a comparison trains; two invocations may share a directory only if equal."""

    task: str
    preset: str
    variants: list[str]  # the entries as given (named, preset, file, or NAME=BASE+KEY=VALUE)
    baseline: str
    seeds: list[int]
    budget_minutes: Optional[float]  # train.max_minutes of every run; None keeps the task's epoch limits
    sets: dict[str, Any] = field(default_factory=dict)  # global --set (text, or a flag's typed value), every variant
    budget_flops: Optional[float] = None  # training FLOPs per run, as each variant's max_steps (budget.py)
    budget_tokens: Optional[int] = None  # training tokens per run, likewise

    def parsed_variants(self) -> list[Variant]:
        return [parse_variant(entry, self.preset) for entry in self.variants]


@dataclass
class PlannedVariant:
    """A variant as it will train: the overrides the child receives and what they build."""

    variant: Variant
    own: dict[str, Any]  # the variant's own overrides (its named variant's, then its entry's)
    sets: dict[str, Any]  # what the run receives: the global --set, then ``own``
    model: dict[str, Any]  # the resolved model config
    parameters: int
    madds: int
    lengths: list[int]  # the arguments of count_madds
    length_label: str
    step: Optional[StepShape] = None  # tokens and FLOPs of an optimiser step, where the task fixes them (budget.py)

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant.to_dict(), "description": self.variant.description, "own": self.own,
                "sets": self.sets,
                "model": self.model, "parameters": self.parameters, "madds": self.madds, "lengths": self.lengths,
                "length_label": self.length_label, "step": None if self.step is None else asdict(self.step)}


@dataclass
class TaskInfo:
    """What the report needs to know of the task, recorded in ``compare.json``: its metric and direction, the units of
    its throughput, its secondary metrics, the metric's decimals."""

    metric: str
    higher_is_better: bool
    units: str  # what the engine's units_per_s counts
    extra_metrics: tuple[str, ...] = ()  # secondary test metrics reported beside ``metric`` (MRPC's F1, chrF)
    decimals: Optional[int] = None  # digits of the metric in the table (``task.metric_decimals``); None: by size


@dataclass
class Plan:
    """A comparison resolved against its task before anything trains: the settings, the task, and every variant with its
    model config, parameters and MAdds; :meth:`runs` is the training order."""

    settings: Settings
    spec: TaskSpec
    task: TaskInfo
    variants: list[PlannedVariant]

    def variant(self, name: str) -> PlannedVariant:
        return next(v for v in self.variants if v.variant.name == name)

    def runs(self) -> list[tuple[PlannedVariant, int]]:
        """(variant, seed) in training order: seed-major, so an interrupted comparison has every variant's first
        seeds before any variant's later ones."""
        return [(variant, seed) for seed in self.settings.seeds for variant in self.variants]


def get_spec(name: str) -> TaskSpec:
    specs = task_specs()
    if name not in specs:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(specs)}")
    return specs[name]


def _train_config(spec: TaskSpec, train_sets: dict[str, Any], max_minutes: Optional[float]) -> TrainConfig:
    """The runs' training settings, checked as ``experiment.train`` checks them: with the budget in place (a
    setting such as ``train.anneal_to_budget`` is only valid beside one)."""
    train_cfg = dataclass_from_dict(TrainConfig, {**spec.train_defaults, **train_sets}, "train.")
    if max_minutes is not None:
        train_cfg.max_minutes = max_minutes
    train_cfg.validate()
    return train_cfg


def build_task(spec: TaskSpec, sets: dict[str, Any], max_minutes: Optional[float] = None) -> tuple[Any, TrainConfig]:
    """The task as ``experiment.train`` builds it for a fresh run (fresh assets), with the global ``--set`` and the
    comparison's time budget (``max_minutes``, None for the task's epoch limits)."""
    _, train_sets, data_sets = split_overrides(with_defaults(spec, sets))
    train_cfg = _train_config(spec, train_sets, max_minutes)
    data_cfg = dataclass_from_dict(spec.data_class, data_sets, "data.")
    return spec.make_task(data_cfg, train_cfg, None), train_cfg


def typical_lengths(task: Any, model: Any) -> tuple[list[int], str]:
    """The lengths the MAdds column is counted at, by what the task holds (first match):

    * the task's own ``madds_lengths()`` when it has one (VQA: a mean question and one image);
    * a graph (``task.graph``): the whole graph, ``(nodes, edges)``, GAT's ``madds`` arguments;
    * an image model (``model.config.tokens``): the tokens the encoder reads per image;
    * parallel text (``task.train_src``/``train_tgt``): the mean training source length and target length + 1
      (the target is read with BOS), rounded;
    * labelled text (``task.train_set.inputs``): the mean training input length (with [CLS]/[SEP]), rounded;
    * a language model (``task.data.block_size``): one training block;
    * otherwise 64 tokens.
    """
    own = getattr(task, "madds_lengths", None)
    if own is not None:
        return own()
    graph = getattr(task, "graph", None)
    if graph is not None:
        return [graph.num_nodes, graph.num_edges], f"whole graph ({graph.num_nodes} nodes, {graph.num_edges} edges)"
    tokens = getattr(getattr(model, "config", None), "tokens", None)
    if isinstance(tokens, int):
        return [tokens], f"{tokens} tokens per image"
    if getattr(task, "train_src", None) and getattr(task, "train_tgt", None):
        src = round(mean(len(s) for s in task.train_src))
        tgt = round(mean(len(t) + 1 for t in task.train_tgt))
        return [src, tgt], f"mean training lengths {src} (source) / {tgt} (target)"
    inputs = getattr(getattr(task, "train_set", None), "inputs", None)
    if inputs:
        length = round(mean(len(item.ids) for item in inputs))
        return [length], f"mean training length {length}"
    block = getattr(getattr(task, "data", None), "block_size", None)
    if isinstance(block, int):
        return [block], f"one block of {block} tokens"
    return [64], "64 tokens (the task gives no lengths)"


def units_of(model_cfg: dict[str, Any]) -> str:
    if model_cfg.get("arch") == "encoder_decoder":
        return "target tokens"
    if model_cfg.get("arch") == "causal_lm":
        return "tokens"
    if model_cfg.get("model_type") == "gat":
        return "labelled nodes"
    return "examples"


def resolve_variant(spec: TaskSpec, task: Any, variant: Variant, global_sets: dict[str, Any],
                    max_minutes: Optional[float] = None) -> PlannedVariant:
    """Resolve one variant as a child run will (``spec.resolve_model``, the budget ``max_minutes``), build it and
    count it."""
    model_sets, global_train, _ = split_overrides(with_defaults(spec, global_sets))
    try:
        ctx = None
        if variant.named:
            base = spec.resolve_model(variant.preset, model_sets, task)
            ctx = VariantContext(spec.name, variant.preset, base.to_dict(), config_family(base).method_slots,
                                 task_settings(spec.name))
        own = variant_overrides(variant, ctx)
        sets = {**global_sets, **own}
        own_model, own_train, _ = split_overrides(own)
        if own_train:
            _train_config(spec, {**global_train, **own_train}, max_minutes)
        config = spec.resolve_model(variant.preset, {**model_sets, **own_model}, task)
        model = spec.model_from_dict(config.to_dict())
    except (ConfigError, ValueError, TypeError) as err:
        raise VariantError(f"variant {variant.name!r} ({variant.spec}) cannot apply to task {spec.name!r}: "
                           f"{err}") from None
    lengths, label = typical_lengths(task, model)
    return PlannedVariant(variant, own, sets, config.to_dict(), count_parameters(model), count_madds(model, *lengths),
                          lengths, label)


def set_steps(planned: list[PlannedVariant], unit: Unit, amount: float, task: str) -> None:
    """Give every variant the whole steps ``amount`` FLOPs (or tokens) buy at its own cost per step
    (:func:`~interlayer.compare.budget.whole_steps`) as its ``train.max_steps``; a variant with its own step limit
    is refused."""
    for v in planned:
        if "train.max_steps" in v.own:
            raise VariantError(f"variant {v.variant.name!r} sets train.max_steps, which --budget-{unit} decides "
                               "for every variant")
        v.sets["train.max_steps"] = whole_steps(unit, amount, v.step, v.variant.name, task)


def apply_budget(settings: Settings, spec: TaskSpec, task: Any, planned: list[PlannedVariant], processes: int
                 ) -> None:
    """Record each variant's cost of a step (:mod:`.budget`; ``processes`` ranks per run) and, under a compute
    budget, its steps."""
    for v in planned:
        v.step = step_shape(task, run_train_config(spec, v.sets), v.madds, v.lengths, processes)
    if settings.budget_flops is not None:
        set_steps(planned, "flops", settings.budget_flops, spec.name)
    elif settings.budget_tokens is not None:
        set_steps(planned, "tokens", settings.budget_tokens, spec.name)


def build_plan(settings: Settings, processes: int = 1) -> Plan:
    """Check every variant against the task and count it; nothing is trained or written. ``processes``: the
    data-parallel ranks of each run, for the steps of a compute budget (:mod:`.budget`)."""
    spec = get_spec(settings.task)
    variants = settings.parsed_variants()
    task, _ = build_task(spec, settings.sets, settings.budget_minutes)
    planned = [resolve_variant(spec, task, variant, settings.sets, settings.budget_minutes) for variant in variants]
    apply_budget(settings, spec, task, planned, processes)
    info = TaskInfo(metric=task.metric, higher_is_better=task.higher_is_better, units=units_of(planned[0].model),
                    extra_metrics=tuple(getattr(task, "extra_metrics", ())),
                    decimals=getattr(task, "metric_decimals", None))
    return Plan(settings, spec, info, planned)


# -- compare.json -------------------------------------------------------------------------------------------
def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    return {prefix: value}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: was X, now Y`` for every leaf that differs (dotted keys)."""
    a, b = _flatten(old), _flatten(new)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            lines.append(f"{key}: was {json.dumps(a.get(key, '<absent>'))}, now {json.dumps(b.get(key, '<absent>'))}")
    return lines


def _identity(plan: Plan) -> dict[str, Any]:
    """What must match for a directory to be continued: the settings and every variant's resolved model."""
    return {"settings": asdict(plan.settings),
            "models": {v.variant.name: {"model": v.model, "sets": v.sets} for v in plan.variants}}


def _parsed(sets: dict[str, Any]) -> dict[str, Any]:
    """Global ``--set`` values as the runs read them: ``train.compile="true"`` (``--set``, or ``--compile`` as
    recorded before it was a boolean) and ``True`` (``--compile``) are one setting."""
    return {key: parse_value(value, f"--set {key}") if isinstance(value, str) else value for key, value in sets.items()}


def growth_problems(stored: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """Why ``identity`` cannot continue the directory of ``stored`` (empty if it can).

    A comparison may *grow*: more seeds, or more variants, because the finished runs stay valid (a researcher who
    ran 3 seeds and wants 5 should not have to train the first 3 again). Everything else must be equal: the other
    settings and the resolved model of every variant already there. Losing seeds or variants is refused, since
    the report would silently drop finished runs.
    """
    old, new = dict(stored["settings"], sets=_parsed(stored["settings"]["sets"])), identity["settings"]
    new = dict(new, sets=_parsed(new["sets"]))
    fixed = [k for k in new if k not in ("seeds", "variants")]
    problems = differences({"settings": {k: old.get(k) for k in fixed}}, {"settings": {k: new[k] for k in fixed}})
    lost_seeds = [seed for seed in old["seeds"] if seed not in new["seeds"]]
    if lost_seeds:
        problems.append(f"settings.seeds: was {old['seeds']}, now {new['seeds']} (seeds {lost_seeds} would be "
                        "dropped; a comparison may gain seeds but not lose them)")
    lost = [entry for entry in old["variants"] if entry not in new["variants"]]
    if lost:
        problems.append(f"settings.variants: was {json.dumps(old['variants'])}, now {json.dumps(new['variants'])} "
                        f"({', '.join(lost)} would be dropped; a comparison may gain variants but not lose them)")
    kept = {name: dict(model, sets=_parsed(model["sets"])) for name, model in stored["models"].items()
            if name in identity["models"]}
    now = {name: dict(identity["models"][name], sets=_parsed(identity["models"][name]["sets"])) for name in kept}
    problems += differences({"models": kept}, {"models": now})
    return problems


def prepare_directory(plan: Plan, output: Path, command: list[str],
                      before_writing: Callable[[], None] = lambda: None) -> bool:
    """Create ``output/compare.json``, or check that the existing one can be continued (the same settings, or a
    grown version of them: :func:`growth_problems`; otherwise :class:`ConfigError` lists the differences; a damaged
    one is refused naming what is wrong, :func:`~interlayer.compare.readback.read_comparison`) and record this
    invocation. ``before_writing`` runs once those checks passed, before anything is written (the caller's own
    checks: every other file the comparison reads back). True if it existed."""
    path = output / COMPARE_FILE
    now = datetime.datetime.now().isoformat(timespec="seconds")
    invocation: dict[str, Any] = {"command": command, "cwd": str(Path.cwd()), "started": now}
    identity = _identity(plan)
    if os.path.lexists(path):
        stored = read_comparison(path)
        problems = growth_problems(stored, identity)
        if problems:
            raise ConfigError(f"{output} holds a comparison with different settings; use another --output, or "
                              "repeat the original command (" + " ".join(stored["invocations"][0]["command"])
                              + "). Differences:\n  " + "\n  ".join(problems))
        before_writing()
        grown = differences({k: stored[k] for k in identity}, identity)
        if grown:
            invocation["grew"] = grown
            stored.update(identity, variants=[v.to_dict() for v in plan.variants])
        stored["invocations"].append(invocation)
        write_json(path, stored)
        return True
    before_writing()
    output.mkdir(parents=True, exist_ok=True)
    write_json(path, {"format": FORMAT, **identity, "task": asdict(plan.task),
                       "variants": [v.to_dict() for v in plan.variants],
                       "environment": {"interlayer": __version__, "torch": torch.__version__,
                                       "python": platform.python_version(), "machine": platform.machine()},
                       "invocations": [invocation]})
    return False
