"""Input embedding: token table (optionally shared), absolute positions, segments, optional LayerNorm, dropout.

Inputs may also arrive as ready vectors (``inputs_embeds``: image patches, graph node features), in which case
only positions, LayerNorm and dropout apply, so the same encoder serves text and non-text tasks.

``position_start="after_pad"`` is RoBERTa's numbering (fairseq ``make_positions``, ``transformers``'
``create_position_ids_from_input_ids``): the non-padding tokens of each row count up from ``pad_id + 1`` and
every padding token reads row ``pad_id``, wherever the padding sits; ready vectors have no padding to skip and
count from ``pad_id + 1`` in order (``create_position_ids_from_inputs_embeds``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import TransformerConfig
from .positions import LearnedPositions, SinusoidalPositions


def make_token_embedding(vocab_size: int, d_model: int, pad_id: int) -> nn.Embedding:
    table = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
    nn.init.normal_(table.weight, mean=0.0, std=d_model**-0.5)
    nn.init.zeros_(table.weight[pad_id])
    return table


class InputEmbedding(nn.Module):
    """A stack's input: the token table (scaled by sqrt(d) with ``embed_scale``), absolute positions (sinusoidal or
    learned, numbered from 0 or RoBERTa's way after the pad id; relative and rotary positions live in the attention),
    segment embeddings for sentence pairs, then the optional LayerNorm and dropout."""

    def __init__(self, cfg: TransformerConfig, tokens: Optional[nn.Embedding]) -> None:
        super().__init__()
        self.tokens = tokens
        self.pad_id = cfg.pad_id
        self.after_pad = cfg.position_start == "after_pad"
        self.scale = math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0
        if cfg.positions == "sinusoidal":
            self.positions: Optional[nn.Module] = SinusoidalPositions(cfg.d_model, cfg.max_positions)
        elif cfg.positions == "learned":
            self.positions = LearnedPositions(cfg.d_model, cfg.max_positions)
        else:
            self.positions = None  # relative positions live inside attention; "none" has no positions
        self.segments = nn.Embedding(cfg.n_segments, cfg.d_model) if cfg.n_segments else None
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.embed_layer_norm else None
        self.dropout = nn.Dropout(cfg.dropout if cfg.embed_dropout is None else cfg.embed_dropout)

    def forward(self, tokens: Optional[Tensor] = None, *, inputs_embeds: Optional[Tensor] = None,
                segments: Optional[Tensor] = None, offset: int = 0, position_ids: Optional[Tensor] = None
                ) -> Tensor:
        """``offset``: position of the first token (incremental decoding); ``position_ids`` (B, T) instead gives
        each token its own absolute position (left-padded batches, where a row's first real token is position 0)."""
        if (tokens is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of tokens (B, T) or inputs_embeds (B, T, d_model)")
        if tokens is not None:
            if self.tokens is None:
                raise ValueError("this model has no token embedding (it reads inputs_embeds)")
            x = self.tokens(tokens) * self.scale
        else:
            x = inputs_embeds
        if self.positions is not None and position_ids is not None:
            x = x + self.positions.lookup(position_ids)
        elif self.positions is not None and self.after_pad:
            x = x + self._positions_after_pad(tokens, x.shape[1], offset)
        elif self.positions is not None:
            x = x + self.positions(x.shape[1], offset)
        if self.segments is not None:
            # Without segment ids every token is in segment 0, as BERT's token_type_ids default.
            x = x + (self.segments(segments) if segments is not None else self.segments.weight[0])
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)

    def _positions_after_pad(self, tokens: Optional[Tensor], length: int, offset: int) -> Tensor:
        """RoBERTa's positions (see the module docstring): ``(B, T, d)`` for tokens, ``(T, d)`` for vectors."""
        first = self.pad_id + 1
        if tokens is None:
            return self.positions(length, offset + first)
        table = self.positions.weight
        if first + offset + length > table.shape[0]:
            raise ValueError(f"sequence needs positions up to {first + offset + length - 1} (RoBERTa numbering from "
                             f"pad_id + 1 = {first}) but the model has max_positions={table.shape[0]}; truncate the "
                             "input")
        keep = tokens.ne(self.pad_id).to(torch.long)
        ids = (torch.cumsum(keep, dim=1) + offset) * keep + self.pad_id
        return F.embedding(ids, table)
