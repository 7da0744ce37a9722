"""Honest size and compute accounting.

* :func:`count_parameters` counts every distinct parameter tensor once, so tied weights (shared embeddings,
  Crossformer's hard guidance, LW's group sharing, MPT's passes) are not double counted.
* :func:`count_madds` is analytic: each module reports the multiply-adds of its matrix products and
  convolutions for a forward pass at the given lengths (normalisations, softmax and element-wise work are not
  counted, the usual MAdds convention). A test checks it against ``torch.utils.flop_counter`` (FLOPs = 2 MAdds).
* :func:`step_cost` is the cost model of a training step: its FLOPs and the bytes it must move, and from them the
  least time it can take on a device (:data:`PEAKS`: the H100 and H200 datasheets; :func:`measure_cpu_peak`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Optional

from torch import nn

from .errors import ConfigError


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        if trainable_only and not param.requires_grad:
            continue
        seen[id(param)] = param.numel()
    return sum(seen.values())


def count_madds(model: nn.Module, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
    """Multiply-adds of one forward pass for one sequence (source ``src_len``, target ``tgt_len``).

    A model that fixes its own input size (an image model's patch grid, MCAN's regions) needs no length:
    ``count_madds(vit)``; a sequence model does, and is told so instead of failing inside its arithmetic.
    """
    first = next(iter(inspect.signature(model.madds).parameters.values()), None)
    if src_len is None and first is not None and first.default is inspect.Parameter.empty:
        raise ConfigError(f"count_madds({type(model).__name__}) needs src_len (its {first.name}): this model has no "
                          "fixed input size; pass it as the second argument, e.g. count_madds(model, 64)")
    return int(model.madds() if first is None else model.madds(src_len, tgt_len))


# -- the cost of a training step: arithmetic, bytes, and the time bound on a device -------------------------------
#
# A lower bound, as a roofline: a step cannot take less than its FLOPs at the device's peak rate, nor less than the
# bytes it must move at the memory's bandwidth. The FLOPs are 6 x MAdds x tokens (2 per multiply-add, forward and
# the two products of the backward, the usual convention). The bytes are what a step cannot avoid moving:
# the weights (read forward and backward, their gradient written: 12 bytes a parameter) and AdamW's update (the
# parameter, gradient and two moments read, three written: 28 bytes), and every activation a module must save for
# its backward (written once forward, read once backward), reported by the modules themselves through a
# ``traffic(batch, length, width)`` hook (``width``: bytes of a 16- or 32-bit activation): the core's attention,
# feed-forward, residual connection and output layer, and each method for what it adds (a map it materialises,
# streams it widens). A module without the hook adds nothing, so the figure stays a bound from below.


@dataclass(frozen=True)
class Peak:
    """A device's datasheet (or measured) ceilings: dense matrix-product FLOP/s by precision, memory bytes/s."""

    name: str
    flops: dict[str, float]
    bandwidth: float
    # warp-instructions a second the device issues at most: multiprocessors x 4 schedulers x boost clock
    issue: float = 0.0

    def flops_for(self, precision: str) -> float:
        if precision not in self.flops:
            raise ConfigError(f"{self.name} has no peak for precision {precision!r}; known: {sorted(self.flops)}")
        return self.flops[precision]


# NVIDIA's datasheets, SXM parts, dense (no sparsity); "fp32" is TF32 on the tensor cores, what PyTorch uses for
# fp32 matrix products with TF32 allowed (interlayer's default on GPUs, train.tf32).
PEAKS: dict[str, Peak] = {
    "H100": Peak("NVIDIA H100 SXM", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12}, 3.35e12,
                 132 * 4 * 1.98e9),
    "H200": Peak("NVIDIA H200 SXM", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12}, 4.8e12,
                 132 * 4 * 1.98e9),
}


@dataclass(frozen=True)
class StepCost:
    """One training step of ``batch`` sequences of ``length`` tokens: multiply-adds, FLOPs, and bytes by term."""

    batch: int
    length: int
    madds: int  # forward multiply-adds of the whole batch
    bytes: dict[str, float]  # what the step must move, by term (weights, optimizer, activations, maps, ...)

    @property
    def flops(self) -> float:
        return 6.0 * self.madds

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes.values()))

    def bound(self, peak: Peak, precision: str = "bf16") -> float:
        """Seconds the step takes at least on ``peak``: ``max(FLOPs / peak rate, bytes / bandwidth)``."""
        return max(self.flops / peak.flops_for(precision), self.total_bytes / peak.bandwidth)

    def serial_bound(self, peak: Peak, precision: str = "bf16") -> float:
        """``FLOPs / peak rate + bytes / bandwidth``: the bound if the step's arithmetic and its memory traffic never
        overlap, nearer what a step of separate kernels (each mostly one or the other) can reach than
        :meth:`bound`, which assumes perfect overlap."""
        return self.flops / peak.flops_for(precision) + self.total_bytes / peak.bandwidth

    def bound_by(self, peak: Peak, precision: str = "bf16") -> str:
        """"arithmetic" or "memory": which side of the roofline the step is on."""
        arithmetic = self.flops / peak.flops_for(precision)
        return "arithmetic" if arithmetic >= self.total_bytes / peak.bandwidth else "memory"


def step_cost(model: nn.Module, batch: int, length: int, *, precision: str = "bf16") -> StepCost:
    """The cost of one training step (forward, backward, AdamW) of ``model`` on ``batch`` x ``length`` tokens in
    ``precision`` (activations of 2 bytes in bf16/fp16, 4 in fp32; weights and optimizer state in fp32)."""
    if precision not in ("bf16", "fp16", "fp32"):
        raise ConfigError(f"precision={precision!r} must be bf16, fp16 or fp32")
    width = 4 if precision == "fp32" else 2
    params = count_parameters(model, trainable_only=True)
    terms: dict[str, float] = {"weights": 12.0 * params, "optimizer": 28.0 * params}
    for module in model.modules():
        traffic = getattr(module, "traffic", None)
        if callable(traffic):
            for name, value in traffic(batch, length, width).items():
                terms[name] = terms.get(name, 0.0) + float(value)
    return StepCost(batch, length, batch * count_madds(model, length), terms)


def measure_cpu_peak(size: int = 1024, repeats: int = 5) -> Peak:
    """This machine's CPU ceilings, measured: fp32 ``torch.mm`` FLOP/s and a large copy's bytes/s (read and
    written), each the best of ``repeats``, with the threads torch uses now."""
    import time

    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    src, dst = torch.empty(32 * 2 ** 20 // 4), torch.empty(32 * 2 ** 20 // 4)

    def best(fn: Any) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    flops = 2 * size ** 3 / best(lambda: torch.mm(a, b))
    bandwidth = 2 * src.numel() * 4 / best(lambda: dst.copy_(src))
    return Peak(f"this CPU ({torch.get_num_threads()} threads, measured)", {"fp32": flops, "bf16": flops}, bandwidth)
