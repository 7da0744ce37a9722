"""Data-parallel training with ``torch.distributed`` (launched by ``torchrun``), and nothing home-made.

``torchrun --nproc_per_node N -m interlayer.cli train ...`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the
engine then initialises the process group (NCCL on GPUs, gloo on CPUs), wraps the model in
``DistributedDataParallel``, gives each rank its own share of every optimiser step's batches, and lets rank 0
alone write logs and checkpoints. The helpers here are the few collective operations the engine needs.

**Ranks agree before they train** (:func:`agree`): every rank resolves its own command line, and the ranks
exchange a hash of what they resolved (``all_gather``) before anything is written; a rank given another
``--set`` than the others is no longer silently overruled by rank 0's settings, and a refusal on any rank (a bad
value, a run directory another process holds) ends every rank with the same one-line message instead of leaving
the others waiting for a rank that is gone (gloo's "connection closed", a traceback from torchrun).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..errors import CheckpointError, ConfigError, DataError, DirectoryBusy, WriteError
from ..fileio import shorten

# The errors a rank reports as a refusal (a bad input or situation, exit code 2 on every rank); any other error is a
# failure, ending every rank with exit code 1. The families the command line reports as bad input.
REFUSALS: tuple[type[BaseException], ...] = (ConfigError, DataError, CheckpointError, FileNotFoundError,
                                            FileExistsError, WriteError, DirectoryBusy)


@dataclass(frozen=True)
class DistEnv:
    """This process's place in a distributed run (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one process is
    rank 0 of 1."""

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
    """The launcher's environment (torchrun), or a single process. ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` that
    are no integers, or a rank outside ``0..WORLD_SIZE-1``, raise :class:`~interlayer.errors.ConfigError` naming
    them (``int()``'s error named neither)."""
    values = {}
    for key, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
        raw = os.environ.get(key)
        try:
            values[key] = default if raw is None else int(raw)
        except ValueError:
            raise ConfigError(f"{key}={raw!r} in the environment is not an integer; torchrun sets RANK, WORLD_SIZE "
                              "and LOCAL_RANK itself: unset them to run one process") from None
    env = DistEnv(rank=values["RANK"], world_size=values["WORLD_SIZE"], local_rank=values["LOCAL_RANK"])
    if env.world_size < 1 or not 0 <= env.rank < env.world_size or env.local_rank < 0:
        raise ConfigError(f"RANK={env.rank}, WORLD_SIZE={env.world_size} and LOCAL_RANK={env.local_rank} in the "
                          "environment are no process of a group (WORLD_SIZE >= 1, RANK in 0..WORLD_SIZE-1, "
                          "LOCAL_RANK >= 0); unset them to run one process")
    return env


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


def leave() -> None:
    """Leave the process group, if this process joined one: a rank that ends on an error lets go of its peers
    here, where the interpreter's shutdown would tear the connections down in any order (gloo then aborts the
    process when a peer has already gone)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def refused(error: BaseException) -> bool:
    """Whether ``error`` is a refusal (a bad input, exit code 2), not a failure."""
    return isinstance(error, REFUSALS)


def settings_digest(settings: Any) -> str:
    """The hash the ranks compare: SHA-256 of ``settings`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def agree(env: DistEnv, error: Optional[BaseException] = None, settings: Optional[dict[str, Any]] = None) -> None:
    """A meeting point of every rank (it waits for all of them, as a barrier): each brings the error its last step
    raised, if any, and at the first meeting the settings it resolved; all leave, or all raise.

    A single process re-raises its own ``error``. Under ``torchrun``, when some rank brings an error, every rank
    raises the same one-line message naming the lowest such rank: a :class:`ConfigError` for a refusal
    (:func:`refused`: exit code 2 on every rank), a ``RuntimeError`` for any other error (exit code 1; the rank that
    met it re-raises its own, with its traceback under ``--debug``). When the settings' hashes differ, every rank
    raises a :class:`ConfigError` naming the keys that differ. Every rank must call it the same number of times.
    """
    if not env.enabled:
        if error is not None:
            raise error
        return
    mine = {"error": None if error is None else {"refused": refused(error), "text": str(error) or type(error).__name__,
                                                  "type": type(error).__name__},
            "digest": None if settings is None else settings_digest(settings), "settings": settings}
    everyone = gather(mine, env)
    failed = [(rank, item["error"]) for rank, item in enumerate(everyone) if item["error"] is not None]
    if failed:
        rank, problem = failed[0]
        where = f"rank {rank} of {env.world_size}"
        if problem["refused"]:
            raise ConfigError(f"{where}: {problem['text']} (every rank stops)") from error
        if rank == env.rank and error is not None:
            raise error
        raise RuntimeError(f"{where} failed ({problem['type']}: {problem['text']}); every rank stops")
    digests = [item["digest"] for item in everyone]
    if any(digest != digests[0] for digest in digests):
        rank = next(r for r, digest in enumerate(digests) if digest != digests[0])
        raise ConfigError(f"the {env.world_size} ranks were started with different settings: "
                          f"{_difference(everyone[0]['settings'], everyone[rank]['settings'], rank)}; every rank must "
                          "run the same command (torchrun starts each with the arguments it was given)")


def _difference(first: Optional[dict[str, Any]], other: Optional[dict[str, Any]], rank: int) -> str:
    """Where rank ``rank``'s settings differ from rank 0's, in words."""
    flat_first, flat_other = _flat(first or {}), _flat(other or {})
    keys = sorted(key for key in set(flat_first) | set(flat_other) if flat_first.get(key) != flat_other.get(key))
    shown = "; ".join(f"{key}: rank 0 {shorten(repr(flat_first.get(key)), 60)}, rank {rank} "
                      f"{shorten(repr(flat_other.get(key)), 60)}" for key in keys[:3])
    return shown + (f"; ... ({len(keys)} settings in all)" if len(keys) > 3 else "")


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
