"""Triton kernels of the hyper-connection mixes (imported only when one runs; the interface and the reference they
must equal are in ``hyper_connections.py``, their costs and machine-code audit in docs/methods/hyper_connections.md).

One forward and one backward kernel, specialised by compile-time flags: ``HAS_DEPTH`` (a pending depth connection
``Z_i = sum_j A[j, i] H_j + b_i y`` first), ``KEEP_MIXED`` (``Z`` written), ``HAS_WIDTH`` (``h0 = sum_j a_j Z_j``
written), ``DYNAMIC`` (the coefficients from ``Z`` by Eq. 10-13, written).

Every tensor is 4-d, ``(slot, stream, position, channel)``, four channels a thread, so all share one register
layout and nothing moves between threads but the reductions over channels (the barriers). Persistent grid, one
wave: as many programs as a multiprocessor holds (learnt from the compiled kernel's registers). A program takes
``BP`` positions at a time, each on its own warps: one, or two for DHC's backward (its barriers are its reductions).
DHC's ``n + 2`` projection columns are a loop (the backward's not unrolled: registers); the stream norm's affine map is
folded into the projection (``(xhat g + bln) . W_c = xhat . g W_c + bln . W_c``, the two sums once a program) and
its backward's two means need no reduction (``g W_c`` is centred; ``dxhat . xhat = sum_c dproj_c u_c``). Small
per-position records (coefficients and their gradients) are laid along the channels and stored by the threads that
hold them (in their own layout they would cross shared memory, two barriers each).

The backward recomputes ``Z`` from ``H`` and ``y`` and the coefficients from ``Z``; its sums over positions are per
program (and per-position records) then summed by the caller, never atomic: the result does not depend on
scheduling. Only long-standing ``tl`` operations (``load``/``store``/``arange``/``sum(keep_dims)``/``where``/
``exp``/``sqrt``/``debug_barrier``, ``static_range``, ``range``), none newer than Triton 3.0; the suite runs them
under ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .tiles import hc_tile_shape

# Programs a multiprocessor holds at once, by kernel (backward?) and DYNAMIC: as Triton 3.9 compiles them for sm_90
# (bench_kernels.py --resources; docs/methods/hyper_connections.md), the grid until a launch's compiled kernel
# gives its registers on this device (_RESIDENT). A persistent grid of that many per multiprocessor runs in one wave.
_RESIDENT_SM90 = {(False, False): 5, (False, True): 2, (True, False): 4, (True, True): 1}
_RESIDENT: dict[tuple, int] = {}
_INTERPRETER_PROGRAMS = 3  # on the CPU: a few, so the tests walk the strided position loop with a ragged end
_REGISTERS_PER_SM = 65536  # every NVIDIA GPU since Volta


def _programs(positions: int, device: torch.device, per_sm: int) -> int:
    if device.type == "cuda":
        return max(1, min(positions, per_sm * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(positions, _INTERPRETER_PROGRAMS))


def _grid(backward: bool, meta: dict, positions: int, device: torch.device) -> tuple[tuple, int]:
    """``(key, programs)``: the persistent grid of a launch with these compile-time arguments, one program per
    block of ``BP`` positions where there are fewer than the multiprocessors hold."""
    key = (backward, device.index, *sorted(meta.items()))
    per_sm = _RESIDENT.get(key, _RESIDENT_SM90[backward, meta["DYNAMIC"]])
    return key, _programs(triton.cdiv(positions, meta["BP"]), device, per_sm)


def _learn(key: tuple, compiled: object, warps: int, device: torch.device) -> None:
    """After a launch on a GPU: how many programs of it a multiprocessor holds (its compiled registers per thread,
    allocated per warp in units of 256; the threads a multiprocessor runs), for the next grid."""
    if device.type == "cuda" and key not in _RESIDENT and hasattr(compiled, "n_regs"):
        per_warp = -(-compiled.n_regs * 32 // 256) * 256
        threads = torch.cuda.get_device_properties(device).max_threads_per_multi_processor
        _RESIDENT[key] = max(1, min(_REGISTERS_PER_SM // (per_warp * warps), threads // (32 * warps)))


def _meta(n: int, d: int, bp: int, **flags: bool) -> dict:
    """A launch's compile-time arguments: the tiles (``NP`` streams, ``NK`` coefficient columns, ``BLOCK_D``
    channels, each a power of two; ``BP`` positions a program takes at a time, each on its own warps), the flags,
    and the warps: four channels a thread, so 32-bit and 16-bit tensors get one register layout and no tensor
    moves between threads (at most 16)."""
    np_, nk, block_d = hc_tile_shape(n, d)
    return dict(N=n, NP=np_, NK=nk, BLOCK_D=block_d, BP=bp, **flags,
                num_warps=max(1, min(16, bp * block_d // 128)))


def _strides(t: Optional[Tensor], dims: int) -> tuple[int, ...]:
    return tuple(t.stride()) if t is not None else (0,) * dims


@triton.jit
def _tanh(x):
    """tanh through exp (no libdevice call, so every Triton version has it): exactly 0 at 0, saturating to +-1."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _axes(NK: tl.constexpr, NP: tl.constexpr, BP: tl.constexpr, BLOCK_D: tl.constexpr):
    """The index vectors of the four axes, each a 4-d tensor: ``slots`` ``(NK,1,1,1)``, ``rows`` (streams)
    ``(1,NP,1,1)``, ``block`` (positions) ``(1,1,BP,1)``, ``ds`` ``(1,1,1,BLOCK_D)``."""
    slots = tl.arange(0, NK)[:, None, None, None]
    rows = tl.arange(0, NP)[None, :, None, None]
    block = tl.arange(0, BP)[None, None, :, None]
    ds = tl.arange(0, BLOCK_D)[None, None, None, :]
    return slots, rows, block, ds


