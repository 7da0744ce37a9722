"""One registry for every named model (models/registry.py), and the layout it stands on: methods that depend only
on the core, no import circle, the method names written once."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Optional

import pytest
import torch

import interlayer
from interlayer import cli, create_model, get_config, list_models
from interlayer.config import ModelConfig
from interlayer.core.config import ConfigError, TransformerConfig
from interlayer.methods import METHODS
from interlayer.models import registry
from interlayer.models.aa_resnet import AAResNetConfig
from interlayer.models.cnn_text import CNNTextConfig
from interlayer.models.gat import GATConfig
from interlayer.models.mcan import MCANConfig
from interlayer.models.regions import RegionConfig
from interlayer.models.swin import SwinConfig
from interlayer.models.vision import VisionConfig

SRC = Path(interlayer.__file__).parent
NAMES = list_models()
CONFIG_CLASS = {"transformer": ModelConfig, "text_cnn": CNNTextConfig, "image": VisionConfig, "gat": GATConfig,
                "mcan": MCANConfig, "region": RegionConfig, "swin": SwinConfig, "aa_resnet": AAResNetConfig}


@pytest.mark.parametrize("name", NAMES)
def test_every_listed_name_builds_and_prints_its_config(name: str, capsys: pytest.CaptureFixture) -> None:
    """The README's promise: ``create_model`` and ``interlayer config`` take every name ``interlayer models``
    lists, whatever its family (built on the meta device: nothing is allocated)."""
    family = registry.presets()[name].family
    with torch.device("meta"):
        model = create_model(name)
    assert isinstance(model.config, CONFIG_CLASS[family])
    assert cli.main(["config", name]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == model.config.to_dict()
    assert get_config(printed) == model.config  # the printed config reads back as the same family


def test_every_family_is_listed_and_filtered() -> None:
    assert {registry.presets()[name].family for name in NAMES} == set(CONFIG_CLASS)
    assert {"transformer_small", "cnn_text", "vit_fashion_mnist", "gat_cora"} <= set(NAMES)
    assert list_models(family="gat") == ["gat_citeseer", "gat_citeseer_crossformer_ffn",
                                         "gat_citeseer_crossformer_kq", "gat_cora", "gat_cora_crossformer_ffn",
                                         "gat_cora_crossformer_kq"]
    assert list_models("*_crossformer_kq") == ["gat_citeseer_crossformer_kq", "gat_cora_crossformer_kq"]
    assert list_models("mpt_*", family="transformer") == sorted(n for n in NAMES if n.startswith("mpt_"))
    with pytest.raises(ConfigError, match="unknown model family 'graph'; known: transformer, text_cnn, image, gat"):
        list_models(family="graph")


@pytest.mark.parametrize("name, overrides, check", [
    ("transformer_small", {"d_model": "128", "crossformer.hard": "kq"},
     lambda c: c.d_model == 128 and c.crossformer.hard == ["kq"]),
    ("vit_fashion_mnist", {"patch_size": "7", "predictive.alpha": "0.2"},
     lambda c: c.patch_size == 7 and c.encoder.predictive.alpha == 0.2 and c.encoder.grid_height == 4),
    ("gat_cora", {"dropout": "0.5", "crossformer": "ffn"}, lambda c: c.dropout == 0.5 and c.crossformer == "ffn"),
    ("cnn_text", {"pooling": "max", "enc_layers": "2"}, lambda c: c.pooling == "max" and c.enc_layers == 2),
    ("swin_fashion_mnist", {"lightweight.groups": "2", "window": "8"},
     lambda c: c.lightweight.groups == 2 and c.window == 8),
    ("aa_resnet_fashion_mnist", {"predictive.alpha": "0.5", "heads": "2"},
     lambda c: c.predictive.alpha == 0.5 and c.heads == 2),
])
def test_overrides_reach_each_family_as_set_strings(name: str, overrides: dict, check) -> None:
    """``--set`` values arrive as text; each family parses them and routes dotted keys into its sections."""
    cfg = get_config(name, **overrides)
    assert check(cfg)
    assert cli.main(["config", name, *[f"--set={k}={v}" for k, v in overrides.items()]]) == 0


def test_a_saved_config_file_is_read_as_its_family(tmp_path: Path) -> None:
    for name in ("gat_cora_crossformer_kq", "pa_vit_fashion_mnist", "cnn_text", "mpt_soft_small", "lw_swin_t",
                 "pa_aa_resnet_fashion_mnist"):
        cfg = get_config(name)
        cfg.save(tmp_path / f"{name}.yaml")
        assert get_config(tmp_path / f"{name}.yaml") == cfg


def test_a_family_refuses_another_familys_preset_and_suggests_names() -> None:
    with pytest.raises(ConfigError, match=r"'transformer_small' is a transformer model, not a gat model; gat "
                                          r"presets: gat_citeseer, "):
        get_config("transformer_small", family="gat")
    with pytest.raises(ConfigError, match=r"unknown preset 'gat_cor'; did you mean \['gat_cora'"):
        get_config("gat_cor")
    with pytest.raises(ConfigError, match=r"unknown key 'dropuot' \(did you mean 'dropout'\?\)"):
        get_config("gat_cora", dropuot=0.1)
    with pytest.raises(ConfigError, match=r"pooling='avg' is not valid"):
        get_config("cnn_text", pooling="avg")


def test_the_models_table_has_one_parameter_column() -> None:
    table = registry.model_catalog(64, ["transformer_small", "gat_cora"])
    header = next(line for line in table.splitlines() if line.startswith("| preset"))
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["preset", "parameters", "MAdds @ 64 tokens"]
    rows = {cells[0]: cells[1:] for line in table.splitlines() if line.startswith("| ")
            for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}
    assert rows["transformer_small"][0] == f"{interlayer.count_parameters(create_model('transformer_small')):,}"
    assert rows["gat_cora"] == ["92,373", "250.90M"]  # PyG's GAT on Cora has 92,373 too


def test_a_preset_name_is_one_model() -> None:
    with pytest.raises(RuntimeError, match="preset 'gat_cora' is defined twice"):
        registry.register_presets("transformer", {"gat_cora": ("again", {})})


# -- the layout --------------------------------------------------------------------------------------------------
METHOD_MODULES = sorted(f"interlayer.methods.{p.stem}" for p in (SRC / "methods").glob("*.py"))


@pytest.mark.parametrize("module", METHOD_MODULES)
def test_a_method_module_imports_only_the_core(module: str) -> None:
    """In a fresh interpreter, a method module loads the core, the kernels and the methods only, with the config
    plumbing below them (``config_io`` and the file readers it uses): not the composed config, the builder, the
    registry (old or new), the papers or the models (the package's ``__init__`` brings the errors and
    ``plugins.after_import``, with which it asks to register with transformers once that is imported)."""
    code = (f"import sys, {module}\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('interlayer')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(SRC.parent)}).stdout.split()
    assert module in loaded
    outside = [m for m in loaded if m not in ("interlayer", "interlayer.errors", "interlayer.plugins",
                                              "interlayer.config_io", "interlayer.fileio")
               and not m.startswith(("interlayer.core", "interlayer.kernels", "interlayer.methods"))]
    assert outside == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The interlayer modules ``path`` imports, wherever the import stands (module level, inside a function or a
    class, in an ``if TYPE_CHECKING:`` block: a type-only import names a dependency too, and a circle of them is
    still a circle for whoever reads the modules). ``from pkg import name`` counts ``pkg.name`` when that is a
    module."""
    return _imports_in(path.read_text(), path, modules)


