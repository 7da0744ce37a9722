"""What every checkpoint tokenizer offers, and finding the right one for a Hugging Face folder.

Two pipelines exist, both on Hugging Face ``tokenizers`` and both giving exactly ``transformers``' ids:
:class:`~interlayer.data.tokenizers.wordpiece.WordPieceTokenizer` (BERT, ELECTRA, DistilBERT: ``vocab.txt``) and
:class:`~interlayer.data.tokenizers.byte_level_bpe.BPETokenizer` (RoBERTa's byte-level BPE from ``vocab.json`` +
``merges.txt``, or any pipeline a ``tokenizer.json`` holds, e.g. XLM-R's SentencePiece). The text task only needs what
:class:`PretrainedTokenizer` declares: encode single texts or pairs (ids, token types, whether truncation cut), pad a
batch, the pad id and length limit, the tokens by id, and writing the files back.

Which one a folder needs (:func:`tokenizer_kind`): ``tokenizer_config.json``'s ``tokenizer_class`` when it names
a known class, else the files present (``vocab.txt`` or a WordPiece ``tokenizer.json`` is WordPiece;
``vocab.json`` + ``merges.txt`` or a BPE ``tokenizer.json`` is BPE). Other tokenizers (XLM-R's SentencePiece
Unigram) have no pipeline here. A folder whose ``tokenizer_config.json`` asks for its own tokenizer code
(``auto_map``, which ``AutoTokenizer.from_pretrained(..., trust_remote_code=True)`` would import and run) is refused:
interlayer never runs a folder's code, and its files alone do not say what that code does to a text.
"""
from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

import torch
from tokenizers import AddedToken, Tokenizer
from torch import Tensor

from ...errors import TokenizerError
from ...fileio import read_json
from .language_model import KIND_KEY as LM_KIND_KEY
from .language_model import SPECIAL_TOKENS_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

WORDPIECE_VOCAB_FILE = "vocab.txt"
BPE_VOCAB_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
# transformers writes model_max_length = int(1e30) when a tokenizer has no limit.
NO_LIMIT = 10**12
# tokenizer_class values of tokenizer_config.json -> the pipeline that reproduces them.
WORDPIECE_CLASSES = ("BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast",
                     "ElectraTokenizer", "ElectraTokenizerFast")
BPE_CLASSES = ("RobertaTokenizer", "RobertaTokenizerFast")
TokenizerKind = Literal["wordpiece", "bpe"]


class EncodedBatch(dict):
    """Padded model inputs, under ``transformers``' names as a dict (``input_ids``, ``token_type_ids``,
    ``attention_mask``: 1 where a token is read, so ``model(**batch)`` works on interlayer and ``transformers``
    models alike) and interlayer's as attributes: ``tokens`` and ``segments`` (token types) ``(B, T)``,
    ``padding_mask`` True at pads."""

    def __init__(self, tokens: Tensor, segments: Tensor, padding_mask: Tensor) -> None:
        super().__init__(input_ids=tokens, token_type_ids=segments, attention_mask=(~padding_mask).long())
        self.tokens, self.segments, self.padding_mask = tokens, segments, padding_mask

    def model_inputs(self) -> dict[str, Tensor]:
        """Keyword arguments of :class:`interlayer.core.models.EncoderClassifier.forward`, interlayer's names."""
        return {"tokens": self.tokens, "segments": self.segments, "key_padding_mask": self.padding_mask}


@dataclass(frozen=True)
class AddedTokenSpec:
    """A token added on top of a vocabulary (specials first); ``id`` is its id in the checkpoint."""

    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