@triton.jit
def _flat(values, offsets, valid, ds):
    """A position's small record (``values`` at ``offsets``, where ``valid``) laid along the channel axis,
    ``(1, 1, BP, BLOCK_D)``: stored so by the threads that hold those channels, with no exchange between threads
    (storing ``values`` in their own layout would go through shared memory, two barriers each)."""
    hit = tl.where((ds == offsets) & valid, values, 0.0)
    return tl.sum(tl.sum(hit, axis=1, keep_dims=True), axis=0, keep_dims=True)


@triton.jit
def _mixed(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, pos, rows, ds, vmask, cmask,
           N: tl.constexpr, NP: tl.constexpr, BP: tl.constexpr, BLOCK_D: tl.constexpr):
    """A pending depth connection at positions ``pos``: ``(Z, b)``, ``Z_i = sum_j A[j, i] H_j + b_i y``
    ``(1, NP, BP, BLOCK_D)``, one source j at a time."""
    y = tl.load(branch + (pos * s_bp + ds * s_bd), mask=vmask, other=0.0).to(tl.float32)
    b = tl.load(carry + (pos * s_cp + rows * (N + 2) + N + 1), mask=cmask, other=0.0).to(tl.float32)
    z = b * y
    for j in range(N):
        h = tl.load(streams + (j * s_sn + pos * s_sp + ds * s_sd), mask=vmask, other=0.0).to(tl.float32)
        a = tl.load(carry + (pos * s_cp + j * (N + 2) + 1 + rows), mask=cmask, other=0.0).to(tl.float32)
        z += a * h
    return z, b


@triton.jit
def _dynamic_constants(weight, norm_weight, norm_bias, constants, slots, block, ds, dmask, D, N: tl.constexpr,
                       HAS_NORM_BIAS: tl.constexpr):
    """What DHC's projection (Eq. 10-13) uses at every position, once a program, for each column c: ``g . W_c`` and
    ``bln . W_c`` (the norm's affine map folded into the projection: ``(xhat g + bln) . W_c = xhat . g W_c +
    bln . W_c``), written to the program's ``constants`` (``(2, n+2)``) and read back a column at a time: held in
    registers across the position loop they would be spilled. Every channel vector gets the position axis
    (``lanes``, zeros ``(1,1,BP,1)``) so that it shares the tiles' register layout."""
    lanes = block * 0
    w = tl.load(weight + (slots * D + ds + lanes), mask=(slots < N + 2) & dmask, other=0.0).to(tl.float32)
    gw_sum = tl.sum(tl.load(norm_weight + (ds + lanes), mask=dmask, other=0.0).to(tl.float32) * w, axis=3,
                    keep_dims=True)
    if HAS_NORM_BIAS:
        bw = tl.sum(tl.load(norm_bias + (ds + lanes), mask=dmask, other=0.0).to(tl.float32) * w, axis=3,
                    keep_dims=True)
    else:
        bw = gw_sum * 0.0
    first = (block == 0) & (slots < N + 2)
    tl.store(constants + (slots + lanes), gw_sum, mask=first)
    tl.store(constants + (N + 2 + slots + lanes), bw, mask=first)
    tl.debug_barrier()  # the program's threads read what others wrote (once, before the position loop)


