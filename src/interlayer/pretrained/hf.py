"""Hugging Face models in: :func:`from_hf` builds the interlayer model of a ``transformers`` checkpoint.

Why: the PA paper fine-tunes PA-BERT from released checkpoints (PA Sec. 4.1.2, Table 2, App. B.2.2: "we load the
pre-trained checkpoints ... the additional parameters are initialized randomly and trained jointly during
fine-tuning"), and researchers hold RoBERTa, DistilBERT, ViT and GPT-2 checkpoints too. A GPT-2 becomes the core's
language model (``arch="causal_lm"``) with the checkpoint's byte-level BPE (:mod:`interlayer.pretrained.gpt2`);
every other family a classifier. :func:`from_hf` reads a folder
(or an in-memory ``transformers`` model), picks its :mod:`family <interlayer.pretrained.families>`, builds the core
model with any method sections on top, loads every pretrained tensor and leaves what the methods add at its own
initialisation, listed in the :class:`ImportReport`. :mod:`interlayer.pretrained.export` writes models back.

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
  projections: :func:`restructuring_sections`) cannot receive the checkpoint: the import fails naming the
  tensor, unless ``reinitialise=True`` asks to load what fits and leave those parameters at their fresh
  initialisation (listed under ``initialised``; the checkpoint tensors they replace under ``restructured``).
  Predictive Attention, Multi-Pass and Crossformer soft guidance only add parameters and load as they are.
* **The model is returned in eval mode**, as ``from_pretrained`` does; weights are copied into fp32 parameters
  whatever the checkpoint's dtype. ``model.tokenizer`` is the checkpoint's tokenizer (None for images, or when
  the folder has none the core can reproduce; a GPT-2's is the ``lm`` task's
  :class:`~interlayer.data.lm_tokenizers.ByteBPETokenizer`) and ``model.import_report`` the report.
"""
from __future__ import annotations

import logging
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from ..build import build_model
from ..checkpoint import build_on_meta, check_buffers, check_config_sizes
from ..config import ModelConfig, config_from_dict
from ..core.hub import PretrainedMixin
from ..data.lm_tokenizers import LMTokenizer
from ..errors import ConfigError, PretrainedError, TokenizerError
from ..fileio import confined, read_json
from ..methods import METHODS
from ..models.registry import get_config
from ..models.vision import VisionConfig, build_vision_model
from .byte_level_bpe import BPETokenizer
from .exact_start import step_zero_notes
from .families import SUPPORTED_MODEL_TYPES, VIT_PIXEL_MEAN, VIT_PIXEL_STD, VIT_RESCALE, HeadLayout, HFFamily, family_of
from .gpt2 import load_gpt2_tokenizer
from .hf_files import read_weights, resolve_source
from .tokenization import PretrainedTokenizer, tokenizer_kind
from .wordpiece import WordPieceTokenizer

log = logging.getLogger(__name__)

OVERRIDABLE = ("dropout", "attn_dropout", "act_dropout", "attn_impl")
PROCESSOR_FILE = "preprocessor_config.json"
ST_MODULES = "modules.json"
REINITIALISE_HINT = ("these methods restructure the pretrained weights; pass reinitialise=True (CLI: --set "
                     "reinitialise=true) to load what fits and start the restructured parameters from their own "
                     "initialisation")
AnyConfig = Union[ModelConfig, VisionConfig]
AnyTokenizer = Union[PretrainedTokenizer, LMTokenizer]  # a classifier's, or a language model's (bytes or characters)


@dataclass
class ImportReport:
    """What an import did with every tensor (core names for the model, HF names for the checkpoint)."""

    source: str
    loaded: list[str] = field(default_factory=list)  # model parameters that received a checkpoint tensor
    initialised: list[str] = field(default_factory=list)  # model parameters left at their own initialisation
    ignored: list[str] = field(default_factory=list)  # checkpoint tensors with no place in the model
    restructured: list[str] = field(default_factory=list)  # checkpoint tensors a method replaced (reinitialise)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """What a run records (task.json): the counts, and by name what is new and what was left out."""
        counts = {"loaded": len(self.loaded), "initialised": len(self.initialised), "ignored": len(self.ignored)}
        out = {"source": self.source, "counts": counts, "initialised": list(self.initialised),
               "ignored": list(self.ignored), "notes": list(self.notes)}
        if self.restructured:
            counts["restructured"] = len(self.restructured)
            out["restructured"] = list(self.restructured)
        return out


