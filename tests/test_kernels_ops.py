"""``kernels.ops.kernel_op``, the one registration of a kernel's forward and backward operators, on a toy op in plain
PyTorch (the kernels' own files test it with Triton, slowly, under the interpreter): the gradients land on the
inputs ``differentiable`` names (list inputs included), an input that needs none gets None and the backward hears
so (``needs``), the saved values reach the backward in order, the fakes serve ``opcheck`` and ``torch.compile``
traces the pair without a graph break."""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import Tensor

from interlayer.kernels.ops import kernel_op

HEARD: list[list[bool]] = []  # what the backward was told about which inputs need a gradient


def _fake(x: Tensor, ys: list[Tensor], bias: Optional[Tensor], scale: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), x.new_empty(x.shape[:-1])


def _backward(grad: Tensor, x: Tensor, ys: list[Tensor], scale: float, needs: list[bool]) -> list[Tensor]:
    HEARD.append(needs)
    return [grad * scale * torch.cos(x), *[grad * 2 * y for y in ys], grad.sum(0)]


def _backward_fake(grad: Tensor, x: Tensor, ys: list[Tensor], scale: float, needs: list[bool]) -> list[Tensor]:
    return [torch.empty_like(x), *[torch.empty_like(y) for y in ys], grad.new_empty(grad.shape[1:])]


@kernel_op("interlayer_tests::toy", fake=_fake, backward=_backward, backward_fake=_backward_fake,
           save=lambda x, ys, bias, scale, output: (x, ys, scale), grads=lambda grad, grad_row_sums: (grad,),
           differentiable=("x", "ys", "bias"), needs=True)
def toy(x: Tensor, ys: list[Tensor], bias: Optional[Tensor], scale: float) -> tuple[Tensor, Tensor]:
    """``(scale sin(x) + sum y^2 (+ bias), row sums of x)``; the second output takes no gradient."""
    out = scale * torch.sin(x) + sum(y * y for y in ys)
    out = out if bias is None else out + bias
    return out, x.sum(-1)


def reference(x: Tensor, ys: list[Tensor], bias: Optional[Tensor], scale: float) -> Tensor:
    out = scale * torch.sin(x) + sum(y * y for y in ys)
    return out if bias is None else out + bias


def _inputs(bias: bool, x_grad: bool = True) -> tuple[Tensor, list[Tensor], Optional[Tensor]]:
    torch.manual_seed(0)
    return (torch.randn(3, 4, requires_grad=x_grad), [torch.randn(3, 4, requires_grad=True) for _ in range(2)],
            torch.randn(4, requires_grad=True) if bias else None)


@pytest.mark.parametrize("bias", [True, False])
def test_gradients_reach_the_named_inputs_list_inputs_included(bias: bool) -> None:
    x, ys, b = _inputs(bias)
    leaves = [x, *ys, *([b] if bias else [])]
    grad = torch.randn(3, 4)
    got = torch.autograd.grad(toy(x, ys, b, 0.5)[0], leaves, grad)
    want = torch.autograd.grad(reference(x, ys, b, 0.5), leaves, grad)
    for a, r in zip(got, want, strict=True):
        torch.testing.assert_close(a, r)


def test_an_input_that_needs_no_gradient_gets_none_and_the_backward_hears_so() -> None:
    x, ys, b = _inputs(bias=True, x_grad=False)
    HEARD.clear()
    toy(x, ys, b, 0.5)[0].sum().backward()
    assert HEARD == [[False, True, True]]  # x, ys (a list: whether any of it does), bias
    assert x.grad is None and b.grad is not None and all(y.grad is not None for y in ys)


def test_the_operators_pass_opcheck() -> None:
    """The fakes against the real outputs, and the autograd registration (``opcheck``'s own tests)."""
    x, ys, b = _inputs(bias=True)
    torch.library.opcheck(toy, (x, ys, b, 0.5))
    torch.library.opcheck(torch.ops.interlayer_tests.toy_backward.default,
                          (torch.randn(3, 4), x.detach(), [y.detach() for y in ys], 0.5, [True, True, True]))


@pytest.mark.slow
def test_the_operators_compile_without_a_graph_break() -> None:
    x, ys, b = _inputs(bias=True)

    def loss(x: Tensor, ys: list[Tensor], b: Tensor) -> Tensor:
        return toy(x, ys, b, 0.5)[0].square().sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x, ys, b), [x, *ys, b])
    want = torch.autograd.grad(loss(x, ys, b), [x, *ys, b])
    for a, r in zip(got, want, strict=True):
        torch.testing.assert_close(a, r)
