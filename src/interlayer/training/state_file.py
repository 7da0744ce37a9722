"""The training checkpoint as one safetensors file: nothing in it can run code when it is read.

``torch.load`` without ``weights_only=True`` unpickles, and a pickle may name any callable: a crafted
``checkpoint_last.pt`` in a run directory ran code on ``train --resume`` and on a re-run of ``compare``. This file
format holds only tensors and JSON:

* tensors: ``model/<name>`` (the canonical state dict: tied weights once), ``optimizer/<param>/<key>`` (Adam's
  moments and step counts), ``rng/<rank>/torch``, ``rng/<rank>/cuda/<i>``, ``rng/<rank>/numpy``, and
  ``asset/<file>`` (the task's files as bytes, e.g. the vocabulary);
* metadata (strings, JSON inside): the model and training configs, the engine's counters, the optimiser's
  parameter groups and non-tensor state, Python's random state, the gradient scaler's state, the tie map and a
  format version.

Tensors are stored from the CPU, so a checkpoint written on a GPU resumes on a CPU and the other way round (the
optimiser moves its state to its parameters' device on load). Reading checks the format and names the file on any
fault (a truncated or foreign file raises :class:`CheckpointError`, never an arbitrary exception).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError
from ..fileio import atomic_path, confined

FORMAT = "interlayer-train-state"
VERSION = 1


def seed_all(seed: int) -> None:
    """Seed every generator :func:`rng_state` saves (torch on every device, Python, numpy)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's random generators: torch (CPU and every CUDA device), Python's ``random``, numpy's legacy
    global generator; the tensors are CPU tensors, the rest JSON-able."""
    version, internal, gauss = random.getstate()
    numpy_name, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = [s.cpu() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda, "numpy": torch.from_numpy(keys.astype(np.int64)),
            "json": {"python": [version, list(internal), gauss], "numpy": [numpy_name, int(pos), int(has_gauss),
                                                                            float(cached)]}}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`; CUDA states are restored where this machine has the same number of GPUs (a run
    moved between machines keeps its CPU streams, and the GPU streams start from the seed of their device)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["json"]["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = state["json"]["numpy"]
    np.random.set_state((name, state["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))


def _split_optimizer(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for param, entries in state_dict["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{param}/{key}"] = value.detach().cpu().contiguous()
            else:
                plain.setdefault(str(param), {})[key] = value
    return tensors, {"param_groups": state_dict["param_groups"], "plain": plain}


def write(path: Path, *, model: dict[str, torch.Tensor], optimizer: dict[str, Any], rng: list[dict[str, Any]],
          assets: dict[str, bytes], metadata: dict[str, Any]) -> None:
    """Write the checkpoint atomically (a temporary file renamed over ``path``): a crash mid-write leaves the
    previous checkpoint intact."""
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.items()}
    optimizer_tensors, optimizer_json = _split_optimizer(optimizer)
    tensors.update(optimizer_tensors)
    for rank, state in enumerate(rng):
        tensors[f"rng/{rank}/torch"] = state["torch"]
        tensors[f"rng/{rank}/numpy"] = state["numpy"]
        for i, cuda in enumerate(state["cuda"]):
            tensors[f"rng/{rank}/cuda/{i}"] = cuda
    for name, data in assets.items():
        tensors[f"asset/{name}"] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
            torch.zeros(0, dtype=torch.uint8)
    header = {"format": FORMAT, "version": str(VERSION), "optimizer": json.dumps(optimizer_json),
              "rng": json.dumps([{"json": s["json"], "cuda": len(s["cuda"])} for s in rng]),
              "assets": json.dumps(sorted(assets)),
              **{key: json.dumps(value) for key, value in metadata.items()}}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)


def read_model_config(path: Path) -> dict[str, Any]:
    """The model config a checkpoint was written with, from its header alone (no tensor is read)."""
    source = confined(path, Path(path).parent, CheckpointError)  # a run directory's own file (fileio.confined)
    try:
        with safe_open(str(source), framework="pt") as handle:
            header = handle.metadata() or {}
        return json.loads(header["model_config"])
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{path} is not a readable interlayer training checkpoint ({err}); it may be "
                              "truncated: delete it to restart the run, or restore it from a copy") from None


def read(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path`` as ``{"model", "optimizer", "rng", "assets", **metadata}``; tensors on the CPU."""
    path = Path(path)
    source = confined(path, path.parent, CheckpointError)  # a run directory's own file (fileio.confined)
    try:
        tensors = load_file(str(source))
        with safe_open(str(source), framework="pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable interlayer training checkpoint ({err}); it may be "
                              "truncated: delete it to restart the run, or restore it from a copy") from None
    if header.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a safetensors file but not an interlayer training checkpoint "
                              f"(format {header.get('format')!r})")
    if header.get("version") != str(VERSION):
        raise CheckpointError(f"{path} has checkpoint format version {header.get('version')}; this interlayer "
                              f"reads version {VERSION}")
    try:
        meta = {key: json.loads(value) for key, value in header.items() if key not in ("format", "version")}
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: malformed metadata ({err})") from None
    optimizer_json = meta.pop("optimizer")
    state: dict[Any, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        if name.startswith("optimizer/"):
            _, param, key = name.split("/", 2)
            state.setdefault(int(param), {})[key] = tensor
    for param, entries in optimizer_json["plain"].items():
        state.setdefault(int(param), {}).update(entries)
    rng = [{"torch": tensors[f"rng/{rank}/torch"], "numpy": tensors[f"rng/{rank}/numpy"], "json": entry["json"],
            "cuda": [tensors[f"rng/{rank}/cuda/{i}"] for i in range(entry["cuda"])]}
           for rank, entry in enumerate(meta.pop("rng"))]
    assets = {name: tensors[f"asset/{name}"].numpy().tobytes() for name in meta.pop("assets")}
    return {"model": {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")},
            "optimizer": {"state": state, "param_groups": optimizer_json["param_groups"]},
            "rng": rng, "assets": assets, **meta}