@dataclass
class HFCheckpoint:
    """A Hugging Face folder read into memory: its config, family, tensors (without the task prefix, TF-era
    LayerNorm names modernised), tokenizer and image normalisation."""

    directory: Path
    hf: dict[str, Any]
    family: HFFamily
    state: dict[str, Tensor]
    tokenizer: Optional[AnyTokenizer] = None
    notes: list[str] = field(default_factory=list)
    pixel_mean: Optional[list[float]] = None
    pixel_std: Optional[list[float]] = None

    @property
    def source(self) -> str:
        return str(self.directory)


# ---------------------------------------------------------------------------------------------------- reading


def read_hf_config(directory: Union[str, Path]) -> tuple[dict[str, Any], HFFamily]:
    """``config.json`` of a supported checkpoint and its family, checked for everything the core cannot compute."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PretrainedError(f"{directory} is not a directory; pass a Hugging Face checkpoint directory "
                              "(config.json, model.safetensors or pytorch_model.bin, tokenizer or processor files)")
    path = directory / "config.json"
    if not os.path.lexists(path):
        raise PretrainedError(f"{directory} has no config.json, so it is not a Hugging Face checkpoint")
    hf = read_json(path, PretrainedError, within=directory)  # names the file: bad UTF-8, bad JSON, not an object
    model_type = hf.get("model_type")
    family = family_of(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise PretrainedError(f"{path}: model_type={hf.get('model_type')!r} is not supported; supported types: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)} (ALBERT shares layers and factorises "
                              "embeddings)")
    problems = family.problems(hf)
    if problems:
        raise PretrainedError(f"{path}: this {hf['model_type']} variant cannot be represented: " + "; ".join(problems))
    return hf, family


def normalise_names(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Drop the task checkpoints' encoder ``prefix`` and rename TF-era LayerNorm ``gamma``/``beta``."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        name = name[len(prefix):] if name.startswith(prefix) else name
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = tensor
    return out


def read_checkpoint(directory: Union[str, Path]) -> HFCheckpoint:
    """Config, family, tensors, tokenizer (text) or pixel normalisation (images) of a Hugging Face folder."""
    directory = Path(directory)
    hf, family = read_hf_config(directory)
    state = family.split(normalise_names(read_weights(directory), family.encoder_prefix(hf)))
    checkpoint = HFCheckpoint(directory, hf, family, state)
    if family.modality == "image":
        checkpoint.pixel_mean, checkpoint.pixel_std = _pixel_normalisation(directory, hf, checkpoint.notes)
    else:
        checkpoint.tokenizer = read_tokenizer(directory, hf, family, checkpoint.notes)
    return checkpoint


def read_tokenizer(directory: Path, hf: dict[str, Any], family: HFFamily, notes: list[str]
                   ) -> Optional[AnyTokenizer]:
    """The folder's tokenizer, truncating to what the position table numbers; None (with a note) without one."""
    if family.arch == "causal_lm" and tokenizer_kind(directory) == "bpe":
        tokenizer = load_gpt2_tokenizer(directory)
        if len(tokenizer) > hf["vocab_size"]:
            raise PretrainedError(f"{directory}: the tokenizer has {len(tokenizer)} ids but the embedding table "
                                  f"only {hf['vocab_size']} rows (vocab_size)")
        return tokenizer
    if tokenizer_kind(directory) is None or family.arch == "causal_lm":
        notes.append("no tokenizer files the core reproduces (vocab.txt, vocab.json + merges.txt, or a WordPiece or "
                     "BPE tokenizer.json; SentencePiece tokenizers such as XLM-R's are not supported): "
                     "model.tokenizer is None")
        return None
    tokenizer = load_tokenizer(directory, max_length=family.max_tokens(hf, _pad_from_config(hf)))
    if tokenizer.vocab_size > hf["vocab_size"]:
        raise PretrainedError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids but the embedding table "
                              f"only {hf['vocab_size']} rows (vocab_size)")
    return tokenizer