def _imports_in(source: str, path: Path, modules: set[str]) -> set[str]:
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

    visit(ast.parse(source))
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(2, m.count(".") + 1)}
    return {m for m in found | parents if m in modules and m != me and not me.startswith(m + ".")}


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    return {m: _imports(p, set(paths)) for m, p in paths.items()}


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
    ("cli_args",),
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


def test_no_source_file_is_over_700_lines() -> None:
    """A file that outgrows 700 lines does several jobs: split it by job (as compare/report.py and the engine were)."""
    assert {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700} == {}


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
    assert [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if _only_reexports(ast.parse(p.read_text()))] == []
    assert _only_reexports(ast.parse('"""Doc."""\nfrom .engine import Trainer\n__all__ = ["Trainer"]\n'))
    assert not _only_reexports(ast.parse('"""Doc."""\nfrom __future__ import annotations\n'))


# Names several modules define on purpose: the same hook of each task or paper module (report, score, predict,
# paper_tables), each kernel's parts (forward, backward, backward_op, reference, covers), and one verb on two unrelated
# things (beam search of the translation decoder and of the causal LM; the reports of compare and search; decoding a
# translation and a search pattern; generating text and Sort-of-CLEVR images; a file's raw bytes; a metrics table).
SHARED_NAMES = {"report", "score", "predict", "paper_tables", "forward", "backward", "backward_op", "reference",
                "covers", "beam_search", "write_report", "decode", "generate", "read_raw", "format_report"}


