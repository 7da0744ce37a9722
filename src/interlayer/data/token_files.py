"""Pre-tokenized corpora: nanoGPT's ``train.bin``/``val.bin`` and llm.c / modded-nanogpt token shards, read through
memory maps and never loaded whole.

At research scale (10^8-10^10 tokens) a corpus is tokenized once and kept as token ids on disk. Two layouts are
the community's:

* **nanoGPT** (``data/openwebtext/prepare.py``): a folder with ``train.bin`` and ``val.bin`` (``test.bin``
  optional, interlayer's addition), each the raw token ids as little-endian ``uint16``, nothing else. The
  vocabulary size is in no file (nanoGPT keeps it in a pickled ``meta.pkl``, or assumes GPT-2's): it comes from
  ``--set data.vocab_size=N``, from a small ``meta.json`` beside the files (below), or from nanoGPT's
  ``meta.pkl``, read as plain data by an unpickler that refuses every global (:mod:`.nanogpt_meta`), when there is
  no ``meta.json``.
* **llm.c / modded-nanogpt shards** (``dev/data/data_common.py``'s ``write_datafile``): files named
  ``*_train_*.bin``, ``*_val_*.bin`` (and ``*_test_*.bin``), in name order; each starts with a header of 256
  little-endian ``int32``: the magic number 20240520, the version 1, the number of tokens, then zeros; then the
  tokens as ``uint16``. The header is checked against the file's size, so a truncated or foreign file is refused
  naming it.

``meta.json`` (written by ``interlayer prepare lm``, or by hand) holds ``vocab_size``, and optionally the tokenizer
the ids came from (``tokenizer``, as a run's ``tokenizer.json`` holds it) or, for nanoGPT's character corpora, the
characters in id order (``chars``). With a tokenizer the language model reports bits per character/byte and writes
text samples; without one it has the ids alone (:class:`~interlayer.data.tokenizers.language_model.IdTokenizer`).

A split is one sequence of ids (its files in order, as if concatenated). :meth:`TokenSplit.windows` reads the rows
of a batch: it opens the memory maps anew for each call, as nanoGPT's ``get_batch`` does, so the pages a long run
has touched are not kept mapped by the process (numpy issue: a memmap's resident pages grow for as long as it
lives), checking first that each file it maps still has the size it had when the run began (a file shrunk during a
run is named, not numpy's "mmap length is greater than file size"), and it checks that every id read is below the
vocabulary size (a CPU-side check on the rows just read: an out-of-range id would otherwise fail inside the
embedding, on a GPU as an opaque device assertion). :meth:`TokenSplit.check_ids` reads a whole split once for the
same check, before a run starts.

What ``meta.json`` says of the files is compared with them when the folder is opened (:func:`open_token_corpus`):
the layout, the id type, each split's files and token counts (``interlayer prepare lm`` writes them), and the
vocabulary's size against its tokenizer or characters (:func:`check_vocabulary`): a disagreement is refused naming
the key and the file, before anything is written.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from .nanogpt_meta import PICKLED_META, read_meta_pkl

Layout = Literal["nanogpt", "shards"]
SPLITS = ("train", "valid", "test")
NANOGPT_FILES = {"train": "train.bin", "valid": "val.bin", "test": "test.bin"}
SHARD_PATTERNS = {"train": "*_train_*.bin", "valid": "*_val_*.bin", "test": "*_test_*.bin"}
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_VOCAB = 1 << 16  # uint16 ids
CHECK_CHUNK = 1 << 24  # ids read at once by TokenSplit.check_ids
META_FILE = "meta.json"


@dataclass(frozen=True)
class TokenFile:
    """One file of ids: where its tokens start (bytes) and how many it holds."""

    path: Path
    offset: int
    tokens: int


def read_raw(path: Path) -> TokenFile:
    """A nanoGPT ``.bin``: raw ``uint16`` ids, so its size must be a positive even number of bytes."""
    size = _size(path)
    if size == 0 or size % TOKEN_DTYPE.itemsize:
        raise DataError(f"{path}: {size} bytes is not a whole number of uint16 token ids (nanoGPT's .bin holds 2 "
                        "bytes per token and nothing else); the file is empty or truncated")
    return TokenFile(path, 0, size // TOKEN_DTYPE.itemsize)


def read_shard(path: Path) -> TokenFile:
    """An llm.c shard: its header's magic number, version and token count, checked against the file's size."""
    size = _size(path)
    if size < HEADER_BYTES:
        raise DataError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header of an llm.c token shard; "
                        "the file is truncated or not a shard")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, tokens = (int(v) for v in header[:3])
    if magic != SHARD_MAGIC:
        raise DataError(f"{path}: magic number {magic}, not llm.c's {SHARD_MAGIC}; not an llm.c / modded-nanogpt "
                        "token shard")
    if version != SHARD_VERSION:
        raise DataError(f"{path}: shard version {version}; interlayer reads version {SHARD_VERSION} (uint16 tokens)")
    expected = HEADER_BYTES + tokens * TOKEN_DTYPE.itemsize
    if tokens <= 0 or size != expected:
        raise DataError(f"{path}: the header announces {tokens} tokens ({expected} bytes with the header), the file "
                        f"has {size} bytes; it is truncated or damaged")
    return TokenFile(path, HEADER_BYTES, tokens)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None


class TokenSplit:
    """One split's ids: its files read as one sequence, through memory maps (module docstring).

    ``vocab_size`` (set once the vocabulary is known) bounds the ids :meth:`windows` and slicing return.
    """

    def __init__(self, files: Sequence[TokenFile], vocab_size: Optional[int] = None) -> None:
        self.files = list(files)
        self.vocab_size = vocab_size
        self.starts = np.cumsum([0] + [f.tokens for f in self.files])  # each file's first position, then the end

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _maps(self) -> list["_LazyMap"]:
        return [_LazyMap(f) for f in self.files]

    def __getitem__(self, index: slice) -> Tensor:
        """A contiguous span (``ids[:32]``) as int64, as a text split's tensor would give it."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("a token split is read by contiguous slices (ids[a:b]) or windows()")
        start, stop, _ = index.indices(len(self))
        return self.windows([start], max(stop - start, 0))[0]

    def windows(self, starts: Union[Sequence[int], Tensor], length: int) -> Tensor:
        """Rows ``ids[s:s + length]`` for each ``s`` in ``starts`` as an int64 tensor ``(len(starts), length)``;
        a row may run over the end of one file into the next."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        if length == 0:
            return torch.empty((len(starts), 0), dtype=torch.long)
        if len(starts) and (starts.min() < 0 or starts.max() + length > len(self)):
            raise IndexError(f"rows of {length} tokens from {starts.min()} to {starts.max()} leave the split's "
                             f"{len(self)} tokens")
        maps = self._maps()
        out = np.empty((len(starts), length), dtype=np.int64)
        first = np.searchsorted(self.starts, starts, side="right") - 1
        inside = starts + length <= self.starts[first + 1]
        span = np.arange(length)
        for index in np.unique(first[inside]):  # rows within one file: one gather per file
            rows = np.flatnonzero(inside & (first == index))
            out[rows] = maps[index][(starts[rows] - self.starts[index])[:, None] + span]
        for row in np.flatnonzero(~inside):  # rows across files
            out[row] = np.concatenate(list(self._pieces(maps, int(starts[row]), int(starts[row]) + length)))
        self._check_ids(out, starts)
        return torch.from_numpy(out)

    def _pieces(self, maps: list[np.memmap], start: int, stop: int) -> Iterator[np.ndarray]:
        index = int(np.searchsorted(self.starts, start, side="right") - 1)
        while start < stop:
            end = min(stop, int(self.starts[index + 1]))
            yield maps[index][start - self.starts[index]:end - self.starts[index]]
            start, index = end, index + 1

    def check_ids(self) -> None:
        """Every id of the split below ``vocab_size``, read once in chunks (:meth:`windows` checks the rows it
        reads; this is the same check of the whole split, before a run starts)."""
        if self.vocab_size is None:
            return
        for index, file in enumerate(self.files):
            ids = _LazyMap(file)[:]
            for start in range(0, file.tokens, CHECK_CHUNK):
                chunk = ids[start:start + CHECK_CHUNK]
                if chunk.max() >= self.vocab_size:
                    self._check_ids(chunk[None].astype(np.int64), np.array([self.starts[index] + start]))

    def _check_ids(self, rows: np.ndarray, starts: np.ndarray) -> None:
        if self.vocab_size is None or rows.size == 0 or rows.max() < self.vocab_size:
            return
        row, column = np.unravel_index(int(np.argmax(rows >= self.vocab_size)), rows.shape)
        position = int(starts[row]) + int(column)
        index = int(np.searchsorted(self.starts, position, side="right") - 1)
        raise DataError(f"{self.files[index].path}: token {position - self.starts[index]} has id "
                        f"{rows[row, column]}, outside the vocabulary of {self.vocab_size} (ids 0 to "
                        f"{self.vocab_size - 1}); the files and data.vocab_size / {META_FILE} disagree")

    @property
    def description(self) -> str:
        if not self.files:
            return "none"
        names = self.files[0].path.name + (f" ... {self.files[-1].path.name} ({len(self.files)} files)"
                                           if len(self.files) > 1 else "")
        return f"{names}: {len(self):,} tokens"


class _LazyMap:
    """One token file's memory map, opened on first use after checking the file still has its size."""

    def __init__(self, file: TokenFile) -> None:
        self.file, self.map = file, None

    def __getitem__(self, index: Any) -> np.ndarray:
        if self.map is None:
            expected = self.file.offset + self.file.tokens * TOKEN_DTYPE.itemsize
            size = _size(self.file.path)
            if size != expected:
                raise DataError(f"{self.file.path}: {size:,} bytes now, {expected:,} when the run opened it "
                                f"({self.file.tokens:,} tokens); the file changed during the run: restore it, or "
                                "start a new run on the new files")
            self.map = np.memmap(self.file.path, dtype=TOKEN_DTYPE, mode="r", offset=self.file.offset,
                                 shape=(self.file.tokens,))
        return self.map[index]


