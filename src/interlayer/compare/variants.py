"""What a ``--variants`` entry means: named method variants, presets, config files and ad-hoc combinations.

A variant is a model configuration to train beside the others under the same budget, seeds and ``--set``
settings. Each entry of ``--variants`` is one of

1. a **named method variant** (:data:`NAMED_VARIANTS`): a method section applied to the comparison's base preset
   (the task's default preset unless ``--preset``), e.g. ``crossformer_kq`` or ``mpt_hard``;
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
from typing import Any, Callable, Optional

from ..config import parse_value
from ..errors import ConfigError, VariantError
from ..methods import METHODS

# Method sections of a Transformer config. A global --set on one of them would switch the method on in every
# variant, the baseline included, so such keys belong to a variant (ad-hoc syntax) instead.
SECTIONS: tuple[str, ...] = tuple(method.name for method in METHODS)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
# Training settings a variant may not change: the comparison gives every variant the same seeds and budget.
SHARED_TRAIN_KEYS = ("seed", "max_minutes")


@dataclass(frozen=True)
class Context:
    """What a named variant may depend on: the task and the resolved base model config (as a dict)."""

    task: str
    preset: str
    base: dict[str, Any]


@dataclass(frozen=True)
class NamedVariant:
    description: str
    overrides: Callable[[Context], dict[str, Any]]


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


# -- the Transformer inside a config, whatever wraps it ----------------------------------------------------------
def is_mcan(ctx: Context) -> bool:
    """An MCAN config (``interlayer.models.mcan``): its method sections sit at the top, as a Transformer's do."""
    return "image_input" in ctx.base and "layers" in ctx.base


def encoder_fields(ctx: Context, method: str) -> dict[str, Any]:
    """The Transformer fields of the base config: the config itself, or a vision model's ``encoder``; an MCAN
    config, whose ``crossformer`` / ``lightweight`` / ``predictive`` sections take the same keys."""
    if "enc_layers" in ctx.base or is_mcan(ctx):
        return ctx.base
    if isinstance(ctx.base.get("encoder"), dict) and "enc_layers" in ctx.base["encoder"]:
        return ctx.base["encoder"]
    kind = ctx.base.get("model_type", "non-Transformer")
    raise VariantError(f"the {method} variants add a method section to a Transformer, but task {ctx.task!r} "
                       f"trains a {kind} model (preset {ctx.preset!r}) that has none; compare that model's own "
                       "presets instead")


def _is_gat(ctx: Context) -> bool:
    return ctx.base.get("model_type") == "gat"


# -- Crossformer ----------------------------------------------------------------------------------------------
def _crossformer(hard: list[str], soft: list[str], gat: Optional[str] = None) -> Callable[[Context], dict]:
    """Hard/soft pairs for a Transformer; on GAT (Crossformer Sec. 3.3, Table 5) its own ``crossformer`` field."""

    def overrides(ctx: Context) -> dict[str, Any]:
        if _is_gat(ctx):
            if gat is None:
                raise VariantError(f"this Crossformer variant has no GAT form on task {ctx.task!r}: GAT takes one "
                                   "hard pair (Crossformer Table 5: key-query or FFN); use crossformer_kq or "
                                   "crossformer_ffn")
            return {"crossformer": gat}
        encoder_fields(ctx, "Crossformer")
        out: dict[str, Any] = {}
        if hard:
            out["crossformer.hard"] = list(hard)
        if soft:
            out["crossformer.soft"] = list(soft)
        return out

    return overrides


