"""Mixed-precision helpers the kernels, the core and the methods share (plain tensor code, the bottom of the layers)."""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

# Device types with an autocast implementation; on others (``meta``, used to check device placement without
# memory) there is nothing to switch off.
_AUTOCAST_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu", "hpu"})


def fp32_island(device: torch.device) -> ContextManager[Any]:
    """A region where autocast is off, so operations run in their inputs' dtype (the caller passes fp32): for
    sums of many terms that bf16/fp16 would round, such as Predictive Attention's convolution over logits."""
    if device.type not in _AUTOCAST_DEVICES:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)
