"""Language modelling: any UTF-8 text -> characters or byte-level BPE -> a decoder-only model -> loss, perplexity
and bits per character (byte); or token ids already on disk -> the same.

``interlayer train lm`` trains a causal language model (``arch="causal_lm"``; default preset
``gpt_shakespeare_char``, nanoGPT's ``shakespeare_char`` model) on a corpus (:mod:`interlayer.data.corpus`; default
the bundled complete works of Shakespeare, split by play) with the shared engine (budgets, resume, logs, DDP).

* **Pre-tokenized corpora**: ``data.path`` may be a folder of token ids (:mod:`interlayer.data.token_files`:
  nanoGPT's ``train.bin``/``val.bin``/``test.bin``, or llm.c / modded-nanogpt shards), written by ``interlayer
  prepare lm`` or by those projects' scripts. The ids are read through memory maps, a batch's rows at a time,
  never the whole file. The vocabulary is ``meta.json``'s (with its tokenizer when it has one) or
  ``data.vocab_size``; ``data.tokenizer`` does not apply. Without a tokenizer the scores have no bits per
  character/byte and the sample is ids.

* **Batches** are ``train.max_tokens // data.block_size`` blocks of ``block_size + 1`` consecutive training tokens
  at random offsets (nanoGPT's ``get_batch``): inputs are the first ``block_size``, targets the last. The offsets
  of an epoch come from a generator seeded with ``(seed, epoch)``, so a run is reproducible and a resumed run
  draws exactly the batches an uninterrupted one would. Every process draws the offsets of the whole epoch (a few
  integers per row) but reads only the rows of its own micro-batches (:class:`Batches` is lazy), so under DDP each
  rank reads its share of the data and no more.
* **An epoch is ``data.eval_interval`` optimiser steps** (nanoGPT's ``eval_interval``): text has no natural epoch,
  and the engine validates at the end of each, so this is how often the learning curve gets a point; whatever the
  number of processes and ``train.update_freq``, an epoch is that many optimiser steps. Budgets are
  ``train.max_steps`` (deterministic) or ``train.max_minutes``.
* **Validation and test** read their split once, in consecutive non-overlapping blocks (each token is predicted
  once, from the tokens before it in its block; the split's first token is never predicted), and report
  ``loss`` (mean NLL per token, nats; the metric that picks ``best/``), ``ppl`` = exp(loss), and
  ``bits_per_char`` (char tokenizer) or ``bits_per_byte`` (BPE): total NLL / ln 2 / the characters (UTF-8
  bytes) the predicted tokens spell. ``data.eval_blocks`` > 0 reads only that many blocks, spread evenly over the
  split, in every validation and in the final valid and test scores (a cheaper estimate, as nanoGPT's
  ``eval_iters``; the results say how many tokens were scored); 0 reads all of it.
* **Fine-tuning a GPT-2** (``--pretrained DIR`` or ``--set data.pretrained=DIR``, a Hugging Face GPT-2 folder):
  the checkpoint's byte-level BPE replaces ``data.tokenizer`` (so the scores are bits per byte), its architecture
  replaces the preset (``--set`` adds method sections, e.g. ``predictive.alpha_warmup_steps=100`` for PA starting
  exactly at the checkpoint), its weights are loaded over the seeded model, and the recipe of
  :data:`~interlayer.pretrained.finetune.LM_FINE_TUNING_DEFAULTS` becomes the default; ``data.block_size`` must fit
  its ``n_positions``. The import report goes to ``task.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Union, get_args, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..accounting import count_madds, count_parameters
from ..config import ModelConfig
from ..config_io import check_choices
from ..core.generation import SamplingOptions
from ..core.losses import label_smoothed_nll, total_loss
from ..data.corpus import corpus_files, corpus_roles, load_corpus, read_corpus_text, resolve
from ..data.token_files import (
    META_FILE,
    Ids,
    TokenSplit,
    check_vocabulary,
    find_layout,
    open_token_corpus,
    read_meta,
    windows,
)
from ..data.tokenizers.language_model import (
    TOKENIZER_FILE,
    CharTokenizer,
    IdTokenizer,
    Kind,
    LMTokenizer,
    chars_tokenizer,
    load_lm_tokenizer,
    save_tokenizer,
    tokenizer_from_json,
    train_tokenizer,
)
from ..errors import ConfigError, DataError
from ..fileio import read_json, write_atomic
from ..models.registry import load_pretrained
from ..pretrained.finetune import LM_FINE_TUNING_DEFAULTS, checkpoint_dir, lm_finetune_config, lm_tokenizer
from ..pretrained.hf_load import load_checkpoint
from ..training import distributed
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import SampleInput, TaskSpec

SPLITS = ("train", "valid", "test")


@dataclass
class LMData:
    """The corpus and how it becomes training blocks (``--set data.KEY=VALUE``)."""

    # a UTF-8 file, a folder of .txt files, a folder with train/valid(/test).txt, or a folder of token ids
    # (train.bin/val.bin, or *_train_*.bin/*_val_*.bin shards; data/token_files.py)
    path: str = "bundled:shakespeare"
    tokenizer: Kind = "char"
    # BPE: the size of the trained vocabulary (>= 257: 256 bytes + merges; default 4096). Token ids: the vocabulary
    # the ids come from (needed when the folder has no meta.json saying it; must agree with it otherwise)
    vocab_size: Optional[int] = None
    block_size: int = 256  # tokens of context per training example (nanoGPT's block_size); the model's max_positions
    eval_interval: int = 250  # optimiser steps per epoch, i.e. between validations (nanoGPT's eval_interval)
    eval_blocks: int = 0  # >0: validation and the final scores read this many blocks spread over a split (0: all)
    valid_fraction: float = 0.05  # a path without split files: the share of the text held out for validation
    test_fraction: float = 0.05  # ... and for test (after the validation part)
    strip_gutenberg: bool = True  # cut Project Gutenberg licence headers/footers off each file
    # A Hugging Face GPT-2 folder to fine-tune (its tokenizer replaces data.tokenizer); empty: train from scratch
    pretrained: str = ""

    def validate(self) -> None:
        check_choices(self, "data.")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ConfigError(f"data.vocab_size={self.vocab_size} must be a positive number of tokens")
        if self.tokenizer == "bpe" and self.vocab_size is not None and self.vocab_size < 257:
            raise ConfigError(f"data.vocab_size={self.vocab_size} must be at least 257 for byte-level BPE (256 "
                              "bytes plus at least one merge)")
        for key in ("block_size", "eval_interval"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a positive integer")
        if self.eval_blocks < 0:
            raise ConfigError(f"data.eval_blocks={self.eval_blocks} must be >= 0 (0 reads the whole split)")
        if not (0 < self.valid_fraction < 1 and 0 <= self.test_fraction < 1
                and self.valid_fraction + self.test_fraction < 1):
            raise ConfigError(f"data.valid_fraction={self.valid_fraction} and data.test_fraction="
                              f"{self.test_fraction} must be shares of the text with valid > 0 and a sum below 1")


BPE_VOCAB_SIZE = 4096  # data.vocab_size's default for a trained BPE


def blocks(ids: Ids, block_size: int) -> list[tuple[int, int]]:
    """``(start, length)`` of consecutive non-overlapping blocks: block ``i`` reads ``ids[start:start+length]`` and
    predicts ``ids[start+1:start+length+1]``; together they predict every token but the first exactly once."""
    predicted = len(ids) - 1
    return [(start, min(block_size, predicted - start)) for start in range(0, predicted, block_size)]


# An epoch's block offsets are drawn at once (one seeded draw, so the order does not depend on how the engine splits
# the epoch). 2^27 int64 offsets are 1 GiB, far beyond any real epoch (nanoGPT's GPT-2 run: 1,000 steps x 40
# micro-batches x 12 rows = 480,000), so a larger one is a mistyped setting, refused before it exhausts the memory.
MAX_EPOCH_STARTS = 2**27


class Batches(Sequence):
    """An epoch's batches, read lazily: batch ``i`` is the rows of ``length`` tokens of ``ids`` at ``starts[i]``.
    A slice is again lazy, so the engine's split of an epoch into steps and ranks reads nothing; a process reads a
    batch's rows when it trains on it (from a memory map, for a token folder)."""

    def __init__(self, ids: Ids, starts: Tensor, length: int) -> None:
        self.ids, self.starts, self.length = ids, starts, length

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> "Batches": ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Tensor, "Batches"]:
        if isinstance(index, slice):
            return Batches(self.ids, self.starts[index], self.length)
        return windows(self.ids, self.starts[index], self.length)