@dataclass
class TokenCorpus:
    """The splits of a token folder (``test`` may be empty) and what ``meta.json`` says about them."""

    layout: Layout
    root: Path
    splits: dict[str, TokenSplit]
    meta: dict[str, Any]  # meta.json's contents ({} without one)

    def files(self) -> list[tuple[str, Path]]:
        """Every file the corpus reads, by name (:mod:`interlayer.data.fingerprint`): the token files, and
        ``meta.json`` or else nanoGPT's ``meta.pkl`` where one is there (its vocabulary decides what the ids mean)."""
        out = [(f.path.name, f.path) for split in self.splits.values() for f in split.files]
        source = next((name for name in (META_FILE, PICKLED_META) if (self.root / name).is_file()), None)
        return out + ([(source, self.root / source)] if self.meta and source else [])

    @property
    def description(self) -> str:
        parts = ", ".join(f"{name} {split.description}" for name, split in self.splits.items() if split.files)
        return f"{self.root} ({'nanoGPT .bin files' if self.layout == 'nanogpt' else 'llm.c token shards'}: {parts})"


def find_layout(root: Path) -> Optional[Layout]:
    """Which token layout the folder ``root`` holds, or None (not a folder, or text)."""
    if not root.is_dir():
        return None
    if (root / NANOGPT_FILES["train"]).is_file():
        return "nanogpt"
    if any(root.glob(SHARD_PATTERNS["train"])):
        return "shards"
    return None


