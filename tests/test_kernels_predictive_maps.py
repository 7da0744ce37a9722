"""Predictive Attention's map pipeline (src/interlayer/kernels/predictive_maps.py): the Triton kernels against the
reference, the attention output, the mixed logits and every gradient, under Triton's interpreter on the CPU."""
import pytest
import torch

from interlayer.kernels import predictive_maps as pm
from interlayer.kernels.dispatch import kernel_mode

pytest.importorskip("triton")


def _case(*, dtype=torch.float32, b=2, h=3, t=20, d=16, convs=1, seed=0):
    torch.manual_seed(seed)
    s = (2 * torch.randn(b, h, t, t)).to(dtype).requires_grad_()
    prev = (2 * torch.randn(b, h, t, t)).to(dtype).requires_grad_()
    v = torch.randn(b, t, h, d).to(dtype).transpose(1, 2).requires_grad_()
    weights = [(0.3 * torch.randn(h, h, 3, 3)).requires_grad_() for _ in range(convs)]
    biases = [(0.1 * torch.randn(h)).requires_grad_() for _ in range(convs)]
    return s, prev, v, weights, biases


def _run(fn, inputs, grads):
    out, mixed = fn()
    g = torch.autograd.grad((out, mixed), inputs, grads, allow_unused=True)
    return out, mixed, g


def _compare(*, causal, convs, padded=False, beta=None, slope=0.0, dtype=torch.float32, h=3, t=20, seed=0):
    s, prev, v, weights, biases = _case(dtype=dtype, h=h, t=t, convs=convs, seed=seed)
    pad = None
    if padded:
        pad = torch.zeros(2, t, dtype=torch.bool)
        pad[0, t - 3:] = True
        pad[1, :2] = True
    alpha = torch.tensor(0.3)
    beta_t = None if beta is None else torch.tensor(beta)
    inputs = (s, prev, v, *weights, *biases)
    torch.manual_seed(1)
    grads = (torch.randn(2, h, t, 16).to(dtype), torch.randn(2, h, t, t).to(dtype))
    if causal:  # what the next layer's backward hands back: nothing above the diagonal
        grads = (grads[0], grads[1].tril())
    if padded:
        grads[1].masked_fill_(pad[:, None, :, None] | pad[:, None, None, :], 0.0)
    with kernel_mode("triton"):
        out, mixed, g = _run(lambda: pm.predictive_attention(s, prev, v, weights, biases, alpha, beta_t, slope, causal,
                                                              pad), inputs, grads)
    ref_out, ref_mixed, ref_g = _run(lambda: pm.reference(s, prev, v, weights, biases, alpha, beta_t, slope, causal,
                                                          pad), inputs, grads)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, ref_out, **tol)
    hidden = pm.hidden_cells(mixed.shape, pad, causal, mixed.device)
    visible = ~hidden if hidden is not None else torch.ones_like(mixed, dtype=torch.bool)
    torch.testing.assert_close(torch.where(visible, mixed, 0), torch.where(visible, ref_mixed, 0), **tol)
    names = ["S", "A_prev", "v"] + [f"weight{i}" for i in range(convs)] + [f"bias{i}" for i in range(convs)]
    for name, a, b in zip(names, g, ref_g):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a / scale, b / scale, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("convs", [0, 1, 2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_every_depth_of_cnn_causal_and_centred(convs, causal) -> None:
    _compare(causal=causal, convs=convs)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_rows_and_columns(causal) -> None:
    _compare(causal=causal, convs=2, padded=True)


@pytest.mark.parametrize("convs", [0, 1, 2])
def test_evolving_attention_beta_and_leaky_relu(convs) -> None:
    _compare(causal=True, convs=convs, beta=0.4, slope=0.01)


def test_odd_sizes_and_many_heads_in_half_precision() -> None:
    _compare(causal=True, convs=1, dtype=torch.float16, h=12, t=37)


def test_nonfinite_previous_logits_read_as_zero() -> None:
    s, prev, v, weights, biases = _case(convs=1)
    with torch.no_grad():
        prev[0, 0, 5, 3] = float("inf")
        prev[1, 2, 7, 7] = float("nan")
    args = (weights, biases, torch.tensor(0.3), None, 0.0, True, None)
    with kernel_mode("triton"):
        out, mixed = pm.predictive_attention(s, prev, v, *args)
    ref_out, _ = pm.reference(s, prev, v, *args)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