def _token_corpus(root: Path, data: LMData, tokenizer: Optional[LMTokenizer]
                  ) -> tuple[LMTokenizer, dict[str, Ids], str, list[tuple[str, Path]]]:
    """The tokenizer, splits, description and files of a token folder. The vocabulary: ``meta.json``'s tokenizer
    (or its ``chars``), else ``tokenizer`` (a resumed run's, a fine-tuned checkpoint's; it wins), else ids alone, of
    ``meta.json``'s ``vocab_size`` or ``data.vocab_size``, which must agree where both are given; ``meta.json``'s
    own tokenizer, characters and size must agree with each other (``check_vocabulary``)."""
    corpus = open_token_corpus(root)
    meta, where = corpus.meta, str(root / META_FILE)
    declared = [size for size in (meta.get("vocab_size"), data.vocab_size) if size is not None]
    if len(set(declared)) > 1:
        raise ConfigError(f"data.vocab_size={data.vocab_size} disagrees with {where}'s vocab_size="
                          f"{meta['vocab_size']}; leave data.vocab_size out, or correct the file")
    own = tokenizer_from_json(meta["tokenizer"], where) if "tokenizer" in meta else (
        chars_tokenizer(meta["chars"], where) if "chars" in meta else None)
    if own is not None:
        check_vocabulary(meta, len(own), "".join(own.chars) if isinstance(own, CharTokenizer) else None,
                         root / META_FILE)
    if tokenizer is not None and own is not None and len(tokenizer) != len(own):
        raise DataError(f"{root}: the ids come from {where}'s {own.kind} tokenizer of {len(own)} tokens, but this run "
                        f"reads them with a {tokenizer.kind} tokenizer of {len(tokenizer)}; they cannot be the same")
    tokenizer = tokenizer or own
    if tokenizer is None and not declared:
        raise DataError(f"{root}: the vocabulary size of these token ids is unknown; give it with --set "
                        f"data.vocab_size=N (GPT-2's: 50257), or write {where} as {{\"vocab_size\": N}}")
    tokenizer = tokenizer or IdTokenizer(declared[0])
    if declared and declared[0] > len(tokenizer):
        raise DataError(f"{root}: the ids come from a vocabulary of {declared[0]}, but the tokenizer has "
                        f"{len(tokenizer)} tokens; they cannot be the same")
    for split in corpus.splits.values():
        split.vocab_size = len(tokenizer)
    return tokenizer, dict(corpus.splits), corpus.description, corpus.files()