@triton.jit
def _normalised(z, tile, D, eps):
    """Eq. 10's LayerNorm of each stream before its affine map: ``(xhat, rstd)``, ``xhat`` zero where masked (two
    passes, as ``F.layer_norm``: the mean, then the variance about it)."""
    mean = tl.sum(z, axis=3, keep_dims=True) / D
    diff = tl.where(tile, z - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=3, keep_dims=True) / D + eps)
    return diff * rstd, rstd


@triton.jit
def _projection(xhat, norm_weight, weight, constants, lanes, ds, dmask, c, D, N: tl.constexpr):
    """Column ``c`` of Eq. 10-13's ``tanh(LN(Z) W)``: ``(u, t, gw)`` with ``gw = g W_c`` (``W`` read from the cache
    at each position, not held: registers), ``u = xhat . gw`` and ``t = tanh(u + bln . W_c)`` ``(1, NP, BP, 1)``."""
    g = tl.load(norm_weight + (ds + lanes), mask=dmask, other=0.0).to(tl.float32)
    gw = g * tl.load(weight + (c * D + ds + lanes), mask=dmask, other=0.0).to(tl.float32)
    u = tl.sum(xhat * gw, axis=3, keep_dims=True)
    return u, _tanh(u + tl.load(constants + N + 2 + c)), gw


@triton.jit
def _column_backward(xhat, norm_weight, weight, constants, lanes, ds, dmask, dcoef_out, s_op, dcoef, pos, pmask, rows,
                     cmask, extra, scale, dxhat, mean_dxhat_xhat, m_low, m_high, c, D, N: tl.constexpr,
                     M1: tl.constexpr, M2: tl.constexpr, HAS_DCOEF_OUT: tl.constexpr):
    """Column ``c``'s part of DHC's backward (``coefficient_c = static_c + scale t_c``): its gradient (``extra`` plus
    the next sublayer's, ``dcoef_out``) through tanh and the projection. Written to ``dcoef``'s record (rows ``< n``:
    the gradient, the static part's; row ``n``: its sum against ``t``, the scale's; row ``n + 1``: the projection's,
    the norm bias's; each summed over positions by the caller). Accumulates, and returns with ``t``: ``dxhat = g
    sum_c dproj_c W_c`` less its mean over the channels (``g W_c`` less the mean of ``g . W_c``) and its mean against
    xhat (``sum_c dproj_c u_c / D``), LN's backward without a reduction; ``M_c = sum_{p, j} dproj[p, j, c] xhat[p,
    j]`` for columns ``< M1`` and the rest (``m_low``, ``m_high``: two powers of two, not one, for registers)."""
    u, t, gw = _projection(xhat, norm_weight, weight, constants, lanes, ds, dmask, c, D, N)
    dcoefficient = extra
    if HAS_DCOEF_OUT:
        dcoefficient += tl.load(dcoef_out + (pos * s_op + rows * (N + 2) + c), mask=cmask, other=0.0).to(tl.float32)
    dproj = dcoefficient * scale * (1.0 - t * t)
    column = pmask & (ds % (N + 2) == c)  # the record's column c, laid along the channels (_flat)
    tl.store(dcoef + (pos * ((N + 2) * (N + 2)) + ds), _flat(dcoefficient, rows * (N + 2) + c, cmask, ds),
             mask=column & (ds < N * (N + 2)))
    sums = tl.where(ds == c, tl.sum(dcoefficient * t, axis=1, keep_dims=True), tl.sum(dproj, axis=1, keep_dims=True))
    tl.store(dcoef + (pos * ((N + 2) * (N + 2)) + N * (N + 2) + ds), sums, mask=column & (ds < 2 * (N + 2)))
    m = tl.sum(dproj * xhat, axis=1, keep_dims=True)
    m_low += (tl.arange(0, M1)[:, None, None, None] == c).to(tl.float32) * m
    m_high += (tl.arange(0, M2)[:, None, None, None] == c - M1).to(tl.float32) * m
    dxhat += dproj * tl.where(dmask, gw - tl.load(constants + c) / D, 0.0)
    mean_dxhat_xhat += dproj * u
    return t, dxhat, mean_dxhat_xhat, m_low, m_high


