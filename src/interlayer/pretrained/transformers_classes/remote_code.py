"""``interlayer export --with-code``: a model folder that loads with ``trust_remote_code=True`` where interlayer is
not installed.

What "self-contained" takes. ``transformers`` loads remote code by copying Python files from the model folder
into its module cache as one flat package (``transformers_modules.<folder>``): the module ``config.json``'s
``auto_map`` names, and, recursively, every file it imports relatively (it looks for ``from .name import``
lines); any other import must be an installed package. The modeling classes
(:mod:`.modeling`) need interlayer's model-building code: the config and its method sections,
``build``, the core and the methods (about 6,000 lines). So that code is copied too, each module to one flat file
(``interlayer/core/attention.py`` -> ``il_core_attention.py``), with its relative imports rewritten to the flat names
(``transformers``' walk follows ``from .name import`` lines only, so a module bound by name, ``from . import name``,
gets such a line beside it: tested with ``transformers``' own walk); ``modeling_interlayer.py`` and
``configuration_interlayer.py`` are ``hf_modeling`` and ``hf_config``. Only what they import is copied (the closure of
their imports, imports inside functions and ``TYPE_CHECKING`` blocks included): no registry, task, CLI or package
``__init__`` (whose import-time work is the installed package's). The third-party imports left are ``torch``, ``numpy``,
``yaml`` and ``safetensors``, which ``transformers`` itself requires.

Scope: the Transformer family (language models and text classifiers); the image models are built through
interlayer's registry, so their folders need interlayer installed (refused here, with that reason). The copy is
the installed interlayer's code at export time, with its version in ``modeling_interlayer.py``'s header; a user
with interlayer installed gets interlayer's registered classes instead (``transformers`` prefers a registered
class over a folder's code), so loading never runs the folder's code then.
"""
from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path
from typing import Optional

from ...errors import ConfigError
from ...fileio import write_atomic

PACKAGE = "interlayer"
ROOT = Path(__file__).resolve().parents[2]  # the installed package's folder
# the modules transformers loads by name (auto_map), and their files in the folder
ENTRY = {"interlayer.pretrained.transformers_classes.modeling": "modeling_interlayer",
         "interlayer.pretrained.transformers_classes.configuration": "configuration_interlayer"}
AUTO_CLASSES = {"causal_lm": ("AutoModelForCausalLM", "InterlayerForCausalLM"),
                "encoder_classifier": ("AutoModelForSequenceClassification", "InterlayerForSequenceClassification")}


def _file(module: str) -> Path:
    parts = module.split(".")[1:]
    folder = ROOT.joinpath(*parts)
    return folder / "__init__.py" if (folder / "__init__.py").is_file() else folder.with_suffix(".py")


def _is_package(module: str) -> bool:
    return _file(module).name == "__init__.py"


def _target(module: str, node: ast.ImportFrom) -> Optional[str]:
    """The absolute module an ``ImportFrom`` in ``module`` names, when it is interlayer's (else None)."""
    if node.level == 0:
        return node.module if node.module and node.module.split(".")[0] == PACKAGE else None
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(name: str) -> bool:
    return _file(name).is_file()


def closure(entries: tuple[str, ...]) -> list[str]:
    """Every interlayer module the ``entries`` import, directly or not (imports inside functions and
    ``TYPE_CHECKING`` blocks counted), without the packages above them."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(_file(module).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
                raise ConfigError(f"{_file(module)}: `import {node.names[0].name}` (an absolute import of "
                                  "interlayer) cannot be copied into a model folder; import it relatively")
            if not isinstance(node, ast.ImportFrom) or (target := _target(module, node)) is None:
                continue
            modules = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            if len(modules) < len(node.names) or not _is_package(target):  # a package only for names it defines
                todo.append(target)
            todo += modules
    return sorted(seen)


def flat_name(module: str) -> str:
    """The file name (without ``.py``) of ``module`` in the folder."""
    return ENTRY.get(module, "il_" + "_".join(module.split(".")[1:]))


def _rewrite(module: str, source: str) -> str:
    """``source`` with every interlayer import turned into a relative import of the flat files."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or (target := _target(module, node)) is None:
            continue
        indent = " " * node.col_offset
        statements, names = [], []
        for alias in node.names:
            bound = alias.asname or alias.name
            if _is_module(f"{target}.{alias.name}"):  # a module, bound by name; the first line names its file for
                flat = flat_name(f"{target}.{alias.name}")  # transformers' walk, which follows `from .name import`
                statements += [f"from .{flat} import __name__ as _{flat}", f"from . import {flat} as {bound}"]
            else:
                names.append(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}")
        if names:
            statements.insert(0, f"from .{flat_name(target)} import {', '.join(names)}")
        start = offsets[node.lineno - 1] + node.col_offset
        end = offsets[node.end_lineno - 1] + node.end_col_offset
        edits.append((start, end, f"\n{indent}".join(statements)))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "(not installed as a distribution)"


def write_remote_code(directory: Path, model_type: str, kind: str) -> dict[str, str]:
    """Copy the modeling code into ``directory`` (module docstring); returns the ``auto_map`` for ``config.json``.
    ``kind``: the model's ``arch`` (``causal_lm`` or ``encoder_classifier``)."""
    if model_type != "transformer" or kind not in AUTO_CLASSES:
        raise ConfigError(f"--with-code covers language models and text classifiers (the Transformer family); a "
                          f"{model_type!r} {kind!r} model is built by interlayer's registry, so its folder needs "
                          "interlayer installed (`pip install interlayer`, then `import interlayer` before "
                          "transformers loads it)")
    modules = closure(tuple(ENTRY))
    version = _version()
    for module in modules:
        text = _rewrite(module, _file(module).read_text(encoding="utf-8"))
        header = f"# Copied from {module} of interlayer {version} by `interlayer export --with-code`; do not edit.\n"
        write_atomic(directory / f"{flat_name(module)}.py", header + text)
    auto, model_class = AUTO_CLASSES[kind]
    return {"AutoConfig": "configuration_interlayer.InterlayerConfig",
            "AutoModel": "modeling_interlayer.InterlayerModel", auto: f"modeling_interlayer.{model_class}"}
