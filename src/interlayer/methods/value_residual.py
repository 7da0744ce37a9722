"""Value residual learning (Zhou, Wu, Jiang, Obeid & Lan, "Value Residual Learning", arXiv:2410.17897, ACL 2025;
first titled "Value Residual Learning For Alleviating Attention Concentration In Transformers"): ResFormer and
SVFormer.

Paper map (section / equation numbers of the paper; the official code is github.com/Zcchill/Value-Residual-Learning,
``src/modeling/modeling_llama_resformer.py`` and ``modeling_llama_svformer.py``):

* **ResFormer** (Sec. 3, Fig. 2): every self-attention layer n > 1 attends with the values
  ``V_n' = lambda_{n,1} V_1 + lambda_{n,2} V_n`` (the paper's notation: ``lambda_{n,1}`` weighs the first layer's
  values ``V_1``, computed from the first layer's own input, ``lambda_{n,2}`` the layer's own ``V_n = H_{n-1}
  W_n^V``); the attention weights ``A_n`` are untouched, so ``U_n = A_n V_n'``. The options are named as the paper
  writes them, ``lambda_1`` on ``V_1`` and ``lambda_2`` on ``V_n``, so its settings port as written (Sparse-ResFormer's
  ``lambda_{n,1} = 5``, for instance, is ``lambda_1=5``). The paper's main setting, and the official code, is
  ``lambda_1 = lambda_2 = 0.5`` (``value_states = 0.5 * formal_layer_values[0] + 0.5 * value_states``):
  ``mode="resformer"`` with the defaults. Layer 1 is unchanged. (Until this naming was settled the section had one
  key, ``lambdas = [weight on V_n, weight on V_1]``: the reverse of the paper's order. A config that still has it
  is read as ``lambda_2, lambda_1`` = those two numbers, with a DeprecationWarning: :mod:`interlayer.config`.)
* **Learnable mixing** (the paper's learnable-lambda variants): ``learnable=True`` makes ``lambda_1, lambda_2``
  trainable parameters of each layer n > 1, initialised at the configured values; ``granularity="head"`` gives each
  head its own pair (``2 H`` numbers per layer instead of 2). Named compare variant ``resformer_learnable``. The
  parameters are named after what they weigh (``lambda_first`` = ``lambda_{n,1}``, ``lambda_own`` =
  ``lambda_{n,2}``), as saved checkpoints have them.
* **Exact start on a pretrained model** (``lambda_warmup_steps`` N, not in the paper): the mixing weights ramp
  from the plain model's ``lambda_1 = 0, lambda_2 = 1`` (``V_n' = V_n``): ``lambda_{n,1}(t) = min(1, t / N)
  lambda_1`` and ``lambda_{n,2}(t) = 1 + min(1, t / N) (lambda_2 - 1)`` after ``t`` optimiser steps, so an imported
  checkpoint computes exactly what it computed before the first update (``0 * V_1 + 1 * V_n`` is ``V_n`` bit for
  bit), the first layer's values grow in, and from step N on the configured (or learned) lambdas hold. As
  Predictive Attention's ``alpha_warmup_steps``: ``t`` is a buffer of each value source (``steps_done``), advanced
  in place by the training engine after each optimiser step (``optimizer_step_done``: no host sync, no graph break)
  and saved with the weights. With ``learnable`` the ramp scales the learned pair (its gradient is scaled by the
  ramp, so the first step leaves it where it is). SVFormer has no value projection in layers n > 1, so it cannot
  start as the plain model: refused.
* **SVFormer** (Sec. 3, Fig. 2): every layer n > 1 attends with ``V_1`` itself and has no value projection (the
  official SVFormer builds ``v_proj`` in layer 0 only). Its KV cache keeps keys for every layer and values for
  layer 1 only: per token ``L qk + d`` numbers instead of ``L (qk + d)``, "nearly half" (Abstract), measured by
  :func:`interlayer.core.generation.kv_cache_bytes_per_token`.

Readings chosen where the text leaves a choice (each with the reason):

* **Before or after the head split**: the mix is elementwise with one scalar per layer, so it is the same either
  way (the code mixes ``(B, T, d)`` tensors before ``view``/``transpose``). Here it runs on the split
  ``(B, H, T, d_head)`` tensors, so ``granularity="head"`` is a broadcast of an ``(H, 1, 1)`` weight.
* **With a KV cache**: the code mixes the new positions and appends the *mixed* values to the layer's cache
  (``past_key_value.update`` after the mix); here likewise (``V_1``'s new positions are the last rows of layer 1's
  full-length values), so ResFormer's cache has the plain size and decoding costs no extra products. SVFormer's
  code still writes ``V_1`` into every layer's cache slot; here a layer n > 1 stores only its keys and reads
  ``V_1`` from layer 1, which is what makes the cache shrink as the paper counts it.
* **Stacks**: the papers are decoder-only. ``sides`` (default: every self-attention stack of the model) applies
  the method to the encoder (classifier, encoder-decoder's encoder) and the decoder's self-attention; each stack
  has its own ``V_1``. Cross-attention is unchanged. Multi-Pass: ``V_1`` is the first layer's in the *same pass*
  (each run of the stack keeps its own history), since every pass recomputes layer 1's values from its own input.
* **Arithmetic**: the mix costs 3 element operations per value number and no matrix product, so it adds nothing to
  the MAdds count (which, like torch's FLOP counter, counts products only); SVFormer removes the value
  projections' ``T d^2`` per layer n > 1.

Parameters: ResFormer adds ``2 (L - 1)`` (``2 H (L - 1)`` per head) with ``learnable``, none otherwise; SVFormer
removes ``(L - 1)(d^2 + d)`` (``d^2`` without bias) per stack.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

import torch
from torch import Tensor, nn

from ..core.attention import KVCache, KVHistory, newest
from ..core.components import Components, StackSide
from ..errors import ConfigError
from .base import (
    KV_MCAN,
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
    return section_variant("value_residual", "ResFormer", KV_MCAN.format(label="ResFormer"), whole=True, **section)


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