def load_tokenizer(directory: Union[str, Path], *, max_length: Optional[int] = None) -> PretrainedTokenizer:
    """The tokenizer saved in ``directory`` (a checkpoint or a fine-tuning run's folder), WordPiece or BPE as
    :func:`~interlayer.pretrained.tokenization.tokenizer_kind` decides."""
    kind = tokenizer_kind(directory)
    if kind is None:
        raise TokenizerError(f"{directory} has no tokenizer: expected vocab.txt (WordPiece), vocab.json + merges.txt "
                             "(byte-level BPE) or tokenizer.json")
    tokenizer_class = WordPieceTokenizer if kind == "wordpiece" else BPETokenizer
    return tokenizer_class.from_pretrained(directory, max_length=max_length)


def _pad_from_config(hf: dict[str, Any]) -> int:
    default = 1 if hf.get("model_type") in ("roberta", "xlm-roberta") else 0
    pad = hf.get("pad_token_id", default)
    return pad if isinstance(pad, int) else default


def _pixel_normalisation(directory: Path, hf: dict[str, Any], notes: list[str]) -> tuple[list[float], list[float]]:
    """``pixel_mean``/``pixel_std`` in [0, 1] pixel units that reproduce the image processor's rescale and
    normalisation: the model sees ``(s x - mean) / std`` with ``s = 255 * rescale_factor`` (or 255 without
    rescaling), i.e. ``(x - mean / s) / (std / s)``."""
    channels = int(hf.get("num_channels", 3))
    settings = read_json(directory / PROCESSOR_FILE, TokenizerError, optional=True, within=directory)
    if not settings:
        notes.append(f"no {PROCESSOR_FILE}: ViTImageProcessor's defaults (rescale 1/255, mean {VIT_PIXEL_MEAN}, "
                     f"std {VIT_PIXEL_STD}) are the model's pixel normalisation")
    scale = 255.0 * float(settings.get("rescale_factor", VIT_RESCALE)) if settings.get("do_rescale", True) else 255.0
    if settings.get("do_normalize", True):
        mean, std = settings.get("image_mean", VIT_PIXEL_MEAN), settings.get("image_std", VIT_PIXEL_STD)
    else:
        mean, std = 0.0, 1.0
    mean = mean if isinstance(mean, list) else [mean] * channels
    std = std if isinstance(std, list) else [std] * channels
    return [float(m) / scale for m in mean], [float(s) / scale for s in std]


def _sentence_transformers_pooling(directory: Path) -> Optional[str]:
    """``mean``/``cls`` from a sentence-transformers ``Pooling`` module config, or None when there is none."""
    modules_path = directory / ST_MODULES
    if not os.path.lexists(modules_path):
        return None
    for module in read_json(modules_path, PretrainedError, expect=list, within=directory):
        if isinstance(module, dict) and str(module.get("type", "")).endswith("Pooling"):
            config_path = directory / str(module.get("path", "")) / "config.json"
            modes = (read_json(confined(config_path, directory, PretrainedError, named_by=modules_path),
                               PretrainedError) if os.path.lexists(config_path) else {})
            chosen = [mode for mode, on in modes.items() if mode.startswith("pooling_mode_") and on]
            if chosen == ["pooling_mode_mean_tokens"]:
                return "mean"
            if chosen == ["pooling_mode_cls_token"]:
                return "cls"
            raise PretrainedError(f"{config_path}: pooling {chosen} has no core equivalent; pass pooling='cls' or "
                                  "pooling='mean'")
    return None


# ---------------------------------------------------------------------------------------------------- configs


def checkpoint_head(checkpoint: HFCheckpoint, num_classes: Optional[int]) -> tuple[Optional[HeadLayout], int]:
    """The checkpoint's classification head whose layout the core shares, and its class count (0 without)."""
    architectures = checkpoint.hf.get("architectures") or []
    for layout in checkpoint.family.heads:
        weight = next(name for name in layout.head if name.endswith("weight"))
        if any(a in layout.architectures for a in architectures) and weight in checkpoint.state:
            classes = checkpoint.state[weight].shape[0]
            if classes < 2 and num_classes is None:
                raise PretrainedError(f"the checkpoint's classifier has {classes} output (regression); interlayer "
                                      "classifiers need num_classes >= 2: pass num_classes=N to start a new head")
            return layout, classes
    return None, 0