def open_token_corpus(root: Path) -> TokenCorpus:
    """The splits of the token folder ``root`` (:func:`find_layout` must have found one), every file's size (and
    a shard's header) checked; ``meta.json`` read when present."""
    layout = find_layout(root)
    if layout is None:
        raise DataError(f"{root}: no train.bin and no *_train_*.bin token shards")
    if layout == "nanogpt":
        files = {name: [read_raw(root / file)] if (root / file).is_file() else []
                 for name, file in NANOGPT_FILES.items()}
        missing = "val.bin"
    else:
        files = {name: [read_shard(path) for path in sorted(root.glob(pattern))]
                 for name, pattern in SHARD_PATTERNS.items()}
        missing = "*_val_*.bin shard"
    if not files["valid"]:
        raise DataError(f"{root} has training tokens but no {missing}; add the validation split")
    corpus = TokenCorpus(layout, root, {name: TokenSplit(files[name]) for name in SPLITS}, read_meta(root))
    _check_meta(corpus)
    return corpus


def _check_meta(corpus: TokenCorpus) -> None:
    """What ``meta.json`` says of the files (``interlayer prepare lm`` writes all of it; a hand-written one may say
    less), compared with the files found: the layout, the id type, each split's files in order and its tokens."""
    meta, where = corpus.meta, corpus.root / META_FILE
    if meta.get("layout", corpus.layout) != corpus.layout:
        raise DataError(f"{where}: layout={meta['layout']!r}, but the folder holds {corpus.layout} files; the "
                        "meta.json belongs to another folder")
    if meta.get("dtype", "uint16") != "uint16":
        raise DataError(f"{where}: dtype={meta['dtype']!r}; interlayer's token files hold uint16 ids")
    for key, found in (("files", lambda split: [f.path.name for f in split.files]), ("tokens", len)):
        declared = meta.get(key, {})
        if not isinstance(declared, dict):
            raise DataError(f"{where}: {key} must be a JSON object by split (train, valid, test)")
        for name, split in corpus.splits.items():
            if name in declared and declared[name] != found(split):
                raise DataError(f"{where}: {key}.{name}={_short(declared[name])}, but the folder's {name} split "
                                f"has {_short(found(split))}; files were added, removed or replaced since "
                                "meta.json was written: restore them, or prepare the folder again")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:100] + f"... ({len(value)} entries)"


