"""``interlayer prepare lm``: UTF-8 text -> token files (:mod:`.token_files`), in parallel, deterministic, atomic.

The text is read exactly as ``train lm`` reads it (:func:`~interlayer.data.corpus.load_corpus`: split files, or the
documents of a folder joined by a blank line, or one file; Project Gutenberg's wrappers cut off; split by
characters at ``valid_fraction``/``test_fraction`` when there are no split files), and tokenized exactly as
``train lm`` would tokenize each split, so training on the prepared folder is training on the same ids:

* **char**: the characters of every split, sorted (nanoGPT's ``shakespeare_char``);
* **bpe**: a byte-level BPE of ``vocab_size`` trained on the training split alone;
* **a given tokenizer** (an interlayer run's, or a GPT-2-style Hugging Face one, loaded by the caller).

The differences are what makes it scale: the documents are read one at a time (two passes: the first counts the
characters, which places the split points, and collects a character vocabulary; a BPE is trained on a pass over
the training split), each split's text is cut into chunks of about ``chunk_chars`` characters at places where the
tokenizer's own pre-tokenization always cuts (anywhere for characters; between a non-space and a newline for
byte-level BPE, :data:`~interlayer.data.tokenizers.language_model.CHUNK_BOUNDARY`), and the chunks are encoded by
``workers`` processes (multiprocessing) and written in their order. The ids of a split are therefore those of the
whole text encoded at once, whatever the number of workers or the chunk size, and the same text prepared twice gives
the same bytes (``meta.json`` holds no time and no path). Each file is read whole, so a corpus larger than memory
should be a folder of files.

Output (``layout``): nanoGPT's ``train.bin``, ``val.bin``, ``test.bin``, or llm.c shards
``tokens_{train,val,test}_NNNNNN.bin`` of at most ``shard_tokens`` ids each; and ``meta.json`` (vocabulary size,
the tokenizer, token and character counts), with, for a character vocabulary, nanoGPT's ``meta.pkl`` (its
``sample.py`` decodes with it: :mod:`.nanogpt_meta`). Everything is written into a temporary folder beside ``output``,
which is renamed to ``output`` when complete: an interrupted run leaves no partial corpus behind. Any exception
stops the workers and removes the temporary folder: ``KeyboardInterrupt``, and on the command line SIGTERM
(:func:`~interlayer.training.concurrency.sigterm_as_stop`); the main process waits for results a second at a time,
so such a signal is met promptly. The workers ignore SIGINT, so that a Ctrl-C in a terminal, which reaches every
process of the group, is one line and not a traceback per worker. A write the machine refuses (a full disk) is
named with the file of ``output`` it was writing, not the temporary folder's.

Bounds, so that a typo cannot start hours of work: ``workers`` at most this machine's cores, and no more than
:data:`MAX_SHARDS` shard files (``--shard-tokens 1`` asked for one file per token).
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError, DataError, DiskFullError
from ..fileio import write_atomic, write_failure
from .corpus import (
    DOCUMENT_SEPARATOR,
    SPLITS,
    CorpusFiles,
    corpus_files,
    document_text,
    fraction_bounds,
    read_corpus_text,
    split_description,
    strip_gutenberg,
)
from .nanogpt_meta import write_meta_pkl
from .token_files import MAX_VOCAB, META_FILE, NANOGPT_FILES, Layout, TokenWriter
from .tokenizers.language_model import (
    CHUNK_BOUNDARY,
    ByteBPETokenizer,
    CharTokenizer,
    Kind,
    LMTokenizer,
    tokenizer_from_json,
)

SHARD_NAMES = {"train": "train", "valid": "val", "test": "test"}
SHARD_PREFIX = "tokens"
DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's fineweb.py shard size
DEFAULT_CHUNK_CHARS = 1 << 20
MAX_SHARDS = 10_000  # shard files one prepare may write: llm.c's 10B-token FineWeb is 100


@dataclass
class PrepareSettings:
    """One ``interlayer prepare lm`` (module docstring)."""

    source: str  # a UTF-8 file, a folder of .txt files, or a folder with train/valid(/test).txt
    output: Path
    tokenizer: Union[Kind, LMTokenizer] = "char"
    vocab_size: int = 4096  # bpe only
    layout: Layout = "nanogpt"
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    gutenberg: bool = True
    workers: int = 1
    chunk_chars: int = DEFAULT_CHUNK_CHARS
    progress: bool = True

    def validate(self) -> None:
        cores = os.cpu_count() or 1
        checks = [(1 <= self.workers <= cores, f"--workers={self.workers} must be 1..{cores}, this machine's CPU "
                                               "cores (more processes only wait for them)"),
                  (self.shard_tokens >= 1, f"--shard-tokens={self.shard_tokens} must be positive"),
                  (self.chunk_chars >= 1, f"chunk_chars={self.chunk_chars} must be positive"),
                  (self.tokenizer != "bpe" or 257 <= self.vocab_size <= MAX_VOCAB,
                   f"--vocab-size={self.vocab_size} must be from 257 (256 bytes and a merge) to {MAX_VOCAB} (ids are "
                   "uint16)"),
                  (0 < self.valid_fraction < 1 and 0 <= self.test_fraction < 1
                   and self.valid_fraction + self.test_fraction < 1,
                   f"--valid-fraction={self.valid_fraction} and --test-fraction={self.test_fraction} must be shares "
                   "of the text with valid > 0 and a sum below 1")]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


class SplitText:
    """The text of each split as a stream of pieces (whose concatenation is what ``load_corpus`` gives), its
    character counts, and the characters it uses; the documents are read on every pass, one at a time."""

    def __init__(self, source: str, valid_fraction: float, test_fraction: float, gutenberg: bool) -> None:
        self.found: CorpusFiles = corpus_files(source)
        self.gutenberg = gutenberg
        self.alphabet: set[str] = set()
        if self.found.splits is not None:
            self.characters = {name: 0 for name in SPLITS}
            for name in SPLITS:
                for piece in self._split_file(name):
                    self.characters[name] += len(piece)
                    self.alphabet.update(piece)
            self.bounds: Optional[tuple[int, int]] = None
            self.description = (f"{self.found.root.name} (split files: "
                                f"{', '.join(f.name for f in self.found.splits.values() if f is not None)})")
            return
        total = 0
        for piece in self._joined():
            total += len(piece)
            self.alphabet.update(piece)
        where = self.found.root.name + (f" ({len(self.found.documents)} documents)" if self.found.folder else "")
        if not any(not c.isspace() for c in self.alphabet):
            raise DataError(f"{self.found.root}: no text (empty, or only whitespace after removing Project "
                            "Gutenberg's header and footer)")
        self.bounds = fraction_bounds(total, valid_fraction, test_fraction, where)
        self.characters = dict(zip(SPLITS, (self.bounds[0], self.bounds[1] - self.bounds[0], total - self.bounds[1])))
        self.description = split_description(where, valid_fraction, test_fraction)

    def _split_file(self, name: str) -> Iterator[str]:
        file = self.found.splits[name]
        if file is None:
            return
        text = read_corpus_text(file)
        text = strip_gutenberg(text) if self.gutenberg else text
        if not text.strip():
            raise DataError(f"{file}: no text (empty, or only whitespace after removing Project Gutenberg's header "
                            "and footer)")
        yield text

    def _joined(self) -> Iterator[str]:
        """The whole text, document by document, as ``load_corpus`` joins it."""
        if not self.found.folder:
            text = read_corpus_text(self.found.root)
            yield strip_gutenberg(text) if self.gutenberg else text
            return
        for index, path in enumerate(self.found.documents):
            if index:
                yield DOCUMENT_SEPARATOR
            yield document_text(path, self.gutenberg)
        yield "\n"

    def pieces(self, only: Optional[str] = None) -> Iterator[tuple[str, str]]:
        """``(split, piece)`` over the whole text in one pass, train first (or the pieces of the split ``only``,
        stopping after it)."""
        if self.bounds is None:
            for name in SPLITS if only is None else (only,):
                yield from ((name, piece) for piece in self._split_file(name))
            return
        ends = dict(zip(SPLITS, (*self.bounds, sum(self.characters.values()))))
        position, split = 0, 0
        for piece in self._joined():
            while piece:
                name = SPLITS[split]
                take = min(len(piece), ends[name] - position)
                if take and (only is None or only == name):
                    yield name, piece[:take]
                piece, position = piece[take:], position + take
                if position == ends[name] and split < len(SPLITS) - 1:
                    if only == name:
                        return
                    split += 1


def chunks(pieces: Iterator[tuple[str, str]], size: int, cut_anywhere: bool) -> Iterator[tuple[str, str]]:
    """Each split's concatenated pieces in chunks of about ``size`` characters (``(split, chunk)``), each ending
    where the tokenizer cuts anyway (``cut_anywhere``: characters; else at :data:`CHUNK_BOUNDARY`, or later when a
    chunk has none) or where its split ends. The text is sliced from a moving start, never copied again after each
    chunk (a file read as one piece of 100 MB was copied whole for every chunk: quadratic time)."""
    buffer, start, current = "", 0, None
    for name, piece in pieces:
        if name != current and start < len(buffer):
            yield current, buffer[start:]
            buffer, start = "", 0
        buffer, start, current = buffer[start:] + piece, 0, name
        while len(buffer) - start >= size:
            cut = size if cut_anywhere else _last_boundary(buffer, start, size)
            if cut is None:
                break
            yield name, buffer[start:start + cut]
            start += cut
    if start < len(buffer):
        yield current, buffer[start:]


def _last_boundary(text: str, start: int, size: int) -> Optional[int]:
    """The last :data:`CHUNK_BOUNDARY` of ``text[start:]`` at or before ``size`` (else the first after it), never at
    0, as an offset from ``start``."""
    before = [m.start() for m in CHUNK_BOUNDARY.finditer(text, start + max(size // 2, 1), start + size + 1)]
    if before:
        return before[-1] - start
    after = CHUNK_BOUNDARY.search(text, start + size)
    return after.start() - start if after else None


# -- the workers ---------------------------------------------------------------------------------------------
_WORKER_TOKENIZER: Optional[LMTokenizer] = None


def _start_worker(tokenizer_json: dict[str, Any]) -> None:
    """A worker's start: its tokenizer, and SIGINT ignored (the main process stops the pool; module docstring)."""
    global _WORKER_TOKENIZER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_TOKENIZER = tokenizer_from_json(tokenizer_json, "the tokenizer handed to the worker")