class PretrainedTokenizer(ABC):
    """A checkpoint's tokenizer on a ``tokenizers`` backend (``self._backend``) with truncation to ``max_length``.

    Subclasses build the backend and write their files; encoding, padding and decoding are shared.
    """

    _backend: Tokenizer
    max_length: Optional[int]
    special_tokens: dict[str, str]

    @classmethod
    @abstractmethod
    def from_pretrained(cls, directory: Union[str, Path], *, max_length: Optional[int] = None
                        ) -> "PretrainedTokenizer":
        """Read the tokenizer files of ``directory``; ``max_length`` caps the checkpoint's ``model_max_length``."""

    @abstractmethod
    def save_pretrained(self, directory: Union[str, Path]) -> list[Path]:
        """Write files ``transformers.AutoTokenizer`` loads with the same ids."""

    def _write_files(self, directory: Path, vocabulary_files: dict[str, str], settings: dict[str, Any]
                     ) -> list[Path]:
        """Write ``vocabulary_files`` (name -> text), then ``tokenizer.json``, ``tokenizer_config.json`` (``settings``
        plus ``model_max_length`` when capped) and ``special_tokens_map.json``; the backend is saved untruncated,
        because truncation is applied per call here and a saved limit would shorten what ``transformers`` reads."""
        if self.max_length is not None:
            settings = {**settings, "model_max_length": self.max_length}
        self._backend.no_truncation()
        files = {**vocabulary_files, TOKENIZER_FILE: self._backend.to_str(),
                 TOKENIZER_CONFIG_FILE: json.dumps(settings, indent=2, ensure_ascii=False) + "\n",
                 SPECIAL_TOKENS_FILE: json.dumps(self.special_tokens, indent=2, ensure_ascii=False) + "\n"}
        for name, text in files.items():
            (directory / name).write_text(text, encoding="utf-8")
        return [directory / name for name in files]

    @property
    @abstractmethod
    def tokens(self) -> list[str]:
        """The vocabulary's tokens in id order (to label inputs, e.g. in attention-map pictures)."""

    @property
    def vocab_size(self) -> int:
        """Ids in use, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, role: str) -> int:
        """The id of a special token by role (``"pad_token"``, ``"cls_token"``, ...)."""
        index = self._backend.token_to_id(self.special_tokens[role])
        if index is None:
            raise TokenizerError(f"the {role} {self.special_tokens[role]!r} is not in the vocabulary")
        return index

    @property
    def pad_id(self) -> int:
        return self.token_id("pad_token")

    def encode(self, text: str, pair: Optional[str] = None, *, max_length: Optional[int] = None
               ) -> tuple[list[int], list[int]]:
        """Ids and token types of one text (or pair) with the checkpoint's special tokens, truncated."""
        encoding = self._encode_batch([text], None if pair is None else [pair], max_length)[0]
        return list(encoding.ids), self._types(encoding)

    def encode_many(self, texts: Sequence[str], pairs: Optional[Sequence[str]] = None, *,
                    max_length: Optional[int] = None) -> list[tuple[list[int], list[int], bool]]:
        """Ids, token types and whether truncation cut anything, per text (or pair): a whole data set in one call,
        unpadded, so that a task can count truncated inputs and batch by length itself."""
        encodings = self._encode_batch(list(texts), None if pairs is None else list(pairs), max_length)
        return [(list(e.ids), self._types(e), bool(e.overflowing)) for e in encodings]

    def __call__(self, texts: Union[str, Sequence[str]], pairs: Union[str, Sequence[str], None] = None, *,
                 max_length: Optional[int] = None, text_pair: Union[str, Sequence[str], None] = None,
                 return_tensors: Optional[str] = None, padding: Union[bool, str] = True,
                 truncation: bool = True) -> EncodedBatch:
        """Encode a batch (optionally of pairs; a single text is a batch of one) and right-pad it with the pad
        token (token type 0) to its longest, truncating to ``max_length`` (default: the checkpoint's).

        ``transformers``' call works too: ``tokenizer(texts, text_pair=..., return_tensors="pt", padding=True,
        truncation=True)`` returns ``input_ids``, ``token_type_ids`` and ``attention_mask``; the values are
        always PyTorch tensors (``return_tensors`` None or ``"pt"``) and batches are always padded."""
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors={return_tensors!r}: interlayer's tokenizers return PyTorch tensors "
                             "('pt')")
        if not padding or not truncation:
            raise ValueError("interlayer's tokenizers always pad a batch to its longest and truncate at max_length "
                             "(padding=False / truncation=False are not available)")
        if text_pair is not None:
            pairs = one_of_texts(pairs, text_pair)
        texts = [texts] if isinstance(texts, str) else texts
        pairs = [pairs] if isinstance(pairs, str) else pairs
        rows = self.encode_many(texts, pairs, max_length=max_length)
        width = max(len(ids) for ids, _, _ in rows)
        tokens = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        segments = torch.zeros_like(tokens)
        padding_mask = torch.ones_like(tokens, dtype=torch.bool)
        for row, (ids, types, _) in enumerate(rows):
            tokens[row, : len(ids)] = torch.tensor(ids)
            segments[row, : len(ids)] = torch.tensor(types)
            padding_mask[row, : len(ids)] = False
        return EncodedBatch(tokens=tokens, segments=segments, padding_mask=padding_mask)

    def _types(self, encoding: Any) -> list[int]:
        """Token types as the model reads them (a pipeline without token types overrides this with zeros)."""
        return list(encoding.type_ids)

    def _encode_batch(self, texts: list[str], pairs: Optional[list[str]], max_length: Optional[int]) -> list[Any]:
        if not texts:
            raise ValueError("nothing to encode: texts is empty")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(pairs)} pairs")
        limit = self.max_length if max_length is None else max_length
        if limit is None:
            self._backend.no_truncation()
        else:
            self._backend.enable_truncation(limit, strategy="longest_first")
        inputs = texts if pairs is None else list(zip(texts, pairs, strict=True))
        return self._backend.encode_batch(inputs, add_special_tokens=True)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


def one_of_texts(pairs: Any, text_pair: Any) -> Any:
    """The second texts, given as ``pairs`` (interlayer) or ``text_pair`` (``transformers``), never both."""
    if pairs is not None:
        raise TypeError("got both pairs and text_pair; they name the same texts, pass one")
    return text_pair