class LanguageModelingTask:
    """Next-token prediction on a corpus (module docstring): the text tokenized once (characters, a trained byte-level
    BPE, a checkpoint's tokenizer, or token files), blocks of ``block_size + 1`` tokens at seeded random offsets, and
    validation as the loss (nats per token), perplexity and bits per character or byte on blocks spread over the
    validation text."""

    metric = "loss"
    higher_is_better = False
    metric_decimals = 3  # a comparison's table: differences between models are a few thousandths of a nat
    device = torch.device("cpu")  # the engine sets the training device, where the saved model is scored

    def __init__(self, data: LMData, train: TrainConfig, *, tokenizer: Optional[LMTokenizer] = None,
                 imported: Optional[dict[str, Any]] = None) -> None:
        """``tokenizer``: the run's own when it is reloaded (None: trained on the corpus, or the checkpoint's);
        ``imported``: a fine-tuning run's import report (``ImportReport.summary``), kept in task.json."""
        data.validate()
        self.imported = imported
        self.data, self.train_cfg = data, train
        self.rows = train.max_tokens // data.block_size
        if self.rows < 1:
            raise ConfigError(f"train.max_tokens={train.max_tokens} holds no block of data.block_size="
                              f"{data.block_size} tokens; a batch is max_tokens // block_size blocks")
        if tokenizer is None and data.pretrained:
            tokenizer = lm_tokenizer(checkpoint_dir(data.pretrained))
        root = resolve(data.path)
        self.ids: dict[str, Ids]
        if find_layout(root) is not None:
            self.tokenizer, self.ids, self.corpus_description, self.files = _token_corpus(root, data, tokenizer)
        else:
            self.files = corpus_roles(corpus_files(data.path))
            corpus = load_corpus(data.path, valid_fraction=data.valid_fraction, test_fraction=data.test_fraction,
                                 gutenberg=data.strip_gutenberg)
            self.corpus_description = corpus.description
            self.tokenizer = tokenizer or train_tokenizer(data.tokenizer, corpus.train,
                                                          [corpus.split(s) for s in SPLITS],
                                                          data.vocab_size or BPE_VOCAB_SIZE)
            self.ids = {split: self.tokenizer.encode_tensor(corpus.split(split)) for split in SPLITS}
        if len(self.ids["train"]) < data.block_size + 1:
            raise DataError(f"{self.corpus_description}: the training split has {len(self.ids['train'])} tokens, "
                            f"fewer than data.block_size + 1 = {data.block_size + 1}; lower data.block_size or give "
                            "more text")
        if len(self.ids["valid"]) < 2:
            raise DataError(f"{self.corpus_description}: the validation split has {len(self.ids['valid'])} "
                            "token(s); it needs at least 2 (one to read, one to predict)")
        self.byte_lengths = self.tokenizer.byte_lengths()
        self.unit: Optional[str] = {"char": "char", "bpe": "byte"}.get(self.tokenizer.kind)  # ids: no bits

    def data_files(self) -> list[tuple[str, Path]]:
        """The files the corpus is read from, by role (the run's data fingerprint: experiment.py)."""
        return self.files

    def check_inputs(self, model: nn.Module) -> None:
        """Every id of a token folder's splits inside the vocabulary, read once before the run starts (a batch's
        rows are checked as they are read too, but that is after the run's folder is written)."""
        for split in self.ids.values():
            if isinstance(split, TokenSplit):
                split.check_ids()

    # -- model shape ---------------------------------------------------------------------------------------
    def model_fields(self) -> dict[str, Any]:
        return {"arch": "causal_lm", "src_vocab_size": len(self.tokenizer), "max_positions": self.data.block_size}

    # -- training --------------------------------------------------------------------------------------------
    def step_blocks(self, train: TrainConfig, processes: int = 1) -> tuple[int, int]:
        """(blocks, tokens each) that one optimiser step of a run with the training settings ``train`` trains on
        over ``processes`` data-parallel ranks: every step reads the same number of tokens, so a budget in tokens
        or FLOPs is a number of steps (``compare --budget-flops``)."""
        return train.max_tokens // self.data.block_size * train.update_freq * processes, self.data.block_size

    def train_batches(self, epoch: int, seed: int) -> "Batches":
        """``eval_interval`` optimiser steps of ``(rows, block_size + 1)`` token blocks at random offsets drawn
        from a generator seeded by ``(seed, epoch)`` alone (as many micro-batches per step as the engine takes:
        ``update_freq`` per process), each read when the engine takes it."""
        per_step = self.train_cfg.update_freq * distributed.environment().world_size
        drawn = self.data.eval_interval * per_step * self.rows
        if drawn > MAX_EPOCH_STARTS:
            raise ConfigError(
                f"an epoch of data.eval_interval={self.data.eval_interval} steps x train.update_freq="
                f"{self.train_cfg.update_freq} x {per_step // self.train_cfg.update_freq} process(es) x {self.rows} "
                f"rows draws {drawn:,} block offsets up front ({drawn * 8 / 2**30:.1f} GiB), over the limit of "
                f"{MAX_EPOCH_STARTS:,}; lower train.update_freq or data.eval_interval")
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        train, block = self.ids["train"], self.data.block_size
        starts = torch.randint(0, len(train) - block, (self.data.eval_interval * per_step, self.rows),
                               generator=generator)
        return Batches(train, starts, block + 1)

    def loss(self, model: nn.Module, batch: Tensor) -> tuple[Tensor, dict[str, Tensor], int]:
        batch = move(batch, module_device(model))
        inputs, targets = batch[:, :-1], batch[:, 1:]
        output = model(inputs)
        smoothing = self.train_cfg.label_smoothing
        loss, logs = total_loss(output, lambda logits: label_smoothed_nll(logits, targets, smoothing))
        return loss, logs, targets.numel()

    def score(self, model: nn.Module, split: str, *, progress: bool = False) -> dict[str, float]:
        """:meth:`score_tokens` of a split, over ``data.eval_blocks`` blocks (0: all)."""
        return self.score_tokens(model, self.ids[split], self.data.eval_blocks, progress=progress,
                                 label=f"scoring {split}")

    @torch.no_grad()
    def score_tokens(self, model: nn.Module, ids: Ids, max_blocks: int = 0, *, progress: bool = False,
                     label: str = "scoring") -> dict[str, float]:
        """Loss, perplexity and bits per char/byte (none without a tokenizer) of the token sequence ``ids`` (all
        of it, or ``max_blocks`` blocks spread evenly over it); sums in float64 so that a long text's total is
        exact. ``progress``: a bar (``label``) counting the blocks scored."""
        model.eval()
        device = module_device(model)
        chosen = blocks(ids, self.data.block_size)
        if max_blocks and max_blocks < len(chosen):
            step = (len(chosen) - 1) / max(max_blocks - 1, 1)
            chosen = [chosen[round(i * step)] for i in range(max_blocks)]
        by_length: dict[int, list[int]] = {}
        for start, length in chosen:
            by_length.setdefault(length, []).append(start)
        nll, tokens, units = torch.zeros((), dtype=torch.float64), 0, 0
        bar = tqdm(total=len(chosen), desc=label, unit="block", disable=not progress, leave=False)
        for length, starts in by_length.items():
            for i in range(0, len(starts), self.rows):
                batch = windows(ids, starts[i:i + self.rows], length + 1)
                targets = batch[:, 1:]
                logits = model(batch[:, :-1].to(device)).logits
                nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                       targets.reshape(-1).to(device), reduction="sum").double().cpu()
                tokens += targets.numel()
                units += int(self.byte_lengths[targets].sum()) if self.unit == "byte" else targets.numel()
                bar.update(len(batch))
        bar.close()
        total = float(nll)
        bits = {f"bits_per_{self.unit}": total / math.log(2) / units} if self.unit else {}
        return {"loss": total / tokens, "ppl": math.exp(total / tokens), **bits, "tokens": tokens}

    def validate(self, model: nn.Module) -> dict[str, float]:
        scores = self.score(model, "valid")
        scores.pop("tokens")
        return scores

    def save_assets(self, directory: Path) -> None:
        save_tokenizer(self.tokenizer, directory)
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        info = {"task": "lm", "corpus": self.corpus_description, "tokens": {s: len(v) for s, v in self.ids.items()}}
        if self.imported is not None:
            info["pretrained"] = self.imported
        write_atomic(directory / "task.json", json.dumps(info))


