"""Subword vocabularies: byte-pair encoding trained with Hugging Face ``tokenizers``.

Pre-tokenization is *Metaspace* (SentencePiece style): spaces become part of the pieces ("▁word"), so decoding
is exact concatenation and the output is detokenized text, which is what sacreBLEU must score (BLEU on tokenized
text is not comparable across papers, Post 2018). Text is NFKC-normalised before training and encoding.

Special ids are fixed so that models and tokenizers agree without a lookup: ``<pad>``=0 (the core's default
``pad_id``), ``<s>``=1, ``</s>``=2, ``<unk>``=3.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ..errors import DataError
from ..fileio import read_json, write_atomic

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


class SubwordVocab:
    """One trained BPE tokenizer: ``encode`` to ids (no BOS/EOS), ``decode`` ids back to detokenized text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        for token, expected in zip(SPECIALS, range(4)):
            if tokenizer.token_to_id(token) != expected:
                raise ValueError(f"tokenizer must map {token} to id {expected}; was it trained by interlayer?")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> "SubwordVocab":
        """A BPE vocabulary of ``vocab_size`` pieces (the fixed specials first) learned from ``texts`` (the training
        split), keeping merges seen at least ``min_frequency`` times."""
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
                                      show_progress=False)
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i >= len(SPECIALS)])

    def to_json(self) -> str:
        return self.tokenizer.to_str()

    @classmethod
    def from_json(cls, text: str) -> "SubwordVocab":
        return cls(Tokenizer.from_str(text))


class VocabPair:
    """Source and target vocabularies: one shared object (joint BPE) or two (separate)."""

    def __init__(self, source: SubwordVocab, target: SubwordVocab) -> None:
        self.source, self.target = source, target

    @property
    def joint(self) -> bool:
        return self.source is self.target

    @classmethod
    def train(cls, source_texts: Sequence[str], target_texts: Sequence[str], vocab_size: int, *,
              joint: bool = True) -> "VocabPair":
        if joint:
            vocab = SubwordVocab.train(list(source_texts) + list(target_texts), vocab_size)
            return cls(vocab, vocab)
        return cls(SubwordVocab.train(source_texts, vocab_size), SubwordVocab.train(target_texts, vocab_size))

    def save(self, directory: Path) -> None:
        data = {"joint": self.joint, "source": self.source.to_json(),
                "target": None if self.joint else self.target.to_json()}
        write_atomic(directory / "vocab.json", json.dumps(data))

    @classmethod
    def load(cls, directory: Path) -> "VocabPair":
        """The pair saved by :meth:`save`; a malformed or foreign ``vocab.json`` raises :class:`DataError`."""
        path = Path(directory) / "vocab.json"
        data = read_json(path, DataError, within=directory)
        if not isinstance(data.get("source"), str) or not isinstance(data.get("joint"), bool) or (
                not data["joint"] and not isinstance(data.get("target"), str)):
            raise DataError(f"{path} is not a translation vocabulary (expected the keys joint, source and target "
                            f"written by interlayer's translation task; found {sorted(data)})")
        try:
            source = SubwordVocab.from_json(data["source"])
            return cls(source, source if data["joint"] else SubwordVocab.from_json(data["target"]))
        except Exception as err:  # tokenizers raises its own exception types for a malformed tokenizer
            raise DataError(f"{path}: not a readable BPE tokenizer ({err})") from None
