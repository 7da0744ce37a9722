"""The logged terms of the training steps since the last log line, kept on the device until they are read.

Why: a task's loss terms are tensors on the training device. Reading one as a Python float makes the host wait for
every kernel queued before it, once per step, so the CPU can no longer run ahead of the GPU (and a compiled step
would break its graph there). The engine adds each step's terms here and reads them all at once, one host
synchronisation per ``train.log_interval`` steps, before any checkpoint is written, and at the end of an epoch.

Reading is also where a diverged run is caught: the first step whose loss (or gradient norm) is not finite is named
exactly, even though it is noticed up to ``log_interval`` steps later; since every checkpoint write reads first, the
last checkpoint on disk always predates the divergence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from . import distributed

Value = Union[Tensor, float]


@dataclass
class _Step:
    number: int
    sums: dict[str, Value]  # each term summed over the step's micro-batches, weighted by their units
    units: float  # tokens or examples of the step over every rank (the divisor of the ranks' summed terms)
    per_step: dict[str, Value]  # terms that are not weighted means (the gradient norm, the loss scale)


@dataclass
class StepLogs:
    """Terms of the steps since the last :meth:`row`; :meth:`read` turns them into floats (one synchronisation,
    and on several processes one all-reduce of the whole window)."""

    env: distributed.DistEnv
    steps: list[_Step] = field(default_factory=list)
    units: float = 0.0
    _read: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def add(self, number: int, sums: dict[str, Value], units: float, per_step: Optional[dict[str, Value]] = None
            ) -> None:
        self.steps.append(_Step(number, sums, units, per_step or {}))
        self.units += units

    def read(self, diverged: Callable[[str, int], Exception]) -> None:
        """Bring every pending term to the host; raise ``diverged(what, step)`` for the first step whose loss or
        gradient norm is not a finite number."""
        if not self.steps:
            return
        keys = sorted({k for s in self.steps for k in s.sums})
        norms = sorted({k for s in self.steps for k in s.per_step})
        values = [s.sums.get(k, 0.0) for s in self.steps for k in keys]
        values += [s.per_step.get(k, float("nan")) for s in self.steps for k in norms]
        flat = _to_floats(values)
        n, width = len(self.steps), len(keys)
        weighted = distributed.sum_all(flat[:n * width], self.env)  # the ranks' sums (the gradient norm is shared)
        sums = [weighted[i * width:(i + 1) * width] for i in range(n)]
        rest = flat[n * width:]
        for i, step in enumerate(self.steps):
            row = {k: v / max(step.units, 1.0) for k, v in zip(keys, sums[i])}
            row.update({k: rest[j * n + i] for j, k in enumerate(norms) if k in step.per_step})
            for name, what in (("loss", "the training loss"), ("grad_norm", "the gradient norm")):
                if name in row and not math.isfinite(row[name]):
                    raise diverged(f"{what} is {row[name]}", step.number)
            self._read.append((step.number, row))
        self.steps = []

    def row(self, diverged: Callable[[str, int], Exception]) -> dict[str, float]:
        """The mean of every term over the steps since the last row (reading what is pending), and a fresh window."""
        self.read(diverged)
        rows = [r for _, r in self._read]
        keys = {k for r in rows for k in r}
        mean = {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in sorted(keys)}
        self._read = []
        return mean

    def take_units(self) -> float:
        units, self.units = self.units, 0.0
        return units


def _to_floats(values: list[Value]) -> list[float]:
    """Python floats of a mixed list, with one device-to-host copy for all the tensors of each device."""
    out: list[float] = [0.0] * len(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, Tensor):
            by_device.setdefault(v.device, []).append(i)
        else:
            out[i] = float(v)
    for index in by_device.values():
        stacked = torch.stack([values[i].detach().reshape(()).double() for i in index]).tolist()  # type: ignore
        for i, v in zip(index, stacked):
            out[i] = v
    return out
