"""Position information: absolute tables added to the input, relative biases added to attention logits, and
rotary positions applied to queries and keys.

Relative positions follow Shaw et al. (2018) on the key side only, which is the form the Predictive Attention
paper writes (PA Eq. 2: ``r_ij = q_i^T e_{i-j}``); the image form is PA Eq. 3, one table for height offsets and
one for width offsets (Bello et al. 2019). Both produce a bias of shape ``(B, H, Tq, Tk)`` that the attention
module adds to its logits, so they work with the fused and the eager attention path alike.

Rotary positions (RoPE, Su et al. 2021, "RoFormer", Sec. 3.4) are the third kind of attention-side position: a
module the ``relative`` factory hands to attention that, instead of a bias, *rotates* queries and keys
(``rotates = True``), so the logit ``q_i . k_j`` depends on ``i - j`` only.
"""
from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor, nn


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos table (Vaswani et al. 2017, Sec. 3.5); no parameters, any length up to ``max_len``."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * inv_freq)
        table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        _check_length(length + offset, self.table.shape[0])
        return self.table[offset : offset + length]

    def lookup(self, position_ids: Tensor) -> Tensor:
        """Rows of the table for per-token positions (B, T) -> (B, T, d); the caller keeps them in range."""
        return nn.functional.embedding(position_ids, self.table)


