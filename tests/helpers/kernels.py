"""What the Triton kernels' tests share: the device they run on and the tolerances there.

On a GPU machine the tests run the compiled kernels on CUDA tensors (the GPU campaign); elsewhere Triton's
interpreter runs them on the CPU (tests/conftest.py sets ``TRITON_INTERPRET=1``). A test module uses
``on_device`` as an autouse fixture (``pytestmark = pytest.mark.usefixtures("on_device")``), so every tensor and
model it makes is on that device."""
from typing import Iterator

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 products run as TF32 (10-bit mantissas) on a GPU's tensor cores, in the kernels as in cuDNN's convolution:
# sums of ~100 such products over logits of a few units differ by ~1e-2 between two TF32 implementations
FP32 = dict(rtol=3e-2, atol=3e-2) if DEVICE == "cuda" else dict(rtol=1e-4, atol=1e-4)
HALF = [torch.float16, torch.bfloat16] if DEVICE == "cuda" else [torch.float16]  # the interpreter's bf16 is wrong
MODEL = dict(rtol=2e-2, atol=1e-3) if DEVICE == "cuda" else dict(rtol=1e-3, atol=1e-4)


def half_tolerance(dtype: torch.dtype) -> dict[str, float]:
    """A 16-bit dtype's tolerance for outputs and gradients of order one."""
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=6e-2, atol=6e-2)


@pytest.fixture
def on_device() -> Iterator[None]:
    with torch.device(DEVICE):
        yield
