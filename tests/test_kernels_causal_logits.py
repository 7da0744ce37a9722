"""A causal map's logits on and below the diagonal (src/interlayer/kernels/causal_logits.py): the kernel against
the library's product, forward and both gradients, under Triton's interpreter on the CPU (a GPU's on one)."""
import pytest
import torch

from helpers.kernels import FP32, half_tolerance, on_device  # noqa: F401 (on_device: the fixture)
from interlayer.kernels import causal_logits as cl

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("on_device"), pytest.mark.slow]  # the interpreter without a GPU: slow


@pytest.mark.parametrize("t", [37, 64, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lower_logits_and_gradients_equal_the_library_product(t, dtype) -> None:
    """Ragged and whole blocks; an upstream gradient with garbage above the diagonal (nothing there is part of the
    map the kernel makes) gives the gradients the product gives for the same gradient zeroed there."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, t, 24).to(dtype).requires_grad_()
    k = torch.randn(2, 3, t, 24).to(dtype).requires_grad_()
    lower = torch.ones(t, t, dtype=torch.bool).tril()
    grad = torch.randn(2, 3, t, t).to(dtype)
    s = cl.causal_logits(q, k, 0.2)
    ref = cl.reference(q, k, 0.2)
    tol = FP32 if dtype == torch.float32 else half_tolerance(dtype)
    torch.testing.assert_close(s[..., lower], ref[..., lower], **tol)
    dq, dk = torch.autograd.grad(s, (q, k), grad)
    rq, rk = torch.autograd.grad(ref, (q, k), grad.masked_fill(~lower, 0.0))
    torch.testing.assert_close(dq, rq, **tol)
    torch.testing.assert_close(dk, rk, **tol)


def test_a_causal_pa_layer_from_queries_and_keys_equals_its_reference() -> None:
    """predictive_attention_qk: the logits made on and below the diagonal feed Eq. 4 and the attention, and the
    queries' and keys' gradients come back through both, as from the library's product on the reference path."""
    from interlayer.kernels import predictive_maps as pm
    from interlayer.kernels.dispatch import kernel_mode

    torch.manual_seed(0)
    b, h, t = 2, 3, 40
    q, k, v = (torch.randn(b, h, t, 16).requires_grad_() for _ in range(3))
    prev = (2 * torch.randn(b, h, t, t)).requires_grad_()
    weights, biases = [(0.3 * torch.randn(h, h, 3, 3)).requires_grad_()], [(0.1 * torch.randn(h)).requires_grad_()]
    args = (weights, biases, torch.tensor(0.3), None, 0.0, True, None)
    inputs = (q, k, v, prev, *weights, *biases)
    lower = torch.ones(t, t, dtype=torch.bool).tril()
    g_out, g_mixed = torch.randn(b, h, t, 16), torch.randn(b, h, t, t).masked_fill(~lower, 0.0)
    results = {}
    for mode in ("triton", "reference"):
        with kernel_mode(mode):
            out, mixed = pm.predictive_attention_qk(q, k, 0.25, prev, v, *args)
        results[mode] = (out, mixed[..., lower], torch.autograd.grad((out, mixed), inputs, (g_out, g_mixed)))
    torch.testing.assert_close(results["triton"][0], results["reference"][0], **FP32)
    torch.testing.assert_close(results["triton"][1], results["reference"][1], **FP32)
    for a, r in zip(results["triton"][2], results["reference"][2]):
        torch.testing.assert_close(a, r, **FP32)


def test_fake_tensors_have_the_kernels_strides_for_views_of_one_projection() -> None:
    """q and k arrive as views of one qkv projection (B, T, H, D transposed); the gradients the kernels write are
    contiguous, and the fake implementations inductor plans with must say so (on the H200 a fake that copied q's
    strides failed inductor's stride assertion in the compiled PA and Res steps)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    qkv = torch.randn(2, 40, 3, 3, 24, device=device)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    grad = torch.randn(2, 3, 40, 40, device=device)
    torch.library.opcheck(torch.ops.interlayer.causal_logits_backward.default, (grad, q, k, 0.2),
                          test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.interlayer.causal_logits.default, (q, k, 0.2), test_utils=("test_faketensor",))
