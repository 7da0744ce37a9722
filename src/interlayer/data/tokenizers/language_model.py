"""Tokenizers of the language-modelling task: characters, or byte-level BPE trained with ``tokenizers``.

Both are lossless (decoding the ids of a text gives the text back) and both know how many UTF-8 bytes and
characters of the text each token stands for, which is what makes bits per character and bits per byte honest:
the total negative log-likelihood of the predicted tokens divided by the characters (bytes) those tokens spell.

* **char** (nanoGPT's ``shakespeare_char``): one id per character; the vocabulary is every character of the corpus
  (all splits, as nanoGPT builds it), sorted. A character outside it (in a prompt) raises naming it.
* **bpe**: GPT-2's byte-level BPE (Radford et al. 2019): text is split by GPT-2's pre-tokenizer pattern, each
  piece is read as bytes (a 256-symbol alphabet, so nothing is ever unknown) and merged by BPE, trained on the
  training split only with ``tokenizers`` (offline). No normaliser and no special tokens, so the ids spell the
  text's bytes exactly (checked when a split is encoded). A pretrained GPT-2's tokenizer (:mod:`.gpt2`) is the
  same pipeline with the checkpoint's vocabulary, merges and added tokens (``<|endoftext|>``), which spell their
  own text.

**On disk** (:func:`save_tokenizer`): ``tokenizer.json`` is a real Hugging Face ``tokenizers`` pipeline, so that
``transformers.AutoTokenizer`` (and ``tokenizers.Tokenizer.from_file``) load it with the same ids: the BPE as
trained; the characters as a ``WordLevel`` vocabulary (id order = code-point order) behind a pre-tokenizer that
isolates every character and a ``Fuse`` decoder (decoding joins the characters without spaces). Beside it,
``tokenizer_config.json`` (``PreTrainedTokenizerFast``, no cleaning of spaces on decoding, the special tokens the
vocabulary has: GPT-2's ``<|endoftext|>`` as bos/eos/unk) and ``special_tokens_map.json``; its
``interlayer_tokenizer`` entry (``"char"``/``"bpe"``) tells interlayer which of the two it is. Folders written
before this format (``tokenizer.json`` holding ``{"kind": ..., ...}``, interlayer's own wrapper) still load.

A character vocabulary has no special token of its own, and ``transformers`` needs two: an unknown token (without
one, an unseen character fails inside ``tokenizers`` with "WordLevel error: Missing [UNK] token") and a pad token
(without one, ``pipeline`` refuses to batch). ``tokenizer.json`` therefore adds ``[UNK]`` and ``[PAD]`` after the
characters (ids ``V`` and ``V + 1`` of a ``V``-character vocabulary, which the model's table does not have): padding
is never read by an interlayer model (:class:`~interlayer.core.lm.CausalLM` reads any id there), and an ``[UNK]``
it is asked to read is refused naming the id (:func:`~interlayer.core.hf_generation.generate_like_hf`).
``split_special_tokens`` keeps a literal "[PAD]" in a text five characters, as interlayer encodes it. (A GPT-2
export leaves them out, :func:`save_tokenizer`'s ``char_specials``: ``transformers``' GPT-2 reads every id.)

Both tokenizers are callable as ``transformers``' are: ``tokenizer(texts, return_tensors="pt")`` gives
``input_ids`` and ``attention_mask`` (:meth:`LMTokenizerMixin.__call__`).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import Tensor

from ...errors import DataError
from ...fileio import read_json, write_atomic

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
KIND_KEY = "interlayer_tokenizer"  # tokenizer_config.json: which interlayer tokenizer the folder holds
END_OF_TEXT = "<|endoftext|>"  # GPT-2's bos, eos and unk token
CHAR_UNK, CHAR_PAD = "[UNK]", "[PAD]"  # a character tokenizer.json's unknown and pad tokens, after the characters
Kind = Literal["char", "bpe"]


class LMTokenizerMixin:
    """``transformers``' call on a language-model tokenizer: ``tokenizer(text_or_texts, return_tensors="pt")``."""

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    @property
    def pad_id(self) -> int:
        """The id padding is written with (the attention mask says it is padding): ``<|endoftext|>`` when the
        vocabulary has it (as ``transformers`` users pad GPT-2), else 0."""
        special = self.special_id(END_OF_TEXT)
        return 0 if special is None else special

    def special_id(self, token: str) -> Optional[int]:
        return None

    def __call__(self, text: Union[str, Sequence[str]], *, return_tensors: Optional[str] = None,
                 padding: Union[bool, str] = True, padding_side: Literal["right", "left"] = "right",
                 truncation: bool = False, max_length: Optional[int] = None) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` of one text or a batch, as ``transformers`` returns them: lists, or
        ``(B, T)`` tensors with ``return_tensors="pt"`` (a single text is a batch of one then). A batch of
        different lengths is padded (``padding``: True/"longest"; False refuses tensors of different lengths) with
        :attr:`pad_id` on ``padding_side`` ("left" for generation); ``truncation`` keeps the first ``max_length``
        tokens."""
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors={return_tensors!r}: interlayer's tokenizers return lists (None) or "
                             "PyTorch tensors ('pt')")
        single = isinstance(text, str)
        rows = [self.encode(t) for t in ([text] if single else text)]
        if truncation and max_length is not None:
            rows = [row[:max_length] for row in rows]
        masks = [[1] * len(row) for row in rows]
        width = max((len(row) for row in rows), default=0)
        if padding and padding != "do_not_pad":
            pad = [width - len(row) for row in rows]
            if padding_side == "left":
                rows = [[self.pad_id] * n + row for n, row in zip(pad, rows)]
                masks = [[0] * n + mask for n, mask in zip(pad, masks)]
            else:
                rows = [row + [self.pad_id] * n for n, row in zip(pad, rows)]
                masks = [mask + [0] * n for n, mask in zip(pad, masks)]
        if return_tensors == "pt":
            if len({len(row) for row in rows}) > 1:
                raise ValueError("texts of different lengths need padding=True to become one tensor")
            return {"input_ids": torch.tensor(rows, dtype=torch.long).view(len(rows), -1),
                    "attention_mask": torch.tensor(masks, dtype=torch.long).view(len(rows), -1)}
        if single:
            return {"input_ids": rows[0], "attention_mask": masks[0]}
        return {"input_ids": rows, "attention_mask": masks}


class CharTokenizer(LMTokenizerMixin):
    """Every character of the training text is a token (nanoGPT's ``shakespeare_char``), in sorted order; saved with the
    run, so a resumed or evaluated run reads the same ids."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = sorted(chars)  # by code point, which encode's lookup relies on

    @classmethod
    def train(cls, texts: Sequence[str]) -> "CharTokenizer":
        return cls(sorted(set().union(*map(set, texts))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return self._encode(text).tolist()

    def _encode(self, text: str) -> np.ndarray:
        """Ids of ``text``'s characters (vectorised: the code points looked up in the sorted vocabulary)."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        known = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        ids = np.searchsorted(known, codes).clip(max=len(known) - 1)
        unknown = np.flatnonzero(known[ids] != codes)
        if len(unknown):
            position = int(unknown[0])
            raise DataError(f"character {text[position]!r} (at position {position}) is not in the model's "
                            f"vocabulary of {len(self)} characters: {''.join(self.chars)!r}")
        return ids

    def encode_tensor(self, text: str) -> Tensor:
        return torch.from_numpy(self._encode(text).astype(np.int64))

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def byte_lengths(self) -> Tensor:
        return torch.tensor([len(c.encode("utf-8")) for c in self.chars], dtype=torch.long)

    def special_id(self, token: str) -> Optional[int]:
        """The id ``tokenizer.json`` gives ``[UNK]`` or ``[PAD]`` (module docstring): past the characters."""
        return {CHAR_UNK: len(self.chars), CHAR_PAD: len(self.chars) + 1}.get(token)

    def to_json(self) -> dict:
        """The compact form a token folder's ``meta.json`` and ``prepare lm``'s workers carry."""
        return {"kind": self.kind, "chars": "".join(self.chars)}

    def backend(self, specials: bool = True) -> Tokenizer:
        """The same tokenisation as a ``tokenizers`` pipeline (module docstring), what ``tokenizer.json`` holds;
        ``specials``: with ``[UNK]`` and ``[PAD]`` after the characters."""
        vocab = {c: i for i, c in enumerate(self.chars)}
        if specials:
            vocab.update({CHAR_UNK: len(self.chars), CHAR_PAD: len(self.chars) + 1})
        backend = Tokenizer(models.WordLevel(vocab, unk_token=CHAR_UNK if specials else None))
        backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        backend.decoder = decoders.Fuse()
        if specials:
            backend.add_special_tokens([CHAR_UNK, CHAR_PAD])
        return backend


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's map from the 256 printable stand-in characters of byte-level BPE back to byte values."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


# A split between a non-space character and a newline is always a boundary of GPT-2's pre-tokenizer (no piece holds
# both), and each side is pre-tokenized as in the whole text (a whitespace run is split by what follows it, which
# stays in its chunk), so encoding the pieces in parallel gives exactly the ids of the whole text at once (tested).
CHUNK_BOUNDARY = re.compile(r"(?<=\S)(?=\n)")


class ByteBPETokenizer(LMTokenizerMixin):
    """GPT-2's byte-level BPE trained with ``tokenizers`` on the training split (or a checkpoint's vocabulary and
    merges): lossless, no normaliser, no special tokens; each token's UTF-8 bytes are known (bits per byte)."""

    kind = "bpe"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        alphabet = _byte_alphabet()
        vocab = tokenizer.get_vocab()
        added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
        self._bytes = [b""] * len(vocab)
        for token, index in vocab.items():  # an added token (GPT-2's <|endoftext|>) is matched, and spelled, literally
            self._bytes[index] = token.encode("utf-8") if token in added else bytes(alphabet[c] for c in token)

    @classmethod
    def train(cls, texts: Sequence[str], vocab_size: int) -> "ByteBPETokenizer":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        chunks = CHUNK_BOUNDARY.split(text)
        ids = [i for encoding in self.tokenizer.encode_batch(chunks) for i in encoding.ids]
        spelled = sum(len(self._bytes[i]) for i in ids)
        if spelled != len(text.encode("utf-8")):
            raise DataError(f"byte-level BPE spelled {spelled} bytes for a text of {len(text.encode('utf-8'))}; "
                            "the tokenizer is not lossless (was it trained by interlayer?)")
        return ids

    def encode_tensor(self, text: str) -> Tensor:
        return torch.tensor(self.encode(text), dtype=torch.long)

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")

    def byte_lengths(self) -> Tensor:
        return torch.tensor([len(b) for b in self._bytes], dtype=torch.long)

    def special_id(self, token: str) -> Optional[int]:
        added = {t.content for t in self.tokenizer.get_added_tokens_decoder().values()}
        return self.tokenizer.token_to_id(token) if token in added else None

    def to_json(self) -> dict:
        """The compact form a token folder's ``meta.json`` and ``prepare lm``'s workers carry."""
        return {"kind": self.kind, "tokenizer": self.tokenizer.to_str()}

    def backend(self) -> Tokenizer:
        return self.tokenizer


class IdTokenizer:
    """The vocabulary of a pre-tokenized corpus that came without its tokenizer (:mod:`.token_files`): ``size`` ids
    and no text. It cannot encode text; it decodes an id as ``<id>`` (a sample, the labels of an attention map), and
    knows no bytes, so the scores have no bits per character or byte."""

    kind = "ids"

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> list[int]:
        raise DataError(f"this language model was trained on token ids without a tokenizer ({self.size} ids), so it "
                        "cannot read text; prepare the corpus with `interlayer prepare lm` (which keeps the tokenizer "
                        "in meta.json), or give the ids directly from Python")

    def encode_tensor(self, text: str) -> Tensor:
        return torch.tensor(self.encode(text), dtype=torch.long)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def byte_lengths(self) -> None:
        return None

    def to_json(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.size}


LMTokenizer = Union[CharTokenizer, ByteBPETokenizer, IdTokenizer]


def train_tokenizer(kind: Kind, train: str, all_text: Sequence[str], vocab_size: int) -> LMTokenizer:
    """``char``: the characters of ``all_text`` (every split); ``bpe``: BPE of ``vocab_size`` on ``train`` alone."""
    if kind == "char":
        return CharTokenizer.train(all_text)
    return ByteBPETokenizer.train(CHUNK_BOUNDARY.split(train), vocab_size)


def save_tokenizer(tokenizer: LMTokenizer, directory: Path, *, max_length: Optional[int] = None,
                   char_specials: bool = True) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` (module docstring);
    ``max_length``: ``model_max_length`` (the model's positions), when known; ``char_specials``: a character
    vocabulary's ``[UNK]`` and ``[PAD]`` (for a model that reads padding with any id)."""
    directory = Path(directory)
    if isinstance(tokenizer, IdTokenizer):  # ids without text (a token folder's): nothing transformers could load
        write_atomic(directory / TOKENIZER_FILE, json.dumps(tokenizer.to_json()))
        return
    specials: dict[str, str] = {}
    if isinstance(tokenizer, CharTokenizer) and char_specials:
        specials = {"unk_token": CHAR_UNK, "pad_token": CHAR_PAD}
    elif tokenizer.special_id(END_OF_TEXT) is not None:
        specials = {role: END_OF_TEXT for role in ("bos_token", "eos_token", "unk_token")}
    settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", KIND_KEY: tokenizer.kind,
                                "clean_up_tokenization_spaces": False, "add_prefix_space": False, **specials}
    if isinstance(tokenizer, CharTokenizer) and char_specials:
        settings["split_special_tokens"] = True  # a literal "[PAD]" in a text is five characters (docstring)
    if max_length is not None:
        settings["model_max_length"] = max_length
    backend = tokenizer.backend(char_specials) if isinstance(tokenizer, CharTokenizer) else tokenizer.backend()
    write_atomic(directory / TOKENIZER_FILE, backend.to_str())
    write_atomic(directory / TOKENIZER_CONFIG_FILE, json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    write_atomic(directory / SPECIAL_TOKENS_FILE, json.dumps(specials, indent=2, ensure_ascii=False) + "\n")


def lm_tokenizer_kind(directory: Path) -> Optional[Kind]:
    """``"char"``/``"bpe"`` when ``directory`` holds a language-model tokenizer interlayer wrote (either format),
    else None."""
    directory = Path(directory)
    try:  # both files read inside the folder (a link leaving it is refused, fileio.confined)
        settings = read_json(directory / TOKENIZER_CONFIG_FILE, DataError, within=directory)
        if settings.get(KIND_KEY) in ("char", "bpe"):
            return settings[KIND_KEY]
    except (DataError, OSError, ValueError):
        pass
    try:
        wrapper = read_json(directory / TOKENIZER_FILE, DataError, within=directory)
    except (DataError, OSError, ValueError):
        return None
    return wrapper.get("kind") if isinstance(wrapper, dict) and wrapper.get("kind") in ("char", "bpe") else None


def load_lm_tokenizer(directory: Path) -> LMTokenizer:
    """The language-model tokenizer saved in ``directory``, in the format of :func:`save_tokenizer` or the one
    before it (``{"kind": "char", "chars": ...}`` / ``{"kind": "bpe", "tokenizer": ...}``)."""
    path = Path(directory) / TOKENIZER_FILE
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path} is missing: pass a language-model folder written by `interlayer train lm` "
                                "(RUN_DIR/best)")
    data = read_json(path, DataError, within=directory)
    if "kind" in data:  # the format before tokenizer.json was a tokenizers pipeline
        return tokenizer_from_json(data, str(path))
    kind = lm_tokenizer_kind(directory)
    if kind is None:
        raise DataError(f"{path} is not a language-model tokenizer interlayer wrote (no {KIND_KEY} in "
                        f"{TOKENIZER_CONFIG_FILE}, nor the older {{\"kind\": ...}} form)")
    backend = Tokenizer.from_str(json.dumps(data))
    if kind == "bpe":
        return ByteBPETokenizer(backend)
    by_id = sorted(((token, index) for token, index in backend.get_vocab().items()
                    if token not in (CHAR_UNK, CHAR_PAD)), key=lambda item: item[1])
    chars = [token for token, _ in by_id]
    if [index for _, index in by_id] != list(range(len(chars))) or chars != sorted(chars):
        raise DataError(f"{path}: a character vocabulary must number its characters 0.. in code-point order")
    return CharTokenizer(chars)


