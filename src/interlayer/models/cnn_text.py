"""The CNN text classifier of PA Table 1 (Sec. 4.1.1 "(1) CNN contains M layers of 1D-convolution of kernel size 3").

The paper gives only that sentence, plus that "all models have similar numbers of parameters and FLOPs" (Table 1:
CNN 2.77M / 317.38M FLOPs, Transformer 2.79M / 338.86M on SST). Our reading keeps everything of the Transformer
text classifier except the token mixer, so the comparison isolates attention versus convolution:

* Block ``l`` (of ``enc_layers`` = M = 3): ``h = LN(x + drop(act(Conv1d_k3(x))))``, then
  ``x' = LN(h + drop(FFN(h)))`` with the Transformer's FFN (256 -> 1024 -> 256), post-LN like the core's
  default. A CNN without the FFN (``d_ffn=0``, the literal "M layers of 1D-convolution") has 0.59M non-embedding
  parameters, a fifth of Table 1's 2.77M; with it the block has 0.72M (the Transformer block 0.79M), which is the
  reading "similar numbers of parameters" supports. ``d_ffn=0`` is offered for the literal reading.
* The convolution is "same"-padded (``kernel_size // 2`` zeros each side) and padded tokens are zeroed before
  every convolution, so padding never reaches a real token and a sentence's output does not depend on the batch.
* No position encoding: a convolution is order-aware by construction.
* Input: the same token and segment embeddings as the Transformer (``[CLS] a [SEP] b [SEP]``, PA App. B.2.1), scaled
  by ``sqrt(d_model)``, with the paper's embedding dropout 0.4 and dropout 0.2 elsewhere (App. B.2.1 "0.4 and 0.2
  dropout ratios for the embedding and fully-connected layers"). The CNN has its own embedding dropout; the core
  Transformer has one ``dropout`` for both.
* Pooling: the mean over real tokens, as the Transformer preset (``pooling="mean"``); ``"max"`` is the max over time
  of Kim (2014)'s sentence CNN.

Not reproduced (nor in the Transformer): the GloVe input and its 1x1 projection, and the DenseNet-style dense
connections of Sec. 4.1.1, which the paper does not specify further.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds
from ..config_io import ConfigFile, MethodSlots, checked_config
from ..core.embedding import make_token_embedding
from ..core.feedforward import FeedForward
from ..core.hub import PretrainedMixin, track_ties
from ..errors import ConfigError
from .registry import Family, override_flat, register_family, register_presets

MODEL_TYPE = "cnn_text"
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


@dataclass
class CNNTextConfig(ConfigFile):
    """Field names follow :class:`~interlayer.core.config.TransformerConfig`, so ``--set d_model=128`` and the
    task's data-decided fields (``src_vocab_size``, ``num_classes``, ``n_segments``, ``pad_id``) mean the same."""

    # sizes of the saved tensors (checkpoint.py)
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"src_vocab_size", "num_classes", "n_segments", "d_model",
                                                        "d_ffn", "enc_layers", "kernel_size"})

    model_type: Literal["cnn_text"] = MODEL_TYPE
    src_vocab_size: int = 16000
    num_classes: int = 5
    n_segments: int = 0  # 2 for sentence pairs (PA App. B.2.1 "field embedding")
    pad_id: int = 0
    d_model: int = 256  # PA Sec. 4.1.1: hidden size 256
    d_ffn: int = 1024  # the Transformer's FFN after each convolution; 0: convolutions only
    enc_layers: int = 3  # PA Sec. 4.1.1: M = 3
    kernel_size: int = 3  # PA Sec. 4.1.1: "1D-convolution of kernel size 3"
    activation: Literal["relu", "gelu"] = "relu"
    pooling: Literal["mean", "max"] = "mean"
    dropout: float = 0.2  # App. B.2.1: fully-connected layers
    embed_dropout: float = 0.4  # App. B.2.1: embedding
    layer_norm_eps: float = 1e-5

    def validate(self) -> None:
        for key in ("src_vocab_size", "d_model", "enc_layers"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        if self.num_classes < 2:
            raise ConfigError(f"num_classes={self.num_classes} must be at least 2")
        if self.d_ffn < 0:
            raise ConfigError(f"d_ffn={self.d_ffn} must be >= 0 (0: no feed-forward sublayer)")
        if self.n_segments < 0:
            raise ConfigError(f"n_segments={self.n_segments} must be >= 0")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size={self.kernel_size} must be a positive odd number (a centred window; "
                              "the paper's is 3)")
        for key in ("dropout", "embed_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{key}={getattr(self, key)} must lie in [0, 1)")
        if not 0 <= self.pad_id < self.src_vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} must be a token id below src_vocab_size={self.src_vocab_size}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "cnn_text config") -> "CNNTextConfig":
        """Checked like every interlayer config: unknown keys and wrong types raise, naming the key."""
        return checked_config(cls, data, source)