def _encode(chunk: tuple[str, str]) -> tuple[str, np.ndarray, int]:
    """One chunk's split, ids and characters."""
    return chunk[0], np.asarray(_WORKER_TOKENIZER.encode(chunk[1]), dtype=np.int64), len(chunk[1])


class _Encoder:
    """Chunks in, ids out, in order: in this process (one worker) or a pool of ``workers`` processes (forkserver
    where there is one, so no worker inherits this process's threads)."""

    def __init__(self, tokenizer: LMTokenizer, workers: int) -> None:
        self.tokenizer, self.workers, self.pool = tokenizer, workers, None
        if workers > 1:
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            self.pool = multiprocessing.get_context(method).Pool(workers, _start_worker, (tokenizer.to_json(),))

    def encode(self, texts: Iterator[tuple[str, str]]) -> Iterator[tuple[str, np.ndarray, int]]:
        if self.pool is None:
            for split, text in texts:
                yield split, np.asarray(self.tokenizer.encode(text), dtype=np.int64), len(text)
        else:
            results = self.pool.imap(_encode, texts, chunksize=1)
            while True:
                try:  # waits of a second at most: a signal's handler runs only between them (SIGTERM took 30 s)
                    yield results.next(timeout=1.0)
                except multiprocessing.TimeoutError:
                    continue
                except StopIteration:
                    return

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