@triton.jit
def _source_backward(streams, s_sn, s_sp, s_sd, carry, s_cp, dstreams, dz, pos, rows, ds, vmask, cmask, j, P, D,
                     N: tl.constexpr):
    """Source stream j's part of the depth connection's backward (``Z_i = sum_j A[j, i] H_j + ...``): writes its
    gradient ``sum_i A[j, i] dZ_i`` and returns its coefficients' gradients ``H_j . dZ_i`` as a record (_flat); ``H``
    and ``A`` read again (registers)."""
    h = tl.load(streams + (j * s_sn + pos * s_sp + ds * s_sd), mask=vmask, other=0.0).to(tl.float32)
    a = tl.load(carry + (pos * s_cp + j * (N + 2) + 1 + rows), mask=cmask, other=0.0).to(tl.float32)
    tl.store(dstreams + (j * (P * D) + pos * D + ds), tl.sum(a * dz, axis=1, keep_dims=True)
             .to(dstreams.dtype.element_ty), mask=vmask)
    return _flat(tl.sum(h * dz, axis=3, keep_dims=True), j * (N + 2) + 1 + rows, cmask, ds)


@triton.jit
def _static(static_alpha, static_beta, rows, cmask, c, N: tl.constexpr):
    """Column ``c`` of the static coefficients ``[A_m | A_r | B]`` ``(1, NP, 1, 1)``."""
    alpha = tl.load(static_alpha + (rows * (N + 1) + c), mask=cmask & (c <= N), other=0.0)
    beta = tl.load(static_beta + rows, mask=cmask & (c == N + 1), other=0.0)
    return alpha.to(tl.float32) + beta.to(tl.float32)


