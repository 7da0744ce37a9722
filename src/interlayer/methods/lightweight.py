"""LW-Transformer (Luo, Zhou, Sun, Wang, Cao, Wu, Huang & Ji, "Towards Lightweight Transformer via Group-wise
Transformation for Vision-and-Language Tasks", arXiv:2204.07780, 2022): group-wise attention and feed-forward.

Paper map:

* **Group-wise transformation** (Sec. III-B, Eq. 5): ``k`` contiguous groups, each transformed: :class:`GroupedLinear`.
* **G-MHA** (Eq. 6, Fig. 1a): the input split before q/k/v, ``h/k`` heads of the baseline width per group, the dense
  ``W_O`` (Eq. 3) kept: :class:`GroupedMultiHeadAttention` (``attention``). **G-FFN** (Eq. 7-8, Fig. 1b): ``W1``
  dense, ``W2 in R^{d_f/k x d/k}`` group-wise: :class:`GroupedFeedForward` (``ffn``).
* **WS** (Sec. III-B, Table II): one weight set for the ``k`` groups: ``share_weights``. **n x** (Table I, Sec. IV-A):
  queries and keys ``n`` times wider per head: ``qk_expansion``. **G-LML / G-IL** (Table III, Sec. IV-D2): ``W_O`` /
  ``W1`` group-wise: ``group_merge`` / ``group_intermediate``; "mini" is G-IL alone (Tables III-IV).

Readings where the paper is vague (together they give eleven of Tables II/III's twelve MAdds to two decimals):
G-MHA replaces every attention, cross-attention included (Table II's 37.0M for G-MHA alone needs all 18 of MCAN's),
query group ``i`` attending to memory group ``i`` (Eq. 6 on both inputs; the released code splits q, k, v alike).
Heads are group-major (group ``i`` owns heads ``i*h/k ..``), so the groups' outputs concatenated are the standard head
layout and relative positions, logit mixers, SDPA, the KV cache and masking stay the core's. WS covers every
group-wise layer (q/k/v, ``W2``, G-LML, G-IL): Table II's 24.0M and Table III's 20.4M/14.5M/11.0M need it; it is an
option, on by default, since Eq. 8 calls ``W2`` "sharable" but Table II's G-FFN row without WS (37.7M) has ``k``
blocks, while the main model (dagger rows, the released code) shares. Logits are scaled by ``1/sqrt(n*d/h)``: Eq. 1's
``sqrt(d)`` with ``d`` the per-head q/k width. Initialisation (not the paper's): Xavier-uniform per group with its own
fans, as ``k`` separate layers would, so at ``k=1`` every weight is the core's (outputs identical, tested).

Parameter/MAdds formulas, options, Tables II-III and what the paper has beyond this: docs/methods/lightweight.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.attention import MultiHeadAttention
from ..core.components import Components, StackSide
from ..core.config import TransformerConfig
from ..core.feedforward import FeedForward
from ..errors import ConfigError
from .base import (
    MAX_MULTIPLIER,
    ComposedConfig,
    CompositionExample,
    Conflict,
    MethodBase,
    NamedVariant,
    VariantContext,
    check_at_most,
)

QKV_GAIN = 1 / math.sqrt(2)  # the core's (fairseq's) Xavier gain for q/k/v; 1 for the merge and the FFN


@dataclass
class LightweightConfig:
    """Options of LW-Transformer (notation of Table I; see the module docstring for the paper references).

    * ``groups``: k, the number of groups (paper default 2; Table II also 4 and 8). 1 is the plain Transformer.
    * ``attention``: G-MHA (Eq. 6) in every self- and cross-attention.
    * ``ffn``: G-FFN (Eq. 7-8), the reducing layer ``W2`` group-wise.
    * ``share_weights``: WS, one set of weights for the k groups of every group-wise layer.
    * ``qk_expansion``: n of "LW-Transformer n x": query/key width per head ``n * d_model / n_heads``.
    * ``group_merge``: G-LML (Table III), the attention's linear merge ``W_O`` group-wise.
    * ``group_intermediate``: G-IL (Table III), the FFN's expanding layer ``W1`` group-wise ("mini" = G-IL).
    * ``straddle_heads``: let a head take features of two groups' projections (the grouped q/k/v followed by the
      usual head split), so ``k`` need not divide the heads: Swin-T's 3-head first stage (Table IX, Sec. IV-A).
    """

    # sizes of the saved tensors in every model (checkpoint.py)
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"groups", "qk_expansion"})

    groups: int = 2
    attention: bool = True
    ffn: bool = True
    share_weights: bool = True
    qk_expansion: int = 1
    group_merge: bool = False
    group_intermediate: bool = False
    straddle_heads: bool = False

    @property
    def replaces_attention(self) -> bool:
        return self.attention or self.group_merge or self.qk_expansion > 1

    @property
    def replaces_ffn(self) -> bool:
        return self.ffn or self.group_intermediate

    def validate(self, cfg: TransformerConfig) -> None:
        """Raise :class:`ConfigError` naming the ``lightweight.*`` key of the first setting that cannot work."""
        k = self.groups
        if k < 1:
            raise ConfigError(f"lightweight.groups={k} must be at least 1 (1 is the plain Transformer)")
        valid = _valid_groups(cfg, self)
        if self.attention and not self.straddle_heads and cfg.n_heads % k:
            raise ConfigError(f"lightweight.groups={k} does not divide n_heads={cfg.n_heads}: G-MHA gives each "
                              f"group n_heads/groups whole heads (Eq. 6); valid groups: {valid} (or set "
                              "lightweight.straddle_heads=true)")
        if cfg.d_model % k:
            raise ConfigError(f"lightweight.groups={k} does not divide d_model={cfg.d_model}: each group holds "
                              f"d_model/groups features (Eq. 5); valid groups: {valid}")
        if self.replaces_ffn and cfg.d_ffn % k:
            raise ConfigError(f"lightweight.groups={k} does not divide d_ffn={cfg.d_ffn}: G-FFN and G-IL split "
                              f"the hidden layer into groups (Eq. 8); valid groups: {valid}")
        if self.qk_expansion < 1:
            raise ConfigError(f"lightweight.qk_expansion={self.qk_expansion} must be an integer >= 1 (the n of "
                              "'LW-Transformer n x', Table I; 1 keeps the baseline query/key width)")
        check_at_most("lightweight.qk_expansion", self.qk_expansion, MAX_MULTIPLIER,
                      "queries and keys are that many times d_model wide (Table I's n x)")
        if cfg.qk_dim is not None:
            hint = (f"lightweight.qk_expansion={cfg.qk_dim // cfg.d_model}" if cfg.qk_dim % cfg.d_model == 0
                    else "lightweight.qk_expansion (an integer multiple of d_model)")
            raise ConfigError(f"qk_dim={cfg.qk_dim} cannot be combined with the lightweight section, whose "
                              f"query/key width is lightweight.qk_expansion x d_model (Table I's n x); set "
                              f"qk_dim=None and {hint}")
        if not (self.replaces_attention or self.replaces_ffn):
            raise ConfigError("the lightweight section turns nothing on: lightweight.attention, .ffn, "
                              ".group_merge and .group_intermediate are all false and qk_expansion=1; enable one "
                              "or remove the section")


def _valid_groups(cfg: TransformerConfig, section: LightweightConfig) -> list[int]:
    """Group counts that divide every width the enabled options split."""
    widths = [cfg.d_model]
    if section.attention and not section.straddle_heads:
        widths.append(cfg.n_heads)
    if section.replaces_ffn:
        widths.append(cfg.d_ffn)
    return [g for g in range(1, cfg.d_model + 1) if all(w % g == 0 for w in widths)]


class GroupedLinear(nn.Module):
    """Eq. 5 with a linear ``tau``: features split into ``groups`` contiguous chunks, chunk ``i`` mapped by
    ``W_i x_i + b_i``, outputs concatenated (a block-diagonal linear layer).

    The weight uses PyTorch's grouped-convolution layout: ``weight`` is ``(blocks * out/groups, in/groups)`` with
    group ``i``'s matrix in rows ``i*out/groups ..``, where ``blocks`` is 1 with weight sharing (every group uses
    the same ``W``, ``b``) and ``groups`` without. So at ``groups=1`` this *is* ``nn.Linear(in, out)``: same
    parameter names, shapes and forward (``F.linear``), and a plain model's checkpoint loads unchanged.
    ``in_features`` / ``out_features`` are the full widths, as for ``nn.Linear``.
    """

    def __init__(self, in_features: int, out_features: int, groups: int = 1, *, shared: bool = False,
                 bias: bool = True, init_gain: float = 1.0) -> None:
        super().__init__()
        if in_features % groups or out_features % groups:
            raise ValueError(f"groups={groups} must divide in_features={in_features} and "
                             f"out_features={out_features}")
        self.in_features, self.out_features, self.groups = in_features, out_features, groups
        self.blocks = 1 if shared else groups
        self.init_gain = init_gain
        self.group_in, self.group_out = in_features // groups, out_features // groups
        self.weight = nn.Parameter(torch.empty(self.blocks * self.group_out, self.group_in))
        self.bias = nn.Parameter(torch.empty(self.blocks * self.group_out)) if bias else None
        self.reset_parameters()

    @property
    def shared(self) -> bool:
        return self.blocks == 1 and self.groups > 1

    def reset_parameters(self) -> None:
        """Xavier-uniform on each group's ``(out/k, in/k)`` matrix with ``init_gain``, zero bias; at ``k=1`` the
        core's initialisation (same bound, same random draw)."""
        bound = self.init_gain * math.sqrt(6.0 / (self.group_in + self.group_out))
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return grouped_linear(x, self.weight, self.bias, self.groups, self.blocks)

    def madds(self, t: int) -> int:
        """``t`` tokens times ``k`` groups of ``(in/k) x (out/k)`` multiply-adds; sharing does not change it."""
        return t * self.groups * self.group_in * self.group_out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, groups={self.groups}, "
                f"shared={self.shared}, bias={self.bias is not None}")


