"""Triton code of :mod:`interlayer.kernels.predictive_maps`: the CNN over attention maps and Eq. 4's mix, streamed.

Layout: maps are contiguous ``(B, H, T, T)``; the heads are the CNN's channels, padded to ``HP`` (16) with zero
weights. A program owns a block of ``BC`` columns by ``BC`` rows (a causal grid: the blocks on and below the
diagonal) and streams rows top to bottom: each row is loaded once, at the three column offsets a 3 x 3 tap reads
(a 16-bit map's from 32-bit words, :func:`_row`), and multiplied into the three rows that read it (a ``tl.dot`` of
an ``HP x HP`` tap and an ``HP x BC`` row), so a convolution reads each cell once (plus two rows of halo a block)
instead of nine times. A row that reads no hidden cell takes a path with no mask; the others read hidden cells
(map edges, a causal upper triangle, padding) as zero, as the CNN does. Kernels:
* ``_forward``: ``Y = act(conv(X) + b) * keep``; with ``FINAL``, Eq. 4's mix ``M = R + alpha (Y - R)`` is its
  epilogue and only ``M`` is written (on and below a causal diagonal: nothing reads it above), with one sign bit a
  cell of the pre-activation for the backward (``R``: the layer's logits, or Evolving Attention's source);
  ``NCONV`` mixes without a convolution (the Res-Transformer).
* ``_input_grad``: from ``dZ`` (the attention's backward epilogue's, :mod:`.logits_attention_triton`, or this
  kernel's for the convolution after), ``dX = sum_tap W_tap^T dZ`` in one pass over the rows, ``dZ`` read at the
  three column offsets; the first convolution's also writes the source's gradient (zeros above a causal diagonal).
* ``_weight_grad``: ``dW_tap = sum dZ X_tap^T`` and the bias gradient, the input read at the three offsets and a
  row's three taps stacked into one ``[BC, 3 HP]`` operand so that each warp's tensor-core work is its own; a
  program's share is summed in registers and written once (``dw_parts``, summed by the caller).

Precision (:func:`_options`, :func:`_mm`; docs/methods/predictive.md): fp32 accumulation; 16-bit maps multiplied
as fp16 forward, TF32 for ``dX``, bf16 (fp16 for an fp16 map) for ``dW``; TF32 for an fp32 map; IEEE fp32 under the
interpreter or with ``torch.backends.cudnn.allow_tf32`` off, so that the tests can ask for exact float32.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .dispatch import interpreting
from .tiles import PA_CHANNELS as HP  # the heads, padded with zero weights

BC = 64  # a program's columns, and its rows
# 2 warps: an HP x BC row is 16 x 64; each warp's tensor-core work is its half of the columns, and the weight
# gradient's 16 x 16 product splits into the two warps' 16 x 8 halves instead of being repeated by idle warps
WARPS = 2


@triton.jit
def _triangle(t):
    """``(a, b)`` with ``t = a (a + 1) / 2 + b`` and ``b <= a``: linear block ``t`` of a lower triangle, row by row."""
    a = ((tl.sqrt(8.0 * t + 1.0) - 1.0) * 0.5).to(tl.int32)
    a = tl.where((a + 1) * (a + 2) // 2 <= t, a + 1, a)  # float rounding, either way
    a = tl.where(a * (a + 1) // 2 > t, a - 1, a)
    return a, t - a * (a + 1) // 2


@triton.jit
def _block(t, n, CAUSAL: tl.constexpr):
    """(column block, row block) of linear block ``t`` of ``n`` a side. Causal: the ``n (n + 1) / 2`` blocks on and
    below the diagonal, row by row, then (a backward that must zero them) the blocks above it."""
    if CAUSAL:
        lower = n * (n + 1) // 2
        if t < lower:
            q, s = _triangle(t)
        else:  # strictly above: the transpose of a strictly lower block
            a, s = _triangle(t - lower)
            s, q = a + 1, s
        return s, q
    return t % n, t // n


@triton.jit
def _half(word, HIGH: tl.constexpr, F16: tl.constexpr):
    """One 16-bit float of a 32-bit word (``HIGH``: bits 16-31), in fp32."""
    if F16:
        bits = (word >> 16) if HIGH else (word & 0xFFFF)
        return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    if HIGH:
        return (word & 0xFFFF0000).to(tl.float32, bitcast=True)
    return (word << 16).to(tl.float32, bitcast=True)


@triton.jit
def _open(PAD, s_pb, b, col, T):
    """Whether the columns (or a row) ``col`` are not padding."""
    return tl.load(PAD + b * s_pb + col, mask=(col >= 0) & (col < T), other=1) == 0


@triton.jit
def _visible(col, i, T, PAD, s_pb, b, CAUSAL: tl.constexpr, PADDED: tl.constexpr):
    """Columns ``col`` of row ``i`` that the CNN reads as themselves (inside the map, at or below a causal
    diagonal, not padding)."""
    ok = (col >= 0) & (col < T)
    if CAUSAL:
        ok = ok & (col <= i)
    if PADDED:
        ok = ok & _open(PAD, s_pb, b, col, T)
    return ok


@triton.jit
def _clean(x, ok, FIRST: tl.constexpr, MASKED: tl.constexpr):
    """The CNN's reading of cells: non-finite previous logits are 0 (``FIRST``), hidden cells are 0."""
    if FIRST:
        x = tl.where(x - x == 0.0, x, 0.0)
    if MASKED:
        x = tl.where(ok[None, :], x, 0.0)
    return x


