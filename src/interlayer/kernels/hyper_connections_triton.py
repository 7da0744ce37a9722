"""Triton kernels of the hyper-connection mixes (imported only when one runs; see ``hyper_connections.py`` for the
interface, the cost model and the reference path they must equal).

One forward and one backward kernel serve every case, specialised by compile-time flags:

* ``HAS_DEPTH``: the depth connection of the previous sublayer is pending (``carry`` and ``branch`` given), so the
  streams the width connection reads are first mixed, ``Z_i = b_i y + sum_j A[j, i] H_j``; without it ``Z = H``.
* ``KEEP_MIXED``: ``Z`` is written (the stack state); off when only its width mix is wanted (the stream sum at the
  end of the stack).
* ``HAS_WIDTH``: ``h0 = sum_j a[j] Z_j`` is written (off for a depth connection alone).
* ``DYNAMIC``: the coefficients are computed in the kernel from ``Z`` (Eq. 10-13: a LayerNorm per stream, the
  ``d x (n+2)`` projection, tanh, the scales, the static matrices added) and written for the next sublayer;
  otherwise they are read from ``coef``.

Each program walks positions ``pid, pid + G, ...`` (``G`` programs), holding one position's ``n`` streams as an
``(NP, BLOCK_D)`` tile in registers (``NP``: n rounded up to a power of two, rows past n masked; ``BLOCK_D``: d
rounded up, columns past d masked), so every stream element is read once from memory and every output written once.
The backward kernel recomputes ``Z`` from ``H`` and ``y`` (reading ``y``, 2 or 4 bytes an element, instead of the
n-times-wider ``Z``), and the dynamic coefficients from ``Z``; its reductions over positions (the projection's,
the stream norm's and the static matrices' gradients) are summed per program and then over programs, so nothing
is accumulated atomically and the result does not depend on scheduling.

Only long-standing ``tl`` operations are used (``load``/``store``/``arange``/``sum``/``where``/``exp``/``sqrt``,
``static_range``, ``range`` over positions), none newer than Triton 3.0; the suite runs them under
``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# Programs per streaming multiprocessor. Forward: enough in flight to saturate memory. Backward: its per-program
# partial sums of the dynamic weight's gradient ((n+2) x d fp32 each) are written and summed once per call, so
# fewer, longer programs.
_FORWARD_PROGRAMS_PER_SM = 8
_BACKWARD_PROGRAMS_PER_SM = 2
_INTERPRETER_PROGRAMS = 3  # on the CPU: a few, so the tests walk the strided position loop with a ragged end


def _warps(np_: int, block_d: int) -> int:
    """Warps to spread an ``NP x BLOCK_D`` register tile over (4 to 8)."""
    return max(4, min(8, np_ * block_d // 512))


def _programs(positions: int, device: torch.device, per_sm: int) -> int:
    if device.type == "cuda":
        return max(1, min(positions, per_sm * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(positions, _INTERPRETER_PROGRAMS))


def _strides(t: Optional[Tensor], dims: int) -> tuple[int, ...]:
    return tuple(t.stride()) if t is not None else (0,) * dims


@triton.jit
def _tanh(x):
    """tanh through exp (no libdevice call, so every Triton version has it): exactly 0 at 0, saturating to +-1."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _layout(D, N: tl.constexpr, NP: tl.constexpr, NC: tl.constexpr, BLOCK_D: tl.constexpr):
    """A position's register tiles: stream ``rows`` (``NP``), coefficient ``cols`` (``NC``), channels ``ds``
    (``BLOCK_D``), their masks and the ``(NP, BLOCK_D)`` mask of the streams."""
    rows = tl.arange(0, NP)
    cols = tl.arange(0, NC)
    ds = tl.arange(0, BLOCK_D)
    rmask = rows < N
    dmask = ds < D
    return rows, cols, ds, rmask, dmask, rmask[:, None] & dmask[None, :]