def grouped_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], groups: int, blocks: int) -> Tensor:
    """Eq. 5 over ``x``'s last dimension, in the layout of :class:`GroupedLinear` (``blocks`` 1: one shared
    matrix; ``groups``: one matrix per group).

    Computed as the fewest, largest matrix products the layout allows, with no copy of the input: shared weights
    are one product over ``(tokens x groups)`` rows; separate weights are one product per group over a strided
    column slice of ``x`` (BLAS reads it in place), the results concatenated. A batched product (``einsum``)
    would first copy the input into group-major order and the output back, which at the paper's widths cost
    more than the products themselves (measured on the project's CPU: 1.25x the time of this form).
    """
    if groups == 1:
        return F.linear(x, weight, bias)
    group_in = x.shape[-1] // groups
    if blocks == 1:
        out = F.linear(x.unflatten(-1, (groups, group_in)), weight, bias)
        return out.flatten(-2)
    weights = weight.chunk(groups)
    biases = bias.chunk(groups) if bias is not None else (None,) * groups
    return torch.cat([F.linear(part, w, b) for part, w, b in zip(x.split(group_in, -1), weights, biases)], -1)


class GroupedMultiHeadAttention(MultiHeadAttention):
    """G-MHA (Eq. 6): the core's attention with group-wise q/k/v projections (and, for G-LML, merge).

    Group ``i`` of the input (and of the memory, in cross-attention) is projected by its own (or, with weight
    sharing, the common) matrices into the queries, keys and values of heads ``i*h/k .. (i+1)*h/k - 1``, so
    every head attends within one group exactly as ``MHA(X_i)`` in Eq. 6, and concatenating the heads is
    ``[tau(X_1), ..., tau(X_k)]`` (with ``whole_heads=False`` a head may straddle two groups' features, where ``k``
    does not divide ``h``). ``W_O`` (Eq. 3) stays dense unless ``merge_groups > 1`` (G-LML, Table III).
    Queries and keys are ``qk_expansion`` times wider than values (n x, Table I). Everything after the
    projections (relative positions, logit mixer, masking, fused/eager paths, KV cache) is the core's.
    """

    def __init__(self, d_model: int, n_heads: int, *, groups: int = 1, merge_groups: int = 1,
                 share_weights: bool = False, qk_expansion: int = 1, whole_heads: bool = True,
                 kv_dim: Optional[int] = None,
                 dropout: float = 0.0, bias: bool = True, relative: Optional[nn.Module] = None,
                 logit_mixer: Optional[nn.Module] = None, force_eager: bool = False) -> None:
        # The core builds dense projections first; they are replaced below before any use.
        super().__init__(d_model, n_heads, kv_dim=kv_dim, qk_dim=qk_expansion * d_model, dropout=dropout,
                         bias=bias, relative=relative, logit_mixer=logit_mixer, force_eager=force_eager)
        if whole_heads and n_heads % groups:
            raise ValueError(f"groups={groups} must divide n_heads={n_heads} (or heads may straddle groups: "
                             "whole_heads=False)")
        self.groups, self.merge_groups = groups, merge_groups

        def grouped(width_in: int, width_out: int, k: int, gain: float) -> GroupedLinear:
            return GroupedLinear(width_in, width_out, k, shared=share_weights, bias=bias, init_gain=gain)

        self.q_proj = grouped(d_model, self.qk_dim, groups, QKV_GAIN)
        self.k_proj = grouped(self.kv_dim, self.qk_dim, groups, QKV_GAIN)
        self.v_proj = grouped(self.kv_dim, d_model, groups, QKV_GAIN)
        self.out_proj = grouped(d_model, d_model, merge_groups, 1.0)

    def reset_parameters(self) -> None:
        """Each projection's own initialisation (per-group Xavier with the core's gains)."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            proj.reset_parameters()

    def madds(self, t_q: int, t_k: int) -> int:
        """Group-wise projections (``in*out/k`` per token each), logits ``Tq Tk n d``, weighted sum ``Tq Tk d``,
        relative positions and the logit mixer."""
        total = (self.q_proj.madds(t_q) + self.k_proj.madds(t_k) + self.v_proj.madds(t_k)
                 + self.out_proj.madds(t_q) + t_q * t_k * (self.qk_dim + self.d_model))
        if self.relative is not None:
            total += self.relative.madds(t_q, t_k, self.n_heads)
        if self.logit_mixer is not None:
            total += self.logit_mixer.madds(t_q, t_k)
        return total


class GroupedFeedForward(FeedForward):
    """G-FFN (Eq. 7-8): ``W1`` dense (or group-wise with ``intermediate_groups``, G-IL), ReLU, then the
    group-wise reducing layer ``W2 in R^{d_f/k x d/k}`` over ``output_groups`` chunks of ``H``."""

    def __init__(self, d_model: int, d_ffn: int, *, intermediate_groups: int = 1, output_groups: int = 1,
                 share_weights: bool = False, activation: str = "relu", act_dropout: float = 0.0,
                 bias: bool = True) -> None:
        # The core builds dense fc1/fc2 first; they are replaced below before any use.
        super().__init__(d_model, d_ffn, activation=activation, act_dropout=act_dropout, bias=bias)
        self.fc1 = GroupedLinear(d_model, d_ffn, intermediate_groups, shared=share_weights, bias=bias)
        self.fc2 = GroupedLinear(d_ffn, d_model, output_groups, shared=share_weights, bias=bias)

    def madds(self, t: int) -> int:
        return self.fc1.madds(t) + self.fc2.madds(t)


def _attention(section: LightweightConfig, cfg: TransformerConfig, relative: Optional[nn.Module],
               logit_mixer: Optional[nn.Module]) -> GroupedMultiHeadAttention:
    k = section.groups
    return GroupedMultiHeadAttention(
        cfg.d_model, cfg.n_heads, groups=k if section.attention else 1, merge_groups=k if section.group_merge else 1,
        share_weights=section.share_weights, qk_expansion=section.qk_expansion,
        whole_heads=not section.straddle_heads, dropout=cfg.attn_dropout,
        bias=cfg.bias, relative=relative, logit_mixer=logit_mixer, force_eager=cfg.attn_impl == "eager")


def _relative(components: Components, section: LightweightConfig, side: StackSide, index: int) -> Optional[nn.Module]:
    """The relative-position module for this layer, sized to the per-head query width ``n d / h``.

    ``head_dim`` is passed only when n x changes the width, so a replacement factory taking ``(side, index)``
    (the documented signature) still composes at ``qk_expansion=1``.
    """
    cfg = components.cfg
    head_dim = section.qk_expansion * cfg.d_model // cfg.n_heads
    if head_dim == cfg.qk_width // cfg.n_heads:
        return components.relative(side, index)
    return components.relative(side, index, head_dim=head_dim)


def _feed_forward(section: LightweightConfig, cfg: TransformerConfig) -> GroupedFeedForward:
    k = section.groups
    return GroupedFeedForward(cfg.d_model, cfg.d_ffn, intermediate_groups=k if section.group_intermediate else 1,
                              output_groups=k if section.ffn else 1, share_weights=section.share_weights,
                              activation=cfg.activation, act_dropout=cfg.act_dropout, bias=cfg.bias)


def _variant(**section: Any) -> Callable[[VariantContext], dict]:
    """k = 2 groups (LW Table II) and ``section``'s other keys, as dotted overrides."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        ctx.transformer_fields("LW-Transformer")
        return {f"lightweight.{key}": value for key, value in {"groups": 2, **section}.items()}

    return overrides


