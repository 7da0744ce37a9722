"""Encoder and decoder layers, post-LN (Vaswani et al. 2017) or pre-LN (Xiong et al. 2020, Crossformer Eq. 7).

A layer is assembled from modules it is given (self-attention, optional cross-attention, feed-forward), so a
method can swap a module (group-wise attention, an attention+convolution block) without touching the wiring.
Generic hooks for cross-layer methods: ``prev_logits`` (the previous layer's attention logits, handed to the
self-attention), ``branch_add`` (a tensor added to the input of the self-attention *branch* only, after the
residual split; adding to the layer input itself is simply ``layer(x + extra)``), the residual connection of each
sublayer (a module from ``Components.residual``: :class:`Residual` by default, replaced by Hyper-Connections) and,
one level up, a :class:`DepthConnection` that the stack loops call around and between the layers (DenseFormer's
depth-weighted averages, Hyper-Connections' streams). ``kv_history`` is handed to the self-attention only when
the stack gives one (a layer whose keys/values come from earlier layers: :class:`~interlayer.core.attention.KVSource`),
so a replaced self-attention module need not accept it; likewise ``attn_inputs``, the separate query, key and value
inputs a depth connection may give a layer (:meth:`DepthConnection.attention_inputs`), reach the self-attention as
``kv_inputs`` only when given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import AttentionIntermediates, KVCache, KVHistory


@dataclass
class LayerOutput:
    hidden: Tensor  # the layer's output
    mid: Tensor  # the state after the self-attention sublayer (MPT's S_mid)
    attention: Optional[AttentionIntermediates]  # self-attention intermediates when requested


@dataclass(frozen=True)
class ActivationCheckpointing:
    """Activation (gradient) checkpointing of a layer stack: in training, every ``every_n_layers``-th layer keeps
    only its inputs and runs again in the backward pass to recompute what its gradients need (Chen et al. 2016,
    "Training Deep Nets with Sublinear Memory Cost"), as ``transformers``' ``gradient_checkpointing_enable`` does.

    ``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=False`` (``options`` may change it): the
    non-reentrant form takes keyword arguments and any output, restores the RNG state so that dropout draws the same
    masks again, and lets gradients reach tensors the layer reads from outside its arguments (the earlier layers'
    keys and values a ``KVSource`` reads from its history) through the graph of the first pass. ``offload`` keeps
    the saved inputs in host memory (``torch.autograd.graph.save_on_cpu``). Off when the stack is cached
    (generation) or gradients are off: nothing would be recomputed.
    """

    every_n_layers: int = 1
    offload: bool = False
    options: tuple[tuple[str, Any], ...] = (("use_reentrant", False),)

    def wrap(self, index: int, layer: Callable[..., Any]) -> Callable[..., Any]:
        """``layer``, or a function that calls it under checkpointing when layer ``index`` is one to checkpoint."""
        if index % self.every_n_layers or not torch.is_grad_enabled():
            return layer
        options = dict(self.options)

        def run(*args: Any, **kwargs: Any) -> Any:
            if self.offload:
                with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
                    return checkpoint(layer, *args, **options, **kwargs)
            return checkpoint(layer, *args, **options, **kwargs)

        return run


def layer_call(stack: nn.Module, index: int, layer: nn.Module, cached: bool) -> Callable[..., Any]:
    """How a stack calls layer ``index``: checkpointed when the stack's ``activation_checkpointing`` is set, it
    trains and no cache is being filled, else the layer itself."""
    setting: Optional[ActivationCheckpointing] = getattr(stack, "activation_checkpointing", None)
    if setting is None or cached or not stack.training:
        return layer
    return setting.wrap(index, layer)


class Residual(nn.Module):
    """The residual connection of one sublayer: ``x + drop(f(LN(x)))`` (pre-LN) or ``LN(x + drop(f(x)))``
    (post-LN), the default of ``Components.residual``.

    A residual module has two steps around the sublayer ``f``: :meth:`split` returns what ``f`` reads and a
    ``carry`` (anything; here the residual ``x`` itself), :meth:`combine` merges ``carry`` with ``f``'s output into
    the next state. Splitting the connection this way lets a method replace it (Hyper-Connections carry several
    streams and the mixing weights from the split to the combine) without the layer knowing what it holds. The
    branch of a self-attention sublayer may be a tuple ``(query input, key input, value input)``: the layer then
    hands the last two to the self-attention as ``kv_inputs`` (separate norms for the projections, e.g. CLA's).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def split(self, x: Tensor, branch_add: Optional[Tensor] = None) -> tuple[Tensor, Any]:
        """(the branch's input, the carry); ``branch_add`` is added to what the branch reads, before its LN."""
        branch = x if branch_add is None else x + branch_add
        return (self.norm(branch) if self.norm_first else branch), x

    def split_inputs(self, x: Tensor, inputs: tuple[Tensor, ...], branch_add: Optional[Tensor] = None
                     ) -> tuple[tuple[Tensor, ...], Any]:
        """:meth:`split` for a branch that reads other tensors than the residual ``x`` (a self-attention whose query,
        key and value inputs differ): each of ``inputs`` prepared as :meth:`split` prepares ``x`` (``branch_add``
        added, then the pre-LN norm, the same module for each), and the carry is ``x``."""
        return tuple(self.split(t, branch_add)[0] for t in inputs), x

    def combine(self, carry: Any, branch_out: Tensor) -> Tensor:
        out = carry + self.dropout(branch_out)
        return out if self.norm_first else self.norm(out)

    def madds(self, t: int) -> int:
        """Multiply-adds beyond the sublayer's own (none: the addition and LN are not counted, as everywhere)."""
        return 0

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move here (:func:`interlayer.accounting.step_cost`): the fp32 residual stream
        read and written forward and its gradient read and written backward (16 bytes a channel), and the norm's
        output written forward and read backward (its input is the stream, read once more backward)."""
        d = self.norm.normalized_shape[0]
        tokens = batch * length
        return {"residual stream": 16.0 * tokens * d, "activations": (2.0 * width + 4.0) * tokens * d}


class DepthConnection(nn.Module):
    """A stack-level hook, built by ``Components.depth_connection(side)`` (None by default: the plain stack).

    The stack loops (:meth:`~interlayer.core.encoder.Encoder.run_layers`, :func:`~interlayer.core.decoder.
    run_decoder_layers`) call :meth:`start` on the embedded input, :meth:`after_layer` on each layer's output
    (what it returns is the next layer's input) and :meth:`finish` on the last one (before the final LayerNorm);
    ``state`` is whatever :meth:`start` returned for this run (e.g. the earlier layers' outputs), so one module
    serves several runs (Multi-Pass passes, cached decoding steps) without state of its own. :meth:`view` reads a
    stack state as ``(..., d_model)`` for the recorded ``states``/``mids``, when they are read
    (:class:`~interlayer.core.encoder.StateViews`). :meth:`attention_inputs`, asked before each layer, may give that
    layer's self-attention its own query, key and value inputs (the layer's input stays the residual; default None:
    the layer's input plays every role). The stack state is whatever :meth:`start` and the layers' residual modules
    agree on: the core only hands it on (hyper-connections' kernel path passes a pending state, a sublayer's output
    not yet merged into the streams, from one residual module to the next). A depth connection must act on each
    position alone (across depth, never across positions): then the causal stack stays causal, and incremental
    decoding, which runs the stack on the new positions only, equals the full forward pass.
    """

    def start(self, x: Tensor) -> tuple[Tensor, Any]:
        return x, None

    def after_layer(self, index: int, h: Tensor, state: Any) -> Tensor:
        return h

    def attention_inputs(self, index: int, state: Any) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        """The query, key and value inputs of layer ``index``'s self-attention (before its pre-norm), when they
        differ from the layer's input; None (the default) when they do not."""
        return None

    def finish(self, h: Tensor, state: Any) -> Tensor:
        return h

    def view(self, h: Tensor) -> Tensor:
        return h

    def madds(self, t: int) -> int:
        return 0


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward; ``causal=True`` with an optional ``cache`` makes it a decoder-only layer
    (the causal language model's), so one layer class carries every self-attention method to both uses."""

    def __init__(self, self_attn: nn.Module, ffn: nn.Module, d_model: int, *, dropout: float, norm_first: bool,
                 eps: float, bias: bool = True, residuals: Optional[tuple[nn.Module, nn.Module]] = None) -> None:
        """``residuals``: the (attention, FFN) residual modules (``Components.residual``); None: :class:`Residual`."""
        super().__init__()
        self.self_attn = self_attn
        self.ffn = ffn
        self.attn_block, self.ffn_block = residuals or (Residual(d_model, dropout, norm_first, eps, bias),
                                                        Residual(d_model, dropout, norm_first, eps, bias))

    def forward(self, x: Tensor, *, key_padding_mask: Optional[Tensor] = None, prev_logits: Optional[Tensor] = None,
                branch_add: Optional[Tensor] = None, need_intermediates: bool = False, need_logits: bool = False,
                causal: bool = False, cache: Optional[KVCache] = None, kv_history: Optional[KVHistory] = None,
                attn_inputs: Optional[tuple[Tensor, Tensor, Tensor]] = None) -> LayerOutput:
        """``cache``: this layer's keys/values (and method state) so far; ``x`` then holds only the new positions.
        ``attn_inputs``: the self-attention's own query, key and value inputs (``x`` stays the residual).
        ``need_logits``: the self-attention's logits only (:func:`logits_request`)."""
        branch, carry, shared = _attention_branch(self.attn_block, x, branch_add, kv_history, attn_inputs)
        shared |= logits_request(need_logits)
        attn_out, inter = self.self_attn(branch, key_padding_mask=key_padding_mask,
                                         prev_logits=prev_logits, need_intermediates=need_intermediates,
                                         causal=causal, cache=cache, **shared)
        mid = self.attn_block.combine(carry, attn_out)
        branch, carry = self.ffn_block.split(mid)
        hidden = self.ffn_block.combine(carry, self.ffn(branch))
        return LayerOutput(hidden=hidden, mid=mid, attention=inter)

    def madds(self, t: int) -> int:
        return (self.self_attn.madds(t, t) + self.ffn.madds(t) + self.attn_block.madds(t)
                + self.ffn_block.madds(t))


@dataclass
class DecoderLayerCache:
    self_attn: KVCache
    cross_attn: KVCache


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention to a memory, feed-forward. ``causal=False`` lets every position attend to
    every other (a stack over a set that is not generated, e.g. MCAN's image regions); the self-attention then
    needs ``self_padding_mask`` and may mix in the previous layer's logits (``prev_logits``), as in the encoder."""

    def __init__(self, self_attn: nn.Module, cross_attn: nn.Module, ffn: nn.Module, d_model: int, *,
                 dropout: float, norm_first: bool, eps: float, bias: bool = True, causal: bool = True,
                 residuals: Optional[tuple[nn.Module, nn.Module, nn.Module]] = None) -> None:
        """``residuals``: the (self-attention, cross-attention, FFN) residual modules; None: :class:`Residual`."""
        super().__init__()
        self.causal = causal
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.attn_block, self.cross_block, self.ffn_block = residuals or tuple(
            Residual(d_model, dropout, norm_first, eps, bias) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, *, self_padding_mask: Optional[Tensor] = None,
                memory_padding_mask: Optional[Tensor] = None, cache: Optional[DecoderLayerCache] = None,
                need_intermediates: bool = False, need_logits: bool = False, prev_logits: Optional[Tensor] = None,
                kv_history: Optional[KVHistory] = None, attn_inputs: Optional[tuple[Tensor, Tensor, Tensor]] = None
                ) -> tuple[Tensor, Optional[AttentionIntermediates], Optional[AttentionIntermediates]]:
        branch, carry, shared = _attention_branch(self.attn_block, x, None, kv_history, attn_inputs)
        shared |= logits_request(need_logits)
        attn_out, self_inter = self.self_attn(
            branch, key_padding_mask=self_padding_mask, causal=self.causal,
            prev_logits=prev_logits, need_intermediates=need_intermediates,
            cache=cache.self_attn if cache else None, **shared)
        x = self.attn_block.combine(carry, attn_out)
        branch, carry = self.cross_block.split(x)
        cross_out, cross_inter = self.cross_attn(
            branch, memory, key_padding_mask=memory_padding_mask,
            need_intermediates=need_intermediates, cache=cache.cross_attn if cache else None)
        x = self.cross_block.combine(carry, cross_out)
        branch, carry = self.ffn_block.split(x)
        x = self.ffn_block.combine(carry, self.ffn(branch))
        return x, self_inter, cross_inter

    def madds(self, t: int, src_len: int) -> int:
        return (self.self_attn.madds(t, t) + self.cross_attn.madds(t, src_len) + self.ffn.madds(t)
                + sum(block.madds(t) for block in (self.attn_block, self.cross_block, self.ffn_block)))


def logits_request(need_logits: bool) -> dict[str, bool]:
    """The keyword a self-attention receives when a next layer reads its logits and it can return them alone
    (``logits_on_request``; the core's attention does): passed only when wanted, so a replaced self-attention
    module without it need not accept the keyword."""
    return {"need_logits": True} if need_logits else {}


def logits_wanted(layers: Sequence[nn.Module]) -> list[tuple[bool, bool]]:
    """For each layer of a stack, ``(needs_logits, logits_only)``: whether the next layer mixes its self-attention
    logits in (predictive attention), and whether its self-attention can return them alone (``need_logits``, no
    probabilities: the fast path); where it cannot, the stack asks for every intermediate instead."""
    wanted = []
    for i, layer in enumerate(layers):
        needed = i + 1 < len(layers) and getattr(layers[i + 1].self_attn, "wants_prev_logits", False)
        wanted.append((needed, needed and getattr(layer.self_attn, "logits_on_request", False)))
    return wanted


def _attention_branch(block: nn.Module, x: Tensor, branch_add: Optional[Tensor], kv_history: Optional[KVHistory],
                      attn_inputs: Optional[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Any, dict[str, Any]]:
    """The self-attention's query input, the residual carry, and the keyword arguments the self-attention receives
    only when there is something to pass (``kv_history``; ``kv_inputs`` from separate ``attn_inputs``)."""
    shared: dict[str, Any] = {} if kv_history is None else {"kv_history": kv_history}
    branch, carry = (block.split(x, branch_add) if attn_inputs is None
                     else block.split_inputs(x, attn_inputs, branch_add))
    if not isinstance(branch, tuple):
        return branch, carry, shared
    q_in, k_in, v_in = branch
    return q_in, carry, {**shared, "kv_inputs": (k_in, v_in)}


def shares_kv(layers: nn.ModuleList) -> bool:
    """Whether a layer of the stack takes keys/values from earlier ones (its self-attention has a ``kv_source``), so
    the stack must keep a :data:`~interlayer.core.attention.KVHistory` while it runs."""
    return any(getattr(layer.self_attn, "kv_source", None) is not None for layer in layers)
