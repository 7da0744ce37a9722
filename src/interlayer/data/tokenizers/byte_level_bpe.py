"""RoBERTa's byte-level BPE tokenizer, rebuilt from a checkpoint's vocabulary and merges with ``tokenizers``.

The pipeline is the one ``transformers`` builds for ``RobertaTokenizer`` (GPT-2's byte-level BPE, Radford et al.
2019, as RoBERTa uses it, Liu et al. 2019 Sec. 4.4): no normaliser, the byte-level pre-tokeniser (spaces are part
of the following token; ``add_prefix_space`` from ``tokenizer_config.json``, default off), BPE over bytes with the
checkpoint's merges and no unknown token, then ``<s> a </s>`` or ``<s> a </s></s> b </s>``.

Choices, each matching ``transformers`` so that ids are identical:

* **The pipeline is rebuilt from the vocabulary and merges**: those of the BPE model inside ``tokenizer.json``
  when present, else ``vocab.json`` + ``merges.txt``. ``transformers`` 5 also rebuilds the pipeline rather than
  taking ``tokenizer.json`` whole (which may carry its exporter's padding or truncation). ``add_prefix_space``,
  ``trim_offsets``, the special tokens and ``added_tokens_decoder`` come from ``tokenizer_config.json``.
* **Token types are all 0.** RoBERTa has one token type (``type_vocab_size=1``) and its tokenizer returns no
  ``token_type_ids``, so the model reads type 0 everywhere, pairs included.
* **Truncation** is longest-first over the pair to ``max_length`` tokens including ``<s>``/``</s>``, as with
  ``truncation=True``; the default length is ``model_max_length``, capped by the importer at what the position
  table can number (``max_position_embeddings - pad_token_id - 1``, i.e. 512 for RoBERTa's 514 rows).
* **Not supported**: a ``tokenizer.json`` whose model is not BPE (XLM-R's SentencePiece Unigram): the importer then
  loads the model without a tokenizer and says so, rather than tokenise differently from ``transformers``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from ...errors import TokenizerError
from ...fileio import read_json, read_text
from .pretrained import (
    BPE_MERGES_FILE,
    BPE_VOCAB_FILE,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    AddedTokenSpec,
    PretrainedTokenizer,
    add_tokens,
    checked_special_tokens,
    model_max_length,
    read_added_tokens,
    read_special_tokens,
)

SPECIAL_DEFAULTS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
                    "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"}


class BPETokenizer(PretrainedTokenizer):
    """Encode single sentences and pairs exactly as a RoBERTa checkpoint's ``transformers`` tokenizer does."""

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]], *, add_prefix_space: bool = False,
                 trim_offsets: bool = True, max_length: Optional[int] = None,
                 special_tokens: Optional[dict[str, str]] = None, added_tokens: Sequence[AddedTokenSpec] = ()
                 ) -> None:
        """``vocab``: token -> id (``vocab.json``); ``merges``: the BPE merges in priority order (``merges.txt``)."""
        self.vocab = dict(vocab)
        self.merges = [tuple(merge) for merge in merges]
        self.add_prefix_space = add_prefix_space
        self.trim_offsets = trim_offsets
        self.max_length = max_length
        self.special_tokens = checked_special_tokens(SPECIAL_DEFAULTS, special_tokens, self.vocab, BPE_VOCAB_FILE)
        specials = list(dict.fromkeys(self.special_tokens.values()))
        declared = {spec.content: spec for spec in added_tokens}  # their lstrip/rstrip/... settings win
        self.added_tokens = [declared.get(token, AddedTokenSpec(token, self.vocab[token])) for token in specials]
        self.added_tokens += [spec for spec in added_tokens if spec.content not in specials]
        self._backend = self._build()

    def _build(self) -> Tokenizer:
        backend = byte_level_backend(self.vocab, self.merges, self.add_prefix_space)
        cls, sep = self.special_tokens["cls_token"], self.special_tokens["sep_token"]
        backend.post_processor = processors.RobertaProcessing((sep, self.vocab[sep]), (cls, self.vocab[cls]),
                                                              trim_offsets=self.trim_offsets,
                                                              add_prefix_space=self.add_prefix_space)
        add_tokens(backend, self.added_tokens, BPE_VOCAB_FILE)
        return backend

    @classmethod
    def from_pretrained(cls, directory: Union[str, Path], *, max_length: Optional[int] = None) -> "BPETokenizer":
        """Read the BPE model of ``tokenizer.json`` (or ``vocab.json`` + ``merges.txt``) and
        ``tokenizer_config.json``; ``max_length`` caps the checkpoint's ``model_max_length``."""
        directory = Path(directory)
        settings = read_json(directory / TOKENIZER_CONFIG_FILE, TokenizerError, optional=True, within=directory)
        special_map = read_json(directory / SPECIAL_TOKENS_FILE, TokenizerError, optional=True, within=directory)
        backend_file = read_json(directory / TOKENIZER_FILE, TokenizerError, optional=True, within=directory)
        vocab, merges = read_bpe(directory, backend_file)
        specials = read_special_tokens(settings, special_map, SPECIAL_DEFAULTS)
        return cls(vocab, merges, add_prefix_space=bool(settings.get("add_prefix_space", False)),
                   trim_offsets=bool(settings.get("trim_offsets", True)),
                   max_length=model_max_length(settings, max_length), special_tokens=specials,
                   added_tokens=read_added_tokens(settings, backend_file))

    @property
    def tokens(self) -> list[str]:
        """Every token in id order (byte-level strings: a leading ``Ġ`` is a space)."""
        by_id = self._backend.get_vocab(with_added_tokens=True)
        return [token for token, _ in sorted(by_id.items(), key=lambda item: item[1])]

    def _types(self, encoding: Any) -> list[int]:
        return [0] * len(encoding.ids)

    def save_pretrained(self, directory: Union[str, Path]) -> list[Path]:
        """Write ``vocab.json``, ``merges.txt``, ``tokenizer.json``, ``tokenizer_config.json`` and
        ``special_tokens_map.json`` in the layout ``transformers.AutoTokenizer`` loads as a ``RobertaTokenizer``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        added = {str(spec.id): {"content": spec.content, "lstrip": spec.lstrip, "rstrip": spec.rstrip,
                                "normalized": spec.normalized, "single_word": spec.single_word,
                                "special": spec.special} for spec in self.added_tokens}
        settings: dict[str, Any] = {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": self.add_prefix_space,
                                    "trim_offsets": self.trim_offsets, "errors": "replace",
                                    "added_tokens_decoder": added, **self.special_tokens}
        return self._write_files(directory, {
            BPE_VOCAB_FILE: json.dumps(self.vocab, ensure_ascii=False) + "\n",
            BPE_MERGES_FILE: "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in self.merges)}, settings)


def byte_level_backend(vocab: dict[str, int], merges: Sequence[tuple[str, str]], add_prefix_space: bool
                       ) -> Tokenizer:
    """GPT-2's byte-level BPE pipeline (no normaliser, no unknown token, no post-processor) on a vocabulary and
    merges; RoBERTa adds its ``<s> ... </s>`` post-processor on top, GPT-2 uses it as it is."""
    backend = Tokenizer(BPE(vocab=vocab, merges=list(merges), dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    return backend


def read_bpe(directory: Path, backend_file: dict[str, Any]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges from ``tokenizer.json``'s BPE model when present, else ``vocab.json`` + ``merges.txt``."""
    model = backend_file.get("model", {})
    if model.get("type") == "BPE" and isinstance(model.get("vocab"), dict):
        source = directory / TOKENIZER_FILE
        return _checked_vocab(dict(model["vocab"]), source), [tuple(m) if isinstance(m, list) else _merge(m, source)
                                                              for m in model.get("merges", [])]
    vocab_path, merges_path = directory / BPE_VOCAB_FILE, directory / BPE_MERGES_FILE
    if os.path.lexists(vocab_path) and os.path.lexists(merges_path):
        lines = read_text(merges_path, TokenizerError, within=directory).splitlines()
        vocab = _checked_vocab(read_json(vocab_path, TokenizerError, within=directory), vocab_path)
        return vocab, [_merge(line, merges_path) for line in lines if line and not line.startswith("#version")]
    found = f"a {model.get('type')} model in {TOKENIZER_FILE}" if model else "neither"
    raise TokenizerError(f"{directory} has no byte-level BPE vocabulary: expected a BPE {TOKENIZER_FILE} or "
                         f"{BPE_VOCAB_FILE} + {BPE_MERGES_FILE}, found {found} (SentencePiece tokenizers such as "
                         "XLM-R's are not supported)")


def _checked_vocab(vocab: dict[str, Any], source: Path) -> dict[str, int]:
    """``vocab`` if its ids are the integers 0..len-1, each once (a BPE vocabulary is dense): an id of 10^9 would
    size the embedding table by it, a string id would fail deep in the tokenizer library."""
    seen: dict[int, str] = {}
    for token, index in vocab.items():
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(vocab):
            raise TokenizerError(f"{source}: token {token!r} has the id {index!r}; the ids of a vocabulary of "
                                 f"{len(vocab)} tokens are the integers 0..{len(vocab) - 1}")
        if index in seen:
            raise TokenizerError(f"{source}: tokens {seen[index]!r} and {token!r} share the id {index}")
        seen[index] = token
    return vocab


def _merge(line: str, source: Path) -> tuple[str, str]:
    parts = line.split(" ")
    if len(parts) != 2:
        raise TokenizerError(f"{source}: merge {line!r} is not two space-separated symbols")
    return parts[0], parts[1]
