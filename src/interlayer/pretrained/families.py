"""The Hugging Face model families interlayer imports and exports, each one mapping onto the core.

A :class:`HFFamily` says which ``config.json`` ``model_type``s it covers, which core fields its config gives (and
which settings it refuses, naming the field), how its tensor names map onto core parameters, which task heads
load, and how ``config.json`` is written back. Import, export and fine-tuning
(:mod:`interlayer.pretrained.hf`) only go through these mappings, so a further family is one more entry in
:data:`FAMILIES`. A checkpoint tensor that holds several core parameters (GPT-2's fused query/key/value) is split
on reading (:meth:`HFFamily.split`) into named parts and joined again on export (:meth:`HFFamily.join`).

The families (each mapping's reasons are on its class):

* :class:`BertFamily` -- ``bert``, ``electra`` (``embedding_size == hidden_size``): post-LN, learned positions
  from 0, token types, embedding LayerNorm, the tanh pooler.
* :class:`RobertaFamily` -- ``roberta``, ``xlm-roberta``: BERT's layers with positions numbered from
  ``pad_token_id + 1`` over non-padding tokens (core ``position_start="after_pad"``); the
  ``RobertaForSequenceClassification`` head (dense + tanh + out_proj on ``<s>``) is the core's pooler and head.
* :class:`DistilBertFamily` -- ``distilbert``: BERT's layer under other names, no token types, no pooler,
  LayerNorm eps fixed at 1e-12 in ``transformers``.
* :class:`ViTFamily` -- ``vit``: the core's ViT (:mod:`interlayer.models.vision`): stride-p convolution over patches,
  CLS token, learned positions, pre-LN layers (``layernorm_before``/``after``), the final LayerNorm, the tanh pooler
  of ``ViTModel`` when present; pixel normalisation from ``preprocessor_config.json``.
* :class:`GPT2Family` -- ``gpt2``: the core's decoder-only language model (``arch="causal_lm"``): pre-LN layers,
  learned positions, ``Conv1D`` weights transposed, the fused ``c_attn`` split into query, key and value, the output
  tied to the token table (or not, as ``tie_word_embeddings`` says).
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch
from torch import Tensor

from ..config import ModelConfig

ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # HF activation name -> core activation (HF "gelu" is exact erf)
Modality = Literal["text", "image"]
CoreArch = Literal["encoder_classifier", "causal_lm"]


@dataclass(frozen=True)
class HeadLayout:
    """A task head of ``architectures`` whose tensors load into the core: ``pooler`` names load whenever the core
    model has its tanh pooler, ``head`` names when, in addition, the class count matches."""

    architectures: tuple[str, ...]
    head: dict[str, str]
    pooler: dict[str, str] = field(default_factory=dict)
    needs_pooler: bool = True  # False: the head reads the [CLS] state directly (ViTForImageClassification)


class HFFamily(ABC):
    """One ``transformers`` architecture family on the core (see the module docstring)."""

    name: str = ""
    title: str = ""  # in messages: "a pretrained BERT"
    model_types: tuple[str, ...] = ()
    prefix: str = ""  # the encoder's prefix in task checkpoints ("bert.")
    modality: Modality = "text"
    arch: CoreArch = "encoder_classifier"  # the core model the family's checkpoints become
    core_prefix: str = ""  # where the EncoderClassifier sits in the interlayer model ("classifier." for images)
    namespaces: tuple[str, ...] = ()  # an unknown tensor under these is an error, not a head to skip
    ignorable: tuple[str, ...] = ()  # tensors under the namespaces that carry no trained values
    has_pooler: bool = True
    heads: tuple[HeadLayout, ...] = ()
    export_model: str = ""  # transformers class of an export without a head
    needed: tuple[str, ...] = ()  # integer config.json fields the mapping needs
    unused_fields: tuple[str, ...] = ()  # core fields that do not act in this family's models (export ignores them)
    activation_key = "hidden_act"

    def encoder_prefix(self, hf: dict[str, Any]) -> str:
        """The encoder's prefix in this checkpoint's task models."""
        return self.prefix

    def problems(self, hf: dict[str, Any]) -> list[str]:
        """What this checkpoint's config asks for that the core cannot compute, each naming the field."""
        problems = [f"{key} is missing" for key in self.needed if not isinstance(hf.get(key), int)]
        act = hf.get(self.activation_key, "gelu")
        if act not in ACTIVATIONS:
            problems.append(f"{self.activation_key}={act!r} (the core has the exact-erf 'gelu' and 'relu'; "
                            "tanh-approximated GELUs such as 'gelu_new' would change every output)")
        return problems

    @abstractmethod
    def core_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        """Every core field (of the encoder) that decides what the checkpoint computes."""

    @abstractmethod
    def layer_map(self, n_layers: int) -> dict[str, str]:
        """Encoder tensor names (no task prefix) -> core parameter names, embeddings and layers."""

    def pooler_map(self) -> dict[str, str]:
        return {}

    def output_map(self, cfg: ModelConfig) -> dict[str, str]:
        """A language model's output projection: checkpoint name -> core name (loaded when the checkpoint has it)."""
        return {}

    def split(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's tensors with fused ones split into the parts :meth:`layer_map` names (and tensors that
        hold no trained values dropped); the inverse of :meth:`join`."""
        return state

    def join(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Tensors under :meth:`layer_map`'s names, with the parts of a fused checkpoint tensor joined again."""
        return state

    @abstractmethod
    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        """``config.json`` fields (without architectures, labels and pooler) of an encoder config; the inverse of
        :meth:`core_fields`."""

    def to_core(self, hf_name: str, tensor: Tensor) -> Tensor:
        """A checkpoint tensor in the shape of its core parameter (only layout, never values)."""
        return tensor

    def to_hf(self, hf_name: str, tensor: Tensor) -> Tensor:
        """A core tensor in the checkpoint's shape (the inverse of :meth:`to_core`)."""
        return tensor

    def max_tokens(self, hf: dict[str, Any], pad_id: int) -> int:
        """The longest input (special tokens included) the position table of ``config.json`` can number."""
        return hf["max_position_embeddings"]