def _num_labels(hf: dict[str, Any]) -> int:
    labels = hf.get("id2label")
    return len(labels) if labels else int(hf.get("num_labels", 2))


def model_config(checkpoint: HFCheckpoint, *, num_classes: Optional[int] = None, pooling: Optional[str] = None,
                 pooler: Optional[bool] = None, extra_sections: Optional[dict[str, Any]] = None,
                 overrides: Optional[dict[str, Any]] = None, input_size: Optional[list[int]] = None) -> AnyConfig:
    """The interlayer config of a checkpoint: its family's core fields, the head, method sections and overrides.

    ``input_size`` (images only) is the ``[channels, height, width]`` of the images the model will be given, when
    they differ from the checkpoint's (:class:`~interlayer.models.vision.VisionConfig`'s ``input_size``).
    """
    family, hf = checkpoint.family, checkpoint.hf
    if family.arch == "causal_lm":
        return _language_model_config(checkpoint, num_classes=num_classes, pooling=pooling, pooler=pooler,
                                      extra_sections=extra_sections, overrides=overrides)
    layout, head_classes = checkpoint_head(checkpoint, num_classes)
    classes = num_classes if num_classes is not None else (head_classes or _num_labels(hf))
    pooling, pooler = _pooling_plan(checkpoint, pooling, pooler)
    fields = {**family.core_fields(hf), "num_classes": classes, "pooling": pooling,
              "classifier_hidden": _pooler_width(family, hf) if pooler else 0}
    fields.update(_checked_sections(extra_sections, overrides, family))
    source = checkpoint.source
    if family.modality == "text":
        fields["pad_id"] = _pad_id(checkpoint)
        return config_from_dict(fields, source=source)
    data: dict[str, Any] = {**family.vision_fields(hf), "pixel_mean": checkpoint.pixel_mean,
                            "pixel_std": checkpoint.pixel_std, "encoder": fields}
    if input_size is not None:
        data["input_size"] = list(input_size)
    try:
        return get_config(data, family="image")
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _language_model_config(checkpoint: HFCheckpoint, *, extra_sections: Optional[dict[str, Any]],
                           overrides: Optional[dict[str, Any]], **head: Any) -> ModelConfig:
    """A GPT-2's config: its family's fields and the method sections; the classifier's options do not apply."""
    given = [name for name, value in head.items() if value is not None]
    if given:
        raise PretrainedError(f"{checkpoint.source}: {', '.join(given)} do not apply to a {checkpoint.family.title}, "
                              "a language model without a classifier")
    fields = {**checkpoint.family.core_fields(checkpoint.hf),
              **_checked_sections(extra_sections, overrides, checkpoint.family)}
    return config_from_dict(fields, source=checkpoint.source)


def _pooling_plan(checkpoint: HFCheckpoint, pooling: Optional[str], pooler: Optional[bool]) -> tuple[str, bool]:
    """Resolve the ``pooling``/``pooler`` defaults (see the module docstring)."""
    family, state = checkpoint.family, checkpoint.state
    if family.modality == "image":
        if pooling not in (None, "cls"):
            raise PretrainedError(f"{checkpoint.source}: pooling={pooling!r} is not possible for a pretrained ViT: "
                                  "its position table numbers the CLS token, which the core's ViT only has with "
                                  "pooling='cls'")
        has_pooler = any(name in state for name in family.pooler_map())
        pooler = has_pooler if pooler is None else pooler
        if pooler and checkpoint.hf.get("pooler_act", "tanh") != "tanh":
            raise PretrainedError(f"{checkpoint.source}: pooler_act={checkpoint.hf['pooler_act']!r} (the core's "
                                  "pooler is tanh); import with pooler=False to leave the pooler out")
        return "cls", pooler
    st_pooling = _sentence_transformers_pooling(checkpoint.directory)
    pooling = pooling or st_pooling or "cls"
    if pooler is None:
        pooler = family.has_pooler and pooling == "cls" and st_pooling != "cls"
    return pooling, pooler


