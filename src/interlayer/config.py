"""The full model configuration: the core Transformer's fields plus one optional section per method.

A section left ``None`` means the method is off. Configs round-trip through JSON and YAML, and every loader path
(file, dict, ``--set key=value`` overrides) goes through :func:`config_from_dict`, which rejects unknown keys
(suggesting the closest valid one) and values of the wrong type, naming the dotted key that was wrong.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import yaml

from .core.config import dataclass_from_dict, unknown_key
from .errors import ConfigError
from .fileio import load_yaml, read_yaml_or_json, write_atomic
from .methods import METHODS
from .methods.base import ComposedConfig


class ConfigFile:
    """``to_dict`` and ``save`` for a config dataclass: JSON, or YAML when the path ends in .yaml/.yml."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Union[str, Path]) -> None:
        path = Path(path)
        text = (yaml.safe_dump(self.to_dict(), sort_keys=False) if path.suffix in (".yaml", ".yml")
                else json.dumps(self.to_dict(), indent=2))
        write_atomic(path, text + ("\n" if not text.endswith("\n") else ""))


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


def read_config_file(path: Union[str, Path]) -> dict[str, Any]:
    """The mapping in a .json or .yaml config file; unreadable files, bytes that are not UTF-8, syntax errors,
    duplicate keys (:mod:`interlayer.fileio`) and non-mappings raise :class:`ConfigError` naming the file."""
    path = Path(path)
    data = read_yaml_or_json(path)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


def checked_config(cls: type, data: dict[str, Any], source: str) -> Any:
    """``cls`` built from ``data`` and validated; any error is prefixed with ``source`` (file, preset, ...)."""
    try:
        cfg = dataclass_from_dict(cls, data)
        cfg.validate()
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    return cfg


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
    """Return a new config with dotted-key overrides (``{"crossformer.hard": ["kq"]}``) applied and validated.

    String values are parsed as YAML scalars/lists, so ``--set d_model=256`` and ``--set passes=[0,2,1]`` work.
    Setting a key inside a section that is off turns the section on with its defaults first.
    """
    return config_from_dict(set_dotted(cfg.to_dict(), overrides, _is_section), source="overrides")


def set_dotted(data: dict[str, Any], overrides: dict[str, Any], is_section: Callable[[str], bool]
               ) -> dict[str, Any]:
    """``data`` (a config dict, changed in place and returned) with dotted-key overrides set, as
    :func:`apply_overrides` describes; ``is_section(name)`` says which keys are method sections."""
    for dotted, raw in overrides.items():
        value = parse_value(raw, f"--set {dotted}") if isinstance(raw, str) else raw
        head, _, rest = dotted.partition(".")
        if head not in data:
            raise unknown_key(head, list(data), "")
        if rest:
            if data[head] is None:
                data[head] = {}
            data[head][rest] = value
        else:
            data[head] = {} if value is True and is_section(head) else value
    return data


def parse_value(text: str, key: str = "--set value") -> Any:
    """A ``--set`` value: YAML (``3``, ``0.1``, ``true``, ``[0,2,1]``, ``null``), and numbers YAML 1.1 leaves as
    strings (``1e-3``, ``5E4``) as floats; an empty value is the empty string. Invalid YAML raises
    :class:`ConfigError` naming ``key``."""
    value = load_yaml(text, key, inline=True) if text.strip() else ""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def flatten_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Python-style overrides to dotted keys: ``crossformer__hard=[...]`` or ``crossformer={"hard": [...]}``
    become ``{"crossformer.hard": [...]}``; an empty dict turns a section on with its defaults."""
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        key = key.replace("__", ".")
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()} if value else {key: True})
        else:
            flat[key] = value
    return flat


def _is_section(name: str) -> bool:
    return any(m.name == name for m in METHODS)
