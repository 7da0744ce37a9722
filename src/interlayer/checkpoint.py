"""Saving and loading models with their config, keeping tied parameters tied.

Tied parameters (one ``nn.Parameter`` reachable under several names) are how interlayer shares weights:
embeddings/output projection, Crossformer's hard guidance, LW's group sharing. ``safetensors`` refuses tensors
that share storage, so a checkpoint stores each tied tensor once, under its first name, and records the *tie map*
(name -> the names it is also known by) in the file's metadata. Loading rebuilds the model from the stored config
(which re-creates the ties), checks the rebuilt model has the same tie map, and loads the canonical tensors.

This module is the bottom layer of saving and loading: tensors, tie maps and the two files. Rebuilding a model
from its saved ``model_type`` and config is the registry's (:func:`interlayer.models.registry.load_pretrained`),
so the training engine, which only writes and reads weights, imports no model family.

Every folder's ``config.json`` is ``transformers``' (:func:`transformers_config`: ``model_type: "interlayer"``, the
interlayer config and model type in its ``interlayer`` section, the special token ids and label names beside it),
so ``transformers``' Auto classes load interlayer's own folders after ``import interlayer``; the tensors keep
interlayer's names (metadata ``format: "interlayer"``). :func:`read_saved` also reads the folders of interlayer's
``transformers`` classes (:mod:`interlayer.pretrained.transformers_classes.modeling`: their ``save_pretrained``,
``interlayer export`` of a model no ``transformers`` family computes), whose tensors carry the class's
``interlayer.`` prefix, and folders written before (``config.json`` the config alone, the model type in the
weights' metadata).

**Sizes are checked before any model is built** (:func:`size_checked_config`): a folder from a stranger may declare
``enc_layers=10000000`` or ``src_vocab_size=10**12`` over weights of one small layer, and building that model
first would take the machine's memory. The check reads the weights file's header only (names and shapes) and
refuses, naming the key, the value and what the file holds:

1. any option a config class names a size of its weights (``WEIGHT_SIZES``: a dimension or a count of the saved
   tensors in every model the class builds, such as ``d_model`` or ``enc_layers``) larger than every dimension of
   every tensor in the file and than the number of tensor names (aliases of tied tensors counted): the file's own
   tensors do not justify it. Every other option (a schedule, an iteration count, a choice, a coefficient, or a
   size only under another option, such as ``max_positions`` of a learned table or ``dec_layers`` of an
   encoder-decoder) is bounded by its config's own ``validate``, which the loader runs as training does, and is
   compared with the weights by steps 3 and 4 wherever it does shape a tensor: a run is never refused for a value
   it trained with (training applies the same steps to its model before it starts: :func:`check_loadable`);
2. a config that, built on PyTorch's ``meta`` device (shapes only, no memory), registers more parameter tensors
   than four times the file's names and 256 more (:func:`build_on_meta` stops the build there, so ten million
   layers cost nothing; the margin is for a Hugging Face checkpoint, whose fused tensors become several
   parameters, with method sections adding their own);
3. any tensor of that shapes-only model missing from the file, unknown to it, or of another shape, and a tie map
   other than the saved one;
4. buffers the file does not hold (position tables, index tables) of more numbers than :func:`buffer_budget`.

The same pieces check a Hugging Face folder (:func:`interlayer.pretrained.hf_load.check_sizes`): its method sections
by (1), its build by (2) and (4); its core sizes are all tensors of the checkpoint, compared by name there.
"""
from __future__ import annotations

import json
import math
import os
import threading
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .errors import CheckpointError, ConfigError, TooManyTensors
from .fileio import atomic_path, confined, parse_json, read_json, write_atomic

