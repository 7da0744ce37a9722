"""Triton code of :mod:`interlayer.kernels.logits_attention`.

Forward: one program per (block of ``BM`` queries, batch x head); an online softmax over key blocks of ``BN``
(FlashAttention's recurrence, over logits read from memory instead of computed), the probabilities rounded to ``v``'s
dtype for the product; it keeps the row's log-sum-exp for the backward. Backward: one program per (block of ``BN``
keys, batch x head), looping over the query blocks that see them: ``P = exp(L - lse)``, ``dP = dO v^T``,
``dL = P (dP - delta)`` with ``delta = rowsum(dO * O)``, ``dV += P^T dO``, plus an optional incoming gradient of the
logits; blocks above a causal diagonal get a zero gradient (a matrix product reads them) and nothing else.

Only a causal diagonal's blocks (and padded maps) mask cell by cell: elsewhere a block is read with its bounds
alone, which a map whose width is a multiple of 16 keeps to whole vectors, so the loads stay 16 bytes wide.

Map epilogues (``MAPS``) turn the backward into the first half of Predictive Attention's (:mod:`.predictive_maps`):
instead of ``dM`` it writes what the map op's backward needs of it, cell by cell, in the same pass: with a CNN,
``dZ = alpha dM act'(Z) keep`` (the forward's sign bits give ``act'``) and the residual's ``(1 - alpha) dM`` (into
the layer's logits' gradient, or with Evolving Attention's ``beta`` into an fp32 buffer the CNN's backward splits);
without one (the Res-Transformer) the whole backward: the previous logits' gradient ``alpha dM keep`` and the
layer's ``(1 - alpha) dM`` (split by ``beta`` as the source's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# a finite floor for running maxima and the log-sum-exp of an empty row: exp(x - floor) never sees inf - inf
_FLOOR: tl.constexpr = tl.constexpr(-1e30)
PLAIN, CNN, NO_CNN = 0, 1, 2  # the backward's epilogue: dL; PA's dZ and dR; the Res-Transformer's dA_prev and dS


@triton.jit
def _allowed(rows, cols, pad_ptr, b, T_q, T_k, stride_pb, CAUSAL: tl.constexpr, PADDED: tl.constexpr):
    ok = (rows[:, None] < T_q) & (cols[None, :] < T_k)
    if CAUSAL:
        ok = ok & (cols[None, :] <= rows[:, None])
    if PADDED:
        pad = tl.load(pad_ptr + b * stride_pb + cols, mask=cols < T_k, other=1)
        ok = ok & (pad[None, :] == 0)
    return ok


@triton.jit
def _head(H, s_lb, s_lh, s_vb, s_vh, s_ob, s_oh):
    """This program's (batch x head) ``bh`` (grid axis 1), its batch ``b`` and the offsets of its logits, of its
    values (and their gradient) and of its output (and the output's gradient)."""
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    return bh, b, b * s_lb + h * s_lh, b * s_vb + h * s_vh, b * s_ob + h * s_oh


@triton.jit
def _online(x, m, s, acc, vt):
    """One key block of the online softmax: the new running maximum, sum and output."""
    m_new = tl.maximum(m, tl.max(x, 1))
    p = tl.exp(x - m_new[:, None])
    scale = tl.exp(m - m_new)
    return m_new, s * scale + tl.sum(p, 1), acc * scale[:, None] + tl.dot(p.to(vt.dtype), vt)


@triton.jit
def _forward(L, V, OUT, LSE, PAD, H, T_q, T_k, D,
             s_lb, s_lh, s_lq, s_vb, s_vh, s_vk, s_vd, s_ob, s_oh, s_oq, s_od, s_pb,
             CAUSAL: tl.constexpr, PADDED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    qb = tl.program_id(0)
    bh, b, l_off, v_off, o_off = _head(H, s_lb, s_lh, s_vb, s_vh, s_ob, s_oh)
    l_base, v_base = L + l_off, V + v_off
    rows = qb * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    m = tl.full([BM], _FLOOR, tl.float32)
    s = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    # key blocks wholly visible (below a causal diagonal, no padding): bounds alone
    clear = 0 if PADDED else ((qb * BM // BN) * BN if CAUSAL else T_k)
    for start in range(0, clear, BN):
        cols = start + tl.arange(0, BN)
        x = tl.load(l_base + rows[:, None].to(tl.int64) * s_lq + cols[None, :],
                    mask=(rows[:, None] < T_q) & (cols[None, :] < T_k), other=float("-inf")).to(tl.float32)
        vt = tl.load(v_base + cols[:, None] * s_vk + dims[None, :] * s_vd,
                     mask=(cols[:, None] < T_k) & (dims[None, :] < D), other=0.0)
        m, s, acc = _online(x, m, s, acc, vt)
    hi = tl.minimum((qb + 1) * BM, T_k) if CAUSAL else T_k
    for start in range(clear, hi, BN):  # the diagonal's blocks, or a padded map's: cell by cell
        cols = start + tl.arange(0, BN)
        ok = _allowed(rows, cols, PAD, b, T_q, T_k, s_pb, CAUSAL, PADDED)
        x = tl.load(l_base + rows[:, None].to(tl.int64) * s_lq + cols[None, :],  # whole vectors, masked after
                    mask=(rows[:, None] < T_q) & (cols[None, :] < T_k), other=float("-inf"))
        x = tl.where(ok, x.to(tl.float32), float("-inf"))
        vt = tl.load(v_base + cols[:, None] * s_vk + dims[None, :] * s_vd,
                     mask=(cols[:, None] < T_k) & (dims[None, :] < D), other=0.0)
        m, s, acc = _online(x, m, s, acc, vt)
    empty = s == 0.0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, s)[:, None])
    o_base = OUT + o_off
    tl.store(o_base + rows[:, None] * s_oq + dims[None, :] * s_od, out.to(OUT.dtype.element_ty),
             mask=(rows[:, None] < T_q) & (dims[None, :] < D))
    # an empty row's log-sum-exp is +inf, so the backward's exp(x - lse) is 0 there
    lse = tl.where(empty, float("inf"), m + tl.log(tl.where(empty, 1.0, s)))
    tl.store(LSE + bh.to(tl.int64) * T_q + rows, lse, mask=rows < T_q)


@triton.jit
def _delta(DO, OUT, DELTA, H, T_q, D, s_ob, s_oh, s_oq, s_od, s_gb, s_gh, s_gq, s_gd, BM: tl.constexpr,
           BD: tl.constexpr):
    """``delta = rowsum(dO * O)`` of a block of rows, in fp32 (the backward's softmax term), from the 16-bit
    tensors in one read."""
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    inside = (rows[:, None] < T_q) & (dims[None, :] < D)
    o = tl.load(OUT + b * s_ob + h * s_oh + rows[:, None] * s_oq + dims[None, :] * s_od, mask=inside, other=0.0)
    do = tl.load(DO + b * s_gb + h * s_gh + rows[:, None] * s_gq + dims[None, :] * s_gd, mask=inside, other=0.0)
    tl.store(DELTA + bh.to(tl.int64) * T_q + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=rows < T_q)


@triton.jit
def _block_grad(L, DO, DELTA, LSE, GL, PAD, vt, offs, ok, inside, rows, cols, dims, b, bh, T_q, D, s_oq, s_od,
                s_pb, do_base, EXTRA: tl.constexpr):
    """One query block's ``dM = P (dP - delta)`` (+ the incoming gradient) and its ``P^T dO``: the block is read
    with its bounds (whole vectors) and masked after."""
    x = tl.where(ok, tl.load(L + offs, mask=inside, other=float("-inf")).to(tl.float32), float("-inf"))
    lse = tl.load(LSE + bh.to(tl.int64) * T_q + rows, mask=rows < T_q, other=float("inf"))
    p = tl.exp(x - lse[:, None])
    do = tl.load(do_base + rows[:, None] * s_oq + dims[None, :] * s_od,
                 mask=(rows[:, None] < T_q) & (dims[None, :] < D), other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * T_q + rows, mask=rows < T_q, other=0.0)
    dl = p * (tl.dot(do, tl.trans(vt)).to(tl.float32) - delta[:, None])
    if EXTRA:
        dl += tl.load(GL + offs, mask=inside, other=0.0).to(tl.float32)
    return dl, tl.dot(tl.trans(p.to(do.dtype)), do)


@triton.jit
def _epilogue(dl, DL, DS, DR, SIGN, ALPHA, BETA_W, PAD, offs, inside, rows, cols, b, bh, T_k, s_pb, slope,
              CAUSAL: tl.constexpr, PADDED: tl.constexpr, MAPS: tl.constexpr, BETA: tl.constexpr,
              BN: tl.constexpr):
    """What one block of ``dM`` becomes (module doc, "Map epilogues")."""
    if MAPS == 0:
        tl.store(DL + offs, dl.to(DL.dtype.element_ty), mask=inside)
    else:
        alpha = tl.load(ALPHA)
        keep = inside
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        if PADDED:
            keep = keep & (tl.load(PAD + b * s_pb + rows, mask=rows < T_k, other=1) == 0)[:, None]
            keep = keep & (tl.load(PAD + b * s_pb + cols, mask=cols < T_k, other=1) == 0)[None, :]
        if MAPS == 1:
            row = (T_k + 7) // 8
            byte = cols // 8
            packed = tl.load(SIGN + bh.to(tl.int64) * T_k * row + rows[:, None] * row + byte[None, :],
                             mask=inside, other=0)
            active = ((packed.to(tl.int32) >> (cols % 8)[None, :]) & 1) != 0
            dz = tl.where(keep, alpha * tl.where(active, dl, dl * slope), 0.0)
            tl.store(DL + offs, dz.to(DL.dtype.element_ty), mask=inside)
            residual = (1.0 - alpha) * dl
            if BETA:
                tl.store(DR + offs, residual, mask=inside)
            else:
                tl.store(DS + offs, residual.to(DS.dtype.element_ty), mask=inside)
        else:
            source = dl * ((1.0 - alpha) + tl.where(keep, alpha, 0.0))
            if BETA:
                beta = tl.load(BETA_W)
                tl.store(DS + offs, ((1.0 - beta) * source).to(DS.dtype.element_ty), mask=inside)
                tl.store(DL + offs, (beta * source).to(DL.dtype.element_ty), mask=inside)
            else:
                tl.store(DS + offs, ((1.0 - alpha) * dl).to(DS.dtype.element_ty), mask=inside)
                tl.store(DL + offs, tl.where(keep, alpha * dl, 0.0).to(DL.dtype.element_ty), mask=inside)


@triton.jit
def _backward(L, V, DO, DELTA, LSE, DL, DV, GL, PAD, DS, DR, SIGN, ALPHA, BETA_W, H, T_q, T_k, D,
              s_lb, s_lh, s_lq, s_vb, s_vh, s_vk, s_vd, s_ob, s_oh, s_oq, s_od, s_pb, slope,
              CAUSAL: tl.constexpr, PADDED: tl.constexpr, EXTRA: tl.constexpr, MAPS: tl.constexpr,
              BETA: tl.constexpr, ZERO_ABOVE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BD: tl.constexpr):
    kb = tl.program_id(0)
    bh, b, l_off, v_off, o_off = _head(H, s_lb, s_lh, s_vb, s_vh, s_ob, s_oh)
    v_base, do_base = V + v_off, DO + o_off
    cols = kb * BN + tl.arange(0, BN)
    dims = tl.arange(0, BD)
    vt = tl.load(v_base + cols[:, None] * s_vk + dims[None, :] * s_vd,
                 mask=(cols[:, None] < T_k) & (dims[None, :] < D), other=0.0)
    dv = tl.zeros([BN, BD], tl.float32)
    lo = ((kb * BN) // BM) * BM if CAUSAL else 0
    zero_to = DL if MAPS == 0 else DS  # the map a matrix product reads whole
    for start in range(0, lo if ZERO_ABOVE else 0, BM):  # blocks wholly above a causal diagonal: zero gradient
        rows = start + tl.arange(0, BM)
        inside = (rows[:, None] < T_q) & (cols[None, :] < T_k)
        offs = l_off + rows[:, None].to(tl.int64) * s_lq + cols[None, :]
        tl.store(zero_to + offs, tl.zeros([BM, BN], zero_to.dtype.element_ty), mask=inside)
        if MAPS == 2:  # the previous logits' gradient too: the op's output, which the first layer's product reads
            tl.store(DL + offs, tl.zeros([BM, BN], DL.dtype.element_ty), mask=inside)
    # the blocks the diagonal crosses (or every block of a padded map) mask cell by cell; the rest by bounds
    clear = T_q if PADDED else (tl.minimum(((kb + 1) * BN + BM - 1) // BM * BM, T_q) if CAUSAL else 0)
    for start in range(lo, clear, BM):
        rows = start + tl.arange(0, BM)
        ok = _allowed(rows, cols, PAD, b, T_q, T_k, s_pb, CAUSAL, PADDED)
        inside = (rows[:, None] < T_q) & (cols[None, :] < T_k)
        offs = l_off + rows[:, None].to(tl.int64) * s_lq + cols[None, :]
        dl, dvp = _block_grad(L, DO, DELTA, LSE, GL, PAD, vt, offs, ok, inside, rows, cols, dims, b, bh, T_q, D,
                              s_oq, s_od, s_pb, do_base, EXTRA)
        if CAUSAL:  # M above the diagonal is not part of the function: an incoming gradient there is not either
            dl = tl.where(cols[None, :] <= rows[:, None], dl, 0.0)
        _epilogue(dl, DL, DS, DR, SIGN, ALPHA, BETA_W, PAD, offs, inside, rows, cols, b, bh, T_k, s_pb, slope,
                  CAUSAL, PADDED, MAPS, BETA, BN)
        dv += dvp
    for start in range(clear, T_q, BM):
        rows = start + tl.arange(0, BM)
        inside = (rows[:, None] < T_q) & (cols[None, :] < T_k)
        offs = l_off + rows[:, None].to(tl.int64) * s_lq + cols[None, :]
        dl, dvp = _block_grad(L, DO, DELTA, LSE, GL, PAD, vt, offs, inside, inside, rows, cols, dims, b, bh, T_q, D,
                              s_oq, s_od, s_pb, do_base, EXTRA)
        _epilogue(dl, DL, DS, DR, SIGN, ALPHA, BETA_W, PAD, offs, inside, rows, cols, b, bh, T_k, s_pb, slope,
                  False, False, MAPS, BETA, BN)
        dv += dvp
    dv_base = DV + v_off
    tl.store(dv_base + cols[:, None] * s_vk + dims[None, :] * s_vd, dv.to(DV.dtype.element_ty),
             mask=(cols[:, None] < T_k) & (dims[None, :] < D))


# 8 warps, and the backward walks the queries 32 rows at a time: at head size 64 the forward takes 76 registers a
# thread and the backward 98, or 102 when it adds the next layer's gradient of the logits (sm_90, Triton 3.9; with
# 4 warps and 64 rows 124, 235 and 247), so a multiprocessor holds 24 and 16 warps instead of 16 and 8
# (bench_kernels.py --resources); a kernel that reads its logits from memory needs the warps in flight
WARPS = 8
BACKWARD_ROWS = 32


@dataclass(frozen=True)
class MapEpilogue:
    """What Predictive Attention's backward asks of the attention's (module doc): ``signs`` of the CNN's last
    pre-activation (None: no CNN, the Res-Transformer), Eq. 4's ``alpha``, Evolving Attention's ``beta``, the
    activation's negative ``slope``."""

    alpha: Tensor
    beta: Optional[Tensor]
    slope: float
    signs: Optional[Tensor]
    zero_above: bool = True  # write the layer's logits' gradient above a causal diagonal as zeros (False: unread)


def _blocks(d: int) -> tuple[int, int, int]:
    return 64, 64, max(16, triton.next_power_of_2(d))


def _padding(key_padding_mask: Optional[Tensor], device: torch.device) -> tuple[Tensor, int, bool]:
    if key_padding_mask is None:
        return torch.zeros(1, dtype=torch.int8, device=device), 0, False
    pad = key_padding_mask.to(torch.int8).contiguous()
    return pad, pad.stride(0), True


def forward(logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: the attention output in ``v``'s dtype and each row's log-sum-exp (fp32)."""
    B, H, T_q, T_k = logits.shape
    D = v.shape[-1]
    out = torch.empty(B, H, T_q, D, device=v.device, dtype=v.dtype)
    lse = torch.empty(B, H, T_q, device=v.device, dtype=torch.float32)
    pad, s_pb, padded = _padding(key_padding_mask, v.device)
    BM, BN, BD = _blocks(D)
    _forward[(triton.cdiv(T_q, BM), B * H)](
        logits, v, out, lse, pad, H, T_q, T_k, D, logits.stride(0), logits.stride(1), logits.stride(2),
        *v.stride(), *out.stride(), s_pb, CAUSAL=causal, PADDED=padded, BM=BM, BN=BN, BD=BD, num_warps=WARPS)
    return out, lse


def backward(grad_out: Tensor, logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], out: Tensor,
             lse: Tensor, causal: bool, logits_grad: Optional[Tensor], maps: Optional[MapEpilogue] = None
             ) -> tuple[Tensor, ...]:
    """``(grad of the logits (+ logits_grad), grad of v)``, in the logits' and v's dtypes; with ``maps``, ``(dZ or
    the previous logits' gradient, grad of v, the layer's logits' gradient, the residual's fp32 gradient or None)``
    (module doc, "Map epilogues")."""
    B, H, T_q, T_k = logits.shape
    D = v.shape[-1]
    grad_out = grad_out.contiguous()
    delta = torch.empty(B, H, T_q, device=out.device, dtype=torch.float32)
    _, BN, BD = _blocks(D)
    _delta[(triton.cdiv(T_q, 64), B * H)](grad_out, out, delta, H, T_q, D, *out.stride(), *grad_out.stride(), BM=64,
                                          BD=BD, num_warps=4)
    grad_logits = torch.empty_like(logits)
    grad_v = torch.empty(v.shape, device=v.device, dtype=v.dtype)  # contiguous, unlike v's view
    extra = logits_grad.contiguous() if logits_grad is not None else grad_logits
    pad, s_pb, padded = _padding(key_padding_mask, v.device)
    if grad_v.stride() != v.stride():
        v = v.contiguous()
    kind, ds, dr, with_beta = PLAIN, grad_logits, None, False
    if maps is not None:
        kind = CNN if maps.signs is not None else NO_CNN
        ds = torch.empty_like(logits)
        with_beta = maps.beta is not None
        dr = torch.empty(logits.shape, device=logits.device, dtype=torch.float32) if kind == CNN and with_beta \
            else None
    alpha = maps.alpha if maps is not None else lse
    _backward[(triton.cdiv(T_k, BN), B * H)](
        logits, v, grad_out, delta, lse, grad_logits, grad_v, extra, pad, ds, dr if dr is not None else lse,
        maps.signs if maps is not None and maps.signs is not None else pad, alpha,
        maps.beta if with_beta else alpha, H, T_q, T_k, D,
        logits.stride(0), logits.stride(1), logits.stride(2), *v.stride(), *grad_out.stride(), s_pb,
        maps.slope if maps is not None else 0.0, CAUSAL=causal, PADDED=padded, EXTRA=logits_grad is not None,
        MAPS=kind, BETA=with_beta, ZERO_ABOVE=maps is None or maps.zero_above, BM=BACKWARD_ROWS, BN=BN, BD=BD,
        num_warps=WARPS)
    if maps is None:
        return grad_logits, grad_v
    return grad_logits, grad_v, ds, dr
