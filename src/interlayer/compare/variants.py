"""What a ``--variants`` entry means: named method variants, presets, config files and ad-hoc combinations.

A variant is a model configuration to train beside the others under the same budget, seeds and ``--set``
settings. Each entry of ``--variants`` is one of

1. a **named method variant** (:data:`NAMED_VARIANTS`): a method section applied to the comparison's base preset
   (the task's default preset unless ``--preset``), e.g. ``crossformer_kq`` or ``mpt_hard``; each method registers
   its own (``variants`` of its module in :mod:`interlayer.methods`);
2. a **preset name** the task accepts (a Transformer preset, or the task's own: ``gat_cora_crossformer_kq``,
   ``vit_fashion_mnist``, ``cnn_text``); the data's fields (vocabulary, classes) are filled in as for ``train``;
3. a **.json / .yaml model config file** (the run name is the file's stem);
4. an **ad-hoc variant** ``NAME=BASE+KEY=VALUE+KEY=VALUE``: ``BASE`` is any of the above, each ``KEY=VALUE``
   overrides a model field (``crossformer.alpha=0.1``, ``d_model=128``) or a training setting (``train.lr=1e-3``);
   values are YAML (``[kq,ffn]``, ``0.1``, ``true``).

Entries are separated by commas outside brackets, so ``x=crossformer_sg+crossformer.soft=[kq,ffn]`` stays one
entry. Every variant is resolved against the task (its model built, parameters and MAdds counted) before anything
trains, so a variant that cannot apply fails at once with the reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..config_io import parse_value
from ..errors import ConfigError, VariantError
from ..methods import METHODS
from ..methods.base import NamedVariant, VariantContext

# Method sections of a Transformer config. A global --set on one of them would switch the method on in every
# variant, the baseline included, so such keys belong to a variant (ad-hoc syntax) instead.
SECTIONS: tuple[str, ...] = tuple(method.name for method in METHODS)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
# Training settings a variant may not change: the comparison gives every variant the same seeds and budget.
SHARED_TRAIN_KEYS = ("seed", "max_minutes")


def _baseline(ctx: VariantContext) -> dict[str, Any]:
    return {}


def _named_variants() -> dict[str, NamedVariant]:
    """``baseline``, then every method's variants (each method registers its own: ``Method.variants``), in the
    order of :data:`~interlayer.methods.METHODS`; a name is one variant."""
    named = {"baseline": NamedVariant("the base preset as it is", _baseline)}
    for method in METHODS:
        for name, variant in method.variants.items():
            if name in named:
                raise RuntimeError(f"the compare variant {name!r} of method {method.name!r} is defined twice")
            named[name] = variant
    return named


NAMED_VARIANTS: dict[str, NamedVariant] = _named_variants()


@dataclass(frozen=True)
class Variant:
    """One model of the comparison: ``preset``, then the global ``--set``, then the overrides of the named method
    variant ``named`` (computed against the task's model when resolved), then ``sets`` (this entry's own)."""

    name: str
    spec: str  # the entry as the user wrote it
    preset: str  # preset name or config file the model starts from
    named: Optional[str] = None  # a key of NAMED_VARIANTS, or None
    sets: dict[str, Any] = field(default_factory=dict)  # dotted model keys and train.* keys

    @property
    def description(self) -> str:
        base = NAMED_VARIANTS[self.named].description if self.named else (
            f"config file {self.preset}" if _is_config_file(self.preset) else f"preset {self.preset}")
        extra = ", ".join(f"{key}={value}" for key, value in self.sets.items())
        return f"{base}; with {extra}" if extra else base

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "preset": self.preset, "named": self.named,
                "sets": dict(self.sets)}


# -- parsing --------------------------------------------------------------------------------------------------
def split_entries(text: str) -> list[str]:
    """Split on commas that are not inside ``[...]`` or ``{...}`` (so list values stay in their entry)."""
    entries, depth, current = [], 0, []
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        if char == "," and depth == 0:
            entries.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    entries.append("".join(current).strip())
    return [entry for entry in entries if entry]


def _is_config_file(text: str) -> bool:
    return Path(text).suffix in CONFIG_SUFFIXES


def _parse_adhoc(entry: str) -> tuple[str, str, dict[str, Any]]:
    """``NAME=BASE+K=V+K=V`` -> (NAME, BASE, {K: V}). A ``+`` splits only where a ``KEY=`` follows it."""
    name, _, rest = entry.partition("=")
    parts = re.split(r"\+(?=[A-Za-z_][\w.]*=)", rest)
    base, pairs = parts[0].strip(), parts[1:]
    if not base or "=" in base:
        raise VariantError(f"variant {entry!r}: expected NAME=BASE+KEY=VALUE..., where BASE is a named variant, a "
                           "preset or a config file (e.g. sg01=crossformer_sg+crossformer.alpha=0.1)")
    sets: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            sets[key.strip()] = parse_value(value, key.strip())
        except ConfigError as err:
            raise VariantError(f"variant {entry!r}: {err}") from None
    return name.strip(), base, sets


def _check_variant_sets(entry: str, sets: dict[str, Any]) -> None:
    for key in sets:
        head, _, rest = key.partition(".")
        if head == "data":
            raise VariantError(f"variant {entry!r} sets {key}: every variant of a comparison reads the same data; "
                               f"give data settings once with --set {key}=...")
        if head == "train" and rest in SHARED_TRAIN_KEYS:
            raise VariantError(f"variant {entry!r} sets {key}: seeds and the time budget are shared by all "
                               "variants (--seeds, --budget-minutes)")


def parse_variant(entry: str, default_preset: str) -> Variant:
    """One ``--variants`` entry -> :class:`Variant` (checked against the task later, by
    :func:`interlayer.compare.plan.resolve_variant`)."""
    if "=" in entry.split("+", 1)[0]:
        name, base, sets = _parse_adhoc(entry)
        _check_variant_sets(entry, sets)
        inner = parse_variant(base, default_preset)
        return Variant(name, entry, inner.preset, inner.named, {**inner.sets, **sets})
    if "+" in entry:
        raise VariantError(f"variant {entry!r}: overrides need a name, as in NAME={entry}")
    if _is_config_file(entry):
        if not Path(entry).is_file():
            raise VariantError(f"variant {entry!r}: config file not found")
        return Variant(Path(entry).stem, entry, entry)
    if entry in NAMED_VARIANTS:
        return Variant(entry, entry, default_preset, named=entry)
    return Variant(entry, entry, entry)


def parse_variants(entries: list[str], default_preset: str, baseline: Optional[str] = None
                   ) -> tuple[list[Variant], str]:
    """All ``--variants`` values (each may hold several comma-separated entries) -> variants and the baseline's
    name (the first variant unless ``baseline`` names another)."""
    variants = [parse_variant(entry, default_preset) for text in entries for entry in split_entries(text)]
    if not variants:
        raise VariantError("--variants is empty: name at least one variant, e.g. --variants baseline,pa "
                           f"(named variants: {', '.join(NAMED_VARIANTS)})")
    names = [variant.name for variant in variants]
    for variant in variants:
        if not NAME_PATTERN.match(variant.name):
            raise VariantError(f"variant name {variant.name!r} (from {variant.spec!r}) must be letters, digits, "
                               "'_', '-' or '.': it names the run directories; give it a name with NAME=...")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise VariantError(f"variant name(s) {repeated} appear more than once; name the copies apart with "
                           "NAME=BASE+KEY=VALUE")
    if baseline is None:
        return variants, names[0]
    if baseline not in names:
        raise VariantError(f"--baseline {baseline!r} is not one of the variants {names}")
    return variants, baseline


def check_global_sets(sets: dict[str, Any]) -> None:
    """Refuse a global ``--set`` that would switch a method on in every variant, the baseline included."""
    for key in sets:
        parts = key.split(".")
        head = parts[1] if parts[0] == "encoder" and len(parts) > 1 else parts[0]
        if head in SECTIONS:
            raise VariantError(f"--set {key}=... would turn the {head} method on in every variant, the baseline "
                               f"included; put it in a variant instead, e.g. --variants baseline,"
                               f"mine=baseline+{key}={sets[key]}")


def variant_overrides(variant: Variant, ctx: Optional[VariantContext]) -> dict[str, Any]:
    """The variant's own overrides: its named method variant's (needs ``ctx``), then the entry's ``sets``."""
    named = NAMED_VARIANTS[variant.named].overrides(ctx) if variant.named else {}
    return {**named, **variant.sets}


def describe_named() -> list[tuple[str, str]]:
    return [(name, named.description) for name, named in NAMED_VARIANTS.items()]


__all__ = ["NAMED_VARIANTS", "SECTIONS", "Variant", "check_global_sets", "describe_named", "parse_variant",
           "parse_variants", "split_entries", "variant_overrides"]