def _layer_names(n_layers: int, hf_layer: str, core_layer: str, parts: dict[str, str]) -> dict[str, str]:
    names = {}
    for i in range(n_layers):
        for hf, core in parts.items():
            for kind in ("weight", "bias"):
                names[f"{hf_layer.format(i=i)}.{hf}.{kind}"] = f"{core_layer.format(i=i)}.{core}.{kind}"
    return names


def _affine(pairs: dict[str, str]) -> dict[str, str]:
    """``{"a": "b"}`` -> weight and bias entries."""
    return {f"{hf}.{kind}": f"{core}.{kind}" for hf, core in pairs.items() for kind in ("weight", "bias")}


# ---------------------------------------------------------------------------------------------------- BERT


_BERT_LAYER = {"attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
               "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
               "attention.output.LayerNorm": "attn_block.norm", "intermediate.dense": "ffn.fc1",
               "output.dense": "ffn.fc2", "output.LayerNorm": "ffn_block.norm"}
_BERT_EMBEDDINGS = {"embeddings.word_embeddings.weight": "encoder.embed.tokens.weight",
                    "embeddings.position_embeddings.weight": "encoder.embed.positions.weight",
                    "embeddings.token_type_embeddings.weight": "encoder.embed.segments.weight",
                    "embeddings.LayerNorm.weight": "encoder.embed.norm.weight",
                    "embeddings.LayerNorm.bias": "encoder.embed.norm.bias"}
_POOLER = {"pooler.dense.weight": "pooler.0.weight", "pooler.dense.bias": "pooler.0.bias"}