class _LightweightMethod(MethodBase):
    """Nothing to tie after the build: a shared group weight is a single tensor inside its layer."""

    name = "lightweight"
    config_class = LightweightConfig
    variants = {
        "lw_1x": NamedVariant("LW-Transformer1x: G-MHA + G-FFN, k=2, shared group weights (LW Table II, dagger)",
                              _variant()),
        "lw_1x_nows": NamedVariant("LW-Transformer1x without weight sharing: G-MHA + G-FFN, k=2 (LW Table II; the "
                                   "image setting of Sec. IV-A)", _variant(share_weights=False)),
        "lw_3x": NamedVariant("LW-Transformer3x: queries and keys 3x wider, k=2, shared weights (LW Table II, "
                              "dagger)", _variant(qk_expansion=3)),
        "lw_mini": NamedVariant("LW-Transformer-mini1x: LW1x plus a group-wise intermediate layer, G-IL (LW Table "
                                "III)", _variant(group_intermediate=True)),
    }
    examples = (CompositionExample("lightweight", {"groups": 2}),)
    conflicts = (Conflict("conv_branch", "conv_branch"),)  # validate: both replace the encoder self-attention
    lm_examples = {"lightweight": {"groups": 2}}

    def restructures(self, section: LightweightConfig) -> bool:
        """Its group-wise modules replace the checkpoint's attention and FFN matrices."""
        return True

    def validate(self, section: LightweightConfig, cfg: ComposedConfig) -> None:
        section.validate(cfg)
        if cfg.conv_branch is not None and section.replaces_attention:
            raise ConfigError("lightweight.attention / group_merge / qk_expansion replace the encoder "
                              "self-attention, which conv_branch replaces with its attention + convolution block; "
                              "one module cannot be both. Keep only G-FFN (lightweight.attention=false, "
                              "group_merge=false, qk_expansion=1) or remove the conv_branch section")

    def customize(self, section: LightweightConfig, cfg: ComposedConfig, components: Components) -> None:
        """Replace the attention factories (self and cross, Sec. IV-A: every Transformer layer) and the FFN
        factory. ``relative`` and ``logit_mixer`` are looked up when a layer is built, so methods that provide
        them (Predictive Attention) compose with G-MHA."""
        if section.replaces_attention:
            components.self_attention = lambda side, i: _attention(
                section, cfg, _relative(components, section, side, i), components.logit_mixer(side, i))
            components.cross_attention = lambda i: _attention(section, cfg, None, None)
        if section.replaces_ffn:
            components.ffn = lambda side, i: _feed_forward(section, cfg)


METHOD = _LightweightMethod()
