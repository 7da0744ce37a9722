"""Tasks: every module here with a module-level ``SPEC`` (:class:`~interlayer.tasks.base.TaskSpec`) is a task."""
from __future__ import annotations

import importlib
import pkgutil

from .base import TaskSpec


def task_specs() -> dict[str, TaskSpec]:
    specs: dict[str, TaskSpec] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if isinstance(spec, TaskSpec):
            specs[spec.name] = spec
        for extra in getattr(module, "SPECS", ()):
            specs[extra.name] = extra
    return dict(sorted(specs.items()))


__all__ = ["TaskSpec", "task_specs"]
