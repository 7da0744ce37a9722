"""The interlayer config of a Hugging Face checkpoint (:func:`model_config`), and the model it builds.

The family gives the core fields; the head, the pooler and the pooling follow the policies of
:mod:`interlayer.pretrained.hf` (its module docstring); the user adds method sections (``extra_sections``) and the
few core fields that leave what the weights compute unchanged (:data:`OVERRIDABLE`). A ViT's config is a
:class:`~interlayer.models.vision.VisionConfig` around the core encoder's (:func:`encoder_config`).
"""
from __future__ import annotations

from typing import Any, Optional, Union

from torch import nn

from ..build import build_model
from ..config import ModelConfig, config_from_dict
from ..data.tokenizers.pretrained import PretrainedTokenizer
from ..errors import ConfigError, PretrainedError
from ..methods import METHODS
from ..models.registry import get_config
from ..models.vision import VisionConfig, build_vision_model
from .families import HFFamily
from .hf_checkpoint import HFCheckpoint, checkpoint_head, config_pad_id, sentence_transformers_pooling

OVERRIDABLE = ("dropout", "attn_dropout", "act_dropout", "attn_impl")
AnyConfig = Union[ModelConfig, VisionConfig]


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
    st_pooling = sentence_transformers_pooling(checkpoint.directory)
    pooling = pooling or st_pooling or "cls"
    if pooler is None:
        pooler = family.has_pooler and pooling == "cls" and st_pooling != "cls"
    return pooling, pooler


def _pooler_width(family: HFFamily, hf: dict[str, Any]) -> int:
    width = hf.get("hidden_size", hf.get("dim"))
    return int(hf.get("pooler_output_size", width)) if family.modality == "image" else int(width)


def _pad_id(checkpoint: HFCheckpoint) -> int:
    """The tokenizer's pad id (BERT's tokenizers decide it); RoBERTa's positions need config.json's to agree."""
    configured = config_pad_id(checkpoint.hf)
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