def _pooler_width(family: HFFamily, hf: dict[str, Any]) -> int:
    width = hf.get("hidden_size", hf.get("dim"))
    return int(hf.get("pooler_output_size", width)) if family.modality == "image" else int(width)


def _pad_id(checkpoint: HFCheckpoint) -> int:
    """The tokenizer's pad id (BERT's tokenizers decide it); RoBERTa's positions need config.json's to agree."""
    configured = _pad_from_config(checkpoint.hf)
    tokenizer = checkpoint.tokenizer
    if not isinstance(tokenizer, PretrainedTokenizer):
        return configured
    if tokenizer.pad_id != configured and checkpoint.family.name == "roberta":
        raise PretrainedError(f"{checkpoint.source}: the tokenizer pads with id {tokenizer.pad_id} but config.json's "
                              f"pad_token_id={configured} numbers the positions; RoBERTa needs one padding id for "
                              "both")
    return tokenizer.pad_id


def _checked_sections(extra_sections: Optional[dict[str, Any]], overrides: Optional[dict[str, Any]],
                      family: HFFamily) -> dict[str, Any]:
    """Method sections and the few core fields that do not change what the weights compute."""
    sections = dict(extra_sections or {})
    method_names = [m.name for m in METHODS]
    for name in sections:
        if name not in method_names:
            raise ConfigError(f"extra_sections: {name!r} is not a method section; valid: {', '.join(method_names)}"
                              " (core fields go in overrides)")
    overrides = dict(overrides or {})
    for key in overrides:
        if key not in OVERRIDABLE:
            raise ConfigError(f"overrides: {key!r} cannot be changed on a pretrained {family.title} (it would change "
                              f"what the weights compute); changeable: {', '.join(OVERRIDABLE)}")
    return {**overrides, **sections}


def encoder_config(config: AnyConfig) -> ModelConfig:
    """The core encoder's config inside a model config (the ViT's ``encoder``, else the config itself)."""
    return config.encoder if isinstance(config, VisionConfig) else config


def build(config: AnyConfig) -> nn.Module:
    """The interlayer model of a config :func:`model_config` made (a vision or a text classifier)."""
    return build_vision_model(config) if isinstance(config, VisionConfig) else build_model(config)


# ---------------------------------------------------------------------------------------------------- loading


def from_hf(source: Union[str, Path, nn.Module], *, processor: Any = None, num_classes: Optional[int] = None,
            pooling: Optional[str] = None, pooler: Optional[bool] = None,
            extra_sections: Optional[dict[str, Any]] = None, overrides: Optional[dict[str, Any]] = None,
            reinitialise: bool = False, revision: Optional[str] = None, local_files_only: bool = False,
            cache_dir: Optional[Union[str, Path]] = None, dtype: Union[torch.dtype, str, None] = None,
            torch_dtype: Union[torch.dtype, str, None] = None) -> nn.Module:
    """The interlayer model of a Hugging Face checkpoint folder, Hub id or in-memory ``transformers`` model.

    * ``source``: a folder (``config.json``, weights, tokenizer or ``preprocessor_config.json``); a Hub id
      (``"openai-community/gpt2"``), read from the local Hugging Face cache as ``from_pretrained`` reads it
      (``revision``, ``local_files_only``, ``cache_dir``: :func:`resolve_source`); or a ``transformers`` model,
      which is written to a temporary folder with its own ``save_pretrained`` (the on-disk names are the stable
      ones) together with ``processor`` (its tokenizer or image processor, if any).
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

def layers_in_weights(family: HFFamily, state: dict[str, Tensor]) -> int:
    """How many encoder layers the checkpoint's tensors hold: layer ``k`` counts when any of its names is there."""
    count, known = 0, set(family.layer_map(0))
    while True:
        names = set(family.layer_map(count + 1)) - known
        if not names & state.keys():
            return count
        known |= names
        count += 1


