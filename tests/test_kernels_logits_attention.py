"""Attention from given logits (src/interlayer/kernels/logits_attention.py): the Triton kernel against the
reference, forward and both gradients, under Triton's interpreter on the CPU."""
import pytest
import torch

from helpers.kernels import FP32, HALF, half_tolerance, on_device  # noqa: F401 (on_device: the fixture)
from interlayer.kernels import logits_attention as la
from interlayer.kernels.dispatch import kernel_mode

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("on_device"), pytest.mark.slow]  # CUDA on a GPU, else the interpreter: slow


def _case(dtype, b=2, h=3, t=70, d=24, seed=0):
    torch.manual_seed(seed)
    logits = (2 * torch.randn(b, h, t, t)).to(dtype).requires_grad_()
    v = torch.randn(b, t, h, d).to(dtype).transpose(1, 2).requires_grad_()  # a head-split view, as the core has
    return logits, v


def _grads(fn, logits, v, grad_out):
    out = fn()
    gl, gv = torch.autograd.grad(out, (logits, v), grad_out)
    return out, gl, gv


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_kernel_equals_the_reference(dtype, causal, padded) -> None:
    logits, v = _case(dtype)
    pad = None
    if padded:  # row 1: left padding (its first queries see no key when causal), row 0: right padding
        pad = torch.zeros(2, 70, dtype=torch.bool)
        pad[0, 60:] = True
        pad[1, :5] = True
    grad_out = torch.randn(2, 3, 70, 24).to(dtype)
    with kernel_mode("triton"):
        out, gl, gv = _grads(lambda: la.logits_attention(logits, v, pad, causal), logits, v, grad_out)
    ref, rgl, rgv = _grads(lambda: la.reference(logits, v, pad, causal), logits, v, grad_out)
    tol = FP32 if dtype == torch.float32 else half_tolerance(dtype)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(gl, rgl, **tol)
    torch.testing.assert_close(gv, rgv, **tol)
    assert torch.isfinite(gl).all() and torch.isfinite(out).all()
    if causal:  # nothing above the diagonal, in the output's dependence or the gradient
        assert torch.all(gl.triu(1) == 0)
    if padded:
        assert torch.all(gl[0, :, :, 60:] == 0)


def test_an_incoming_logits_gradient_is_added_in_the_same_pass() -> None:
    from interlayer.kernels import logits_attention_triton as kernels

    logits, v = _case(torch.float32, t=40)
    with torch.no_grad():
        out, lse = kernels.forward(logits, v, None, True)
        grad_out, extra = torch.randn_like(out), torch.randn_like(logits)
        plain, _ = kernels.backward(grad_out, logits, v, None, out, lse, True, None)
        both, _ = kernels.backward(grad_out, logits, v, None, out, lse, True, extra)
    # above a causal diagonal the map is not part of the function, so an incoming gradient there is not either
    torch.testing.assert_close(both, plain + extra.tril())


def test_rows_without_keys_give_zero_not_nan() -> None:
    logits, v = _case(torch.float32, t=20)
    pad = torch.ones(2, 20, dtype=torch.bool)
    with kernel_mode("triton"):
        out = la.logits_attention(logits, v, pad, False)
    out.sum().backward()
    assert torch.all(out == 0) and torch.all(logits.grad == 0) and torch.isfinite(v.grad).all()
