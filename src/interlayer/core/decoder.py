"""The Transformer decoder: causal self-attention, cross-attention, and an output projection.

Incremental decoding keeps a :class:`DecoderCache` (keys/values per layer); feeding one token at a time with a
cache gives the same logits as the full forward pass (tested). Target padding needs no self-attention mask: with
right padding, the causal mask already hides every padded position from every real one.

``causal_decoder=False`` (config) makes the self-attention bidirectional: then the padded target positions are
masked, and a layer whose self-attention mixes in the previous layer's logits (Predictive Attention) receives
them, as in the encoder. :func:`run_decoder_layers` is that loop, shared with stacks that have no token table
(MCAN's image stack).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor, nn

from .attention import AttentionIntermediates, KVCache, KVHistory
from .components import Components
from .config import TransformerConfig
from .embedding import InputEmbedding
from .layers import ActivationCheckpointing, DecoderLayer, DecoderLayerCache, DepthConnection, logits_wanted, shares_kv


@dataclass
class DecoderCache:
    """The incremental decoding state of a decoder stack: one :class:`~interlayer.core.layers.DecoderLayerCache` per
    layer (self-attention keys/values, the cross-attention's memory projections); ``reorder`` follows beam search."""

    layers: list[DecoderLayerCache] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.layers[0].self_attn.length if self.layers else 0

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)


@dataclass
class DecoderOutput:
    """What the decoder returns: next-token logits, the hidden states they are read from, and each layer's self- and
    cross-attention intermediates (when asked for)."""

    logits: Tensor  # (B, T, V)
    hidden: Tensor  # (B, T, d) before the output projection
    self_attentions: list[Optional[AttentionIntermediates]]
    cross_attentions: list[Optional[AttentionIntermediates]]


def decoder_layers(cfg: TransformerConfig, components: Components) -> nn.ModuleList:
    """The ``dec_layers`` layers built from the components' decoder-side factories."""
    return nn.ModuleList(
        DecoderLayer(components.self_attention("decoder", i), components.cross_attention(i),
                     components.ffn("decoder", i), cfg.d_model, dropout=cfg.dropout, norm_first=cfg.norm_first,
                     eps=cfg.layer_norm_eps, bias=cfg.bias, causal=cfg.causal_decoder,
                     residuals=tuple(components.residual("decoder", i, kind) for kind in ("attn", "cross", "ffn")))
        for i in range(cfg.dec_layers))


def run_decoder_layers(layers: nn.ModuleList, x: Tensor, memory: Tensor, *, self_padding_mask: Optional[Tensor],
                       memory_padding_mask: Optional[Tensor], cache: Optional[DecoderCache] = None,
                       need_intermediates: bool = False, depth: Optional[DepthConnection] = None,
                       checkpointing: Optional[ActivationCheckpointing] = None
                       ) -> tuple[Tensor, list[Optional[AttentionIntermediates]],
                                  list[Optional[AttentionIntermediates]]]:
    """Run the stack; each layer's self-attention logits go to the next layer when it mixes them in. ``depth``:
    the stack-level hook (see :class:`~interlayer.core.layers.DepthConnection`), called around the layers;
    ``checkpointing``: the stack's activation checkpointing when it trains without a cache."""
    self_attns, cross_attns = [], []
    prev_logits: Optional[Tensor] = None
    kv_history: Optional[KVHistory] = [] if shares_kv(layers) else None
    if depth is not None:
        x, depth_state = depth.start(x)
    for i, (layer, (needed, alone)) in enumerate(zip(layers, logits_wanted(layers))):
        attn_inputs = depth.attention_inputs(i, depth_state) if depth is not None else None
        call = checkpointing.wrap(i, layer) if checkpointing is not None and cache is None else layer
        x, self_inter, cross_inter = call(x, memory, self_padding_mask=self_padding_mask,
                                          memory_padding_mask=memory_padding_mask,
                                           cache=cache.layers[i] if cache is not None else None,
                                           need_intermediates=need_intermediates or (needed and not alone),
                                           need_logits=alone and not need_intermediates, prev_logits=prev_logits,
                                           kv_history=kv_history,
                                           **({} if attn_inputs is None else {"attn_inputs": attn_inputs}))
        if depth is not None:
            x = depth.after_layer(i, x, depth_state)
        prev_logits = self_inter.logits if self_inter is not None else None
        self_attns.append(self_inter if need_intermediates else None)
        cross_attns.append(cross_inter)
    if depth is not None:
        x = depth.finish(x, depth_state)
    return x, self_attns, cross_attns


class Decoder(nn.Module):
    """The decoder of an encoder-decoder: target embedding (sharing the token table when the config says so),
    ``dec_layers`` layers with self-attention (causal unless ``causal_decoder=False``, MCAN's image stack),
    cross-attention to the encoder's memory and a feed-forward block, and the output projection (tied to the token table
    with ``tie_output``). Built from the components' decoder-side factories, so methods reach it as they reach the
    encoder."""

    def __init__(self, cfg: TransformerConfig, components: Components, tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed = InputEmbedding(cfg, tokens)
        self.pad_id = cfg.pad_id
        self.causal = cfg.causal_decoder
        self.layers = decoder_layers(cfg, components)
        self.depth: Optional[DepthConnection] = components.depth_connection("decoder")
        self.final_norm = (nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.norm_first
                           else None)
        self.output_projection = nn.Linear(cfg.d_model, tokens.num_embeddings, bias=False)
        if cfg.tie_output:
            self.output_projection.weight = tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, std=cfg.d_model**-0.5)
        # Set by the model's gradient_checkpointing_enable (core/hub.py); None: every layer keeps its activations.
        self.activation_checkpointing: Optional[ActivationCheckpointing] = None

    def new_cache(self) -> DecoderCache:
        return DecoderCache([DecoderLayerCache(KVCache(), KVCache()) for _ in self.layers])

    def forward(self, tokens: Tensor, memory: Tensor, memory_padding_mask: Optional[Tensor] = None, *,
                cache: Optional[DecoderCache] = None, need_intermediates: bool = False) -> DecoderOutput:
        """``tokens`` (B, T): the whole shifted target, or with ``cache`` only the positions not yet seen."""
        x = self.embed(tokens, offset=cache.length if cache is not None else 0)
        x, self_attns, cross_attns = run_decoder_layers(
            self.layers, x, memory, self_padding_mask=None if self.causal else tokens.eq(self.pad_id),
            memory_padding_mask=memory_padding_mask, cache=cache, need_intermediates=need_intermediates,
            depth=self.depth, checkpointing=self.activation_checkpointing if self.training else None)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return DecoderOutput(logits=self.output_projection(x), hidden=x, self_attentions=self_attns,
                             cross_attentions=cross_attns)

    def madds(self, t: int, src_len: int) -> int:
        proj = t * self.output_projection.in_features * self.output_projection.out_features
        depth = self.depth.madds(t) if self.depth is not None else 0
        return sum(layer.madds(t, src_len) for layer in self.layers) + proj + depth
