"""Machine translation: parallel text -> BPE -> encoder-decoder training -> beam search -> sacreBLEU.

The bundled default is Multi30k De->En (29,000 / 1,014 / 1,000 pairs), a small stand-in for the IWSLT'14 De-En
benchmark of Crossformer Table 1 and PA Table 1. Any line-aligned parallel files (plain or .gz) work through
:class:`TranslationData`. Sources get an EOS appended and targets are trained as ``<s> y`` -> ``y </s>`` (fairseq).
Scores are sacreBLEU on *detokenized* output against the raw references, with the metric's signature.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import sacrebleu
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..accounting import count_madds, count_parameters
from ..core.losses import label_smoothed_nll, total_loss
from ..data.batching import epoch_order, length_buckets
from ..data.bpe import BOS_ID, EOS_ID, PAD_ID, VocabPair
from ..data.parallel import read_parallel, resolve_path
from ..errors import CheckpointError, ConfigError, DataError
from ..fileio import read_json, write_atomic
from ..models.registry import load_pretrained
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import SampleInput, TaskSpec
from .translation_decoding import DecodeOptions, decode

_MULTI30K = "bundled:multi30k"


@dataclass
class TranslationData:
    """Where the text is and how it becomes ids. Paths may be plain or .gz; ``bundled:multi30k`` is the default."""

    train_src: str = f"{_MULTI30K}/train.de.gz"
    train_tgt: str = f"{_MULTI30K}/train.en.gz"
    valid_src: str = f"{_MULTI30K}/val.de.gz"
    valid_tgt: str = f"{_MULTI30K}/val.en.gz"
    test_src: str = f"{_MULTI30K}/test_2016_flickr.de.gz"
    test_tgt: str = f"{_MULTI30K}/test_2016_flickr.en.gz"
    vocab_size: int = 8000
    joint_vocab: bool = True  # one BPE model for both languages (enables shared embeddings)
    max_tokens_per_sentence: int = 128  # longer *training* pairs are dropped and counted; evaluation never is

    def resolve(self, path: str) -> Path:
        return resolve_path(path)


def pad_batch(rows: Sequence[Sequence[int]]) -> Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


@dataclass
class TranslationBatch:
    """A batch of sentence pairs as padded id tensors: the source, the decoder's input (``<s> y``) and its targets (``y
    </s>``)."""

    src: Tensor  # (B, S) ids + EOS, padded
    tgt_in: Tensor  # (B, T) BOS + ids
    tgt_out: Tensor  # (B, T) ids + EOS, PAD where absent
    tokens: int  # target tokens (what tokens/s counts)
    src_padded: bool = True  # whether any source is shorter than the longest (known here, on the host)


class TranslationTask:
    """Training and scoring a translation model on parallel text (module docstring): BPE vocabularies trained on the
    training split (or a run's own, on resume), token-budget batches by length, label-smoothed cross-entropy, validation
    by the teacher-forced loss and sacreBLEU of greedy decoding, and the test set scored with beam search (sacreBLEU and
    chrF on detokenized output)."""

    device = torch.device("cpu")  # the engine sets the training device (Task.device)
    metric = "bleu"
    higher_is_better = True
    extra_metrics = ("chrf",)  # reported beside BLEU by interlayer compare

    def __init__(self, data: TranslationData, train: TrainConfig, *, vocab: Optional[VocabPair] = None,
                 valid_options: DecodeOptions = DecodeOptions(beam=1)) -> None:
        self.data, self.train_cfg, self.valid_options = data, train, valid_options
        corpus = read_parallel(data.resolve(data.train_src), data.resolve(data.train_tgt), drop_blank=True)
        self.vocab = vocab or VocabPair.train(corpus.source, corpus.target, data.vocab_size, joint=data.joint_vocab)
        src_ids = self.encode_sources(corpus.source)
        tgt_ids = self.vocab.target.encode_batch(corpus.target)
        limit = data.max_tokens_per_sentence
        keep = [i for i in range(len(src_ids)) if len(src_ids[i]) <= limit and len(tgt_ids[i]) + 1 <= limit]
        self.dropped = {"blank": corpus.dropped_blank, "too_long": len(src_ids) - len(keep)}
        self.train_src = [src_ids[i] for i in keep]
        self.train_tgt = [tgt_ids[i] for i in keep]
        self.train_lines = [corpus.lines[i] for i in keep]
        lengths = [max(len(s), len(t) + 1) for s, t in zip(self.train_src, self.train_tgt)]
        self.buckets = length_buckets(lengths, train.max_tokens)
        self.valid = read_parallel(data.resolve(data.valid_src), data.resolve(data.valid_tgt))
        self._valid_src = self.encode_sources(self.valid.source)
        self._valid_tgt = self.vocab.target.encode_batch(self.valid.target)

    def data_files(self) -> list[tuple[str, Path]]:
        """The six files, by the setting that names them (the run's data fingerprint: experiment.py)."""
        keys = ("train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt")
        return [(key, self.data.resolve(getattr(self.data, key))) for key in keys]

    # -- model shape ---------------------------------------------------------------------------------------
    def model_fields(self) -> dict:
        """Config fields the data decides: vocabulary sizes and whether embeddings can be shared."""
        fields = {"arch": "encoder_decoder", "src_vocab_size": len(self.vocab.source), "pad_id": PAD_ID}
        if self.vocab.joint:
            fields["tgt_vocab_size"] = None
        else:
            fields.update(tgt_vocab_size=len(self.vocab.target), share_embeddings=False)
        return fields

    def check_inputs(self, model: nn.Module) -> None:
        """Refuse, before any training, a sentence of any split longer than the model's ``max_positions`` (with
        EOS on the source, BOS on the target): the forward pass would fail on it, for a validation sentence only
        after the first epoch, for a test sentence only after the whole run. The error names file and line."""
        limit = model.config.max_positions
        data = self.data
        test = read_parallel(data.resolve(data.test_src), data.resolve(data.test_tgt))
        splits = [("train", data.train_src, data.train_tgt, self.train_src, self.train_tgt, self.train_lines),
                  ("valid", data.valid_src, data.valid_tgt, self._valid_src, self._valid_tgt, None),
                  ("test", data.test_src, data.test_tgt, self.encode_sources(test.source), [], None)]
        for split, src_path, tgt_path, sources, targets, lines in splits:
            for side, path, rows, extra in (("source", src_path, sources, 0), ("target", tgt_path, targets, 1)):
                for i, ids in enumerate(rows):
                    if len(ids) + extra > limit:
                        line = lines[i] if lines is not None else i + 1
                        fix = (f"--set data.max_tokens_per_sentence={limit} drops such training pairs (counted in "
                               "task.json)" if split == "train" else
                               "evaluation data is never cut: shorten or split the line")
                        raise DataError(f"{data.resolve(path)}:{line}: the {split} {side} sentence has "
                                        f"{len(ids) + extra} tokens, more than the model's max_positions={limit}; "
                                        f"{fix}, or raise max_positions")

    # -- data ----------------------------------------------------------------------------------------------
    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        return [ids + [EOS_ID] for ids in self.vocab.source.encode_batch(texts)]

    def make_batch(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> TranslationBatch:
        return TranslationBatch(src=pad_batch(src), tgt_in=pad_batch([[BOS_ID] + list(t) for t in tgt]),
                                tgt_out=pad_batch([list(t) + [EOS_ID] for t in tgt]),
                                tokens=sum(len(t) + 1 for t in tgt),
                                src_padded=len({len(s) for s in src}) > 1)

    def train_batches(self, epoch: int, seed: int) -> list[TranslationBatch]:
        order = epoch_order(self.buckets, seed, epoch)
        return [self.make_batch([self.train_src[i] for i in b], [self.train_tgt[i] for i in b]) for b in order]

    # -- training --------------------------------------------------------------------------------------------
    def loss(self, model: nn.Module, batch: TranslationBatch) -> tuple[Tensor, dict[str, Tensor], int]:
        batch = move(batch, module_device(model))
        output = model(batch.src, batch.tgt_in, source_padded=batch.src_padded)
        smoothing = self.train_cfg.label_smoothing
        loss, logs = total_loss(output, lambda logits: label_smoothed_nll(logits, batch.tgt_out, smoothing,
                                                                          ignore_index=PAD_ID))
        return loss, logs, batch.tokens

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        """Validation NLL (teacher forcing) and BLEU of greedy decoding on the validation set."""
        model.eval()
        device = module_device(model)
        nll_sum, tokens = 0.0, 0
        for chunk in _chunks(list(range(len(self._valid_src))), 64):
            batch = move(self.make_batch([self._valid_src[i] for i in chunk], [self._valid_tgt[i] for i in chunk]),
                         device)
            logits = model(batch.src, batch.tgt_in).logits
            nll_sum += float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                         batch.tgt_out.reshape(-1), ignore_index=PAD_ID,
                                                         reduction="sum"))
            tokens += batch.tokens
        hypotheses = self.translate(model, self.valid.source, self.valid_options)
        return {"nll": nll_sum / tokens, "bleu": score(hypotheses, self.valid.target)["bleu"]}

    def translate(self, model: nn.Module, sentences: Sequence[str], options: DecodeOptions,
                  batch_tokens: int = 2048) -> list[str]:
        return translate(model, self.vocab, sentences, options, batch_tokens)

    def save_assets(self, directory: Path) -> None:
        self.vocab.save(directory)
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        write_atomic(directory / "task.json", json.dumps({"task": "translation", "dropped": self.dropped}))


def translate(model: nn.Module, vocab: VocabPair, sentences: Sequence[str], options: DecodeOptions,
              batch_tokens: int = 2048, *, source: str = "input", progress: bool = False,
              label: str = "decoding") -> list[str]:
    """Detokenized translations in input order; batches group sentences of similar length. A sentence longer than
    the model can read raises :class:`DataError` naming ``source`` and its line (sentence ``i`` is line ``i + 1``).
    ``progress``: a bar (``label``) counting the sentences decoded (beam search of a test set takes a while)."""
    model.eval()
    src = [ids + [EOS_ID] for ids in vocab.source.encode_batch(sentences)]
    limit = model.config.max_positions
    too_long = [i for i, s in enumerate(src) if len(s) > limit]
    if too_long:
        raise DataError(f"{source}:{too_long[0] + 1}: the sentence has {len(src[too_long[0]])} subword tokens "
                        f"(with EOS), more than the model reads (max_positions={limit}); shorten or split it "
                        f"({len(too_long)} such line(s) in all)")
    if not src:
        return []
    out: list[str] = [""] * len(sentences)
    device = module_device(model)
    with tqdm(total=len(src), desc=label, unit="sentence", disable=not progress, leave=False) as bar:
        for batch in length_buckets([len(s) for s in src], max(batch_tokens, max(map(len, src)))):
            for index, ids in zip(batch, decode(model, move(pad_batch([src[i] for i in batch]), device), options)):
                out[index] = vocab.target.decode(ids)
            bar.update(len(batch))
    return out


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, object]:
    """Corpus sacreBLEU and chrF on detokenized text, with their signatures."""
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": bleu_score.score, "chrf": chrf_score.score, "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature())}


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def load_translator(directory: Path, device: Union[str, torch.device, None] = None) -> tuple[nn.Module, VocabPair]:
    """A saved translation model (``best/``, ``averaged/``) with its vocabulary."""
    directory = Path(directory)
    info = directory / "task.json"
    task = (read_json(info, CheckpointError, within=directory).get("task") if os.path.lexists(info)
            else "translation")
    if task != "translation":
        raise CheckpointError(f"{directory} holds a {task!r} model ({info}), not a translation model; translate "
                              "needs the folder of a translation run (RUN_DIR/best or RUN_DIR/averaged of "
                              "`interlayer train translation`); score this one with `interlayer evaluate "
                              f"--checkpoint {directory}`")
    if not os.path.lexists(directory / "vocab.json"):
        raise FileNotFoundError(f"{directory} has no vocab.json: pass a translation model folder such as "
                                "RUN_DIR/best or RUN_DIR/averaged")
    return load_pretrained(directory, device).eval(), VocabPair.load(directory)


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy (default 5, the papers' IWSLT)")
    parser.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default 1.0)")
    parser.add_argument("--no-cache", action="store_true", help="decode without the incremental cache (slower)")