# -- the saved model: scoring and generating --------------------------------------------------------------
def load_language_model(directory: Path, device: Union[str, torch.device, None] = None
                        ) -> tuple[nn.Module, LMTokenizer]:
    """A saved language model (``RUN_DIR/best``) with its tokenizer, on ``device`` (default the CPU)."""
    directory = Path(directory)
    tokenizer = load_lm_tokenizer(directory)
    model = load_pretrained(directory, device).eval()
    if getattr(model.config, "arch", None) != "causal_lm":
        raise ConfigError(f"{directory} holds a {getattr(model.config, 'arch', type(model).__name__)!r} model, not "
                          "a language model (arch='causal_lm')")
    return model, tokenizer


def generate_text(directory: Path, prompt: str, options: SamplingOptions, *, seed: int = 1, samples: int = 1,
                  device: Union[str, torch.device, None] = None) -> list[str]:
    """``samples`` continuations of ``prompt`` from the model in ``directory`` (prompt included), seeded."""
    model, tokenizer = load_language_model(directory, device)
    if not prompt:
        raise DataError("the prompt is empty; give at least one character (nanoGPT starts from a newline: '\\n')")
    return [prompt + tokenizer.decode(new) for new in generate_ids(model, tokenizer.encode(prompt), options,
                                                                    seed=seed, samples=samples)]


