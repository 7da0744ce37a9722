"""The device a name means: ``"auto" | "cpu" | "cuda" | "cuda:N" | "mps"`` as a ``torch.device`` that exists here.

The device comes back in one canonical form, the one a tensor placed there reports as its ``.device``: ``cpu``,
``cuda:N`` (``"cuda"`` and ``"auto"`` on a GPU machine give ``cuda:0``, or the rank's GPU), ``mps:0``, ``meta``; so
``tensor.device == resolve_device(name)`` holds for a tensor on that device, whatever name chose it.

A bottom module (torch and the errors only), because both the trainer (``train.device``) and loading a saved model
(:func:`interlayer.load_pretrained`'s ``device``) read such names; under ``torchrun`` ``"auto"``/``"cuda"`` give
each rank the GPU of its ``LOCAL_RANK``.
"""
from __future__ import annotations

import torch

from .errors import ConfigError


def resolve_device(spec: str = "auto", local_rank: int = 0, world_size: int = 1) -> torch.device:
    """The device named by ``spec``, checked to exist here (an error names what is available), in the canonical
    form of the module docstring."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            spec = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            spec = "mps"
        else:
            spec = "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"train.device={spec!r} is not a device; choose auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={spec!r}: this machine has no CUDA device (torch "
                              f"{torch.__version__}, CUDA build: {torch.version.cuda is not None}); use cpu or auto")
        if world_size > 1:
            if device.index is not None:
                raise ConfigError(f"train.device={spec!r} names one GPU, but torchrun started {world_size} "
                                  "processes; use cuda (or auto): each rank takes the GPU of its LOCAL_RANK")
            device = torch.device("cuda", local_rank)
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ConfigError(f"train.device={spec!r}: only {torch.cuda.device_count()} CUDA device(s) here "
                              f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
        return torch.device("cuda", index)
    if device.type == "mps":
        if not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
            raise ConfigError("train.device='mps': Apple's Metal backend is not available on this machine")
        if device.index not in (None, 0):
            raise ConfigError(f"train.device={spec!r}: Metal has one device, mps (mps:0)")
        return torch.device("mps", 0)
    if device.type == "meta":  # tests: every tensor placed on it without data
        return torch.device("meta")
    raise ConfigError(f"train.device={spec!r} is not supported; choose auto, cpu, cuda, cuda:N or mps")