def check_sizes(checkpoint: HFCheckpoint, config: AnyConfig, *, reinitialise: bool = False) -> None:
    """Refuse a ``config.json`` whose sizes the weights do not hold, before any model is built.

    A folder from a stranger may declare ``num_hidden_layers=1000000`` over one layer of weights, or
    ``vocab_size=1e12``: building that model first would take the memory until the machine gives out. The layer
    count is compared with the layers the tensors hold (cheap); then the model is built on PyTorch's ``meta``
    device (shapes only, no memory) and every tensor checked against its parameter, which refuses any other size
    (vocabulary, width, positions, patches) naming the tensor, as the real load would. The method sections (the
    user's, on top of the checkpoint) and the build pass the checks every model folder gets
    (:mod:`interlayer.checkpoint`: no section size the tensors do not justify, a build stopped after twice the
    checkpoint's tensors, tables outside the weights bounded).
    """
    source = checkpoint.source
    declared = encoder_config(config).enc_layers
    present = layers_in_weights(checkpoint.family, checkpoint.state)
    if declared > present:
        family = checkpoint.family
        missing = sorted(set(family.layer_map(present + 1)) - set(family.layer_map(present)))
        raise PretrainedError(f"{source} lacks {family.title} encoder tensors {_first(missing)} (config.json "
                              f"declares {declared} layers, the weights hold {present}); refused before any model "
                              "was built: the folder is damaged or its config.json belongs to another model")
    shapes = {name: tuple(tensor.shape) for name, tensor in checkpoint.state.items()}
    encoder = encoder_config(config)
    sections = {method.name: asdict(section) for method, section in encoder.sections()}
    check_config_sizes(sections, shapes, config_class=type(encoder), source=f"{source} (method sections)",
                       holder=source, error=PretrainedError)
    shadow = build_on_meta(lambda: build(config), len(shapes), source=source, holder=f"{source}'s weights",
                           error=PretrainedError)
    load_checkpoint_state(shadow, checkpoint, reinitialise=reinitialise, log_report=False)
    check_buffers(shadow, shapes, source=source, holder=f"{source}'s weights", error=PretrainedError)


def restructuring_sections(cfg: ModelConfig) -> list[str]:
    """The method sections of ``cfg`` that restructure pretrained weights (they need ``reinitialise``): those that
    replace modules (LW, the conv branch), delete projections (CLA's reusing layers, SVFormer's values beyond the
    first layer) or tie matrices the checkpoint holds apart (Crossformer hard guidance, layer sharing). An import
    without ``reinitialise`` fails for exactly these (tests/test_hf_gpt2.py checks every method)."""
    names = [name for name in ("lightweight", "conv_branch") if getattr(cfg, name) is not None]
    if cfg.crossformer is not None and cfg.crossformer.hard:
        names.append("crossformer.hard")
    if cfg.cla is not None and cfg.cla.sharing_factor > 1:
        names.append("cla")
    if cfg.value_residual is not None and cfg.value_residual.mode == "svformer":
        names.append("value_residual.mode=svformer")
    if cfg.layer_sharing is not None and cfg.layer_sharing.repeats != 1:
        names.append("layer_sharing")
    return names


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


