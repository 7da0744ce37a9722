"""Encoder and decoder layers, post-LN (Vaswani et al. 2017) or pre-LN (Xiong et al. 2020, Crossformer Eq. 7).

A layer is assembled from modules it is given (self-attention, optional cross-attention, feed-forward), so a
method can swap a module (group-wise attention, an attention+convolution block) without touching the wiring.
Two generic hooks exist for cross-layer methods: ``prev_logits`` (the previous layer's attention logits, handed
to the self-attention) and ``branch_add`` (a tensor added to the input of the self-attention *branch* only, after
the residual split; adding to the layer input itself is simply ``layer(x + extra)``). A third, ``kv_history``, is
handed to the self-attention only when the stack gives one (a layer whose keys/values come from earlier layers:
:class:`~interlayer.core.attention.KVSource`), so a replaced self-attention module need not accept it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor, nn

from .attention import AttentionIntermediates, KVCache, KVHistory


@dataclass
class LayerOutput:
    hidden: Tensor  # the layer's output
    mid: Tensor  # the state after the self-attention sublayer (MPT's S_mid)
    attention: Optional[AttentionIntermediates]  # self-attention intermediates when requested


class _Sublayer(nn.Module):
    """Residual wrapper: ``x + drop(f(LN(x)))`` (pre-LN) or ``LN(x + drop(f(x)))`` (post-LN)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def branch_input(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.norm_first else x

    def combine(self, residual: Tensor, branch_out: Tensor) -> Tensor:
        out = residual + self.dropout(branch_out)
        return out if self.norm_first else self.norm(out)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward; ``causal=True`` with an optional ``cache`` makes it a decoder-only layer
    (the causal language model's), so one layer class carries every self-attention method to both uses."""

    def __init__(self, self_attn: nn.Module, ffn: nn.Module, d_model: int, *, dropout: float, norm_first: bool,
                 eps: float, bias: bool = True) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.ffn = ffn
        self.attn_block = _Sublayer(d_model, dropout, norm_first, eps, bias)
        self.ffn_block = _Sublayer(d_model, dropout, norm_first, eps, bias)

    def forward(self, x: Tensor, *, key_padding_mask: Optional[Tensor] = None, prev_logits: Optional[Tensor] = None,
                branch_add: Optional[Tensor] = None, need_intermediates: bool = False, causal: bool = False,
                cache: Optional[KVCache] = None, kv_history: Optional[KVHistory] = None) -> LayerOutput:
        """``cache``: this layer's keys/values (and method state) so far; ``x`` then holds only the new positions."""
        branch = x if branch_add is None else x + branch_add
        shared = {} if kv_history is None else {"kv_history": kv_history}
        attn_out, inter = self.self_attn(self.attn_block.branch_input(branch), key_padding_mask=key_padding_mask,
                                         prev_logits=prev_logits, need_intermediates=need_intermediates,
                                         causal=causal, cache=cache, **shared)
        mid = self.attn_block.combine(x, attn_out)
        hidden = self.ffn_block.combine(mid, self.ffn(self.ffn_block.branch_input(mid)))
        return LayerOutput(hidden=hidden, mid=mid, attention=inter)

    def madds(self, t: int) -> int:
        return self.self_attn.madds(t, t) + self.ffn.madds(t)


@dataclass
class DecoderLayerCache:
    self_attn: KVCache
    cross_attn: KVCache


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention to a memory, feed-forward. ``causal=False`` lets every position attend to
    every other (a stack over a set that is not generated, e.g. MCAN's image regions); the self-attention then
    needs ``self_padding_mask`` and may mix in the previous layer's logits (``prev_logits``), as in the encoder."""

    def __init__(self, self_attn: nn.Module, cross_attn: nn.Module, ffn: nn.Module, d_model: int, *,
                 dropout: float, norm_first: bool, eps: float, bias: bool = True, causal: bool = True) -> None:
        super().__init__()
        self.causal = causal
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.attn_block = _Sublayer(d_model, dropout, norm_first, eps, bias)
        self.cross_block = _Sublayer(d_model, dropout, norm_first, eps, bias)
        self.ffn_block = _Sublayer(d_model, dropout, norm_first, eps, bias)

    def forward(self, x: Tensor, memory: Tensor, *, self_padding_mask: Optional[Tensor] = None,
                memory_padding_mask: Optional[Tensor] = None, cache: Optional[DecoderLayerCache] = None,
                need_intermediates: bool = False, prev_logits: Optional[Tensor] = None,
                kv_history: Optional[KVHistory] = None
                ) -> tuple[Tensor, Optional[AttentionIntermediates], Optional[AttentionIntermediates]]:
        shared = {} if kv_history is None else {"kv_history": kv_history}
        attn_out, self_inter = self.self_attn(
            self.attn_block.branch_input(x), key_padding_mask=self_padding_mask, causal=self.causal,
            prev_logits=prev_logits, need_intermediates=need_intermediates,
            cache=cache.self_attn if cache else None, **shared)
        x = self.attn_block.combine(x, attn_out)
        cross_out, cross_inter = self.cross_attn(
            self.cross_block.branch_input(x), memory, key_padding_mask=memory_padding_mask,
            need_intermediates=need_intermediates, cache=cache.cross_attn if cache else None)
        x = self.cross_block.combine(x, cross_out)
        x = self.ffn_block.combine(x, self.ffn(self.ffn_block.branch_input(x)))
        return x, self_inter, cross_inter

    def madds(self, t: int, src_len: int) -> int:
        return self.self_attn.madds(t, t) + self.cross_attn.madds(t, src_len) + self.ffn.madds(t)


def shares_kv(layers: nn.ModuleList) -> bool:
    """Whether a layer of the stack takes keys/values from earlier ones (its self-attention has a ``kv_source``), so
    the stack must keep a :data:`~interlayer.core.attention.KVHistory` while it runs."""
    return any(getattr(layer.self_attn, "kv_source", None) is not None for layer in layers)
