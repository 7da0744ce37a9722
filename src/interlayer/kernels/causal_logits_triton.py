"""Triton code of :mod:`interlayer.kernels.causal_logits`: block products on and below a causal diagonal.

Forward: one program per (block of ``BM`` query rows, batch x head) multiplies its queries into each key block up to
the diagonal (``tl.dot`` of ``BM x D`` and ``D x BN``) and writes the ``BM x BN`` logits. Backward: ``dq`` a program
per query block over the key blocks up to the diagonal, ``dk`` a program per key block over the query blocks from
the diagonal; a diagonal block's gradient is read whole (vectors) and its cells above the diagonal set to zero, since
the map there is unspecified and so is anything written there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BM, BN = 64, 64
WARPS = 4


@triton.jit
def _forward(Q, K, S, T, D, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, scale, H,
             BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    rows = qb * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    q = tl.load(Q + b * s_qb + h * s_qh + rows[:, None] * s_qt + dims[None, :],
                mask=(rows[:, None] < T) & (dims[None, :] < D), other=0.0)
    base = S + bh.to(tl.int64) * T * T
    for start in range(0, (qb + 1) * BM, BN):
        cols = start + tl.arange(0, BN)
        k = tl.load(K + b * s_kb + h * s_kh + cols[:, None] * s_kt + dims[None, :],
                    mask=(cols[:, None] < T) & (dims[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        tl.store(base + rows[:, None] * T + cols[None, :], s.to(S.dtype.element_ty),
                 mask=(rows[:, None] < T) & (cols[None, :] < T))


@triton.jit
def _grad_tile(DS, bh, rows, cols, T):
    """A block of the map's gradient, read whole and zero above the diagonal."""
    g = tl.load(DS + bh.to(tl.int64) * T * T + rows[:, None] * T + cols[None, :],
                mask=(rows[:, None] < T) & (cols[None, :] < T), other=0.0)
    return tl.where(cols[None, :] <= rows[:, None], g, 0.0).to(g.dtype)


@triton.jit
def _backward_q(DS, K, DQ, T, D, s_kb, s_kh, s_kt, s_gb, s_gh, s_gt, scale, H,
                BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    rows = qb * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    acc = tl.zeros([BM, BD], tl.float32)
    for start in range(0, (qb + 1) * BM, BN):
        cols = start + tl.arange(0, BN)
        k = tl.load(K + b * s_kb + h * s_kh + cols[:, None] * s_kt + dims[None, :],
                    mask=(cols[:, None] < T) & (dims[None, :] < D), other=0.0)
        acc = tl.dot(_grad_tile(DS, bh, rows, cols, T), k, acc)
    tl.store(DQ + b * s_gb + h * s_gh + rows[:, None] * s_gt + dims[None, :], (acc * scale).to(DQ.dtype.element_ty),
             mask=(rows[:, None] < T) & (dims[None, :] < D))


@triton.jit
def _backward_k(DS, Q, DK, T, D, s_qb, s_qh, s_qt, s_gb, s_gh, s_gt, scale, H,
                BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    kb = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    cols = kb * BN + tl.arange(0, BN)
    dims = tl.arange(0, BD)
    acc = tl.zeros([BN, BD], tl.float32)
    for start in range((kb * BN // BM) * BM, T, BM):
        rows = start + tl.arange(0, BM)
        q = tl.load(Q + b * s_qb + h * s_qh + rows[:, None] * s_qt + dims[None, :],
                    mask=(rows[:, None] < T) & (dims[None, :] < D), other=0.0)
        acc = tl.dot(tl.trans(_grad_tile(DS, bh, rows, cols, T)), q, acc)
    tl.store(DK + b * s_gb + h * s_gh + cols[:, None] * s_gt + dims[None, :], (acc * scale).to(DK.dtype.element_ty),
             mask=(cols[:, None] < T) & (dims[None, :] < D))


def _bd(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def forward(q: Tensor, k: Tensor, scale: float) -> Tensor:
    B, H, T, D = q.shape
    s = torch.empty(B, H, T, T, device=q.device, dtype=q.dtype)
    _forward[(triton.cdiv(T, BM), B * H)](q, k, s, T, D, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
                                          k.stride(1), k.stride(2), scale, H, BM=BM, BN=BN, BD=_bd(D),
                                          num_warps=WARPS)
    return s


def backward(grad: Tensor, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    B, H, T, D = q.shape
    dq, dk = torch.empty(B, H, T, D, device=q.device, dtype=q.dtype), torch.empty(B, H, T, D, device=k.device,
                                                                                   dtype=k.dtype)
    _backward_q[(triton.cdiv(T, BM), B * H)](grad, k, dq, T, D, k.stride(0), k.stride(1), k.stride(2), *dq.stride()[:3],
                                             scale, H, BM=BM, BN=BN, BD=_bd(D), num_warps=WARPS)
    _backward_k[(triton.cdiv(T, BN), B * H)](grad, q, dk, T, D, q.stride(0), q.stride(1), q.stride(2), *dk.stride()[:3],
                                             scale, H, BM=BM, BN=BN, BD=_bd(D), num_warps=WARPS)
    return dq, dk
