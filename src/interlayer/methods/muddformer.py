"""MUDDFormer (Xiao, Meng, Li & Yuan, "MUDDFormer: Breaking Residual Bottlenecks in Transformers via Multiway Dynamic
Dense Connections", ICML 2025, arXiv 2502.12170): after every block, depth-wise aggregates (DA) of the embeddings
and every earlier block's output, with weights computed per position from the block's output, and a separate
aggregate for each input the next block reads (its query, key, value and residual).

Paper map (arXiv v2 equation and section numbers; App. B is the paper's PyTorch-style pseudo-code):

* **Dense connections** (Sec. 2, Eq. 3): ``X_0 = Embedding(X)``, ``X_i = B_i(X_bar_{i-1})``,
  ``X_bar_i = DA_i(X_0..X_i)``; the DA's inputs are the raw block outputs ``X_j`` (as DenseFormer's), never
  earlier aggregates.
* **Static** (Sec. 2.1, Eq. 4): ``DA_i = sum_j a_ij X_j`` with learned scalars: DenseFormer (Pagliardini et al.
  2024) exactly (tested against :mod:`~interlayer.methods.denseformer` with the same weights).
* **Dynamic** (Sec. 2.2, Eq. 5-6): ``X_bar_i[t] = sum_j A_ij[t] X_j[t]`` with ``A_i(X_i) = GELU(RMSNorm(X_i) W1) W2 +
  a_i``, computed at every position t from the block's own output ``X_i[t]``.
* **Multiway** (Sec. 2.3, Eq. 7-8): four DA modules per block, one per input of the next block: ``X_A' = MHA(LN(X^Q),
  LN(X^K), LN(X^V)) + X^R``, ``B'(..) = FFN(LN(X_A')) + X_A'``; the model's output is the residual way of the last
  aggregate, ``X^R_L`` (so the last DA computes that way only; App. B: ``C = 1`` there).
* **Shapes** (App. B): ``W1`` is ``D x K``, ``W2`` is ``K x (C (i+1))`` with the hidden width ``K = C (i+1)`` and C
  the ways (4, or 1 for the last DA and for ``multiway=False``); ``a_i`` is ``C x (i+1)``. Parameters per dynamic DA:
  ``D K + K C (i+1) + C (i+1)`` (tested); a static DA has ``a_i`` only.
* **Initialisation** (Sec. 3, "Implementation details"): ``W1 ~ N(0, 1/D)``, ``W2 = 0``, ``a_ii = 1`` and the rest
  0, "This reduces MUDDFormer to Transformer at the beginning of training": every way of every DA is ``X_i``, so
  at initialisation the model is the plain Transformer exactly (tested bit for bit).
* **Parameter re-allocation** (Sec. 2.4, Eq. 9): ``ffn_reallocation=True`` grows the FFN width linearly with depth,
  ``D_f'(i) = (0.5 (L - i) + 1.5 (i - 1)) / (L - 1) D_f``, rounded to an integer (the total is ``L D_f`` exactly:
  the widths of layers i and L+1-i sum to ``2 D_f``, and round-half-even rounds such a pair's halves apart).
* **PrePostDANorm** (Sec. 2.5, Eq. 10): ``prepost_norm=True`` normalises the DA's inputs (``Norm(X_j)``, a learnable
  RMSNorm per block output, scale initialised to 1) and adds a normalised aggregate to the block output:
  ``X_bar_i = Norm(DA_i(Norm(X_0), .., Norm(X_i))) + X_i`` (scale initialised to 1e-3, ``a_i = 0``, Sec. 3), one
  post-norm per way. At initialisation ``DA = 0`` and every way is ``X_i``: the plain model again (tested).
* **Sparse connectivity** (Sec. 3.6, Fig. 9, "MUDDFormer-kxp"): ``dilation`` k and ``period`` p as DenseFormer's
  kxp: ``DA_i`` aggregates ``{X_j : j <= i, j = i (mod k)}`` and exists after the blocks with ``p | i``; after the
  others every input of the next block is ``X_i`` (the plain residual). 2x2 is the paper's cheaper trade-off
  (89.8% -> 97.8% relative training speed, +0.18 perplexity).

Choices where the paper leaves room (each with the reason):

* **The weight generator's RMSNorm has no scale**: App. B writes ``RMSNorm(x) @ w1`` and the released PyTorch port
  (``RMSnormNoscale``) has none; a scale would be absorbed in ``W1`` anyway. Its epsilon is the model's
  ``layer_norm_eps``.
* **``N(0, 1/D)``** is read as variance ``1/D`` (standard deviation ``D^-1/2``, the usual fan-in scale; the paper
  writes ``N(mean, variance)``). Only the start of training depends on it (``W2 = 0``).
* **One pre-norm for the three attention inputs**: Eq. 7 writes the same ``LN`` for ``X^Q``, ``X^K``, ``X^V`` (the
  released port applies its ``attention_norm`` to each); the block's own pre-norm is reused, so the plain block's
  parameters are unchanged.
* **How the query, key and value ways reach the attention**: through the core's generic hook: the depth connection
  gives each layer its self-attention's inputs (:meth:`~interlayer.core.layers.DepthConnection.attention_inputs`),
  the layer's input is the residual way. Any attention with the core's projections composes (value residuals and
  CLA project the key/value ways, predictive attention mixes the logits); the attention modules of LW-Transformer
  and the conv branch are refused, since they read a single input.
* **Arithmetic**: the weights ``GELU(RMSNorm(X_i) W1) W2`` are two matrix products (``D K + K C (i+1)`` multiply-adds
  per position, counted). The aggregation ``sum_j A_ij X_j`` is element-wise, in the stream's dtype, one term per
  source: not a batched product, because the sources are separate tensors and a product would first copy them
  into one (``(i+1) D`` numbers per position at every DA, kept for the backward pass: memory quadratic in depth),
  and because a TF32 or bf16 product would round the residual stream at every block (the identity at
  initialisation would then not be exact on a GPU). Like residual additions and DenseFormer's DWA it is not
  counted in MAdds (nor by torch's FLOP counter). Compiled, the terms fuse into one pass.
* **Every stack** and **post-LN**: as DenseFormer here, each stack (encoder, causal LM, decoder) has its own DA
  modules and ``X_0``; a post-LN block is aggregated the same way (Eq. 7 with the LN after the residual sum).
  Everything acts on each position alone, so the causal LM stays causal and decoding with the KV cache equals the
  full forward pass (tested). **Multi-Pass** composes: each pass runs the stack with its own ``X_0``, and the
  injected tensor is added to the layer's input in every role (query, key, value and residual), as it is added to
  the single input of a plain layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.components import Components, StackSide
from ..core.feedforward import FeedForward
from ..core.layers import DepthConnection
from ..errors import ConfigError
from .base import (
    STACK_MCAN,
    ComposedConfig,
    CompositionExample,
    Conflict,
    MethodBase,
    NamedVariant,
    VariantContext,
    check_core_self_attention,
    section_variant,
)
from .denseformer import dwa_inputs

WAYS = ("q", "k", "v", "r")  # Eq. 8's order: query, key, value, residual


@dataclass
class MUDDFormerConfig:
    """Options (see the module docstring for the paper references).

    * ``dynamic``: per-position weights (Eq. 5-6) or static ones (Eq. 4; with ``multiway=False``, DenseFormer).
    * ``multiway``: a DA per input of the next block, query, key, value, residual (Eq. 7-8), or one for all.
    * ``dilation``, ``period``: the kxp sparse variant (Sec. 3.6; 1x1 is the full MUDDFormer, 2x2 the cheap one).
    * ``prepost_norm``: PrePostDANorm (Sec. 2.5, Eq. 10), for deep-and-narrow models.
    * ``ffn_reallocation``: the FFN width grows with depth, 0.5 to 1.5 times ``d_ffn`` (Sec. 2.4, Eq. 9).
    """

    dynamic: bool = True
    multiway: bool = True
    dilation: int = 1
    period: int = 1
    prepost_norm: bool = False
    ffn_reallocation: bool = False

    def depths(self, cfg: ComposedConfig) -> dict[str, int]:
        """Each stack's depth by its config key."""
        return {"enc_layers": cfg.enc_layers, **({"dec_layers": cfg.dec_layers} if cfg.arch == "encoder_decoder"
                                                  else {})}

    def validate(self, cfg: ComposedConfig) -> None:
        for key in ("dilation", "period"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"muddformer.{key}={value!r} must be an integer >= 1 (1x1 is the full MUDDFormer, "
                                  "2x2 the paper's cheaper variant, Sec. 3.6)")
        for key, depth in self.depths(cfg).items():
            if self.period > depth:
                raise ConfigError(f"muddformer.period={self.period} is larger than {key}={depth}: no block would be "
                                  f"followed by a DA module; use a period in 1..{depth}")
            if self.ffn_reallocation and depth < 2:
                raise ConfigError(f"muddformer.ffn_reallocation grows the FFN width from the first to the last layer "
                                  f"(Eq. 9 divides by L - 1), but {key}={depth}; set ffn_reallocation=false")
        if self.multiway:
            sides = ["encoder", "decoder"] if cfg.arch == "encoder_decoder" else ["encoder"]
            check_core_self_attention(cfg, "muddformer", sides)  # multiway: its own K/V inputs
        if self.ffn_reallocation:
            self._check_ffn_widths(cfg)

    def _check_ffn_widths(self, cfg: ComposedConfig) -> None:
        """Refuse what ties or replaces FFNs, whose widths re-allocation makes differ from layer to layer."""
        if cfg.lightweight is not None:
            raise ConfigError("muddformer.ffn_reallocation gives each layer its own FFN width, but lightweight "
                              "replaces the FFNs with group-wise ones of width d_ffn; set ffn_reallocation=false or "
                              "remove the lightweight section")
        if cfg.crossformer is not None and "ffn" in (*cfg.crossformer.hard, *cfg.crossformer.soft):
            raise ConfigError("crossformer's 'ffn' pair ties or regularises adjacent layers' FFN weights, which "
                              "muddformer.ffn_reallocation makes of different widths; drop 'ffn' or set "
                              "ffn_reallocation=false")
        if cfg.layer_sharing is not None:
            raise ConfigError("layer_sharing runs shared blocks at several depths, but muddformer.ffn_reallocation "
                              "gives each depth its own FFN width; set ffn_reallocation=false or remove one section")


