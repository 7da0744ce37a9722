"""Data-parallel training with ``torch.distributed`` (launched by ``torchrun``), and nothing home-made.

``torchrun --nproc_per_node N -m interlayer.cli train ...`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the
engine then initialises the process group (NCCL on GPUs, gloo on CPUs), wraps the model in
``DistributedDataParallel``, gives each rank its own share of every optimiser step's batches, and lets rank 0
alone write logs and checkpoints. The helpers here are the few collective operations the engine needs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def environment() -> DistEnv:
    """The launcher's environment (torchrun), or a single process."""
    return DistEnv(rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)),
                   local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def initialise(env: DistEnv, device_type: str = "cpu") -> None:
    """Join the process group once: NCCL when the ranks train on GPUs (each on the GPU of its ``LOCAL_RANK``),
    gloo otherwise. A rank that trains on the CPU uses gloo even on a machine with GPUs."""
    if env.enabled and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(env.local_rank)
        dist.init_process_group(backend)


def _collective_device() -> torch.device:
    """NCCL reduces only GPU tensors; gloo CPU tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_all(values: list[float], env: DistEnv) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64, so token counts stay exact)."""
    if not env.enabled:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor)
    return tensor.tolist()


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True if ``flag`` is true on any rank, so every rank takes the same decision (stop, out of budget)."""
    return bool(sum_all([float(flag)], env)[0]) if env.enabled else flag


def gather(obj: Any, env: DistEnv) -> list[Any]:
    """``obj`` of every rank, in rank order."""
    if not env.enabled:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()
