"""The layout's fitness tests (docs/architecture.md): method modules that depend only on the core, no import circle,
no layer reaching up, files under the size cap, no module that only re-exports, each public name and the method
names written once, one reader of bundled paths. They read the sources (or import them in a fresh interpreter),
so they fail the suite when a change breaks the architecture, whatever it does at run time."""
from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

import interlayer
from interlayer.methods import METHODS

SRC = Path(interlayer.__file__).parent
METHOD_MODULES = sorted(f"interlayer.methods.{p.stem}" for p in (SRC / "methods").glob("*.py") if p.stem != "__init__")


@pytest.mark.slow
def test_a_method_module_imports_only_the_core() -> None:
    """A method module loads the core, the kernels and the methods only, with the config plumbing below them
    (``config_io`` and the file readers it uses): not the composed config, the builder, the registry (old or new),
    the papers or the models (the package's ``__init__`` brings the errors and ``plugins.after_import``, with which
    it asks to register with transformers once that is imported).

    One fresh interpreter imports the method modules one after another and records the modules each import adds:
    what a module loads is what it adds and what those before it added (each checked here), so every module's
    own imports are checked as in an interpreter of its own (and ``methods/__init__`` imports them all anyway)."""
    code = ("import importlib, json, sys\n"
            "before, added = set(), {}\n"
            f"for module in {METHOD_MODULES!r}:\n"
            "    importlib.import_module(module)\n"
            "    now = {m for m in sys.modules if m.startswith('interlayer')}\n"
            "    added[module], before = sorted(now - before), now\n"
            "print(json.dumps(added))")
    added = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONPATH": str(SRC.parent)}).stdout)
    assert set(METHOD_MODULES) <= {m for modules in added.values() for m in modules}
    outside = {module: [m for m in modules if m not in ("interlayer", "interlayer.errors", "interlayer.plugins",
                                                         "interlayer.config_io", "interlayer.fileio")
                        and not m.startswith(("interlayer.core", "interlayer.kernels", "interlayer.methods"))]
               for module, modules in added.items()}
    assert {module: modules for module, modules in outside.items() if modules} == {}


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    """Every source file of the package, parsed once for the module (the checks below each walk them all)."""
    return {path: ast.parse(path.read_text()) for path in sorted(SRC.rglob("*.py"))}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_in(source: str | ast.AST, path: Path, modules: set[str]) -> set[str]:
    """The interlayer modules the file at ``path`` imports (its ``source``, or its parsed tree), wherever the import
    stands (module level, inside a function or a class, in an ``if TYPE_CHECKING:`` block: a type-only import names
    a dependency too, and a circle of them is still a circle for whoever reads the modules). ``from pkg import
    name`` counts ``pkg.name`` when that is a module."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source) if isinstance(source, str) else source)
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(2, m.count(".") + 1)}
    return {m for m in found | parents if m in modules and m != me and not me.startswith(m + ".")}


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    paths = {_module_name(p): p for p in _trees()}
    return {m: frozenset(_imports_in(_trees()[p], p, set(paths))) for m, p in paths.items()}


def _import_graph() -> dict[str, set[str]]:
    """The package's import graph, module -> the modules it imports (a copy: a test may add edges)."""
    return {m: set(targets) for m, targets in _graph().items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan) in an import graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return components


def test_no_import_circle() -> None:
    """Counting the imports inside functions and ``if TYPE_CHECKING:`` blocks too (where circles hide), the package
    has no import circle."""
    assert _cycles(_import_graph()) == []


def test_the_checks_see_an_import_inside_a_function() -> None:
    """What the core's hub once did: import the loader of saved models inside a method, closing a circle through
    the registry and the model families, and reaching up."""
    graph = _import_graph()
    inside = _imports_in("class A:\n    def f(self):\n        from ..pretrained.hub import load_model\n",
                         SRC / "core" / "hub.py", set(graph))
    assert inside == {"interlayer.pretrained", "interlayer.pretrained.hub"}
    graph["interlayer.core.hub"] |= inside
    assert _cycles(graph)
    assert _upward(graph) == [f"interlayer.core.hub -> {m}" for m in sorted(inside)]


def test_the_checks_see_a_type_only_import() -> None:
    """What every method once did: name the composed config for its type hints only, a circle with config.py."""
    graph = _import_graph()
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config import ModelConfig\n"
    typed = _imports_in(source, SRC / "methods" / "cla.py", set(graph))
    assert typed == {"interlayer.config"}
    graph["interlayer.methods.cla"] |= typed
    assert ["interlayer.config", "interlayer.methods", "interlayer.methods.cla"] in [
        [m for m in cycle if m in ("interlayer.config", "interlayer.methods", "interlayer.methods.cla")]
        for cycle in _cycles(graph)]


# The layers, bottom first: a module imports only modules of its own layer or of the layers before it; within a
# layer, the circle check keeps an order. The bottom holds what knows no model (errors, files, tables, data
# readers, the weights on disk); the package's ``__init__`` (""), which imports its public names lazily and gives
# the core its saver and loader, stands on top with the CLI.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "fileio", "config_io", "tables", "accounting", "devices", "checkpoint", "plugins", "data"),
    ("kernels",),
    ("core",),
    ("methods",),
    ("config", "build"),
    ("models",),
    ("papers",),
    ("pretrained", "training"),
    ("tasks",),
    ("experiment",),
    ("compare", "search"),
    ("cli", ""),
]


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    return next(rank for rank, names in enumerate(LAYERS) if part in names)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if _layer(t) > _layer(m))


