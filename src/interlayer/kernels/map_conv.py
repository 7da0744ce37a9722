"""Predictive Attention's map convolution as registered operators, for the PyTorch path (CPUs; GPUs where the
Triton kernels of :mod:`.predictive_maps` are not used): one convolution layer of the prediction CNN,
``act(conv2d(pad(x), weight, bias)) * keep``, hidden cells zeroed, with a backward written out as what it is.

:func:`reference` is the same layer op by op, the CNN's one layer of :mod:`.predictive_cnn` (the library's padding,
convolution and activation), what ``tests/test_fast_paths.py`` holds these operators to, forward and gradient.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import conv_flop_count, register_flop_formula

from .ops import kernel_op
from .predictive_cnn import conv_layer


def reference(x: Tensor, weight: Tensor, bias: Tensor, keep: Optional[Tensor], pads: list[int],
              negative_slope: float) -> Tensor:
    """:func:`map_conv_relu`'s arguments handed to the CNN's one layer, op by op
    (:func:`.predictive_cnn.conv_layer`): the cells where the float mask ``keep`` is 0 are the hidden ones."""
    return conv_layer(x, weight, bias, None if keep is None else keep == 0, pads, negative_slope)


class VisibleCells(torch.autograd.Function):
    """The CNN's input: non-finite values and hidden cells (``keep == 0``) set to zero, in two passes.

    The reference path's ``masked_fill(~isfinite(x))`` and ``masked_fill(hidden)`` cost about ten passes over the
    map with their backward (``isfinite`` alone is four). Here ``nan_to_num`` zeroes non-finite values in one
    pass and a multiply by the float ``keep`` mask zeroes the hidden cells; the backward multiplies by ``keep``.
    It does not zero the gradient of a *visible* non-finite logit: such a logit is also in its own layer's
    softmax, so the loss is already non-finite and the run stops as diverged; a hidden non-finite logit (a
    padded or future key) gets zero gradient on both paths.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(keep)
        out = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        return out if keep is None else out.mul_(keep)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None]:
        keep, = ctx.saved_tensors
        return (grad if keep is None else grad * keep), None


# One layer of the prediction CNN: ``ReLU(conv2d(pad(x), weight, bias)) * keep``, hidden cells zeroed.
#
# Why operators of their own: the CNN has few channels (the heads, e.g. 4) over large maps (T x T), the shape the
# library convolutions are least tuned for. On the project's CPU the generic convolution backward took 5x its
# forward, almost all of it in the input gradient. Here the backward is written out as what it is: the input
# gradient is the forward convolution of the output gradient with the flipped, transposed kernel (one more
# forward-speed convolution), the weight gradient the library's weight-only backward. The ReLU and the zeroed cells
# need no mask of their own in the backward: the gradient passes where the saved output is positive, which is
# exactly the visible cells where the ReLU was active (``threshold_backward``, ReLU's own). The convolutions read
# their maps in channels-last layout (heads innermost), which oneDNN runs 1.3-1.6x faster than the default layout
# for this shape (measured); cuDNN takes it as well. What leaves is in the default layout again, because the
# elementwise operations that follow (Eq. 4's mix, the softmax) slow down when their inputs' layouts differ.
# Saved for backward: the padded input and the output. ``pads`` is ``(left, right, top, bottom)``; ``keep`` a float
# mask broadcastable to the output, or None when every cell is visible.
#
# They are registered operators (``torch.library.custom_op``), not an ``autograd.Function``, so that
# ``torch.compile`` keeps them whole (no graph break: the fake implementations give the shapes): traced through,
# inductor fused the padding and layout change into the neighbouring softmax's kernel, which then ran 5x slower
# than in eager mode (measured on the project's CPU).
#
def _fake(x: Tensor, weight: Tensor, bias: Tensor, keep: Optional[Tensor], pads: list[int], negative_slope: float
          ) -> tuple[Tensor, Tensor]:
    left, right, top, bottom = pads
    b, _, h, w = x.shape
    k_rows, k_cols = weight.shape[-2:]
    padded = torch.empty(b, x.shape[1], h + top + bottom, w + left + right, dtype=x.dtype, device=x.device,
                         memory_format=torch.channels_last)
    return x.new_empty(b, weight.shape[0], h + top + bottom - k_rows + 1, w + left + right - k_cols + 1), padded


