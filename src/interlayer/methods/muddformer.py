"""MUDDFormer (Xiao, Meng, Li & Yuan, ICML 2025, arXiv 2502.12170): after every block, depth-wise aggregates (DA) of the
embeddings and every earlier block's output, weighted per position from the block's output, one aggregate for each
input the next block reads (its query, key, value and residual). Every reading below is argued, with its tests, in
docs/methods/muddformer.md.

Paper map (arXiv v2 numbers; App. B is the paper's pseudo-code):

* **Dense connections** (Eq. 3): ``X_bar_i = DA_i(X_0..X_i)`` over the raw block outputs; **static** (Eq. 4,
  learned scalars) is DenseFormer exactly; **dynamic** (Eq. 5-6): ``A_i(X_i) = GELU(RMSNorm(X_i) W1) W2 + a_i`` per
  position: :class:`DenseAggregate`.
* **Multiway** (Eq. 7-8): four DAs per block, ``MHA(LN(X^Q), LN(X^K), LN(X^V)) + X^R``, the output ``X^R_L``:
  :class:`MultiwayDenseConnections`, the stack's depth connection; the query/key/value ways reach the
  self-attention through the core's ``attention_inputs`` hook.
* **Shapes** (App. B): hidden width ``K = C (i+1)``; **initialisation** (Sec. 3): ``W1 ~ N(0, 1/D)``, ``W2 = 0``,
  ``a_ii = 1``, so the model starts as the plain Transformer exactly.
* **Options**: parameter re-allocation (Eq. 9, ``ffn_reallocation``), PrePostDANorm (Eq. 10, ``prepost_norm``),
  MUDDFormer-kxp (Sec. 3.6, ``dilation``, ``period``).

Readings where the paper leaves room: the weight generator's RMSNorm has no scale; ``N(0, 1/D)`` is a variance;
one pre-norm serves the query, key and value ways; each way has its own post-norm; the aggregation is element-wise
in the stream's dtype (not a product, which would round the residual and copy the sources), uncounted in MAdds;
every stack has its own DAs, post-LN blocks are aggregated alike, Multi-Pass composes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.components import Components, StackSide
from ..core.feedforward import FeedForward
from ..core.layers import DepthConnection
from ..errors import ConfigError
from .base import (
    STACK_REFUSAL,
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

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

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
    return section_variant("muddformer", "MUDDFormer", STACK_REFUSAL.format(label="MUDDFormer"), **section)


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
    lm_examples = {"muddformer": {}}
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
