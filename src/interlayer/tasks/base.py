"""What a task module declares so that ``interlayer train <task>`` and the experiment runner can drive it.

A task module (any module of :mod:`interlayer.tasks` with a module-level ``SPEC``) supplies its data settings,
training defaults, how to build its task object, how to score the final model, and its command-line flags. The
default model hooks build interlayer Transformers from presets; a task with another kind of model (GAT, a CNN
baseline) supplies its own.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from torch import nn

from ..build import build_model
from ..config import config_from_dict
from ..models.registry import get_config
from ..training.config import TrainConfig


def resolve_transformer(preset: str, model_sets: dict[str, Any], task: Any) -> Any:
    """A preset (or config file) with the fields the data decides, then the user's overrides."""
    return get_config(get_config(preset, **task.model_fields()), **model_sets)


def transformer_from_dict(data: dict[str, Any]) -> nn.Module:
    return build_model(config_from_dict(data))


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A task without flags of its own."""


def _no_options(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
    return {}, {}


def _no_defaults(sets: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class TaskSpec:
    name: str
    description: str
    default_preset: str
    data_class: type  # dataclass of data settings, reachable as --set data.KEY=VALUE
    make_task: Callable[[Any, TrainConfig, Optional[Path]], Any]  # (data, train, run dir to reload assets from)
    finish: Callable[[Any, Path, Any, dict[str, Any]], dict[str, Any]]  # (task, run dir, state, options) -> results
    train_defaults: dict[str, Any] = field(default_factory=dict)
    add_arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    # (parsed args) -> (data settings as --set strings, options handed to ``finish``)
    options_from_args: Callable[[argparse.Namespace], tuple[dict[str, str], dict[str, Any]]] = _no_options
    # (saved model folder, parsed `interlayer evaluate` args) -> printed report; the folder's task.json names the task
    evaluate: Optional[Callable[[Path, argparse.Namespace], str]] = None
    # (task) -> (model args, model kwargs, token labels) of one validation example, for attention-map pictures
    sample_input: Optional[Callable[[Any], tuple[tuple, dict[str, Any], list[str]]]] = None
    resolve_model: Callable[[str, dict[str, Any], Any], Any] = resolve_transformer
    model_from_dict: Callable[[dict[str, Any]], nn.Module] = transformer_from_dict
    # (the user's --set) -> defaults, as --set keys, that depend on them (a fine-tuning recipe when a checkpoint is
    # given); they replace train_defaults and the data class's defaults, and the user's own keys replace them
    defaults_for: Callable[[dict[str, Any]], dict[str, Any]] = _no_defaults
    # (model, task): called once on a fresh run's model right after its seeded build (e.g. to load pretrained
    # weights over it); not on resume, where the weights come from the run's checkpoint
    initialise: Optional[Callable[[nn.Module, Any], None]] = None
