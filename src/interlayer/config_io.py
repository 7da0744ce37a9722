"""Config plumbing every config family shares, below the methods and the core: typed dataclasses from mappings,
config files, ``--set`` values and dotted-key overrides.

* **The coercer** (:func:`dataclass_from_dict`, :func:`coerce`, :func:`check_choices`, :func:`check_finite`): a
  mapping becomes a typed dataclass, each value checked against its annotation, so a choice field's valid values
  (a ``Literal``) are written once, in the annotation, and every error names the dotted key, what was given and
  what is valid (the closest valid key or value suggested).
* **Files** (:class:`ConfigFile`, :func:`read_config_file`, :func:`checked_config`): JSON or YAML, strict.
* **Overrides** (:func:`parse_value`, :func:`set_dotted`, :func:`flatten_overrides`): ``--set KEY=VALUE`` text and
  Python keyword overrides, applied by one function whatever the family (the Transformer and its method sections,
  a vision model's nested encoder, MCAN, the flat GAT and text-CNN configs, a resumed run's stored config).

It imports nothing of interlayer but the errors and the file readers, so the core's config, the methods'
sections and every model family use it without loading one another (reading a GAT config loads no method).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

import yaml

from .errors import ConfigError
from .fileio import load_yaml, read_yaml_or_json, write_atomic


def _no_section(name: str) -> bool:
    return False


def check_finite(cfg: Any, prefix: str = "") -> None:
    """Refuse NaN and infinite floats anywhere in the dataclass ``cfg`` (nested sections and lists included).

    One check for every config instead of one per field: a range test such as ``0 <= p < 1`` happens to reject
    NaN, but ``lr <= 0`` does not, and an infinite epsilon or learning rate trains to NaN without a word. Ranges
    stay with each field's ``validate``; this only asks that every number be a number.
    """

    def visit(value: Any, key: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value")
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in fields(value):
                visit(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, f"{key}[{i}]")

    visit(cfg, prefix.rstrip("."))


def unknown_key(key: str, valid: list[str], prefix: str, aliases: Mapping[str, str] = {}) -> ConfigError:
    """The error for a key a config does not have, with the closest valid key (or other name) as a suggestion and
    the other names (``aliases``: name -> field) listed after the fields."""
    close = difflib.get_close_matches(key, [*valid, *aliases], n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    also = f"; other names: {', '.join(f'{a} ({f})' for a, f in aliases.items())}" if aliases else ""
    return ConfigError(f"unknown key '{prefix}{key}'{hint}; valid keys: {', '.join(sorted(valid)) or 'none'}{also}")


def field_name(key: str, names: Sequence[str], aliases: Mapping[str, str]) -> Optional[str]:
    """The field ``key`` names: itself, or the field it is another name of (``aliases``); None when neither."""
    if key in names:
        return key
    return aliases.get(key)


def dataclass_from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Instantiate dataclass ``cls`` from a mapping, checking keys and value types (errors name ``prefix+key``).

    A class may accept other names of its fields as input (``FIELD_ALIASES``: name -> field, e.g. the Transformer
    config's ``n_layer`` for ``enc_layers``); a field given under two names is refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in fields(cls)]
    aliases: Mapping[str, str] = getattr(cls, "FIELD_ALIASES", {})
    kwargs, given = {}, {}
    for key, value in data.items():
        name = field_name(key, names, aliases)
        if name is None:
            raise unknown_key(key, names, prefix, aliases)
        if name in given:
            raise ConfigError(f"{prefix}{given[name]} and {prefix}{key} both set {prefix}{name}; give one of them")
        given[name] = key
        kwargs[name] = coerce(value, hints[name], prefix + key)
    obj = cls(**kwargs)
    check_finite(obj, prefix)
    return obj


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` as the type ``hint`` asks for, or a :class:`ConfigError` naming ``key``: a ``Literal`` admits its
    values (the message lists them and suggests the closest), a list admits a comma-separated string, ``Optional``
    admits null, a dataclass admits a mapping (``True``: its defaults)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if typing.get_origin(inner[0]) is Literal and value not in typing.get_args(inner[0]):
            raise _not_a_choice(key, value, typing.get_args(inner[0]), nullable=type(None) in args)
        return coerce(value, inner[0], key)
    if dataclasses.is_dataclass(hint):
        return dataclass_from_dict(hint, {} if value is True else value, key + ".")
    if origin is Literal:
        if value not in args:
            raise _not_a_choice(key, value, args)
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        item = args[0] if args else Any
        return origin(coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    return value


def check_choices(cfg: Any, prefix: str = "") -> None:
    """Run :func:`coerce` over every field of the dataclass ``cfg`` whose type names a ``Literal`` (nested sections
    included): a config built in Python skips the loaders, and its ``validate`` still refuses a value outside the
    annotation with the loaders' message."""
    hints = _hints(type(cfg))
    for f in fields(cfg):
        value, hint = getattr(cfg, f.name), hints[f.name]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_choices(value, f"{prefix}{f.name}.")
        elif _names_literal(hint):
            coerce(value, hint, prefix + f.name)


