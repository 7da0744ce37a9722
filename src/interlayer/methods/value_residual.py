"""Value residual learning (Zhou, Wu, Jiang, Obeid & Lan, "Value Residual Learning", arXiv:2410.17897, ACL 2025; first
titled "... For Alleviating Attention Concentration In Transformers"): every self-attention layer n > 1 also attends
with the first layer's values (ResFormer) or with them alone (SVFormer). The rest (options, parameter formulas,
composition, what the paper has that interlayer does not) is in docs/methods/value_residual.md.

Paper map:

* **ResFormer** (Sec. 3, Fig. 2): ``V_n' = lambda_{n,1} V_1 + lambda_{n,2} V_n``, ``U_n = A_n V_n'`` in layers n > 1:
  :class:`ValueResidual`. ``lambda_1``/``lambda_2`` are ``lambda_{n,1}`` (on ``V_1``)/``lambda_{n,2}``, 0.5/0.5 as
  the paper and its code (the old ``lambdas`` key, reversed, is read with a DeprecationWarning). ``learnable`` (the
  paper's learnable variants): a trained pair per layer, or per head (``granularity="head"``).
* **SVFormer** (Sec. 3, Fig. 2; "nearly half" the KV cache, Abstract): layers n > 1 attend with ``V_1`` and have no
  value projection, ``L qk + d`` cached numbers per token instead of ``L (qk + d)``: :class:`SharedFirstValue`.
* **Exact start** (not in the paper): ``lambda_warmup_steps`` N ramps the pair from the plain model's 0 and 1 over N
  optimiser steps (buffer ``steps_done``), so an imported checkpoint starts exactly; ResFormer only.

Readings where the paper leaves room (each with its reason):

* Mixed after the head split: the per-layer mix is elementwise, the same either way (the code mixes before), and
  there ``granularity="head"`` is a broadcast.
* KV cache: the *mixed* values are cached, as the code does, so ResFormer's cache and decoding are the plain
  model's; SVFormer's layers n > 1 cache keys only and read ``V_1`` from layer 1 (the code writes ``V_1`` into
  every slot): that is what shrinks the cache as the paper counts it.
* Stacks: the papers are decoder-only; ``sides`` (default: every self-attention stack), each with its own ``V_1``,
  cross-attention unchanged. Multi-Pass: ``V_1`` of the same pass, as every pass recomputes layer 1 from its input.
* MAdds: the mix is 3 element operations per value number and no product, so the count (products only, like
  torch's FLOP counter) is unchanged; SVFormer removes the value projections' ``T d^2`` per layer n > 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Optional

import torch
from torch import Tensor, nn

from ..core.attention import KVCache, KVHistory, newest
from ..core.components import Components, StackSide
from ..errors import ConfigError
from .base import (
    KV_REFUSAL,
    ComposedConfig,
    CompositionExample,
    Conflict,
    MethodBase,
    NamedVariant,
    VariantContext,
    add_kv_sources,
    check_core_self_attention,
    section_variant,
    stack_sides,
)

Mode = Literal["resformer", "svformer"]
DEFAULT_LAMBDA = 0.5  # the paper's Identity-ResFormer and the official code
Granularity = Literal["layer", "head"]


@dataclass
class ValueResidualConfig:
    """``mode``: ``resformer`` (``V_n' = lambda_1 V_1 + lambda_2 V_n``) or ``svformer`` (``V_n' = V_1``, no value
    projection in layers n > 1). ``lambda_1``: the weight on the first layer's values ``V_1`` (the paper's
    ``lambda_{n,1}``), ``lambda_2``: on the layer's own ``V_n`` (``lambda_{n,2}``); 0.5 and 0.5 as the paper, 0 and 1
    is the plain model; ``learnable``: train them, from these values; ``granularity``: one pair per layer or per
    head; ``sides``: the self-attention stacks (None: all of the model's); ``lambda_warmup_steps``: ramp the pair
    from the plain model's 0 and 1 over that many optimiser steps (0: none), so a pretrained model starts exactly
    (module doc)."""

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

    mode: Mode = "resformer"
    lambda_1: float = DEFAULT_LAMBDA
    lambda_2: float = DEFAULT_LAMBDA
    learnable: bool = False
    granularity: Granularity = "layer"
    sides: Optional[list[StackSide]] = None
    lambda_warmup_steps: int = 0

    def resolved_sides(self, cfg: ComposedConfig) -> list[str]:
        return stack_sides("value_residual", self.sides, cfg)

    def validate(self, cfg: ComposedConfig) -> None:
        for key in ("lambda_1", "lambda_2"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"value_residual.{key}={value!r} must be a finite number (V_n' = lambda_1 V_1 + "
                                  "lambda_2 V_n; the paper uses 0.5 and 0.5)")
        if self.mode == "svformer" and (self.learnable or self.granularity != "layer"
                                        or (self.lambda_1, self.lambda_2) != (DEFAULT_LAMBDA, DEFAULT_LAMBDA)):
            raise ConfigError("value_residual.lambda_1 / lambda_2 / learnable / granularity mix V_1 with V_n in "
                              "ResFormer; "
                              "value_residual.mode='svformer' uses V_1 alone (layers n > 1 have no value "
                              "projection), so leave them at their defaults or set mode='resformer'")
        if self.lambda_warmup_steps < 0:
            raise ConfigError(f"value_residual.lambda_warmup_steps={self.lambda_warmup_steps} must be >= 0 (0: the "
                              "lambdas from the first step; N: a ramp from [1, 0] over N optimiser steps)")
        if self.lambda_warmup_steps and self.mode == "svformer":
            raise ConfigError("value_residual.lambda_warmup_steps ramps ResFormer's lambdas from [1, 0]; "
                              "value_residual.mode='svformer' has no value projection in layers n > 1, so it cannot "
                              "start as the plain model: set lambda_warmup_steps=0 or mode='resformer'")
        if self.granularity == "head" and not self.learnable:
            raise ConfigError("value_residual.granularity='head' gives each head its own learnable pair; with "
                              "value_residual.learnable=false every head would hold the same numbers. Set "
                              "learnable=true or granularity='layer'")
        if cfg.crossformer is not None and self.mode == "svformer":
            pairs = [p for p in (*cfg.crossformer.hard, *cfg.crossformer.soft) if p == "vf"]
            if pairs:
                raise ConfigError("crossformer 'vf' ties or regularises the value projections of adjacent layers, "
                                  "but value_residual.mode='svformer' removes the value projection of every layer "
                                  "after the first; drop 'vf' from crossformer.hard/soft or use mode='resformer'")
        check_core_self_attention(cfg, "value_residual", self.resolved_sides(cfg))


class ValueResidual(nn.Module):
    """ResFormer's source for layer n > 1: own keys, values ``lambda_first V_1 + lambda_own V_n`` (the paper's
    ``lambda_{n,1}``, ``lambda_{n,2}``; mixed on the new positions, then kept in the layer's cache as the official
    code does); with ``warmup_steps`` the pair ramps from the plain model's 0 and 1 (module doc, "Exact start")."""

    projects_keys = True
    projects_values = True

    def __init__(self, lambda_first: float, lambda_own: float, learnable: bool, heads: Optional[int],
                 warmup_steps: int = 0) -> None:
        super().__init__()
        shape = (heads, 1, 1) if heads is not None else ()
        first, own = torch.full(shape, float(lambda_first)), torch.full(shape, float(lambda_own))
        if learnable:
            self.lambda_own, self.lambda_first = nn.Parameter(own), nn.Parameter(first)
        else:
            self.register_buffer("lambda_own", own, persistent=False)
            self.register_buffer("lambda_first", first, persistent=False)
        self.warmup_steps = warmup_steps
        if warmup_steps:
            self.register_buffer("steps_done", torch.zeros(()))

    def optimizer_step_done(self) -> None:
        """One more optimiser step (the training engine calls this after each): advances the warm-up."""
        if self.warmup_steps:
            self.steps_done.add_(1.0)

    def weights(self) -> tuple[Tensor, Tensor]:
        """``(lambda_own, lambda_first)`` now: the pair, or during the warm-up the plain model's ``(1, 0)`` moved
        ``min(1, t/N)`` of the way to it."""
        if not self.warmup_steps:  # a config constant, fixed at build time
            return self.lambda_own, self.lambda_first
        ramp = (self.steps_done / self.warmup_steps).clamp(max=1.0)
        return 1.0 + ramp * (self.lambda_own - 1.0), ramp * self.lambda_first

    def forward(self, k: Optional[Tensor], v: Optional[Tensor], history: KVHistory, cache: Optional[KVCache]
                ) -> tuple[Tensor, Tensor]:
        v_first = newest(history[0][1], v.shape[2], cache)  # the first layer's values at the new positions
        own, first = self.weights()
        mixed = own.to(v.dtype) * v + first.to(v.dtype) * v_first
        return cache.append(k, mixed) if cache is not None else (k, mixed)


