"""interlayer: published ways of making Transformer layers work together or cost less, on one core (the methods of
:data:`interlayer.methods.METHODS`: Crossformer, Multi-Pass, Predictive Attention, LW-Transformer and the
cross-layer family since them).

Start with :func:`create_model` (any name :func:`list_models` or ``interlayer models`` lists, or a config, plus
overrides), :func:`count_parameters` and :func:`count_madds`; :func:`save_pretrained` / :func:`load_pretrained` keep
the config and tied weights (also as ``model.save_pretrained`` / ``ModelClass.from_pretrained``); :func:`from_hf` /
:func:`to_hf` bring Hugging Face BERT, ELECTRA, RoBERTa, DistilBERT and ViT models in and back out.

The names below are imported when first used (PEP 562), so that importing one part of the package (a method
module, the core) does not load the rest: :mod:`interlayer.methods` depends only on :mod:`interlayer.core`. Two
things are done at import: giving the core's models their saver and loader
(:func:`interlayer.core.hub.register_storage`), which this package, above every layer, may name and the core may
not; and asking to register interlayer's classes with ``transformers`` once ``transformers`` is imported
(:mod:`interlayer.pretrained.transformers_classes.auto`; nothing of ``transformers`` is imported here, and without
it nothing happens).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .core.hub import register_storage
from .errors import ConfigError
from .plugins import after_import

__version__ = "0.1.0"

# public name -> the module (relative to this package) that defines it
_LAZY: dict[str, str] = {
    "count_madds": "accounting", "count_parameters": "accounting", "step_cost": "accounting", "build_model": "build",
    "CheckpointError": "errors", "load_pretrained": "models.registry", "save_pretrained": "checkpoint",
    "ModelConfig": "config", "apply_overrides": "config", "config_from_dict": "config",
    "create_model": "models.registry", "get_config": "models.registry", "list_models": "models.registry",
    "from_hf": "pretrained.hf", "to_hf": "pretrained.export",
}


def _save(model: Any, directory: Path) -> Path:
    from .checkpoint import save_pretrained

    return save_pretrained(model, directory)


def _load(source: Any, **options: Any) -> Any:
    from .pretrained.hub import load_model

    return load_model(source, **options)


# The core's models save and load through these (core/hub.py): the package, which sits above every layer, wires
# them, so the core imports nothing above it and each is imported when first used.
register_storage(save=_save, load=_load)


def _register_config(_: Any) -> None:
    from .pretrained.transformers_classes.auto import register_config

    register_config()


def _register_trainer_callback(trainer: Any) -> None:
    from .pretrained.transformers_classes.auto import register_trainer_callback

    register_trainer_callback(trainer)


# transformers' AutoConfig / AutoModel* know model_type "interlayer", and its Trainer advances interlayer's step
# counters, from when transformers imports those modules (pretrained/transformers_classes/auto.py).
after_import("transformers.models.auto.configuration_auto", _register_config)
after_import("transformers.trainer", _register_trainer_callback)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'interlayer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["ConfigError", *sorted(_LAZY)]


def __dir__() -> list[str]:
    """The public API only (not this module's helpers, nor the subpackages imported so far)."""
    return sorted([*__all__, "__version__"])
