"""Every named model of interlayer in one registry: ``create_model(name)`` builds whatever ``interlayer models`` lists.

Models come in *families*, each with its own config class: the Transformer (:class:`~interlayer.config.ModelConfig`,
translation, language modelling and the text tasks), the text CNN, the image models and GAT. A family module
registers a :class:`Family` (how a config is read, overridden and built, how its MAdds are counted); a preset is a
plain dict of config fields with a description, registered under a family by the module that holds it: the
papers' presets by :mod:`interlayer.papers`, a family's own defaults by its module. Lookups first import every
module of :mod:`interlayer.models` and :mod:`interlayer.papers` (as :func:`interlayer.tasks.task_specs` finds
tasks), so a new family is one module in ``models/`` that calls :func:`register_family` and
:func:`register_presets`, with nothing to edit elsewhere.

One resolver serves every family: a preset name, a ``.json``/``.yaml`` file, a dict or a config object, then the
overrides (``d_model=128``, dotted or double-underscore keys for nested sections, strings parsed as ``--set``
values). A dict or file is read as the family whose ``claims`` accepts it (a ``model_type`` key, an image
``backbone``), else as a Transformer; a task passes ``family=`` so that a preset of another family is refused with
the names it accepts.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import nn

from ..accounting import count_parameters
from ..checkpoint import SavedModel, load_saved_weights, read_saved, size_checked_config
from ..config_io import ConfigFile, MethodSlots, checked_config, flatten_overrides, read_config_file, set_dotted
from ..devices import resolve_device
from ..errors import CheckpointError, ConfigError
from ..plugins import import_modules
from ..tables import format_table, human

# Packages whose modules register families and presets when imported.
PLUGIN_PACKAGES = ("interlayer.models", "interlayer.papers")
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class Family:
    """A kind of model with its own config class.

    ``from_dict(data, source)`` validates a config dict (errors prefixed with ``source``); ``override(config,
    overrides)`` returns a new validated config with dotted-key overrides applied (string values are ``--set``
    text); ``claims(data)`` says whether a config dict describes this family (``None``: the default family, the
    Transformer); ``madds(preset, model, length)`` is what ``interlayer models`` prints under ``madds_unit``
    (``{length}`` is filled in); ``rank`` orders the families' tables; ``model_types`` are the ``model_type``
    names its models are saved under (:func:`~interlayer.checkpoint.save_pretrained`), which
    :func:`load_pretrained` rebuilds with ``build(from_dict(config))``; ``method_slots``: where the named
    ``compare`` variants of the methods write their sections (default: the config is a Transformer's).
    """

    name: str
    title: str
    tasks: str
    config_class: type
    from_dict: Callable[[dict[str, Any], str], Any]
    override: Callable[[Any, dict[str, Any]], Any]
    build: Callable[[Any], nn.Module]
    madds: Callable[[str, nn.Module, int], int]
    madds_unit: str
    rank: int
    model_types: tuple[str, ...]
    claims: Optional[Callable[[dict[str, Any]], bool]] = None
    method_slots: MethodSlots = MethodSlots()


@dataclass(frozen=True)
class Preset:
    """A named model: its family, what it is (with the paper's table or section), and the fields it sets over the
    family's defaults."""

    name: str
    description: str
    fields: dict[str, Any]
    family: str = "transformer"


_FAMILIES: dict[str, Family] = {}
_PRESETS: dict[str, Preset] = {}
_MODEL_TYPES: dict[str, Family] = {}  # a saved model's ``model_type`` -> the family that rebuilds it


def register_family(family: Family) -> Family:
    """Add a model family to the registry (each family module calls it when imported); a name, a default family
    (``claims=None``) or a saved model type registered twice is an error."""
    if family.name in _FAMILIES:
        raise RuntimeError(f"model family {family.name!r} is registered twice")
    if family.claims is None and any(f.claims is None for f in _FAMILIES.values()):
        raise RuntimeError(f"model family {family.name!r}: only one family may be the default (claims=None)")
    taken = sorted(set(family.model_types) & set(_MODEL_TYPES))
    if taken:
        raise RuntimeError(f"model family {family.name!r}: model types {taken} are already registered")
    _FAMILIES[family.name] = family
    _MODEL_TYPES.update(dict.fromkeys(family.model_types, family))
    return family


def register_presets(family: str, presets: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Register ``name -> (description, fields)`` under ``family``; a name is one model, whatever its family."""
    for name, (description, fields) in presets.items():
        if name in _PRESETS:
            raise RuntimeError(f"preset {name!r} is defined twice ({_PRESETS[name].family} and {family})")
        _PRESETS[name] = Preset(name, description, fields, family)


@functools.lru_cache(maxsize=None)
def discover() -> None:
    """Import every module of :data:`PLUGIN_PACKAGES` once, so that all families and presets are registered."""
    for package in PLUGIN_PACKAGES:
        import_modules(package)


def families() -> list[Family]:
    """The registered families in the order of their tables."""
    discover()
    return sorted(_FAMILIES.values(), key=lambda f: f.rank)


def family(name: str) -> Family:
    discover()
    if name not in _FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; known: {', '.join(f.name for f in families())}")
    return _FAMILIES[name]


def presets(family_name: Optional[str] = None) -> dict[str, Preset]:
    """Every preset by name (or those of one family), in name order."""
    discover()
    wanted = family(family_name).name if family_name is not None else None
    return {name: _PRESETS[name] for name in sorted(_PRESETS)
            if wanted is None or _PRESETS[name].family == wanted}


def list_models(pattern: Optional[str] = None, family: Optional[str] = None) -> list[str]:
    """Sorted preset names, optionally filtered by a shell-style ``pattern`` (``"*crossformer*"``, as timm's
    ``list_models``) and by ``family`` (``"transformer"``, ``"text_cnn"``, ``"image"``, ``"gat"``)."""
    names = list(presets(family))
    return [n for n in names if fnmatch.fnmatchcase(n, pattern)] if pattern else names


def get_config(name_or_config: Union[str, Path, dict[str, Any], Any], *, family: Optional[str] = None,
               **overrides: Any) -> Any:
    """A validated config from a preset name, a config file, a dict or a config, with overrides applied.

    Overrides use field names; a nested section's keys are reached with a double underscore or a dict:
    ``get_config("transformer_small", d_model=128, crossformer={"hard": ["kq"]})``. ``family`` restricts what is
    accepted (a task's models) and decides how a dict or file is read.
    """
    kind, cfg = _resolve(name_or_config, family)
    if not overrides:
        return cfg
    return kind.override(cfg, flatten_overrides(overrides))


def create_model(name_or_config: Union[str, Path, dict[str, Any], Any], *, family: Optional[str] = None,
                 **overrides: Any) -> nn.Module:
    """Build the model of a preset name, config file, dict or config; ``overrides`` as in :func:`get_config`."""
    cfg = get_config(name_or_config, family=family, **overrides)
    return config_family(cfg).build(cfg)


def config_family(cfg: Any) -> Family:
    """The family whose config class ``cfg`` (a resolved config, as :func:`get_config` returns) is."""
    return next(kind for kind in families() if isinstance(cfg, kind.config_class))


def load_pretrained(directory: Union[str, Path], device: Union[str, torch.device, None] = None) -> nn.Module:
    """The model saved in ``directory`` by :func:`~interlayer.checkpoint.save_pretrained`, rebuilt by the family
    that registered its ``model_type`` and re-tied, on ``device`` (a ``torch.device`` or ``"auto" | "cpu" |
    "cuda[:N]" | "mps"``; default the CPU) when given, in eval mode (dropout off) as ``transformers``'
    ``from_pretrained`` returns models: call ``.train()`` to train it. The model's ``source_dir`` is
    ``directory``.

    Nothing is built before the config's sizes are checked against the weights' header
    (:func:`~interlayer.checkpoint.size_checked_config`: a ``config.json`` declaring ten million layers over one is
    refused naming the key, at no cost)."""
    saved = read_saved(directory)
    model = build_saved(saved.model_type, saved.config, str(saved.config_path), saved=saved)
    load_saved_weights(model, saved)
    if device is not None:
        model.to(device if isinstance(device, torch.device) else resolve_device(device))
    return model.eval()


def build_saved(model_type: str, config: dict[str, Any], source: str, *, saved: Optional[SavedModel] = None
                ) -> nn.Module:
    """A freshly initialised model of a saved ``model_type`` and config dict (what :func:`load_pretrained` loads
    the weights into; the ``transformers`` classes build interlayer models of every family with it). With
    ``saved`` (the folder as read), the config's sizes are checked against its weights' header first
    (:func:`~interlayer.checkpoint.size_checked_config`)."""
    discover()
    if model_type not in _MODEL_TYPES:
        raise CheckpointError(f"{source} holds a {model_type!r} model; known model types: "
                              f"{', '.join(sorted(_MODEL_TYPES))} (import the module that registers it)")
    kind = _MODEL_TYPES[model_type]
    try:
        if saved is None:
            return kind.build(kind.from_dict(config, source))
        checked = size_checked_config(saved, kind.config_class, lambda data: kind.from_dict(data, source),
                                      kind.build)
        return kind.build(checked)
    except ConfigError as err:  # the config's own errors name the file already; a build's may not
        named = str(err) if str(err).startswith(f"{source}: ") else f"{source}: {err}"
        raise CheckpointError(named + ("; refused before any model was built" if saved is not None else "")) from None


def _resolve(source: Any, family_name: Optional[str]) -> tuple[Family, Any]:
    allowed = [family(family_name)] if family_name is not None else families()
    for kind in allowed:
        if isinstance(source, kind.config_class):
            return kind, copy.deepcopy(source)
    if isinstance(source, dict):
        data, where = copy.deepcopy(source), "config"
    elif isinstance(source, str) and source in _PRESETS:  # family() / families() above ran discover()
        preset = _PRESETS[source]
        if preset.family not in {kind.name for kind in allowed}:
            raise ConfigError(f"{source!r} is a {preset.family} model, not a {family_name} model; "
                              f"{family_name} presets: {', '.join(list_models(family=family_name))} (or a "
                              ".json/.yaml config file)")
        kind = _FAMILIES[preset.family]
        return kind, kind.from_dict(copy.deepcopy(preset.fields), f"preset {source}")
    elif isinstance(source, (str, Path)) and Path(source).suffix in CONFIG_SUFFIXES:
        data, where = read_config_file(source), str(source)
    else:
        known = [name for kind in allowed for name in list_models(family=kind.name)]
        close = difflib.get_close_matches(str(source), known, n=3)
        raise ConfigError(f"unknown preset {str(source)!r}" + (f"; did you mean {close}?" if close else "")
                          + " (list them with `interlayer models`, or pass a .json/.yaml config file)")
    kind = allowed[0] if family_name is not None else _claimant(data)
    return kind, kind.from_dict(data, where)


def _claimant(data: dict[str, Any]) -> Family:
    """The family a config dict describes: the first that claims it, else the default family."""
    kinds = families()
    for kind in kinds:
        if kind.claims is not None and kind.claims(data):
            return kind
    return next(kind for kind in kinds if kind.claims is None)


def override_flat(cfg: ConfigFile, overrides: dict[str, Any]) -> Any:
    """A flat config dataclass (no nested sections: GAT, the text CNN) with ``overrides`` applied
    (:func:`~interlayer.config_io.set_dotted`) and validated."""
    return checked_config(type(cfg), set_dotted(dataclasses.asdict(cfg), overrides), "overrides")


def model_catalog(length: int = 64, names: Optional[Sequence[str]] = None) -> str:
    """A table per family of every model (or only ``names``): parameters and the MAdds of one forward pass.

    Text models are counted at their presets' placeholder vocabulary; a task replaces it with the size of the
    vocabulary it builds, so a run's ``results.json`` holds the exact figures for its data.
    """
    wanted = set(names or [])
    unknown = sorted(wanted - set(list_models()))
    if unknown:
        raise ConfigError(f"unknown model preset(s) {unknown}; known: {', '.join(list_models())}")
    parts = []
    for kind in families():
        rows = []
        for name in list_models(family=kind.name):
            if wanted and name not in wanted:
                continue
            with torch.device("meta"):  # shapes are all the table needs: no memory, no initialisation
                model = create_model(name)
            rows.append([name, f"{count_parameters(model):,}", human(kind.madds(name, model, length))])
        if rows:
            parts.append(f"{kind.title} (tasks: {kind.tasks})\n\n"
                         + format_table(["preset", "parameters", kind.madds_unit.format(length=length)], rows))
    return "\n\n".join(parts)

