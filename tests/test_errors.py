"""errors.py is the one home of the package's exception classes: no other module defines one, at module level or
inside a function or class."""
from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import interlayer
from interlayer import errors

SRC = Path(interlayer.__file__).parent
# The exception names a class statement may derive from: Python's and errors.py's.
EXCEPTION_NAMES = ({name for name, value in vars(builtins).items()
                    if isinstance(value, type) and issubclass(value, BaseException)}
                   | {name for name, value in vars(errors).items()
                      if isinstance(value, type) and issubclass(value, BaseException)})


def _modules() -> list[str]:
    # the Triton sources import triton at module level: they are read by the AST check below
    return [m.name for m in pkgutil.walk_packages(interlayer.__path__, "interlayer.") if not m.name.endswith("_triton")]


def _exception_classes_defined(tree: ast.AST) -> list[str]:
    """Class statements anywhere in ``tree`` whose bases name an exception (``Error``, ``errors.X``, ...)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases}
            if bases & EXCEPTION_NAMES:
                found.append(f"line {node.lineno}: {node.name}")
    return found


def test_every_exception_class_is_defined_in_errors_py() -> None:
    """At module level, what the modules hold (a class made any way); anywhere, what their class statements say."""
    defined_elsewhere = []
    for name in _modules():
        module = importlib.import_module(name)
        defined_elsewhere += [f"{name}.{cls.__name__}" for cls in vars(module).values()
                              if inspect.isclass(cls) and issubclass(cls, BaseException)
                              and cls.__module__.startswith("interlayer") and cls.__module__ != errors.__name__]
    statements = {str(path.relative_to(SRC)): _exception_classes_defined(ast.parse(path.read_text()))
                  for path in SRC.rglob("*.py") if path.name != "errors.py"}
    assert defined_elsewhere == []
    assert {path: found for path, found in statements.items() if found} == {}


@pytest.mark.parametrize("source", [
    "class Stopped(Exception):\n    pass\n",
    "def f():\n    class Local(ValueError):\n        pass\n",
    "from .. import errors\nclass Refined(errors.ConfigError):\n    pass\n",
])
def test_the_check_finds_an_exception_class_written_elsewhere(source: str) -> None:
    assert _exception_classes_defined(ast.parse(source))


def test_the_user_errors_are_value_errors_and_the_machine_errors_os_errors() -> None:
    """What callers catch: a user's bad input is a ValueError wherever it is met; a failed write an OSError."""
    for cls in (errors.ConfigError, errors.VariantError, errors.CheckpointError, errors.PretrainedError,
                errors.DataError, errors.TokenizerError, errors.UnsupportedGenerationOption):
        assert issubclass(cls, ValueError)
    assert issubclass(errors.DiskFullError, errors.WriteError) and issubclass(errors.WriteError, OSError)
    assert not issubclass(errors.TooManyTensors, Exception)  # no `except Exception` of a builder swallows it