class SharedFirstValue(nn.Module):
    """SVFormer's source for layer n > 1: own keys (kept in its cache), the first layer's values (kept there)."""

    projects_keys = True
    projects_values = False

    def forward(self, k: Optional[Tensor], v: Optional[Tensor], history: KVHistory, cache: Optional[KVCache]
                ) -> tuple[Tensor, Tensor]:
        return (cache.append_keys(k) if cache is not None else k), history[0][1]


def _variant(**section: Any) -> Callable[[VariantContext], dict[str, Any]]:
    return section_variant("value_residual", "ResFormer", KV_REFUSAL.format(label="ResFormer"), whole=True, **section)


class _ValueResidualMethod(MethodBase):
    name = "value_residual"
    config_class = ValueResidualConfig
    variants = {
        "resformer": NamedVariant("ResFormer: V_n' = 0.5 V_1 + 0.5 V_n in every layer n > 1 (Value Residual "
                                  "Learning, Zhou et al. 2025, Sec. 3; the official code's fixed mix)", _variant()),
        "resformer_learnable": NamedVariant("ResFormer with learnable lambda_1, lambda_2 per layer from 0.5, 0.5 "
                                            "(Value Residual Learning's learnable variant)", _variant(learnable=True)),
        "svformer": NamedVariant("SVFormer: every layer attends with the first layer's values, no value projection "
                                 "after layer 1, about half the KV cache (Value Residual Learning, Sec. 3)",
                                 _variant(mode="svformer")),
    }
    examples = (CompositionExample("value_residual", {"learnable": True}),)
    # check_core_self_attention: the values are fed through the core self-attention's kv_source
    conflicts = (Conflict("lightweight", "lightweight.attention"), Conflict("conv_branch", "conv_branch"))
    lm_examples = {"resformer": {"learnable": True}, "svformer": {"mode": "svformer"}}

    def restructures(self, section: ValueResidualConfig) -> bool:
        """SVFormer deletes the value projections of every layer after the first."""
        return section.mode == "svformer"

    def exact_start(self, section: ValueResidualConfig) -> Optional[str]:
        return "lambda_warmup_steps" if section.mode == "resformer" else None

    def customize(self, section: ValueResidualConfig, cfg: ComposedConfig, components: Components) -> None:
        """Give every self-attention layer n > 1 of the chosen stacks its value source; layer 1 stays plain."""
        heads = cfg.n_heads if section.granularity == "head" else None

        def source(index: int) -> Optional[nn.Module]:
            if index == 0:
                return None
            if section.mode == "svformer":
                return SharedFirstValue()
            return ValueResidual(section.lambda_1, section.lambda_2, section.learnable, heads,
                                 section.lambda_warmup_steps)

        add_kv_sources(components, section.resolved_sides(cfg), source)


METHOD = _ValueResidualMethod()
