"""Reading the small text files interlayer trusts nothing about: config files, ``--set`` values, JSON beside a model.

Every YAML document (config files, ``--set`` values, variant definitions) is read by :class:`UniqueKeyLoader`, a
``yaml.SafeLoader`` that refuses a mapping with a repeated key: PyYAML keeps the last value of ``{lr: 1, lr: 2}``
silently, so a config edited in two places would train with whichever came last. JSON files are read the same way
(``json`` also keeps the last duplicate). Errors name the file, the line and column, and what is expected, and are
raised as the caller's error class (a config file: ``ConfigError``; a file of a saved model: ``CheckpointError``),
so the command line reports them as a bad input (exit code 2) instead of a traceback.

What is read is bounded: a document nested deeper than :data:`MAX_DEPTH` levels, an integer of more than 4,300
digits, and in a config or a ``--set`` value an integer beyond the 64-bit range every setting uses, are refused
naming the source (Python's own limits would end in a ``RecursionError`` or ``ValueError: Exceeds the limit (4300
digits)``; JSON beside a model may hold larger integers: a tokenizer's ``model_max_length`` is often ``int(1e30)``),
and what an error message echoes of a value is cut to :data:`ECHO_CHARS` characters (:func:`shorten`), so a 120 KB
``--set`` value gives a one-line message.

Files of a folder from elsewhere (a model folder, a run directory, a Hugging Face checkpoint) are read through
:func:`confined` (``read_text`` / ``read_json`` with ``within=FOLDER``): a file that is a link leading out of the
folder, or that is not a regular file (a FIFO would hang the read, a device never end), is refused, so a folder
cannot make interlayer read ``/etc/passwd`` and copy it into a run or an export.

Writing: every file a run writes goes through :func:`atomic_path` (or :func:`write_atomic`): written under a
temporary name beside it and renamed, so a crash leaves the old file or the new one, never half of one, and a full
disk is reported as :class:`DiskFullError` naming the file and the free space, the old file intact; any other
failure to write (a read-only file system, a missing permission) as :class:`WriteError` naming the file. A whole
folder (an export) is written by :func:`atomic_directory`: into a temporary folder beside it, renamed into place
when complete. Every file written either way gets the mode a new file gets from ``open`` (``0o666`` less the
umask: ``0644`` usually), whoever wrote the temporary file: safetensors' writer makes its files ``0600``, which
left checkpoints and exported weights unreadable to the group where every other file of the folder was not.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import yaml

from .errors import ConfigError, DiskFullError, WriteError

PathLike = Union[str, Path]
# Configs nest a few levels (a method section, a list of sides); 100 leaves room for any real one and stays far
# below Python's recursion limit (1000), which every recursive walk of a config (copying, checking) would hit.
MAX_DEPTH = 100
# Every integer setting is a size, a count, an id or a seed, and none exceeds 64 bits (torch's int64, numpy's
# seeds): a larger one is a typo or an attack, and Python's int parser refuses 4,300 digits with a ValueError.
MAX_INT = 2 ** 63 - 1
ECHO_CHARS = 200  # what a message quotes of a value at most (:func:`shorten`)
# The error numbers of a file that cannot be written for a reason of the machine, not of interlayer: reported as a
# bad situation (exit code 2) naming the file, never as an internal error. The first are the machine's whatever
# the operation (the command line reports them wherever they come from); the others, met writing a file through
# atomic_path / atomic_directory (a path below a file, a name too long, ...).
MACHINE_ERRNOS = (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EIO)
WRITE_ERRNOS = (*MACHINE_ERRNOS, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ENOTEMPTY,
                errno.EXDEV)


# safetensors (Rust) raises its own SafetensorError for a failed write, with the OS error inside its message:
# "Error while serializing: IoError(Os { code: 30, kind: ReadOnlyFilesystem, message: \"Read-only file system\" })"
_RUST_OS_ERROR = re.compile(r"Os \{ code: (\d+)")


def os_error_number(err: BaseException) -> Optional[int]:
    """The ``errno`` of an ``OSError``, or the one a safetensors error carries in its message; None otherwise."""
    if isinstance(err, OSError):
        return err.errno
    found = _RUST_OS_ERROR.search(str(err))
    return int(found.group(1)) if found else None


def _disk_full(err: BaseException) -> bool:
    return os_error_number(err) in (errno.ENOSPC, errno.EDQUOT) or \
        "No space left on device" in str(err) or "Disk quota exceeded" in str(err)


def write_failure(path: Optional[PathLike], err: BaseException) -> Optional[WriteError]:
    """``err``, raised writing ``path``, as a :class:`WriteError` naming the path (a full disk as
    :class:`DiskFullError`, with the free space), or None when it is no failure of the machine (a bug).

    ``path=None``: ``err`` was raised somewhere (the command line's last resort), and only the machine's errors
    (:data:`MACHINE_ERRNOS`) count, named with the path ``err`` holds; a missing permission or an I/O error there
    may have been a read."""
    number = os_error_number(err)
    known = WRITE_ERRNOS if path is not None else MACHINE_ERRNOS
    verb = "write" if path is not None or number in (errno.EROFS, errno.ENOSPC, errno.EDQUOT) else "read or write"
    where = path if path is not None else getattr(err, "filename", None)
    path = Path(where or ".")
    if _disk_full(err):
        failure: WriteError = DiskFullError(
            f"{path}: no space left on device while writing it ({_free_space(path.parent)} in {path.parent}); the "
            f"previous {path.name}, if any, is intact: free some space and run the command again (a training run: "
            "with --resume)")
    elif number in known:
        failure = WriteError(f"cannot {verb} {where or 'a file'}: {os.strerror(number).lower()}; choose a place you "
                             "may write to (or fix its permissions, free its disk) and run the command again")
    else:
        return None
    failure.errno = number  # one argument, so that the message is the text (OSError(n, text) prints "[Errno n]")
    return failure


def _free_space(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 2 ** 20:.1f} MiB free"
    except OSError:
        return "free space unknown"


def umask() -> int:
    """This process's umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere set
    and restored at once (``os.umask`` has no read-only form)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def _usual_mode(path: Path) -> None:
    """Give the regular file ``path`` the mode ``open`` gives a new file (``0o666`` less the umask), whatever its
    writer chose (module docstring)."""
    if path.is_file() and not path.is_symlink():
        os.chmod(path, 0o666 & ~umask())


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to; renamed onto ``path`` when the block ends without an error,
    removed when it fails. A full disk raises :class:`DiskFullError` naming ``path`` and the free space. The file
    gets the usual mode of a new file (module docstring)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        _usual_mode(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        failure = None if isinstance(err, WriteError) else write_failure(path, err)
        if failure is not None:
            raise failure from err
        raise


@contextlib.contextmanager
def atomic_directory(path: PathLike, *, replace: bool = False) -> Iterator[Path]:
    """A new temporary folder beside ``path`` to write a whole folder into; renamed onto ``path`` when the block
    ends without an error, removed when it fails, so ``path`` never holds half a folder. ``path`` must not exist
    or be an empty folder, or, with ``replace``, may be any folder, whose contents are then replaced as a whole
    (the old folder is removed only after the new one is in place). A failure of the machine raises
    :class:`WriteError` naming ``path``. Every file in it gets the usual mode of a new file (module docstring)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        yield tmp
        for written in tmp.rglob("*"):
            _usual_mode(written)
        if path.is_dir() and (replace or not any(path.iterdir())):
            os.rename(path, old)
        os.rename(tmp, path)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.rename(old, path)  # put the old folder back
        failure = None if isinstance(err, WriteError) else write_failure(path, err)
        if failure is not None:
            raise failure from err
        raise
    shutil.rmtree(old, ignore_errors=True)


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


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` as a message may quote it: at most ``limit`` characters, the middle left out and counted."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 20)
    return f"{text[:keep // 2]}...({len(text) - keep:,} characters left out)...{text[len(text) - keep // 2:]}"


def _bounded(value: Any, source: str, error: type[Exception], max_int: Optional[int] = MAX_INT) -> Any:
    """``value`` (parsed YAML or JSON) if it nests at most :data:`MAX_DEPTH` levels and no integer's magnitude
    exceeds ``max_int`` (None: any); else ``error`` naming ``source``. Iterative, so that it never meets the
    recursion limit itself."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise error(f"{source}: nested more than {MAX_DEPTH} levels deep (lists or mappings inside each "
                            "other); a config nests a few levels: check the file")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
        elif (max_int is not None and isinstance(item, int) and not isinstance(item, bool)
              and not -max_int - 1 <= item <= max_int):
            raise error(f"{source}: the integer {_digits(item)} is outside the 64-bit range every setting uses "
                        f"(-2^63..2^63-1)")
    return value


def _digits(number: int) -> str:
    """A huge integer as a message may quote it (converting 4,300+ digits to text is refused by Python)."""
    length = number.bit_length() * 0.30103  # log10(2)
    return f"of about {length:,.0f} digits" if length > 40 else str(number)


def _too_large(err: ValueError) -> bool:
    return "Exceeds the limit" in str(err) and "integer string conversion" in str(err)


def load_yaml(text: str, source: str, error: type[Exception] = ConfigError, *, inline: bool = False) -> Any:
    """The YAML document in ``text``; a syntax error or a duplicate key raises ``error`` naming ``source`` (and the
    line and column, unless ``inline``: a one-line value such as ``--set KEY=VALUE`` is named with the value, cut
    to :data:`ECHO_CHARS`); so does a document nested too deeply or with an integer beyond 64 bits."""
    where = f"{source}={shorten(repr(text))}" if inline else source
    try:
        return _bounded(yaml.load(text, Loader=UniqueKeyLoader), where, error)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if not inline and mark is not None:
            where = f"{source}:{mark.line + 1}:{mark.column + 1}"
        problem = getattr(err, "problem", None) or str(err)
        raise error(f"{where}: not valid YAML: {shorten(problem)}") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep (lists or mappings inside each other); a "
                    "config nests a few levels: check it") from None
    except ValueError as err:
        if not _too_large(err):
            raise
        raise error(f"{where}: an integer of more than 4,300 digits; every setting fits 64 bits "
                    "(-2^63..2^63-1)") from None


def _refuse_duplicates(source: str, error: type[Exception]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{source}: duplicate key {key!r}; give every key once")
            out[key] = value
        return out

    return hook


def confined(path: PathLike, within: PathLike, error: type[Exception] = ConfigError, *,
             named_by: Optional[PathLike] = None) -> Path:
    """``path`` resolved, if it is a regular file inside folder ``within`` once every link is followed; else
    ``error`` (named by ``named_by``, default the path itself): a link leading out of the folder, a link that goes
    nowhere, a FIFO, a device or a folder. The one file every reader of a folder from elsewhere goes through.

    One link out is allowed: the Hugging Face cache's own layout, where ``REPO/snapshots/REVISION/`` (the folder
    ``snapshot_download`` returns) holds links into ``REPO/blobs/``.
    """
    path, named_by = Path(path), Path(named_by or path)
    root = Path(within).resolve()
    roots = [root] + ([root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [])
    try:
        resolved = path.resolve(strict=True)
        mode = resolved.stat().st_mode
    except (OSError, RuntimeError) as err:  # missing, or a loop of links
        raise error(f"{named_by}: {path.name} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if not any(resolved.is_relative_to(allowed) for allowed in roots):
        raise error(f"{named_by}: {path} leads outside {within} (to {resolved}); a checkpoint folder may only read "
                    "its own files: refused")
    if not stat.S_ISREG(mode):
        raise error(f"{named_by}: {path} is not a regular file (a FIFO, device or folder); refused")
    return resolved


def read_text(path: PathLike, error: type[Exception] = ConfigError, *, within: Optional[PathLike] = None) -> str:
    """A UTF-8 text file; a missing file or undecodable bytes raise ``error`` naming the file and byte offset.
    ``within``: the folder the file must stay inside (:func:`confined`)."""
    path = Path(path)
    source = confined(path, within, error) if within is not None else path
    try:
        data = source.read_bytes()
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise error(f"{path}:{line}: not valid UTF-8 (byte {err.start}: {data[err.start:err.start + 4]!r}); save the "
                    "file as UTF-8") from None


def parse_json(text: str, source: str, error: type[Exception] = ConfigError, *, max_int: Optional[int] = None
               ) -> Any:
    """The JSON document in ``text``; syntax errors (line, column), duplicate keys, nesting deeper than
    :data:`MAX_DEPTH` and integers beyond ``max_int`` (None: Python's 4,300 digits; a config file's are bounded
    by 64 bits, while a tokenizer's ``model_max_length`` is often ``int(1e30)``) raise ``error``."""
    try:
        return _bounded(json.loads(text, object_pairs_hook=_refuse_duplicates(source, error)), source, error,
                        max_int)
    except json.JSONDecodeError as err:
        raise error(f"{source}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from None
    except RecursionError:
        raise error(f"{source}: nested more than {MAX_DEPTH} levels deep (lists or objects inside each other); a "
                    "config nests a few levels: check the file") from None
    except ValueError as err:
        if not _too_large(err):
            raise
        raise error(f"{source}: an integer of more than 4,300 digits, more than Python reads; no setting needs one "
                    "(a config's fit 64 bits)") from None


def read_json(path: PathLike, error: type[Exception] = ConfigError, *, expect: type = dict,
              optional: bool = False, within: Optional[PathLike] = None) -> Any:
    """The JSON document in file ``path``, which must be of type ``expect`` (a mapping by default); with
    ``optional``, an empty ``expect()`` when the file does not exist (a tokenizer folder's optional files).
    ``within``: the folder the file must stay inside (:func:`confined`; a dangling link or a FIFO there is refused,
    not taken for a missing optional file)."""
    exists = os.path.lexists(path) if within is not None else Path(path).is_file()
    if optional and not exists:
        return expect()
    data = parse_json(read_text(path, error, within=within), str(path), error)
    if not isinstance(data, expect):
        raise error(f"{path}: expected a JSON {'object' if expect is dict else expect.__name__}, got "
                    f"{type(data).__name__}")
    return data


def json_field(record: Any, key: str, kind: Union[type, tuple[type, ...]], where: str,
               error: type[Exception] = ConfigError) -> Any:
    """``record[key]`` of a JSON record read from a publisher's file, which must be of type ``kind`` (a boolean
    is no number); otherwise ``error`` naming ``where`` (file and record), the key and the value (cut short)."""
    if not isinstance(record, Mapping) or key not in record:
        raise error(f"{where}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise error(f"{where}: field {key!r} must be a {names}, got {shorten(repr(value))}")
    return value


def read_yaml_or_json(path: PathLike, error: type[Exception] = ConfigError) -> Any:
    """A config file: YAML when the name ends in .yaml/.yml, JSON otherwise (YAML 1.1 would read ``1e-05`` in a JSON
    file as a string)."""
    path = Path(path)
    text = read_text(path, error)
    if path.suffix in (".yaml", ".yml"):
        return load_yaml(text, str(path), error)
    return parse_json(text, str(path), error, max_int=MAX_INT)