# Values up to this are never refused: no setting this small makes a model the file could not hold (the default
# dec_layers=6 of a tiny language model whose tensors are 4 wide, say).
MEASURED_FLOOR = 64
# Buffers outside the weights file may hold at most this many numbers, or as many as the file's tensors, whichever
# is more: 2^24 is a sinusoidal table of 65,536 positions x 256 widths (64 MiB in fp32).
BUFFER_FLOOR = 2 ** 24
# The most parameter tensors a model built for training may register (check_buildable): a thousand layers of any
# method's model hold fewer
MAX_TENSORS = 100_000

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HF_MODEL_TYPE = "interlayer"  # config.json's model_type in a folder written for transformers
HF_PREFIX = "interlayer."  # where the transformers classes hold the interlayer model
NATIVE_FORMAT = "interlayer"  # model.safetensors' metadata format when its names are interlayer's (no HF_PREFIX)
HF_SETTINGS = ("bos_token_id", "eos_token_id", "pad_token_id", "id2label", "label2id")
HF_NAMES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
# the transformers class of each kind of interlayer model (pretrained/transformers_classes/modeling.py)
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
    aliases = {alias for group in tie_map(model).values() for alias in group}
    own = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in own.items() if k not in aliases}
    problem = _fit_problem(expected, {k: tuple(v.shape) for k, v in state.items() if k not in aliases}, source)
    if problem is not None:
        raise CheckpointError(problem)
    model.load_state_dict({k: state[k] for k in expected}, strict=False)


def save_pretrained(model: nn.Module, directory: Union[str, Path]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (tie map and model type in its metadata) into ``directory``.

    ``config.json`` is ``transformers``' (:func:`transformers_config`: ``model_type: "interlayer"``, the model's
    config in its ``interlayer`` section), so that ``AutoModelForCausalLM.from_pretrained(directory)`` (and the
    other Auto classes) load the folder after ``import interlayer``, as they load a ``transformers`` model's
    ``save_pretrained``; the tensors keep interlayer's names (no ``interlayer.`` prefix: the metadata's
    ``format`` is ``"interlayer"``). ``model.config`` must offer ``to_dict()``; ``model.model_type`` names the
    family that rebuilds it (a ``model_types`` entry of a registered family; default ``"transformer"``). Folders
    written before (``config.json`` the config alone) still load (:func:`read_saved`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in canonical_state_dict(model).items()}
    metadata = {"tie_map": json.dumps(tie_map(model)), "format": NATIVE_FORMAT,
                "model_type": getattr(model, "model_type", "transformer")}
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    write_atomic(directory / CONFIG_FILE, json.dumps(transformers_config(model), indent=2) + "\n")
    return directory


def model_kind(model: nn.Module) -> str:
    """``causal_lm``, ``encoder_classifier``, ``image`` or another model's class name."""
    if getattr(model, "main_input_name", "") == "pixel_values":
        return "image"
    return str(getattr(getattr(model, "config", None), "arch", type(model).__name__))


def transformers_config(model: nn.Module, architecture: Optional[str] = None) -> dict[str, Any]:
    """``config.json`` of a folder written for ``transformers``
    (:mod:`interlayer.pretrained.transformers_classes.configuration`): the interlayer config and model type, and
    ``transformers``' names of the sizes, special tokens and labels."""
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
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the weights' header: name -> shape
    prefix: str = ""  # the tensors' names start with it (a folder written for transformers: "interlayer.")
    settings: Optional[dict[str, Any]] = None  # transformers' settings the config.json holds (eos_token_id, ...)

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def weights_path(self) -> Path:
        return self.directory / WEIGHTS_FILE


