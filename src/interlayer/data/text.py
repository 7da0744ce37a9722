"""Line-oriented text files, plain or gzip, read strictly: every problem is reported with file and line.

Why strict: a silently skipped or mis-decoded line shifts a parallel corpus out of alignment, and the damage shows
up hours later as a bad BLEU score. So undecodable bytes, NUL bytes (valid UTF-8, but no text holds them: a binary
file that happens to decode, a file of zeros a crash left), empty files and over-long lines raise
:class:`DataError` at load time, naming ``path:line``.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Union

from ..errors import DataError

PathLike = Union[str, Path]


def _decoded(raw_lines: Iterable[bytes], source: object, max_chars: int) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of UTF-8 byte lines; errors name ``source:line``."""
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise DataError(f"{source}:{number}: not valid UTF-8 (byte {err.start} of the line: "
                            f"{raw[max(0, err.start - 10):err.start + 10]!r}); convert it to UTF-8") from None
        if "\x00" in line:
            raise DataError(nul_refusal(f"{source}:{number}", line.index("\x00"), "of the line"))
        if max_chars and len(line) > max_chars:
            raise DataError(f"{source}:{number}: line has {len(line)} characters, more than the limit of "
                            f"{max_chars}; split or drop it, or raise the limit")
        yield number, line


def nul_refusal(where: str, position: int, of: str) -> str:
    """The message refusing text that holds a NUL byte (at character ``position`` ``of`` what was read)."""
    return (f"{where}: holds a NUL byte (character {position} {of}); no text file holds one, so it is binary or "
            "damaged (a file of zeros, say): convert it to UTF-8 text")


def iter_lines(path: PathLike, *, max_chars: int = 0) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` (1-based, without the newline) from a UTF-8 file, ``.gz`` allowed.

    ``max_chars`` > 0 rejects longer lines (a line that long is usually a broken file: a missing newline, binary
    data), naming the line and the limit.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            yield from _decoded(handle, path, max_chars)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: cannot read ({err})") from None


def read_lines(path: PathLike, *, max_chars: int = 0) -> list[str]:
    lines = [line for _, line in iter_lines(path, max_chars=max_chars)]
    if not lines:
        raise DataError(f"{path}: the file is empty")
    return lines


def read_stream_lines(stream: BinaryIO, source: str = "<stdin>", *, max_chars: int = 0) -> list[str]:
    """The lines of a binary stream (``sys.stdin.buffer``), read as strictly as a file: UTF-8 only, not empty.

    Bytes, not the text stream, because a text stream decodes with the locale's encoding and error handler
    (``surrogateescape`` under the C locale), which would hand undecodable input on as garbage characters.
    """
    lines = [line for _, line in _decoded(stream, source, max_chars)]
    if not lines:
        raise DataError(f"{source}: no input (empty); give one sentence per line")
    return lines
