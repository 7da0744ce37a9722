"""Sentence and sentence-pair classification data: strict readers, a word vocabulary, BERT-style input encoding.

Formats (each read from a plain or ``.gz`` file; every malformed row raises :class:`DataError` naming file:line):

* ``sst``: ``LABEL SENTENCE`` per line (Kim 2014's ``stsa.fine.*`` with labels 0-4, ``stsa.binary.*`` with 0-1).
* ``sick``: TSV with the header ``pair_ID sentence_A sentence_B relatedness_score entailment_judgment``; the label
  is ``ENTAILMENT``, ``NEUTRAL`` or ``CONTRADICTION`` (any case).
* ``mrpc``: TSV with the header ``Quality #1 ID #2 ID #1 String #2 String`` (a leading UTF-8 byte-order mark is
  allowed); ``Quality`` is 1 (paraphrase) or 0. Cells are split on tabs only: the strings contain quote characters
  that a CSV reader would treat as quoting.

Input encoding (PA App. B.2.1: "Similar to BERT-style implementation, we concatenate two sentences into a single
one by putting a special token in the middle and adding a field embedding vector"): ``[CLS] a [SEP]`` for one
sentence and ``[CLS] a [SEP] b [SEP]`` for a pair, with segment ids 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``.
Inputs longer than ``max_len`` (64 in PA Sec. 4.1.1) are truncated, the longer sentence of a pair first (BERT's
rule), and counted.

Tokenisation is word level (the paper's inputs are GloVe *word* vectors, Sec. 4.1.1): lower-cased, words with
their internal hyphens and apostrophes kept together (``re-imagining``, ``n't``), every other punctuation mark a
token of its own. The vocabulary comes from the training split only; words seen fewer than ``min_freq`` times map
to ``[UNK]``, so that ``[UNK]`` itself is trained on rare words and means something on unseen test words.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from ..errors import DataError
from ..fileio import read_json, write_atomic
from .text import PathLike, iter_lines

PAD_ID, UNK_ID, CLS_ID, SEP_ID = 0, 1, 2, 3
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
MAX_LINE_CHARS = 4096
VOCAB_FILE = "vocab.json"

_TOKEN = re.compile(r"\w+(?:['\-]\w+)*|'\w+|[^\w\s]")


@dataclass(frozen=True)
class Example:
    """One text-classification example: a sentence (or a pair) and its label."""

    text_a: str
    label: int
    text_b: Optional[str] = None
    line: int = field(default=0, compare=False)  # where the example is in its file (1-based), for messages


@dataclass(frozen=True)
class DataFormat:
    """A file format with its class names (index = class id) and whether examples are sentence pairs."""

    name: str
    labels: tuple[str, ...]
    pair: bool
    reader: Callable[[Path, "DataFormat"], list[Example]]

    def read(self, path: PathLike) -> list[Example]:
        examples = self.reader(Path(path), self)
        if not examples:
            raise DataError(f"{path}: no examples (an empty file, or only a header)")
        return examples


# -- readers ---------------------------------------------------------------------------------------------------
def _read_sst(path: Path, fmt: DataFormat) -> list[Example]:
    valid = [str(i) for i in range(len(fmt.labels))]
    examples = []
    for number, line in iter_lines(path, max_chars=MAX_LINE_CHARS):
        label, _, text = line.partition(" ")
        if label not in valid:
            raise DataError(f"{path}:{number}: label {label!r} is not one of {', '.join(valid)} "
                            f"({fmt.name} format: 'LABEL SENTENCE' per line)")
        examples.append(Example(_sentence(text, path, number, "the sentence after the label"), int(label),
                                line=number))
    return examples


def _read_tsv(path: Path, header: Sequence[str], row: Callable[[list[str], str], Example]) -> list[Example]:
    """Rows of a tab-separated file whose first line is ``header``; ``row(cells, "file:line")`` builds one example."""
    lines = iter_lines(path, max_chars=MAX_LINE_CHARS)
    first = next(lines, None)
    if first is None:
        raise DataError(f"{path}: the file is empty")
    found = first[1].lstrip("\ufeff").split("\t")
    if found != list(header):
        raise DataError(f"{path}:1: header {found} does not match the expected {list(header)}")
    examples = []
    for number, line in lines:
        cells = line.split("\t")
        if len(cells) != len(header):
            raise DataError(f"{path}:{number}: {len(cells)} tab-separated columns, expected {len(header)} "
                            f"({' | '.join(header)})")
        examples.append(dataclasses.replace(row(cells, f"{path}:{number}"), line=number))
    return examples


SICK_HEADER = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment")
MRPC_HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")


def _read_sick(path: Path, fmt: DataFormat) -> list[Example]:
    def row(cells: list[str], where: str) -> Example:
        label = cells[4].strip().upper()
        if label not in fmt.labels:
            raise DataError(f"{where}: entailment_judgment {cells[4]!r} is not one of {', '.join(fmt.labels)}")
        try:
            float(cells[3])
        except ValueError:
            raise DataError(f"{where}: relatedness_score {cells[3]!r} is not a number (are columns shifted?)"
                            ) from None
        return Example(_sentence(cells[1], where, None, "sentence_A"), fmt.labels.index(label),
                       _sentence(cells[2], where, None, "sentence_B"))

    return _read_tsv(path, SICK_HEADER, row)


def _read_mrpc(path: Path, fmt: DataFormat) -> list[Example]:
    def row(cells: list[str], where: str) -> Example:
        if cells[0] not in ("0", "1"):
            raise DataError(f"{where}: Quality {cells[0]!r} is not 0 or 1")
        return Example(_sentence(cells[3], where, None, "#1 String"), int(cells[0]),
                       _sentence(cells[4], where, None, "#2 String"))

    return _read_tsv(path, MRPC_HEADER, row)


def _sentence(text: str, path: PathLike, number: Optional[int], what: str) -> str:
    text = text.strip()
    if not text:
        where = f"{path}:{number}" if number is not None else str(path)
        raise DataError(f"{where}: {what} is empty")
    return text


SST5 = DataFormat("sst", ("very negative", "negative", "neutral", "positive", "very positive"), False, _read_sst)
SST2 = DataFormat("sst", ("negative", "positive"), False, _read_sst)
SICK = DataFormat("sick", ("ENTAILMENT", "NEUTRAL", "CONTRADICTION"), True, _read_sick)
MRPC = DataFormat("mrpc", ("not paraphrase", "paraphrase"), True, _read_mrpc)


# -- vocabulary and encoding -----------------------------------------------------------------------------------
def tokenize(text: str, lowercase: bool = True) -> list[str]:
    return _TOKEN.findall(text.lower() if lowercase else text)


class WordVocab:
    """Word -> id, with the specials ``[PAD]=0`` (the core's ``pad_id``), ``[UNK]``, ``[CLS]``, ``[SEP]`` first."""

    def __init__(self, words: Sequence[str], *, lowercase: bool, min_freq: int) -> None:
        self.words = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.index = {w: i for i, w in enumerate(self.words)}
        self.lowercase, self.min_freq = lowercase, min_freq

    @classmethod
    def build(cls, texts: Iterable[str], *, min_freq: int, lowercase: bool) -> "WordVocab":
        """Words of ``texts`` seen at least ``min_freq`` times, most frequent first (ties alphabetical)."""
        counts = Counter(t for text in texts for t in tokenize(text, lowercase))
        kept = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        return cls(kept, lowercase=lowercase, min_freq=min_freq)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(t, UNK_ID) for t in tokenize(text, self.lowercase)]

    def save(self, directory: PathLike) -> None:
        data = {"specials": list(SPECIALS), "lowercase": self.lowercase, "min_freq": self.min_freq,
                "words": self.words}
        write_atomic(Path(directory) / VOCAB_FILE, json.dumps(data, ensure_ascii=False))

    @classmethod
    def load(cls, directory: PathLike) -> "WordVocab":
        """The vocabulary a text-classification run saved in ``directory`` (read inside it), checked: the fields it was
        written with and the special tokens this code expects."""
        path = Path(directory) / VOCAB_FILE
        if not os.path.lexists(path):
            raise FileNotFoundError(f"{directory} has no {VOCAB_FILE}: pass a run directory or a model folder "
                                    "written by a text-classification run")
        data = read_json(path, DataError, within=directory)
        if not isinstance(data.get("words"), list) or not {"lowercase", "min_freq"} <= set(data):
            raise DataError(f"{path} is not a word vocabulary (expected the keys specials, lowercase, min_freq and "
                            f"words written by a text-classification run; found {sorted(data)})")
        if data.get("specials") != list(SPECIALS):
            raise DataError(f"{path}: special tokens {data.get('specials')} differ from {list(SPECIALS)}")
        return cls(data["words"], lowercase=data["lowercase"], min_freq=data["min_freq"])


@dataclass(frozen=True)
class Encoded:
    """An example's token ids, segment ids for a pair, and whether the length limit cut it."""

    ids: list[int]
    segments: list[int]
    truncated: bool


def encode_example(vocab: WordVocab, example: Example, max_len: int) -> Encoded:
    """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with segment ids, at most ``max_len`` tokens."""
    a = vocab.encode(example.text_a)
    if example.text_b is None:
        room = max_len - 2
        ids = [CLS_ID] + a[:room] + [SEP_ID]
        return Encoded(ids, [0] * len(ids), len(a) > room)
    b = vocab.encode(example.text_b)
    total = len(a) + len(b)
    while len(a) + len(b) > max_len - 3:
        if len(a) >= len(b):
            a = a[:-1]
        else:
            b = b[:-1]
    first = [CLS_ID] + a + [SEP_ID]
    second = b + [SEP_ID]
    return Encoded(first + second, [0] * len(first) + [1] * len(second), len(a) + len(b) < total)
