"""The papers' configurations and tables, kept apart from the methods so that :mod:`interlayer.methods` depends
only on the core.

One module per paper (``crossformer``, ``multipass``, ``predictive``, ``lightweight``, and ``transformer`` for the
plain Transformers they start from) registers its presets with :mod:`interlayer.models.registry` when imported and
may define ``paper_tables()``: the paper's parameter (and MAdds) tables beside the counts of our builds, as
``(title, headers, rows)``. :func:`paper_tables` prints them all (``interlayer tables``). A module's
``TASK_SETTINGS`` (task name -> dotted model settings) are what the paper sets for a dataset we train as that task,
which the methods' named ``compare`` variants take there (:func:`task_settings`), so that no method names a task.
"""
from __future__ import annotations

from typing import Any

from ..plugins import import_modules
from ..tables import format_table


def paper_tables() -> str:
    """Every paper module's tables, formatted, in the modules' name order."""
    parts = []
    for module in import_modules(__name__):
        for title, headers, rows in getattr(module, "paper_tables", lambda: [])():
            parts.append(f"## {title}\n\n{format_table(headers, rows)}")
    return "\n\n".join(parts)


def task_settings(task: str) -> dict[str, Any]:
    """The dotted model settings the papers fix for ``task``: every paper module's ``TASK_SETTINGS[task]``."""
    settings: dict[str, Any] = {}
    for module in import_modules(__name__):
        settings.update(getattr(module, "TASK_SETTINGS", {}).get(task, {}))
    return settings