def test_a_public_name_is_defined_once() -> None:
    """One name per idea: no two modules define the same public class or function (two ``Family`` classes, two
    ``load_tokenizer``, ``read_checkpoint``, ``read_text``, ``environment``, ``Decoder`` once were), and no two
    modules share a file name that is not a layer's convention (two ``bpe.py`` once were)."""
    defined: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
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
    written = {str(p.relative_to(SRC)): _method_name_lists(ast.parse(p.read_text()), names)
               for p in SRC.rglob("*.py")}
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


def test_model_config_has_one_section_per_method() -> None:
    """The sections' typed fields are ModelConfig's schema; they must match METHODS, name and class."""
    hints = typing.get_type_hints(ModelConfig)
    core = {f for f in typing.get_type_hints(TransformerConfig)}
    sections = {name: hint for name, hint in hints.items() if name not in core}
    assert sections == {method.name: Optional[method.config_class] for method in METHODS}


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


def test_load_pretrained_finds_a_family_nothing_has_imported_yet(tmp_path: Path) -> None:
    """``interlayer`` imports its parts lazily, so ``load_pretrained`` asks the registry for the model types."""
    create_model("gat_cora", hidden=2, heads=2).save_pretrained(tmp_path / "gat")
    code = ("import sys, interlayer\n"
            f"model = interlayer.load_pretrained({str(tmp_path / 'gat')!r})\n"
            "print(type(model).__name__, 'interlayer.models.gat' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC.parent)}).stdout.split()
    assert out == ["GAT", "True"]


def test_the_core_saves_and_loads_through_what_the_package_registers(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``core/hub.py`` imports nothing above the core: ``save_pretrained`` / ``from_pretrained`` call the saver and
    loader that ``interlayer/__init__`` registers, and say so when none is."""
    from interlayer.core import hub
    from interlayer.core.models import EncoderClassifier

    model = create_model("gat_cora", hidden=2, heads=2)
    model.save_pretrained(tmp_path / "gat")
    assert type(type(model).from_pretrained(tmp_path / "gat")).__name__ == "GAT"
    with pytest.raises(interlayer.CheckpointError, match="holds a GAT, not a EncoderClassifier"):
        EncoderClassifier.from_pretrained(tmp_path / "gat")
    monkeypatch.setattr(hub, "_STORAGE", {})
    with pytest.raises(RuntimeError, match="no model saver is registered"):
        model.save_pretrained(tmp_path / "again")
    with pytest.raises(RuntimeError, match="no model loader is registered"):
        type(model).from_pretrained(tmp_path / "gat")
