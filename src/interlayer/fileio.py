"""Reading the small text files interlayer trusts nothing about: config files, ``--set`` values, JSON beside a model.

Every YAML document (config files, ``--set`` values, variant definitions) is read by :class:`UniqueKeyLoader`, a
``yaml.SafeLoader`` that refuses a mapping with a repeated key: PyYAML keeps the last value of ``{lr: 1, lr: 2}``
silently, so a config edited in two places would train with whichever came last. JSON files are read the same way
(``json`` also keeps the last duplicate). Errors name the file, the line and column, and what is expected, and are
raised as the caller's error class (a config file: ``ConfigError``; a file of a saved model: ``CheckpointError``),
so the command line reports them as a bad input (exit code 2) instead of a traceback.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

import yaml

from .core.config import ConfigError

PathLike = Union[str, Path]


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (plain data only: no Python objects) that refuses duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {first.line + 1}, column {first.column + 1}); "
                    "give every key once", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: str, error: type[Exception] = ConfigError, *, inline: bool = False) -> Any:
    """The YAML document in ``text``; a syntax error or a duplicate key raises ``error`` naming ``source`` (and the
    line and column, unless ``inline``: a one-line value such as ``--set KEY=VALUE`` is named with the value)."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = (f"{source}={text!r}" if inline else
                 f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source)
        problem = getattr(err, "problem", None) or str(err)
        raise error(f"{where}: not valid YAML: {problem}") from None


def _refuse_duplicates(source: str, error: type[Exception]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{source}: duplicate key {key!r}; give every key once")
            out[key] = value
        return out

    return hook


def read_text(path: PathLike, error: type[Exception] = ConfigError) -> str:
    """A UTF-8 text file; a missing file or undecodable bytes raise ``error`` naming the file and byte offset."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise error(f"{path}:{line}: not valid UTF-8 (byte {err.start}: {data[err.start:err.start + 4]!r}); save the "
                    "file as UTF-8") from None


def parse_json(text: str, source: str, error: type[Exception] = ConfigError) -> Any:
    """The JSON document in ``text``; syntax errors (line, column) and duplicate keys raise ``error``."""
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates(source, error))
    except json.JSONDecodeError as err:
        raise error(f"{source}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from None


def read_json(path: PathLike, error: type[Exception] = ConfigError, *, expect: type = dict) -> Any:
    """The JSON document in file ``path``, which must be of type ``expect`` (a mapping by default)."""
    data = parse_json(read_text(path, error), str(path), error)
    if not isinstance(data, expect):
        raise error(f"{path}: expected a JSON {'object' if expect is dict else expect.__name__}, got "
                    f"{type(data).__name__}")
    return data


def read_yaml_or_json(path: PathLike, error: type[Exception] = ConfigError) -> Any:
    """A config file: YAML when the name ends in .yaml/.yml, JSON otherwise (YAML 1.1 would read ``1e-05`` in a JSON
    file as a string)."""
    path = Path(path)
    text = read_text(path, error)
    return load_yaml(text, str(path), error) if path.suffix in (".yaml", ".yml") else parse_json(text, str(path), error)