class BertFamily(HFFamily):
    """BERT (Devlin et al. 2019) and ELECTRA's discriminator (BERT's encoder under ``electra.``).

    Post-LN layers, exact-erf GELU, learned absolute positions from 0, token types as ``n_segments``, a LayerNorm
    after the summed embeddings, no ``sqrt(d)`` embedding scale, the pooler ``tanh(W h_[CLS] + b)`` as
    ``classifier_hidden`` with ``pooling="cls"``; ``BertForSequenceClassification``'s ``classifier`` is the head.
    ELECTRA-Small's ``embeddings_project`` (``embedding_size != hidden_size``) has no place in the core; ELECTRA's
    classification head (dense + GELU) is not the core's tanh pooler, so it is not loaded.
    """

    name, title = "bert", "BERT"
    model_types = ("bert", "electra")
    prefix = "bert."
    namespaces = ("embeddings.", "encoder.", "pooler.")
    ignorable = ("embeddings.position_ids",)
    heads = (HeadLayout(("BertForSequenceClassification",), _affine({"classifier": "head"})),)
    export_model = "BertModel"
    needed = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")

    def encoder_prefix(self, hf: dict[str, Any]) -> str:
        return "electra." if hf.get("model_type") == "electra" else self.prefix

    def problems(self, hf: dict[str, Any]) -> list[str]:
        problems = super().problems(hf)
        if hf.get("position_embedding_type", "absolute") != "absolute":
            problems.append(f"position_embedding_type={hf['position_embedding_type']!r} (only 'absolute' is "
                            "supported: relative_key/relative_key_query add learned distance embeddings the core "
                            "does not have)")
        if isinstance(hf.get("type_vocab_size"), int) and hf["type_vocab_size"] < 1:
            problems.append(f"type_vocab_size={hf['type_vocab_size']} ({self.title} has token-type embeddings: a core "
                            "model needs n_segments >= 1)")
        if hf.get("is_decoder") or hf.get("add_cross_attention"):
            problems.append("is_decoder/add_cross_attention is set (only bidirectional encoders are supported)")
        if hf.get("model_type") == "electra" and hf.get("embedding_size", hf.get("hidden_size")) != hf.get(
                "hidden_size"):
            problems.append(f"embedding_size={hf['embedding_size']} differs from hidden_size={hf.get('hidden_size')}"
                            " (ELECTRA-Small's embeddings_project has no place in the core)")
        return problems

    def core_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        return dict(arch="encoder_classifier", src_vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                    n_heads=hf["num_attention_heads"], d_ffn=hf["intermediate_size"],
                    enc_layers=hf["num_hidden_layers"], qk_dim=None,
                    activation=ACTIVATIONS[hf.get("hidden_act", "gelu")], norm_first=False,
                    layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)), bias=True, positions="learned",
                    max_positions=hf["max_position_embeddings"], position_start="zero", embed_scale=False,
                    embed_layer_norm=True, n_segments=hf["type_vocab_size"],
                    dropout=float(hf.get("hidden_dropout_prob", 0.1)), embed_dropout=None,
                    attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)), act_dropout=0.0)

    def layer_map(self, n_layers: int) -> dict[str, str]:
        return {**_BERT_EMBEDDINGS, **_layer_names(n_layers, "encoder.layer.{i}", "encoder.layers.{i}", _BERT_LAYER)}

    def pooler_map(self) -> dict[str, str]:
        return dict(_POOLER)

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"model_type": "bert", "vocab_size": cfg.src_vocab_size, "hidden_size": cfg.d_model,
                "num_hidden_layers": cfg.enc_layers, "num_attention_heads": cfg.n_heads,
                "intermediate_size": cfg.d_ffn, "hidden_act": cfg.activation, "hidden_dropout_prob": cfg.dropout,
                "attention_probs_dropout_prob": cfg.attn_dropout, "max_position_embeddings": cfg.max_positions,
                "type_vocab_size": cfg.n_segments, "initializer_range": 0.02, "layer_norm_eps": cfg.layer_norm_eps,
                "pad_token_id": cfg.pad_id, "position_embedding_type": "absolute", "classifier_dropout": None}


