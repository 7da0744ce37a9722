"""The full model configuration: the core Transformer's fields plus one optional section per method.

A section left ``None`` means the method is off. Configs round-trip through JSON and YAML, and every loader path
(file, dict, ``--set key=value`` overrides) goes through :func:`config_from_dict`, which rejects unknown keys
(suggesting the closest valid one) and values of the wrong type, naming the dotted key that was wrong.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .config_io import ConfigFile, checked_config, read_config_file, set_dotted
from .errors import ConfigError
from .methods import METHODS
from .methods.base import ComposedConfig


def _with_method_sections(cls: type) -> type:
    """``cls`` as a dataclass with one field per method of :data:`~interlayer.methods.METHODS`, in that order: the
    method's name, typed ``Optional[method.config_class]``, ``None`` (off) by default. A method's section is
    declared by the method (its ``name`` and ``config_class``), so adding a method adds its field here."""
    annotations = dict(cls.__dict__.get("__annotations__", {}))
    for method in METHODS:
        annotations[method.name] = Optional[method.config_class]
        setattr(cls, method.name, None)
    cls.__annotations__ = annotations
    return dataclass(cls)


@_with_method_sections
class ModelConfig(ConfigFile, ComposedConfig):
    """A :class:`TransformerConfig` plus the method sections (each ``None`` when the method is off), one per method
    of :data:`~interlayer.methods.METHODS`, under the method's name."""

    def sections(self) -> list[tuple[Any, Any]]:
        """(method, section) for every method that is on."""
        return [(m, getattr(self, m.name)) for m in METHODS if getattr(self, m.name) is not None]

    def validate(self) -> None:
        super().validate()
        for method, section in self.sections():
            method.validate(section, self)

    @classmethod
    def load(cls, path: Union[str, Path]) -> "ModelConfig":
        return config_from_dict(read_config_file(path), source=str(path))


# Keys renamed after configs holding them were saved: (section, old key) -> new key. A saved config keeps loading.
RENAMED_KEYS: dict[tuple[str, str], str] = {("crossformer", "sg_reduction"): "reduction"}


def _renamed(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    for (section, old), new in RENAMED_KEYS.items():
        if isinstance(out.get(section), dict) and old in out[section]:
            block = dict(out[section])
            if new in block:
                raise ConfigError(f"{section}.{old} is the old name of {section}.{new}; give only {section}.{new}")
            block[new] = block.pop(old)
            out[section] = block
    if isinstance(out.get("value_residual"), dict) and "lambdas" in out["value_residual"]:
        out["value_residual"] = _legacy_lambdas(out["value_residual"])
    return out


def _legacy_lambdas(block: dict[str, Any]) -> dict[str, Any]:
    """``value_residual.lambdas = [on V_n, on V_1]`` (the section's first naming, the reverse of the paper's order)
    as the paper's ``lambda_2`` (on V_n) and ``lambda_1`` (on V_1), with a DeprecationWarning; the mix it gives is
    the one the old key gave."""
    block = dict(block)
    old = block.pop("lambdas")
    if "lambda_1" in block or "lambda_2" in block:
        raise ConfigError("value_residual.lambdas is the old form of value_residual.lambda_1 / lambda_2; give only "
                          "lambda_1 (the weight on V_1) and lambda_2 (on V_n)")
    if not isinstance(old, (list, tuple)) or len(old) != 2:
        raise ConfigError(f"value_residual.lambdas={old!r} (the old form, [weight on V_n, weight on V_1]) must be two "
                          "numbers; better, give value_residual.lambda_1 (on V_1) and lambda_2 (on V_n), as the paper "
                          "names them")
    warnings.warn(f"value_residual.lambdas={list(old)} is deprecated: it listed [weight on V_n, weight on V_1], the "
                  f"reverse of the paper's lambda_{{n,1}} (on V_1), lambda_{{n,2}} (on V_n); read as "
                  f"lambda_1={old[1]}, "
                  f"lambda_2={old[0]}. Write those keys instead", DeprecationWarning, stacklevel=4)
    block["lambda_2"], block["lambda_1"] = old
    return block


def config_from_dict(data: dict[str, Any], source: str = "config") -> ModelConfig:
    """Build and validate a :class:`ModelConfig`; errors name ``source`` and the dotted key. Keys renamed since a
    config was saved (:data:`RENAMED_KEYS`, and ``value_residual.lambdas``: :func:`_legacy_lambdas`) are read under
    their new names."""
    return checked_config(ModelConfig, _renamed(data), source)


def apply_overrides(cfg: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """Return a new config with dotted-key overrides (``{"crossformer.hard": ["kq"]}``) applied and validated, as
    :func:`~interlayer.config_io.set_dotted` sets them: text values are ``--set`` values, and a key inside a
    section that is off turns the section on with its defaults first."""
    return config_from_dict(set_dotted(cfg.to_dict(), overrides, is_section=is_section, aliases=cfg.FIELD_ALIASES,
                                       implied=cfg.FIELD_IMPLIED), source="overrides")


def is_section(name: str) -> bool:
    """Whether ``name`` is a method section of :class:`ModelConfig`."""
    return any(m.name == name for m in METHODS)
