"""Triton code of :mod:`interlayer.kernels.cross_entropy`: one program per row, the classes in tiles of ``BLOCK``.

Forward: an online log-sum-exp (running maximum ``m`` and rescaled sum ``s``) with the sum of the logits, all in
fp32; the target's logit read once. Backward: ``(exp(x - lse) - (1 - eps) [v = t] - eps / V) * g`` written in the
logits' dtype; an ignored row's gradient is zero. A target outside ``[0, V)`` (other than the ignored one) reads
nothing: its load is masked and its loss is NaN, as the reference gives (a label equal to V read the next row's first
logit, or past the tensor).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _row(x_ptr, t_ptr, rows_per_batch, sxb, sxt, stb, stt):
    """This program's row (batch b, position t, of strided ``(B, T, V)`` logits): its index, its logits' address and
    its target class (in the targets' own 64 bits: a cast first would wrap 2^32 + 5 into class 5)."""
    row = tl.program_id(0)
    b = row // rows_per_batch
    t = row % rows_per_batch
    base = x_ptr + b.to(tl.int64) * sxb + t.to(tl.int64) * sxt
    return row, base, tl.load(t_ptr + b * stb + t * stt)


@triton.jit
def _forward(x_ptr, t_ptr, lse_ptr, loss_ptr, nll_ptr, rows_per_batch, V, sxb, sxt, stb, stt, smoothing,
             ignore_index, BLOCK: tl.constexpr):
    row, base, target = _row(x_ptr, t_ptr, rows_per_batch, sxb, sxt, stb, stt)
    # the running maximum starts at a finite floor, so a lane that has seen only masked (-inf) classes keeps s = 0
    # without ever computing exp(-inf - -inf)
    m = tl.full([BLOCK], -1e30, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
        total += tl.where(cols < V, x, 0.0)
    m_row = tl.max(m, 0)
    s_row = tl.sum(s * tl.exp(m - m_row), 0)
    lse = m_row + tl.log(s_row)
    keep = target != ignore_index
    inside = (target >= 0) & (target < V)
    x_t = tl.load(base + tl.where(inside, target, 0), mask=keep & inside, other=float("nan")).to(tl.float32)
    nll = lse - x_t
    loss = (1.0 - smoothing) * nll + smoothing * (lse - tl.sum(total, 0) / V)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, tl.where(keep, loss, 0.0))
    tl.store(nll_ptr + row, tl.where(keep, nll, 0.0))


@triton.jit
def _backward(x_ptr, t_ptr, lse_ptr, g_ptr, dx_ptr, rows_per_batch, V, sxb, sxt, stb, stt, smoothing,
              ignore_index, BLOCK: tl.constexpr):
    row, base, target = _row(x_ptr, t_ptr, rows_per_batch, sxb, sxt, stb, stt)
    out = dx_ptr + row.to(tl.int64) * V
    keep = target != ignore_index
    g = tl.where(keep, tl.load(g_ptr + row), 0.0)
    lse = tl.load(lse_ptr + row)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - smoothing / V - (1.0 - smoothing) * (cols == target).to(tl.float32)
        tl.store(out + cols, (grad * g).to(dx_ptr.dtype.element_ty), mask=cols < V)


def _block(V: int, block: int) -> int:
    return min(block, triton.next_power_of_2(V))


def forward(logits: Tensor, target: Tensor, smoothing: float, ignore_index: int, block: int
            ) -> tuple[Tensor, Tensor, Tensor]:
    """``(lse, loss, nll)`` per row of ``logits`` ``(B, T, V)`` (classes contiguous), ``target`` ``(B, T)``."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    B, T, V = logits.shape
    lse, loss, nll = (torch.empty(B, T, device=logits.device, dtype=torch.float32) for _ in range(3))
    # 8 warps: the running maximum, sum and total of a 4,096-class block take 72 registers a thread (sm_90, Triton
    # 3.9; 133 with 4 warps), so a multiprocessor holds 24 warps instead of 12 (bench_kernels.py --resources)
    _forward[(B * T,)](logits, target, lse, loss, nll, T, V, logits.stride(0), logits.stride(1), target.stride(0),
                       target.stride(1), smoothing, ignore_index, BLOCK=_block(V, block), num_warps=8)
    return lse, loss, nll


def backward(logits: Tensor, target: Tensor, lse: Tensor, grad: Tensor, smoothing: float, ignore_index: int,
             block: int) -> Tensor:
    """The gradient of ``sum(grad * loss)`` with respect to ``logits``, contiguous, in the logits' dtype."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    B, T, V = logits.shape
    out = torch.empty(B, T, V, device=logits.device, dtype=logits.dtype)
    _backward[(B * T,)](logits, target, lse, grad.contiguous(), out, T, V, logits.stride(0), logits.stride(1),
                        target.stride(0), target.stride(1), smoothing, ignore_index, BLOCK=_block(V, block))
    return out