def decode_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.beam < 1:
        raise ConfigError(f"--beam={args.beam} must be at least 1")
    return {"beam": args.beam, "lenpen": args.lenpen, "use_cache": not args.no_cache}


# fairseq's IWSLT recipe (Adam 0.9/0.98, inverse-sqrt, label smoothing 0.1) scaled to Multi30k on 2 CPU cores.
# Warm-up and peak rate come from the validation curve of an 18-minute run (docs/translation.md): 1,000 warm-up
# steps at 7e-4 spent 4.4 of a 60-minute budget's ~15 epochs below the peak, so the budgeted recipe warms up over
# 400 steps (under 2 epochs) to 1e-3; a post-LN 3+3-layer model trains stably at that rate.
TRAIN_DEFAULTS = dict(lr=1e-3, warmup_steps=400, max_tokens=2048, label_smoothing=0.1, clip_norm=1.0,
                      max_epochs=60, patience=8, keep_last=5, average_last=5)


class TranslationSpec(TaskSpec):
    """Machine translation: BPE, an encoder-decoder, beam search, sacreBLEU and chrF."""

    name = "translation"
    description = "machine translation (default: bundled Multi30k De-En)"
    default_preset = "transformer_multi30k"
    data_class = TranslationData
    train_defaults = TRAIN_DEFAULTS

    def make_task(self, data: TranslationData, train: TrainConfig, run_dir: Optional[Path]) -> TranslationTask:
        return TranslationTask(data, train, vocab=VocabPair.load(run_dir) if run_dir is not None else None)

    def finish(self, task: TranslationTask, run_dir: Path, state: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Choose ``best/`` or ``averaged/`` by validation BLEU (beam search), then score it once on test."""
        progress = bool(options.get("progress"))
        decode_options = DecodeOptions(**{key: value for key, value in options.items() if key != "progress"})
        valid = {}
        for directory in (run_dir / "best", run_dir / "averaged"):
            if (directory / "config.json").is_file():
                model, vocab = load_translator(directory, task.device)
                valid[directory.name] = score(translate(model, vocab, task.valid.source, decode_options,
                                                        progress=progress, label=f"decoding valid ({directory.name})"),
                                              task.valid.target)["bleu"]
        chosen = max(valid, key=valid.get)
        model, vocab = load_translator(run_dir / chosen, task.device)
        data = task.data
        test = read_parallel(data.resolve(data.test_src), data.resolve(data.test_tgt))
        start = time.perf_counter()
        hypotheses = translate(model, vocab, test.source, decode_options, progress=progress, label="decoding test")
        seconds = time.perf_counter() - start
        write_atomic(run_dir / "test.hyp", "\n".join(hypotheses) + "\n")
        scores = score(hypotheses, test.target)
        return {"model": chosen, "valid_bleu": valid, "test_bleu": scores["bleu"], "test_chrf": scores["chrf"],
                "bleu_signature": scores["bleu_signature"], "chrf_signature": scores["chrf_signature"],
                "decode": asdict(decode_options), "test_decode_seconds": seconds,
                "parameters": count_parameters(model), "madds_at_64": count_madds(model, 64)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for split in ("train", "valid", "test"):
            for side in ("src", "tgt"):
                parser.add_argument(f"--{split}-{side}", metavar="PATH",
                                    help=f"{split} {'source' if side == 'src' else 'target'} text (plain or .gz; "
                                         "default: bundled Multi30k De-En)")
        add_decode_arguments(parser)

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        data = {f"data.{split}_{side}": getattr(args, f"{split}_{side}") for split in ("train", "valid", "test")
                for side in ("src", "tgt") if getattr(args, f"{split}_{side}")}
        return data, decode_options(args)

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """BLEU and chrF of ``--src`` against ``--ref`` (default: the run's test set)."""
        model, vocab = load_translator(directory, getattr(args, "device", None))
        data = self.saved_data(directory)
        src_path = Path(args.src) if args.src else data.resolve(data.test_src)
        ref_path = Path(args.ref) if args.ref else data.resolve(data.test_tgt)
        pair = read_parallel(src_path, ref_path)
        result = score(translate(model, vocab, pair.source, DecodeOptions(**decode_options(args))), pair.target)
        return (f"BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}\n"
                f"signature: {result['bleu_signature']}\n           {result['chrf_signature']}")

    def sample_input(self, task: TranslationTask) -> SampleInput:
        """The first validation pair as model inputs, with the source subword pieces as labels."""
        src = task._valid_src[0]
        batch = task.make_batch([src], [task._valid_tgt[0]])
        pieces = [task.vocab.source.tokenizer.id_to_token(i) for i in src]
        return (batch.src, batch.tgt_in), {}, pieces
