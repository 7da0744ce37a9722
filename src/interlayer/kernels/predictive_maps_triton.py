"""Triton code of :mod:`interlayer.kernels.predictive_maps`: the CNN over attention maps and Eq. 4's mix.

Layout: maps are contiguous ``(B, H, T, T)`` (heads are the CNN's channels). A program handles a tile of ``BR x BC``
cells and every channel at once, as a ``(HP, BR * BC)`` block (``HP``: the heads rounded up to a power of two, at
least 16), so one tap of the 3 x 3 convolution is one matrix product ``W_tap (HP x HP) @ X_shifted (HP x cells)``
on the tensor cores (TF32 for fp32 operands, as cuDNN runs the reference's convolution). Cells outside the map,
above a causal diagonal or in a padded row or column read as zero (the CNN's hidden cells); a causal tile wholly
above the diagonal is skipped (or, for a gradient something downstream reads, filled with zeros).

Kernels:
* ``_conv_forward``: ``Y = act(conv(X) + b) * keep``; with ``FINAL`` the mix ``M = R + alpha (Y - R)`` is its
  epilogue and only ``M`` is written (``R`` is the layer's own logits, or Evolving Attention's source; above a
  causal diagonal ``M`` is 0, cells that neither the attention nor the next layer's CNN reads); with
  ``NCONV`` there is no convolution (Res-Transformer: ``Y = X`` visible). ``FIRST`` marks the CNN's input (the
  previous layer's logits, non-finite values read as zero; with ``BETA`` the source ``(1-beta) S + beta M_prev``).
* ``_conv_backward_z``: one program per tile, as the forward: the gradient of the pre-activation
  ``dZ = dY keep act'(Z)`` (``Z`` recomputed for the last convolution, read off the stored ``Y`` for the others),
  the tile's share of the weight and bias gradients (nine taps: the kernel covers 3 x 3, the paper's size), each
  tap's product stored as soon as it is made, and for the last convolution ``dR = (1 - alpha) dM``. (A first
  version walked each column of tiles in one program holding nine accumulators: 512 programs at GPT-2 small, each
  serial over up to 64 tiles. The one GPU run of that version measured the whole PA step at 44x the plain model's.
  Compiled offline for sm_90, the one-tile version still spilled 1.6 KB of registers a thread to local memory, and
  the forward's 201 registers left a multiprocessor 8 warps; see ``WARPS``. Neither version is timed on a GPU yet.)
* ``_conv_backward_x``: the input gradient, ``dX = sum_tap W_tap^T dZ(shifted back)``, times the input's keep;
  for the CNN's input it becomes the gradient of the previous layer's logits (and with ``BETA`` of the layer's own).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

BR, BC = 16, 16  # the tile: 256 cells x HP channels
# Register budget (sm_90, Triton 3.9, GPT-2 small's maps; benchmarks/bench_kernels.py --resources): a (16, 256)
# tile over 8 warps, the taps as a loop rather than unrolled (unrolled, the compiler hoisted the nine shifted loads
# and the weight-gradient kernel spilled 1.6 KB a thread) and 32-bit offsets within a batch element's maps take
# 75 / 122 / 63 registers in the forward / dZ / dX kernels, no spill, against 201 / 255 + spills / 168 before.
WARPS = 8


@triton.jit
def _tile(H, T, HP: tl.constexpr):
    """This program's tile of cells and what every kernel addresses it by: batch ``b``, tile row and column
    ``rb, cb``, the cells' rows ``r`` and columns ``c`` (256), the channels ``ch`` (``HP``), the batch element's
    offset ``base`` and, for the ``(HP, 256)`` block, which entries lie inside the map and their 32-bit offsets."""
    b = tl.program_id(0)
    rb = tl.program_id(1)
    cb = tl.program_id(2)
    cell = tl.arange(0, 256)
    r = rb * 16 + cell // 16
    c = cb * 16 + cell % 16
    ch = tl.arange(0, HP)
    base = b.to(tl.int64) * H * T * T
    inside = (ch[:, None] < H) & ((r < T) & (c < T))[None, :]
    offs = ch[:, None] * T * T + (r * T + c)[None, :]
    return b, rb, cb, r, c, ch, base, inside, offs


@triton.jit
def _visible(b, rr, cc, T, pad_ptr, s_pb, CAUSAL: tl.constexpr, PADDED: tl.constexpr):
    ok = (rr >= 0) & (rr < T) & (cc >= 0) & (cc < T)
    if CAUSAL:
        ok = ok & (cc <= rr)
    if PADDED:
        pr = tl.load(pad_ptr + b * s_pb + rr, mask=(rr >= 0) & (rr < T), other=1)
        pc = tl.load(pad_ptr + b * s_pb + cc, mask=(cc >= 0) & (cc < T), other=1)
        ok = ok & (pr == 0) & (pc == 0)
    return ok


@triton.jit
def _load(ptr, base, ch, rr, cc, H, T, ok):
    """A ``(HP, cells)`` block of a map at rows ``rr``, columns ``cc``; zero where not ``ok``; fp32."""
    offs = ch[:, None] * T * T + (rr * T + cc)[None, :]  # int32: the host keeps H T^2 < 2^31
    return tl.load(ptr + base + offs, mask=(ch[:, None] < H) & ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _input(X, S, beta, base, ch, rr, cc, H, T, ok, FIRST: tl.constexpr, BETA: tl.constexpr):
    """The CNN's input at shifted cells: the previous layer's logits (non-finite read as 0), Evolving Attention's
    source, or an intermediate map (already zero where hidden)."""
    x = _load(X, base, ch, rr, cc, H, T, ok)
    if FIRST:
        if BETA:
            x = (1.0 - beta) * _load(S, base, ch, rr, cc, H, T, ok) + beta * x
        x = tl.where((x == x) & (tl.abs(x) != float("inf")), x, 0.0)
    return x


@triton.jit
def _convolve(X, S, W, Bias, beta, base, b, r, c, H, T, PAD, s_pb, CAUSAL: tl.constexpr, PADDED: tl.constexpr,
              FIRST: tl.constexpr, BETA: tl.constexpr, TOP: tl.constexpr, HP: tl.constexpr):
    """The pre-activation ``Z = conv(X) + b`` of one tile, ``(HP, 256)``: one ``W_tap @ X_shifted`` product a tap."""
    ch = tl.arange(0, HP)
    ci = tl.arange(0, HP)
    acc = tl.zeros([HP, 256], tl.float32)
    for tap in range(9):
        rr = r + tap // 3 - TOP
        cc = c + tap % 3 - 1
        ok = _visible(b, rr, cc, T, PAD, s_pb, CAUSAL, PADDED)
        x = _input(X, S, beta, base, ch, rr, cc, H, T, ok, FIRST, BETA)
        w = tl.load(W + (ch[:, None] * H + ci[None, :]) * 9 + tap, mask=(ch[:, None] < H) & (ci[None, :] < H),
                    other=0.0)
        acc += tl.dot(w, x)
    return acc + tl.load(Bias + ch, mask=ch < H, other=0.0)[:, None]


@triton.jit
def _conv_forward(X, S, Prev, W, Bias, Out, PAD, ALPHA, BETA_W, H, T, s_pb, slope,
                  CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr,
                  BETA_RES: tl.constexpr, FINAL: tl.constexpr, NCONV: tl.constexpr, TOP: tl.constexpr,
                  HP: tl.constexpr):
    b, rb, cb, r, c, ch, base, inside, offs = _tile(H, T, HP)
    if CAUSAL and cb > rb:
        if FINAL:  # M above the diagonal: zeros, never uninitialised memory (nothing reads them)
            tl.store(Out + base + offs, tl.zeros([HP, 256], Out.dtype.element_ty), mask=inside)
        return
    beta = tl.load(BETA_W) if BETA or BETA_RES else 0.0
    keep = _visible(b, r, c, T, PAD, s_pb, CAUSAL, PADDED)
    if NCONV:
        y = _input(X, S, beta, base, ch, r, c, H, T, keep, FIRST, BETA)
    else:
        z = _convolve(X, S, W, Bias, beta, base, b, r, c, H, T, PAD, s_pb, CAUSAL, PADDED, FIRST, BETA, TOP, HP)
        y = tl.where(z > 0, z, z * slope) * keep[None, :].to(tl.float32)
    if FINAL:
        alpha = tl.load(ALPHA)
        res = tl.load(S + base + offs, mask=inside, other=0.0).to(tl.float32)
        if BETA_RES:  # Evolving Attention: the residual is the source, (1 - beta) S + beta M_prev
            res = (1.0 - beta) * res + beta * tl.load(Prev + base + offs, mask=inside, other=0.0).to(tl.float32)
        mixed = res + alpha * (y - res)
        if CAUSAL:
            mixed = tl.where((c <= r)[None, :], mixed, 0.0)
        tl.store(Out + base + offs, mixed.to(Out.dtype.element_ty), mask=inside)
    else:
        tl.store(Out + base + offs, y.to(Out.dtype.element_ty), mask=inside)


@triton.jit
def _conv_backward_z(G, X, S, W, Bias, Y, DZ, DR, DW, DB, PAD, ALPHA, BETA_W, H, T, s_pb, slope, n_rb, n_cb,
                     CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr,
                     FINAL: tl.constexpr, TOP: tl.constexpr, HP: tl.constexpr):
    """One tile: ``dZ = dY keep act'(Z)`` (and ``dR = (1 - alpha) dM`` for the last convolution), and the tile's
    share of the weight and bias gradients, each tap's ``dZ X_tap^T`` stored as soon as it is made (no accumulator
    lives across taps) into this tile's row of ``DW`` (``[tiles, H, H, 9]``; a causal map's skipped tiles have no
    row, so every row is written and the host sums them without zeroing first). A causal tile above the diagonal
    only writes its zeros of ``dZ`` (and ``dR``)."""
    b, rb, cb, r, c, ch, base, inside, offs = _tile(H, T, HP)
    ci = tl.arange(0, HP)
    if CAUSAL and cb > rb:  # read by nobody downstream, but must not be garbage
        zero = tl.zeros([HP, 256], tl.float32)
        tl.store(DZ + base + offs, zero, mask=inside)
        if FINAL:
            tl.store(DR + base + offs, zero.to(DR.dtype.element_ty), mask=inside)
        return
    beta = tl.load(BETA_W) if BETA else 0.0
    keep = _visible(b, r, c, T, PAD, s_pb, CAUSAL, PADDED)
    g = tl.load(G + base + offs, mask=inside, other=0.0).to(tl.float32)
    if FINAL:
        alpha = tl.load(ALPHA)
        dr = (1.0 - alpha) * g
        if CAUSAL:  # M is 0 above the diagonal, whatever S holds there
            dr = tl.where((c <= r)[None, :], dr, 0.0)
        tl.store(DR + base + offs, dr.to(DR.dtype.element_ty), mask=inside)
        z = _convolve(X, S, W, Bias, beta, base, b, r, c, H, T, PAD, s_pb, CAUSAL, PADDED, FIRST, BETA, TOP, HP)
        active = z > 0
        g = alpha * g
    else:
        active = tl.load(Y + base + offs, mask=inside, other=0.0) > 0
    dz = tl.where(active, g, g * slope) * keep[None, :].to(tl.float32)
    tl.store(DZ + base + offs, dz, mask=inside)
    if CAUSAL:  # the tiles on and below the diagonal, row by row: a causal map's rows of DW are all written
        tile = (b * (n_rb * (n_rb + 1) // 2) + rb * (rb + 1) // 2 + cb).to(tl.int64)
    else:
        tile = ((b * n_rb + rb) * n_cb + cb).to(tl.int64)
    tl.store(DB + tile * H + ch, tl.sum(dz, 1), mask=ch < H)
    wmask = (ch[:, None] < H) & (ci[None, :] < H)
    woffs = tile * H * H * 9 + (ch[:, None] * H + ci[None, :]) * 9
    for tap in range(9):
        rr = r + tap // 3 - TOP
        cc = c + tap % 3 - 1
        ok = _visible(b, rr, cc, T, PAD, s_pb, CAUSAL, PADDED)
        x = _input(X, S, beta, base, ch, rr, cc, H, T, ok, FIRST, BETA)
        tl.store(DW + woffs + tap, tl.dot(dz, tl.trans(x)), mask=wmask)


@triton.jit
def _conv_backward_x(DZ, W, DR, DX, DS, PAD, ALPHA, BETA_W, H, T, s_pb,
                     CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr,
                     NCONV: tl.constexpr, TOP: tl.constexpr, HP: tl.constexpr):
    """``dX = sum_tap W_tap^T dZ[cells - tap]`` times the input's keep. ``FIRST``: ``dX`` is the gradient of the
    previous layer's logits (``BETA``: of the source, split into it and the layer's own ``DS``, with ``DR`` added).
    ``NCONV``: no convolution, ``dX = DZ`` (which holds ``alpha dM``)."""
    b, rb, cb, r, c, ch, base, inside, offs = _tile(H, T, HP)
    if CAUSAL and cb > rb:
        zero = tl.zeros([HP, 256], tl.float32)
        tl.store(DX + base + offs, zero.to(DX.dtype.element_ty), mask=inside)
        if BETA:
            tl.store(DS + base + offs, zero.to(DS.dtype.element_ty), mask=inside)
        return
    keep = _visible(b, r, c, T, PAD, s_pb, CAUSAL, PADDED)
    if NCONV:
        dx = tl.load(DZ + base + offs, mask=inside, other=0.0).to(tl.float32)
    else:
        dx = tl.zeros([HP, 256], tl.float32)
        co = tl.arange(0, HP)
        for tap in range(9):
            # the output cell that read input (r, c) through this tap
            rr = r - tap // 3 + TOP
            cc = c - tap % 3 + 1
            ok = (rr >= 0) & (rr < T) & (cc >= 0) & (cc < T)
            dz = _load(DZ, base, ch, rr, cc, H, T, ok)
            # W_tap^T: [in, out]
            wt = tl.load(W + (co[None, :] * H + ch[:, None]) * 9 + tap, mask=(ch[:, None] < H) & (co[None, :] < H),
                         other=0.0)
            dx += tl.dot(wt, dz)
    dx = dx * keep[None, :].to(tl.float32)
    if BETA:
        beta = tl.load(BETA_W)
        source = dx + tl.load(DR + base + offs, mask=inside, other=0.0)
        tl.store(DS + base + offs, ((1.0 - beta) * source).to(DS.dtype.element_ty), mask=inside)
        dx = beta * source
    tl.store(DX + base + offs, dx.to(DX.dtype.element_ty), mask=inside)


def _grid_cells(B: int, T: int) -> tuple[int, int, int]:
    n = triton.cdiv(T, BR)
    return B, n, n


def _hp(H: int) -> int:
    return max(16, triton.next_power_of_2(H))


def _padding(key_padding_mask: Optional[Tensor], device: torch.device) -> tuple[Tensor, int, bool]:
    if key_padding_mask is None:
        return torch.zeros(1, dtype=torch.int8, device=device), 0, False
    pad = key_padding_mask.to(torch.int8).contiguous()
    return pad, pad.stride(0), True


def conv_forward(x: Tensor, s: Tensor, prev: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                 alpha: Tensor, beta: Optional[Tensor], key_padding_mask: Optional[Tensor], causal: bool, slope: float,
                 first: bool, final: bool) -> Tensor:
    """One convolution of the CNN over ``x`` (``weight`` None: none, the Res-Transformer), with the mix when
    ``final`` (``s``: the layer's own logits; ``prev``: the previous layer's, for Evolving Attention's residual).
    Returns the mixed map in ``s``'s dtype (``final``) or the fp32 intermediate map."""
    B, H, T, _ = s.shape
    out = torch.empty_like(s) if final else torch.empty(B, H, T, T, device=s.device, dtype=torch.float32)
    pad, s_pb, padded = _padding(key_padding_mask, s.device)
    dummy = alpha
    _conv_forward[_grid_cells(B, T)](
        x, s, prev, weight if weight is not None else dummy, bias if bias is not None else dummy, out, pad, alpha,
        beta if beta is not None else dummy, H, T, s_pb, slope, CAUSAL=causal, PADDED=padded, FIRST=first,
        BETA=beta is not None and first, BETA_RES=beta is not None and final, FINAL=final, NCONV=weight is None,
        TOP=2 if causal else 1, HP=_hp(H), num_warps=WARPS)
    return out


def conv_backward(grad: Tensor, x: Tensor, s: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                  y: Optional[Tensor], alpha: Tensor, beta: Optional[Tensor], key_padding_mask: Optional[Tensor],
                  causal: bool, slope: float, first: bool, final: bool, ds: Tensor,
                  residual_grad: Optional[Tensor] = None
                  ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """The backward of :func:`conv_forward`: ``(grad of x, grad of its weight, of its bias, dR)``.

    ``grad``: the gradient of the convolution's output (``final``: of the mixed map ``M``); ``y`` its stored output
    (an intermediate convolution's, for the activation's derivative; None for the last, which recomputes it).
    With ``final`` the residual's gradient ``dR = (1 - alpha) dM`` is written into ``ds`` (the layer's logits'
    gradient) or, with ``beta``, returned in fp32; the CNN input's backward (``first``) then splits
    ``residual_grad`` (that ``dR``) plus its own gradient into ``ds`` and the previous logits' gradient. The grad of
    ``x`` is in ``x``'s dtype (``first``: the previous layer's logits) or fp32 (an intermediate map)."""
    B, H, T, _ = s.shape
    pad, s_pb, padded = _padding(key_padding_mask, s.device)
    hp, top, n_cb = _hp(H), 2 if causal else 1, triton.cdiv(T, BC)
    has_beta = beta is not None and first
    dummy = alpha
    dr = None
    if final:
        dr = torch.empty(B, H, T, T, device=s.device, dtype=torch.float32) if beta is not None else ds
    source_grad = dr if final else residual_grad
    dz = torch.empty(B, H, T, T, device=s.device, dtype=torch.float32)
    dw = db = None
    if weight is None:  # no convolution: the prediction is the input itself
        _identity_backward(grad, dz, dr, alpha, causal)
    else:
        # each computed tile's share of the weight and bias gradients (a causal map's upper tiles compute none),
        # written by its program, then summed
        tiles = B * (n_cb * (n_cb + 1) // 2 if causal else n_cb * n_cb)
        dw_parts = torch.empty(tiles, H, H, 9, device=s.device, dtype=torch.float32)
        db_parts = torch.empty(tiles, H, device=s.device, dtype=torch.float32)
        _conv_backward_z[_grid_cells(B, T)](
            grad, x, s, weight, bias, y if y is not None else dummy, dz, dr if dr is not None else dummy,
            dw_parts, db_parts, pad, alpha, beta if beta is not None else dummy, H, T, s_pb, slope, n_cb, n_cb,
            CAUSAL=causal, PADDED=padded, FIRST=first, BETA=has_beta, FINAL=final, TOP=top, HP=hp, num_warps=WARPS)
        dw = dw_parts.sum(0).view_as(weight)
        db = db_parts.sum(0)
    dx = torch.empty(B, H, T, T, device=s.device, dtype=x.dtype if first else torch.float32)
    _conv_backward_x[_grid_cells(B, T)](
        dz, weight if weight is not None else dummy, source_grad if has_beta else dummy, dx, ds if has_beta else dummy,
        pad, alpha, beta if beta is not None else dummy, H, T, s_pb, CAUSAL=causal, PADDED=padded, FIRST=first,
        BETA=has_beta, NCONV=weight is None, TOP=top, HP=hp, num_warps=WARPS)
    return dx, dw, db, dr


def _identity_backward(grad: Tensor, dz: Tensor, dr: Optional[Tensor], alpha: Tensor, causal: bool) -> None:
    """Without a convolution: ``dZ = alpha dM`` (the input's keep is applied by ``_conv_backward_x``) and
    ``dR = (1 - alpha) dM`` (0 above a causal diagonal, where the forward wrote ``M = 0``)."""
    g = grad.float()
    torch.mul(g, alpha, out=dz)
    if dr is not None:
        residual = g * (1.0 - alpha)
        dr.copy_(residual.tril_() if causal else residual)