class _SplitWriter:
    """Writes a split's ids into one nanoGPT file, or into shards of at most ``shard_tokens`` ids."""

    def __init__(self, folder: Path, split: str, layout: Layout, shard_tokens: int) -> None:
        self.folder, self.split, self.layout, self.shard_tokens = folder, split, layout, shard_tokens
        self.files: list[str] = []
        self.writer: Optional[TokenWriter] = None
        self.tokens = 0

    def _open(self) -> TokenWriter:
        name = (NANOGPT_FILES[self.split] if self.layout == "nanogpt" else
                f"{SHARD_PREFIX}_{SHARD_NAMES[self.split]}_{len(self.files):06d}.bin")
        self.files.append(name)
        return TokenWriter(self.folder / name, self.layout)

    def write(self, ids: np.ndarray) -> None:
        while len(ids):
            if self.writer is None:
                self.writer = self._open()
            room = len(ids) if self.layout == "nanogpt" else self.shard_tokens - self.writer.tokens
            self.writer.write(ids[:room])
            self.tokens += min(room, len(ids))
            ids = ids[room:]
            if self.layout == "shards" and self.writer.tokens == self.shard_tokens:
                self.writer.close()
                self.writer = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _tokenizer(settings: PrepareSettings, text: SplitText) -> LMTokenizer:
    if settings.tokenizer == "char":
        return CharTokenizer(sorted(text.alphabet))
    if settings.tokenizer == "bpe":
        return ByteBPETokenizer.train((chunk for _, chunk in chunks(text.pieces("train"), settings.chunk_chars,
                                                                    False)), settings.vocab_size)
    return settings.tokenizer


def _fresh_output(output: Path) -> None:
    if output.exists() and not (output.is_dir() and not any(output.iterdir())):
        raise FileExistsError(f"{output} already exists and is not an empty folder; prepare never overwrites: choose "
                              "another --output or remove it")


