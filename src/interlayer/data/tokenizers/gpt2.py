"""GPT-2's tokenizer in and out: a checkpoint's byte-level BPE as the language-modelling task's tokenizer.

Why the language-modelling tokenizer and not :class:`~.byte_level_bpe.BPETokenizer`: a GPT-2 reads plain running text
(``GPT2Tokenizer`` adds no ``<s>``/``</s>``, and GPT-2 has no padding token), and the ``lm`` task needs what
:class:`~.language_model.ByteBPETokenizer` knows: the UTF-8 bytes every token spells (bits per byte), lossless
decoding, and saving with a run. So the checkpoint's pipeline is rebuilt with the pieces
:mod:`interlayer.data.tokenizers.byte_level_bpe` uses for RoBERTa (the vocabulary and merges of ``tokenizer.json`` or
``vocab.json`` + ``merges.txt``, :func:`~interlayer.data.tokenizers.byte_level_bpe.byte_level_backend` without a
post-processor) and wrapped in the task's tokenizer; ids equal ``transformers``' ``AutoTokenizer`` (tested).

* **Special tokens**: ``<|endoftext|>`` (GPT-2's bos, eos and unk) and any added token of ``tokenizer.json`` or
  ``tokenizer_config.json`` are matched in the text as ``transformers`` matches them; a special role naming a
  token outside the vocabulary is left out (``transformers`` would append it with a new id the model's table does
  not have).
* **``add_prefix_space=true`` is refused**: the task encodes a long text in pieces (split before newlines, which
  the pre-tokenizer never merges across), and a prefix space would be added to every piece.
* **Export** (:func:`save_gpt2_tokenizer`) writes ``vocab.json``, ``merges.txt`` and a ``GPT2Tokenizer``
  ``tokenizer_config.json``, for a checkpoint's tokenizer and for one the ``lm`` task trained alike.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from ...errors import TokenizerError
from ...fileio import read_json
from .byte_level_bpe import byte_level_backend, read_bpe
from .language_model import ByteBPETokenizer
from .pretrained import (
    BPE_VOCAB_FILE,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    AddedTokenSpec,
    add_tokens,
    read_added_tokens,
    read_special_tokens,
)

END_OF_TEXT = "<|endoftext|>"
GPT2_SPECIALS = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}


def load_gpt2_tokenizer(directory: Union[str, Path]) -> ByteBPETokenizer:
    """The byte-level BPE of a GPT-2 folder (see the module docstring)."""
    directory = Path(directory)
    settings = read_json(directory / TOKENIZER_CONFIG_FILE, TokenizerError, optional=True, within=directory)
    if settings.get("add_prefix_space"):
        raise TokenizerError(f"{directory / TOKENIZER_CONFIG_FILE}: add_prefix_space=true is not supported for a "
                             "language model (the text is encoded in pieces and each would gain a leading space); "
                             "set it to false")
    backend_file = read_json(directory / TOKENIZER_FILE, TokenizerError, optional=True, within=directory)
    vocab, merges = read_bpe(directory, backend_file)
    backend = byte_level_backend(vocab, merges, add_prefix_space=False)
    declared = read_added_tokens(settings, backend_file)
    named = {spec.content for spec in declared}
    specials = read_special_tokens(settings, read_json(directory / SPECIAL_TOKENS_FILE, TokenizerError, optional=True,
                                                                   within=directory), GPT2_SPECIALS)
    implied = [AddedTokenSpec(token, vocab[token]) for token in dict.fromkeys(specials.values())
               if token in vocab and token not in named]
    add_tokens(backend, declared + implied, BPE_VOCAB_FILE)
    return ByteBPETokenizer(backend)


def end_of_text_id(tokenizer: Any) -> Optional[int]:
    """The id of ``<|endoftext|>`` (GPT-2's bos and eos), or None when the tokenizer has none (a character
    tokenizer, a byte-level BPE the ``lm`` task trained)."""
    return tokenizer.tokenizer.token_to_id(END_OF_TEXT) if isinstance(tokenizer, ByteBPETokenizer) else None


def save_gpt2_tokenizer(tokenizer: ByteBPETokenizer, directory: Union[str, Path], *,
                        max_length: Optional[int] = None) -> list[Path]:
    """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` that ``transformers.AutoTokenizer`` loads
    as a ``GPT2Tokenizer`` with the same ids; ``max_length`` is its ``model_max_length`` (the position table)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backend = tokenizer.tokenizer
    files = [Path(name) for name in backend.model.save(str(directory))]
    added = {str(index): {"content": token.content, "lstrip": token.lstrip, "rstrip": token.rstrip,
                          "normalized": token.normalized, "single_word": token.single_word,
                          "special": token.special}
             for index, token in sorted(backend.get_added_tokens_decoder().items())}
    special = END_OF_TEXT if end_of_text_id(tokenizer) is not None else None
    settings: dict[str, Any] = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
                                "add_bos_token": False, "errors": "replace", "added_tokens_decoder": added,
                                **{role: special for role in GPT2_SPECIALS}}
    if max_length is not None:
        settings["model_max_length"] = max_length
    config = directory / TOKENIZER_CONFIG_FILE
    config.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return files + [config]
