"""The one rule that picks a Triton kernel or its reference path.

``auto`` (the default): the kernel wherever it can run, the reference elsewhere. ``reference``: never a kernel (a
bit-level comparison, a debugging session, a suspected kernel bug). ``triton``: the kernel wherever it can run and
an error where it cannot, so a benchmark or a test that means to measure the kernel cannot silently measure the
fallback. The mode comes from the environment variable ``INTERLAYER_KERNELS`` and can be changed for a block with
:func:`kernel_mode`.

The rule is evaluated in Python when a model runs (or when ``torch.compile`` traces it), never inside a kernel, so a
compiled graph contains one path and no branch.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Iterator, Literal, Optional

from torch import Tensor

from ..errors import ConfigError, KernelUnavailable

KernelMode = Literal["auto", "triton", "reference"]
MODES: tuple[KernelMode, ...] = ("auto", "triton", "reference")
_override: Optional[KernelMode] = None


def current_mode() -> KernelMode:
    """The mode in force: :func:`kernel_mode`'s, else ``INTERLAYER_KERNELS``, else ``auto``. A value that is no
    mode raises :class:`~interlayer.errors.ConfigError`; the command line checks it before any command
    (:func:`check_environment`), so that a run is never stopped by it after its folder was written."""
    if _override is not None:
        return _override
    mode = os.environ.get("INTERLAYER_KERNELS", "auto").strip().lower()
    if mode not in MODES:
        raise ConfigError(f"INTERLAYER_KERNELS={mode!r} is not a kernel mode; use one of {', '.join(MODES)} (or "
                          "unset it for auto)")
    return mode  # type: ignore[return-value]


def check_environment() -> None:
    """Refuse, before a command does anything, an ``INTERLAYER_KERNELS`` that is no mode, and ``triton`` where
    Triton is not installed (every kernel would refuse to run, after the run was written)."""
    if current_mode() == "triton" and not triton_available():
        raise KernelUnavailable("INTERLAYER_KERNELS=triton asks for the Triton kernels, but Triton is not installed "
                                "(pip install triton); unset it, or use auto or reference")


@contextlib.contextmanager
def kernel_mode(mode: KernelMode) -> Iterator[None]:
    """Run a block with ``mode`` (``auto``, ``triton`` or ``reference``), then restore the previous one."""
    global _override
    if mode not in MODES:
        raise ValueError(f"kernel mode {mode!r} is not one of {', '.join(MODES)}")
    previous, _override = _override, mode
    try:
        yield
    finally:
        _override = previous


_TRITON_FOUND = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether Triton is installed (it is an optional dependency: ``pip install triton``); looked up once."""
    return _TRITON_FOUND


# The kernels ``auto`` runs on a GPU: those a GPU run has shown equal to their reference path and faster than it
# (docs/benchmarks.md, "GPU: the short slot's second run", one H200, 2026-11-28: their tests passed compiled on the
# GPU, and alone at GPT-2 small's sizes, forward and backward, the cross-entropy ran 5.5x, attention from logits
# 2.1x, static and dynamic hyper-connections 2.1x and 2.7x faster than their references). A kernel not listed runs
# only when asked for (``INTERLAYER_KERNELS=triton``, or ``kernel_mode("triton")``): Predictive Attention's and the
# Res-Transformer's (``predictive-attention``) ran 5.5x and 3.4x faster alone, but their compiled model step failed
# on that GPU (a fake implementation's strides, fixed since) and has not run since, so they are no one's default yet.
VALIDATED: frozenset[str] = frozenset({"cross-entropy", "logits-attention", "hyper_connections"})


def interpreting() -> bool:
    """Whether Triton runs its kernels on the CPU through its interpreter (``TRITON_INTERPRET=1``, or ``true`` /
    ``on``, which Triton reads the same way)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on")


def use_triton(*tensors: Tensor, covered: bool = True, kernel: str = "kernel") -> bool:
    """True when ``kernel`` should run on ``tensors``: Triton is installed, every tensor is on a CUDA device, the
    kernel ``covered`` the case (its own shape and option checks), and the mode asks for it (``triton``; ``auto``
    for a kernel in :data:`VALIDATED`). CPU tensors take a kernel only in ``triton`` mode under
    ``TRITON_INTERPRET=1`` (how the suite tests kernels: the interpreter is far too slow to be anyone's default).
    In ``triton`` mode a case the kernel cannot run raises instead of falling back, saying why."""
    mode = current_mode()
    if mode == "reference" or (mode == "auto" and kernel not in VALIDATED):
        return False
    devices = {t.device.type for t in tensors}
    where = devices <= {"cuda"} or (mode == "triton" and interpreting() and devices <= {"cpu"})
    reasons = [why for why, bad in (("Triton is not installed (pip install triton)", not triton_available()),
                                    (f"its tensors are on {sorted(devices)}, not CUDA (nor the CPU under "
                                     "TRITON_INTERPRET=1)", not where),
                                    ("it does not cover this case (shape, dtype or option)", not covered)) if bad]
    if reasons and mode == "triton":
        raise KernelUnavailable(f"INTERLAYER_KERNELS=triton asks for the {kernel} kernel, but it cannot run: "
                                + "; ".join(reasons) + "; unset it, or use auto or reference")
    return not reasons
