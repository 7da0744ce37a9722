"""Tiny random GPT-2 models built by ``transformers`` (no download) in three shapes, and a byte-level BPE
tokenizer trained here and saved by ``transformers``' own ``GPT2Tokenizer``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

VOCAB, D, POSITIONS = 300, 16, 40
# initializer_range 0.2 (GPT-2's is 0.02): attention maps far from uniform, so PA's prediction shows in the outputs
BASE = dict(vocab_size=VOCAB, n_embd=D, n_positions=POSITIONS, bos_token_id=0, eos_token_id=0, initializer_range=0.2)
# case -> (model class, config fields)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "tied": ("GPT2LMHeadModel", dict(BASE, n_layer=2, n_head=2)),
    "untied": ("GPT2LMHeadModel", dict(BASE, n_layer=3, n_head=4, n_inner=24, activation_function="gelu",
                                       layer_norm_epsilon=1e-6, tie_word_embeddings=False)),
    "bare": ("GPT2Model", dict(BASE, n_layer=2, n_head=1, activation_function="relu")),
}
ADDED = "<| sep |>"  # outside the byte alphabet (spaces): spelled literally
TEXTS = ["To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer",
         "The quick brown fox jumps over the lazy dog. " * 3, "Ünïcödé, naïve café"]


def hf_gpt2(case: str, seed: int = 0) -> Any:
    model_class, fields = CASES[case]
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(transformers.GPT2Config(**fields)).eval()


def write_tokenizer(directory: Path) -> Any:
    """A byte-level BPE with <|endoftext|> (id 0) and an added token holding spaces (id VOCAB - 1), saved as
    transformers saves a GPT2Tokenizer."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 1, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(TEXTS, trainer=trainer)
    raw = directory / "raw"
    raw.mkdir(parents=True)
    backend.model.save(str(raw))
    tokenizer = transformers.GPT2Tokenizer(vocab=str(raw / "vocab.json"), merges=str(raw / "merges.txt"))
    tokenizer.add_special_tokens({"additional_special_tokens": [ADDED]})
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def gpt2_folder(directory: Path, case: str = "tied") -> Path:
    """A GPT-2 folder (``hf_gpt2(case)``) with :func:`write_tokenizer`'s tokenizer."""
    hf_gpt2(case).save_pretrained(str(directory))
    write_tokenizer(directory)
    return directory
