"""Label-smoothed cross-entropy over 16-bit logits with fp32 accumulation and no fp32 copy of the logits.

Why a kernel: at GPT-2 small (16 x 1,024 tokens, 50,304 classes) the logits are 1.6 GB in bf16. The reference path
(``F.log_softmax(logits.float())``) materialises a 3.3 GB fp32 copy, a 3.3 GB log-softmax and their backward: on
one H100 the eager loss took 13 ms of a 54 ms GPT-2-small step (docs/benchmarks.md). The per-token loss is

    loss_i = lse_i - (1 - eps) x_{i, t_i} - eps mean_v x_{i, v},   nll_i = lse_i - x_{i, t_i}

(``lse`` the log-sum-exp of the row; PyTorch's ``label_smoothing`` form), and its gradient with respect to the row
is ``softmax(x_i) - (1 - eps) onehot(t_i) - eps / V``, so one pass over the logits gives the forward (the row's
maximum, sum of exponentials, sum and target logit, accumulated in fp32) and one the backward (read a row, write its
gradient in the logits' dtype).

Cost model (N rows, V classes, 16-bit logits): the kernel reads ``2 N V`` bytes forward and reads and writes
``4 N V`` backward; the eager reference moves about ``30 N V`` (the upcast copy, the log-softmax, the mean and the
gather forward, their backward in fp32, the downcast). Inside ``torch.compile`` the reference runs: inductor fuses
it into the same single-pass reductions, so the kernel would add nothing there (measured: 1.2 ms for the compiled
loss at GPT-2 small).

Rows are addressed through a ``(B, T, V)`` view with any strides on B and T, so the causal LM's shifted
``logits[:, :-1]`` and ``labels[:, 1:]`` are read in place, without the copy a ``reshape`` would make.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import use_triton


def reference(logits: Tensor, target: Tensor, smoothing: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Per-token ``(loss, nll)`` in fp32, zero where ``target == ignore_index``: one fp32 log-softmax over the
    logits (what the compiled step fuses, and the path everywhere the kernel does not run). A target outside
    ``[0, V)`` reads no class (``gather`` of class 0 scored -5 as class 0, and raised for V) and gives NaN, as in
    the kernel: the host refuses such labels before a step (``core.losses.check_labels``), and a NaN loss stops a
    compiled run at its next log instead of training on another class's logit."""
    classes = logits.shape[-1]
    lprobs = F.log_softmax(logits.reshape(-1, classes).float(), dim=-1)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    inside = target.ge(0) & target.lt(classes)
    nll = -lprobs.gather(1, target.where(inside, 0)[:, None]).squeeze(1)
    nll = nll.masked_fill(keep & ~inside, float("nan"))
    loss = nll if not smoothing else (1.0 - smoothing) * nll - smoothing * lprobs.mean(-1)
    return loss.masked_fill(~keep, 0.0), nll.detach().masked_fill(~keep, 0.0)


def _as_rows(t: Tensor, dims: int) -> Tensor:
    """``t`` as a ``(B, T, ...)`` view (``dims`` = 3 for logits, 2 for targets): a leading 1 added, never a copy."""
    return t if t.dim() == dims else t.unsqueeze(0)


class _CrossEntropy(torch.autograd.Function):
    """The Triton forward and backward (``cross_entropy_triton``); ``nll`` is returned for the logs, detached."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, smoothing: float, ignore_index: int,
                block: int) -> tuple[Tensor, Tensor]:
        from . import cross_entropy_triton

        lse, loss, nll = cross_entropy_triton.forward(logits, target, smoothing, ignore_index, block)
        ctx.save_for_backward(logits, target, lse)
        ctx.smoothing, ctx.ignore_index, ctx.block = smoothing, ignore_index, block
        ctx.mark_non_differentiable(nll)
        return loss.reshape(-1), nll.reshape(-1)

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Any, ...]:
        from . import cross_entropy_triton

        logits, target, lse = ctx.saved_tensors
        grad = cross_entropy_triton.backward(logits, target, lse, grad_loss.reshape(lse.shape).float(),
                                             ctx.smoothing, ctx.ignore_index, ctx.block)
        return grad, None, None, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, smoothing: float = 0.0, ignore_index: int = -100,
                           *, block: int = 4096) -> tuple[Tensor, Tensor]:
    """Per-token ``(loss, nll)``, flattened, fp32, zero where ``target == ignore_index``; ``logits`` ``(..., V)``
    and ``target`` of its leading shape. The Triton kernel in eager mode on a GPU (:func:`use_triton`), the
    reference elsewhere and always inside ``torch.compile`` (module doc). ``block``: the kernel's tile of classes."""
    if torch.compiler.is_compiling() or not use_triton(logits, target, kernel="cross-entropy",
                                                       covered=logits.dim() in (2, 3)):
        return reference(logits, target, smoothing, ignore_index)
    return _CrossEntropy.apply(_as_rows(logits, 3), _as_rows(target, 2), float(smoothing), int(ignore_index),
                               block)
