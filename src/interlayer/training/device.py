"""Where training runs and in what precision: the short device/dtype/autocast block every entry point shares.

* :func:`~interlayer.devices.resolve_device` (a module of its own: loading a saved model uses it too) turns
  ``"auto" | "cpu" | "cuda" | "cuda:N" | "mps"`` into a ``torch.device``.
* :func:`resolve_precision` turns ``"auto" | "fp32" | "bf16" | "fp16"`` into the precision a device can run:
  ``auto`` is bf16 on a GPU that supports it, fp32 elsewhere (fp16 is never chosen for you: it needs a loss scaler
  and can overflow, so it is an explicit opt-in).
* :func:`autocast` is the mixed-precision context (parameters and optimiser state stay fp32; matrix products
  run in bf16/fp16), :func:`make_scaler` the gradient scaler fp16 needs.
* :func:`move` copies a batch (a tensor, or tensors inside tuples, lists, named tuples, dicts or dataclasses) to the
  device; to a GPU through pinned memory with ``non_blocking=True``, so the copy overlaps the work already queued.
  That is safe because the pinned copy is the source and nothing writes to it (the host allocator keeps it until
  the copy is done), and only host-to-device copies are made asynchronous: a device-to-host copy the host reads
  at once must wait for its data.
* :func:`inputs_to` moves the inputs of every call of a module while it is in force (the engine's validation).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ContextManager, Iterator, Literal, Optional

import torch
from torch import nn

from ..config_io import coerce
from ..errors import ConfigError
from .config import PrecisionSetting

Precision = Literal["fp32", "bf16", "fp16"]
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def supports_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type in ("cpu", "mps")


def resolve_precision(spec: str, device: torch.device) -> Precision:
    """``auto`` -> bf16 on a GPU with bf16 support, else fp32; an explicit choice is checked against the device."""
    spec = coerce((spec or "auto").strip().lower(), PrecisionSetting, "train.precision")
    if spec == "auto":
        return "bf16" if device.type == "cuda" and supports_bf16(device) else "fp32"
    if spec == "bf16" and not supports_bf16(device):
        raise ConfigError(f"train.precision=bf16: {device} does not support bfloat16; use fp16 or fp32")
    return spec  # type: ignore[return-value]


def autocast(device: torch.device, precision: Precision) -> ContextManager[Any]:
    """The autocast context of ``precision`` on ``device`` (nothing for fp32)."""
    if precision == "fp32" or device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def make_scaler(device: torch.device, precision: Precision) -> Optional[torch.amp.GradScaler]:
    """fp16's dynamic loss scaler (bf16 has fp32's exponent range and needs none)."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def configure_tf32(device: torch.device, enabled: bool) -> None:
    """TensorFloat-32 matrix products and convolutions on GPUs that have them (Ampere and later): fp32 storage,
    10-bit mantissa products, about 8x the fp32 rate. On by default, as in nanoGPT; ``train.tf32=false`` gives
    IEEE fp32 products for bit-level comparisons."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (CPU for a module without any)."""
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def move(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor inside it on ``device``; other values are returned as they are.

    Dataclasses are rebuilt with :func:`dataclasses.replace` (their non-tensor fields kept), so a task's batch type
    needs nothing to travel. What holds no tensor to move comes back as the same object: a tensor already there,
    and a container or dataclass all of whose tensors are, so moving twice (the engine, then the task) costs
    nothing, and an object the caller keeps updating (a decoding step's KV caches, under :func:`inputs_to`) is not
    replaced by a copy.
    """
    if isinstance(obj, torch.Tensor):
        if obj.device == device:
            return obj
        if device.type == "cuda" and obj.device.type == "cpu":
            return obj.pin_memory().to(device, non_blocking=True)
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.init and (moved := move(value, device)) is not value:
                changes[f.name] = moved
        return dataclasses.replace(obj, **changes) if changes else obj
    if isinstance(obj, (list, tuple)):
        items = [move(v, device) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # a named tuple takes fields
    if isinstance(obj, dict):
        values = {k: move(v, device) for k, v in obj.items()}
        return obj if all(values[k] is v for k, v in obj.items()) else values
    return obj


@contextlib.contextmanager
def inputs_to(module: nn.Module, device: torch.device) -> Iterator[None]:
    """While in force, every call of ``module`` gets its tensor arguments (positional and keyword, inside
    containers too) moved to ``device`` first, by a forward pre-hook that is removed on exit. The engine validates
    under it, so a task's ``validate`` may hand the model CPU tensors; what the model returns stays on ``device``."""

    def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return move(args, device), move(kwargs, device)

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