def check_vocabulary(meta: dict[str, Any], tokenizer_size: Optional[int], chars: Optional[str], where: Path) -> None:
    """``meta.json``'s ``vocab_size`` against the size of the tokenizer it holds, and its ``chars`` against that
    tokenizer's characters (the same characters in the same order: an id means one character)."""
    size = meta.get("vocab_size")
    if size is not None and tokenizer_size is not None and size != tokenizer_size:
        raise DataError(f"{where}: vocab_size={size}, but its tokenizer has {tokenizer_size} tokens; one of them "
                        "was edited: the ids cannot mean both")
    if chars is not None and "chars" in meta and meta["chars"] != chars:
        raise DataError(f"{where}: chars lists {len(meta['chars'])} characters that differ from its tokenizer's "
                        f"{len(chars)} (or their order); ids would decode to other characters: keep one of them")


def read_meta(root: Path) -> dict[str, Any]:
    """``meta.json`` beside the token files, its keys checked: ``vocab_size`` (1 to 65536), ``tokenizer`` (an
    object), ``chars`` (a string); else nanoGPT's ``meta.pkl`` read as plain data (:mod:`.nanogpt_meta`); {} when
    there is neither."""
    path = root / META_FILE
    if not path.is_file():
        return read_meta_pkl(root) if os.path.lexists(root / PICKLED_META) else {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object with vocab_size, got {type(meta).__name__}")
    size = meta.get("vocab_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_VOCAB):
        raise DataError(f"{path}: vocab_size={size!r} must be an integer from 1 to {MAX_VOCAB} (ids are uint16)")
    for key, kind in (("tokenizer", dict), ("chars", str)):
        if key in meta and not isinstance(meta[key], kind):
            raise DataError(f"{path}: {key} must be a JSON {'object' if kind is dict else 'string'}")
    return meta


# -- writing ---------------------------------------------------------------------------------------------------
def shard_header(tokens: int) -> bytes:
    """The 256 x int32 header of an llm.c shard holding ``tokens`` ids."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = SHARD_MAGIC, SHARD_VERSION, tokens
    return header.tobytes()


class TokenWriter:
    """Writes one file of ids, in pieces (``write``), as nanoGPT raw ``uint16`` or an llm.c shard (its header's
    count filled in at ``close``). Ids must fit ``uint16``."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path, self.layout, self.tokens = Path(path), layout, 0
        self.handle = self.path.open("wb")
        if layout == "shards":
            self.handle.write(shard_header(0))

    def write(self, ids: np.ndarray) -> None:
        if len(ids) and (ids.min() < 0 or ids.max() >= MAX_VOCAB):
            raise DataError(f"{self.path}: token id {int(ids.max())} does not fit uint16 (vocabularies up to "
                            f"{MAX_VOCAB} ids)")
        try:
            self.handle.write(np.asarray(ids).astype(TOKEN_DTYPE).tobytes())
        except OSError as err:  # a full disk's error names no file: this one
            raise self._named(err) from None
        self.tokens += len(ids)

    def close(self) -> None:
        try:
            if self.layout == "shards":
                self.handle.seek(0)
                self.handle.write(shard_header(self.tokens))
            self.handle.flush()
            os.fsync(self.handle.fileno())
        except OSError as err:
            with contextlib.suppress(OSError):  # closing flushes what is left, and fails the same way
                self.handle.close()
            raise self._named(err) from None
        self.handle.close()

    def _named(self, err: OSError) -> OSError:
        named = OSError(err.errno, err.strerror or str(err))
        named.filename = str(self.path)
        return named


Ids = Union[Tensor, TokenSplit]


def windows(ids: Ids, starts: Union[Sequence[int], Tensor], length: int) -> Tensor:
    """Rows ``ids[s:s + length]`` for each start, from a split held in memory (a text corpus's tensor) or on disk
    (:class:`TokenSplit`), as one int64 tensor."""
    if isinstance(ids, TokenSplit):
        return ids.windows(starts, length)
    return ids[torch.as_tensor(starts, dtype=torch.long)[:, None] + torch.arange(length)]
