"""Hyper-connection mixes: the reference path (today's PyTorch), the fused Triton path, and the one rule between them.

What is computed (Zhu et al., arXiv 2409.19606; notation of ``methods/hyper_connections.py``). The stack state is
``H``, n streams of width d, stacked first: ``(n, ..., d)``. Around sublayer ``T`` (attention, FFN, ...):

* width connection (Eq. 3-4, split): ``h0 = sum_j a[j] H_j`` is what ``T`` reads, ``kept_i = sum_j A[j, i] H_j``;
* depth connection (Eq. 5, combine): ``H'_i = b_i y + kept_i`` with ``y = T(h0)``;
* static (Sec. 2.1): ``[a | A | b]`` are parameters; dynamic (Eq. 10-13): per position,
  ``[a | A | b] = S + [s_alpha .. s_alpha, s_beta] * tanh(LN(H_j) W)`` row by row, ``W`` (d x (n+2)).

**The interface (shared with other multi-stream residuals such as mHC).** The kernels see one sublayer's
coefficients as a tensor ``coef`` of shape ``(positions, n, n + 2)``, row j being source stream j:
``coef[p, j, 0] = a_j`` (the width mix, mHC's ``H_pre[j]``), ``coef[p, j, 1 + i] = A[j, i]`` (stream j into
stream i, i.e. mHC's ``H_res[i, j]``), ``coef[p, j, n + 1] = b_j`` (mHC's ``H_post[j]``). Static coefficients are
the same tensor expanded over positions (stride 0), so one kernel serves both. Two operators (``torch.library``
custom ops, so ``torch.compile`` keeps each whole, with a hand-written backward):

* :func:`hc_mix` ``(streams (n, P, d), branch (P, d)?, carry (P, n, n+2)?, coef (P, n, n+2)?, keep_mixed)``
  -> ``(mixed, h0)``: with ``branch``, first the pending depth connection ``Z_i = carry[i, n+1] y +
  sum_j carry[j, 1+i] H_j`` (written as ``mixed`` when ``keep_mixed``), else ``Z = H``; then, with ``coef``,
  ``h0 = sum_j coef[j, 0] Z_j``. Any coefficients: static HC, and mHC's sigmoid/Sinkhorn ones computed outside.
* :func:`hc_dynamic`: the same with DHC's coefficients computed in the kernel from ``Z`` (Eq. 10-13) and returned
  ``(P, n, n+2)`` fp32 for the next depth connection.

**Pending state: the depth connection fused with the next width connection.** ``combine`` does not compute
``H'``: it returns a :class:`Pending` ``(H, coef, y)``; the next sublayer's ``split`` runs one kernel that reads
``H`` and ``y``, writes ``H'`` (the state the next one reads) and the next ``h0`` (and coefficients), with ``H'``
never read back. The stack's end sums a pending state without writing it. The backward kernel does the same in
reverse (the next width connection's backward, then this depth connection's) and recomputes ``H'`` from ``H`` and
``y`` instead of reading it. mHC's fused kernel (arXiv 2512.24880, Sec. 4.3) applies ``H_post`` and ``H_res`` with
the residual merge, cutting the reads per token from (3n+1)C to (n+1)C; the pending state also folds the next
width connection into that pass, so nothing reads the stream state twice.

**Cost model.** Memory-bound: the bytes each pass must move, per position and sublayer, at n = 4, d = C = 768,
fp32 streams and a bf16 sublayer output ``y``, forward + backward. Counted operator by operator, each reading its
inputs and writing its outputs once (the eager traffic), with the sublayer's own LayerNorm and the bf16 cast for its
matmul included as every residual has them; ``tests/test_kernels_hyper_connections.py`` recounts these figures.
Per step: 8 x 1,024 tokens x 24 sublayers (GPT-2 small); the time is the bytes over an H100 SXM's 3.35 TB/s:

=====================================  ==========  ==========  ====================
path                                   bytes / C   per step    at 3.35 TB/s
=====================================  ==========  ==========  ====================
plain pre-LN residual                  60          9.1 GB      2.7 ms
static HC, today's path                434         65.5 GB     19.6 ms
dynamic HC, today's path               1758        265 GB      79.2 ms
stack records, today (both)            +20         +3.0 GB     +0.9 ms
static HC, kernels                     126.8       19.1 GB     5.7 ms
dynamic HC, kernels                    126.6       19.1 GB     5.7 ms
=====================================  ==========  ==========  ====================

The kernels' share, 94C: forward ``16C`` read (``H``) + ``2C`` (``y``), ``16C`` (``H'``) + ``4C`` (``h0``)
written; backward ``16C + 4C`` read (the gradients of ``H'`` and ``h0``) + ``16C + 2C`` (``H``, ``y``),
``16C + 2C`` written (the gradients of ``H`` and ``y``); the coefficients, ``n (n+2)`` floats a position, under 1C.
The rest is the sublayer's LayerNorm (8C + 12C) and cast (6C + 6C). So HC's extra over the plain residual is 67C
eager: 10.1 GB, 3.0 ms a step. Compiled, inductor fuses the plain residual's addition, LayerNorm and cast into one
pass each way (about 12C forward, 16C backward by the same accounting, an estimate), and HC's LayerNorm with its cast
(6C + 10C), so HC's extra is about 82C: 12.4 GB, 3.7 ms a step, i.e. a bound of ``1 + 3.7 ms / T`` on the time
ratio for a compiled plain step of T ms (1.10x needs T >= 37 ms at full bandwidth). What remains is the floor of
fp32 streams: four streams read and written each way (64C) is what any implementation keeping them must move (bf16
streams would halve it by rounding the residual at every sublayer, which this library does not do). Fusing the
sublayer's LayerNorm into the kernels would save the ``h0`` round trip and the LayerNorm's own backward reads
eager (about 20C) but about 4C compiled, where inductor fuses the LayerNorm with the cast already: not done.
Dynamic HC moves the same bytes as static HC (its LayerNorm, projection and tanh run on the tile in registers): the
two differ in arithmetic only. The stack's records (the stream sums, ``states``/``mids``) are computed when read
(``core.encoder.StateViews``), no longer at every layer.

**Dispatch.** :func:`width_connection` / :func:`depth_connection` / :func:`stream_sum` take the Triton path when
:func:`interlayer.kernels.dispatch.use_triton` says so (CUDA tensors, Triton installed, ``INTERLAYER_KERNELS`` not
``reference``) and the case is covered (fp32/fp16/bf16 streams, ``n`` and ``d`` whose ``(n, d)`` register tile has
at most 8192 elements: d <= 2048 at n = 4), and today's path otherwise; ``INTERLAYER_KERNELS=triton`` makes an
uncovered case an error instead. Both paths give the same numbers up to rounding: the kernels compute in fp32 where
autocast runs the dynamic projection in bf16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import use_triton
from .precision import fp32_island

KERNEL = "hyper_connections"
MAX_TILE = 8192  # elements of one (n, d) register tile, rounded up to powers of two; beyond, registers would spill


def tile_shape(n: int, d: int) -> tuple[int, int, int]:
    """``(NP, NK, BLOCK_D)``: the kernels' register tiles, ``n`` streams, ``n + 2`` coefficient columns and ``d``
    channels, each rounded up to a power of two (``NP >= 2``, ``BLOCK_D >= 16``)."""
    def pow2(x: int) -> int:
        return 1 << max(0, (x - 1).bit_length())
    return max(2, pow2(n)), pow2(n + 2), max(16, pow2(d))


FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def covers(streams: Tensor, branch: Optional[Tensor] = None) -> bool:
    """Whether the kernels handle these streams ``(n, ..., d)`` (and a pending sublayer output ``branch``)."""
    if streams.dim() < 2 or streams.numel() == 0 or streams.dtype not in FLOATS:
        return False
    if branch is not None and branch.dtype not in FLOATS:
        return False
    n = streams.shape[0]
    np_, _, block_d = tile_shape(n, streams.shape[-1])
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
        normed = F.layer_norm(streams, streams.shape[-1:], params.norm_weight, params.norm_bias, params.eps)
        w = torch.tanh(normed @ params.weight)  # Eq. 10-13: tanh(norm(H) W), (n, ..., n+2)
        coefficients = (params.alpha_scale * w[..., :n + 1]).to(streams.dtype).movedim(-1, 1).unsqueeze(-1)
        for j in range(n):
            mixed = mixed + coefficients[j] * streams[j]
        beta = beta + (params.beta_scale * w[..., n + 1]).to(streams.dtype).unsqueeze(-1)
    return mixed[0], mixed[1:], beta


def reference_depth(kept: Tensor, beta: Tensor, branch: Tensor) -> Tensor:
    """Eq. 5: ``B^T y + H'``, the sublayer's output scaled into every stream."""
    return beta * branch + kept


def _reference_pending(state: "Pending") -> Tensor:
    """A pending depth connection written out: ``Z_i = b_i y + sum_j A[j, i] H_j`` from the packed coefficients
    (only where a kernel's pending state meets the reference path, e.g. the mode changed within a forward)."""
    n, d = state.streams.shape[0], state.streams.shape[-1]
    coef = state.coef.view(*state.streams.shape[1:-1], n, n + 2).movedim(-2, 0)  # (n, ..., n+2)
    mixed = torch.einsum("j...i,j...d->i...d", coef[..., 1:n + 1], state.streams)
    return mixed + coef[..., n + 1].unsqueeze(-1) * state.branch.reshape(1, *state.streams.shape[1:-1], d)


# ---------------------------------------------------------------------------------------------------------------
# The Triton path: two operators with hand-written backward passes.

def _grad(g: Optional[Tensor]) -> Optional[Tensor]:
    """An output's gradient, None where autograd has none (an output nobody used, or an empty placeholder)."""
    return g if g is not None and g.numel() else None


def _given(t: Optional[Tensor], grad: Tensor) -> Optional[Tensor]:
    """An input's gradient for autograd: None for an input that was None (the backward op returned a placeholder)."""
    return grad if t is not None else None


@torch.library.custom_op("interlayer::hc_mix", mutates_args=())
def hc_mix(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
           keep_mixed: bool) -> tuple[Tensor, Tensor]:
    """``(mixed, h0)`` from given coefficients (see the module docstring); an output not computed is empty."""
    from . import hyper_connections_triton as triton_kernels
    mixed, h0, _ = triton_kernels.forward(streams, branch, carry, coef, None, keep_mixed)
    return mixed, h0


@hc_mix.register_fake
def _(streams, branch, carry, coef, keep_mixed):
    n, positions, d = streams.shape
    dtype = torch.promote_types(streams.dtype, branch.dtype) if branch is not None else streams.dtype
    mixed = streams.new_empty((n, positions, d) if branch is not None and keep_mixed else (0,), dtype=dtype)
    return mixed, streams.new_empty((positions, d) if coef is not None else (0,), dtype=dtype)


@torch.library.custom_op("interlayer::hc_mix_backward", mutates_args=())
def hc_mix_backward(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
                    dmixed: Optional[Tensor], dh0: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from . import hyper_connections_triton as triton_kernels
    dstreams, dbranch, dcarry, dcoef, _ = triton_kernels.backward(streams, branch, carry, coef, None, dmixed, dh0, None)
    return tuple(g if g is not None else streams.new_empty(0) for g in (dstreams, dbranch, dcarry, dcoef))


@hc_mix_backward.register_fake
def _(streams, branch, carry, coef, dmixed, dh0):
    return tuple(t.new_empty(t.shape) if t is not None else streams.new_empty(0)
                 for t in (streams, branch, carry, coef))


def _mix_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    streams, branch, carry, coef, _ = inputs
    ctx.save_for_backward(streams, branch, carry, coef)


def _mix_backward(ctx: Any, dmixed: Optional[Tensor], dh0: Optional[Tensor]) -> tuple:
    streams, branch, carry, coef = ctx.saved_tensors
    dstreams, dbranch, dcarry, dcoef = hc_mix_backward(streams, branch, carry, coef, _grad(dmixed), _grad(dh0))
    return dstreams, _given(branch, dbranch), _given(carry, dcarry), _given(coef, dcoef), None


hc_mix.register_autograd(_mix_backward, setup_context=_mix_setup)


@torch.library.custom_op("interlayer::hc_dynamic", mutates_args=())
def hc_dynamic(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], static_alpha: Tensor,
               static_beta: Tensor, weight: Tensor, norm_weight: Tensor, norm_bias: Optional[Tensor],
               alpha_scale: Tensor, beta_scale: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(mixed, h0, coef)`` with DHC's coefficients (Eq. 10-13) computed from the (mixed) streams."""
    from . import hyper_connections_triton as triton_kernels
    dynamic = triton_kernels.DynamicParams(static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale,
                                           beta_scale, eps)
    return triton_kernels.forward(streams, branch, carry, None, dynamic, True)


@hc_dynamic.register_fake
def _(streams, branch, carry, static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale, beta_scale,
      eps):
    n, positions, d = streams.shape
    dtype = torch.promote_types(streams.dtype, branch.dtype) if branch is not None else streams.dtype
    mixed = streams.new_empty((n, positions, d) if branch is not None else (0,), dtype=dtype)
    return (mixed, streams.new_empty((positions, d), dtype=dtype),
            streams.new_empty((positions, n, n + 2), dtype=torch.float32))


@torch.library.custom_op("interlayer::hc_dynamic_backward", mutates_args=())
def hc_dynamic_backward(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], static_alpha: Tensor,
                        static_beta: Tensor, weight: Tensor, norm_weight: Tensor, norm_bias: Optional[Tensor],
                        alpha_scale: Tensor, beta_scale: Tensor, eps: float, dmixed: Optional[Tensor],
                        dh0: Optional[Tensor], dcoef: Optional[Tensor]) -> list[Tensor]:
    """The Triton backward of the dynamic hyper-connection: gradients of the streams, the branch output, the carry and
    every coefficient parameter (empty tensors for the inputs that were None, as the registered operator returns a
    list)."""
    from . import hyper_connections_triton as triton_kernels
    dynamic = triton_kernels.DynamicParams(static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale,
                                           beta_scale, eps)
    dstreams, dbranch, dcarry, _, params = triton_kernels.backward(streams, branch, carry, None, dynamic, dmixed, dh0,
                                                                   dcoef)
    return [g if g is not None else streams.new_empty(0) for g in (dstreams, dbranch, dcarry, *params)]


@hc_dynamic_backward.register_fake
def _(streams, branch, carry, static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale, beta_scale,
      eps, dmixed, dh0, dcoef):
    inputs = (streams, branch, carry, static_alpha, static_beta, weight, norm_weight, norm_bias, alpha_scale,
              beta_scale)
    return [t.new_empty(t.shape) if t is not None else streams.new_empty(0) for t in inputs]


def _dynamic_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    *tensors, eps = inputs
    ctx.save_for_backward(*tensors)
    ctx.eps = eps


def _dynamic_backward(ctx: Any, dmixed: Optional[Tensor], dh0: Optional[Tensor], dcoef: Optional[Tensor]) -> tuple:
    saved = ctx.saved_tensors
    grads = hc_dynamic_backward(*saved, ctx.eps, _grad(dmixed), _grad(dh0), _grad(dcoef))
    return (*(_given(t, g) for t, g in zip(saved, grads)), None)


hc_dynamic.register_autograd(_dynamic_backward, setup_context=_dynamic_setup)


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
        return _kernel_width(state, params)
    if isinstance(state, Pending):
        state = _reference_pending(state)
    h0, kept, beta = reference_width(state, params)
    return h0, (kept, beta)


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


def _kernel_width(state: State, params: HCParams) -> tuple[Tensor, KernelCarry]:
    """The kernel path's width connection, with the pending depth connection of the previous sublayer (if any) in
    the same pass."""
    if isinstance(state, Pending):
        streams, branch, carry = state.streams, state.branch, state.coef
    else:
        streams, branch, carry = state, None, None
    n, d = streams.shape[0], streams.shape[-1]
    flat = streams.reshape(n, -1, d)
    positions = flat.shape[1]
    flat_branch = branch.reshape(positions, d) if branch is not None else None
    if params.weight is None:
        coef = torch.cat([params.static_alpha, params.static_beta[:, None]], dim=1).expand(positions, n, n + 2)
        mixed, h0 = hc_mix(flat, flat_branch, carry, coef, True)
    else:
        mixed, h0, coef = hc_dynamic(flat, flat_branch, carry, params.static_alpha, params.static_beta,
                                     params.weight, params.norm_weight, params.norm_bias, params.alpha_scale,
                                     params.beta_scale, params.eps)
    new_streams = mixed.view(streams.shape) if branch is not None else streams
    return h0.view(streams.shape[1:]), KernelCarry(new_streams, coef)
