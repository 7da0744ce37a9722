"""Hyper-connection mixes: the reference path (PyTorch), the fused Triton path, and the one rule between them.

What is computed (Zhu et al., arXiv 2409.19606; notation of ``methods/hyper_connections.py``): the stack state is
``H``, n streams of width d stacked first, ``(n, ..., d)``. Around a sublayer ``T``: the width connection ``h0 =
sum_j a[j] H_j`` (what ``T`` reads) and ``kept_i = sum_j A[j, i] H_j``; the depth connection ``H'_i = b_i y + kept_i``
with ``y = T(h0)``. Static HC: ``[a | A | b]`` are parameters; dynamic (Eq. 10-13): per position, ``S + [s_alpha ..
s_alpha, s_beta] * tanh(LN(H_j) W)`` row by row.

**The interface, shared with other multi-stream residuals (mHC).** One sublayer's coefficients are ``coef``
``(positions, n, n + 2)``, row j being source stream j: ``coef[p, j, 0] = a_j`` (mHC's ``H_pre[j]``), ``coef[p, j,
1 + i] = A[j, i]`` (mHC's ``H_res[i, j]``), ``coef[p, j, n + 1] = b_j`` (mHC's ``H_post[j]``); static coefficients
are expanded over positions (stride 0). :func:`width_connection` (HC's parameters) and :func:`width_mix` (given
coefficients) return ``(h0, carry)``, :func:`depth_connection` the next state, :func:`stream_sum` the streams' sum;
the kernel path runs the operators :func:`hc_mix` and :func:`hc_dynamic` (:mod:`.ops`); the reference path writes
every mix as n scaled streams added, which inductor fuses (a batched product of inner size n: a library call).

**Pending state.** On the kernel path :func:`depth_connection` returns a :class:`Pending` ``(H, coef, y)``: the
next width connection's kernel writes ``H'`` and the next ``h0`` in one pass (``H'`` never read back), the stack's
end sums it unwritten; the backward does the same in reverse, recomputing ``H'`` from ``H`` and ``y``. Costs (bytes
per position, against the plain residual) and the machine-code audit: docs/methods/hyper_connections.md.

**Dispatch.** The Triton path where :func:`interlayer.kernels.dispatch.use_triton` says so and :func:`covers` the
case, the reference path otherwise (``INTERLAYER_KERNELS=triton``: an error). The stack state keeps its dtype
(16-bit streams are an option of the methods); the kernels compute in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import use_triton
from .ops import kernel_op
from .precision import fp32_island
from .tiles import hc_tile_shape

KERNEL = "hyper_connections"
MAX_TILE = 8192  # elements of one (n, d) register tile, rounded up to powers of two; beyond, registers would spill


FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def covers(streams: Tensor, branch: Optional[Tensor] = None) -> bool:
    """Whether the kernels handle these streams ``(n, ..., d)`` (and a pending sublayer output ``branch``):
    fp32/fp16/bf16, an ``(n, d)`` register tile of at most 8,192 elements (``d <= 2048`` at n = 4), and a
    position's coefficients along its channels (``max(n, 2) (n + 2) <= d`` rounded up to a power of two)."""
    if streams.dim() < 2 or streams.numel() == 0 or streams.dtype not in FLOATS:
        return False
    if branch is not None and branch.dtype not in FLOATS:
        return False
    n = streams.shape[0]
    np_, _, block_d = hc_tile_shape(n, streams.shape[-1])
    # a position's coefficients (and DHC's two sums per column) fit along its channels
    return np_ * block_d <= MAX_TILE and max(n, 2) * (n + 2) <= block_d


class HCParams(NamedTuple):
    """One hyper-connection's parameters: ``static_alpha = [A_m | A_r]`` ``(n, n+1)``, ``static_beta = B``
    ``(n,)``; for DHC ``weight = [W_m | W_r | W_beta]`` ``(d, n+2)``, the stream norm's affine parameters, the
    scales ``s_alpha``, ``s_beta`` (0-d) and the norm's ``eps`` (all None for SHC)."""

    static_alpha: Tensor
    static_beta: Tensor
    weight: Optional[Tensor] = None
    norm_weight: Optional[Tensor] = None
    norm_bias: Optional[Tensor] = None
    alpha_scale: Optional[Tensor] = None
    beta_scale: Optional[Tensor] = None
    eps: float = 1e-5


# ---------------------------------------------------------------------------------------------------------------
# The reference path: today's PyTorch, also the fallback (CPU, no Triton, uncovered cases).

