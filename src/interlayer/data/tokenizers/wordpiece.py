"""BERT's WordPiece tokenizer, rebuilt from a checkpoint's vocabulary with Hugging Face ``tokenizers``.

The pipeline is the one of Devlin et al. (2019, Sec. 3 "Input/Output Representations") as ``transformers``
builds it (``BertTokenizer``): BERT normaliser (clean control characters, space out CJK characters, lower-case and
strip accents per the checkpoint), BERT pre-tokeniser (whitespace and punctuation), greedy longest-match WordPiece
with ``##`` continuations (at most 100 characters per word, longer words become ``[UNK]``), then
``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with token types 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``.

Choices, each matching what ``transformers`` does so that ids are identical:

* **The pipeline is built from the vocabulary and ``tokenizer_config.json``, never taken whole from
  ``tokenizer.json``.** ``transformers`` rebuilds the normaliser from ``do_lower_case``, ``strip_accents`` and
  ``tokenize_chinese_chars`` even when a ``tokenizer.json`` exists, and a shipped ``tokenizer.json`` often carries
  padding/truncation settings of its exporter (all-MiniLM-L6-v2's pads every input to 128). ``tokenizer.json`` is
  used for the vocabulary only when ``vocab.txt`` is absent, and for its added tokens.
* **Special tokens are never split** (``[MASK]`` in raw text is the mask token), as in ``transformers``.
* **Truncation** is "longest first" over the pair, to ``max_length`` tokens including the special tokens. The
  default length is the checkpoint's ``model_max_length`` (capped at the model's position table by
  :func:`interlayer.pretrained.bert.import_bert`); ``transformers`` truncates to the same length with
  ``truncation=True``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from ...errors import TokenizerError
from ...fileio import read_json, read_text
from .pretrained import (
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    AddedTokenSpec,
    EncodedBatch,
    PretrainedTokenizer,
    add_tokens,
    checked_special_tokens,
    model_max_length,
    read_added_tokens,
    read_special_tokens,
)
from .pretrained import WORDPIECE_VOCAB_FILE as VOCAB_FILE

__all__ = ["AddedTokenSpec", "EncodedBatch", "TokenizerError", "VOCAB_FILE", "WordPieceTokenizer"]
SPECIAL_DEFAULTS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}


class WordPieceTokenizer(PretrainedTokenizer):
    """Encode single sentences and pairs exactly as a BERT checkpoint's ``transformers`` tokenizer does."""

    def __init__(self, tokens: Sequence[str], *, do_lower_case: bool = True, strip_accents: Optional[bool] = None,
                 tokenize_chinese_chars: bool = True, max_length: Optional[int] = None,
                 special_tokens: Optional[dict[str, str]] = None, added_tokens: Sequence[AddedTokenSpec] = ()
                 ) -> None:
        """``tokens``: the vocabulary in id order (``vocab.txt``'s lines); ``special_tokens``: role -> token, roles
        as in :data:`SPECIAL_DEFAULTS`. ``strip_accents=None`` follows ``do_lower_case``, as in BERT."""
        self._tokens = list(tokens)
        self.vocab = {token: index for index, token in enumerate(self._tokens)}  # a repeated line: the last id wins
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.max_length = max_length
        self.special_tokens = checked_special_tokens(SPECIAL_DEFAULTS, special_tokens, self.vocab, VOCAB_FILE)
        self.added_tokens = self._all_added(added_tokens)
        self._backend = self._build()

    def _all_added(self, extra: Sequence[AddedTokenSpec]) -> list[AddedTokenSpec]:
        specials = [AddedTokenSpec(token, self.vocab[token]) for token in self.special_tokens.values()]
        seen = {spec.content for spec in specials}
        return specials + [spec for spec in extra if spec.content not in seen]

    def _build(self) -> Tokenizer:
        backend = Tokenizer(WordPiece(self.vocab, unk_token=self.special_tokens["unk_token"],
                                      max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(clean_text=True,
                                                        handle_chinese_chars=self.tokenize_chinese_chars,
                                                        strip_accents=self.strip_accents,
                                                        lowercase=self.do_lower_case)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        cls, sep = self.special_tokens["cls_token"], self.special_tokens["sep_token"]
        # BERT's template ([CLS] a [SEP], [CLS] a [SEP] b [SEP], token types 0 then 1) given as tokens, not as
        # TemplateProcessing's text, which cannot spell a token holding a space or a ':' ("[CLS]:0")
        backend.post_processor = processors.BertProcessing((sep, self.vocab[sep]), (cls, self.vocab[cls]))
        add_tokens(backend, self.added_tokens, VOCAB_FILE)
        return backend

    @classmethod
    def from_pretrained(cls, directory: Union[str, Path], *, max_length: Optional[int] = None
                        ) -> "WordPieceTokenizer":
        """Read ``vocab.txt`` (or the vocabulary inside ``tokenizer.json``) and ``tokenizer_config.json``.

        ``max_length`` caps the checkpoint's ``model_max_length`` (the importer passes the position table size).
        """
        directory = Path(directory)
        settings = read_json(directory / TOKENIZER_CONFIG_FILE, TokenizerError, optional=True, within=directory)
        special_map = read_json(directory / SPECIAL_TOKENS_FILE, TokenizerError, optional=True, within=directory)
        backend_file = read_json(directory / TOKENIZER_FILE, TokenizerError, optional=True, within=directory)
        tokens = _read_vocab(directory, backend_file)
        specials = read_special_tokens(settings, special_map, SPECIAL_DEFAULTS)
        limit = model_max_length(settings, max_length)
        return cls(tokens, do_lower_case=bool(settings.get("do_lower_case", True)),
                   strip_accents=settings.get("strip_accents"),
                   tokenize_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)), max_length=limit,
                   special_tokens=specials, added_tokens=read_added_tokens(settings, backend_file))

    @property
    def tokens(self) -> list[str]:
        """The WordPiece vocabulary in id order (``vocab.txt``'s lines)."""
        return list(self._tokens)

    def token_id(self, role: str) -> int:
        """The id of a special token by role: its ``vocab.txt`` line (the last one when a token repeats)."""
        return self.vocab[self.special_tokens[role]]

    def save_pretrained(self, directory: Union[str, Path]) -> list[Path]:
        """Write ``vocab.txt``, ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` in the
        layout ``transformers.AutoTokenizer`` loads as a ``BertTokenizer``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        settings: dict[str, Any] = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.do_lower_case,
                                    "strip_accents": self.strip_accents,
                                    "tokenize_chinese_chars": self.tokenize_chinese_chars, **self.special_tokens}
        return self._write_files(directory, {VOCAB_FILE: "".join(f"{token}\n" for token in self._tokens)}, settings)


def _read_vocab(directory: Path, backend_file: dict[str, Any]) -> list[str]:
    """``vocab.txt`` lines (as ``transformers``: only the newline stripped), else ``tokenizer.json``'s vocabulary."""
    path = directory / VOCAB_FILE
    if os.path.lexists(path):
        text = read_text(path, TokenizerError, within=directory)
        return [line.rstrip("\n") for line in text.splitlines(keepends=True)]
    model = backend_file.get("model", {})
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        found = f"a {model.get('type')} model in {TOKENIZER_FILE}" if model else "neither file"
        raise TokenizerError(f"{directory} has no WordPiece vocabulary: expected {VOCAB_FILE} or a WordPiece "
                             f"{TOKENIZER_FILE}, found {found}")
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    if [index for _, index in by_id] != list(range(len(by_id))):
        raise TokenizerError(f"{directory / TOKENIZER_FILE}: the WordPiece vocabulary ids are not 0..{len(by_id) - 1}")
    return [token for token, _ in by_id]