def read_saved(directory: Union[str, Path]) -> SavedModel:
    """The config, model type, tie map and tensor shapes of a folder written by :func:`save_pretrained`, from
    ``config.json`` and the weights' header (no tensor is read). Both files must be regular files inside the
    folder (:func:`~interlayer.fileio.confined`)."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not os.path.lexists(path):  # a link to nowhere is no missing file: confined() names it
            raise CheckpointError(f"{directory} is not an interlayer checkpoint: {path.name} is missing")
    try:
        with safe_open(str(confined(weights_path, directory, CheckpointError)), framework="pt") as handle:
            metadata = handle.metadata() or {}
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({err}); it may be truncated or "
                              "corrupt: copy it again, or save the model again") from None
    ties = parse_json(metadata.get("tie_map", "{}"), f"{weights_path} (metadata tie_map)", CheckpointError)
    if not isinstance(ties, dict) or not all(isinstance(v, list) for v in ties.values()):
        raise CheckpointError(f"{weights_path}: the metadata's tie_map is not a JSON object of name -> list of names")
    config = read_json(config_path, CheckpointError, within=directory)
    if config.get("model_type") == HF_MODEL_TYPE:
        section = config.get("interlayer")
        if not isinstance(section, dict) or not isinstance(section.get("config"), dict):
            raise CheckpointError(f"{config_path}: model_type 'interlayer' without an interlayer section "
                                  "({'model_type': ..., 'config': {...}}): the file is damaged")
        settings = {key: config[key] for key in HF_SETTINGS if config.get(key) is not None}
        if "id2label" in settings:
            settings["id2label"] = {int(k): v for k, v in settings["id2label"].items()}
        # the size check compares names with interlayer's model: without the transformers class's prefix
        prefix = "" if metadata.get("format") == NATIVE_FORMAT else HF_PREFIX
        shapes = {name.removeprefix(prefix): shape for name, shape in shapes.items()}
        return SavedModel(directory, str(section.get("model_type", "transformer")), section["config"], ties, shapes,
                          prefix, settings)
    return SavedModel(directory, metadata.get("model_type", "transformer"), config, ties, shapes)


# ------------------------------------------------------------------------------------ sizes, before any build


def tensor_extent(shapes: Mapping[str, tuple[int, ...]], aliases: int = 0) -> tuple[int, int]:
    """What a weights file holds, as the size check measures it: (the largest dimension of any tensor, the number
    of tensor names, ``aliases`` of tied tensors included)."""
    return max((d for shape in shapes.values() for d in shape), default=0), len(shapes) + aliases


def _field_classes(cls: Optional[type]) -> dict[str, type]:
    """Field name -> the dataclass a nested section of ``cls`` is read as (``Optional[X]`` -> ``X``)."""
    if cls is None or not is_dataclass(cls):
        return {}
    hints = typing.get_type_hints(cls)
    out = {}
    for item in fields(cls):
        candidates = [hints.get(item.name), *typing.get_args(hints.get(item.name))]
        nested = next((c for c in candidates if isinstance(c, type) and is_dataclass(c)), None)
        if nested is not None:
            out[item.name] = nested
    return out


def weight_sizes(cls: Optional[type]) -> frozenset[str]:
    """The options of config class ``cls`` that size its weights (its ``WEIGHT_SIZES``; none for a class without)."""
    return frozenset(getattr(cls, "WEIGHT_SIZES", ()))


def _sizes(config: Mapping[str, Any], cls: Optional[type], prefix: str = "") -> Iterator[tuple[str, int]]:
    """(dotted key, value) of every integer of ``config`` that sizes the weights (lists included), reading nested
    sections as the dataclasses ``cls`` declares."""
    sizes, nested = weight_sizes(cls), _field_classes(cls)
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _sizes(value, nested.get(key), f"{name}.")
            continue
        if key not in sizes:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool):
                yield name, item


def check_config_sizes(config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], *, config_class: type,
                       source: str, holder: str, aliases: int = 0,
                       error: type[Exception] = CheckpointError,
                       verdict: str = "refused before any model was built: the config was edited or belongs to "
                                      "other weights") -> None:
    """Step 1 of the module docstring: refuse (``error``) a size of the weights in ``config`` (read as
    ``config_class``) that the tensors of ``holder`` (whose ``shapes`` they are) do not justify, naming ``source``
    (the config's file), the key, the value, what the file holds and ``verdict``."""
    widest, names = tensor_extent(shapes, aliases)
    limit = max(widest, names, MEASURED_FLOOR)
    for key, value in _sizes(config, config_class):
        if value > limit:
            raise error(
                f"{source}: {key}={value} is larger than anything {holder} holds ({names} tensors, none with a "
                f"dimension above {widest}); {verdict}")


def _meta_build(build: Callable[[], nn.Module], budget: int) -> nn.Module:
    """``build()`` on the ``meta`` device (shapes only), stopped with :class:`TooManyTensors` as soon as it has
    registered more than ``budget`` parameter tensors."""
    builder = threading.get_ident()
    count = 0

    def counted(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        nonlocal count
        if threading.get_ident() == builder:
            count += 1
            if count > budget:
                raise TooManyTensors

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(counted)
    try:
        with torch.device("meta"):
            return build()
    finally:
        handle.remove()


def build_on_meta(build: Callable[[], nn.Module], names: int, *, source: str, holder: str,
                  error: type[Exception] = CheckpointError) -> nn.Module:
    """Step 2 of the module docstring: ``build()`` on the ``meta`` device (shapes only), stopped with
    :class:`CheckpointError` as soon as it has registered more than ``4 * names + 256`` parameter tensors (a config
    that asks for millions of layers over the ``names`` tensors of ``holder`` is refused after a few)."""
    budget = 4 * names + 256
    try:
        return _meta_build(build, budget)
    except TooManyTensors:
        raise error(f"{source} describes a model of more than {budget} parameter tensors, but {holder} "
                    f"holds {names}; refused before any model was built: the config was edited or belongs "
                    "to other weights") from None
    except RuntimeError as err:  # a size PyTorch cannot even describe ("Storage size calculation overflowed")
        raise error(f"{source} describes a model PyTorch cannot build ({str(err).splitlines()[0]}); refused "
                    "before any model was built: the config was edited or is damaged") from None


def machine_memory() -> int:
    """Bytes of physical memory of this machine (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def check_buildable(build: Callable[[], nn.Module]) -> None:
    """Refuse (:class:`~interlayer.errors.ConfigError`) a config whose model cannot be built here, before it is
    built for real: one of more than :data:`MAX_TENSORS` parameter tensors (``enc_layers=10000000`` built layers for
    minutes, then ran out of memory), or whose parameters and tables alone need more bytes than this machine has
    (``d_model=10**9``, ``max_positions`` or a grid far too large: the allocator's "can't allocate memory" named
    no option). The shapes-only build costs no memory; the message names the largest tensor, whose shape points at
    the option."""
    try:
        shadow = _meta_build(build, MAX_TENSORS)
    except TooManyTensors:
        raise ConfigError(f"the model would hold more than {MAX_TENSORS:,} parameter tensors (a depth, count or "
                          "rate mistyped?); refused before it was built") from None
    except RuntimeError as err:  # a size PyTorch cannot even describe ("Storage size calculation overflowed")
        raise ConfigError(f"the model cannot be built: {str(err).splitlines()[0]} (a size mistyped?); refused "
                          "before it was built") from None
    tensors = [(name, t) for name, t in [*shadow.named_parameters(), *shadow.named_buffers()]]
    need, memory = sum(t.numel() * t.element_size() for _, t in tensors), machine_memory()
    if memory and need > memory:
        name, largest = max(tensors, key=lambda item: item[1].numel())
        raise ConfigError(f"the model's parameters and tables need {need / 2 ** 30:,.1f} GiB (the largest, {name}, "
                          f"of shape {tuple(largest.shape)}), more than this machine's {memory / 2 ** 30:,.1f} GiB of "
                          "memory; refused before it was built: lower the size that shape comes from")


def buffer_budget(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """How many numbers a model may hold outside its weights file (step 4): as many as the file, or
    :data:`BUFFER_FLOOR`, whichever is more."""
    return max(sum(math.prod(shape) for shape in shapes.values()), BUFFER_FLOOR)


def check_buffers(shadow: nn.Module, shapes: Mapping[str, tuple[int, ...]], *, source: str, holder: str,
                  error: type[Exception] = CheckpointError,
                  verdict: str = "refused before any model was built: lower max_positions (or the grid sizes), or "
                                 "the config was edited") -> None:
    """Step 4 of the module docstring, on the shapes-only model ``shadow``: the buffers it keeps outside the state
    dict (position and index tables) may not hold more numbers than :func:`buffer_budget` (else ``error``, ending
    with ``verdict``)."""
    saved = set(shadow.state_dict())
    extra = [(name, buffer) for name, buffer in shadow.named_buffers() if name not in saved]
    total, limit = sum(buffer.numel() for _, buffer in extra), buffer_budget(shapes)
    if total > limit:
        name, buffer = max(extra, key=lambda item: item[1].numel())
        raise error(f"{source} describes a model whose tables outside the weights hold {total:,} numbers (the "
                    f"largest, {name}, of shape {tuple(buffer.shape)}), more than {limit:,} for what {holder} holds; "
                    f"{verdict}")


def _fit_problem(expected: Mapping[str, tuple[int, ...]], given: Mapping[str, tuple[int, ...]], source: str
                 ) -> Optional[str]:
    """Why tensors of shapes ``given`` do not fill a model whose canonical tensors have shapes ``expected``."""
    missing, unexpected = [k for k in expected if k not in given], sorted(set(given) - set(expected))
    if missing or unexpected:
        return (f"{source} does not fit this model: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    wrong = next((k for k in expected if tuple(given[k]) != tuple(expected[k])), None)
    if wrong is not None:
        return f"{source}: {wrong} has shape {tuple(given[wrong])}, the model expects {tuple(expected[wrong])}"
    return None


def size_checked_config(saved: SavedModel, config_class: type, from_dict: Callable[[dict[str, Any]], Any],
                   build: Callable[[Any], nn.Module]) -> Any:
    """The config of ``saved`` (``from_dict(saved.config)``), once the model it builds is known to be the one the
    weights' header describes: steps 1-4 of the module docstring, before any model is built for real."""
    holder = str(saved.weights_path)
    aliases = sum(len(group) for group in saved.ties.values())
    check_config_sizes(saved.config, saved.shapes, config_class=config_class, source=str(saved.config_path),
                       holder=holder, aliases=aliases)
    config = from_dict(saved.config)
    shadow = build_on_meta(lambda: build(config), tensor_extent(saved.shapes, aliases)[1],
                           source=str(saved.config_path), holder=holder)
    _check_ties(saved, shadow)
    problem = _fit_problem({k: tuple(v.shape) for k, v in canonical_state_dict(shadow).items()}, saved.shapes,
                           holder)
    if problem is not None:
        raise CheckpointError(f"{problem}; refused before any model was built: {saved.config_path} and the weights "
                              "come from different models")
    check_buffers(shadow, saved.shapes, source=str(saved.config_path), holder=holder)
    return config


def check_loadable(model: nn.Module) -> None:
    """Refuse (:class:`~interlayer.errors.ConfigError`) a model that :func:`size_checked_config` would refuse once
    saved: steps 1 and 4 of the module docstring against its own tensors. Training calls it before a run starts,
    so that no run trains a model its own ``best/`` could not give back to ``generate``, ``evaluate`` or
    ``export`` (steps 2 and 3 compare the model with itself and always pass)."""
    shapes = {k: tuple(v.shape) for k, v in canonical_state_dict(model).items()}
    aliases = sum(len(group) for group in tie_map(model).values())
    config, where = model.config, "its saved weights file"
    verdict = ("refused before training: a saved copy of this model could not be loaded back (generate, evaluate "
               "and export would refuse it)")
    check_config_sizes(config.to_dict(), shapes, config_class=type(config), source="the model's config",
                       holder=where, aliases=aliases, error=ConfigError, verdict=verdict)
    check_buffers(model, shapes, source="the model's config", holder=where, error=ConfigError,
                  verdict=f"{verdict}: lower max_positions (or the grid sizes)")


def _check_ties(saved: SavedModel, model: nn.Module) -> None:
    if saved.ties != tie_map(model):
        raise CheckpointError(f"{saved.weights_path} was saved with tied parameters {saved.ties}, but its config "
                              f"builds a model tied as {tie_map(model)}; the files come from different models")


def load_saved_weights(model: nn.Module, saved: SavedModel) -> nn.Module:
    """Load ``saved``'s tensors into ``model``, rebuilt from ``saved.config``, after checking that it is tied as the
    saved one was; sets ``model.source_dir`` (an export finds the run's tokenizer, labels and scores there:
    pretrained/run_assets.py)."""
    _check_ties(saved, model)
    try:
        tensors = load_file(str(confined(saved.weights_path, saved.directory, CheckpointError)))
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