def _backward(grad: Tensor, padded: Tensor, weight: Tensor, out: Tensor, keep: Optional[Tensor], pads: list[int],
              negative_slope: float, needs: list[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`map_conv_relu` w.r.t. ``x``, ``weight`` and ``bias`` (zeros where ``needs`` is False).

    With the ReLU the gradient passes where the output is positive, which excludes the hidden cells; a leaky
    ReLU passes ``slope x`` the gradient elsewhere, so the hidden cells are then zeroed with ``keep``."""
    if negative_slope:
        grad = torch.ops.aten.leaky_relu_backward(grad, out, negative_slope, True)
        grad = grad if keep is None else grad * keep
    else:
        grad = torch.ops.aten.threshold_backward(grad, out, 0.0)
    left, right, top, bottom = pads
    k_rows, k_cols = weight.shape[-2:]
    grad_x = grad_w = grad_b = None
    if needs[0]:
        full = _pad_channels_last(grad, [k_cols - 1 - left, k_cols - 1 - right, k_rows - 1 - top,
                                         k_rows - 1 - bottom])
        grad_x = F.conv2d(full, weight.flip(2, 3).transpose(0, 1)).contiguous()
    if needs[1] or needs[2]:
        _, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad.contiguous(memory_format=torch.channels_last), padded, weight, [weight.shape[0]], [1, 1], [0, 0],
            [1, 1], False, [0, 0], 1, [False, needs[1], needs[2]])
    b, c = padded.shape[:2]
    return (grad_x if grad_x is not None else grad.new_zeros(b, c, out.shape[2], out.shape[3]),
            grad_w.contiguous() if grad_w is not None else torch.zeros_like(weight),
            grad_b if grad_b is not None else weight.new_zeros(weight.shape[0]))


def _backward_fake(grad: Tensor, padded: Tensor, weight: Tensor, out: Tensor, keep: Optional[Tensor], pads: list[int],
                   negative_slope: float, needs: list[bool]) -> tuple[Tensor, Tensor, Tensor]:
    return (grad.new_empty(padded.shape[0], padded.shape[1], out.shape[2], out.shape[3]),
            torch.empty_like(weight, memory_format=torch.contiguous_format),
            weight.new_empty(weight.shape[0]))


def _save(x: Tensor, weight: Tensor, bias: Tensor, keep: Optional[Tensor], pads: list[int], negative_slope: float,
          output: tuple[Tensor, Tensor]) -> tuple:
    out, padded = output
    return padded, weight, out, keep, pads, negative_slope


@kernel_op("interlayer::map_conv_relu", fake=_fake, backward=_backward, backward_fake=_backward_fake, save=_save,
           grads=lambda grad, grad_padded: (grad,), differentiable=("x", "weight", "bias"), needs=True)
def map_conv_relu(x: Tensor, weight: Tensor, bias: Tensor, keep: Optional[Tensor], pads: list[int],
                  negative_slope: float) -> tuple[Tensor, Tensor]:
    """The layer's output and its padded input (kept for the backward); ``negative_slope`` 0 is the ReLU."""
    padded = _pad_channels_last(x, pads)
    out = F.leaky_relu_(F.conv2d(padded, weight, bias), negative_slope).contiguous()
    if keep is not None:
        out.mul_(keep)
    return out, padded


# FLOP counts for torch.utils.flop_counter, which cannot see inside a registered operator: the convolution's, as
# the library convolution would report it (so FlopCounterMode keeps agreeing with ``count_madds``); the backward
# is two convolutions of the same size (input and weight gradient), as the library's backward counts.
@register_flop_formula(torch.ops.interlayer.map_conv_relu)
def _map_conv_relu_flops(x_shape: Any, weight_shape: Any, bias_shape: Any, keep_shape: Any, pads: list[int],
                         negative_slope: float, *, out_shape: Any, **kwargs: Any) -> int:
    return conv_flop_count(list(x_shape), list(weight_shape), list(out_shape[0]))


@register_flop_formula(torch.ops.interlayer.map_conv_relu_backward)
def _map_conv_relu_backward_flops(grad_shape: Any, padded_shape: Any, weight_shape: Any, out_shape_in: Any,
                                  keep_shape: Any, pads: list[int], negative_slope: float, needs: list[bool], *,
                                  out_shape: Any, **kwargs: Any) -> int:
    one = conv_flop_count(list(padded_shape), list(weight_shape), list(grad_shape))
    return one * (int(needs[0]) + int(needs[1]))


def _pad_channels_last(x: Tensor, pads: list[int]) -> Tensor:
    """``F.pad(x, pads)`` written straight into a channels-last tensor: one zero fill and one copy."""
    left, right, top, bottom = pads
    b, c, h, w = x.shape
    out = torch.empty(b, c, h + top + bottom, w + left + right, dtype=x.dtype, device=x.device,
                      memory_format=torch.channels_last).zero_()
    out[:, :, top:top + h, left:left + w] = x
    return out
