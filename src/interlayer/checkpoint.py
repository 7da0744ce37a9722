"""Saving and loading models with their config, keeping tied parameters tied.

Tied parameters (one ``nn.Parameter`` reachable under several names) are how interlayer shares weights:
embeddings/output projection, Crossformer's hard guidance, LW's group sharing. ``safetensors`` refuses tensors
that share storage, so a checkpoint stores each tied tensor once, under its first name, and records the *tie map*
(name -> the names it is also known by) in the file's metadata. Loading rebuilds the model from the stored config
(which re-creates the ties), checks the rebuilt model has the same tie map, and loads the canonical tensors.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .build import build_model
from .config import config_from_dict
from .core.config import ConfigError
from .fileio import atomic_path, parse_json, read_json

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the requested model; the message says what differs."""


def tie_map(model: nn.Module) -> dict[str, list[str]]:
    """Canonical parameter name -> other names of the same tensor (only entries with aliases)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return {group[0]: group[1:] for group in names.values() if len(group) > 1}


def canonical_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with every tied tensor present once (under its canonical name)."""
    aliases = {alias for group in tie_map(model).values() for alias in group}
    return {k: v for k, v in model.state_dict().items() if k not in aliases}


def load_canonical_state_dict(model: nn.Module, state: dict[str, torch.Tensor], *, source: str = "state dict"
                              ) -> None:
    """Load a state dict that may omit alias names; mismatches raise :class:`CheckpointError` naming the keys."""
    ties = tie_map(model)
    aliases = {alias: canon for canon, group in ties.items() for alias in group}
    expected = [k for k in model.state_dict() if k not in aliases]
    given = {k for k in state if k not in aliases}
    missing, unexpected = [k for k in expected if k not in given], sorted(given - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{source} does not fit this model: missing {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                              f"{'...' if len(unexpected) > 5 else ''}")
    own = model.state_dict()
    for key in expected:
        if own[key].shape != state[key].shape:
            raise CheckpointError(f"{source}: {key} has shape {tuple(state[key].shape)}, the model expects "
                                  f"{tuple(own[key].shape)}")
    model.load_state_dict({k: state[k] for k in expected}, strict=False)


# Model families besides the Transformer (a CNN baseline, GAT, ...) register how to rebuild themselves from the
# dict in config.json: a model with ``model_type = "name"`` is saved with that name in the weights' metadata.
_BUILDERS: dict[str, Callable[[dict], nn.Module]] = {
    "transformer": lambda data: build_model(config_from_dict(data)),
}


def register_model_type(name: str, builder: Callable[[dict], nn.Module]) -> None:
    """Let :func:`load_pretrained` rebuild models whose ``model_type`` is ``name`` from their config dict."""
    _BUILDERS[name] = builder


def save_pretrained(model: nn.Module, directory: Union[str, Path]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (tie map and model type in its metadata) into ``directory``.

    ``model.config`` must offer ``save(path)`` and ``to_dict()``; ``model.model_type`` names a registered builder
    (default ``"transformer"``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save(directory / CONFIG_FILE)
    tensors = {k: v.detach().contiguous() for k, v in canonical_state_dict(model).items()}
    metadata = {"tie_map": json.dumps(tie_map(model)), "format": "interlayer",
                "model_type": getattr(model, "model_type", "transformer")}
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return directory


def load_pretrained(directory: Union[str, Path], device: Union[str, torch.device, None] = None) -> nn.Module:
    """Rebuild the model from ``config.json`` and load its weights, re-tying shared parameters; on ``device``
    (a ``torch.device`` or ``"auto" | "cpu" | "cuda[:N]" | "mps"``; default the CPU) when given. The model's
    ``source_dir`` is ``directory``."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{directory} is not an interlayer checkpoint: {path.name} is missing")
    try:
        with safe_open(str(weights_path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({err}); it may be truncated or "
                              "corrupt: copy it again, or save the model again") from None
    stored_ties = parse_json(metadata.get("tie_map", "{}"), f"{weights_path} (metadata tie_map)", CheckpointError)
    model_type = metadata.get("model_type", "transformer")
    if model_type not in _BUILDERS:
        from .models.registry import discover  # imports the model families, which register their types here

        discover()
    if model_type not in _BUILDERS:
        raise CheckpointError(f"{weights_path} holds a {model_type!r} model; known model types: "
                              f"{', '.join(sorted(_BUILDERS))} (import the module that registers it)")
    data = read_json(config_path, CheckpointError)
    try:
        model = _BUILDERS[model_type](data)
    except ConfigError as err:
        raise CheckpointError(f"{config_path}: {err}") from None
    if stored_ties != tie_map(model):
        raise CheckpointError(f"{weights_path} was saved with tied parameters {stored_ties}, but its config "
                              f"builds a model tied as {tie_map(model)}; the files come from different models")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights_path}: cannot read the tensors ({err}); the file may be truncated or "
                              "corrupt: copy it again, or save the model again") from None
    load_canonical_state_dict(model, tensors, source=str(weights_path))
    # where it came from: an export finds the run's tokenizer, labels and scores there (pretrained/run_assets.py)
    model.source_dir = directory
    if device is not None:
        from .training.device import resolve_device  # the training package imports this module

        model.to(device if isinstance(device, torch.device) else resolve_device(device))
    return model
