"""A causal map's logits ``S = scale q k^T`` on and below the diagonal only, for methods that must read them.

Why a kernel: a library matrix product writes ``S`` whole, and its backward reads ``dS`` whole twice (``dq = dS k``,
``dk = dS^T q``), though above a causal diagonal nothing reads ``S`` and its gradient there is zero: at GPT-2 small
(batch 8 x 1,024, 12 heads, bf16) half of 200 MB written and of 400 MB read a layer. Here the blocks above the
diagonal are neither computed, written nor read (half the products too). Above the diagonal the returned map is
unspecified; the one consumer that takes it (:func:`interlayer.kernels.predictive_maps.predictive_attention_qk`)
reads it on and below the diagonal only, and gives it a gradient only there.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .ops import kernel_op


def reference(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """The whole map, ``(q scale) k^T``, as the core's attention computes it."""
    return torch.matmul(q * scale, k.transpose(-2, -1))


def _fake(q: Tensor, k: Tensor, scale: float) -> Tensor:
    b, h, t, _ = q.shape
    return q.new_empty(b, h, t, t)


def _backward(grad: Tensor, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """``(dq, dk)`` from the map's gradient on and below the diagonal."""
    from . import causal_logits_triton as kernels

    return kernels.backward(grad, q, k, scale)


def _backward_fake(grad: Tensor, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    # contiguous, as the kernels write them, whatever q's and k's strides (views of one qkv projection, usually):
    # a fake whose strides differ fails inductor's stride assertion on a GPU
    return q.new_empty(q.shape), k.new_empty(k.shape)


@kernel_op("interlayer::causal_logits", fake=_fake, backward=_backward, backward_fake=_backward_fake,
           save=lambda q, k, scale, out: (q, k, scale), grads=lambda grad: (grad.contiguous(),),
           differentiable=("q", "k"))
def causal_logits(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``scale q k^T`` of ``(B, H, T, D)`` queries and keys, on and below the diagonal (the kernel)."""
    from . import causal_logits_triton as kernels

    return kernels.forward(q, k, scale)
