"""The test suite's own layout (issue 32): no test module imports another, so each file runs on its own and the
shared fixtures and helpers have one home, ``tests/conftest.py`` and ``tests/helpers``."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TEST_MODULES = {path.stem for path in TESTS.glob("test_*.py")}
# every Python file of the suite: the test modules, conftest.py and the helpers package
SUITE = sorted([*TESTS.glob("*.py"), *(TESTS / "helpers").rglob("*.py")])


def imported_test_modules(source: str) -> list[str]:
    """The imports in ``source`` (at any depth, inside functions too) that name a test module or conftest."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from tests import test_x` and `from tests.test_x import y` as well as `from test_x import y`
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative: `from .test_x import y`, `from . import test_x`
            names = [node.module or ""] + [alias.name for alias in node.names]
        else:
            continue
        hits = [name for name in names if any(part in TEST_MODULES or part == "conftest" for part in name.split("."))]
        if hits:
            found.append(f"line {node.lineno}: {hits[0]}")
    return found


def test_no_test_module_imports_another() -> None:
    """Shared fixtures belong in conftest.py, shared functions and constants in tests/helpers."""
    offenders = {str(path.relative_to(TESTS)): found for path in SUITE
                 if (found := imported_test_modules(path.read_text(encoding="utf-8")))}
    assert offenders == {}, ("these files import a test module; move what they share to conftest.py (fixtures) or "
                             "tests/helpers (functions, constants)")
    assert len(SUITE) > len(TEST_MODULES) > 40  # the glob found the suite


def test_the_check_sees_every_way_of_importing_a_test_module() -> None:
    for source in ["from test_compare import corpus\n", "import test_compare\n",
                   "def f():\n    from test_hf import CASES as ENCODER_CASES\n",
                   "from tests.test_finetune import fresh\n", "from tests import test_finetune\n",
                   "from .test_finetune import fresh\n", "from conftest import corpus\n"]:
        assert imported_test_modules(source), source


def test_the_check_lets_helpers_and_libraries_through() -> None:
    assert imported_test_modules("import helpers\nfrom helpers.compare import fake_runs\nimport pytest\n"
                                 "from interlayer.tasks import task_specs\n") == []
