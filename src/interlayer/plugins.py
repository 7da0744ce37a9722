"""Finding the modules of a package: how a new model family, paper or task is one module with nothing to edit
elsewhere. The registry imports :mod:`interlayer.models` and :mod:`interlayer.papers` this way, ``interlayer
tables`` the papers and ``interlayer train`` the tasks. And :func:`after_import`: code to run when another
package's module is imported (how ``import interlayer`` registers with ``transformers`` without importing it)."""
from __future__ import annotations

import importlib
import importlib.abc
import pkgutil
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Callable, Optional


def import_modules(package: str) -> list[ModuleType]:
    """Every module of ``package`` (a dotted name), imported, in name order."""
    root = importlib.import_module(package)
    return [importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(root.__path__)]


# -- running code when another package's module has been imported (transformers' Auto classes) --------------------
class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder first on ``sys.meta_path`` that finds nothing itself: for a watched module it asks the other
    finders, and wraps the loader they return so that the callbacks run once the module has been executed."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[ModuleSpec]:
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbacksAfterExec(spec.loader, self.pending.pop(fullname))
        return spec


class _CallbacksAfterExec(importlib.abc.Loader):
    """A module's own loader, then the callbacks (a failing callback warns: the import itself goes on)."""

    def __init__(self, loader: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self.loader, self.callbacks = loader, callbacks

    def create_module(self, spec: ModuleSpec) -> Optional[ModuleType]:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its own loader
        self.loader.exec_module(module)
        for callback in self.callbacks:
            _run(callback, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


_WATCHER = _AfterImport()


def _run(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as err:  # noqa: BLE001 - another package's import must not fail because of interlayer
        warnings.warn(f"interlayer: after importing {module.__name__}: {type(err).__name__}: {err}", stacklevel=2)


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it already is, else right after its
    import, without importing it (the package need not even be installed). What ``import interlayer`` uses to
    register its classes with ``transformers`` only when ``transformers`` is used."""
    module = sys.modules.get(name)
    if module is not None:
        _run(callback, module)
        return
    _WATCHER.pending.setdefault(name, []).append(callback)
    if _WATCHER not in sys.meta_path:
        sys.meta_path.insert(0, _WATCHER)