def _rms(x: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class DenseAggregate(nn.Module):
    """``DA_i`` for ``ways`` inputs of the next block: the weights of Eq. 6 (``static`` is ``a_i``, ``ways x
    len(inputs)``) and the aggregation of Eq. 5 over the block outputs ``inputs`` (their indices j)."""

    def __init__(self, d_model: int, inputs: list[int], ways: int, *, dynamic: bool, prepost_norm: bool,
                 eps: float) -> None:
        super().__init__()
        self.inputs, self.ways, self.eps, self.d_model = inputs, ways, eps, d_model
        width = ways * len(inputs)  # App. B: K = C (i + 1)
        self.dynamic = dynamic
        if dynamic:
            self.w1 = nn.Linear(d_model, width, bias=False)
            self.w2 = nn.Linear(width, width, bias=False)
            nn.init.normal_(self.w1.weight, std=d_model ** -0.5)  # Sec. 3: W1 ~ N(0, 1/D)
            nn.init.zeros_(self.w2.weight)  # Sec. 3: W2 = 0
        static = torch.zeros(ways, len(inputs))
        if not prepost_norm:
            static[:, -1] = 1.0  # Sec. 3: a_ii = 1 (the last input is X_i), the rest 0
        self.static = nn.Parameter(static)
        # Eq. 10's PostDANorm, one per way (Sec. 3: scale initialised to 1e-3).
        self.post_scale = nn.Parameter(torch.full((ways, d_model), 1e-3)) if prepost_norm else None

    def weights(self, h: Tensor) -> Tensor:
        """Eq. 6: ``(..., ways, inputs)`` per position (dynamic), or ``a_i`` ``(ways, inputs)`` (static)."""
        if not self.dynamic:
            return self.static
        dw = self.w2(F.gelu(self.w1(_rms(h, self.eps))))
        return dw.unflatten(-1, (self.ways, len(self.inputs))) + self.static

    def forward(self, sources: list[Tensor], h: Tensor) -> Tensor:
        """The ways ``(ways, ..., d)`` from the block outputs ``sources`` (those of ``inputs``, PreDANorm'ed when
        on) and the block's own output ``h``: Eq. 5, each term element-wise in the stream's dtype."""
        w = self.weights(h).to(h.dtype)
        if w.dim() == 2:  # static a_i (ways, inputs) -> (inputs, ways, 1, .., 1)
            columns = w.t().reshape(len(self.inputs), self.ways, *([1] * h.dim()))
        else:  # (..., ways, inputs) -> (inputs, ways, ..., 1)
            columns = w.permute(w.dim() - 1, w.dim() - 2, *range(w.dim() - 2)).unsqueeze(-1)
        out = columns[0] * sources[0]
        for j in range(1, len(sources)):
            out = out + columns[j] * sources[j]
        if self.post_scale is not None:  # Eq. 10: Norm(DA_i(..)) + X_i
            scale = self.post_scale.to(h.dtype).view(self.ways, *([1] * (h.dim() - 1)), -1)
            out = _rms(out, self.eps) * scale + h
        return out

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move here (:func:`interlayer.accounting.step_cost`): the block outputs this
        aggregate reads and the ways it writes, in the streams' fp32, forward, and their gradients backward."""
        return {"depth averages": 8.0 * batch * length * (len(self.inputs) + self.ways) * self.d_model}

    def madds(self, t: int) -> int:
        """The weight generator's two products (the aggregation is element-wise, not counted)."""
        if not self.dynamic:
            return 0
        return t * (self.w1.in_features * self.w1.out_features + self.w2.in_features * self.w2.out_features)


class _Run:
    """One run of the stack: the DA inputs so far, and the query/key/value ways the next layer reads."""

    def __init__(self, x: Tensor) -> None:
        self.sources: list[Tensor] = [x]
        self.inputs: Optional[tuple[Tensor, Tensor, Tensor]] = None


class MultiwayDenseConnections(DepthConnection):
    """The DA modules of one stack of ``n_layers`` blocks (``aggregates[m]`` follows the m-th block with ``period |
    i``). After block i the residual way is the next layer's input and the query/key/value ways its self-attention's
    inputs; the last block's DA computes the residual way only (Eq. 8: the output is ``X^R_L``)."""

    def __init__(self, n_layers: int, d_model: int, section: MUDDFormerConfig, eps: float) -> None:
        super().__init__()
        blocks = [i for i in range(1, n_layers + 1) if i % section.period == 0]
        self.slot: list[Optional[int]] = [blocks.index(i) if i in blocks else None for i in range(1, n_layers + 1)]
        self.aggregates = nn.ModuleList(
            DenseAggregate(d_model, dwa_inputs(i, section.dilation),
                           len(WAYS) if section.multiway and i < n_layers else 1, dynamic=section.dynamic,
                           prepost_norm=section.prepost_norm, eps=eps)
            for i in blocks)
        used = sorted({j for i in blocks for j in dwa_inputs(i, section.dilation)})
        # Eq. 10's PreDANorm: each block output normalised once, a learnable scale (initialised to 1) per output.
        self.pre_norms = (nn.ModuleDict({str(j): nn.RMSNorm(d_model, eps=eps) for j in used})
                          if section.prepost_norm else None)

    def _source(self, j: int, x: Tensor) -> Tensor:
        return self.pre_norms[str(j)](x) if self.pre_norms is not None and str(j) in self.pre_norms else x

    def start(self, x: Tensor) -> tuple[Tensor, Any]:
        return x, _Run(self._source(0, x))

    def attention_inputs(self, index: int, state: Any) -> Optional[tuple[Tensor, Tensor, Tensor]]:
        return state.inputs

    def after_layer(self, index: int, h: Tensor, state: Any) -> Tensor:
        state.sources.append(self._source(index + 1, h))
        slot = self.slot[index]
        if slot is None:  # no DA after this block (kxp): every input of the next block is X_i
            state.inputs = None
            return h
        aggregate = self.aggregates[slot]
        ways = aggregate([state.sources[j] for j in aggregate.inputs], h)
        state.inputs = (ways[0], ways[1], ways[2]) if aggregate.ways == len(WAYS) else None
        return ways[-1]

    def madds(self, t: int) -> int:
        return sum(aggregate.madds(t) for aggregate in self.aggregates)


def ffn_width(d_ffn: int, index: int, n_layers: int) -> int:
    """Eq. 9: layer ``index`` (0-based)'s FFN width, ``0.5 d_ffn`` at the first layer to ``1.5 d_ffn`` at the last."""
    i = index + 1
    return round(d_ffn * (0.5 * (n_layers - i) + 1.5 * (i - 1)) / (n_layers - 1))


def _variant(**section: Any) -> Callable[[VariantContext], dict[str, Any]]:
    return section_variant("muddformer", "MUDDFormer", STACK_MCAN.format(label="MUDDFormer"), **section)


class _MUDDFormerMethod(MethodBase):
    name = "muddformer"
    config_class = MUDDFormerConfig
    variants = {
        "muddformer": NamedVariant("MUDDFormer: per-position dense aggregates of every earlier block's output, one "
                                   "each for the query, key, value and residual inputs of the next block, started as "
                                   "the plain model (MUDDFormer Sec. 2, Eq. 3-8, Sec. 3)", _variant()),
        "muddformer_static": NamedVariant("MUDDFormer's multiway static dense connections: one learned weight per "
                                          "(way, earlier block), no per-position part (Table 5's '+Multiway Static "
                                          "Dense'; single-way it is DenseFormer)", _variant(dynamic=False)),
        "muddformer_2x2": NamedVariant("MUDDFormer-2x2: dilation 2, a DA after every second block, the paper's "
                                       "cheaper trade-off (MUDDFormer Sec. 3.6, Fig. 9)",
                                       _variant(dilation=2, period=2)),
    }
    examples = (CompositionExample("muddformer", {"dilation": 1, "period": 1}),)
    # validate, and check_core_self_attention: multiway MUDDFormer hands the core self-attention its own
    # query/key/value inputs
    conflicts = (Conflict("hyper_connections", "muddformer and hyper_connections"),
                 Conflict("denseformer", "muddformer and denseformer"),
                 Conflict("lightweight", "lightweight.attention"), Conflict("conv_branch", "conv_branch"))

    def validate(self, section: MUDDFormerConfig, cfg: ComposedConfig) -> None:
        """Checked on the config, so the refusal does not depend on the order the methods customise in."""
        section.validate(cfg)
        for other, what in (("denseformer", "its depth-weighted averages"),
                            ("hyper_connections", "n residual streams")):
            if getattr(cfg, other) is not None:
                raise ConfigError(f"muddformer and {other} both replace the stack's depth connection (dense "
                                  f"aggregates vs {what}); the two cannot be combined (remove one section)")

    def customize(self, section: MUDDFormerConfig, cfg: ComposedConfig, components: Components) -> None:
        if components.depth_connection != components.default_depth_connection:
            raise ConfigError("muddformer installs the stack's depth connection (its DA modules), but another "
                              "method already did; the two cannot be combined (remove one section)")

        def layers(side: StackSide) -> int:
            return cfg.enc_layers if side == "encoder" else cfg.dec_layers

        components.depth_connection = lambda side: MultiwayDenseConnections(layers(side), cfg.d_model, section,
                                                                            cfg.layer_norm_eps)
        if section.ffn_reallocation:
            def ffn(side: StackSide, index: int) -> nn.Module:
                return FeedForward(cfg.d_model, ffn_width(cfg.d_ffn, index, layers(side)),
                                   activation=cfg.activation, act_dropout=cfg.act_dropout, bias=cfg.bias)

            components.ffn = ffn


METHOD = _MUDDFormerMethod()
