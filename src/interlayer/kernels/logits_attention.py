"""Attention from given logits: ``softmax(masked logits) @ v``, flash-style, for methods that must see the maps.

Why a kernel: a cross-layer method that reads or rewrites attention logits (Predictive Attention's CNN over the
previous layer's maps) cannot use the library's flash attention, which never materialises them, and the eager
path (fp32 upcast, additive mask, softmax, downcast, product, and all of it again backward) moves each
``B x H x T x T`` map about ten times. Here the logits are the only map in memory: the forward reads them once with
an online softmax (never writing the probabilities), the backward reads them once more and writes their gradient
once. A causal map's blocks above the diagonal are neither read nor computed.

Cost model for a ``(B, H, T, T)`` map of N cells in a 16-bit dtype: forward reads ``2 N`` bytes (``N`` causal),
backward reads ``2 N`` and writes ``2 N`` (the gradient's upper blocks are written as zeros, since a matrix product
reads them). The eager reference: about ``2 N`` (read) + ``4 N`` (fp32 copy) + ``4 N`` (mask add) + ``4 N``
(softmax) + ``2 N`` (downcast) forward, twice that backward.

The semantics are the core's eager attention (:mod:`interlayer.core.attention`): masked cells are excluded, a row
with no allowed key outputs zeros (never NaN), probabilities are rounded to ``v``'s dtype before the product with
``v``. The backward's ``logits_grad`` (:func:`.logits_attention_triton.backward`) lets a caller add a gradient
that arrives for the logits from elsewhere (the next layer of a chain of maps, :mod:`.predictive_maps`) inside the
same pass, instead of a separate addition over the map.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .dispatch import use_triton
from .ops import kernel_op


def allowed_cells(key_padding_mask: Optional[Tensor], t_q: int, t_k: int, causal: bool, device: torch.device
                  ) -> Optional[Tensor]:
    """Boolean ``(B|1, 1, Tq, Tk)``: True where query i may attend key j (queries at positions 0..Tq-1)."""
    allowed = None
    if causal:
        allowed = (torch.arange(t_k, device=device)[None, :] <= torch.arange(t_q, device=device)[:, None])[None, None]
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


def reference(logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> Tensor:
    """The core's eager attention over ``logits`` ``(B, H, Tq, Tk)``: masked softmax in fp32 (float64 for float64
    logits), probabilities in ``v``'s dtype, a row with no allowed key set to zero."""
    allowed = allowed_cells(key_padding_mask, logits.shape[-2], logits.shape[-1], causal, logits.device)
    masked = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if allowed is not None:
        masked = masked.masked_fill(~allowed, torch.finfo(torch.float32).min)
    out = torch.softmax(masked, dim=-1).to(v.dtype) @ v
    if allowed is not None:
        out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return out


def _fake(logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> tuple[Tensor, Tensor]:
    b, h, t_q, _ = logits.shape
    return v.new_empty(b, h, t_q, v.shape[-1]), logits.new_empty(b, h, t_q, dtype=torch.float32)


def _backward(grad_out: Tensor, logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], out: Tensor,
              lse: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """The gradients of the logits and of ``v``."""
    from . import logits_attention_triton as kernels

    return kernels.backward(grad_out, logits, v, key_padding_mask, out, lse, causal, None)


def _backward_fake(grad_out: Tensor, logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], out: Tensor,
                   lse: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(logits), v.new_empty(v.shape)


# The kernel's outputs: the attention and each row's log-sum-exp (for the backward; it takes no gradient).
@kernel_op("interlayer::logits_attention", fake=_fake, backward=_backward, backward_fake=_backward_fake,
           save=lambda logits, v, key_padding_mask, causal, output: (logits, v, key_padding_mask, *output, causal),
           grads=lambda grad_out, grad_lse: (grad_out,), differentiable=("logits", "v"))
def _forward_op(logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], causal: bool
                ) -> tuple[Tensor, Tensor]:
    from . import logits_attention_triton as kernels

    return kernels.forward(logits, v, key_padding_mask, causal)


def covers(logits: Tensor, v: Tensor, causal: bool) -> bool:
    """What the kernel handles: contiguous 4-D logits, a head size up to 256, causal only over a square map."""
    return (logits.dim() == 4 and logits.is_contiguous() and v.shape[-1] <= 256
            and (not causal or logits.shape[-2] == logits.shape[-1]))


def logits_attention(logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None,
                     causal: bool = False) -> Tensor:
    """``softmax(logits masked) @ v`` for ``logits`` ``(B, H, Tq, Tk)``, ``v`` ``(B, H, Tk, D)``;
    ``key_padding_mask`` ``(B, Tk)`` True at padding. The kernel where :func:`use_triton` allows, else the
    reference."""
    if not use_triton(logits, v, covered=covers(logits, v, causal), kernel="logits-attention"):
        return reference(logits, v, key_padding_mask, causal)
    return _forward_op(logits, v, key_padding_mask, causal)[0]