class RobertaFamily(BertFamily):
    """RoBERTa (Liu et al. 2019) and XLM-R (Conneau et al. 2020): BERT's layers and names under ``roberta.``.

    The one difference in the encoder is the position numbering of fairseq, which ``transformers`` keeps: the
    non-padding tokens of a row count from ``padding_idx + 1`` (``pad_token_id + 1``, so 2 for RoBERTa) and padding
    tokens read row ``padding_idx``; with inputs given as vectors the positions run from ``padding_idx + 1`` in
    order. That is the core's ``position_start="after_pad"`` (the same ``pad_id`` masks attention), so outputs
    agree at every position, padding included, and wherever padding sits. The position table therefore numbers
    ``max_position_embeddings - pad_token_id - 1`` tokens (512 of RoBERTa's 514 rows).
    ``RobertaForSequenceClassification``'s head, ``out_proj(dropout(tanh(dense(dropout(h_<s>)))))``, is the
    core's pooler (``classifier.dense``) and head (``classifier.out_proj``); the core has no dropout before the
    pooler, which only matters in training. ``RobertaModel``'s own ``pooler.dense`` loads as the pooler when the
    checkpoint has no classification head.
    """

    name, title = "roberta", "RoBERTa"
    model_types = ("roberta", "xlm-roberta")
    prefix = "roberta."
    heads = (HeadLayout(("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification"),
                        _affine({"classifier.out_proj": "head"}), pooler=_affine({"classifier.dense": "pooler.0"})),)
    export_model = "RobertaModel"

    def problems(self, hf: dict[str, Any]) -> list[str]:
        problems = super().problems(hf)
        pad = hf.get("pad_token_id", 1)
        if not isinstance(pad, int) or not 0 <= pad < hf.get("max_position_embeddings", 0) - 1:
            problems.append(f"pad_token_id={pad!r} (RoBERTa numbers positions from pad_token_id + 1, which must lie "
                            "inside max_position_embeddings)")
        return problems

    def core_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        return dict(super().core_fields(hf), position_start="after_pad")

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().hf_config(cfg), model_type="roberta", bos_token_id=0, eos_token_id=2)

    def max_tokens(self, hf: dict[str, Any], pad_id: int) -> int:
        return hf["max_position_embeddings"] - pad_id - 1


# ---------------------------------------------------------------------------------------------------- DistilBERT


_DISTIL_LAYER = {"attention.q_lin": "self_attn.q_proj", "attention.k_lin": "self_attn.k_proj",
                 "attention.v_lin": "self_attn.v_proj", "attention.out_lin": "self_attn.out_proj",
                 "sa_layer_norm": "attn_block.norm", "ffn.lin1": "ffn.fc1", "ffn.lin2": "ffn.fc2",
                 "output_layer_norm": "ffn_block.norm"}
DISTILBERT_LAYER_NORM_EPS = 1e-12  # hard-coded in transformers' DistilBERT, not a config field


class DistilBertFamily(HFFamily):
    """DistilBERT (Sanh et al. 2019): BERT's post-LN layer under other names, without token types or pooler.

    ``sinusoidal_pos_embds=True`` checkpoints store the fixed table in ``position_embeddings``: it loads as a
    learned table (identical outputs; it then trains during fine-tuning, where ``transformers`` freezes it) and is
    exported with ``sinusoidal_pos_embds=false``, so ``transformers`` keeps the stored values. The classifier of
    ``DistilBertForSequenceClassification`` (``pre_classifier`` + ReLU + ``classifier``) is not the core's tanh
    pooler: it is not loaded (listed as ignored), and exports are ``DistilBertModel``.
    """

    name, title = "distilbert", "DistilBERT"
    model_types = ("distilbert",)
    prefix = "distilbert."
    namespaces = ("embeddings.", "transformer.")
    ignorable = ("embeddings.position_ids",)
    has_pooler = False
    export_model = "DistilBertModel"
    activation_key = "activation"
    needed = ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings")

    def core_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        return dict(arch="encoder_classifier", src_vocab_size=hf["vocab_size"], d_model=hf["dim"],
                    n_heads=hf["n_heads"], d_ffn=hf["hidden_dim"], enc_layers=hf["n_layers"], qk_dim=None,
                    activation=ACTIVATIONS[hf.get("activation", "gelu")], norm_first=False,
                    layer_norm_eps=DISTILBERT_LAYER_NORM_EPS, bias=True, positions="learned",
                    max_positions=hf["max_position_embeddings"], position_start="zero", embed_scale=False,
                    embed_layer_norm=True, n_segments=0, dropout=float(hf.get("dropout", 0.1)), embed_dropout=None,
                    attn_dropout=float(hf.get("attention_dropout", 0.1)), act_dropout=0.0)

    def layer_map(self, n_layers: int) -> dict[str, str]:
        embeddings = {k: v for k, v in _BERT_EMBEDDINGS.items() if "token_type" not in k}
        return {**embeddings, **_layer_names(n_layers, "transformer.layer.{i}", "encoder.layers.{i}", _DISTIL_LAYER)}

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"model_type": "distilbert", "vocab_size": cfg.src_vocab_size, "dim": cfg.d_model,
                "n_layers": cfg.enc_layers, "n_heads": cfg.n_heads, "hidden_dim": cfg.d_ffn,
                "activation": cfg.activation, "dropout": cfg.dropout, "attention_dropout": cfg.attn_dropout,
                "max_position_embeddings": cfg.max_positions, "sinusoidal_pos_embds": False,
                "initializer_range": 0.02, "pad_token_id": cfg.pad_id, "seq_classif_dropout": 0.2,
                "qa_dropout": 0.1}


