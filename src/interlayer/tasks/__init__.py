"""Tasks: every module here may define :class:`~interlayer.tasks.base.TaskSpec` subclasses; each one with a
``name`` is a task (``interlayer train NAME``). ``tasks/base.py`` says how to write one."""
from __future__ import annotations

import inspect

from ..plugins import import_modules
from .base import SampleInput, TaskCommand, TaskSpec


def task_specs() -> dict[str, TaskSpec]:
    """Every task, by name: the named, concrete :class:`TaskSpec` subclasses defined in this package's modules."""
    specs: dict[str, TaskSpec] = {}
    for module in import_modules(__name__):
        for cls in vars(module).values():
            if not (isinstance(cls, type) and issubclass(cls, TaskSpec) and cls.__module__ == module.__name__
                    and cls.name and not inspect.isabstract(cls)):
                continue
            if cls.name in specs:
                raise RuntimeError(f"two tasks are named {cls.name!r}: {type(specs[cls.name]).__qualname__} and "
                                   f"{cls.__qualname__} ({module.__name__})")
            specs[cls.name] = cls()
    return dict(sorted(specs.items()))


def task_commands() -> dict[str, TaskCommand]:
    """Every task's own commands (:meth:`TaskSpec.commands`), by name; a name two tasks give is an error."""
    commands: dict[str, TaskCommand] = {}
    for spec in task_specs().values():
        for name, command in spec.commands().items():
            if name in commands:
                raise RuntimeError(f"two tasks define the command {name!r}")
            commands[name] = command
    return commands


__all__ = ["SampleInput", "TaskCommand", "TaskSpec", "task_commands", "task_specs"]
