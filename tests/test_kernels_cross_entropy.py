"""The cross-entropy kernel (src/interlayer/kernels/cross_entropy.py) against its reference path, forward and
gradient, under Triton's interpreter on the CPU (fp32 and fp16; the interpreter's bf16 is not trusted)."""
import pytest
import torch

from helpers.kernels import HALF, on_device  # noqa: F401 (on_device: the fixture)
from interlayer.kernels import cross_entropy
from interlayer.kernels.dispatch import kernel_mode

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("on_device"), pytest.mark.slow]  # CUDA on a GPU, else the interpreter: slow


def _case(dtype: torch.dtype, shape: tuple[int, ...], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    logits = (3 * torch.randn(*shape, vocab)).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, shape)
    target.view(-1)[::3] = -100  # ignored rows
    return logits, target


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("shape,vocab,block", [((7,), 37, 16), ((2, 5), 300, 64), ((3, 4), 50, 4096)])
def test_kernel_equals_the_reference_forward_and_gradient(dtype, smoothing, shape, vocab, block) -> None:
    """Blocks smaller than the vocabulary exercise the online log-sum-exp across tiles, odd sizes the masks."""
    logits, target = _case(dtype, shape, vocab)
    weights = torch.rand(target.numel())
    with kernel_mode("triton"):
        loss, nll = cross_entropy.smoothed_cross_entropy(logits, target, smoothing, block=block)
    grad, = torch.autograd.grad((loss * weights).sum(), logits)
    ref_loss, ref_nll = cross_entropy.reference(logits, target, smoothing, -100)
    ref_grad, = torch.autograd.grad((ref_loss * weights).sum(), logits)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else (
        dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else dict(rtol=2e-2, atol=2e-2))
    torch.testing.assert_close(loss, ref_loss, **tol)
    torch.testing.assert_close(nll, ref_nll, **tol)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), ref_grad.float(), **tol)
    ignored = target.reshape(-1) == -100
    assert torch.all(loss[ignored] == 0) and torch.all(grad.reshape(-1, vocab)[ignored] == 0)


def test_strided_rows_are_read_in_place() -> None:
    """The causal LM's shifted ``logits[:, :-1]`` and ``labels[:, 1:]``: the same values as on contiguous copies."""
    logits, target = _case(torch.float32, (3, 6), 40)
    with kernel_mode("triton"):
        loss, _ = cross_entropy.smoothed_cross_entropy(logits[:, :-1], target[:, 1:], 0.1, block=16)
    grad, = torch.autograd.grad(loss.sum(), logits)
    ref_loss, _ = cross_entropy.reference(logits[:, :-1].contiguous(), target[:, 1:].contiguous(), 0.1, -100)
    ref_grad, = torch.autograd.grad(ref_loss.sum(), logits)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert torch.all(grad[:, -1] == 0)


def test_huge_logits_stay_finite() -> None:
    """The online maximum keeps exp() in range where a naive sum of exponentials would overflow."""
    logits = torch.tensor([[1e4, -1e4, 0.0, 5e3]], requires_grad=True)
    target = torch.tensor([0])
    with kernel_mode("triton"):
        loss, _ = cross_entropy.smoothed_cross_entropy(logits, target, 0.0, block=2)
    assert torch.isfinite(loss).all() and loss.item() == pytest.approx(0.0, abs=1e-6)


def test_compiled_code_takes_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside torch.compile the reference runs (inductor fuses it into the same single pass), even in triton mode."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    called = []
    monkeypatch.setattr(cross_entropy, "reference", lambda *a: called.append(a) or (a[0].sum(), a[0].sum()))
    logits, target = _case(torch.float32, (4,), 10)
    with kernel_mode("triton"):
        cross_entropy.smoothed_cross_entropy(logits, target, 0.0)
    assert called


# labels outside [0, V): V itself (read the next row's first logit), V + 5, -5 (scored as class 0 by the reference),
# 2^32 + 5 (class 5 once cast to 32 bits)
OUTSIDE = [40, 45, -5, 2 ** 32 + 5]


@pytest.mark.parametrize("mode", ["triton", "reference"])
def test_a_label_outside_the_classes_reads_nothing_and_gives_nan(mode) -> None:
    """No path reads out of bounds (issue 49: the kernel under the interpreter gave nll -4.6e24 for a label equal to
    V, other labels read another row's logit; the reference scored -5 as class 0): each such row's loss and NLL are
    NaN, every other row is as before, and the gradient is finite."""
    logits, target = _case(torch.float32, (3, 5), 40)
    clean = target.clone()
    rows = [(0, 1), (1, 4), (2, 0), (2, 4)]  # the last row of the tensor too: past it is no one's memory
    for (b, t), label in zip(rows, OUTSIDE):
        target[b, t] = label
    with kernel_mode(mode):
        loss, nll = cross_entropy.smoothed_cross_entropy(logits, target, 0.1, block=16)
        expected, _ = cross_entropy.smoothed_cross_entropy(logits, clean, 0.1, block=16)
    grad, = torch.autograd.grad(loss.nan_to_num().sum(), logits)
    bad = torch.zeros_like(target, dtype=torch.bool)
    for b, t in rows:
        bad[b, t] = True
    bad = bad.reshape(-1)
    assert loss[bad].isnan().all() and nll[bad].isnan().all()
    torch.testing.assert_close(loss[~bad], expected[~bad])
    assert torch.isfinite(grad).all()
