"""Reading the small text files interlayer trusts nothing about: config files, ``--set`` values, JSON beside a model.

Every YAML document (config files, ``--set`` values, variant definitions) is read by :class:`UniqueKeyLoader`, a
``yaml.SafeLoader`` that refuses a mapping with a repeated key: PyYAML keeps the last value of ``{lr: 1, lr: 2}``
silently, so a config edited in two places would train with whichever came last. JSON files are read the same way
(``json`` also keeps the last duplicate). Errors name the file, the line and column, and what is expected, and are
raised as the caller's error class (a config file: ``ConfigError``; a file of a saved model: ``CheckpointError``),
so the command line reports them as a bad input (exit code 2) instead of a traceback.

Writing: every file a run writes goes through :func:`atomic_path` (or :func:`write_atomic`): written under a
temporary name beside it and renamed, so a crash leaves the old file or the new one, never half of one, and a full
disk is reported as :class:`DiskFullError` naming the file and the free space, the old file intact.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Union

import yaml

from .errors import ConfigError

PathLike = Union[str, Path]


class DiskFullError(OSError):
    """A file could not be written for lack of space; the message names it and the free space (a bad situation of
    the user's machine, not a bug: exit code 2)."""


def _disk_full(err: BaseException) -> bool:
    # safetensors raises its own SafetensorError, whose message carries the OS error's text
    return (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or \
        "No space left on device" in str(err) or "Disk quota exceeded" in str(err)


def _free_space(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 2 ** 20:.1f} MiB free"
    except OSError:
        return "free space unknown"


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to; renamed onto ``path`` when the block ends without an error,
    removed when it fails. A full disk raises :class:`DiskFullError` naming ``path`` and the free space."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if _disk_full(err):
            raise DiskFullError(f"{path}: no space left on device while writing it "
                                f"({_free_space(path.parent)} in {path.parent}); the previous {path.name}, if any, "
                                "is intact: free some space and run the command again (a training run: with "
                                "--resume)") from err
        raise


def write_atomic(path: PathLike, data: Union[str, bytes]) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: PathLike, data: Any, *, indent: Union[int, None] = 2, ensure_ascii: bool = True) -> None:
    """``data`` as JSON to ``path`` through :func:`atomic_path`."""
    write_atomic(path, json.dumps(data, indent=indent, ensure_ascii=ensure_ascii) + "\n")


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


def read_json(path: PathLike, error: type[Exception] = ConfigError, *, expect: type = dict,
              optional: bool = False) -> Any:
    """The JSON document in file ``path``, which must be of type ``expect`` (a mapping by default); with
    ``optional``, an empty ``expect()`` when the file does not exist (a tokenizer folder's optional files)."""
    if optional and not Path(path).is_file():
        return expect()
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
