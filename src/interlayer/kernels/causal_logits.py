"""A causal map's logits ``S = scale q k^T`` on and below the diagonal only, for methods that must read them.

Why a kernel: a library matrix product writes ``S`` whole, and its backward reads ``dS`` whole twice (``dq = dS k``,
``dk = dS^T q``), though above a causal diagonal nothing reads ``S`` and its gradient there is zero: at GPT-2 small
(batch 8 x 1,024, 12 heads, bf16) half of 200 MB written and of 400 MB read a layer. Here the blocks above the
diagonal are neither computed, written nor read (half the products too). Above the diagonal the returned map is
unspecified; the one consumer that takes it (:func:`interlayer.kernels.predictive_maps.predictive_attention_qk`)
reads it on and below the diagonal only, and gives it a gradient only there.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def reference(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """The whole map, ``(q scale) k^T``, as the core's attention computes it."""
    return torch.matmul(q * scale, k.transpose(-2, -1))


@torch.library.custom_op("interlayer::causal_logits", mutates_args=())
def causal_logits(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``scale q k^T`` of ``(B, H, T, D)`` queries and keys, on and below the diagonal (the kernel)."""
    from . import causal_logits_triton as kernels

    return kernels.forward(q, k, scale)


@causal_logits.register_fake
def _(q: Tensor, k: Tensor, scale: float) -> Tensor:
    b, h, t, _ = q.shape
    return q.new_empty(b, h, t, t)


@torch.library.custom_op("interlayer::causal_logits_backward", mutates_args=())
def backward_op(grad: Tensor, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """``(dq, dk)`` from the map's gradient on and below the diagonal."""
    from . import causal_logits_triton as kernels

    return kernels.backward(grad, q, k, scale)


@backward_op.register_fake
def _(grad: Tensor, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    # contiguous, as the kernels write them, whatever q's and k's strides (views of one qkv projection, usually):
    # a fake whose strides differ fails inductor's stride assertion on a GPU
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    q, k, scale = inputs
    ctx.save_for_backward(q, k)
    ctx.scale = scale


def _grad(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    q, k = ctx.saved_tensors
    dq, dk = backward_op(grad.contiguous(), q, k, ctx.scale)
    return dq, dk, None


causal_logits.register_autograd(_grad, setup_context=_setup)
