"""Triton code of :mod:`interlayer.kernels.logits_attention`.

Forward: one program per (block of ``BM`` queries, batch x head); an online softmax over key blocks of ``BN``
(FlashAttention's recurrence, over logits read from memory instead of computed), the probabilities rounded to ``v``'s
dtype for the product; it keeps the row's log-sum-exp for the backward. Backward: one program per (block of ``BN``
keys, batch x head), looping over the query blocks that see them: ``P = exp(L - lse)``, ``dP = dO v^T``,
``dL = P (dP - delta)`` with ``delta = rowsum(dO * O)``, ``dV += P^T dO``; every cell of ``dL`` is written (zeros
where masked or above a causal diagonal), plus an optional incoming gradient of the logits.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# a finite floor for running maxima and the log-sum-exp of an empty row: exp(x - floor) never sees inf - inf
_FLOOR: tl.constexpr = tl.constexpr(-1e30)


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
    hi = tl.minimum((qb + 1) * BM, T_k) if CAUSAL else T_k
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        ok = _allowed(rows, cols, PAD, b, T_q, T_k, s_pb, CAUSAL, PADDED)
        x = tl.load(l_base + rows[:, None].to(tl.int64) * s_lq + cols[None, :], mask=ok, other=float("-inf"))
        x = x.to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 1))
        p = tl.exp(x - m_new[:, None])
        scale = tl.exp(m - m_new)
        s = s * scale + tl.sum(p, 1)
        vt = tl.load(v_base + cols[:, None] * s_vk + dims[None, :] * s_vd,
                     mask=(cols[:, None] < T_k) & (dims[None, :] < D), other=0.0)
        acc = acc * scale[:, None] + tl.dot(p.to(vt.dtype), vt)
        m = m_new
    empty = s == 0.0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, s)[:, None])
    o_base = OUT + o_off
    tl.store(o_base + rows[:, None] * s_oq + dims[None, :] * s_od, out.to(OUT.dtype.element_ty),
             mask=(rows[:, None] < T_q) & (dims[None, :] < D))
    # an empty row's log-sum-exp is +inf, so the backward's exp(x - lse) is 0 there
    lse = tl.where(empty, float("inf"), m + tl.log(tl.where(empty, 1.0, s)))
    tl.store(LSE + bh.to(tl.int64) * T_q + rows, lse, mask=rows < T_q)


@triton.jit
def _backward(L, V, DO, DELTA, LSE, DL, DV, GL, PAD, H, T_q, T_k, D,
              s_lb, s_lh, s_lq, s_vb, s_vh, s_vk, s_vd, s_ob, s_oh, s_oq, s_od, s_pb,
              CAUSAL: tl.constexpr, PADDED: tl.constexpr, EXTRA: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    kb = tl.program_id(0)
    bh, b, l_off, v_off, o_off = _head(H, s_lb, s_lh, s_vb, s_vh, s_ob, s_oh)
    v_base, do_base = V + v_off, DO + o_off
    cols = kb * BN + tl.arange(0, BN)
    dims = tl.arange(0, BD)
    vt = tl.load(v_base + cols[:, None] * s_vk + dims[None, :] * s_vd,
                 mask=(cols[:, None] < T_k) & (dims[None, :] < D), other=0.0)
    dv = tl.zeros([BN, BD], tl.float32)
    lo = ((kb * BN) // BM) * BM if CAUSAL else 0
    for start in range(0, lo, BM):  # blocks wholly above a causal diagonal: the gradient there is zero
        rows = start + tl.arange(0, BM)
        inside = (rows[:, None] < T_q) & (cols[None, :] < T_k)
        offs = l_off + rows[:, None].to(tl.int64) * s_lq + cols[None, :]
        extra = tl.load(GL + offs, mask=inside, other=0.0) if EXTRA else tl.zeros([BM, BN], tl.float32)
        tl.store(DL + offs, extra.to(DL.dtype.element_ty), mask=inside)
    for start in range(lo, T_q, BM):
        rows = start + tl.arange(0, BM)
        ok = _allowed(rows, cols, PAD, b, T_q, T_k, s_pb, CAUSAL, PADDED)
        offs = l_off + rows[:, None].to(tl.int64) * s_lq + cols[None, :]
        x = tl.load(L + offs, mask=ok, other=float("-inf")).to(tl.float32)
        lse = tl.load(LSE + bh.to(tl.int64) * T_q + rows, mask=rows < T_q, other=float("inf"))
        p = tl.exp(x - lse[:, None])
        do = tl.load(do_base + rows[:, None] * s_oq + dims[None, :] * s_od,
                     mask=(rows[:, None] < T_q) & (dims[None, :] < D), other=0.0)
        delta = tl.load(DELTA + bh.to(tl.int64) * T_q + rows, mask=rows < T_q, other=0.0)
        dp = tl.dot(do, tl.trans(vt)).to(tl.float32)
        dl = p * (dp - delta[:, None])
        inside = (rows[:, None] < T_q) & (cols[None, :] < T_k)
        if EXTRA:
            dl += tl.load(GL + offs, mask=inside, other=0.0).to(tl.float32)
        tl.store(DL + offs, dl.to(DL.dtype.element_ty), mask=inside)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
    dv_base = DV + v_off
    tl.store(dv_base + cols[:, None] * s_vk + dims[None, :] * s_vd, dv.to(DV.dtype.element_ty),
             mask=(cols[:, None] < T_k) & (dims[None, :] < D))


# 8 warps, and the backward walks the queries 32 rows at a time: at head size 64 the forward takes 76 registers a
# thread and the backward 98, or 102 when it adds the next layer's gradient of the logits (sm_90, Triton 3.9; with
# 4 warps and 64 rows 124, 235 and 247), so a multiprocessor holds 24 and 16 warps instead of 16 and 8
# (bench_kernels.py --resources); a kernel that reads its logits from memory needs the warps in flight
WARPS = 8
BACKWARD_ROWS = 32


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
             lse: Tensor, causal: bool, logits_grad: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``(grad of the logits (+ logits_grad), grad of v)``, in the logits' and v's dtypes."""
    B, H, T_q, T_k = logits.shape
    D = v.shape[-1]
    grad_out = grad_out.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1).contiguous()
    grad_logits = torch.empty_like(logits)
    grad_v = torch.empty(v.shape, device=v.device, dtype=v.dtype)  # contiguous, unlike v's view
    extra = logits_grad.contiguous() if logits_grad is not None else grad_logits
    pad, s_pb, padded = _padding(key_padding_mask, v.device)
    _, BN, BD = _blocks(D)
    if grad_v.stride() != v.stride():
        v = v.contiguous()
    _backward[(triton.cdiv(T_k, BN), B * H)](
        logits, v, grad_out, delta, lse, grad_logits, grad_v, extra, pad, H, T_q, T_k, D,
        logits.stride(0), logits.stride(1), logits.stride(2), *v.stride(), *grad_out.stride(), s_pb,
        CAUSAL=causal, PADDED=padded, EXTRA=logits_grad is not None, BM=BACKWARD_ROWS, BN=BN, BD=BD,
        num_warps=WARPS)
    return grad_logits, grad_v