def _check_shards(settings: PrepareSettings, text: SplitText) -> None:
    """Refuse more than :data:`MAX_SHARDS` shard files: a split's tokens are at most its characters (characters),
    or four times as many (byte-level BPE: up to 4 UTF-8 bytes a character)."""
    if settings.layout != "shards":
        return
    per_char = 1 if settings.tokenizer == "char" else 4
    files = sum(-(-count * per_char // settings.shard_tokens) for count in text.characters.values())
    if files > MAX_SHARDS:
        least = -(-sum(text.characters.values()) * per_char // MAX_SHARDS)
        raise ConfigError(f"--shard-tokens={settings.shard_tokens} would write up to {files:,} shard files for "
                          f"{sum(text.characters.values()):,} characters, more than {MAX_SHARDS:,}; give "
                          f"--shard-tokens {least:,} or more")


def _write_failure(output: Path, err: OSError, *, inside: bool = True) -> OSError:
    """``err``, raised writing a file of the temporary folder (``inside``; else making the folder), as the error of
    the file of ``output`` it becomes (the temporary folder is removed: nothing is left to name there)."""
    name = Path(err.filename).name if inside and isinstance(getattr(err, "filename", None), str) else None
    target = output / name if name else output
    failure = write_failure(target, err)
    if isinstance(failure, DiskFullError):
        failure = DiskFullError(f"{target}: no space left on device while writing it ({_free(output.parent)} in "
                                f"{output.parent}); nothing was written (the partial folder is removed): free "
                                "some space and run prepare again")
    return failure or err


def _free(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 2 ** 20:.1f} MiB free"
    except OSError:
        return "free space unknown"


def prepare(settings: PrepareSettings) -> dict[str, Any]:
    """Tokenize ``settings.source`` into ``settings.output`` (module docstring); returns what ``meta.json`` holds."""
    settings.validate()
    output = Path(settings.output)
    _fresh_output(output)
    text = SplitText(settings.source, settings.valid_fraction, settings.test_fraction, settings.gutenberg)
    _check_shards(settings, text)
    tokenizer = _tokenizer(settings, text)
    if len(tokenizer) > MAX_VOCAB:
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens; token files hold uint16 ids (at most "
                          f"{MAX_VOCAB})")
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.parent / f".{output.name}.tmp-{os.getpid()}"
    try:
        temporary.mkdir()
    except OSError as err:
        raise _write_failure(output, err, inside=False) from None
    try:
        return _write(settings, output, temporary, text, tokenizer)
    except OSError as err:
        raise _write_failure(output, err) from None


def _write(settings: PrepareSettings, output: Path, temporary: Path, text: SplitText, tokenizer: LMTokenizer
           ) -> dict[str, Any]:
    """Encode and write every split into ``temporary``, then rename it to ``output``; removed on any failure."""
    encoder = None
    bar = tqdm(total=sum(text.characters.values()), unit="char", unit_scale=True, disable=not settings.progress,
               desc="prepare lm", dynamic_ncols=True)
    try:
        encoder = _Encoder(tokenizer, settings.workers)
        writers = {split: _SplitWriter(temporary, split, settings.layout, settings.shard_tokens) for split in SPLITS}
        cut_anywhere = isinstance(tokenizer, CharTokenizer)
        for split, ids, characters in encoder.encode(chunks(text.pieces(), settings.chunk_chars, cut_anywhere)):
            writers[split].write(ids)
            bar.update(characters)
        for writer in writers.values():
            writer.close()
        meta = {"vocab_size": len(tokenizer), "tokenizer": tokenizer.to_json(), "layout": settings.layout,
                "dtype": "uint16", "corpus": text.description,
                "tokens": {split: writer.tokens for split, writer in writers.items()},
                "characters": text.characters, "files": {split: writer.files for split, writer in writers.items()},
                "written_by": "interlayer prepare lm"}
        if not meta["tokens"]["train"] or not meta["tokens"]["valid"]:
            raise DataError(f"{settings.source}: the training or validation split has no tokens")
        with _naming(temporary / META_FILE):
            write_atomic(temporary / META_FILE, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
            if isinstance(tokenizer, CharTokenizer):
                write_meta_pkl(temporary, "".join(tokenizer.chars))
        _fresh_output(output)
        if output.exists():
            output.rmdir()
        os.replace(temporary, output)
    except BaseException:
        if encoder is not None:
            encoder.close()  # first: a worker still writing would keep the folder busy
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    finally:
        if encoder is not None:
            encoder.close()
        bar.close()
    return meta


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An ``OSError`` raised in the block without a file name (``write``'s full disk) names ``path``."""
    try:
        yield
    except OSError as err:
        if not getattr(err, "filename", None):
            err.filename = str(path)
        raise