# -- Multi-Pass Transformer -----------------------------------------------------------------------------------
def hard_permutation(n_layers: int) -> list[int]:
    """MPT's best searched hard pattern (Fig. 3: ``[0,4,1,5,2,3]`` for N=6) written as a rule for any depth N.

    Even outer layers ``0, 2, 4, ...`` take the shallow inner layers ``0, 1, 2, ...`` in order (short paths:
    "features from shallow layers in the first network are directly linked to deeper layers in the outer
    network", Sec. 4.2); odd outer layers take the deep inner half ``ceil(N/2) .. N-1`` rotated left by one
    (long paths: "features from deeper layer in the inner network should be added to shallow features in the
    outer network"), so outer layer 0 keeps inner layer 0 and never receives the last inner layer, which
    "results in significantly deteriorated performance". The rule gives exactly ``[0,4,1,5,2,3]`` at N=6 and
    ``[0,2,1]`` at N=3 (the project's ``mpt_hard_small_021`` preset); at N=4 ``[0,3,1,2]``, at N=5 ``[0,4,1,3,2]``.
    """
    shallow = list(range((n_layers + 1) // 2))
    deep = list(range((n_layers + 1) // 2, n_layers))
    deep = deep[1:] + deep[:1]
    return [shallow[k // 2] if k % 2 == 0 else deep[k // 2] for k in range(n_layers)]


def _multipass(connection: str) -> Callable[[Context], dict]:
    def overrides(ctx: Context) -> dict[str, Any]:
        if is_mcan(ctx):
            raise VariantError("MPT has no MCAN form: the papers put MCAN only under LW, Crossformer and PA")
        fields = encoder_fields(ctx, "MPT")
        out: dict[str, Any] = {"multipass.passes": 2, "multipass.connection": connection}
        if connection == "hard":
            n = fields["enc_layers"]
            permutation = hard_permutation(n)
            if permutation == list(range(n)):
                raise VariantError(f"mpt_hard at enc_layers={n} would be the default connection {permutation}: "
                                   "the only other permutation feeds the last inner layer to the first outer layer,"
                                   " which MPT Sec. 4.2 found to deteriorate results; use mpt, or more layers")
            out["multipass.permutation"] = permutation
        return out

    return overrides


# -- Predictive Attention -------------------------------------------------------------------------------------
# PA's alpha by task (Eq. 4): 0.1 for SST/Yelp/IWSLT (Sec. 4.1.1, the section's default), 0.5 for SNLI (Sec. 4.1.1;
# SICK is our stand-in), 0.2 for GLUE (App. B.2.2; MRPC), 0.01 for images (CIFAR, Sec. 4.2.1).
PA_ALPHA = {"sick": 0.5, "mrpc": 0.2, "fashion_mnist": 0.01}


def _predictive(conv_layers: int, conv_branch: bool) -> Callable[[Context], dict]:
    def overrides(ctx: Context) -> dict[str, Any]:
        encoder_fields(ctx, "PA")
        out: dict[str, Any] = {"predictive.conv_layers": conv_layers}
        if ctx.task in PA_ALPHA:
            out["predictive.alpha"] = PA_ALPHA[ctx.task]
        if conv_branch:
            out["conv_branch"] = {}
        return out

    return overrides


def _conv_branch(ctx: Context) -> dict[str, Any]:
    encoder_fields(ctx, "Conv-Transformer")
    return {"conv_branch": {}}


# -- LW-Transformer -------------------------------------------------------------------------------------------
def _lightweight(**section: Any) -> Callable[[Context], dict]:
    def overrides(ctx: Context) -> dict[str, Any]:
        encoder_fields(ctx, "LW-Transformer")
        return {f"lightweight.{key}": value for key, value in {"groups": 2, **section}.items()}

    return overrides


# -- Layer sharing (ALBERT, MobileLLM) -------------------------------------------------------------------------
def _layer_sharing(deep: bool = False, **section: Any) -> Callable[[Context], dict]:
    """Shared layers at the base's executed depth (fewer parameters, same compute), or with ``deep`` MobileLLM's
    reading: the base's layers become unique blocks run ``repeats`` times (same parameters, more compute)."""

    def overrides(ctx: Context) -> dict[str, Any]:
        if is_mcan(ctx):
            raise VariantError("layer sharing has no MCAN form here: ALBERT and MobileLLM share one Transformer "
                               "stack; compare it on a Transformer task")
        fields = encoder_fields(ctx, "layer sharing")
        out: dict[str, Any] = {"layer_sharing": dict(section)}
        if deep:
            out["enc_layers"] = fields["enc_layers"] * section["repeats"]
            if fields.get("arch") == "encoder_decoder":
                out["dec_layers"] = fields["dec_layers"] * section["repeats"]
        return out

    return overrides


# -- value residuals and cross-layer attention ----------------------------------------------------------------
def _kv_method(method: str, **section: Any) -> Callable[[Context], dict]:
    def overrides(ctx: Context) -> dict[str, Any]:
        if is_mcan(ctx):
            raise VariantError(f"the {method} variants change the core Transformer's self-attention stacks; task "
                               f"{ctx.task!r} trains an MCAN model (preset {ctx.preset!r}), whose config has no such "
                               "section")
        encoder_fields(ctx, method)
        key = "cla" if method == "CLA" else "value_residual"
        return {key: dict(section)}

    return overrides


# -- DenseFormer, hyper-connections, mHC, MUDDFormer ----------------------------------------------------------
def _stack_method(method: str, label: str, **section: Any) -> Callable[[Context], dict]:
    """A section on the Transformer's stack (DenseFormer, (m)HC, MUDDFormer); none of the papers has an MCAN form."""

    def overrides(ctx: Context) -> dict[str, Any]:
        if is_mcan(ctx):
            raise VariantError(f"{label} has no MCAN form here: MCAN's stacks run their own loops")
        encoder_fields(ctx, label)
        return {f"{method}.{key}": value for key, value in section.items()} if section else {method: {}}

    return overrides


def _baseline(ctx: Context) -> dict[str, Any]:
    return {}


NAMED_VARIANTS: dict[str, NamedVariant] = {
    "baseline": NamedVariant("the base preset as it is", _baseline),
    "crossformer_kq": NamedVariant("Crossformer-Key-Query hard guidance (Eq. 3; Tables 1-2, Table 5 on GAT)",
                                   _crossformer(["kq"], [], gat="kq")),
    "crossformer_vf": NamedVariant("Crossformer-Value hard guidance (Eq. 6; Tables 1-2)",
                                   _crossformer(["vf"], [])),
    "crossformer_ffn": NamedVariant("Crossformer-FFN hard guidance (Eq. 5; Tables 1-2, Table 5 on GAT)",
                                    _crossformer(["ffn"], [], gat="ffn")),
    "crossformer_all": NamedVariant("Crossformer-All: key-query, value-fusion and FFN hard guidance (Sec. 2.2, "
                                    "Table 2)", _crossformer(["kq", "vf", "ffn"], [])),
    "crossformer_sg": NamedVariant("Crossformer-SG: soft guidance of key-query, value-fusion and FFN, L2, "
                                   "alpha=0.01 (Eq. 1-2, Table 1 left, App. A.1.2)",
                                   _crossformer([], ["kq", "vf", "ffn"])),
    "mpt": NamedVariant("MPT default connections [0,1,...,N-1], 2 passes, routing (a) (MPT Table 1)",
                        _multipass("default")),
    "mpt_soft": NamedVariant("MPT soft connections (Eq. 6), 2 passes, routing (a) (MPT Tables 1-2, Fig. 5)",
                             _multipass("soft")),
    "mpt_hard": NamedVariant("MPT hard connections, the best pattern [0,4,1,5,2,3] (Fig. 3) as a rule for the "
                             "preset's depth (compare.variants.hard_permutation), 2 passes", _multipass("hard")),
    "pa": NamedVariant("PA-Transformer: one 3x3 conv per prediction module, alpha by task (PA Eq. 4, Sec. 4.1.1; "
                       "0.1 SST/IWSLT, 0.5 SICK, 0.2 MRPC, 0.01 images)", _predictive(1, conv_branch=False)),
    "pa_res": NamedVariant("Res-Transformer: attention maps added without the CNN (PA Table 5, conv_layers=0)",
                           _predictive(0, conv_branch=False)),
    "conv": NamedVariant("Conv-Transformer: half self-attention (4 heads), half convolution (PA Sec. 3.5, "
                         "Table 1)", _conv_branch),
    "pa_conv": NamedVariant("PA-Conv-Transformer: the Conv-Transformer plus attention prediction (PA Sec. 3.5, "
                            "Table 1)", _predictive(1, conv_branch=True)),
    "lw_1x": NamedVariant("LW-Transformer1x: G-MHA + G-FFN, k=2, shared group weights (LW Table II, dagger)",
                          _lightweight()),
    "lw_1x_nows": NamedVariant("LW-Transformer1x without weight sharing: G-MHA + G-FFN, k=2 (LW Table II; the "
                               "image setting of Sec. IV-A)", _lightweight(share_weights=False)),
    "lw_3x": NamedVariant("LW-Transformer3x: queries and keys 3x wider, k=2, shared weights (LW Table II, dagger)",
                          _lightweight(qk_expansion=3)),
    "lw_mini": NamedVariant("LW-Transformer-mini1x: LW1x plus a group-wise intermediate layer, G-IL (LW Table III)",
                            _lightweight(group_intermediate=True)),
    "albert": NamedVariant("ALBERT cross-layer sharing: every layer runs one block, all parameters shared, same "
                           "depth and compute (ALBERT Sec. 3.1, Table 4 'all-shared')", _layer_sharing()),
    "mobilellm": NamedVariant("MobileLLM immediate block-wise sharing A A B B: enc_layers/2 unique blocks each run "
                              "twice in a row, same depth and compute (MobileLLM Sec. 2.3, Fig. 6)",
                              _layer_sharing(repeats=2, order="immediate")),
    "mobilellm_all_over": NamedVariant("MobileLLM repeat-all-over sharing A B A B: the stack of enc_layers/2 "
                                       "blocks run twice (MobileLLM Fig. 6; MPT's 'tied weights' stack)",
                                       _layer_sharing(repeats=2, order="all_over")),
    "mobilellm_deep": NamedVariant("MobileLLM-LS as the paper counts depth: each base layer a unique block run "
                                   "twice in a row, so the base's parameters at twice its layers and compute "
                                   "(MobileLLM Sec. 2.3)", _layer_sharing(deep=True, repeats=2, order="immediate")),
    "resformer": NamedVariant("ResFormer: V_n' = 0.5 V_1 + 0.5 V_n in every layer n > 1 (Value Residual Learning, "
                              "Zhou et al. 2025, Sec. 3; the official code's fixed mix)", _kv_method("ResFormer")),
    "resformer_learnable": NamedVariant("ResFormer with learnable lambda_1, lambda_2 per layer from 0.5, 0.5 "
                                        "(Value Residual Learning's learnable variant)",
                                        _kv_method("ResFormer", learnable=True)),
    "svformer": NamedVariant("SVFormer: every layer attends with the first layer's values, no value projection "
                             "after layer 1, about half the KV cache (Value Residual Learning, Sec. 3)",
                             _kv_method("ResFormer", mode="svformer")),
    "cla2": NamedVariant("Cross-Layer Attention, sharing factor 2: pairs of layers share one K/V, half the KV cache "
                         "(Brandon et al. 2024, Sec. 2)", _kv_method("CLA", sharing_factor=2)),
    "cla3": NamedVariant("Cross-Layer Attention, sharing factor 3; a first group of fewer layers where 3 does not "
                         "divide the depth, as the paper's Fig. 2 (Brandon et al. 2024, Sec. 2.1)",
                         _kv_method("CLA", sharing_factor=3)),
    "denseformer": NamedVariant("DenseFormer 1x1: a depth-weighted average of the embeddings and every earlier "
                                "block's output after each block, started at the identity (DenseFormer Sec. 3.1)",
                                _stack_method("denseformer", "DenseFormer")),
    "denseformer_2x2": NamedVariant("DenseFormer 2x2: dilation 2, a DWA after every second block (DenseFormer Sec. "
                                    "3.2; the paper's deep models prefer 4x5, which a 4-layer stack cannot hold)",
                                    _stack_method("denseformer", "DenseFormer", dilation=2, period=2)),
    "hyper_connections": NamedVariant("Dynamic hyper-connections, expansion rate 4 (DHCx4, the paper's default; "
                                      "Hyper-Connections Sec. 2.2, Sec. 4.1); needs pre-LN",
                                      _stack_method("hyper_connections", "Hyper-connections", rate=4, dynamic=True)),
    "hyper_connections_static": NamedVariant("Static hyper-connections, expansion rate 4 (SHCx4; "
                                             "Hyper-Connections Sec. 2.1); needs pre-LN",
                                             _stack_method("hyper_connections", "Hyper-connections", rate=4,
                                                           dynamic=False)),
}
# mHC and MUDDFormer, added by keyword (their names are method sections too; the sections are listed only in
# methods/__init__.py).
NAMED_VARIANTS.update(
    mhc=NamedVariant("mHC: hyper-connections x4 whose residual mixing is doubly stochastic (20 Sinkhorn-Knopp "
                     "iterations), started as the plain model (mHC Sec. 4.2, Eq. 7-9, Table 5); needs pre-LN",
                     _stack_method("mhc", "mHC")),
    muddformer=NamedVariant("MUDDFormer: per-position dense aggregates of every earlier block's output, one each for "
                            "the query, key, value and residual inputs of the next block, started as the plain "
                            "model (MUDDFormer Sec. 2, Eq. 3-8, Sec. 3)", _stack_method("muddformer", "MUDDFormer")),
    muddformer_static=NamedVariant("MUDDFormer's multiway static dense connections: one learned weight per (way, "
                                   "earlier block), no per-position part (Table 5's '+Multiway Static Dense'; "
                                   "single-way it is DenseFormer)",
                                   _stack_method("muddformer", "MUDDFormer", dynamic=False)),
    muddformer_2x2=NamedVariant("MUDDFormer-2x2: dilation 2, a DA after every second block, the paper's cheaper "
                                "trade-off (MUDDFormer Sec. 3.6, Fig. 9)",
                                _stack_method("muddformer", "MUDDFormer", dilation=2, period=2)),
)


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


def check_global_sets(sets: dict[str, str]) -> None:
    """Refuse a global ``--set`` that would switch a method on in every variant, the baseline included."""
    for key in sets:
        parts = key.split(".")
        head = parts[1] if parts[0] == "encoder" and len(parts) > 1 else parts[0]
        if head in SECTIONS:
            raise VariantError(f"--set {key}=... would turn the {head} method on in every variant, the baseline "
                               f"included; put it in a variant instead, e.g. --variants baseline,"
                               f"mine=baseline+{key}={sets[key]}")


def variant_overrides(variant: Variant, ctx: Optional[Context]) -> dict[str, Any]:
    """The variant's own overrides: its named method variant's (needs ``ctx``), then the entry's ``sets``."""
    named = NAMED_VARIANTS[variant.named].overrides(ctx) if variant.named else {}
    return {**named, **variant.sets}


def describe_named() -> list[tuple[str, str]]:
    return [(name, named.description) for name, named in NAMED_VARIANTS.items()]


__all__ = ["Context", "NAMED_VARIANTS", "SECTIONS", "Variant", "VariantError", "check_global_sets",
           "describe_named", "hard_permutation", "parse_value", "parse_variant", "parse_variants", "split_entries",
           "variant_overrides"]