@triton.jit
def _row(X, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL: tl.constexpr, PADDED: tl.constexpr,
         FIRST: tl.constexpr, MASKED: tl.constexpr, PAIRS: tl.constexpr, F16: tl.constexpr, HP: tl.constexpr,
         BC: tl.constexpr):
    """Row ``i`` of a map from column ``c0`` at the three offsets a 3 x 3 tap reads, ``(x[c - 1], x[c], x[c + 1])``,
    each ``(HP, BC)`` fp32, hidden cells 0 (``MASKED``; else every cell read is visible).

    ``PAIRS`` (a 16-bit map of even width): word ``k`` of the row holds columns ``2k`` and ``2k + 1``; with the words
    before and after it, it gives all four columns ``2k - 1 .. 2k + 2`` the offsets need. Otherwise three loads."""
    row = i + 0 * T  # a tensor also where the interpreter's loop variable is a Python int
    ok_row = (row >= 0) & (row < T)
    if PADDED:
        ok_row = ok_row & _open(PAD, s_pb, b, row, T)
    if PAIRS:
        j = c0 + 2 * tl.arange(0, BC // 2)
        ptr = X.to(tl.pointer_type(tl.uint32)) + base + i * (T // 2) + c0 // 2 + cells
        if MASKED:  # a scalar condition joins a block through tl.where (the interpreter's & of the two is int32)
            w = tl.load(ptr, mask=lane & tl.where(ok_row, j >= 0, False)[None, :], other=0)
            after = tl.load(ptr + 1, mask=lane & tl.where(ok_row, j + 2 < T, False)[None, :], other=0)
            before = tl.load(ptr - 1, mask=lane & tl.where(ok_row, j > 0, False)[None, :], other=0)
        else:
            w = tl.load(ptr, mask=lane)
            after = tl.load(ptr + 1, mask=lane)
            before = tl.load(ptr - 1, mask=lane)
        even = _clean(_half(w, False, F16), _visible(j, i, T, PAD, s_pb, b, CAUSAL, PADDED), FIRST, MASKED)
        odd = _clean(_half(w, True, F16), _visible(j + 1, i, T, PAD, s_pb, b, CAUSAL, PADDED), FIRST, MASKED)
        right = _clean(_half(after, False, F16), _visible(j + 2, i, T, PAD, s_pb, b, CAUSAL, PADDED), FIRST, MASKED)
        left = _clean(_half(before, True, F16), _visible(j - 1, i, T, PAD, s_pb, b, CAUSAL, PADDED), FIRST, MASKED)
        return (tl.reshape(tl.join(left, even), [HP, BC]), tl.reshape(tl.join(even, odd), [HP, BC]),
                tl.reshape(tl.join(odd, right), [HP, BC]))
    else:
        c = c0 + tl.arange(0, BC)
        ptr = X + base + i * T + c0 + cells
        ok_m = tl.where(ok_row, _visible(c - 1, i, T, PAD, s_pb, b, CAUSAL, PADDED), False)
        ok_0 = tl.where(ok_row, _visible(c, i, T, PAD, s_pb, b, CAUSAL, PADDED), False)
        ok_p = tl.where(ok_row, _visible(c + 1, i, T, PAD, s_pb, b, CAUSAL, PADDED), False)
        xm = tl.load(ptr - 1, mask=lane & ok_m[None, :], other=0.0).to(tl.float32)
        x0 = tl.load(ptr, mask=lane & ok_0[None, :], other=0.0).to(tl.float32)
        xp = tl.load(ptr + 1, mask=lane & ok_p[None, :], other=0.0).to(tl.float32)
        return _clean(xm, ok_m, FIRST, False), _clean(x0, ok_0, FIRST, False), _clean(xp, ok_p, FIRST, False)


@triton.jit
def _mm(a, b, acc, MODE: tl.constexpr):
    """``a @ b + acc`` in fp32: ``"f16"`` multiplies fp16 copies (an exact copy of a 16-bit map, the weights to
    TF32's 11 significant bits, at half TF32's register and shared-memory cost), ``"bf16"`` bf16 copies (exact for
    a bf16 map and gradient), ``"tf32"``/``"ieee"`` fp32 operands at that precision."""
    if MODE == "f16":
        out = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    elif MODE == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        out = tl.dot(a, b, acc, input_precision=MODE)
    return out


@triton.jit
def _interior(i, c0, T, CAUSAL: tl.constexpr, PADDED: tl.constexpr, BC: tl.constexpr):
    """Whether row ``i`` of the strip from ``c0`` reads no hidden cell: inside the map with its halo columns and
    (causal) every column of it, the halo included, at or below the diagonal."""
    ok = (i >= 0) & (i < T) & (c0 > 0) & (c0 + BC < T) & (not PADDED)
    if CAUSAL:
        ok = ok & (c0 + BC <= i)
    return ok


@triton.jit
def _taps(W, TRANSPOSE: tl.constexpr, HP: tl.constexpr):
    """The nine taps of a padded ``(9, HP, HP)`` fp32 weight (``[out, in]``), each ``HP x HP`` (``TRANSPOSE``:
    ``[in, out]``)."""
    o = tl.arange(0, HP)
    offs = o[:, None] * HP + o[None, :] if not TRANSPOSE else o[None, :] * HP + o[:, None]
    return (tl.load(W + offs), tl.load(W + HP * HP + offs), tl.load(W + 2 * HP * HP + offs),
            tl.load(W + 3 * HP * HP + offs), tl.load(W + 4 * HP * HP + offs), tl.load(W + 5 * HP * HP + offs),
            tl.load(W + 6 * HP * HP + offs), tl.load(W + 7 * HP * HP + offs), tl.load(W + 8 * HP * HP + offs))


@triton.jit
def _keep(cols, o, T, PAD, s_pb, b, CAUSAL: tl.constexpr, PADDED: tl.constexpr):
    """The visible cells of row ``o`` (a padded row has none)."""
    keep = _visible(cols, o, T, PAD, s_pb, b, CAUSAL, PADDED)
    if PADDED:
        keep = tl.where(_open(PAD, s_pb, b, o, T), keep, False)
    return keep


@triton.jit
def _mix(y, S, Prev, Out, offs, store, alpha, beta, BETA_RES: tl.constexpr):
    """Eq. 4 on one row: ``M = R + alpha (Y - R)``, ``R`` the layer's logits (or Evolving Attention's source)."""
    res = tl.load(S + offs, mask=store, other=0.0).to(tl.float32)
    if BETA_RES:
        res = (1.0 - beta) * res + beta * tl.load(Prev + offs, mask=store, other=0.0).to(tl.float32)
    tl.store(Out + offs, (res + alpha * (y - res)).to(Out.dtype.element_ty), mask=store)


@triton.jit
def _forward(X, S, Prev, W, Bias, Out, Sign, PAD, ALPHA, BETA_W, H, T, n_blocks, s_pb, slope,
             CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr,
             BETA_RES: tl.constexpr, FINAL: tl.constexpr, NCONV: tl.constexpr, TOP: tl.constexpr,
             PAIRS: tl.constexpr, F16: tl.constexpr, PRECISION: tl.constexpr, HP: tl.constexpr, BC: tl.constexpr,
             CW: tl.constexpr):
    b, _, _, _, c0, r0, r_end, lane, cells, base, cols, out_cells, inside = _setup(H, T, n_blocks, CAUSAL, PAIRS,
                                                                                  HP, BC, CW)
    alpha = tl.load(ALPHA) if FINAL else 0.0
    beta = tl.load(BETA_W) if BETA or BETA_RES else 0.0
    if NCONV:  # the Res-Transformer: M = R + alpha (keep X - R), cell by cell
        for o in range(r0, r_end):
            keep = _keep(cols, o, T, PAD, s_pb, b, CAUSAL, PADDED)
            # whole vectors, the hidden cells zeroed after
            x = _clean(tl.load(X + out_cells + o * T, mask=inside, other=0.0).to(tl.float32), keep, FIRST, True)
            if BETA:  # Evolving Attention's source, (1 - beta) S + beta A_prev
                x = (1.0 - beta) * tl.where(keep[None, :], tl.load(S + out_cells + o * T, mask=inside, other=0.0)
                                            .to(tl.float32), 0.0) + beta * x
            _mix(x, S, Prev, Out, out_cells + o * T, inside, alpha, beta, BETA_RES)
        return
    w0, w1, w2, w3, w4, w5, w6, w7, w8 = _taps(W, False, HP)
    bias = tl.load(Bias + tl.arange(0, HP))
    zero = tl.zeros([HP, BC], tl.float32)
    later = zero  # output row i + TOP - 1: the taps of its first input row
    nearly = zero  # output row i + TOP - 2: all but its last input row
    for i in range(r0 - TOP, r_end + 2 - TOP):
        if _interior(i, c0, T, CAUSAL, PADDED, BC):
            xm, x, xp = _row(X, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, FIRST, False, PAIRS, F16,
                             HP, BC)
        else:
            xm, x, xp = _row(X, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, FIRST, True, PAIRS, F16,
                             HP, BC)
        if BETA:  # Evolving Attention's CNN input: (1 - beta) S + beta A_prev
            sm, s0, sp = _row(S, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, False, True, PAIRS,
                              F16, HP, BC)
            xm, x, xp = (1.0 - beta) * sm + beta * xm, (1.0 - beta) * s0 + beta * x, (1.0 - beta) * sp + beta * xp
        # one product a line: the machine-code audit counts a line's runs (benchmarks/sass_audit.py)
        done = _mm(w6, xm, nearly, PRECISION)
        done = _mm(w7, x, done, PRECISION)
        done = _mm(w8, xp, done, PRECISION)
        nearly = _mm(w3, xm, later, PRECISION)
        nearly = _mm(w4, x, nearly, PRECISION)
        nearly = _mm(w5, xp, nearly, PRECISION)
        later = _mm(w0, xm, zero, PRECISION)
        later = _mm(w1, x, later, PRECISION)
        later = _mm(w2, xp, later, PRECISION)
        o = i + TOP - 2
        if (o >= r0) & (o < T):
            z = done + bias[:, None]
            keep = _keep(cols, o, T, PAD, s_pb, b, CAUSAL, PADDED)[None, :]
            y = tl.where(keep, tl.where(z > 0, z, z * slope), 0.0)
            if FINAL:  # the whole row of the block: above a causal diagonal M is unspecified, so no cell mask
                _mix(y, S, Prev, Out, out_cells + o * T, inside, alpha, beta, BETA_RES)
                _signs(z, Sign, b, H, T, o, c0, HP, BC)
            else:
                tl.store(Out + out_cells + o * T, y.to(Out.dtype.element_ty), mask=inside)


@triton.jit
def _signs(z, Sign, b, H, T, o, c0, HP: tl.constexpr, BC: tl.constexpr):
    """One bit a cell, ``z > 0``, eight columns a byte (the backward's ``act'``)."""
    bits = tl.reshape((z > 0).to(tl.int32), [HP, BC // 8, 8]) << tl.arange(0, 8)[None, None, :]
    ch = tl.arange(0, HP)
    byte = c0 // 8 + tl.arange(0, BC // 8)
    row = (T + 7) // 8
    tl.store(Sign + (b.to(tl.int64) * H + ch[:, None]) * T * row + o * row + byte[None, :],
             tl.sum(bits, 2).to(tl.uint8), mask=(ch < H)[:, None] & (byte < row)[None, :])


@triton.jit
def _setup(H, T, n_blocks, CAUSAL: tl.constexpr, PAIRS: tl.constexpr, HP: tl.constexpr, BC: tl.constexpr,
           CW: tl.constexpr):
    """What every kernel here addresses its block by: the batch element, the linear block and its (column block,
    row block), its first column and row, the row past its last, the channels' lanes and cells of :func:`_row`, the
    batch element's base, the columns, the cells of the block's first row, and which of them are inside the map."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    s, q = _block(t, n_blocks, CAUSAL)
    c0, r0 = s * BC, q * BC
    ch = tl.arange(0, HP)
    lane = (ch < H)[:, None] & (tl.arange(0, CW) >= 0)[None, :]
    cells = ch[:, None] * (T * T // (2 if PAIRS else 1)) + tl.arange(0, CW)[None, :]
    base = b.to(tl.int64) * H * T * T // (2 if PAIRS else 1)
    cols = c0 + tl.arange(0, BC)
    out_cells = b.to(tl.int64) * H * T * T + ch[:, None] * T * T + cols[None, :]
    inside = (ch < H)[:, None] & (cols < T)[None, :]
    return b, t, s, q, c0, r0, tl.minimum(r0 + BC, T), lane, cells, base, cols, out_cells, inside


@triton.jit
def _input_grad(DZ, W, DX, DS, DR, Y, PAD, BETA_W, H, T, n_blocks, s_pb, slope,
                CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr,
                TOP: tl.constexpr, PAIRS: tl.constexpr, F16: tl.constexpr, PRECISION: tl.constexpr,
                HP: tl.constexpr, BC: tl.constexpr, CW: tl.constexpr):
    """Rows ``r0 .. r0 + BC`` of the input's gradient: input row ``r`` is read by output rows ``r + TOP - kr`` through
    taps ``kr``, so ``dX`` row ``i`` is done when ``dZ`` row ``i + TOP`` is in. ``FIRST``: the previous layer's logits'
    gradient (with ``BETA``, Evolving Attention's source's, split with the residual's ``DR`` into it and ``DS``); a
    causal grid's blocks above the diagonal write its zeros. Otherwise ``dZ`` of the convolution before,
    ``dX act'(Y)`` (``Y``: that convolution's output)."""
    b, t, s, q, c0, r0, r_end, lane, cells, base, cols, out_cells, inside = _setup(H, T, n_blocks, CAUSAL, PAIRS,
                                                                                   HP, BC, CW)
    if CAUSAL and s > q:  # above the diagonal (launched for the previous logits only): their gradient is 0
        for i in range(r0, r_end):
            tl.store(DX + out_cells + i * T, tl.zeros([HP, BC], DX.dtype.element_ty), mask=inside)
        return
    v0, v1, v2, v3, v4, v5, v6, v7, v8 = _taps(W, True, HP)
    zero = tl.zeros([HP, BC], tl.float32)
    later = zero  # dX row i + 1
    latest = zero  # dX row i + 2
    for i in range(r0 - 2, r_end):
        j = i + TOP  # the dZ row this step brings in
        if _interior(j, c0, T, CAUSAL, PADDED, BC):
            zm, z0, zp = _row(DZ, base, j, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, False, False, PAIRS,
                              F16, HP, BC)
        else:
            zm, z0, zp = _row(DZ, base, j, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, False, True, PAIRS,
                              F16, HP, BC)
        # dX row i: sum over taps (kr, dc) of W[kr, dc]^T dZ[i + TOP - kr, c + 1 - dc]
        done = _mm(v0, zp, later, PRECISION)
        done = _mm(v1, z0, done, PRECISION)
        done = _mm(v2, zm, done, PRECISION)
        later = _mm(v3, zp, latest, PRECISION)
        later = _mm(v4, z0, later, PRECISION)
        later = _mm(v5, zm, later, PRECISION)
        latest = _mm(v6, zp, zero, PRECISION)
        latest = _mm(v7, z0, latest, PRECISION)
        latest = _mm(v8, zm, latest, PRECISION)
        if i >= r0:
            _input_gradient(done, DX, DS, DR, Y, out_cells + i * T, inside, cols, i, T, PAD, s_pb, b, BETA_W,
                            slope, CAUSAL, PADDED, FIRST, BETA)


@triton.jit
def _weight_grad(DZ, X, S, DW, DB, PAD, BETA_W, H, T, n_blocks, s_pb,
                 CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr,
                 TOP: tl.constexpr, PAIRS: tl.constexpr, F16: tl.constexpr, PRECISION: tl.constexpr,
                 HP: tl.constexpr, BC: tl.constexpr, CW: tl.constexpr):
    """The weight and bias gradients of this block's ``dZ`` cells, summed in registers and written once: input row
    ``i`` at the three column offsets against ``dZ`` rows ``i + TOP - kr`` of the block (the two before the current
    one carried from the steps before). ``FIRST`` with ``BETA``: the CNN read Evolving Attention's source."""
    b, t, s, q, c0, r0, r_end, lane, cells, base, cols, out_cells, inside = _setup(H, T, n_blocks, CAUSAL, PAIRS,
                                                                                   HP, BC, CW)
    acc = tl.zeros([HP, 4 * HP], tl.float32)
    g0, g1, g2 = acc, acc, acc  # g_kr[out, dc * HP + in]: the three column offsets side by side (and a zero fourth)
    db = tl.zeros([HP], tl.float32)
    dz1 = tl.zeros([HP, BC], tl.float32)  # dZ row i + TOP - 1 of this block (0 outside it)
    dz2 = tl.zeros([HP, BC], tl.float32)  # dZ row i + TOP - 2
    for i in range(r0 - TOP, r_end + 2 - TOP):
        j = i + TOP
        ours = tl.where((j >= r0) & (j < r_end), inside, False)  # tl.where: the interpreter's & of the two is int32
        dz0 = tl.load(DZ + out_cells + j * T, mask=ours, other=0.0).to(tl.float32)
        db += tl.sum(dz0, 1)
        if _interior(i, c0, T, CAUSAL, PADDED, BC):
            xm, x, xp = _row(X, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, FIRST, False, PAIRS, F16,
                             HP, BC)
        else:
            xm, x, xp = _row(X, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, FIRST, True, PAIRS, F16,
                             HP, BC)
        if BETA:
            beta = tl.load(BETA_W)
            sm, s0, sp = _row(S, base, i, c0, T, lane, cells, PAD, s_pb, b, CAUSAL, PADDED, False, True, PAIRS, F16,
                              HP, BC)
            xm, x, xp = (1.0 - beta) * sm + beta * xm, (1.0 - beta) * s0 + beta * x, (1.0 - beta) * sp + beta * xp
        # [x(c-1); x(c); x(c+1); 0]^T as one (BC, 4 HP) operand: each product then fills both warps' halves of its
        # columns instead of a 16 x 16 tile both warps would compute whole
        row = tl.join(tl.join(xm, x), tl.join(xp, tl.zeros([HP, BC], tl.float32)))  # [HP, BC, 2, 2]
        row = tl.reshape(tl.permute(row, (1, 3, 2, 0)), [BC, 4 * HP])
        g0 = _mm(dz0, row, g0, PRECISION)
        g1 = _mm(dz1, row, g1, PRECISION)
        g2 = _mm(dz2, row, g2, PRECISION)
        dz2 = dz1
        dz1 = dz0
    program = (b * tl.num_programs(1) + t).to(tl.int64)
    o = tl.arange(0, HP)
    offs = program * 3 * HP * 4 * HP + o[:, None] * 4 * HP + tl.arange(0, 4 * HP)[None, :]
    tl.store(DW + offs, g0)
    tl.store(DW + 4 * HP * HP + offs, g1)
    tl.store(DW + 8 * HP * HP + offs, g2)
    tl.store(DB + program * HP + o, db)


@triton.jit
def _input_gradient(dx, DX, DS, DR, Y, offs, inside, cols, i, T, PAD, s_pb, b, BETA_W, slope,
                    CAUSAL: tl.constexpr, PADDED: tl.constexpr, FIRST: tl.constexpr, BETA: tl.constexpr):
    """Row ``i`` of the input's gradient, times its keep: the previous logits' (``FIRST``; with ``BETA`` split with
    the residual's ``DR`` into the previous and own logits'), or the ``dZ`` of the convolution before."""
    keep = _keep(cols, i, T, PAD, s_pb, b, CAUSAL, PADDED)[None, :]
    dx = tl.where(keep, dx, 0.0)
    if FIRST:
        if BETA:
            beta = tl.load(BETA_W)
            source = dx + tl.load(DR + offs, mask=inside, other=0.0).to(tl.float32)
            tl.store(DS + offs, ((1.0 - beta) * source).to(DS.dtype.element_ty), mask=inside)
            dx = beta * source
    else:
        y = tl.load(Y + offs, mask=inside, other=0.0).to(tl.float32)
        dx = tl.where(y > 0, dx, dx * slope)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=inside)


# -- the launches ---------------------------------------------------------------------------------------------
def launch_blocks(B: int, T: int, causal: bool, whole: bool = False) -> tuple[tuple[int, int], int, int]:
    """The grid (batch, blocks), the blocks a side and the blocks that compute (causal: on and below the diagonal;
    ``whole``: the grid also covers the blocks above it)."""
    n = triton.cdiv(T, BC)
    computed = n * (n + 1) // 2 if causal else n * n
    return (B, n * n if whole else computed), n, computed


def _options(x: Tensor, causal: bool, products: str) -> dict:
    """The compile-time switches every launch shares: the causal kernel's top rows, the word-pair reads (a 16-bit
    map of even width), and the products' precision (:func:`_mm`): ``products`` for a 16-bit map where TF32 is
    allowed (as cuDNN's convolutions are), TF32 for an fp32 map, exact fp32 where TF32 is off or the interpreter runs
    (whose bf16 products are wrong)."""
    pairs = x.element_size() == 2 and x.shape[-1] % 2 == 0
    if interpreting() or not torch.backends.cudnn.allow_tf32:
        precision = "ieee"
    else:
        precision = products if x.element_size() == 2 else "tf32"
    if precision == "bf16" and x.dtype == torch.float16:
        precision = "f16"
    return dict(CAUSAL=causal, TOP=2 if causal else 1, PAIRS=pairs, F16=x.dtype == torch.float16,
                PRECISION=precision, HP=HP, BC=BC, CW=BC // 2 if pairs else BC, num_warps=WARPS)


def padding(key_padding_mask: Optional[Tensor], device: torch.device) -> tuple[Tensor, int, bool]:
    if key_padding_mask is None:
        return torch.zeros(1, dtype=torch.int8, device=device), 0, False
    pad = key_padding_mask.to(torch.int8).contiguous()
    return pad, pad.stride(0), True


def padded_taps(weight: Tensor) -> Tensor:
    """A ``(H, H, 3, 3)`` weight as the kernels read it: ``(9, HP, HP)`` fp32, tap-major, ``[out, in]``, zeros
    beyond the heads."""
    h = weight.shape[0]
    taps = weight.new_zeros(9, HP, HP, dtype=torch.float32)
    taps[:, :h, :h] = weight.float().permute(2, 3, 0, 1).reshape(9, h, h)
    return taps


def sign_bits(like: Tensor) -> Tensor:
    """The buffer of the last convolution's pre-activation signs: a bit a cell, ``(B, H, T, ceil(T / 8))``."""
    B, H, T, _ = like.shape
    return torch.empty(B, H, T, triton.cdiv(T, 8), device=like.device, dtype=torch.uint8)


def conv_forward(x: Tensor, s: Tensor, prev: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                 alpha: Tensor, beta: Optional[Tensor], key_padding_mask: Optional[Tensor], causal: bool, slope: float,
                 first: bool, final: bool) -> tuple[Tensor, Optional[Tensor]]:
    """One convolution of the CNN over ``x`` (``weight`` None: none, the Res-Transformer), with the mix when
    ``final`` (``s``: the layer's own logits; ``prev``: the previous layer's, for Evolving Attention's residual).
    Returns the mixed map (``final``) or the intermediate map, in ``s``'s dtype, and the sign bits (``final`` with a
    convolution)."""
    B, H, T, _ = s.shape
    out = torch.empty_like(s)
    signs = sign_bits(s) if final and weight is not None else None
    pad, s_pb, padded = padding(key_padding_mask, s.device)
    grid, n, _ = launch_blocks(B, T, causal)
    dummy = alpha
    _forward[grid](
        x, s, prev, padded_taps(weight) if weight is not None else dummy,
        _padded_bias(bias) if bias is not None else dummy, out, signs if signs is not None else dummy, pad, alpha,
        beta if beta is not None else dummy, H, T, n, s_pb, slope, PADDED=padded, FIRST=first,
        BETA=beta is not None and first, BETA_RES=beta is not None and final, FINAL=final, NCONV=weight is None,
        **_options(s, causal, "f16"))
    return out, signs


def _padded_bias(bias: Tensor) -> Tensor:
    out = bias.new_zeros(HP, dtype=torch.float32)
    out[:bias.shape[0]] = bias.float()
    return out


def conv_backward(dz: Tensor, x: Tensor, s: Tensor, weight: Tensor, y: Optional[Tensor], beta: Optional[Tensor],
                  key_padding_mask: Optional[Tensor], causal: bool, slope: float, first: bool,
                  ds: Optional[Tensor], dr: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of one convolution from its pre-activation's gradient ``dz``: ``(grad of x, of the weight, of
    the bias)``. ``first``: the grad of ``x`` is the previous layer's logits' (with ``beta``, the CNN read the source
    ``(1 - beta) s + beta x``, whose gradient, with the residual's ``dr``, splits into it and ``ds``); otherwise it is
    the ``dZ`` of the convolution before, whose output ``y`` it reads for the activation's derivative.

    Two passes: the input's gradient multiplies fp32 weights (TF32: a gradient's small values would underflow fp16),
    the weight gradient 16-bit copies of the 16-bit ``dZ`` and input (exact products)."""
    B, H, T, _ = dz.shape
    pad, s_pb, padded = padding(key_padding_mask, dz.device)
    has_beta = beta is not None and first
    dx = torch.empty_like(x)
    grid, n, computed = launch_blocks(B, T, causal, whole=first)  # the previous logits' gradient is 0 above a diagonal
    _input_grad[grid](
        dz, padded_taps(weight), dx, ds if has_beta else dx, dr if has_beta else dx, y if y is not None else dx,
        pad, beta if beta is not None else dx, H, T, n, s_pb, slope, PADDED=padded, FIRST=first, BETA=has_beta,
        **_options(dz, causal, "tf32"))
    dw_parts = torch.empty(B * computed, 3, HP, 4, HP, device=dz.device, dtype=torch.float32)  # [kr, out, dc, in]
    db_parts = torch.empty(B * computed, HP, device=dz.device, dtype=torch.float32)
    _weight_grad[(B, computed)](
        dz, x, s if has_beta else x, dw_parts, db_parts, pad, beta if beta is not None else dx, H, T, n, s_pb,
        PADDED=padded, FIRST=first, BETA=has_beta, **_options(dz, causal, "bf16"))
    h = weight.shape[0]
    dw = dw_parts.sum(0)[:, :h, :3, :h].permute(1, 3, 0, 2)  # [out, in, kr, dc]
    return dx, dw.contiguous(), db_parts.sum(0)[:h]