class LearnedPositions(nn.Module):
    """A trained table of absolute positions (BERT, fairseq ``learned_pos``)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        _check_length(length + offset, self.weight.shape[0])
        return self.weight[offset : offset + length]

    def lookup(self, position_ids: Tensor) -> Tensor:
        """Rows of the table for per-token positions (B, T) -> (B, T, d); the caller keeps them in range."""
        return nn.functional.embedding(position_ids, self.weight)


class RelativePositionBias(nn.Module):
    """Shaw et al. (2018) key-side relative positions: ``bias[b,h,i,j] = q_i . e[clip(j - i, -k, k)]``.

    One table of ``2k+1`` vectors of the per-head query width, shared across heads (as in Shaw et al.);
    each attention module owns its own table. Offsets beyond ``k`` share the edge vector.
    """

    def __init__(self, head_dim: int, max_distance: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.embeddings = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim))
        nn.init.normal_(self.embeddings, std=head_dim**-0.5)

    def forward(self, q: Tensor, q_offset: Union[int, Tensor], k_len: int) -> Tensor:
        """``q``: (B, H, Tq, dh) already scaled as the logits are, its rows at positions ``q_offset ..`` (a 0-dim
        tensor in fixed-shape decoding). Returns (B, H, Tq, Tk)."""
        t_q = q.shape[2]
        scores = q @ self.embeddings.t()  # (B, H, Tq, 2k+1)
        i = offset_positions(q_offset, t_q, q.device).unsqueeze(1)
        j = torch.arange(k_len, device=q.device).unsqueeze(0)
        index = (j - i).clamp(-self.max_distance, self.max_distance) + self.max_distance
        return scores.gather(-1, index.expand(*scores.shape[:2], t_q, k_len))

    def madds(self, t_q: int, t_k: int, n_heads: int) -> int:
        return n_heads * t_q * self.embeddings.shape[0] * self.embeddings.shape[1]


class RelativePositionBias2D(nn.Module):
    """PA Eq. 3: ``r_ij = q_i . e^H[h(j)-h(i)] + q_i . e^W[w(j)-w(i)]`` over a ``height x width`` token grid.

    Tokens are in raster order. A sequence may carry ``T - height*width`` leading prefix tokens (a CLS token):
    they have no place on the grid, so every bias that involves them is zero. Offsets are not clipped beyond the
    grid (the tables cover ``-(H-1)..H-1`` and ``-(W-1)..W-1``).
    """

    def __init__(self, head_dim: int, height: int, width: int) -> None:
        super().__init__()
        self.height, self.width = height, width
        self.e_h = nn.Parameter(torch.empty(2 * height - 1, head_dim))
        self.e_w = nn.Parameter(torch.empty(2 * width - 1, head_dim))
        nn.init.normal_(self.e_h, std=head_dim**-0.5)
        nn.init.normal_(self.e_w, std=head_dim**-0.5)
        rows = torch.arange(height).repeat_interleave(width)
        cols = torch.arange(width).repeat(height)
        self.register_buffer("h_index", (rows[None, :] - rows[:, None]) + height - 1, persistent=False)
        self.register_buffer("w_index", (cols[None, :] - cols[:, None]) + width - 1, persistent=False)

    def forward(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        cells = self.height * self.width
        prefix = k_len - cells
        if prefix < 0 or q_offset != 0 or q.shape[2] != k_len:
            raise ValueError(f"2-D relative positions need a full self-attention over {self.height}x{self.width}"
                             f" grid tokens (plus optional prefix tokens); got query length {q.shape[2]},"
                             f" key length {k_len}")
        grid_q = q[:, :, prefix:]
        b, h, n, _ = grid_q.shape
        s_h = (grid_q @ self.e_h.t()).gather(-1, self.h_index.expand(b, h, n, n))
        s_w = (grid_q @ self.e_w.t()).gather(-1, self.w_index.expand(b, h, n, n))
        grid_bias = s_h + s_w
        if prefix == 0:
            return grid_bias
        return nn.functional.pad(grid_bias, (prefix, 0, prefix, 0))

    def madds(self, t_q: int, t_k: int, n_heads: int) -> int:
        cells = self.height * self.width
        return n_heads * cells * (self.e_h.shape[0] + self.e_w.shape[0]) * self.e_h.shape[1]


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021, Eq. 34): feature pair ``(x_2i, x_2i+1)`` of a query or key at position ``m`` is
    rotated by the angle ``m theta_i``, ``theta_i = base^(-2i/d)`` (``d``: the per-head query/key width).

    Pairs are adjacent features as in the paper's Eq. 34 (GPT-NeoX and Hugging Face's LLaMA pair feature ``i`` with
    ``i + d/2`` instead; the two differ by a fixed permutation of the q/k projection rows). Because
    ``R(m)^T R(n) = R(n - m)``, the logit between positions ``m`` and ``n`` depends only on ``n - m``: a shifted
    sequence (left padding, a cache offset) gets the same logits. No parameters; the angle tables are buffers
    that are not saved. Element-wise, so it adds no multiply-adds to the MAdds convention (``madds`` is 0).
    """

    rotates = True  # read by the attention module: rotate q and k instead of adding a logit bias

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions rotate feature pairs, so the per-head query/key width must be even, "
                             f"got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float64).unsqueeze(1) * inv_freq  # (max_len, d/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: Union[int, Tensor] = 0) -> Tensor:
        """``x`` (B, H, T, d) at positions ``offset .. offset + T - 1`` -> the rotated (B, H, T, d). ``offset`` is a
        0-dim tensor in fixed-shape decoding (its range is then the caller's to keep: checking it would sync)."""
        length = x.shape[-2]
        if isinstance(offset, Tensor):
            rows = offset_positions(offset, length, x.device)
            cos, sin = self.cos[rows].to(x.dtype), self.sin[rows].to(x.dtype)
        else:
            _check_length(length + offset, self.cos.shape[0])
            cos = self.cos[offset : offset + length].to(x.dtype)
            sin = self.sin[offset : offset + length].to(x.dtype)
        pairs = x.unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def madds(self, t_q: int, t_k: int, n_heads: int) -> int:
        return 0


def offset_positions(offset: Union[int, Tensor], length: int, device: torch.device) -> Tensor:
    """``offset, offset + 1, ..., offset + length - 1`` on ``device``: the positions of ``length`` rows from
    ``offset``, a number or a 0-dim tensor (fixed-shape decoding, where the arithmetic stays on the device)."""
    if isinstance(offset, Tensor):
        return offset + torch.arange(length, device=device)
    return torch.arange(offset, offset + length, device=device)


def _check_length(needed: int, available: int) -> None:
    if needed > available:
        raise ValueError(f"sequence needs {needed} positions but the model has max_positions={available}; "
                         "raise max_positions in the config or truncate the input")
