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
def _rows(X, b, h, rows, dims, s_b, s_h, s_t, T, D):
    """Rows ``rows`` of head ``(b, h)`` of a ``(B, H, T, D)`` tensor, zero beyond ``T`` and ``D``."""
    return tl.load(X + b * s_b + h * s_h + rows[:, None] * s_t + dims[None, :],
                   mask=(rows[:, None] < T) & (dims[None, :] < D), other=0.0)


@triton.jit
def _store_rows(X, acc, b, h, rows, dims, s_b, s_h, s_t, T, D):
    tl.store(X + b * s_b + h * s_h + rows[:, None] * s_t + dims[None, :], acc.to(X.dtype.element_ty),
             mask=(rows[:, None] < T) & (dims[None, :] < D))


@triton.jit
def _forward(Q, K, S, T, D, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, scale, H,
             BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    rows = qb * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    q = _rows(Q, b, h, rows, dims, s_qb, s_qh, s_qt, T, D)
    base = S + bh.to(tl.int64) * T * T
    for start in range(0, (qb + 1) * BM, BN):
        cols = start + tl.arange(0, BN)
        s = tl.dot(q, tl.trans(_rows(K, b, h, cols, dims, s_kb, s_kh, s_kt, T, D))) * scale
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
        acc = tl.dot(_grad_tile(DS, bh, rows, cols, T), _rows(K, b, h, cols, dims, s_kb, s_kh, s_kt, T, D), acc)
    _store_rows(DQ, acc * scale, b, h, rows, dims, s_gb, s_gh, s_gt, T, D)


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
        acc = tl.dot(tl.trans(_grad_tile(DS, bh, rows, cols, T)), _rows(Q, b, h, rows, dims, s_qb, s_qh, s_qt, T, D),
                     acc)
    _store_rows(DK, acc * scale, b, h, cols, dims, s_gb, s_gh, s_gt, T, D)


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
