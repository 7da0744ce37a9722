"""What every kernel brings with it (docs/architecture.md, "Adding a kernel"): each ``kernels/NAME_triton.py`` has
its reference module ``kernels/NAME.py``, its test file ``tests/test_kernels_NAME.py`` and a case in
``benchmarks/bench_kernels.py`` (whose dry run checks that the case launches it), and the kernels' docstrings stay
short (a cost model or a table belongs in the docs)."""
from __future__ import annotations

import ast
from pathlib import Path

from helpers.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "src" / "interlayer" / "kernels"
MAX_DOCSTRING_LINES = 25


def triton_ops() -> list[str]:
    """The ops with Triton code: ``NAME`` of every ``kernels/NAME_triton.py``."""
    return sorted(path.stem.removesuffix("_triton") for path in KERNELS.glob("*_triton.py"))


def test_every_triton_module_has_its_reference_test_file_and_benchmark_case() -> None:
    ops = triton_ops()
    assert len(ops) >= 5  # the glob found the kernels
    missing = {op: [what for what, present in (
        (f"src/interlayer/kernels/{op}.py (the reference and the registered op)", (KERNELS / f"{op}.py").is_file()),
        (f"tests/test_kernels_{op}.py", (ROOT / "tests" / f"test_kernels_{op}.py").is_file()))
        if not present] for op in ops}
    assert {op: what for op, what in missing.items() if what} == {}, "a Triton module lacks these"
    bench = load_benchmark("bench_kernels")
    assert set(bench.MODULES) == set(bench.CASES), "every benchmark case names the kernel modules it launches"
    measured = {op for modules in bench.MODULES.values() for op in modules}
    assert [op for op in ops if op not in measured] == [], "no case of benchmarks/bench_kernels.py launches these"
    assert measured <= set(ops), "bench_kernels.MODULES names a module without Triton code"


def long_docstrings(source: str) -> dict[str, int]:
    """The module, class and function docstrings in ``source`` longer than :data:`MAX_DOCSTRING_LINES` source lines
    (the quotes' lines included), by name."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node) is not None:
            lines = node.body[0].end_lineno - node.body[0].lineno + 1
            if lines > MAX_DOCSTRING_LINES:
                found[getattr(node, "name", "the module")] = lines
    return found


def test_kernel_docstrings_are_at_most_25_lines() -> None:
    """A docstring says what a kernel computes and why; its cost tables and measurements live in the method's docs
    page or docs/benchmarks.md, where they are dated and found."""
    long = {path.name: found for path in sorted(KERNELS.glob("*.py"))
            if (found := long_docstrings(path.read_text(encoding="utf-8")))}
    assert long == {}
    assert long_docstrings('"""one\n' + "line\n" * MAX_DOCSTRING_LINES + '"""\n') == {"the module": 27}