def generate_ids(model: nn.Module, prompt: list[int], options: SamplingOptions, *, seed: int = 1, samples: int = 1
                 ) -> list[list[int]]:
    """``samples`` seeded continuations (new ids only) of the ids ``prompt``."""
    device = module_device(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(torch.tensor([prompt] * samples, device=device), options, generator=generator)
    return [row[:length].tolist() for row, length in zip(out.tokens.cpu(), out.lengths.tolist())]


def tokenizer_of(path: Union[str, Path]) -> LMTokenizer:
    """The tokenizer in ``path`` (a folder, or its ``tokenizer.json``), for ``interlayer prepare lm``: an interlayer
    run's (``RUN_DIR`` or ``RUN_DIR/best``: characters or byte-level BPE), or a GPT-2-style Hugging Face tokenizer
    (``vocab.json`` + ``merges.txt``, or a BPE ``tokenizer.json``) run through GPT-2's byte-level pipeline
    (:func:`~interlayer.data.tokenizers.gpt2.load_gpt2_tokenizer`: transformers' ids). A ``tokenizer.json`` whose
    normaliser or pre-tokenizer is not GPT-2's (Llama-3's regex, a SentencePiece Metaspace) is refused: that
    pipeline would give other ids than the tokenizer's own."""
    from ..data.tokenizers.gpt2 import load_gpt2_tokenizer

    path = Path(path)
    folder = path.parent if path.is_file() else path
    if not folder.is_dir():
        raise FileNotFoundError(f"--tokenizer {path}: no such folder (give char, bpe, a run folder, or a GPT-2 "
                                "tokenizer folder: vocab.json + merges.txt or tokenizer.json)")
    own = folder / TOKENIZER_FILE
    data = read_json(own, DataError, optional=True, within=folder)
    if "kind" in data:  # interlayer's own
        return tokenizer_from_json(data, str(own))
    if data:
        pre = data.get("pre_tokenizer") or {}
        if data.get("normalizer") or pre.get("type") != "ByteLevel" or pre.get("use_regex", True) is not True:
            raise DataError(f"{own}: its pre-tokenizer ({json.dumps(pre)[:120]}) or normaliser is not GPT-2's "
                            "byte-level one, so GPT-2's pipeline would give other ids than this tokenizer; interlayer "
                            "prepares text with GPT-2-style tokenizers only (GPT-2, and those trained like it)")
    return load_gpt2_tokenizer(folder)


# nanoGPT's config/train_shakespeare_char.py: AdamW (0.9, 0.99), lr 1e-3 with 100 warm-up steps and a cosine to 1e-4
# over 5,000 iterations, weight decay 0.1 on matrices and embeddings (not biases or LayerNorms), clipping at 1.0,
# 64 blocks of 256 characters per step, validation every 250 steps; no label smoothing.
TRAIN_DEFAULTS = dict(optimizer="adamw", lr=1e-3, betas=[0.9, 0.99], weight_decay=0.1, decay_bias_norm=False,
                      schedule="cosine", min_lr=1e-4, warmup_steps=100, label_smoothing=0.0, clip_norm=1.0,
                      max_tokens=64 * 256, max_steps=5000, max_epochs=1_000_000, keep_last=1, log_interval=10)

class LanguageModelingSpec(TaskSpec):
    """A causal language model on a UTF-8 corpus: loss, perplexity, bits per character (byte), and a sample."""

    name = "lm"
    description = "language modelling on any UTF-8 text (default: bundled Shakespeare)"
    default_preset = "gpt_shakespeare_char"
    data_class = LMData
    train_defaults = TRAIN_DEFAULTS

    def make_task(self, data: LMData, train: TrainConfig, run_dir: Optional[Path]) -> LanguageModelingTask:
        if run_dir is None:
            return LanguageModelingTask(data, train)
        stored = run_dir / "task.json"
        imported = (read_json(stored, DataError, within=run_dir).get("pretrained") if os.path.lexists(stored)
                    else None)
        return LanguageModelingTask(data, train, tokenizer=load_lm_tokenizer(run_dir), imported=imported)

    def finish(self, task: LanguageModelingTask, run_dir: Path, state: Any, options: dict[str, Any]
               ) -> dict[str, Any]:
        """Score ``best/`` on valid and test (``data.eval_blocks`` of each, or all), and keep a sample of its
        text."""
        model, _ = load_language_model(run_dir / "best", task.device)
        results: dict[str, Any] = {}
        for split in ("valid", "test"):
            if len(task.ids[split]) >= 2:
                scores = task.score(model, split, progress=bool(options.get("progress")))
                results.update({f"{split}_{k}": v for k, v in scores.items()})
        block = task.data.block_size
        results.update(parameters=count_parameters(model), madds_per_block=count_madds(model, block),
                       corpus=task.corpus_description)
        prompt = task.ids["valid"][:min(16, block)].tolist()  # ids, so a corpus without a tokenizer has a sample too
        sample_options = SamplingOptions(max_new_tokens=min(200, block), temperature=0.8, top_k=200)
        started = time.perf_counter()
        new = generate_ids(model, prompt, sample_options, seed=1)[0]
        sample = task.tokenizer.decode(prompt) + task.tokenizer.decode(new)
        results["sample_seconds"] = time.perf_counter() - started
        write_atomic(run_dir / "sample.txt", sample + "\n")
        return results

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data", metavar="PATH", help="a UTF-8 text file or a folder, or a folder of token ids "
                                                           "(nanoGPT's train.bin/val.bin, llm.c shards; interlayer "
                                                           "prepare lm writes them) (default: the bundled complete "
                                                           "works of Shakespeare, split by play)")
        parser.add_argument("--tokenizer", choices=get_args(Kind), help="characters (default) or byte-level BPE")
        parser.add_argument("--pretrained", metavar="DIR",
                            help="fine-tune this Hugging Face GPT-2 folder (its tokenizer and architecture; methods "
                                 "via --set); same as --set data.pretrained=DIR")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        sets = {}
        if args.data:
            sets["data.path"] = args.data
        if args.tokenizer:
            sets["data.tokenizer"] = args.tokenizer
        if args.pretrained:
            sets["data.pretrained"] = args.pretrained
        return sets, {}

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """Loss, perplexity and bits of the run's valid and test splits, or of the whole text of ``--data FILE``."""
        model, tokenizer = load_language_model(directory, args.device)
        data = self.saved_data(directory)
        task = LanguageModelingTask(data, TrainConfig(max_tokens=16 * data.block_size), tokenizer=tokenizer)
        if args.data:
            texts = {args.data: tokenizer.encode_tensor(read_corpus_text(args.data))}
        else:
            texts = {split: task.ids[split] for split in ("valid", "test")}
        lines = [f"{name}: " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in task.score_tokens(model, ids).items())
                 for name, ids in texts.items() if len(ids) >= 2]
        return "\n".join(lines) or "nothing to score: the text has fewer than 2 tokens"

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: LanguageModelingTask) -> ModelConfig:
        """The preset as a causal language model of the corpus's vocabulary, or a fine-tuning run's checkpoint with
        the ``--set`` method sections; its context must hold a block."""
        if task.data.pretrained and preset != self.default_preset:
            raise ConfigError(f"--preset {preset} cannot be combined with data.pretrained={task.data.pretrained}: "
                              "the checkpoint decides the architecture; add a method with --set instead (e.g. --set "
                              "predictive.alpha_warmup_steps=100)")
        if task.data.pretrained:
            cfg = lm_finetune_config(checkpoint_dir(task.data.pretrained), model_sets)
        else:
            cfg = super().resolve_model(preset, model_sets, task)
        if cfg.max_positions < task.data.block_size and task.data.pretrained:
            raise ConfigError(f"data.block_size={task.data.block_size} is longer than the {cfg.max_positions} "
                              f"positions of {task.data.pretrained} (its n_positions); the model must read a whole "
                              f"block: lower it, e.g. --set data.block_size={cfg.max_positions}")
        if cfg.max_positions < task.data.block_size:
            raise ConfigError(f"max_positions={cfg.max_positions} is shorter than data.block_size="
                              f"{task.data.block_size}; the model must read a whole block (raise max_positions or "
                              "lower data.block_size)")
        return cfg

    def initialise(self, model: nn.Module, task: LanguageModelingTask) -> None:
        """A fresh fine-tuning run's model, just built from the seed: load the GPT-2 over it (what methods add keeps
        its seeded initialisation); the import report goes to task.json."""
        if task.data.pretrained:
            task.imported = load_checkpoint(model, checkpoint_dir(task.data.pretrained)).summary()
            if task.data.eval_blocks:
                print(f"interlayer: validation and the final scores read {task.data.eval_blocks} blocks spread over "
                      f"each split (data.eval_blocks={task.data.eval_blocks}, the fine-tuning default; "
                      "--set data.eval_blocks=0 reads them all)", file=sys.stderr)

    def defaults_for(self, sets: dict[str, Any]) -> dict[str, Any]:
        """The fine-tuning recipe as the defaults of a run with ``data.pretrained`` (the user's ``--set`` wins); for
        a token folder, its own tokenizer's kind as ``data.tokenizer``, so that the run records what it reads with,
        and a ``--tokenizer`` (``data.tokenizer``) that differs from it refused (it was ignored, and recorded)."""
        defaults = dict(LM_FINE_TUNING_DEFAULTS) if sets.get("data.pretrained") else {}
        root = resolve(str(sets.get("data.path", LMData.path)))
        if find_layout(root) is None:
            return defaults
        wrapper = read_meta(root).get("tokenizer")
        kind = wrapper.get("kind") if isinstance(wrapper, dict) else ("char" if "chars" in read_meta(root) else None)
        given = sets.get("data.tokenizer")
        if given is not None and given != kind:
            made = f"its ids come from meta.json's {kind} tokenizer" if kind else "its meta.json names no tokenizer"
            raise ConfigError(f"--tokenizer / data.tokenizer={given} does not apply to the token folder {root}: "
                              f"{made}, and the ids are read as they are; drop it")
        return {**defaults, "data.tokenizer": kind} if kind in get_args(Kind) else defaults

    def sample_input(self, task: LanguageModelingTask) -> SampleInput:
        """The first 32 validation tokens, labelled with the text they spell."""
        ids = task.ids["valid"][:min(32, task.data.block_size)]
        return (ids[None],), {}, [task.tokenizer.decode([i]) for i in ids.tolist()]