def load_checkpoint_state(model: nn.Module, checkpoint: HFCheckpoint, *, reinitialise: bool = False,
                          log_report: bool = True, measure_start: bool = True) -> ImportReport:
    """Copy the checkpoint's tensors into ``model`` (built from :func:`model_config`); see the module docstring.
    With ``measure_start`` and ``log_report`` (a real import, not the shape check) the report's notes also name
    every method section that changes the imported function before the first update, measured
    (:mod:`~interlayer.pretrained.exact_start`).

    Raises :class:`PretrainedError` when an encoder tensor is missing from the checkpoint, is unknown, has no
    place or another shape in the model, or two different tensors would land in one tied parameter (the last
    three are restructured parameters, left at their initialisation with ``reinitialise=True``).
    """
    family, state, source = checkpoint.family, checkpoint.state, checkpoint.source
    cfg = encoder_config(model.config)
    mapping = family.layer_map(cfg.enc_layers)
    missing = [name for name in mapping if name not in state]
    if missing:
        raise PretrainedError(f"{source} lacks {family.title} encoder tensors {_first(missing)} (for the "
                              f"{cfg.enc_layers} layers its config declares); found e.g. {_first(sorted(state))}")
    layout, classes = checkpoint_head(checkpoint, cfg.num_classes)
    pooler = layout.pooler if layout is not None and layout.pooler else family.pooler_map()
    if cfg.classifier_hidden:
        mapping.update({k: v for k, v in pooler.items() if k in state})
    mapping.update({k: v for k, v in family.output_map(cfg).items() if k in state})
    head_loaded = (layout is not None and classes == cfg.num_classes and cfg.pooling == "cls"
                   and layout.needs_pooler == bool(cfg.classifier_hidden))
    if head_loaded:
        mapping.update(layout.head)
    known = set(mapping) | set(family.ignorable) | set(family.pooler_map())
    unexpected = [k for k in state if k.startswith(family.namespaces) and k not in known]
    if unexpected:
        raise PretrainedError(f"{source} has encoder tensors this {family.title} layout does not know: "
                              f"{_first(unexpected)}")
    report = ImportReport(source=source)
    filled = _copy_state(model, family, mapping, state, report, source, reinitialise)
    params = dict(model.named_parameters(remove_duplicate=False))
    canonical = {id(p): n for n, p in reversed(list(params.items()))}
    report.initialised = [name for pid, name in sorted(canonical.items(), key=lambda x: x[1]) if pid not in filled]
    report.ignored = sorted(k for k in state if k not in mapping)
    _init_fresh_heads(model, family, report, float(checkpoint.hf.get("initializer_range", 0.02)))
    report.notes += checkpoint.notes + _notes(checkpoint, cfg, report, layout, head_loaded, classes)
    if log_report and measure_start:  # not for the shape check on the meta device (check_sizes)
        report.notes += step_zero_notes(model, build, lambda plain: load_checkpoint_state(
            plain, checkpoint, log_report=False).initialised)
        log.info("imported %s: %d tensors loaded, initialised %s, ignored %s, restructured %s; %s", source,
                 len(report.loaded), report.initialised, report.ignored, report.restructured, " ".join(report.notes))
    return report


def load_checkpoint(model: nn.Module, directory: Union[str, Path]) -> ImportReport:
    """Copy checkpoint ``directory``'s tensors into ``model``, built from a config the import made for it.

    Why: a fine-tuning run builds its model itself, after seeding, so that what the checkpoint lacks (PA's
    convolutions, a new head) gets the run's seeded initialisation; this is the loading half of the import (the
    same head policy, report and notes). ``torch.manual_seed(s)`` then ``build_model(cfg)`` and
    ``load_checkpoint`` give exactly the model of ``torch.manual_seed(s)`` then ``import_bert`` with that config's
    options. A config with a section that restructures pretrained weights was only built because the import was
    asked to re-initialise them (``reinitialise=True``), so they are re-initialised here too. The model is left in
    its current mode.
    """
    reinitialise = bool(restructuring_sections(encoder_config(model.config)))
    return load_checkpoint_state(model, read_checkpoint(directory), reinitialise=reinitialise)


def checkpoint_tokenizer(directory: Union[str, Path]) -> PretrainedTokenizer:
    """The checkpoint's tokenizer as :func:`import_bert` returns it (truncating to the position table at most)."""
    checkpoint = read_checkpoint(directory)
    if checkpoint.tokenizer is None:
        raise PretrainedError(f"{directory}: " + " ".join(checkpoint.notes))
    return checkpoint.tokenizer


