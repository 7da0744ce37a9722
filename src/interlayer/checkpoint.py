"""Saving and loading models with their config, keeping tied parameters tied.

Tied parameters (one ``nn.Parameter`` reachable under several names) are how interlayer shares weights:
embeddings/output projection, Crossformer's hard guidance, LW's group sharing. ``safetensors`` refuses tensors
that share storage, so a checkpoint stores each tied tensor once, under its first name, and records the *tie map*
(name -> the names it is also known by) in the file's metadata. Loading rebuilds the model from the stored config
(which re-creates the ties), checks the rebuilt model has the same tie map, and loads the canonical tensors.

This module is the bottom layer of saving and loading: tensors, tie maps and the two files. Rebuilding a model
from its saved ``model_type`` and config is the registry's (:func:`interlayer.models.registry.load_pretrained`),
so the training engine, which only writes and reads weights, imports no model family.

:func:`read_saved` also reads the folders interlayer writes for ``transformers``
(:mod:`interlayer.pretrained.hf_modeling`: ``interlayer export`` of a model no ``transformers`` family computes):
their ``config.json`` is ``transformers``' (``model_type: "interlayer"``, the interlayer config and model type in
its ``interlayer`` section, the special token ids and label names beside it) and their tensors carry the
``transformers`` class's ``interlayer.`` prefix.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .errors import CheckpointError
from .fileio import atomic_path, parse_json, read_json, write_atomic

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HF_MODEL_TYPE = "interlayer"  # config.json's model_type in a folder written for transformers
HF_PREFIX = "interlayer."  # where the transformers classes hold the interlayer model
HF_SETTINGS = ("bos_token_id", "eos_token_id", "pad_token_id", "id2label", "label2id")
HF_NAMES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
# the transformers class of each kind of interlayer model (pretrained/hf_modeling.py)
HF_ARCHITECTURES = {"causal_lm": "InterlayerForCausalLM", "encoder_classifier": "InterlayerForSequenceClassification",
                    "image": "InterlayerForImageClassification"}


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


def save_pretrained(model: nn.Module, directory: Union[str, Path]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (tie map and model type in its metadata) into ``directory``.

    ``model.config`` must offer ``save(path)`` and ``to_dict()``; ``model.model_type`` names the family that
    rebuilds it (a ``model_types`` entry of a registered family; default ``"transformer"``).
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


def model_kind(model: nn.Module) -> str:
    """``causal_lm``, ``encoder_classifier``, ``image`` or another model's class name."""
    if getattr(model, "main_input_name", "") == "pixel_values":
        return "image"
    return str(getattr(getattr(model, "config", None), "arch", type(model).__name__))


def transformers_config(model: nn.Module, architecture: Optional[str] = None) -> dict[str, Any]:
    """``config.json`` of a folder written for ``transformers`` (:mod:`interlayer.pretrained.hf_config`): the
    interlayer config and model type, and ``transformers``' names of the sizes, special tokens and labels."""
    cfg = model.config
    core = getattr(cfg, "encoder", cfg)  # an image model's config holds its encoder's
    data: dict[str, Any] = {"model_type": HF_MODEL_TYPE,
                            "architectures": [architecture or HF_ARCHITECTURES.get(model_kind(model),
                                                                                   "InterlayerModel")],
                            "interlayer": {"model_type": getattr(model, "model_type", "transformer"),
                                           "config": cfg.to_dict()}}
    data.update({key: getattr(core, key) for key in HF_NAMES if getattr(core, key, None) is not None})
    data["tie_word_embeddings"] = bool(getattr(core, "arch", "") == "causal_lm" and core.tie_output)
    if getattr(core, "num_classes", 0) and getattr(core, "id2label", None):
        data["id2label"] = {str(k): v for k, v in core.id2label.items()}
        data["label2id"] = {v: int(k) for k, v in core.id2label.items()}
    return data


def save_for_transformers(model: nn.Module, directory: Union[str, Path], config: dict[str, Any],
                          state: Optional[dict[str, torch.Tensor]] = None) -> Path:
    """Write a folder for ``transformers``: ``config`` as ``config.json`` and ``model.safetensors`` holding
    ``state`` (the ``transformers`` class's state dict, names under ``interlayer.``; default ``model``'s), each tied
    tensor once, the tie map in the metadata. :func:`read_saved` reads it back."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ties = tie_map(model)
    if state is None:
        state = {HF_PREFIX + k: v for k, v in canonical_state_dict(model).items()}
    aliases = {HF_PREFIX + alias for group in ties.values() for alias in group}
    tensors = {k: v.detach().contiguous() for k, v in state.items() if k not in aliases}
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", "tie_map": json.dumps(ties)})
    write_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return directory


@dataclass(frozen=True)
class SavedModel:
    """A model folder as read from disk, before any model is built: its ``model_type`` (from the weights'
    metadata; :func:`interlayer.models.registry.load_pretrained` picks the family that rebuilds it), the config
    dict and the tie map it was saved with."""

    directory: Path
    model_type: str
    config: dict[str, Any]
    ties: dict[str, list[str]]
    prefix: str = ""  # the tensors' names start with it (a folder written for transformers: "interlayer.")
    settings: Optional[dict[str, Any]] = None  # transformers' settings the config.json holds (eos_token_id, ...)

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def weights_path(self) -> Path:
        return self.directory / WEIGHTS_FILE


def read_saved(directory: Union[str, Path]) -> SavedModel:
    """The config, model type and tie map of a folder written by :func:`save_pretrained` (tensors not read)."""
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
    ties = parse_json(metadata.get("tie_map", "{}"), f"{weights_path} (metadata tie_map)", CheckpointError)
    config = read_json(config_path, CheckpointError)
    if config.get("model_type") == HF_MODEL_TYPE:
        section = config.get("interlayer")
        if not isinstance(section, dict) or not isinstance(section.get("config"), dict):
            raise CheckpointError(f"{config_path}: model_type 'interlayer' without an interlayer section "
                                  "({'model_type': ..., 'config': {...}}): the file is damaged")
        settings = {key: config[key] for key in HF_SETTINGS if config.get(key) is not None}
        if "id2label" in settings:
            settings["id2label"] = {int(k): v for k, v in settings["id2label"].items()}
        return SavedModel(directory, str(section.get("model_type", "transformer")), section["config"], ties,
                          HF_PREFIX, settings)
    return SavedModel(directory, metadata.get("model_type", "transformer"), config, ties)


def load_saved_weights(model: nn.Module, saved: SavedModel) -> nn.Module:
    """Load ``saved``'s tensors into ``model``, rebuilt from ``saved.config``, after checking that it is tied as the
    saved one was; sets ``model.source_dir`` (an export finds the run's tokenizer, labels and scores there:
    pretrained/run_assets.py)."""
    if saved.ties != tie_map(model):
        raise CheckpointError(f"{saved.weights_path} was saved with tied parameters {saved.ties}, but its config "
                              f"builds a model tied as {tie_map(model)}; the files come from different models")
    try:
        tensors = load_file(str(saved.weights_path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{saved.weights_path}: cannot read the tensors ({err}); the file may be truncated "
                              "or corrupt: copy it again, or save the model again") from None
    if saved.prefix:
        tensors = {name[len(saved.prefix):]: t for name, t in tensors.items() if name.startswith(saved.prefix)}
    load_canonical_state_dict(model, tensors, source=str(saved.weights_path))
    core = getattr(model.config, "encoder", model.config)  # an image model's config holds its encoder's
    for key, value in (saved.settings or {}).items():
        setattr(core, key, value)
    model.source_dir = saved.directory
    return model