@dataclass
class CNNTextOutput:
    """Shaped like :class:`~interlayer.core.models.ClassifierOutput`, so ``core.losses.total_loss`` applies."""

    logits: Tensor  # (B, num_classes)
    pooled: Tensor  # (B, d_model)
    exit_logits: Optional[list[Tensor]] = None
    aux_losses: dict[str, Tensor] = dataclasses.field(default_factory=dict)


class ConvBlock(nn.Module):
    """``LN(x + drop(act(conv(x))))`` then, with ``d_ffn > 0``, ``LN(h + drop(FFN(h)))``."""

    def __init__(self, cfg: CNNTextConfig) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, cfg.kernel_size, padding=cfg.kernel_size // 2)
        self.activation = _ACTIVATIONS[cfg.activation]
        self.conv_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ffn, activation=cfg.activation) if cfg.d_ffn else None
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.d_ffn else None
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        """``x`` (B, T, d); ``keep`` (B, T, 1) is 1 at real tokens, 0 at padding."""
        mixed = self.activation(self.conv((x * keep).transpose(1, 2))).transpose(1, 2)
        h = self.conv_norm(x + self.dropout(mixed))
        if self.ffn is None:
            return h
        return self.ffn_norm(h + self.dropout(self.ffn(h)))

    def madds(self, t: int) -> int:
        return t * self.conv.weight.numel() + (self.ffn.madds(t) if self.ffn is not None else 0)


class CNNTextClassifier(nn.Module, PretrainedMixin):
    """PA Table 1's CNN baseline for text (module docstring): the Transformer text classifier with each self-attention
    replaced by a same-padded 1-D convolution (``enc_layers`` blocks of convolution and FFN), then pooling over the
    real tokens and a linear classifier."""

    model_type = MODEL_TYPE

    def __init__(self, cfg: CNNTextConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.pad_id = cfg.pad_id
        self.tokens = make_token_embedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        self.segments = nn.Embedding(cfg.n_segments, cfg.d_model) if cfg.n_segments else None
        self.scale = math.sqrt(cfg.d_model)
        self.embed_dropout = nn.Dropout(cfg.embed_dropout)
        self.layers = nn.ModuleList(ConvBlock(cfg) for _ in range(cfg.enc_layers))
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_model, cfg.num_classes)
        track_ties(self)  # each tied tensor once in state dicts

    def forward(self, tokens: Tensor, *, segments: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None) -> CNNTextOutput:
        """``tokens`` (B, T); ``segments`` (B, T) segment ids (default: all 0, as the core and BERT);
        ``key_padding_mask`` True at padding (default: ``tokens == pad_id``)."""
        padding = tokens.eq(self.pad_id) if key_padding_mask is None else key_padding_mask
        x = self.tokens(tokens) * self.scale
        if self.segments is not None:
            x = x + (self.segments(segments) if segments is not None else self.segments.weight[0])
        x = self.embed_dropout(x)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        for layer in self.layers:
            x = layer(x, keep)
        pooled = self.pool(x, padding, keep)
        return CNNTextOutput(logits=self.head(self.dropout(pooled)), pooled=pooled)

    def pool(self, x: Tensor, padding: Tensor, keep: Tensor) -> Tensor:
        if self.config.pooling == "max":
            return x.masked_fill(padding.unsqueeze(-1), torch.finfo(x.dtype).min).amax(dim=1)
        return (x * keep).sum(1) / keep.sum(1).clamp_min(1.0)

    def madds(self, src_len: int, tgt_len: Optional[int] = None) -> int:
        """Multiply-adds for one sequence of ``src_len`` tokens (``tgt_len`` is unused: there is no decoder)."""
        return sum(layer.madds(src_len) for layer in self.layers) + self.head.weight.numel()


register_family(Family(
    name="text_cnn", title="Text CNN (PA Table 1)", tasks="sst5, sst2, sick, mrpc", config_class=CNNTextConfig,
    from_dict=CNNTextConfig.from_dict, override=override_flat, build=CNNTextClassifier,
    madds=lambda name, model, length: count_madds(model, length), madds_unit="MAdds @ {length} tokens", rank=1,
    model_types=(MODEL_TYPE,), claims=lambda data: data.get("model_type") == MODEL_TYPE,
    method_slots=MethodSlots("text CNN", at=None)))
register_presets("text_cnn", {MODEL_TYPE: ("PA Table 1's CNN: M=3 blocks of a kernel-3 convolution and the "
                                           "Transformer's FFN, d=256 (the text tasks fill in the data's fields)",
                                           {})})
