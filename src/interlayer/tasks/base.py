"""The task base class: what ``interlayer train <task>``, ``evaluate``, ``compare`` and ``search`` drive.

How to write a task
-------------------
Add a module to :mod:`interlayer.tasks` with a subclass of :class:`TaskSpec` that sets ``name``; the module is
found by :func:`interlayer.tasks.task_specs` (no registration). A subclass without a ``name`` (or with an abstract
method left) is a family base, never listed: the text tasks share ``TextClassificationSpec``, and ``SST5Spec`` etc.
only set their name, files and defaults. Fairseq's ``FairseqTask`` is the model: class attributes say what the task
is, methods are hooks with defaults that a task overrides where it differs::

    class MyTaskSpec(TaskSpec):
        name = "mytask"                      # interlayer train mytask
        description = "one line for --help"
        default_preset = "transformer_text_cls"
        data_class = MyData                  # a dataclass; --set data.KEY=VALUE reaches its fields
        train_defaults = dict(lr=1e-3)       # TrainConfig fields the task changes

        def make_task(self, data, train, run_dir):   # required: the engine's Task (training/engine.py)
            return MyTask(data, train)
        def finish(self, task, run_dir, state, options):   # required: the final scores for results.json
            return {"test_accuracy": ...}

Every other hook is optional: ``add_arguments``/``options_from_args`` (flags of ``interlayer train mytask``),
``evaluate`` (``interlayer evaluate``), ``commands`` (commands of the task's own: ``interlayer caption``),
``sample_input`` (attention-map pictures in ``compare``), ``resolve_model`` (a model other than the interlayer
Transformer; the registry rebuilds it from its saved config), ``defaults_for`` (defaults that depend on the user's
``--set``) and ``initialise`` (pretrained weights over a fresh model). Converting an old
record ``SPEC = TaskSpec(name=..., make_task=f, ...)``: each keyword becomes a class attribute or a method of the same
name taking ``self`` first.
"""
from __future__ import annotations

import abc
import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Sequence

from torch import nn

from ..config_io import dataclass_from_dict
from ..errors import ConfigError, DataError
from ..fileio import read_json
from ..models.registry import create_model, get_config
from ..training.config import TrainConfig

if TYPE_CHECKING:
    from ..training.engine import TrainState

# (model args, model kwargs, token labels) of one validation example, for attention-map pictures
SampleInput = tuple[tuple, dict[str, Any], list[str]]


@dataclass(frozen=True)
class TaskCommand:
    """A command of the command line: a task's own beside ``train NAME`` (``interlayer caption``, ``interlayer
    convert-refer``), which the command line registers from every task (:func:`interlayer.tasks.task_commands`), so
    adding one edits no CLI code; the CLI's own commands are of this shape too. ``run(args, argv)`` returns the exit
    code (None: 0)."""

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Sequence[str]], Optional[int]]


class TaskSpec(abc.ABC):
    """One task: its name and defaults (class attributes) and the hooks the runner calls (methods)."""

    name: ClassVar[str] = ""  # a subclass without a name is a family base, not a task
    description: ClassVar[str]
    default_preset: ClassVar[str]
    data_class: ClassVar[type]  # dataclass of data settings, reachable as --set data.KEY=VALUE
    train_defaults: ClassVar[dict[str, Any]] = {}  # TrainConfig fields, as --set train.KEY would give them

    @abc.abstractmethod
    def make_task(self, data: Any, train: TrainConfig, run_dir: Optional[Path]) -> Any:
        """The engine's task (:class:`~interlayer.training.engine.Task`) for ``data``; ``run_dir`` is the run being
        resumed or reloaded, whose saved assets (vocabulary, tokenizer) the task must reuse, or None."""

    @abc.abstractmethod
    def finish(self, task: Any, run_dir: Path, state: "TrainState", options: dict[str, Any]) -> dict[str, Any]:
        """The final scores of a finished run (they go to results.json); ``options`` come from
        :meth:`options_from_args`, plus ``progress`` (whether the run shows progress bars: long test scoring and
        decoding show theirs)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The task's own flags of ``interlayer train NAME``; none by default."""

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        """(data settings as ``--set`` strings, options handed to :meth:`finish`) from the parsed flags."""
        return {}, {}

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """``interlayer evaluate``: the printed report of the saved model folder ``directory`` (its task.json names
        this task)."""
        raise ConfigError(f"task {self.name!r} has no evaluate command")

    def commands(self) -> dict[str, TaskCommand]:
        """Commands of the task's own, by name (``interlayer NAME``); none by default."""
        return {}

    def sample_input(self, task: Any) -> Optional[SampleInput]:
        """One validation example as model inputs with its token labels (attention-map pictures), or None when the
        task has none to offer."""
        return None

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: Any) -> Any:
        """The model config: a preset (or config file) with the fields the data decides, then the user's
        ``--set`` overrides."""
        return get_config(get_config(preset, **task.model_fields()), **model_sets)

    def saved_data(self, directory: Path) -> Any:
        """The data settings a run saved beside its model (``data.json``, a :attr:`data_class`), checked as
        ``--set data.KEY`` values are: what ``evaluate`` reads to rebuild the data the model was trained on."""
        saved = read_json(Path(directory) / "data.json", DataError, within=directory)
        return dataclass_from_dict(self.data_class, saved, "data.")

    def model_from_dict(self, data: dict[str, Any]) -> nn.Module:
        """The model a saved config (``resolve_model(...).to_dict()``) describes, built by the family that claims
        it in the registry (a ``model_type`` key, an image ``backbone``; else the Transformer)."""
        return create_model(data)

    def defaults_for(self, sets: dict[str, Any]) -> dict[str, Any]:
        """Defaults, as ``--set`` keys, that depend on the user's ``sets`` (a fine-tuning recipe when a checkpoint is
        given); they replace ``train_defaults`` and the data class's defaults, and the user's own keys win."""
        return {}

    def initialise(self, model: nn.Module, task: Any) -> None:
        """Called once on a fresh run's model right after its seeded build (e.g. to load pretrained weights over
        it); not on resume, where the weights come from the run's checkpoint."""
