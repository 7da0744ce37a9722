"""Hugging Face models in: :func:`from_hf` builds the interlayer model of a ``transformers`` checkpoint.

Why: the PA paper fine-tunes PA-BERT from released checkpoints (PA Sec. 4.1.2, Table 2, App. B.2.2: "we load the
pre-trained checkpoints ... the additional parameters are initialized randomly and trained jointly during
fine-tuning"), and researchers hold RoBERTa, DistilBERT, ViT and GPT-2 checkpoints too. A GPT-2 becomes the core's
language model (``arch="causal_lm"``) with the checkpoint's byte-level BPE (:mod:`interlayer.data.tokenizers.gpt2`);
every other family a classifier. :func:`from_hf` reads a folder (or an in-memory ``transformers`` model), picks
its :mod:`family <interlayer.pretrained.families>`, builds the core model with any method sections on top, loads
every pretrained tensor and leaves what the methods add at its own initialisation, listed in the import report.
Each step is a module: reading the folder (:mod:`~interlayer.pretrained.hf_checkpoint`), the model's config
(:mod:`~interlayer.pretrained.hf_core_config`), the tensors into the model and the report
(:mod:`~interlayer.pretrained.hf_load`); :mod:`interlayer.pretrained.export` writes models back.

Policies where the checkpoints leave room (each with its reason):

* **Refusals name the field**: a ``model_type`` without a family, an activation other than exact GELU/ReLU,
  relative position embeddings, decoders, ELECTRA's embedding projection, ViT's ``qkv_bias=false``, GPT-2's
  per-layer score scaling (:class:`~interlayer.pretrained.families.GPT2Family`). Missing
  encoder tensors, unknown tensors inside the encoder's namespaces and shape mismatches name the tensor.
* **Pooler**: ``pooling="cls"`` uses the checkpoint's tanh pooler (BERT, RoBERTa, ``ViTModel``); one without
  pooler weights gets a fresh pooler initialised as ``transformers`` does (normal, std ``initializer_range``; zero
  bias), with a warning. DistilBERT and ``ViTForImageClassification`` have none, so their default is no pooler.
  ``pooling=None`` reads a sentence-transformers ``Pooling`` config when present (all-MiniLM-L6-v2: mean pooling).
* **Heads**: a sequence/image classification head whose layout the core shares (BERT's ``classifier``, RoBERTa's
  ``classifier.dense``/``out_proj``, ViT's ``classifier``) loads when the class count matches; otherwise the head
  is new. Pre-training heads and heads the core cannot express (DistilBERT's ReLU ``pre_classifier``, ELECTRA's
  GELU head) are skipped and listed under ``ignored``.
* **Methods that restructure pretrained weights** (LW group-wise layers, the conv branch, Crossformer hard
  guidance and layer sharing tying matrices the checkpoint holds apart, CLA and SVFormer deleting key/value
  projections: each method's ``restructures``) cannot receive the checkpoint: the import fails naming the
  tensor, unless ``reinitialise=True`` asks to load what fits and leave those parameters at their fresh
  initialisation (listed under ``initialised``; the checkpoint tensors they replace under ``restructured``).
  Predictive Attention, Multi-Pass and Crossformer soft guidance only add parameters and load as they are.
* **The model is returned in eval mode**, as ``from_pretrained`` does; weights are copied into fp32 parameters
  whatever the checkpoint's dtype. ``model.tokenizer`` is the checkpoint's tokenizer (None for images, or when
  the folder has none the core can reproduce; a GPT-2's is the ``lm`` task's
  :class:`~interlayer.data.tokenizers.language_model.ByteBPETokenizer`) and ``model.import_report`` the report.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from ..config import ModelConfig
from ..core.hub import PretrainedMixin
from ..errors import ConfigError, PretrainedError
from .hf_checkpoint import HFCheckpoint, read_checkpoint
from .hf_core_config import build, encoder_config, model_config
from .hf_files import resolve_source
from .hf_load import ImportReport, check_sizes, load_checkpoint_state


def from_hf(source: Union[str, Path, nn.Module], *, processor: Any = None, num_classes: Optional[int] = None,
            pooling: Optional[str] = None, pooler: Optional[bool] = None,
            extra_sections: Optional[dict[str, Any]] = None, overrides: Optional[dict[str, Any]] = None,
            reinitialise: bool = False, revision: Optional[str] = None, local_files_only: bool = False,
            cache_dir: Optional[Union[str, Path]] = None, dtype: Union[torch.dtype, str, None] = None,
            torch_dtype: Union[torch.dtype, str, None] = None) -> nn.Module:
    """The interlayer model of a Hugging Face checkpoint folder, Hub id or in-memory ``transformers`` model.

    * ``source``: a folder (``config.json``, weights, tokenizer or ``preprocessor_config.json``); a Hub id
      (``"openai-community/gpt2"``), read from the local Hugging Face cache as ``from_pretrained`` reads it
      (``revision``, ``local_files_only``, ``cache_dir``: :func:`~interlayer.pretrained.hf_files.resolve_source`);
      or a ``transformers`` model, which is written to a temporary folder with its own ``save_pretrained`` (the
      on-disk names are the stable ones) together with ``processor`` (its tokenizer or image processor, if any).
    * ``num_classes``: the head's classes; None takes a loadable classification head's, else ``num_labels``.
    * ``pooling`` / ``pooler``: text ``"cls"`` or ``"mean"`` and BERT's tanh pooler (see the module docstring).
    * ``extra_sections``: method sections, e.g. ``{"predictive": {"alpha": 0.2}}`` (PA-BERT, PA Sec. 4.1.2).
    * ``overrides``: core fields that do not change what the weights compute (:data:`OVERRIDABLE`).
    * ``reinitialise``: let methods that restructure pretrained weights (LW, conv branch, Crossformer hard
      guidance) start those parameters afresh instead of refusing.

    * ``dtype`` (``transformers``' older name: ``torch_dtype``): the parameters' dtype, a ``torch.dtype``, its name
      (``"bfloat16"``) or ``"auto"`` (the checkpoint's: ``config.json``'s ``dtype``/``torch_dtype``, else its
      first floating-point tensor's); default float32. The weights are loaded in float32 and then cast.

    Returns the model in eval mode with ``model.import_report`` (:class:`ImportReport`, also logged),
    ``model.tokenizer`` and the checkpoint's special token ids and label names on ``model.config``
    (``bos_token_id``, ``eos_token_id``, ``pad_token_id``, ``id2label``: :mod:`interlayer.core.hf_names`).
    """
    if dtype is not None and torch_dtype is not None:
        raise TypeError("got both dtype and torch_dtype; torch_dtype is transformers' older name of dtype, pass one")
    dtype = dtype if dtype is not None else torch_dtype
    if isinstance(source, nn.Module):
        with tempfile.TemporaryDirectory(prefix="interlayer-hf-") as tmp:
            _save_transformers_model(source, processor, Path(tmp))
            model = from_hf(tmp, num_classes=num_classes, pooling=pooling, pooler=pooler,
                            extra_sections=extra_sections, overrides=overrides, reinitialise=reinitialise,
                            dtype=dtype)
        model.import_report.source = f"in-memory {type(source).__name__}"
        return model
    directory = resolve_source(source, revision=revision, local_files_only=local_files_only, cache_dir=cache_dir)
    checkpoint = read_checkpoint(directory)
    model = from_checkpoint(checkpoint, num_classes=num_classes, pooling=pooling, pooler=pooler,
                            extra_sections=extra_sections, overrides=overrides, reinitialise=reinitialise)
    chosen = _dtype(dtype, checkpoint)
    return model.to(chosen) if chosen is not None else model


def _dtype(dtype: Union[torch.dtype, str, None], checkpoint: HFCheckpoint) -> Optional[torch.dtype]:
    """The dtype ``from_hf(dtype=...)`` asks for (see there), or None to keep float32."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        named = checkpoint.hf.get("dtype") or checkpoint.hf.get("torch_dtype")
        if named is None:
            return next((t.dtype for t in checkpoint.state.values() if t.is_floating_point()), None)
        dtype = str(named)
    chosen = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(chosen, torch.dtype) or not chosen.is_floating_point:
        raise ConfigError(f"dtype={dtype!r} is not a floating-point torch dtype; give e.g. torch.bfloat16, "
                          "'float16', 'float32' or 'auto' (the checkpoint's)")
    return chosen


def from_checkpoint(checkpoint: HFCheckpoint, *, reinitialise: bool = False, measure_start: bool = True,
                    **options: Any) -> nn.Module:
    """:func:`from_hf` for a checkpoint already read; ``options`` are :func:`model_config`'s; ``measure_start``:
    measure what each method changes before the first update (:func:`load_checkpoint_state`; off for an import
    that only checks a config)."""
    config = model_config(checkpoint, **options)
    check_sizes(checkpoint, config, reinitialise=reinitialise)
    model = build(config)
    model.import_report = load_checkpoint_state(model, checkpoint, reinitialise=reinitialise,
                                                measure_start=measure_start)
    model.tokenizer = checkpoint.tokenizer
    _special_settings(checkpoint, encoder_config(model.config), model.import_report)
    return model.eval()


def _special_settings(checkpoint: HFCheckpoint, cfg: ModelConfig, report: ImportReport) -> None:
    """The checkpoint's special token ids, and its label names when its head was loaded, on ``cfg``."""
    hf = checkpoint.hf
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(hf.get(key), int):
            setattr(cfg, key, hf[key])
    names = hf.get("id2label")
    head = f"{checkpoint.family.core_prefix}head.weight"
    if isinstance(names, dict) and len(names) == cfg.num_classes and head in report.loaded:
        cfg.id2label = {int(k): str(v) for k, v in names.items()}
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}


def _save_transformers_model(model: nn.Module, processor: Any, directory: Path) -> None:
    if isinstance(model, PretrainedMixin):
        raise PretrainedError(f"{type(model).__name__} is already an interlayer model; from_hf takes transformers "
                              "models (or folders)")
    if not callable(getattr(model, "save_pretrained", None)) or not hasattr(getattr(model, "config", None),
                                                                            "model_type"):
        raise PretrainedError(f"{type(model).__name__} is not a transformers model (no save_pretrained or "
                              "config.model_type); pass a transformers PreTrainedModel or a checkpoint folder")
    model.save_pretrained(str(directory))
    if processor is not None:
        processor.save_pretrained(str(directory))