def _not_a_choice(key: str, value: Any, valid: tuple, nullable: bool = False) -> ConfigError:
    close = difflib.get_close_matches(value, [v for v in valid if isinstance(v, str)], n=1) \
        if isinstance(value, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(map(repr, valid))}"
                       f"{', or null' if nullable else ''}{hint}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _names_literal(hint: Any) -> bool:
    return typing.get_origin(hint) is Literal or any(_names_literal(arg) for arg in typing.get_args(hint))


class ConfigFile:
    """``to_dict`` and ``save`` for a config dataclass: JSON, or YAML when the path ends in .yaml/.yml."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Union[str, Path]) -> None:
        path = Path(path)
        text = (yaml.safe_dump(self.to_dict(), sort_keys=False) if path.suffix in (".yaml", ".yml")
                else json.dumps(self.to_dict(), indent=2))
        write_atomic(path, text + ("\n" if not text.endswith("\n") else ""))


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


def set_dotted(data: dict[str, Any], overrides: Mapping[str, Any], *, is_section: Callable[[str], bool] = _no_section,
               nested: Sequence[str] = (), aliases: Mapping[str, str] = {},
               implied: Mapping[str, Callable[[Any], Mapping[str, Any]]] = {}) -> dict[str, Any]:
    """``data`` (a config as a mapping, changed in place and returned) with dotted-key overrides set: the one
    function every config family applies ``--set`` and Python overrides with.

    * A value given as text is a ``--set`` value (:func:`parse_value`): ``--set d_model=256``, ``--set
      passes=[0,2,1]``.
    * ``KEY`` sets a field; ``SECTION.KEY`` a field of a nested section (``crossformer.hard``, at any depth:
      ``encoder.predictive.alpha``); a section that is off (``None``) is turned on with its defaults first, and
      ``SECTION=true`` (``is_section(SECTION)``) turns it on with its defaults.
    * A key the config lacks is looked up in the nested configs named by ``nested``: a vision model's ``d_model``
      is its ``encoder.d_model``. ``aliases`` (name -> field: the Transformer's ``FIELD_ALIASES``) are other names
      of top-level fields (here or nested): ``n_layer`` sets ``enc_layers``. ``implied`` (name -> value -> fields)
      sets what a name also means unless those fields are given too (under any of their names): nanoGPT's
      ``n_embd`` also sets ``d_ffn`` to 4 x ``n_embd``.
    * A top-level key found nowhere raises :class:`ConfigError` with the closest valid key, a dotted key into a
      field that is not a section names both; the keys inside a section, and every value, are checked when the
      config is built from ``data`` (the coercer's errors name the whole dotted key).
    """
    named: dict[tuple[Optional[str], str], str] = {}  # (nested config, field) -> the name the overrides gave it
    for dotted, raw in overrides.items():
        value = parse_value(raw, f"--set {dotted}") if isinstance(raw, str) else raw
        given, *path = dotted.split(".")
        head = given if given in data else aliases.get(given, given)
        inner = None
        if head not in data:
            inner = next((name for name in nested if isinstance(data.get(name), dict) and head in data[name]), None)
            if inner is None:
                valid = [*data, *(key for name in nested if isinstance(data.get(name), dict) for key in data[name])]
                raise unknown_key(given, valid, "", aliases)
        if named.setdefault((inner, head), given) != given:
            raise ConfigError(f"{named[inner, head]} and {given} both set {head}; give one of them")
        _set(data if inner is None else data[inner], dotted, [head, *path], value, is_section)
    given_fields = {head for _, head in named}
    for name, rule in implied.items():
        value = overrides.get(name)
        value = parse_value(value, f"--set {name}") if isinstance(value, str) else value
        if isinstance(value, int) and not isinstance(value, bool):  # a bad value is the coercer's to name
            unset = {key: derived for key, derived in rule(value).items() if key not in given_fields}
            set_dotted(data, unset, nested=nested)
    return data


def _set(data: dict[str, Any], dotted: str, path: list[str], value: Any, is_section: Callable[[str], bool]) -> None:
    head = path[0]
    if len(path) == 1:
        data[head] = {} if value is True and is_section(head) else value
        return
    if data.get(head) is None:
        data[head] = {}
    if not isinstance(data[head], dict):
        raise ConfigError(f"{dotted}: {head}={data[head]!r} is not a section, so it has no key "
                          f"{'.'.join(path[1:])!r}; set {head} itself")
    _set(data[head], dotted, path[1:], value, is_section)


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


SectionForm = Literal["section", "hard_pair"]


@dataclasses.dataclass(frozen=True)
class MethodSlots:
    """Where a model's config takes the methods' sections, as its family declares it (``Family.method_slots`` in
    :mod:`interlayer.models.registry`): what a named variant writes its overrides into, so that no method recognises
    a model by the keys of its config. Config plumbing below the methods, so that a family without Transformer
    sections (GAT, the text CNN) declares its slots without loading them.

    ``name``: the model in messages. ``at``: where the sections go, with a Transformer's keys: ``""`` the config's
    top, a key (``"encoder"``, ``"transformer"``) a nested Transformer config, None nowhere. ``only``: the methods
    whose sections the model takes there, when not all (None: every method). ``forms``: sections the model takes in
    a form of its own, by method (``"hard_pair"``: one Crossformer hard pair named by a string, as GAT's)."""

    name: str = "Transformer"
    at: Optional[str] = ""
    only: Optional[frozenset[str]] = None
    forms: Mapping[str, SectionForm] = dataclasses.field(default_factory=dict)