def tokenizer_from_json(data: dict, where: str) -> LMTokenizer:
    """The tokenizer :meth:`to_json` wrote (a run's ``tokenizer.json``, a token folder's ``meta.json``);
    ``where`` names the file in the error a malformed one raises."""
    kind = data.get("kind")
    if kind == "char" and isinstance(data.get("chars"), str):
        return chars_tokenizer(data["chars"], where)  # its characters in id order, checked
    try:
        if kind == "char":
            return CharTokenizer(list(data["chars"]))
        if kind == "bpe":
            return ByteBPETokenizer(Tokenizer.from_str(data["tokenizer"]))
        if kind == "ids":
            return IdTokenizer(int(data["vocab_size"]))
    except Exception as err:  # tokenizers raises its own exception types for a malformed tokenizer
        raise DataError(f"{where}: not a readable {kind} tokenizer ({type(err).__name__}: {err})") from None
    raise DataError(f"{where}: tokenizer kind {kind!r} is none of char, bpe, ids")


def chars_tokenizer(chars: str, where: str) -> CharTokenizer:
    """nanoGPT's character vocabulary (``meta.pkl``'s ``itos`` in id order, as ``meta.json``'s ``chars``): the same
    ids only if the characters are distinct and sorted by code point, as nanoGPT's ``prepare.py`` sorts them."""
    if list(chars) != sorted(set(chars)):
        raise DataError(f"{where}: chars must be distinct characters sorted by code point (nanoGPT's order); ids "
                        "would otherwise map to other characters")
    return CharTokenizer(list(chars))