def token_content(token: Union[str, dict[str, Any]]) -> str:
    """A special token given as a string or as a serialised ``AddedToken`` (``{"content": ...}``)."""
    return token["content"] if isinstance(token, dict) else str(token)


def model_max_length(settings: dict[str, Any], max_length: Optional[int]) -> Optional[int]:
    """``model_max_length`` of ``tokenizer_config.json`` (None when unlimited), capped at ``max_length``."""
    limit = settings.get("model_max_length")
    limit = limit if isinstance(limit, int) and limit < NO_LIMIT else None
    if max_length is not None:
        limit = max_length if limit is None else min(limit, max_length)
    return limit


def tokenizer_kind(directory: Union[str, Path]) -> Optional[TokenizerKind]:
    """Which pipeline reproduces the folder's tokenizer (see the module docstring); None when it has none, or
    when it is a language-model tokenizer interlayer wrote (:mod:`interlayer.data.tokenizers.language_model`)."""
    directory = Path(directory)
    settings = read_json(directory / TOKENIZER_CONFIG_FILE, TokenizerError, optional=True, within=directory)
    if "auto_map" in settings:
        code = json.dumps(settings["auto_map"])
        raise TokenizerError(f"{directory / TOKENIZER_CONFIG_FILE}: auto_map asks for the folder's own tokenizer code "
                             f"({code[:120]}), which interlayer never runs (a folder's code can do anything) and "
                             "cannot stand in for: refused. interlayer reads tokenizers defined by their files "
                             "(vocab.txt, vocab.json + merges.txt, tokenizer.json)")
    if settings.get(LM_KIND_KEY):
        return None
    declared = str(settings.get("tokenizer_class", ""))
    if declared in WORDPIECE_CLASSES:
        return "wordpiece"
    if declared in BPE_CLASSES:
        return "bpe"
    # lexists, not is_file: a link or a FIFO in the folder's place of a vocabulary is refused when it is read
    if os.path.lexists(directory / WORDPIECE_VOCAB_FILE):
        return "wordpiece"
    if os.path.lexists(directory / BPE_VOCAB_FILE) and os.path.lexists(directory / BPE_MERGES_FILE):
        return "bpe"
    backend = read_json(directory / TOKENIZER_FILE, TokenizerError, optional=True, within=directory
                        ).get("model", {}).get("type")
    return {"WordPiece": "wordpiece", "BPE": "bpe"}.get(backend)


def add_tokens(backend: Tokenizer, specs: Sequence[AddedTokenSpec], vocab_file: str) -> None:
    """Register the added tokens on ``backend`` in id order; each must land on its checkpoint id, which holds when
    they follow the vocabulary of ``vocab_file`` with consecutive ids."""
    for spec in sorted(specs, key=lambda s: s.id):
        token = AddedToken(spec.content, single_word=spec.single_word, lstrip=spec.lstrip, rstrip=spec.rstrip,
                           normalized=spec.normalized, special=spec.special)
        if spec.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        if backend.token_to_id(spec.content) != spec.id:
            raise TokenizerError(f"added token {spec.content!r} has id {spec.id} in the checkpoint but would get "
                                 f"id {backend.token_to_id(spec.content)}: added tokens outside {vocab_file} "
                                 "must follow it with consecutive ids")


def checked_special_tokens(defaults: dict[str, str], given: Optional[dict[str, str]], vocab: dict[str, int],
                           vocab_file: str) -> dict[str, str]:
    """Each special role's token (``given`` over ``defaults``), each checked to be in ``vocab``."""
    tokens = dict(defaults, **(given or {}))
    for role, token in tokens.items():
        if token not in vocab:
            raise TokenizerError(f"the {role} {token!r} is not in the vocabulary of {len(vocab)} tokens; set {role} "
                                 f"in {TOKENIZER_CONFIG_FILE} to a token of {vocab_file}")
    return tokens


def read_special_tokens(settings: dict[str, Any], special_map: dict[str, Any], defaults: dict[str, str]
                        ) -> dict[str, str]:
    """Each special role's token: ``tokenizer_config.json``, else ``special_tokens_map.json``, else the default."""
    return {role: token_content(settings.get(role, special_map.get(role, default))) for role, default in
            defaults.items()}


def read_added_tokens(settings: dict[str, Any], backend_file: dict[str, Any]) -> list[AddedTokenSpec]:
    """Added tokens of ``tokenizer.json`` and of ``tokenizer_config.json``'s ``added_tokens_decoder``."""
    entries = [dict(entry) for entry in backend_file.get("added_tokens", [])]
    entries += [dict(entry, id=int(index)) for index, entry in settings.get("added_tokens_decoder", {}).items()]
    specs: dict[str, AddedTokenSpec] = {}
    for entry in entries:
        specs.setdefault(entry["content"], AddedTokenSpec(
            content=entry["content"], id=int(entry["id"]), special=bool(entry.get("special", False)),
            lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
            single_word=bool(entry.get("single_word", False)), normalized=bool(entry.get("normalized", True))))
    return list(specs.values())