# ---------------------------------------------------------------------------------------------------- ViT


_VIT_LAYER = {"attention.attention.query": "self_attn.q_proj", "attention.attention.key": "self_attn.k_proj",
              "attention.attention.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
              "layernorm_before": "attn_block.norm", "intermediate.dense": "ffn.fc1", "output.dense": "ffn.fc2",
              "layernorm_after": "ffn_block.norm"}
_VIT_POSITIONS = "embeddings.position_embeddings"
# ViTImageProcessor's defaults (IMAGENET_STANDARD_MEAN/STD, rescale 1/255) when a folder has no processor config.
VIT_PIXEL_MEAN, VIT_PIXEL_STD, VIT_RESCALE = 0.5, 0.5, 1 / 255


class ViTFamily(HFFamily):
    """ViT (Dosovitskiy et al. 2021) as ``ViTModel`` / ``ViTForImageClassification`` on the core's ViT.

    The patch embedding is the same stride-``p`` convolution (``embed.proj``), patches in raster order after the
    CLS token (``embed.cls_token``); the position table ``(1, N+1, d)`` is the core's learned table ``(N+1, d)``;
    ``layernorm_before``/``layernorm_after`` are the pre-LN sublayer norms and ``layernorm`` the encoder's final
    LayerNorm; ``ViTModel``'s pooler (``pooler_act="tanh"``) is the core's pooler, ``ViTForImageClassification``'s
    ``classifier`` reads the [CLS] state directly (no pooler). Pixel normalisation, which ``transformers`` leaves
    to the image processor, is the model's ``pixel_mean``/``pixel_std`` (from ``preprocessor_config.json``).
    ``qkv_bias=False`` (a bias-free q/k/v with biased other layers) has no core equivalent.
    """

    name, title = "vit", "ViT"
    model_types = ("vit",)
    prefix = "vit."
    modality = "image"
    core_prefix = "classifier."
    namespaces = ("embeddings.", "encoder.", "layernorm.", "pooler.")
    ignorable = ("embeddings.mask_token",)  # ViTForMaskedImageModeling's [MASK] patch, unused by a classifier
    heads = (HeadLayout(("ViTForImageClassification",), _affine({"classifier": "classifier.head"}),
                        needs_pooler=False),)
    export_model = "ViTModel"
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    unused_fields = ("src_vocab_size", "embed_scale")  # the encoder reads patch vectors, never token ids

    def problems(self, hf: dict[str, Any]) -> list[str]:
        problems = super().problems(hf)
        if not hf.get("qkv_bias", True):
            problems.append("qkv_bias=false (the core's bias setting covers every projection alike)")
        try:
            size, patch = _pair(hf.get("image_size", 224)), _pair(hf.get("patch_size", 16))
        except (TypeError, ValueError, IndexError):
            return problems + [f"image_size={hf.get('image_size')!r} and patch_size={hf.get('patch_size')!r} must "
                               "be whole numbers or [height, width] pairs"]
        if min(*size, *patch) < 1:
            problems.append(f"image_size={hf.get('image_size')} and patch_size={hf.get('patch_size')} must be "
                            "positive")
        elif patch[0] != patch[1]:
            problems.append(f"patch_size={hf['patch_size']} (the core's patches are square)")
        elif size[0] % patch[0] or size[1] % patch[0]:
            problems.append(f"image_size={hf.get('image_size')} is not a multiple of patch_size={patch[0]}")
        return problems

    def core_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        return dict(arch="encoder_classifier", src_vocab_size=1, d_model=hf["hidden_size"],
                    n_heads=hf["num_attention_heads"], d_ffn=hf["intermediate_size"],
                    enc_layers=hf["num_hidden_layers"], qk_dim=None,
                    activation=ACTIVATIONS[hf.get("hidden_act", "gelu")], norm_first=True,
                    layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)), bias=True, positions="learned",
                    position_start="zero", embed_scale=False, embed_layer_norm=False, n_segments=0,
                    dropout=float(hf.get("hidden_dropout_prob", 0.0)), embed_dropout=None,
                    attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.0)), act_dropout=0.0)

    def vision_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        """The :class:`~interlayer.models.vision.VisionConfig` fields besides the encoder and the normalisation."""
        height, width = _pair(hf.get("image_size", 224))
        return dict(backbone="vit", image_height=height, image_width=width, channels=int(hf.get("num_channels", 3)),
                    patch_size=_pair(hf.get("patch_size", 16))[0])

    def layer_map(self, n_layers: int) -> dict[str, str]:
        names = {"embeddings.cls_token": "embed.cls_token",
                 _VIT_POSITIONS: "classifier.encoder.embed.positions.weight",
                 "embeddings.patch_embeddings.projection.weight": "embed.proj.weight",
                 "embeddings.patch_embeddings.projection.bias": "embed.proj.bias",
                 "layernorm.weight": "classifier.encoder.final_norm.weight",
                 "layernorm.bias": "classifier.encoder.final_norm.bias"}
        return {**names, **_layer_names(n_layers, "encoder.layer.{i}", "classifier.encoder.layers.{i}", _VIT_LAYER)}

    def pooler_map(self) -> dict[str, str]:
        return {k: f"classifier.{v}" for k, v in _POOLER.items()}

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"model_type": "vit", "hidden_size": cfg.d_model, "num_hidden_layers": cfg.enc_layers,
                "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ffn, "hidden_act": cfg.activation,
                "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.attn_dropout,
                "initializer_range": 0.02, "layer_norm_eps": cfg.layer_norm_eps, "qkv_bias": cfg.bias}

    def vision_hf_config(self, height: int, width: int, channels: int, patch_size: int) -> dict[str, Any]:
        """The image fields of ``config.json`` (the inverse of :meth:`vision_fields`)."""
        size = height if height == width else [height, width]
        return {"image_size": size, "patch_size": patch_size, "num_channels": channels, "encoder_stride": patch_size}

    def to_core(self, hf_name: str, tensor: Tensor) -> Tensor:
        return tensor.squeeze(0) if hf_name == _VIT_POSITIONS and tensor.dim() == 3 else tensor

    def to_hf(self, hf_name: str, tensor: Tensor) -> Tensor:
        return tensor.unsqueeze(0) if hf_name == _VIT_POSITIONS else tensor


