"""The factories a model is built from, one per replaceable part.

A method plugs into the core by replacing entries *before* the model is built (e.g. group-wise attention
replaces ``self_attention``; predictive attention provides ``logit_mixer``; value residuals and cross-layer attention
provide ``kv_source``). The default self-attention factory looks up ``relative``, ``logit_mixer`` and ``kv_source``
on this object when it is called, so replacements made by one method
are seen by another: that late binding is what lets the methods compose.
"""
from __future__ import annotations

from typing import Callable, Literal, Optional

from torch import nn

from .attention import LogitMixer, MultiHeadAttention
from .config import TransformerConfig
from .feedforward import FeedForward
from .layers import DepthConnection, Residual
from .positions import RelativePositionBias, RelativePositionBias2D, RotaryEmbedding

# The two stacks of layers: the encoder (a causal LM's stack is its encoder) and the decoder of an encoder-decoder
StackSide = Literal["encoder", "decoder"]
SublayerKind = Literal["attn", "cross", "ffn"]


class Components:
    """Per-layer factories: each takes ``(side, layer_index)`` and returns a fresh module."""

    def __init__(self, cfg: TransformerConfig) -> None:
        self.cfg = cfg
        self.relative: Callable[[StackSide, int], Optional[nn.Module]] = self.default_relative
        self.logit_mixer: Callable[[StackSide, int], Optional[LogitMixer]] = lambda side, index: None
        # Where a self-attention layer's keys/values come from (attention.KVSource); None: its own projections.
        self.kv_source: Callable[[StackSide, int], Optional[nn.Module]] = lambda side, index: None
        self.self_attention: Callable[[StackSide, int], nn.Module] = self.default_self_attention
        self.cross_attention: Callable[[int], nn.Module] = self.default_cross_attention
        self.ffn: Callable[[StackSide, int], nn.Module] = self.default_ffn
        # The residual connection around each sublayer (side, layer index, which sublayer) and the stack-level
        # hook around and between the layers (None: the plain stack); see core/layers.py.
        self.residual: Callable[[StackSide, int, SublayerKind], nn.Module] = self.default_residual
        self.depth_connection: Callable[[StackSide], Optional[DepthConnection]] = self.default_depth_connection
        self.encoder_class: Optional[type] = None  # None: interlayer.core.encoder.Encoder

    def default_relative(self, side: StackSide, index: int, head_dim: Optional[int] = None) -> Optional[nn.Module]:
        """The core's position module inside the attention of layer ``index``, sized for ``head_dim`` (default: the
        config's head width): Shaw et al.'s relative bias, PA's 2-D relative bias (encoder only, on the token grid),
        rotary embeddings, or None for absolute positions."""
        cfg = self.cfg
        head_dim = head_dim or cfg.qk_width // cfg.n_heads
        if cfg.positions == "relative":
            return RelativePositionBias(head_dim, cfg.rel_max_distance)
        if cfg.positions == "relative_2d" and side == "encoder":
            return RelativePositionBias2D(head_dim, cfg.grid_height, cfg.grid_width)
        if cfg.positions == "rotary":
            return RotaryEmbedding(head_dim, cfg.max_positions)
        return None

    def default_self_attention(self, side: StackSide, index: int) -> nn.Module:
        cfg = self.cfg
        return MultiHeadAttention(cfg.d_model, cfg.n_heads, qk_dim=cfg.qk_dim, dropout=cfg.attn_dropout,
                                  bias=cfg.bias, relative=self.relative(side, index),
                                  logit_mixer=self.logit_mixer(side, index), force_eager=cfg.attn_impl == "eager",
                                  kv_source=self.kv_source(side, index))

    def default_cross_attention(self, index: int) -> nn.Module:
        cfg = self.cfg
        return MultiHeadAttention(cfg.d_model, cfg.n_heads, qk_dim=cfg.qk_dim, dropout=cfg.attn_dropout,
                                  bias=cfg.bias, force_eager=cfg.attn_impl == "eager")

    def default_residual(self, side: StackSide, index: int, kind: SublayerKind) -> nn.Module:
        cfg = self.cfg
        return Residual(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.layer_norm_eps, cfg.bias)

    def default_depth_connection(self, side: StackSide) -> Optional[DepthConnection]:
        """None: the plain stack (a method that installs one can see whether another did by comparing)."""
        return None

    def default_ffn(self, side: StackSide, index: int) -> nn.Module:
        cfg = self.cfg
        return FeedForward(cfg.d_model, cfg.d_ffn, activation=cfg.activation, act_dropout=cfg.act_dropout,
                           bias=cfg.bias)
