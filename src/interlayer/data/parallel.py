"""Line-aligned parallel text: two files, line i of one translates line i of the other.

Checks, each with a :class:`DataError` naming file and line: missing or empty files, invalid UTF-8, over-long
lines, unequal line counts. One documented filter: pairs where either side is blank are dropped from *training*
data and counted (``ParallelCorpus.dropped_blank``); evaluation data is never filtered, since a test set must be
translated whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError
from .text import PathLike, read_lines

MAX_LINE_CHARS = 4096


@dataclass
class ParallelCorpus:
    """Line-aligned source and target sentences of one split, and the files they were read from."""

    source: list[str]
    target: list[str]
    source_path: str
    target_path: str
    dropped_blank: int = 0
    lines: list[int] = field(default_factory=list)  # the 1-based line number of every kept pair, for messages

    def __len__(self) -> int:
        return len(self.source)


def read_parallel(source_path: PathLike, target_path: PathLike, *, drop_blank: bool = False,
                  max_chars: int = MAX_LINE_CHARS) -> ParallelCorpus:
    """The sentence pairs of two line-aligned files (plain or .gz): files of different lengths are refused naming where
    the shorter ends; a blank line is refused naming it, or with ``drop_blank`` (training data) the pair is dropped and
    counted; lines longer than ``max_chars`` are refused."""
    src = read_lines(source_path, max_chars=max_chars)
    tgt = read_lines(target_path, max_chars=max_chars)
    if len(src) != len(tgt):
        shorter, longer = (source_path, target_path) if len(src) < len(tgt) else (target_path, source_path)
        raise DataError(f"{source_path} has {len(src)} lines but {target_path} has {len(tgt)}: parallel files "
                        f"must be line-aligned; {shorter} ends at line {min(len(src), len(tgt))}, {longer} goes on")
    blank = [i for i, (s, t) in enumerate(zip(src, tgt)) if not s.strip() or not t.strip()]
    if blank and not drop_blank:
        first = blank[0] + 1
        side = source_path if not src[blank[0]].strip() else target_path
        raise DataError(f"{side}:{first}: blank line in evaluation data ({len(blank)} blank pairs in all); "
                        "every line must hold a sentence")
    keep = sorted(set(range(len(src))) - set(blank))
    return ParallelCorpus([src[i] for i in keep], [tgt[i] for i in keep], str(source_path), str(target_path),
                          dropped_blank=len(blank), lines=[i + 1 for i in keep])


def bundled_dir(name: str) -> Path:
    """Folder of a data set shipped inside the package (``multi30k``, ``sst``, ...)."""
    path = Path(__file__).parent / "bundled" / name
    if not path.is_dir():
        raise DataError(f"no bundled data set {name!r} at {path}")
    return path


BUNDLED_PREFIX = "bundled:"


def resolve_path(path: str) -> Path:
    """``bundled:NAME`` is a data set shipped inside the package (its folder), ``bundled:NAME/FILE`` a file in
    it; anything else is a path as given. Every data setting that names a file or folder reads it this way."""
    if not path.startswith(BUNDLED_PREFIX):
        return Path(path)
    name, _, rest = path[len(BUNDLED_PREFIX):].partition("/")
    return bundled_dir(name) / rest if rest else bundled_dir(name)