def _copy_state(model: nn.Module, family: HFFamily, mapping: dict[str, str], state: dict[str, Tensor],
                report: ImportReport, source: str, reinitialise: bool) -> set[int]:
    """Copy ``mapping``'s tensors; returns the ids of the parameters that received one."""
    cfg = encoder_config(model.config)
    params = dict(model.named_parameters(remove_duplicate=False))
    groups: dict[int, list[tuple[str, str, Tensor]]] = {}
    for hf_name, core_name in mapping.items():
        tensor = family.to_core(hf_name, state[hf_name])
        if core_name not in params:
            problem = (f"{hf_name} has no place in this model ({core_name} does not exist): {_methods(cfg)} replaced "
                       "the pretrained module")
        elif params[core_name].shape != tensor.shape:
            problem = (f"{hf_name} has shape {tuple(tensor.shape)} but {core_name} expects "
                       f"{tuple(params[core_name].shape)} ({_methods(cfg)} changed the module)")
        else:
            groups.setdefault(id(params[core_name]), []).append((hf_name, core_name, tensor))
            continue
        if not reinitialise or not cfg.sections():
            raise PretrainedError(f"{source}: {problem}" + (f"; {REINITIALISE_HINT}" if cfg.sections() else ""))
        report.restructured.append(hf_name)
    filled: set[int] = set()
    with torch.no_grad():
        for pid, group in groups.items():
            (first, core_name, tensor), rest = group[0], group[1:]
            clash = next((other for other in rest if not torch.equal(other[2].to(tensor.dtype), tensor)), None)
            if clash is not None:
                if not reinitialise:
                    raise PretrainedError(f"{source}: {clash[1]} is tied to the parameter that received {first}, but "
                                          f"{clash[0]} holds different pretrained values; {_methods(cfg)} ties "
                                          "matrices the checkpoint keeps apart (use crossformer.soft to guide them "
                                          f"instead); {REINITIALISE_HINT}")
                report.restructured += [name for name, _, _ in group]
                continue
            params[core_name].copy_(tensor)
            filled.add(pid)
            report.loaded += [name for _, name, _ in group]
    report.loaded.sort()
    report.restructured.sort()
    return filled


def _init_fresh_heads(model: nn.Module, family: HFFamily, report: ImportReport, std: float) -> None:
    """A pooler/head the checkpoint did not provide: ``transformers``' init (normal(0, std), zero bias)."""
    for name in ("pooler.0", "head"):
        module_name = family.core_prefix + name
        if f"{module_name}.weight" not in report.initialised:
            continue
        module = model.get_submodule(module_name)
        nn.init.normal_(module.weight, std=std)
        nn.init.zeros_(module.bias)
        if name == "pooler.0":
            warnings.warn(f"{report.source} has no pooler weights: the pooler was initialised randomly (fine-tune "
                          "before use, or import with pooling='mean' / pooler=False)", stacklevel=5)
            report.notes.append("the pooler was initialised randomly (not in the checkpoint)")


def _notes(checkpoint: HFCheckpoint, cfg: ModelConfig, report: ImportReport, layout: Optional[HeadLayout],
           head_loaded: bool, classes: int) -> list[str]:
    """What the import could not carry over exactly, in words."""
    hf, notes, tokenizer = checkpoint.hf, [], checkpoint.tokenizer
    if isinstance(tokenizer, PretrainedTokenizer) and tokenizer.pad_id != _pad_from_config(hf):
        notes.append(f"pad id {tokenizer.pad_id} is the tokenizer's {tokenizer.special_tokens['pad_token']}, not "
                     f"config.json's pad_token_id={_pad_from_config(hf)}")
    if layout is not None and not head_loaded:
        notes.append(f"the checkpoint's {classes}-class classifier was not loaded (num_classes={cfg.num_classes}, "
                     f"pooling={cfg.pooling!r}, pooler={bool(cfg.classifier_hidden)}): the head is new")
    task_head = [name for name in report.ignored if name.startswith(("classifier.", "pre_classifier."))]
    if layout is None and task_head:
        notes.append(f"the checkpoint's task head ({_first(task_head)}) has no core equivalent (its activation is not "
                     "the core pooler's tanh): ignored, the head is new")
    if hf.get("classifier_dropout") not in (None, hf.get("hidden_dropout_prob")):
        notes.append(f"classifier_dropout={hf['classifier_dropout']} is not used: the core's head dropout is "
                     f"dropout={cfg.dropout}")
    return notes


def _methods(cfg: ModelConfig) -> str:
    names = [m.name for m, _ in cfg.sections()]
    return f"the method section(s) {', '.join(names)}" if names else "the config"


def _first(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")