@triton.jit
def _forward_kernel(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp,
                    coef, s_kp, static_alpha, static_beta, weight,
                    norm_weight, norm_bias, alpha_scale, beta_scale, eps, constants,
                    mixed, h0, coef_out, P, D,
                    N: tl.constexpr, NP: tl.constexpr, NK: tl.constexpr, BLOCK_D: tl.constexpr, BP: tl.constexpr,
                    HAS_DEPTH: tl.constexpr, KEEP_MIXED: tl.constexpr, HAS_WIDTH: tl.constexpr,
                    DYNAMIC: tl.constexpr, HAS_NORM_BIAS: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    slots, rows, block, ds = _axes(NK, NP, BP, BLOCK_D)
    rmask = rows < N
    dmask = ds < D
    if DYNAMIC:
        lanes = block * 0
        constants += pid * (2 * (N + 2))
        _dynamic_constants(weight, norm_weight, norm_bias, constants, slots, block, ds, dmask, D, N, HAS_NORM_BIAS)
        s_alpha = tl.load(alpha_scale).to(tl.float32)
        s_beta = tl.load(beta_scale).to(tl.float32)
    for start in range(pid * BP, P, programs * BP):
        pos = start + block
        pmask = pos < P
        tile = pmask & rmask & dmask
        if HAS_DEPTH:
            z, _ = _mixed(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, pos, rows, ds, pmask & dmask,
                          pmask & rmask, N, NP, BP, BLOCK_D)
            if KEEP_MIXED:
                tl.store(mixed + (rows * (P * D) + pos * D + ds), z.to(mixed.dtype.element_ty), mask=tile)
        else:
            z = tl.load(streams + (rows * s_sn + pos * s_sp + ds * s_sd), mask=tile, other=0.0).to(tl.float32)
        if DYNAMIC:  # coefficients = static + scale * t, one column at a time, written as one record
            xhat, rstd = _normalised(z, tile, D, eps)
            record = tl.zeros([1, 1, BP, BLOCK_D], dtype=tl.float32)
            a = tl.zeros([1, NP, BP, 1], dtype=tl.float32)
            for c in tl.static_range(N + 2):  # unrolled: registers to spare here (not in the backward)
                u, t, gw = _projection(xhat, norm_weight, weight, constants, lanes, ds, dmask, c, D, N)
                coefficient = (_static(static_alpha, static_beta, rows, rmask, c, N)
                               + tl.where(c <= N, s_alpha, s_beta) * t)
                record += _flat(coefficient, rows * (N + 2) + c, rmask, ds)
                a = tl.where(c == 0, coefficient, a)
            tl.store(coef_out + (pos * (N * (N + 2)) + ds), record, mask=pmask & (ds < N * (N + 2)))
        elif HAS_WIDTH:
            a = tl.load(coef + (pos * s_kp + rows * (N + 2)), mask=pmask & rmask, other=0.0).to(tl.float32)
        if HAS_WIDTH:
            tl.store(h0 + (pos * D + ds), tl.sum(a * z, axis=1, keep_dims=True).to(h0.dtype.element_ty),
                     mask=pmask & dmask)


@triton.jit
def _backward_kernel(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp,
                     coef, s_kp, static_alpha, static_beta, weight,
                     norm_weight, norm_bias, alpha_scale, beta_scale, eps, constants,
                     dmixed, s_mn, s_mp, s_md, dh0, s_hp, s_hd, dcoef_out, s_op,
                     dstreams, dbranch, dcarry, dcoef, part, P, D,
                     N: tl.constexpr, NP: tl.constexpr, NK: tl.constexpr, BLOCK_D: tl.constexpr, BP: tl.constexpr,
                     M1: tl.constexpr, M2: tl.constexpr, HAS_DEPTH: tl.constexpr, HAS_WIDTH: tl.constexpr,
                     DYNAMIC: tl.constexpr, HAS_NORM_BIAS: tl.constexpr, HAS_DMIXED: tl.constexpr,
                     HAS_DCOEF_OUT: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    slots, rows, block, ds = _axes(NK, NP, BP, BLOCK_D)
    rmask = rows < N
    dmask = ds < D
    if DYNAMIC:
        lanes = block * 0
        constants += pid * (2 * (N + 2))
        _dynamic_constants(weight, norm_weight, norm_bias, constants, slots, block, ds, dmask, D, N, HAS_NORM_BIAS)
        s_alpha = tl.load(alpha_scale).to(tl.float32)
        s_beta = tl.load(beta_scale).to(tl.float32)
        # M_c = sum_{p, j} dproj[p, j, c] xhat[p, j] per position lane (the caller adds the lanes and programs)
        m_low = tl.zeros([M1, 1, BP, BLOCK_D], dtype=tl.float32)
        m_high = tl.zeros([M2, 1, BP, BLOCK_D], dtype=tl.float32)
    for start in range(pid * BP, P, programs * BP):
        pos = start + block
        pmask = pos < P
        vmask = pmask & dmask
        tile = pmask & rmask & dmask
        if HAS_DEPTH:
            z, b = _mixed(streams, s_sn, s_sp, s_sd, branch, s_bp, s_bd, carry, s_cp, pos, rows, ds, vmask,
                          pmask & rmask, N, NP, BP, BLOCK_D)
        else:
            z = tl.load(streams + (rows * s_sn + pos * s_sp + ds * s_sd), mask=tile, other=0.0).to(tl.float32)
        if HAS_WIDTH:  # h0 = sum_j a_j Z_j
            dh = tl.load(dh0 + (pos * s_hp + ds * s_hd), mask=vmask, other=0.0).to(tl.float32)
            da = tl.sum(z * dh, axis=3, keep_dims=True)
        if DYNAMIC:  # coefficients = static + scale * t, t = tanh(LN(Z) W), one column at a time
            xhat, rstd = _normalised(z, tile, D, eps)
            dxhat = tl.zeros([1, NP, BP, BLOCK_D], dtype=tl.float32)
            mean_dxhat_xhat = tl.zeros([1, NP, BP, 1], dtype=tl.float32)
            # column 0, a: its gradient gets da, and h0's gradient a dh joins dZ (through dxhat, scaled by rstd below)
            t, dxhat, mean_dxhat_xhat, m_low, m_high = _column_backward(
                xhat, norm_weight, weight, constants, lanes, ds, dmask, dcoef_out, s_op, dcoef, pos, pmask, rows,
                pmask & rmask, da, s_alpha, dxhat, mean_dxhat_xhat, m_low, m_high, 0, D, N, M1, M2, HAS_DCOEF_OUT)
            dxhat += (_static(static_alpha, static_beta, rows, pmask & rmask, 0, N) + s_alpha * t) * dh / rstd
            for c in range(1, N + 2):  # a loop, not unrolled: one column's values live at a time
                t, dxhat, mean_dxhat_xhat, m_low, m_high = _column_backward(
                    xhat, norm_weight, weight, constants, lanes, ds, dmask, dcoef_out, s_op, dcoef, pos, pmask, rows,
                    pmask & rmask, tl.zeros_like(da), tl.where(c <= N, s_alpha, s_beta), dxhat, mean_dxhat_xhat,
                    m_low, m_high, c, D, N, M1, M2, HAS_DCOEF_OUT)
            dz = tl.where(tile, rstd * (dxhat - xhat * (mean_dxhat_xhat / D)), 0.0)
        elif HAS_WIDTH:
            dz = tl.load(coef + (pos * s_kp + rows * (N + 2)), mask=pmask & rmask, other=0.0).to(tl.float32) * dh
            tl.store(dcoef + (pos * (N * (N + 2)) + ds), _flat(da, rows * (N + 2), rmask, ds)
                     .to(dcoef.dtype.element_ty), mask=pmask & (ds < N * (N + 2)))
        else:
            dz = tl.zeros([1, NP, BP, BLOCK_D], dtype=tl.float32)
        if HAS_DMIXED:
            dz += tl.load(dmixed + (rows * s_mn + pos * s_mp + ds * s_md), mask=tile, other=0.0).to(tl.float32)
        if HAS_DEPTH:  # Z_i = sum_j A[j, i] H_j + b_i y (y read again: registers)
            y = tl.load(branch + (pos * s_bp + ds * s_bd), mask=vmask, other=0.0).to(tl.float32)
            tl.store(dbranch + (pos * D + ds), tl.sum(b * dz, axis=1, keep_dims=True).to(dbranch.dtype.element_ty),
                     mask=vmask)
            record = _flat(tl.sum(y * dz, axis=3, keep_dims=True), rows * (N + 2) + N + 1, rmask, ds)  # b_i's
            if DYNAMIC:  # a loop, not unrolled: registers
                for j in range(N):
                    record += _source_backward(streams, s_sn, s_sp, s_sd, carry, s_cp, dstreams, dz, pos, rows, ds,
                                               vmask, pmask & rmask, j, P, D, N)
            else:
                for j in tl.static_range(N):
                    record += _source_backward(streams, s_sn, s_sp, s_sd, carry, s_cp, dstreams, dz, pos, rows, ds,
                                               vmask, pmask & rmask, j, P, D, N)
            tl.store(dcarry + (pos * (N * (N + 2)) + ds), record.to(dcarry.dtype.element_ty),
                     mask=pmask & (ds < N * (N + 2)))
        else:
            tl.store(dstreams + (rows * (P * D) + pos * D + ds), dz.to(dstreams.dtype.element_ty), mask=tile)
    if DYNAMIC:
        offsets = pid * ((M1 + M2) * BP * BLOCK_D) + block * BLOCK_D + ds
        tl.store(part + (offsets + tl.arange(0, M1)[:, None, None, None] * (BP * BLOCK_D)), m_low)
        tl.store(part + (offsets + (M1 + tl.arange(0, M2)[:, None, None, None]) * (BP * BLOCK_D)), m_high)


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

    def args(self, dummy: Tensor, programs: int) -> tuple:
        """The kernels' arguments for these parameters (``dummy`` for a missing bias), each contiguous, ``W``
        transposed (``(n+2, d)``: the kernels read ``W_c`` along the channels as they read a stream; a strided read
        would get its own register layout, and an exchange between threads), and each program's room for its
        constants."""
        bias = self.norm_bias.contiguous() if self.norm_bias is not None else dummy
        constants = dummy.new_empty((programs, 2 * (self.static_beta.shape[0] + 2)), dtype=torch.float32)
        return (self.static_alpha.contiguous(), self.static_beta.contiguous(), self.weight.t().contiguous(),
                self.norm_weight.contiguous(), bias, self.alpha_scale, self.beta_scale, self.eps, constants)


def _no_dynamic(dummy: Tensor) -> tuple:
    return (dummy, dummy, dummy, dummy, dummy, dummy, dummy, 0.0, dummy)


def _records(t: Optional[Tensor], n: int) -> tuple[Optional[Tensor], int]:
    """A ``(positions, n, n+2)`` coefficient tensor as the kernels read it, each position's record contiguous (the
    static coefficients come expanded over the positions, stride 0), and its position stride."""
    if t is None:
        return None, 0
    if t.stride()[1:] != (n + 2, 1):
        t = t.contiguous()
    return t, t.stride(0)


def forward(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
            dynamic: Optional[DynamicParams], keep_mixed: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(mixed, h0, coef_out)`` (empty where not computed); see ``hyper_connections.py`` for the shapes. One
    position a program at a time (the registers leave room for several programs a multiprocessor instead)."""
    n, positions, d = streams.shape
    has_depth, has_width = branch is not None, coef is not None or dynamic is not None
    meta = _meta(n, d, 1, HAS_DEPTH=has_depth, KEEP_MIXED=has_depth and keep_mixed, HAS_WIDTH=has_width,
                 DYNAMIC=dynamic is not None, HAS_NORM_BIAS=dynamic is not None and dynamic.norm_bias is not None)
    key, programs = _grid(False, meta, positions, streams.device)
    # Outputs not computed are empty (a custom op returns tensors, never None, and none aliasing another); the
    # stack state keeps the streams' dtype.
    mixed = streams.new_empty((n, positions, d) if has_depth and keep_mixed else (0,))
    h0 = streams.new_empty((positions, d) if has_width else (0,))
    coef_out = streams.new_empty((positions, n, n + 2) if dynamic is not None else (0,), dtype=torch.float32)
    (carry, s_carry), (coef, s_coef) = _records(carry, n), _records(coef, n)
    compiled = _forward_kernel[(programs,)](
        streams, *streams.stride(), branch if has_depth else streams, *_strides(branch, 2),
        carry if has_depth else streams, s_carry, coef if coef is not None else streams, s_coef,
        *(dynamic.args(streams, programs) if dynamic is not None else _no_dynamic(streams)),
        mixed if mixed.numel() else streams, h0 if has_width else streams, coef_out if coef_out.numel() else streams,
        positions, d, **meta)
    _learn(key, compiled, meta["num_warps"], streams.device)
    return mixed, h0, coef_out


def backward(streams: Tensor, branch: Optional[Tensor], carry: Optional[Tensor], coef: Optional[Tensor],
             dynamic: Optional[DynamicParams], dmixed: Optional[Tensor], dh0: Optional[Tensor],
             dcoef_out: Optional[Tensor]
             ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[tuple[Tensor, ...]]]:
    """The gradients of :func:`forward`'s inputs from those of its outputs (None: an output nobody used):
    ``(dstreams, dbranch, dcarry, dcoef, dynamic_grads)``, with ``dcarry``/``dcoef`` per position (column 0 of
    ``dcarry``, and all but column 0 of ``dcoef``, zero: those columns are another sublayer's) and
    ``dynamic_grads`` = (static_alpha, static_beta, weight, norm_weight, norm_bias or None, alpha_scale,
    beta_scale). DHC's takes two positions a program at a time (on 16 warps, up to 1,024 channels): its reductions
    are most of its barriers, and its registers allow one program a multiprocessor either way."""
    n, positions, d = streams.shape
    has_depth, is_dynamic = branch is not None, dynamic is not None
    if is_dynamic and dh0 is None:  # h0 unused: its gradient is zero, but dynamic coefficients still get theirs
        dh0 = streams.new_zeros((positions, d))
    has_width = dh0 is not None and (coef is not None or is_dynamic)
    m1 = 1 << ((n + 2).bit_length() - 1)  # the projection's n + 2 columns as two powers of two (_column_backward)
    m2 = 1 << max(0, (n + 2 - m1 - 1).bit_length())
    meta = _meta(n, d, 2 if is_dynamic and d <= 1024 else 1, M1=m1, M2=m2, HAS_DEPTH=has_depth,
                 HAS_WIDTH=has_width, DYNAMIC=is_dynamic, HAS_NORM_BIAS=is_dynamic and dynamic.norm_bias is not None,
                 HAS_DMIXED=dmixed is not None, HAS_DCOEF_OUT=dcoef_out is not None)
    key, programs = _grid(True, meta, positions, streams.device)
    dstreams = torch.empty((n, positions, d), dtype=streams.dtype, device=streams.device)
    dbranch = torch.empty_like(branch, memory_format=torch.contiguous_format) if has_depth else None
    # (positions, n, n+2) records the kernel writes whole (the pending coefficients' gradient; the given or, for
    # DHC, the static coefficients' per position), zero where nothing writes them
    dcarry = torch.empty((positions, n, n + 2), dtype=carry.dtype, device=streams.device) if has_depth else None
    dcoef = None
    if coef is not None:
        dcoef = (torch.empty if has_width else torch.zeros)((positions, n, n + 2), dtype=coef.dtype,
                                                             device=streams.device)
    elif is_dynamic:  # the coefficients' gradient per position, with two rows more (_column_backward)
        dcoef = streams.new_empty((positions, n + 2, n + 2), dtype=torch.float32)
    part = streams.new_empty((programs, m1 + m2, meta["BP"], meta["BLOCK_D"]) if is_dynamic else (0,),
                             dtype=torch.float32)
    dummy = streams
    (carry, s_carry), (coef, s_coef), (dcoef_out, s_dcoef) = (_records(t, n) for t in (carry, coef, dcoef_out))
    compiled = _backward_kernel[(programs,)](
        streams, *streams.stride(), branch if has_depth else dummy, *_strides(branch, 2),
        carry if has_depth else dummy, s_carry, coef if coef is not None else dummy, s_coef,
        *(dynamic.args(dummy, programs) if is_dynamic else _no_dynamic(dummy)),
        dmixed if dmixed is not None else dummy, *_strides(dmixed, 3), dh0 if has_width else dummy,
        *_strides(dh0 if has_width else None, 2), dcoef_out if dcoef_out is not None else dummy, s_dcoef,
        dstreams, dbranch if has_depth else dummy, dcarry if has_depth else dummy,
        dcoef if dcoef is not None else dummy, part if part.numel() else dummy, positions, d, **meta)
    _learn(key, compiled, meta["num_warps"], streams.device)
    if not is_dynamic:
        return dstreams, dbranch, dcarry, dcoef, None
    return dstreams, dbranch, dcarry, None, _dynamic_grads(dynamic, n, d, dcoef, part)


def _dynamic_grads(dynamic: DynamicParams, n: int, d: int, dcoef: Tensor, part: Tensor) -> tuple[Tensor, ...]:
    """The parameters' gradients from the per-position coefficient gradients and the programs' partial sums. With
    ``zbar = xhat g + bln`` and ``M[c] = sum_{p,j} dproj[p, j, c] xhat[p, j]``: ``dW[:, c] = g M[c] + bln sum
    dproj[.., c]``, ``dg = sum_c W[:, c] M[c]``, ``dbln = W sum dproj``."""
    sums = dcoef.sum(0)  # rows < n: the static coefficients' gradient; n: sum dcoef t; n + 1: sum dproj
    static, t_sum, proj_sum = sums[:n], sums[n], sums[n + 1]
    m = part.sum((0, 2))[:n + 2, :d]  # (n+2, d)
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
    # Contiguous copies: several are views of one sum, and a custom op's outputs must neither alias one another
    # nor differ in layout from its fake implementation's (which torch.compile checks).
    return tuple(grad.to(param.dtype, memory_format=torch.contiguous_format, copy=True) if grad is not None else None
                 for grad, param in zip(grads, params))