def _pair(value: Any) -> tuple[int, int]:
    """``image_size``/``patch_size``: an int or a ``[height, width]`` pair."""
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), int(value)


# ---------------------------------------------------------------------------------------------------- GPT-2


# HF activation_function -> core activation: gelu_new and gelu_pytorch_tanh are both GELU's tanh approximation
# (GPT-2's own), "gelu" is the exact erf form.
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_GPT2_EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
_GPT2_LAYER = {"ln_1": "attn_block.norm", "attn.c_proj": "self_attn.out_proj", "ln_2": "ffn_block.norm",
               "mlp.c_fc": "ffn.fc1", "mlp.c_proj": "ffn.fc2"}
_GPT2_QKV = {"q": "q_proj", "k": "k_proj", "v": "v_proj"}  # the thirds of c_attn's outputs, in this order
_CONV1D_WEIGHT = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight(\[[qkv]\])?")
_FUSED = re.compile(r"(h\.\d+\.attn\.c_attn)\.(weight|bias)")
_GPT2_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")  # older transformers' causal-mask buffers


class GPT2Family(HFFamily):
    """GPT-2 (Radford et al. 2019) as ``GPT2Model`` / ``GPT2LMHeadModel`` on the core's ``causal_lm``.

    * **Layers**: pre-LN (``ln_1`` before attention, ``ln_2`` before the MLP, ``ln_f`` after the stack: the core's
      ``attn_block.norm``, ``ffn_block.norm`` and ``encoder.final_norm``), biases everywhere, learned positions
      ``wpe`` from 0, the token table ``wte`` unscaled, no embedding LayerNorm, scores scaled by ``1/sqrt(d_head)``.
    * **Weights**: GPT-2's ``Conv1D`` computes ``x W + b`` with ``W`` stored ``(in, out)``; an ``nn.Linear`` stores
      ``(out, in)``, so every ``Conv1D`` weight is transposed. ``c_attn`` holds query, key and value side by side
      in its ``3 d`` outputs (in that order, heads contiguous inside each third, as the core's projections): it is
      split into ``h.N.attn.c_attn.weight[q]``, ``[k]``, ``[v]`` (the names the import report shows) and joined
      on export.
    * **Fields**: ``n_inner`` (None: ``4 n_embd``), ``layer_norm_epsilon``, ``n_positions``, the dropouts
      (``resid_pdrop`` -> ``dropout``, ``embd_pdrop`` -> ``embed_dropout``, ``attn_pdrop`` -> ``attn_dropout``),
      ``activation_function`` (``gelu_new``/``gelu_pytorch_tanh`` -> ``gelu_tanh``, ``gelu``, ``relu``) and
      ``tie_word_embeddings`` (-> ``tie_output``; an untied ``lm_head`` loads as the core's own ``lm_head``).
    * **Refused**, naming the field: ``scale_attn_by_inverse_layer_idx`` (scores also divided by the layer
      number), ``scale_attn_weights=false`` (unscaled scores), ``add_cross_attention``, other activations.
      ``reorder_and_upcast_attn`` only changes the precision of fp16 attention and is accepted.
    * **Heads**: ``GPT2LMHeadModel``'s head is the core's ``lm_head``; the heads of ``GPT2DoubleHeadsModel``,
      ``GPT2ForSequenceClassification`` and the like have no core form and are listed as ignored. Exports are
      ``GPT2LMHeadModel``.
    """

    name, title = "gpt2", "GPT-2"
    model_types = ("gpt2",)
    prefix = "transformer."
    arch = "causal_lm"
    namespaces = ("wte.", "wpe.", "h.", "ln_f.")
    has_pooler = False
    export_model = "GPT2LMHeadModel"
    activation_key = "activation_function"
    needed = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")

    def problems(self, hf: dict[str, Any]) -> list[str]:
        problems = [f"{key} is missing" for key in self.needed if not isinstance(hf.get(key), int)]
        act = hf.get(self.activation_key, "gelu_new")
        if act not in GPT2_ACTIVATIONS:
            problems.append(f"{self.activation_key}={act!r} (the core has {', '.join(map(repr, GPT2_ACTIVATIONS))})")
        if hf.get("scale_attn_by_inverse_layer_idx"):
            problems.append("scale_attn_by_inverse_layer_idx=true (the core scales every layer's scores by "
                            "1/sqrt(d_head) alone, not also by 1/(layer + 1))")
        if not hf.get("scale_attn_weights", True):
            problems.append("scale_attn_weights=false (the core always scales scores by 1/sqrt(d_head))")
        if hf.get("add_cross_attention"):
            problems.append("add_cross_attention=true (the core's language model has no cross-attention)")
        if hf.get("n_inner") is not None and not isinstance(hf["n_inner"], int):
            problems.append(f"n_inner={hf['n_inner']!r} (an integer, or null for 4 * n_embd)")
        return problems

    def core_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        dropout, embed = float(hf.get("resid_pdrop", 0.1)), float(hf.get("embd_pdrop", 0.1))
        return dict(arch="causal_lm", src_vocab_size=hf["vocab_size"], d_model=hf["n_embd"], n_heads=hf["n_head"],
                    d_ffn=hf.get("n_inner") or 4 * hf["n_embd"], enc_layers=hf["n_layer"], qk_dim=None,
                    activation=GPT2_ACTIVATIONS[hf.get("activation_function", "gelu_new")], norm_first=True,
                    layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), bias=True, positions="learned",
                    max_positions=hf["n_positions"], position_start="zero", embed_scale=False,
                    embed_layer_norm=False, n_segments=0, tie_output=bool(hf.get("tie_word_embeddings", True)),
                    dropout=dropout, embed_dropout=None if embed == dropout else embed,
                    attn_dropout=float(hf.get("attn_pdrop", 0.1)), act_dropout=0.0)

    def layer_map(self, n_layers: int) -> dict[str, str]:
        names = {"wte.weight": "encoder.embed.tokens.weight", "wpe.weight": "encoder.embed.positions.weight",
                 **_affine({"ln_f": "encoder.final_norm"})}
        for i in range(n_layers):
            for part, core in _GPT2_QKV.items():
                for kind in ("weight", "bias"):
                    names[f"h.{i}.attn.c_attn.{kind}[{part}]"] = f"encoder.layers.{i}.self_attn.{core}.{kind}"
        return {**names, **_layer_names(n_layers, "h.{i}", "encoder.layers.{i}", _GPT2_LAYER)}

    def output_map(self, cfg: ModelConfig) -> dict[str, str]:
        return {"lm_head.weight": "lm_head.weight"}

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"model_type": "gpt2", "vocab_size": cfg.src_vocab_size, "n_embd": cfg.d_model,
                "n_layer": cfg.enc_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ffn,
                "n_positions": cfg.max_positions,
                "activation_function": _GPT2_EXPORT_ACTIVATIONS.get(cfg.activation, cfg.activation),
                "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout if cfg.embed_dropout is None else
                cfg.embed_dropout, "attn_pdrop": cfg.attn_dropout, "layer_norm_epsilon": cfg.layer_norm_eps,
                "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "add_cross_attention": False,
                "tie_word_embeddings": cfg.tie_output, "use_cache": True}

    def split(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, tensor in state.items():
            fused = _FUSED.fullmatch(name)
            if fused is None:
                if not _GPT2_BUFFERS.fullmatch(name):
                    out[name] = tensor
                continue
            module, kind = fused.groups()
            thirds = tensor.chunk(3, dim=-1)  # (in, 3d) weight or (3d,) bias: the outputs are the last axis
            out.update({f"{module}.{kind}[{part}]": third for part, third in zip(_GPT2_QKV, thirds)})
        return out

    def join(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {name: tensor for name, tensor in state.items() if not name.endswith("]")}
        parts = sorted({name[:-3] for name in state if name.endswith("]")})
        for fused in parts:
            out[fused] = torch.cat([state[f"{fused}[{part}]"] for part in _GPT2_QKV], dim=-1).contiguous()
        return out

    def to_core(self, hf_name: str, tensor: Tensor) -> Tensor:
        return tensor.t() if _CONV1D_WEIGHT.fullmatch(hf_name) else tensor

    def to_hf(self, hf_name: str, tensor: Tensor) -> Tensor:
        return tensor.t() if _CONV1D_WEIGHT.fullmatch(hf_name) else tensor

    def max_tokens(self, hf: dict[str, Any], pad_id: int) -> int:
        return hf["n_positions"]


FAMILIES: tuple[HFFamily, ...] = (BertFamily(), RobertaFamily(), DistilBertFamily(), ViTFamily(), GPT2Family())
SUPPORTED_MODEL_TYPES: dict[str, HFFamily] = {t: family for family in FAMILIES for t in family.model_types}


def family_of(model_type: Optional[str]) -> Optional[HFFamily]:
    """The family of a ``config.json`` ``model_type``, or None."""
    return SUPPORTED_MODEL_TYPES.get(model_type or "")


def family_named(name: str) -> HFFamily:
    """A family by its name (``"bert"``, ``"roberta"``, ``"distilbert"``, ``"vit"``, ``"gpt2"``)."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(name)
