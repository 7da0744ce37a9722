"""Multi-head attention with separate q/k/v/out projections (fairseq layout) and two interchangeable paths.

* **Fused** — ``torch.nn.functional.scaled_dot_product_attention``: used automatically when nothing needs the
  attention logits (no intermediates requested, no logit mixer, ``attn_impl='auto'``).
* **Eager** — explicit ``softmax(q k^T / sqrt(d) + bias)``: used when a caller wants the
  :class:`AttentionIntermediates` or a *logit mixer* rewrites the logits (Predictive Attention).

Masking never writes ``-inf``: disallowed logits are replaced by the dtype's most negative finite number, and a
query row with no allowed key (an all-padding sequence) outputs zeros on both paths, so no NaN can appear and
the two paths agree exactly on every row.

Extension points used by the method modules, all optional and generic:
``relative`` (a module giving a ``(B,H,Tq,Tk)`` logit bias, or, when it ``rotates``, rotating queries and keys
before the cache: rotary positions), ``logit_mixer`` (a :class:`LogitMixer`, mapping the current and
the previous layer's logits to new logits), ``qk_dim`` (query/key width different from ``d_model``), ``kv_source``
(a :class:`KVSource`: the keys and values a self-attention attends with may come from earlier layers of the same
stack, ``kv_history``; a layer that reuses them has no key or value projection and keeps nothing in its cache),
``kv_inputs`` (self-attention whose key and value projections read other tensors than the query projection: a
stack that hands each role of a layer's input its own mix of earlier layers).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels.logits_attention import logits_attention
from .positions import offset_positions


@dataclass
class AttentionIntermediates:
    """What one attention call computed, for analysis, plots and cross-layer methods.

    ``logits`` are pre-softmax and *unmasked* (they include relative-position bias and any logit mixing), so a
    next layer can read them without meeting a masking constant. ``probs`` are the masked softmax, None when only
    the logits were asked for (``need_logits``: a next layer that reads them), in which case a causal map's cells
    above the diagonal are unspecified (the fast paths never compute them; every reader masks them). ``extras``
    holds method-specific maps (e.g. Predictive Attention's CNN prediction).
    """

    logits: Tensor
    probs: Optional[Tensor]
    q: Tensor
    k: Tensor
    v: Tensor
    extras: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class KVCache:
    """Keys and values kept between decoding steps: appended for self-attention, computed once for cross.

    ``state`` holds whatever else a module of the layer must carry from one step to the next, by name (a causal
    logit mixer keeps the last rows of its convolution inputs there); every tensor in it has the batch first, so
    :meth:`reorder` can select its rows too.

    Three layouts, the same keys and values in each:

    * **growing** (``capacity=None``, the default): each append concatenates, so every step allocates the whole
      cache anew (``torch.cat``), which is what makes incremental decoding slow on a GPU;
    * **static** (``capacity=N``): the first append allocates ``N`` positions once (zeros, in the keys' dtype and
      device), and every append writes into them in place; ``k`` and ``v`` are views of the positions written,
      so attention reads exactly what the growing layout holds, and no step allocates cache memory;
    * **fixed-shape** (static, plus ``position``: a 0-dim long tensor on the device, shared by the layers'
      caches): appends write at ``position, position + 1, ...`` (``index_copy_``) and ``k``, ``v`` are the whole
      buffers, so every decoding step has the same shapes and no Python number changes between steps, which is
      what a compiled step replayed as a CUDA graph needs. Attention then reads its query positions from
      :attr:`offset` (the tensor); the causal mask hides the positions not written yet (zeros, so never NaN).
      The caller advances ``position`` and keeps it within ``capacity`` (a device tensor cannot be checked
      without a host sync).
    """

    k: Optional[Tensor] = None
    v: Optional[Tensor] = None
    state: dict[str, Tensor] = field(default_factory=dict)
    capacity: Optional[int] = None  # static layout: positions allocated at the first append
    position: Optional[Tensor] = None  # fixed-shape layout: where this call's first position is written
    buffers: dict[str, Tensor] = field(default_factory=dict, repr=False)  # static layout: "k", "v" (allocated)

    @property
    def length(self) -> int:
        """Positions held (in the fixed-shape layout: the capacity; :attr:`offset` is the position)."""
        return 0 if self.k is None else self.k.shape[2]

    @property
    def offset(self) -> Union[int, Tensor]:
        """The position of the first new query of the coming call: the length held, or the ``position`` tensor."""
        return self.position if self.position is not None else self.length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.capacity is None:
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        else:
            end = self.length + k.shape[2]
            self.k, self.v = self._write("k", k, end), self._write("v", v, end)
        return self.k, self.v

    def append_keys(self, k: Tensor) -> Tensor:
        """Keep new keys only: a layer whose values are another layer's (a :class:`KVSource`) stores no values."""
        if self.capacity is None:
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        else:
            self.k = self._write("k", k, self.length + k.shape[2])
        return self.k

    def _write(self, name: str, new: Tensor, end: int) -> Tensor:
        """Static layouts: ``new`` (B, H, t, d) into the buffer ``name``, allocated at the first write; returns
        what attention reads (the view up to ``end``, or the whole buffer in the fixed-shape layout)."""
        buffer = self.buffers.get(name)
        if buffer is None:
            shape = (new.shape[0], new.shape[1], self.capacity, new.shape[3])
            buffer = self.buffers[name] = new.new_zeros(shape)
        if self.position is not None:
            rows = offset_positions(self.position, new.shape[2], buffer.device)
            return buffer.index_copy_(2, rows, new.to(buffer.dtype))
        if end > self.capacity:
            raise ValueError(f"the static KV cache holds {self.capacity} positions; {end} were written (make it "
                             "with a larger capacity)")
        buffer[:, :, end - new.shape[2]:end] = new
        return buffer[:, :, :end]

    def reset(self) -> None:
        """Empty, keeping a static layout's buffers for the next sequence of the same batch size: their stale
        positions are overwritten or, past what is written, never attended to."""
        self.k = self.v = None
        self.state = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held (the method state excluded): what a KV-cache-saving method shrinks."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of key/value memory this cache occupies: the buffers of a static layout (its whole capacity), the
        tensors held of a growing one (each step also allocates their next size before freeing these)."""
        if self.buffers:
            return sum(t.numel() * t.element_size() for t in self.buffers.values())
        return self.nbytes

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses); a static layout does it in place when
        the batch keeps its size."""
        if self.buffers:
            for name, buffer in self.buffers.items():
                rows = buffer.index_select(0, index)
                self.buffers[name] = buffer.copy_(rows) if rows.shape == buffer.shape else rows
            length = self.length
            self.k = self._read("k", length)
            self.v = self._read("v", length)
        else:
            if self.k is not None:
                self.k = self.k.index_select(0, index)
            if self.v is not None:
                self.v = self.v.index_select(0, index)
        self.state = {name: value.index_select(0, index) for name, value in self.state.items()}

    def _read(self, name: str, length: int) -> Optional[Tensor]:
        buffer = self.buffers.get(name)
        if buffer is None:
            return None
        return buffer if self.position is not None else buffer[:, :, :length]


def newest(full: Tensor, count: int, cache: Optional[KVCache]) -> Tensor:
    """The ``count`` positions the current call added to ``full`` (B, H, T, d), an earlier layer's full-length
    keys or values (ResFormer mixes the first layer's new values in): the last ones, or in the fixed-shape layout
    of ``cache`` those at its ``position``."""
    if cache is not None and cache.position is not None:
        return full.index_select(2, offset_positions(cache.position, count, full.device))
    return full[:, :, full.shape[2] - count:]


# The keys and values each earlier self-attention layer of the stack attended with in this forward pass, in layer
# order, full length (after its cache append), heads split: ``(B, H, T, d_head)`` each.
KVHistory = list[tuple[Tensor, Tensor]]


class KVSource(Protocol):
    """Where a self-attention layer's keys and values come from, when not (only) from its own projections.

    ``projects_keys`` / ``projects_values`` say whether the layer has a key / value projection at all (without one
    it has fewer parameters, and its cache keeps none of them). Called as ``source(k, v, history, cache)``: ``k``,
    ``v`` are the layer's own new keys (rotated, with rotary positions) and values, or None where it has no
    projection; ``history`` the earlier layers' (:data:`KVHistory`); ``cache`` the layer's :class:`KVCache` or
    None. It returns the full-length keys and values to attend with and appends to ``cache`` only what the layer
    must keep itself (reused tensors stay in their owner's cache, so the cache shrinks). It is an ``nn.Module``, so
    mixing weights it learns are the layer's parameters.
    """

    projects_keys: bool
    projects_values: bool

    def __call__(self, k: Optional[Tensor], v: Optional[Tensor], history: KVHistory, cache: Optional[KVCache]
                 ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class MixerContext:
    """What a logit mixer may need besides the maps, handed to it as ``context``: whether the attention is causal,
    the position of the first query row (``q_offset``, non-zero in incremental decoding, where the maps hold only
    the new rows), and the layer's cache, whose ``state`` keeps what the mixer carries from one step to the next."""

    causal: bool = False
    q_offset: int = 0  # a tensor only in a fixed-shape cache's decoding, which refuses logit mixers
    cache: Optional[KVCache] = None


class LogitMixer(nn.Module, abc.ABC):
    """What a ``logit_mixer`` is: a module that rewrites a layer's attention logits from the previous layer's
    (Predictive Attention's Eq. 4; Res-Transformer / RealFormer-style residual attention).

    The core asks :meth:`fuses` before the layer computes anything; where it says True it calls
    :meth:`fused_attention`, else it makes the logits itself, calls the mixer (:meth:`forward`) and runs its own
    masked softmax over the result (the eager path). A mixer without a fused op keeps the default, False.
    """

    @abc.abstractmethod
    def forward(self, logits: Tensor, prev_logits: Tensor, key_padding_mask: Optional[Tensor] = None,
                context: MixerContext = MixerContext()) -> tuple[Tensor, dict[str, Tensor]]:
        """``(mixed logits, extras)`` from the layer's logits and the previous layer's, both ``(B, H, Tq, Tk)``
        before masking; ``extras`` go to :attr:`AttentionIntermediates.extras` by name."""

    @abc.abstractmethod
    def madds(self, t_q: int, t_k: int) -> int:
        """Multiply-adds of one forward pass over ``t_q x t_k`` maps (the layer's count adds them)."""

    def fuses(self, prev_logits: Tensor, v: Tensor, causal: bool) -> bool:
        """Whether :meth:`fused_attention` takes this case (maps shaped like ``prev_logits``, values ``v``); the
        core asks only where the logits are not needed as probabilities (no dropout while training, no cache)."""
        return False

    def fused_attention(self, q: Tensor, k: Tensor, scale: float, bias: Optional[Tensor], prev_logits: Tensor,
                        v: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> tuple[Tensor, Tensor]:
        """``(softmax(M masked) @ v, M)`` with ``M`` the mix of the logits ``scale q k^T (+ bias)`` and
        ``prev_logits``, in one op: called only where :meth:`fuses` said True, so a mixer that overrides one
        overrides both."""
        raise NotImplementedError(f"{type(self).__name__}.fuses() took a case, but the class defines no "
                                  "fused_attention")


def build_allowed_mask(key_padding_mask: Optional[Tensor], t_q: int, t_k: int, causal: bool,
                       q_offset: Union[int, Tensor], device: torch.device) -> Optional[Tensor]:
    """Boolean ``(B|1, 1, Tq, Tk)`` mask, True where query i may attend key j; None when everything is allowed."""
    allowed = None
    if causal:
        i = offset_positions(q_offset, t_q, device).unsqueeze(1)
        j = torch.arange(t_k, device=device).unsqueeze(0)
        allowed = (j <= i)[None, None]
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


def _mask_bias(allowed: Tensor) -> Tensor:
    """``allowed`` as an additive fp32 bias: 0 where allowed, the most negative finite float elsewhere (never
    ``-inf``: a logit plus it stays finite, and a row with no allowed key gives a uniform softmax, not NaN)."""
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, torch.finfo(torch.float32).min)


def _rows_without_keys(allowed: Optional[Tensor], key_padding_mask: Optional[Tensor], causal: bool
                       ) -> Optional[Tensor]:
    """Broadcastable mask of query rows that may attend no key (their output is set to zero), or None.

    Without padding no row is empty (a causal row always sees its first key). Without causality a row is empty
    only when its whole sequence is padding; the mask is returned whether or not such a sequence is present,
    because asking (``bool(empty.any())``) would synchronise the host with the device and break a compiled graph
    on every attention call, while the fill it would save costs one pass over the output.
    """
    if allowed is None or key_padding_mask is None:
        return None
    if not causal:
        return key_padding_mask.all(-1)[:, None, None, None]
    return ~allowed.any(-1, keepdim=True)


def _project_together(x: Tensor, projections: Sequence[nn.Module]) -> Sequence[Tensor]:
    """Each projection of ``x``: one matrix product over the weights stacked when they are plain ``nn.Linear``
    layers alike in bias (only the product is fused; the parameters stay separate), else one product each."""
    # Compiled, separate products: inductor fused the weights' concatenation with the token embedding's gather
    # into one kernel that took 8% of an IWSLT-size training step on the CPU (docs/benchmarks.md).
    if torch.compiler.is_compiling() or len(projections) == 1:
        return [p(x) for p in projections]
    if all(type(p) is nn.Linear for p in projections) and len({p.bias is None for p in projections}) == 1:
        weight = torch.cat([p.weight for p in projections])
        bias = None if projections[0].bias is None else torch.cat([p.bias for p in projections])
        return F.linear(x, weight, bias).split([p.out_features for p in projections], dim=-1)
    return [p(x) for p in projections]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``n_heads`` heads (Vaswani et al. 2017, Eq. 1-2 of Sec. 3.2).

    ``kv_dim`` is the width of the key/value input (cross-attention may read a memory of another width);
    ``qk_dim`` the total width of queries and keys (``d_model`` by default). Values and output are ``d_model``.
    """

    logits_on_request = True  # forward(need_logits=True): the logits alone, for a next layer that mixes them in

    def __init__(self, d_model: int, n_heads: int, *, kv_dim: Optional[int] = None, qk_dim: Optional[int] = None,
                 dropout: float = 0.0, bias: bool = True, relative: Optional[nn.Module] = None,
                 logit_mixer: Optional[LogitMixer] = None, force_eager: bool = False,
                 kv_source: Optional[nn.Module] = None) -> None:
        super().__init__()
        if logit_mixer is not None and not isinstance(logit_mixer, LogitMixer):
            raise TypeError(f"logit_mixer must be an instance of {__name__}.LogitMixer (its forward and madds, and "
                            f"fuses with fused_attention where it has a fused op), got {type(logit_mixer).__name__}")
        kv_dim = kv_dim or d_model
        qk_dim = qk_dim or d_model
        self.n_heads, self.d_model, self.qk_dim, self.kv_dim = n_heads, d_model, qk_dim, kv_dim
        self.scale = (qk_dim // n_heads) ** -0.5
        self.q_proj = nn.Linear(d_model, qk_dim, bias=bias)
        self.k_proj: Optional[nn.Linear] = (nn.Linear(kv_dim, qk_dim, bias=bias)
                                            if kv_source is None or kv_source.projects_keys else None)
        self.v_proj: Optional[nn.Linear] = (nn.Linear(kv_dim, d_model, bias=bias)
                                            if kv_source is None or kv_source.projects_values else None)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.relative = relative
        self.logit_mixer = logit_mixer
        self.kv_source = kv_source
        self.force_eager = force_eager
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's initialisation: Xavier-uniform projections, the query/key/value ones scaled by 1/sqrt(2), zero
        biases."""
        # fairseq's init: q/k/v scaled Xavier (gain 1/sqrt(2)) keeps the logit variance near 1 at the start.
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            if proj is not None:
                nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj is not None and proj.bias is not None:
                nn.init.zeros_(proj.bias)

    @property
    def wants_prev_logits(self) -> bool:
        """True when this module mixes in the previous layer's logits, so that layer must produce them."""
        return self.logit_mixer is not None

    def _project_self(self, x: Tensor, kv_inputs: Optional[tuple[Tensor, Tensor]] = None
                      ) -> list[Optional[Tensor]]:
        """q, k, v of self-attention (None for a projection the layer does not have). From one input: one matrix
        product over the weights stacked, when they are plain ``nn.Linear`` layers (the parameters stay separate,
        fairseq's layout; only the product is fused), else one product each. With ``kv_inputs`` the key and value
        projections read their own inputs: three products."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if kv_inputs is not None and kv_inputs[0] is kv_inputs[1] and None not in projections[1:]:
            return [self.q_proj(x), *_project_together(kv_inputs[0], projections[1:])]  # one input for k and v
        if kv_inputs is not None:
            return [p(t) if p is not None else None for p, t in zip(projections, (x, *kv_inputs))]
        present = iter(_project_together(x, [p for p in projections if p is not None]))
        return [next(present) if p is not None else None for p in projections]

    def _sourced_kv(self, x: Tensor, cache: Optional[KVCache], history: KVHistory,
                    kv_inputs: Optional[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor, Union[int, Tensor]]:
        """q, k, v and the first query's position when ``kv_source`` supplies the keys/values (see :class:`KVSource`).
        The position is read off the full-length keys, since a layer that reuses them keeps no cache of its own."""
        q, k, v = (self._split(t) if t is not None else None for t in self._project_self(x, kv_inputs))
        rotary = getattr(self.relative, "rotates", False)
        if rotary and k is not None:
            k = self.relative(k, cache.offset if cache is not None else 0)
        k, v = self.kv_source(k, v, history, cache)
        # a fixed-shape cache's keys are the whole buffer: the position is its tensor, not the keys' length
        fixed = cache is not None and cache.position is not None
        q_offset = cache.position if fixed else k.shape[2] - x.shape[1]
        if rotary:
            q = self.relative(q, q_offset)
        return q, k, v, q_offset

    def _memory_kv(self, memory: Tensor, cache: Optional[KVCache]) -> tuple[Tensor, Tensor]:
        """Keys and values of a cross-attention memory, projected once per sequence when a cache is given."""
        if cache is not None and cache.k is not None:
            return cache.k, cache.v
        k, v = self._split(self.k_proj(memory)), self._split(self.v_proj(memory))
        if cache is not None:
            cache.k, cache.v = k, v
        return k, v

    def _split(self, x: Tensor) -> Tensor:
        b, t, width = x.shape
        return x.view(b, t, self.n_heads, width // self.n_heads).transpose(1, 2)

    def forward(self, x: Tensor, memory: Optional[Tensor] = None, *, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False, prev_logits: Optional[Tensor] = None, need_intermediates: bool = False,
                need_logits: bool = False, cache: Optional[KVCache] = None, kv_history: Optional[KVHistory] = None,
                kv_inputs: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Optional[AttentionIntermediates]]:
        """Attend from ``x`` (B, Tq, d_model) to itself, or to ``memory`` (B, Tk, kv_dim) for cross-attention.

        ``key_padding_mask`` (B, Tk) is True at padding. With ``cache`` and self-attention, ``x`` holds only the
        new positions and keys/values are appended; with ``cache`` and cross-attention the memory projections are
        computed once and reused. ``kv_history`` (self-attention; the stack passes it only when a layer has a
        ``kv_source``): the earlier layers' keys/values, which ``kv_source`` may reuse; this layer's are appended.
        ``need_logits``: return intermediates holding the logits only (a next layer mixes them in), which the maps
        path (:meth:`_maps`) computes without the probabilities; ``need_intermediates`` returns everything.
        """
        b, t_q, _ = x.shape
        q_offset: Union[int, Tensor] = 0
        rotary = getattr(self.relative, "rotates", False)
        if memory is None and self.kv_source is not None:
            q, k, v, q_offset = self._sourced_kv(x, cache, kv_history if kv_history is not None else [], kv_inputs)
        elif memory is None:
            q, k, v = (self._split(t) for t in self._project_self(x, kv_inputs))
            if cache is not None:
                q_offset = cache.offset
            if rotary:  # keys enter the cache rotated to their own positions
                q, k = self.relative(q, q_offset), self.relative(k, q_offset)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q = self._split(self.q_proj(x))
            k, v = self._memory_kv(memory, cache)
        if memory is None and kv_history is not None:
            kv_history.append((k, v))
        t_k = k.shape[2]
        # Shaw et al.: the bias is q . e / sqrt(d), like the logits, so it is computed from the scaled query.
        bias = self.relative(q * self.scale, q_offset, t_k) if self.relative is not None and not rotary else None
        # A tensor offset is a fixed-shape cache's step: its keys are the whole buffer, and the causal mask is what
        # hides the positions not written yet, so it is always built there (and no Python comparison reads it).
        fixed = isinstance(q_offset, Tensor)
        # One new query at the end of the sequence (a decoding step) sees every key: no causal mask to build.
        masked_causal = causal and (fixed or not (t_q == 1 and q_offset == t_k - 1))
        first = not fixed and q_offset == 0  # the queries start at position 0
        # The flash path of a causal stack: is_causal, no mask tensor (the mask is built only where it is read).
        plain_causal = masked_causal and key_padding_mask is None and first and t_q == t_k and bias is None

        maps = None
        if not need_intermediates and not self.force_eager and (need_logits or self.logit_mixer is not None):
            maps = self._maps(q, k, v, bias, key_padding_mask, prev_logits, causal and first, cache)
        eager = need_intermediates or self.logit_mixer is not None or self.force_eager or need_logits
        allowed = None
        if maps is None and (eager or not plain_causal):
            allowed = build_allowed_mask(key_padding_mask, t_q, t_k, masked_causal, q_offset, x.device)
        if maps is not None:
            out, inter = maps
        elif eager:
            context = MixerContext(causal, q_offset, cache if memory is None else None)
            out, inter = self._eager(q, k, v, bias, allowed, key_padding_mask, prev_logits, context)
        else:
            out, inter = self._fused(q, k, v, bias, allowed, plain_causal), None
        empty = _rows_without_keys(allowed, key_padding_mask, causal)
        if empty is not None:
            out = out.masked_fill(empty, 0.0)
        out = out.transpose(1, 2).reshape(b, t_q, self.d_model)
        return self.out_proj(out), inter if need_intermediates or need_logits else None

    def _maps(self, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], key_padding_mask: Optional[Tensor],
              prev_logits: Optional[Tensor], causal: bool, cache: Optional[KVCache]
              ) -> Optional[tuple[Tensor, AttentionIntermediates]]:
        """Attention whose logits must exist as a map (a next layer reads them, or a logit mixer rewrites them),
        without the probabilities: the logits ``S``, then the mixer's fused map op where it
        :meth:`~LogitMixer.fuses` this case (asked before anything is computed; :meth:`~LogitMixer.fused_attention`
        makes the logits ``scale q k^T + bias`` itself), else attention from the logits
        (:func:`~interlayer.kernels.logits_attention.logits_attention`). None where the eager path must run:
        attention dropout while training, a cache (incremental decoding), a mixer that does not fuse the case."""
        if (self.dropout and self.training) or cache is not None:
            return None
        mixer = self.logit_mixer
        if mixer is not None and (prev_logits is None or not mixer.fuses(prev_logits, v, causal)):
            return None
        if mixer is not None:  # the mixer makes the logits itself: it may need only part of the map
            out, logits = mixer.fused_attention(q, k, self.scale, bias, prev_logits, v, key_padding_mask, causal)
        else:
            logits = torch.matmul(q * self.scale, k.transpose(-2, -1))
            if bias is not None:
                logits = logits + bias
            out = logits_attention(logits, v, key_padding_mask, causal)
        return out, AttentionIntermediates(logits=logits, probs=None, q=q, k=k, v=v)

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], allowed: Optional[Tensor],
               plain_causal: bool) -> Tensor:
        """SDPA with the least mask it needs: ``is_causal`` and none for an unpadded causal map (the flash kernel),
        none at all where every key is allowed, else the boolean mask as broadcast as it is built (``(B, 1, 1, Tk)``
        for padding alone, which the memory-efficient kernel reads without expanding), or the bias with the masked
        cells at the most negative float."""
        dropout = self.dropout if self.training else 0.0
        if plain_causal:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale)
        mask = allowed
        if bias is not None:
            mask = bias if allowed is None else bias.masked_fill(~allowed, torch.finfo(bias.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scale)

    def _eager(self, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], allowed: Optional[Tensor],
               key_padding_mask: Optional[Tensor], prev_logits: Optional[Tensor], context: MixerContext
               ) -> tuple[Tensor, AttentionIntermediates]:
        """The explicit path, with as few passes over the ``(B, H, Tq, Tk)`` maps as it can take: the scale is
        applied to the queries (``Tq x d`` numbers, not ``Tq x Tk``) and the mask is added as a ``0 / min`` bias
        in fp32 before the softmax (``masked_fill`` with a broadcast mask costs several times an add on CPUs). The
        softmax runs in fp32, or in the logits' own precision where it is higher (a float64 model stays float64)."""
        logits = torch.matmul(q * self.scale, k.transpose(-2, -1))
        if bias is not None:
            logits = logits + bias
        extras: dict[str, Tensor] = {}
        if self.logit_mixer is not None and prev_logits is not None:
            logits, extras = self.logit_mixer(logits, prev_logits, key_padding_mask, context=context)
        masked = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if allowed is not None:
            masked = masked + _mask_bias(allowed)
        probs = torch.softmax(masked, dim=-1).to(v.dtype)
        dropped = F.dropout(probs, self.dropout, self.training) if self.dropout else probs
        return dropped @ v, AttentionIntermediates(logits=logits, probs=probs, q=q, k=k, v=v, extras=extras)

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move for this attention's saved activations (:func:`interlayer.accounting.
        step_cost`): the projected queries, keys and values and the heads' output, written forward, read backward
        (flash attention keeps no map; a method that materialises maps reports them itself)."""
        own = self.qk_dim + (self.qk_dim if self.k_proj is not None else 0) + (
            self.d_model if self.v_proj is not None else 0) + self.d_model
        return {"activations": 2.0 * width * batch * length * own}

    def madds(self, t_q: int, t_k: int) -> int:
        """Multiply-adds of one forward pass without cache (projections, logits, weighted sum, extras)."""
        kv_width = (self.qk_dim if self.k_proj is not None else 0) + (self.d_model if self.v_proj is not None else 0)
        total = t_q * self.d_model * self.qk_dim + t_k * self.kv_dim * kv_width
        total += t_q * t_k * (self.qk_dim + self.d_model) + t_q * self.d_model * self.d_model
        if self.relative is not None:
            total += self.relative.madds(t_q, t_k, self.n_heads)
        if self.logit_mixer is not None:
            total += self.logit_mixer.madds(t_q, t_k)
        return total