def test_no_layer_reaches_up() -> None:
    """bottom <- kernels <- core <- methods <- config/build <- models <- papers <- pretrained, training <- tasks <-
    experiment <- compare, search <- cli, imports inside functions counted: the core knows nothing of the papers or of
    saving, a method nothing of the composed config, a model family nothing of the tasks (docs/architecture.md,
    "Layers and imports")."""
    assert _upward(_import_graph()) == []


def test_no_source_file_is_over_600_lines() -> None:
    """A file that outgrows 600 lines does several jobs: split it by job (as compare/report.py and the engine were)."""
    assert {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600} == {}


def _only_reexports(tree: ast.Module) -> bool:
    """A module whose body is imports (and ``__all__``) only, after its docstring: it defines nothing."""
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    imports = [node for node in body
               if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__"]
    rest = [node for node in body if not isinstance(node, (ast.Import, ast.ImportFrom))
            and not (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"])]
    return bool(imports) and not rest


def test_no_module_only_reexports() -> None:
    """Every name is imported from the module that defines it: no package ``__init__`` (nor any module) exists
    to forward another's names (a package's docstring may say where they live)."""
    assert [str(p.relative_to(SRC)) for p, tree in _trees().items() if _only_reexports(tree)] == []
    assert _only_reexports(ast.parse('"""Doc."""\nfrom .engine import Trainer\n__all__ = ["Trainer"]\n'))
    assert not _only_reexports(ast.parse('"""Doc."""\nfrom __future__ import annotations\n'))


# Names several modules define on purpose: the same hook of each task or paper module (report, score, predict,
# paper_tables), each kernel's parts (forward, backward, reference, covers), and one verb on two unrelated
# things (beam search of the translation decoder and of the causal LM; the reports of compare and search; decoding a
# translation and a search pattern; generating text and Sort-of-CLEVR images; a file's raw bytes; a metrics table).
SHARED_NAMES = {"report", "score", "predict", "paper_tables", "forward", "backward", "reference",
                "covers", "beam_search", "write_report", "decode", "generate", "read_raw", "format_report"}


def test_a_public_name_is_defined_once() -> None:
    """One name per idea: no two modules define the same public class or function (two ``Family`` classes, two
    ``load_tokenizer``, ``read_checkpoint``, ``read_text``, ``environment``, ``Decoder`` once were), and no two
    modules share a file name that is not a layer's convention (two ``bpe.py`` once were)."""
    defined: dict[str, list[str]] = {}
    for path, tree in _trees().items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert {name: paths for name, paths in defined.items() if len(paths) > 1 and name not in SHARED_NAMES} == {}
    names = [path.name for path in SRC.rglob("*.py") if path.parent.name not in ("papers", "kernels")]
    conventions = {"__init__.py", "base.py", "config.py", "hub.py", "report.py"}  # a package's base, settings, ...
    assert sorted({name for name in names if names.count(name) > 1} - conventions) == []


def _method_name_lists(tree: ast.AST, names: set[str]) -> list[str]:
    """Literal collections (tuple, list, set, dict keys) holding two or more method names, and imports of two or
    more method modules by name: a fact about several methods written outside them (which of them restructure a
    checkpoint, which have an exact start) belongs on each method."""
    hits = []
    for node in ast.walk(tree):
        items: Optional[list] = None
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        if items is not None:
            found = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
            if len(found) >= 2:
                hits.append(f"line {node.lineno}: {sorted(found)}")
        if isinstance(node, ast.ImportFrom):
            found = {alias.name for alias in node.names if alias.name in names}
            if len(found) >= 2:
                hits.append(f"line {node.lineno}: import {sorted(found)}")
    return hits


def test_the_method_names_are_written_once() -> None:
    """``methods/__init__.py`` lists the methods (METHODS); everything else derives from it."""
    names = {method.name for method in METHODS}
    written = {str(p.relative_to(SRC)): _method_name_lists(tree, names) for p, tree in _trees().items()}
    modules = sorted(names)
    assert {path: hits for path, hits in written.items() if hits} == {"methods/__init__.py": [
        f"line 9: import {modules}"]}


def test_the_check_finds_a_name_list_written_out_again() -> None:
    names = {method.name for method in METHODS}
    assert _method_name_lists(ast.parse('S = ("crossformer", "multipass", "predictive")'), names)
    assert _method_name_lists(ast.parse("from .methods import crossformer, lightweight"), names)
    # what pretrained/ once held: a pair of methods that restructure, a map of the two with an exact start
    assert _method_name_lists(ast.parse('[n for n in ("lightweight", "conv_branch") if n]'), names)
    assert _method_name_lists(ast.parse('E = {"predictive": "a", "value_residual": "b"}'), names)
    assert not _method_name_lists(ast.parse('S = ("crossformer", "crossformer.hard", "kq")'), names)


def test_one_resolver_reads_bundled_paths(tmp_path: Path) -> None:
    from interlayer.data.parallel import resolve_path
    from interlayer.data.text import DataError

    assert resolve_path("bundled:planetoid/cora.npz").is_file()
    assert resolve_path("bundled:shakespeare").is_dir()
    assert resolve_path(str(tmp_path / "x.txt")) == tmp_path / "x.txt"
    with pytest.raises(DataError, match="no bundled data set 'nope'"):
        resolve_path("bundled:nope/a.txt")
    elsewhere = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if 'startswith("bundled:")' in p.read_text() and p.name != "parallel.py"]
    assert elsewhere == []
