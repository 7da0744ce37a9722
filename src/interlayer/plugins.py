"""Finding the modules of a package: how a new model family, paper or task is one module with nothing to edit
elsewhere. The registry imports :mod:`interlayer.models` and :mod:`interlayer.papers` this way, ``interlayer
tables`` the papers and ``interlayer train`` the tasks."""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def import_modules(package: str) -> list[ModuleType]:
    """Every module of ``package`` (a dotted name), imported, in name order."""
    root = importlib.import_module(package)
    return [importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(root.__path__)]