@triton.jit
def _dynamic_constants(norm_weight, norm_bias, static_alpha, s_a0, s_a1, static_beta, s_b0, alpha_scale, beta_scale,
                       rows, cols, ds, rmask, dmask, N: tl.constexpr, BLOCK_D: tl.constexpr,
                       HAS_NORM_BIAS: tl.constexpr):
    """What DHC's coefficients (Eq. 10-13) use at every position, loaded once a program: the stream norm's affine
    ``(g, b)``, the static coefficients and each coefficient column's scale (``s_alpha`` or ``s_beta``)."""
    g = tl.load(norm_weight + ds, mask=dmask, other=0.0).to(tl.float32)
    if HAS_NORM_BIAS:
        bln = tl.load(norm_bias + ds, mask=dmask, other=0.0).to(tl.float32)
    else:
        bln = tl.zeros([BLOCK_D], dtype=tl.float32)
    static = _static_tile(static_alpha, s_a0, s_a1, static_beta, s_b0, rows, cols, rmask, N)
    scale = tl.where(cols <= N, tl.load(alpha_scale).to(tl.float32), tl.load(beta_scale).to(tl.float32))
    return g, bln, static, scale


@triton.jit
def _mixed_streams(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, s_cj, s_cc, p, rows, ds, rmask,
                   dmask, N: tl.constexpr, NP: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(Z, y, b)`` at position ``p``: ``Z_i = b_i y + sum_j A[j, i] H_j`` (``(NP, BLOCK_D)``, zero where masked),
    the sublayer output ``y`` and ``b``."""
    y = tl.load(branch + p * s_bp + ds * s_bd, mask=dmask, other=0.0).to(tl.float32)
    b = tl.load(carry + p * s_cp + rows * s_cj + (N + 1) * s_cc, mask=rmask, other=0.0).to(tl.float32)
    z = b[:, None] * y[None, :]
    for j in tl.static_range(N):
        h = tl.load(streams + j * s_sn + p * s_sp + ds * s_sd, mask=dmask, other=0.0).to(tl.float32)
        a = tl.load(carry + p * s_cp + j * s_cj + (1 + rows) * s_cc, mask=rmask, other=0.0).to(tl.float32)
        z += a[:, None] * h[None, :]
    return z, y, b


@triton.jit
def _normalised(z, tile, D, eps):
    """Eq. 10's LayerNorm of each stream before its affine map: ``(xhat, rstd)``, ``xhat`` zero where masked."""
    mean = tl.sum(z, axis=1) / D
    diff = tl.where(tile, z - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / D + eps)
    return diff * rstd[:, None], rstd


@triton.jit
def _tanh_projection(zbar, weight, s_w0, s_w1, ds, dmask, cols, N: tl.constexpr, NP: tl.constexpr,
                     NC: tl.constexpr):
    """``tanh(zbar W)``, ``(NP, NC)``: column c is ``tanh(zbar . W[:, c])`` for c < n + 2, 0 beyond."""
    t = tl.zeros([NP, NC], dtype=tl.float32)
    for c in tl.static_range(N + 2):
        w = tl.load(weight + ds * s_w0 + c * s_w1, mask=dmask, other=0.0).to(tl.float32)
        t += tl.where(cols[None, :] == c, _tanh(tl.sum(zbar * w[None, :], axis=1))[:, None], 0.0)
    return t


@triton.jit
def _static_tile(static_alpha, s_a0, s_a1, static_beta, s_b0, rows, cols, rmask,
                 N: tl.constexpr):
    """``[A_m | A_r | B]`` as an ``(NP, NC)`` tile (column n + 1 is B), zero where masked."""
    alpha = tl.load(static_alpha + rows[:, None] * s_a0 + cols[None, :] * s_a1,
                    mask=rmask[:, None] & (cols[None, :] < N + 1), other=0.0).to(tl.float32)
    beta = tl.load(static_beta + rows * s_b0, mask=rmask, other=0.0).to(tl.float32)
    return alpha + tl.where(cols[None, :] == N + 1, beta[:, None], 0.0)


@triton.jit
def _forward_kernel(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, s_cj, s_cc,
                    coef, s_kp, s_kj, s_kc, static_alpha, s_a0, s_a1, static_beta, s_b0, weight, s_w0, s_w1,
                    norm_weight, norm_bias, alpha_scale, beta_scale, eps,
                    mixed, h0, coef_out, P, D,
                    N: tl.constexpr, NP: tl.constexpr, NC: tl.constexpr, BLOCK_D: tl.constexpr,
                    HAS_DEPTH: tl.constexpr, KEEP_MIXED: tl.constexpr, HAS_WIDTH: tl.constexpr,
                    DYNAMIC: tl.constexpr, HAS_NORM_BIAS: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows, cols, ds, rmask, dmask, tile = _layout(D, N, NP, NC, BLOCK_D)
    if DYNAMIC:
        g, bln, static, scale = _dynamic_constants(norm_weight, norm_bias, static_alpha, s_a0, s_a1, static_beta,
                                                   s_b0, alpha_scale, beta_scale, rows, cols, ds, rmask, dmask, N,
                                                   BLOCK_D, HAS_NORM_BIAS)
    for p in range(pid, P, programs):
        if HAS_DEPTH:
            z, y, b = _mixed_streams(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, s_cj, s_cc, p,
                                     rows, ds, rmask, dmask, N, NP, BLOCK_D)
            if KEEP_MIXED:
                tl.store(mixed + rows[:, None] * (P * D) + p * D + ds[None, :],
                         z.to(mixed.dtype.element_ty), mask=tile)
        else:
            z = tl.load(streams + rows[:, None] * s_sn + p * s_sp + ds[None, :] * s_sd, mask=tile,
                        other=0.0).to(tl.float32)
        if DYNAMIC:
            xhat, rstd = _normalised(z, tile, D, eps)
            t = _tanh_projection(xhat * g[None, :] + bln[None, :], weight, s_w0, s_w1, ds, dmask, cols, N, NP, NC)
            coefficients = static + scale[None, :] * t
            tl.store(coef_out + p * (N * (N + 2)) + rows[:, None] * (N + 2) + cols[None, :], coefficients,
                     mask=rmask[:, None] & (cols[None, :] < N + 2))
            a = tl.sum(tl.where(cols[None, :] == 0, coefficients, 0.0), axis=1)
        elif HAS_WIDTH:
            a = tl.load(coef + p * s_kp + rows * s_kj, mask=rmask, other=0.0).to(tl.float32)
        if HAS_WIDTH:
            tl.store(h0 + p * D + ds, tl.sum(a[:, None] * z, axis=0).to(h0.dtype.element_ty), mask=dmask)


@triton.jit
def _backward_kernel(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, s_cj, s_cc,
                     coef, s_kp, s_kj, s_kc, static_alpha, s_a0, s_a1, static_beta, s_b0, weight, s_w0, s_w1,
                     norm_weight, norm_bias, alpha_scale, beta_scale, eps,
                     dmixed, s_mn, s_mp, s_md, dh0, s_hp, s_hd, dcoef_out, s_op, s_oj, s_oc,
                     dstreams, dbranch, dcarry, dcoef, part_static, part_m, part_vec, P, D,
                     N: tl.constexpr, NP: tl.constexpr, NC: tl.constexpr, BLOCK_D: tl.constexpr,
                     HAS_DEPTH: tl.constexpr, HAS_WIDTH: tl.constexpr, DYNAMIC: tl.constexpr,
                     HAS_NORM_BIAS: tl.constexpr, HAS_DMIXED: tl.constexpr, HAS_DCOEF_OUT: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows, cols, ds, rmask, dmask, tile = _layout(D, N, NP, NC, BLOCK_D)
    ctile = rmask[:, None] & (cols[None, :] < N + 2)
    if DYNAMIC:
        g, bln, static, scale = _dynamic_constants(norm_weight, norm_bias, static_alpha, s_a0, s_a1, static_beta,
                                                   s_b0, alpha_scale, beta_scale, rows, cols, ds, rmask, dmask, N,
                                                   BLOCK_D, HAS_NORM_BIAS)
        acc_static = tl.zeros([NP, NC], dtype=tl.float32)  # sum over positions of dL/d(coefficients)
        acc_m = tl.zeros([NC, BLOCK_D], dtype=tl.float32)  # M[c] = sum_{p, j} dproj[j, c] xhat_j
        acc_t = tl.zeros([NC], dtype=tl.float32)  # sum_{p, j} dL/dcoef[j, c] tanh[j, c] (the scales' gradient)
        acc_proj = tl.zeros([NC], dtype=tl.float32)  # sum_{p, j} dproj[j, c]
    for p in range(pid, P, programs):
        if HAS_DEPTH:
            z, y, b = _mixed_streams(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, s_cj, s_cc, p,
                                     rows, ds, rmask, dmask, N, NP, BLOCK_D)
        else:
            z = tl.load(streams + rows[:, None] * s_sn + p * s_sp + ds[None, :] * s_sd, mask=tile,
                        other=0.0).to(tl.float32)
        if HAS_DMIXED:
            dz = tl.load(dmixed + rows[:, None] * s_mn + p * s_mp + ds[None, :] * s_md, mask=tile,
                         other=0.0).to(tl.float32)
        else:
            dz = tl.zeros([NP, BLOCK_D], dtype=tl.float32)
        if DYNAMIC:
            xhat, rstd = _normalised(z, tile, D, eps)
            t = _tanh_projection(xhat * g[None, :] + bln[None, :], weight, s_w0, s_w1, ds, dmask, cols, N, NP, NC)
            a = tl.sum(tl.where(cols[None, :] == 0, static + scale[None, :] * t, 0.0), axis=1)
            if HAS_DCOEF_OUT:
                dcoefficients = tl.load(dcoef_out + p * s_op + rows[:, None] * s_oj + cols[None, :] * s_oc,
                                        mask=ctile, other=0.0).to(tl.float32)
            else:
                dcoefficients = tl.zeros([NP, NC], dtype=tl.float32)
        elif HAS_WIDTH:
            a = tl.load(coef + p * s_kp + rows * s_kj, mask=rmask, other=0.0).to(tl.float32)
        if HAS_WIDTH:  # h0 = sum_j a_j Z_j
            dh = tl.load(dh0 + p * s_hp + ds * s_hd, mask=dmask, other=0.0).to(tl.float32)
            dz += a[:, None] * dh[None, :]
            da = tl.sum(z * dh[None, :], axis=1)
            if DYNAMIC:
                dcoefficients += tl.where(cols[None, :] == 0, da[:, None], 0.0)
            else:
                tl.store(dcoef + p * (N * (N + 2)) + rows * (N + 2), da.to(dcoef.dtype.element_ty), mask=rmask)
        if DYNAMIC:  # coefficients = static + scale * tanh(proj), proj = (xhat g + bln) W
            acc_static += dcoefficients
            acc_t += tl.sum(dcoefficients * t, axis=0)
            dproj = dcoefficients * scale[None, :] * (1.0 - t * t)
            acc_proj += tl.sum(dproj, axis=0)
            dzbar = tl.zeros([NP, BLOCK_D], dtype=tl.float32)
            for c in tl.static_range(N + 2):
                w = tl.load(weight + ds * s_w0 + c * s_w1, mask=dmask, other=0.0).to(tl.float32)
                dproj_c = tl.sum(tl.where(cols[None, :] == c, dproj, 0.0), axis=1)
                dzbar += dproj_c[:, None] * w[None, :]
                acc_m += tl.where(cols[:, None] == c, tl.sum(dproj_c[:, None] * xhat, axis=0)[None, :], 0.0)
            dxhat = dzbar * g[None, :]
            mean_dxhat = tl.sum(dxhat, axis=1) / D
            mean_dxhat_xhat = tl.sum(dxhat * xhat, axis=1) / D
            dz += tl.where(tile, rstd[:, None] * (dxhat - mean_dxhat[:, None] - xhat * mean_dxhat_xhat[:, None]),
                           0.0)
        if HAS_DEPTH:  # Z_i = b_i y + sum_j A[j, i] H_j
            tl.store(dbranch + p * D + ds, tl.sum(b[:, None] * dz, axis=0).to(dbranch.dtype.element_ty),
                     mask=dmask)
            tl.store(dcarry + p * (N * (N + 2)) + rows * (N + 2) + (N + 1),
                     tl.sum(y[None, :] * dz, axis=1).to(dcarry.dtype.element_ty), mask=rmask)
            for j in tl.static_range(N):
                h = tl.load(streams + j * s_sn + p * s_sp + ds * s_sd, mask=dmask, other=0.0).to(tl.float32)
                a_j = tl.load(carry + p * s_cp + j * s_cj + (1 + rows) * s_cc, mask=rmask, other=0.0).to(tl.float32)
                tl.store(dstreams + j * (P * D) + p * D + ds,
                         tl.sum(a_j[:, None] * dz, axis=0).to(dstreams.dtype.element_ty), mask=dmask)
                tl.store(dcarry + p * (N * (N + 2)) + j * (N + 2) + 1 + rows,
                         tl.sum(h[None, :] * dz, axis=1).to(dcarry.dtype.element_ty), mask=rmask)
        else:
            tl.store(dstreams + rows[:, None] * (P * D) + p * D + ds[None, :], dz.to(dstreams.dtype.element_ty),
                     mask=tile)
    if DYNAMIC:
        tl.store(part_static + pid * (NP * NC) + rows[:, None] * NC + cols[None, :], acc_static)
        tl.store(part_m + pid * (NC * BLOCK_D) + cols[:, None] * BLOCK_D + ds[None, :], acc_m)
        tl.store(part_vec + pid * (2 * NC) + cols, acc_t)
        tl.store(part_vec + pid * (2 * NC) + NC + cols, acc_proj)


class DynamicParams(NamedTuple):
    """The dynamic coefficients' parameters (Eq. 10-13), as tensors: ``static_alpha`` ``(n, n+1)``,
    ``static_beta`` ``(n,)``, ``weight`` ``(d, n+2)``, ``norm_weight``/``norm_bias`` ``(d,)`` (bias may be None),
    the scales (0-d) and the norm's ``eps``."""

    static_alpha: Tensor
    static_beta: Tensor
    weight: Tensor
    norm_weight: Tensor
    norm_bias: Optional[Tensor]
    alpha_scale: Tensor
    beta_scale: Tensor
    eps: float

    def args(self, dummy: Tensor) -> tuple:
        """The kernels' arguments for these parameters (``dummy`` for a missing bias; the norm's vectors are read
        with unit stride)."""
        bias = self.norm_bias.contiguous() if self.norm_bias is not None else dummy
        return (self.static_alpha, *self.static_alpha.stride(), self.static_beta, *self.static_beta.stride(),
                self.weight, *self.weight.stride(), self.norm_weight.contiguous(), bias, self.alpha_scale,
                self.beta_scale, self.eps)


def _no_dynamic(dummy: Tensor) -> tuple:
    return (dummy, 0, 0, dummy, 0, dummy, 0, 0, dummy, dummy, dummy, dummy, 0.0)


def forward(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
            dynamic: Optional[DynamicParams], keep_mixed: bool, tiles: tuple[int, int, int]
            ) -> tuple[Tensor, Tensor, Tensor]:
    """``(mixed, h0, coef_out)`` (empty where not computed); see ``hyper_connections.py`` for the shapes.
    ``tiles``: ``(NP, NC, BLOCK_D)``, the register tiles (``hyper_connections.tile_shape``)."""
    n, positions, d = streams.shape
    np_, nc, block_d = tiles
    warps = _warps(np_, block_d)
    has_depth, has_width = branch is not None, coef is not None or dynamic is not None
    dtype = torch.promote_types(streams.dtype, branch.dtype) if has_depth else streams.dtype
    # Outputs not computed are empty (a custom op returns tensors, never None, and none aliasing another).
    mixed = streams.new_empty((n, positions, d) if has_depth and keep_mixed else (0,), dtype=dtype)
    h0 = streams.new_empty((positions, d) if has_width else (0,), dtype=dtype)
    coef_out = streams.new_empty((positions, n, n + 2) if dynamic is not None else (0,), dtype=torch.float32)
    grid = (_programs(positions, streams.device, _FORWARD_PROGRAMS_PER_SM),)
    _forward_kernel[grid](
        streams, *streams.stride(), branch if has_depth else streams, *_strides(branch, 2),
        carry if has_depth else streams, *_strides(carry, 3), coef if coef is not None else streams,
        *_strides(coef, 3), *(dynamic.args(streams) if dynamic is not None else _no_dynamic(streams)),
        mixed if mixed.numel() else streams, h0 if has_width else streams, coef_out if coef_out.numel() else streams,
        positions, d, N=n, NP=np_, NC=nc, BLOCK_D=block_d, HAS_DEPTH=has_depth, KEEP_MIXED=has_depth and keep_mixed,
        HAS_WIDTH=has_width, DYNAMIC=dynamic is not None,
        HAS_NORM_BIAS=dynamic is not None and dynamic.norm_bias is not None, num_warps=warps)
    return mixed, h0, coef_out


def backward(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
             dynamic: Optional[DynamicParams], dmixed: Optional[Tensor], dh0: Optional[Tensor],
             dcoef_out: Optional[Tensor], tiles: tuple[int, int, int]
             ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[tuple[Tensor, ...]]]:
    """The gradients of :func:`forward`'s inputs from those of its outputs (None: an output nobody used):
    ``(dstreams, dbranch, dcarry, dcoef, dynamic_grads)``, with ``dcarry``/``dcoef`` per position (column 0 of
    ``dcarry``, and all but column 0 of ``dcoef``, zero: those columns are another sublayer's) and
    ``dynamic_grads`` = (static_alpha, static_beta, weight, norm_weight, norm_bias or None, alpha_scale,
    beta_scale)."""
    n, positions, d = streams.shape
    np_, nc, block_d = tiles
    warps = _warps(np_, block_d)
    has_depth, is_dynamic = branch is not None, dynamic is not None
    has_width = dh0 is not None and (coef is not None or is_dynamic)
    programs = _programs(positions, streams.device, _BACKWARD_PROGRAMS_PER_SM)
    dstreams = torch.empty((n, positions, d), dtype=streams.dtype, device=streams.device)
    dbranch = torch.empty_like(branch, memory_format=torch.contiguous_format) if has_depth else None
    dcarry = torch.zeros((positions, n, n + 2), dtype=carry.dtype, device=streams.device) if has_depth else None
    dcoef = (torch.zeros((positions, n, n + 2), dtype=coef.dtype, device=streams.device)
             if coef is not None else None)
    parts = [streams.new_empty((programs, *shape), dtype=torch.float32) if is_dynamic else streams.new_empty(0)
             for shape in ((np_, nc), (nc, block_d), (2, nc))]
    if is_dynamic and dh0 is None:  # h0 unused: its gradient is zero, but dynamic coefficients still get theirs
        dh0 = streams.new_zeros((positions, d))
        has_width = True
    dummy = streams
    _backward_kernel[(programs,)](
        streams, *streams.stride(), branch if has_depth else dummy, *_strides(branch, 2),
        carry if has_depth else dummy, *_strides(carry, 3), coef if coef is not None else dummy,
        *_strides(coef, 3), *(dynamic.args(dummy) if is_dynamic else _no_dynamic(dummy)),
        dmixed if dmixed is not None else dummy, *_strides(dmixed, 3), dh0 if has_width else dummy,
        *_strides(dh0 if has_width else None, 2), dcoef_out if dcoef_out is not None else dummy,
        *_strides(dcoef_out, 3), dstreams, dbranch if has_depth else dummy, dcarry if has_depth else dummy,
        dcoef if dcoef is not None else dummy, *[part if part.numel() else dummy for part in parts], positions, d,
        N=n, NP=np_, NC=nc, BLOCK_D=block_d, HAS_DEPTH=has_depth, HAS_WIDTH=has_width, DYNAMIC=is_dynamic,
        HAS_NORM_BIAS=is_dynamic and dynamic.norm_bias is not None, HAS_DMIXED=dmixed is not None,
        HAS_DCOEF_OUT=dcoef_out is not None, num_warps=warps)
    if not is_dynamic:
        return dstreams, dbranch, dcarry, dcoef, None
    return dstreams, dbranch, dcarry, dcoef, _dynamic_grads(dynamic, n, d, *parts)


def _dynamic_grads(dynamic: DynamicParams, n: int, d: int, part_static: Tensor, part_m: Tensor,
                   part_vec: Tensor) -> tuple[Tensor, ...]:
    """The parameters' gradients from the programs' partial sums. With ``zbar = xhat g + bln`` and
    ``M[c] = sum_{p,j} dproj[p, j, c] xhat[p, j]``: ``dW[:, c] = g M[c] + bln sum dproj[.., c]``,
    ``dg = sum_c W[:, c] M[c]``, ``dbln = W sum dproj``."""
    static = part_static.sum(0)[:n, :n + 2]
    m = part_m.sum(0)[:n + 2, :d]  # (n+2, d)
    t_sum, proj_sum = part_vec.sum(0)[:, :n + 2]
    weight = dynamic.weight.float()
    dweight = dynamic.norm_weight.float()[:, None] * m.t()
    if dynamic.norm_bias is not None:
        dweight = dweight + dynamic.norm_bias.float()[:, None] * proj_sum[None, :]
    dnorm_weight = (weight * m.t()).sum(1)
    dnorm_bias = weight @ proj_sum if dynamic.norm_bias is not None else None
    grads = (static[:, :n + 1], static[:, n + 1], dweight, dnorm_weight, dnorm_bias, t_sum[:n + 1].sum(),
             t_sum[n + 1])
    params = (dynamic.static_alpha, dynamic.static_beta, dynamic.weight, dynamic.norm_weight, dynamic.norm_bias,
              dynamic.alpha_scale, dynamic.beta_scale)
    # Contiguous copies: several are views of one partial sum, and a custom op's outputs must neither alias one
    # another nor differ in layout from its fake implementation's (which torch.compile checks).
    return tuple(grad.to(param.dtype, memory_format=torch.contiguous_format, copy=True) if grad is not None else None
                 for grad, param in zip(grads, params))