def reference_width(streams: Tensor, params: HCParams) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 3-4 (+ 10-13): ``(h0, kept (n, ..., d), beta (n, ..., 1))``. The static width connection
    ``[A_m | A_r]^T H`` is one ``(n+1, n) x (n, positions * d)`` product over the whole batch (Algorithm 2's
    matmul), with autocast off so bf16 autocast does not round the residual streams; the dynamic part adds, per
    position, ``sum_j alpha_dyn[j] H[j]`` (n element-wise terms)."""
    n = params.static_alpha.shape[0]
    with fp32_island(streams.device):
        mixed = (params.static_alpha.to(streams.dtype).t() @ streams.reshape(n, -1)).view(n + 1, *streams.shape[1:])
    beta = params.static_beta.to(streams.dtype).view(n, *([1] * (streams.dim() - 1)))
    if params.weight is not None:
        normed = F.layer_norm(streams.to(params.weight.dtype), streams.shape[-1:], params.norm_weight, params.norm_bias,
                              params.eps)  # 16-bit streams: the projection in the parameters' dtype
        w = torch.tanh(normed @ params.weight)  # Eq. 10-13: tanh(norm(H) W), (n, ..., n+2)
        coefficients = (params.alpha_scale * w[..., :n + 1]).to(streams.dtype).movedim(-1, 1).unsqueeze(-1)
        for j in range(n):
            mixed = mixed + coefficients[j] * streams[j]
        beta = beta + (params.beta_scale * w[..., n + 1]).to(streams.dtype).unsqueeze(-1)
    return mixed[0], mixed[1:], beta


def reference_depth(kept: Tensor, beta: Tensor, branch: Tensor) -> Tensor:
    """Eq. 5: ``B^T y + H'``, the sublayer's output scaled into every stream (in the streams' dtype)."""
    return (beta * branch + kept).to(kept.dtype)


def reference_mix(streams: Tensor, coef: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(h0, kept (n, ..., d), beta (n, ..., 1))`` for given coefficients ``coef``, packed as the kernels take them,
    ``(..., n, n+2)`` per position or ``(n, n+2)`` for every position: ``h0 = sum_j coef[j, 0] H_j``, ``kept_i =
    sum_j coef[j, 1+i] H_j``, ``beta_i = coef[i, n+1]``, each n scaled streams added, in the coefficients' precision,
    then in the streams' dtype."""
    n = streams.shape[0]
    coef = coef.expand(*streams.shape[1:-1], n, n + 2)  # a view where the coefficients serve every position
    c = coef.movedim(-2, 0).unsqueeze(-1)  # (n, ..., n+2, 1): c[j, ..., k] is source stream j's column k

    def mix(k: int) -> Tensor:
        total = c[0, ..., k, :] * streams[0]
        for j in range(1, n):
            total = total + c[j, ..., k, :] * streams[j]
        return total.to(streams.dtype)

    return mix(0), torch.stack([mix(1 + i) for i in range(n)]), c[:, ..., n + 1, :].to(streams.dtype)


def _reference_pending(state: "Pending") -> Tensor:
    """A pending depth connection written out: ``Z_i = b_i y + sum_j A[j, i] H_j`` from the packed coefficients
    (where a kernel's pending state meets the reference path, e.g. the mode changed within a forward)."""
    n = state.streams.shape[0]
    _, kept, beta = reference_mix(state.streams, state.coef.view(*state.streams.shape[1:-1], n, n + 2))
    return reference_depth(kept, beta, state.branch)


# ---------------------------------------------------------------------------------------------------------------
# The Triton path: two operators with hand-written backward passes.

def _used(*grads: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
    """The outputs' gradients for a backward operator: None where autograd has none (an output nobody used, or an
    empty placeholder)."""
    return tuple(g if g is not None and g.numel() else None for g in grads)


def _placeholders(streams: Tensor, grads: Sequence[Optional[Tensor]]) -> list[Tensor]:
    """A backward operator's results: an empty tensor for an input that was None (an operator returns no None)."""
    return [g if g is not None else streams.new_empty(0) for g in grads]


def _like(streams: Tensor, inputs: Sequence[Optional[Tensor]]) -> list[Tensor]:
    """A backward operator's fake results: one tensor like each input, empty for an input that was None."""
    return [t.new_empty(t.shape) if t is not None else streams.new_empty(0) for t in inputs]


def _mix_fake(streams, branch, carry, coef, keep_mixed):
    n, positions, d = streams.shape
    mixed = streams.new_empty((n, positions, d) if branch is not None and keep_mixed else (0,))
    return mixed, streams.new_empty((positions, d) if coef is not None else (0,))


def _mix_backward(dmixed: Optional[Tensor], dh0: Optional[Tensor], streams: Tensor, branch: Optional[Tensor],
                  carry: Optional[Tensor], coef: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from . import hyper_connections_triton as triton_kernels
    dstreams, dbranch, dcarry, dcoef, _ = triton_kernels.backward(streams, branch, carry, coef, None, dmixed, dh0, None)
    return tuple(_placeholders(streams, (dstreams, dbranch, dcarry, dcoef)))


def _mix_backward_fake(dmixed, dh0, streams, branch, carry, coef):
    return tuple(_like(streams, (streams, branch, carry, coef)))


@kernel_op("interlayer::hc_mix", fake=_mix_fake, backward=_mix_backward, backward_fake=_mix_backward_fake,
           save=lambda streams, branch, carry, coef, keep_mixed, output: (streams, branch, carry, coef), grads=_used,
           differentiable=("streams", "branch", "carry", "coef"))
def hc_mix(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
           keep_mixed: bool) -> tuple[Tensor, Tensor]:
    """``(mixed, h0)`` from given coefficients (see the module docstring); an output not computed is empty."""
    from . import hyper_connections_triton as triton_kernels
    mixed, h0, _ = triton_kernels.forward(streams, branch, carry, coef, None, keep_mixed)
    return mixed, h0


_DYNAMIC_TENSORS = ("streams", "branch", "carry", "static_alpha", "static_beta", "weight", "norm_weight", "norm_bias",
                   "alpha_scale", "beta_scale")  # hc_dynamic's inputs but eps, in order: what its backward reads


def _dynamic_fake(streams, branch, carry, static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale,
                  beta_scale, eps):
    n, positions, d = streams.shape
    mixed = streams.new_empty((n, positions, d) if branch is not None else (0,))
    return mixed, streams.new_empty((positions, d)), streams.new_empty((positions, n, n + 2), dtype=torch.float32)


def _dynamic_backward(dmixed: Optional[Tensor], dh0: Optional[Tensor], dcoef: Optional[Tensor], streams: Tensor,
                      branch: Optional[Tensor], carry: Optional[Tensor], static_alpha: Tensor, static_beta: Tensor,
                      weight: Tensor, norm_weight: Tensor, norm_bias: Optional[Tensor], alpha_scale: Tensor,
                      beta_scale: Tensor, eps: float) -> list[Tensor]:
    """The Triton backward of the dynamic hyper-connection: gradients of the streams, the branch output, the carry and
    every coefficient parameter."""
    from . import hyper_connections_triton as triton_kernels
    dynamic = triton_kernels.DynamicParams(static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale,
                                           beta_scale, eps)
    dstreams, dbranch, dcarry, _, params = triton_kernels.backward(streams, branch, carry, None, dynamic, dmixed, dh0,
                                                                   dcoef)
    return _placeholders(streams, (dstreams, dbranch, dcarry, *params))


def _dynamic_backward_fake(dmixed, dh0, dcoef, streams, branch, carry, static_alpha, static_beta, weight, norm_weight,
                           norm_bias, alpha_scale, beta_scale, eps):
    return _like(streams, (streams, branch, carry, static_alpha, static_beta, weight, norm_weight, norm_bias,
                           alpha_scale, beta_scale))


@kernel_op("interlayer::hc_dynamic", fake=_dynamic_fake, backward=_dynamic_backward,
           backward_fake=_dynamic_backward_fake, save=lambda *inputs_and_output: inputs_and_output[:-1], grads=_used,
           differentiable=_DYNAMIC_TENSORS)
def hc_dynamic(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], static_alpha: Tensor,
               static_beta: Tensor, weight: Tensor, norm_weight: Tensor, norm_bias: Optional[Tensor],
               alpha_scale: Tensor, beta_scale: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(mixed, h0, coef)`` with DHC's coefficients (Eq. 10-13) computed from the (mixed) streams."""
    from . import hyper_connections_triton as triton_kernels
    dynamic = triton_kernels.DynamicParams(static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale,
                                           beta_scale, eps)
    return triton_kernels.forward(streams, branch, carry, None, dynamic, True)


# ---------------------------------------------------------------------------------------------------------------
# What the method calls: the width and depth connections, and the sum of the streams, on either path.

@dataclass(frozen=True)
class Pending:
    """A stack state not written yet: ``H'_i = coef[.., i, n+1] y + sum_j coef[.., j, 1+i] H_j`` with
    ``streams`` ``(n, ..., d)``, ``coef`` ``(positions, n, n+2)`` and ``branch`` (``y``) ``(..., d)``."""

    streams: Tensor
    coef: Tensor
    branch: Tensor


@dataclass(frozen=True)
class KernelCarry:
    """What the kernel path's width connection hands to its depth connection: the streams ``H`` it read and the
    packed coefficients."""

    streams: Tensor
    coef: Tensor


State = Union[Tensor, Pending]


def width_connection(state: State, params: HCParams) -> tuple[Tensor, Any]:
    """``(h0, carry)``: the sublayer's input (before its own norm) and what :func:`depth_connection` needs."""
    streams, branch = (state.streams, state.branch) if isinstance(state, Pending) else (state, None)
    if use_triton(streams, params.static_alpha, covered=covers(streams, branch), kernel=KERNEL):
        if params.weight is None:
            return _kernel_mix(state, torch.cat([params.static_alpha, params.static_beta[:, None]], dim=1))
        return _kernel_dynamic(state, params)
    if isinstance(state, Pending):
        state = _reference_pending(state)
    h0, kept, beta = reference_width(state, params)
    return h0, (kept, beta)


def width_mix(state: State, coef: Tensor) -> tuple[Tensor, Any]:
    """:func:`width_connection` with given coefficients (another multi-stream residual's, e.g. mHC's), packed as
    the kernels take them: ``(..., n, n+2)`` per position or ``(n, n+2)`` for every position."""
    streams, branch = (state.streams, state.branch) if isinstance(state, Pending) else (state, None)
    if use_triton(streams, coef, covered=covers(streams, branch), kernel=KERNEL):
        return _kernel_mix(state, coef)
    if isinstance(state, Pending):
        state = _reference_pending(state)
    h0, kept, beta = reference_mix(state, coef)
    return h0, (kept, beta)


def materialize(state: State) -> Tensor:
    """The stack state as streams ``(n, ..., d)``: a pending depth connection written (one kernel pass on the kernel
    path), for a method that reads the streams before its width connection (mHC's dynamic coefficients)."""
    if not isinstance(state, Pending):
        return state
    if not use_triton(state.streams, covered=covers(state.streams, state.branch), kernel=KERNEL):
        return _reference_pending(state)
    n, d = state.streams.shape[0], state.streams.shape[-1]
    mixed, _ = hc_mix(state.streams.reshape(n, -1, d), state.branch.reshape(-1, d), state.coef, None, True)
    return mixed.view(state.streams.shape)


def depth_connection(carry: Any, branch: Tensor) -> State:
    """Eq. 5 on the sublayer's output ``branch``: a :class:`Pending` state on the kernel path (the next width
    connection, or :func:`stream_sum`, writes it), the new streams on the reference path."""
    if isinstance(carry, KernelCarry):
        return Pending(carry.streams, carry.coef, branch)
    kept, beta = carry
    return reference_depth(kept, beta, branch)


def stream_sum(state: State) -> Tensor:
    """``sum_i H_i`` (Algorithm 1's output, and the recorded states): a pending state is summed without being
    written, ``sum_i H'_i = sum_j (sum_i A[j, i]) H_j + (sum_i b_i) y``, one kernel pass."""
    if not isinstance(state, Pending):
        return state.sum(0)
    if not use_triton(state.streams, covered=covers(state.streams, state.branch), kernel=KERNEL):
        return _reference_pending(state).sum(0)
    n, d = state.streams.shape[0], state.streams.shape[-1]
    ones = state.coef.new_ones(1, 1, 1).expand(state.coef.shape[0], n, n + 2)
    _, total = hc_mix(state.streams.reshape(n, -1, d), state.branch.reshape(-1, d), state.coef, ones, False)
    return total.view(state.branch.shape)


def _kernel_args(state: State) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], int]:
    """The kernels' ``(streams (n, positions, d), branch (positions, d) or None, carry or None, positions)``."""
    streams, branch, carry = (state.streams, state.branch, state.coef) if isinstance(state, Pending) else \
        (state, None, None)
    n, d = streams.shape[0], streams.shape[-1]
    flat = streams.reshape(n, -1, d)
    return flat, branch.reshape(-1, d) if branch is not None else None, carry, flat.shape[1]


def _kernel_mix(state: State, coef: Tensor) -> tuple[Tensor, KernelCarry]:
    """The kernel path's width connection with given coefficients, the pending depth connection of the previous
    sublayer (if any) in the same pass."""
    streams = state.streams if isinstance(state, Pending) else state
    flat, branch, carry, positions = _kernel_args(state)
    n = flat.shape[0]
    coef = coef.reshape(positions, n, n + 2) if coef.dim() > 2 else coef.expand(positions, n, n + 2)
    mixed, h0 = hc_mix(flat, branch, carry, coef, True)
    return h0.view(streams.shape[1:]), KernelCarry(mixed.view(streams.shape) if branch is not None else streams, coef)


def _kernel_dynamic(state: State, params: HCParams) -> tuple[Tensor, KernelCarry]:
    """The kernel path's dynamic width connection (the coefficients computed in the kernel), the pending depth
    connection of the previous sublayer (if any) in the same pass."""
    streams = state.streams if isinstance(state, Pending) else state
    flat, branch, carry, _ = _kernel_args(state)
    mixed, h0, coef = hc_dynamic(flat, branch, carry, params.static_alpha, params.static_beta, params.weight,
                                 params.norm_weight, params.norm_bias, params.alpha_scale, params.beta_scale,
                                 params.eps)
    return h0.view(streams.shape[1:]), KernelCarry(mixed.view(streams.shape) if branch is not None else streams, coef)
