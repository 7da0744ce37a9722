"""Predictive Attention Transformer (PA-Transformer): a CNN predicts each layer's attention logits from the previous
layer's. Every choice below is argued, with the tests that hold it, in docs/methods/predictive.md.

Paper map:

* **Eq. 4**, ``A = softmax(alpha * CNN(A_prev_logits) + (1 - alpha) * Attention(X)_logits)``: :class:`PredictiveMixer`,
  a logit mixer in encoder layers 1..N-1 (Sec. 3.3: "we do not apply convolution-based attention prediction to the
  first transformer block"). The mixed logits are what the next layer receives: the chain of Fig. 1(b).
* **The CNN** (Sec. 3.3): ``conv_layers`` K -> K convolutions of ``kernel_size`` x ``kernel_size``, heads as
  channels, a ReLU after each; 1 layer (Sec. 4.1.1), 0 is Table 5's Res-Transformer. ``alpha`` = 0.1 (Sec. 4.1.1),
  random initialisation (Sec. 4.1.2). The logits include the relative-position bias (Eq. 2/3).

Readings where the paper leaves room: padded rows and columns and non-finite values are zeroed before *every*
convolution, the mixer runs in fp32 (the CNN op by op and its hidden cells: :mod:`interlayer.kernels.predictive_cnn`);
the causal kernel of a language model (``kernel``: current and earlier query rows only, the masked triangle zeroed,
the rows kept in the decoding cache); ``beta``: Evolving Attention (Wang et al., ICML 2021), with
``activation="leaky_relu"`` its code's activation; ``alpha_warmup_steps``: alpha (and beta) ramp from 0 with the
optimiser steps; ``init="dirac"``; ``share_conv``; a decoder only when it attends both ways
(``causal_decoder=False``). The prediction and the layer's own logits are kept in ``AttentionIntermediates.extras``
(``predicted``, ``self``): the columns of PA Fig. 8.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Optional, Union

import torch
from torch import Tensor, nn

from ..core.attention import LogitMixer, MixerContext
from ..core.components import Components, StackSide
from ..errors import ConfigError
from ..kernels import predictive_cnn, predictive_maps
from ..kernels.map_conv import VisibleCells, map_conv_relu
from ..kernels.precision import fp32_island
from .base import (
    MAX_MULTIPLIER,
    ComposedConfig,
    CompositionExample,
    MethodBase,
    NamedVariant,
    VariantContext,
    check_at_most,
    stack_sides,
)
from .conv_branch import attention_heads, check_kernel


@dataclass
class PredictiveConfig:
    """Eq. 4 mixing weight and the prediction CNN (PA Sec. 3.3, Table 5)."""

    # the options that size the saved tensors in every model (checkpoint.py); kernel_size does only with conv_layers
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"conv_layers"})
    alpha: float = 0.1  # Sec. 4.1.1: 0.1 on SST, Yelp and IWSLT'14 De-En
    conv_layers: int = 1  # Sec. 4.1.1 / Table 5: one 3x3 layer; 0 = Res-Transformer
    kernel_size: int = 3  # Sec. 3.3: 3 x 3 kernels
    share_conv: bool = False  # False: one prediction module per block (Fig. 1(b)); True: one for all layers
    init: Literal["random", "dirac"] = "random"  # Sec. 4.1.2: "initialized randomly"
    beta: Optional[float] = None  # None: Eq. 4; a number: Evolving Attention's residual weight (docs page)
    # > 0: alpha (and beta) ramp linearly from 0 over this many optimiser steps, so step 0 is the model without
    # prediction (an imported checkpoint exactly; docs page, "Warm-up"); 0: the paper's constant alpha
    alpha_warmup_steps: int = 0
    # None: "causal" in a causal language model, "symmetric" (the paper's centred kernel) elsewhere (docs page)
    kernel: Optional[Literal["symmetric", "causal"]] = None
    # after every convolution: "relu", PA Sec. 3.3; "leaky_relu" (slope 0.01), Evolving Attention's code (docs page)
    activation: Literal["relu", "leaky_relu"] = "relu"
    # the encoder (Sec. 4.1.1); a decoder that attends both ways (causal_decoder=False) may take it too (docs page)
    sides: list[StackSide] = field(default_factory=lambda: ["encoder"])

    def resolved_kernel(self, cfg: ComposedConfig) -> str:
        if self.kernel is not None:
            return self.kernel
        return "causal" if cfg.arch == "causal_lm" else "symmetric"

    def validate(self, cfg: ComposedConfig) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"predictive.alpha={self.alpha} must lie in [0, 1] (PA Eq. 4; 0 is the plain "
                              "Transformer, 1 uses the CNN prediction alone)")
        if self.alpha_warmup_steps < 0:
            raise ConfigError(f"predictive.alpha_warmup_steps={self.alpha_warmup_steps} must be >= 0 (0: alpha from "
                              "the first step, as in the paper; N: alpha ramps from 0 over N optimiser steps)")
        if self.conv_layers < 0:
            raise ConfigError(f"predictive.conv_layers={self.conv_layers} must be >= 0 (0 is the Res-Transformer "
                              "of PA Table 5, 1 the paper's default)")
        check_at_most("predictive.conv_layers", self.conv_layers, MAX_MULTIPLIER,
                      "every layer runs that many convolutions over its attention maps (the paper's default: 1)")
        if self.beta is not None and not 0.0 <= self.beta <= 1.0:
            raise ConfigError(f"predictive.beta={self.beta} must lie in [0, 1] (Evolving Attention's weight of the "
                              "previous layer's map in the CNN's input), or be null for PA's Eq. 4")
        check_kernel("predictive.kernel_size", self.kernel_size, cfg.max_positions)
        if cfg.arch == "causal_lm" and self.kernel == "symmetric":
            raise ConfigError("predictive.kernel='symmetric' cannot be used in a causal language model: the centred "
                              f"{self.kernel_size}x{self.kernel_size} kernel reads the next query's row of the "
                              "attention map, so a position would see the future; use predictive.kernel='causal' "
                              "(the default in a causal model)")
        causal = ("a 3x3 kernel over a causal attention map mixes future keys' and future queries' logits into "
                  "visible positions (the PA paper uses the encoder only); a decoder built with causal_decoder=False "
                  "may take 'decoder'")
        stack_sides("predictive", self.sides, cfg, decoder_refused=causal if cfg.causal_decoder else None)
        if "decoder" in self.sides and cfg.dec_layers < 2:
            raise ConfigError(f"predictive.sides includes 'decoder', which needs dec_layers >= 2, got "
                              f"{cfg.dec_layers}: the first layer never predicts (PA Sec. 3.3)")
        if "encoder" in self.sides and cfg.enc_layers < 2:
            raise ConfigError(f"predictive needs enc_layers >= 2, got {cfg.enc_layers}: the first layer never "
                              "predicts (PA Sec. 3.3), so with one layer the method would do nothing")


class PredictiveMixer(LogitMixer):
    """PA Eq. 4 as a core logit mixer: ``alpha * CNN(A_prev) + (1 - alpha) * A_cur`` with heads as channels.

    With ``beta`` set, Evolving Attention's form instead: ``alpha * CNN(A_in) + (1 - alpha) * A_in`` with
    ``A_in = (1 - beta) * A_cur + beta * A_prev`` (docs page). ``causal_kernel``: the kernel reads the current
    and earlier query rows only (docs page, "Causal prediction"). ``warmup_steps`` > 0: both weights ramp
    from 0 with the optimiser steps counted in the ``steps_done`` buffer (docs page, "Warm-up").
    """

    def __init__(self, heads: int, *, alpha: float, conv_layers: int, kernel_size: int, init: str,
                 beta: Optional[float] = None, causal_kernel: bool = False, warmup_steps: int = 0,
                 negative_slope: float = 0.0, fast: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.fast = fast
        self.negative_slope = negative_slope
        self.alpha = alpha
        self.beta = beta
        self.causal_kernel = causal_kernel
        self.warmup_steps = warmup_steps
        if warmup_steps:
            self.register_buffer("steps_done", torch.zeros(()))
        self.convs = nn.ModuleList(nn.Conv2d(heads, heads, kernel_size,
                                             padding=0 if causal_kernel else kernel_size // 2)
                                   for _ in range(conv_layers))
        if init == "dirac":
            for conv in self.convs:
                nn.init.dirac_(conv.weight)
                nn.init.zeros_(conv.bias)

    def predict(self, prev_logits: Tensor, key_padding_mask: Optional[Tensor],
                context: MixerContext = MixerContext()) -> Tensor:
        """``CNN(A_prev)`` in fp32: non-finite entries zeroed first, the hidden cells
        (:func:`~interlayer.kernels.predictive_cnn.hidden_cells`) zeroed before the first convolution and after every
        one (so also in the returned prediction).

        Two paths compute it, equal to rounding (``tests/test_fast_paths.py``, forward and gradients):
        without a cache (training, evaluation, a prompt) each convolution is :func:`map_conv_relu`, whose backward
        is two small convolutions instead of the library's generic one; with a cache (incremental decoding, one
        row at a time, where the input rows kept from earlier steps are needed) the reference path
        :meth:`predict_reference` runs. ``fast=False`` on the mixer forces the reference path everywhere.
        """
        if not self.fast or context.cache is not None:
            return self.predict_reference(prev_logits, key_padding_mask, context)
        x = prev_logits.float()
        hidden = predictive_cnn.hidden_cells(x.shape, key_padding_mask, context.causal, x.device, context.q_offset)
        keep = None if hidden is None else (~hidden).to(x.dtype)
        x = VisibleCells.apply(x, keep)
        for conv in self.convs:
            x = map_conv_relu(x, conv.weight.float(), conv.bias.float(), keep,
                              predictive_cnn.conv_padding(conv.kernel_size, self.causal_kernel),
                              self.negative_slope)[0]
        return x

    def predict_reference(self, prev_logits: Tensor, key_padding_mask: Optional[Tensor],
                          context: MixerContext = MixerContext()) -> Tensor:
        """The CNN as the docs page states it, op by op with the library convolution
        (:func:`interlayer.kernels.predictive_cnn.reference`; in incremental decoding the causal kernel's rows above
        the new ones come from the cache's ``state``): the definition the fast path of :meth:`predict` is tested
        against."""
        hidden = predictive_cnn.hidden_cells(prev_logits.shape, key_padding_mask, context.causal, prev_logits.device,
                                             context.q_offset)
        return predictive_cnn.reference(prev_logits, [conv.weight for conv in self.convs],
                                        [conv.bias for conv in self.convs], self.negative_slope, self.causal_kernel,
                                        hidden, None if context.cache is None else context.cache.state)

    def forward(self, logits: Tensor, prev_logits: Tensor, key_padding_mask: Optional[Tensor] = None,
                context: MixerContext = MixerContext()) -> tuple[Tensor, dict[str, Tensor]]:
        if prev_logits.shape != logits.shape or logits.shape[1] != self.heads:
            raise ValueError(f"predictive attention mixes maps of {self.heads} heads: got current logits "
                             f"{tuple(logits.shape)} and previous {tuple(prev_logits.shape)}")
        if context.causal and not self.causal_kernel:
            raise ValueError("a centred prediction kernel over causal attention would read later tokens; the "
                             "config's predictive.kernel must be 'causal' in a causal model")
        alpha, beta = self._weights()
        with fp32_island(logits.device):
            source, residual = prev_logits, logits.float()
            if beta is not None:  # None or not is a config constant, fixed at build time
                source = residual = (1.0 - beta) * residual + beta * prev_logits.float()
            predicted = self.predict(source, key_padding_mask, context)
            # alpha * predicted + (1 - alpha) * residual in one pass (and two in the backward)
            mixed = torch.lerp(residual, predicted, alpha)
        return mixed.to(logits.dtype), {"predicted": predicted.to(logits.dtype), "self": logits}

    def fuses(self, prev_logits: Tensor, v: Tensor, causal: bool) -> bool:
        """Whether :meth:`fused_attention` takes this case (:class:`~interlayer.core.attention.LogitMixer`'s
        question to its mixers): the GPU kernels of
        :mod:`interlayer.kernels.predictive_maps` run here (the one dispatch rule), the convolution's causality is
        the attention's (the kernels tie them), and ``fast`` is on. Elsewhere the core runs :meth:`forward` and its
        own softmax: the reference path, and on CPUs the registered convolution operators below."""
        return (self.fast and causal == self.causal_kernel
                and predictive_maps.runs_kernel(prev_logits, v, [conv.weight for conv in self.convs]))

    def fused_attention(self, q: Tensor, k: Tensor, scale: float, bias: Optional[Tensor], prev_logits: Tensor,
                        v: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> tuple[Tensor, Tensor]:
        """The logits ``scale q k^T (+ bias)``, Eq. 4 and the attention over its result in one op
        (:func:`~interlayer.kernels.predictive_maps.predictive_attention`): ``(softmax(M masked) @ v, M)``, the mixed
        logits ``M`` handed to the next layer. Without a bias the op makes the logits itself, a causal map's on and
        below the diagonal only. The weights travel as 0-dim device tensors, so the warm-up ramp changes them
        without a host round trip."""
        if prev_logits.shape[1] != self.heads or prev_logits.shape[-2:] != (q.shape[-2], k.shape[-2]):
            raise ValueError(f"predictive attention mixes maps of {self.heads} heads: got {q.shape[1]} heads of "
                             f"{q.shape[-2]} x {k.shape[-2]} logits and previous {tuple(prev_logits.shape)}")
        alpha, beta = self._weights()
        args = ([conv.weight for conv in self.convs], [conv.bias for conv in self.convs],
                _device_scalar(alpha, q.device), None if beta is None else _device_scalar(beta, q.device),
                self.negative_slope, causal, key_padding_mask)
        if bias is None:
            return predictive_maps.predictive_attention_qk(q, k, scale, prev_logits, v, *args)
        logits = torch.matmul(q * scale, k.transpose(-2, -1)) + bias
        return predictive_maps.predictive_attention(logits, prev_logits, v, *args)

    def optimizer_step_done(self) -> None:
        """One more optimiser step (the training engine calls this after each): advances the warm-up."""
        if self.warmup_steps:
            self.steps_done.add_(1.0)

    def _weights(self) -> tuple[Union[float, Tensor], Optional[Union[float, Tensor]]]:
        """``(alpha, beta)`` now: the configured numbers, or during the warm-up tensors scaled by ``min(1, t/N)``."""
        if not self.warmup_steps:  # a config constant, fixed at build time
            return self.alpha, self.beta
        ramp = (self.steps_done / self.warmup_steps).clamp(max=1.0)
        return self.alpha * ramp, None if self.beta is None else self.beta * ramp

    def madds(self, t_q: int, t_k: int) -> int:
        return sum(t_q * t_k * conv.weight.numel() for conv in self.convs)


def _device_scalar(value: Union[float, Tensor], device: torch.device) -> Tensor:
    """A 0-dim fp32 tensor on ``device``: a fill kernel for a number (no host-to-device copy to wait for)."""
    if isinstance(value, Tensor):
        return value.to(device=device, dtype=torch.float32).reshape(())
    return torch.full((), float(value), device=device, dtype=torch.float32)


# nn.LeakyReLU's default, which Evolving Attention's ``att_conv`` uses (docs page)
LEAKY_SLOPE = 0.01


def make_mixer(section: PredictiveConfig, heads: int, cfg: ComposedConfig) -> PredictiveMixer:
    return PredictiveMixer(heads, alpha=section.alpha, conv_layers=section.conv_layers,
                           kernel_size=section.kernel_size, init=section.init, beta=section.beta,
                           causal_kernel=section.resolved_kernel(cfg) == "causal",
                           warmup_steps=section.alpha_warmup_steps,
                           negative_slope=LEAKY_SLOPE if section.activation == "leaky_relu" else 0.0)


def _variant(conv_layers: int, conv_branch: bool) -> Callable[[VariantContext], dict[str, Any]]:
    """``conv_layers`` convolutions per prediction module, with the alpha the paper sets for the task where it sets
    one (``VariantContext.settings_of``; PA's by dataset are in :mod:`interlayer.papers.predictive`), on the plain
    block or on the Conv-Transformer's (``conv_branch``)."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        ctx.transformer_fields("PA")
        out: dict[str, Any] = {**ctx.settings_of("predictive"), "predictive.conv_layers": conv_layers}
        if conv_branch:
            out["conv_branch"] = {}
        return out

    return overrides


class _PredictiveMethod(MethodBase):
    """Nothing to tie or add after the build: the mixers are installed in the attention modules at build time."""

    name = "predictive"
    config_class = PredictiveConfig
    variants = {
        "pa": NamedVariant("PA-Transformer: one 3x3 conv per prediction module, alpha as the paper sets it for the "
                           "task's data (PA Eq. 4; 0.1 by default, Sec. 4.1.1)", _variant(1, conv_branch=False)),
        "pa_res": NamedVariant("Res-Transformer: attention maps added without the CNN (PA Table 5, conv_layers=0)",
                               _variant(0, conv_branch=False)),
        "pa_conv": NamedVariant("PA-Conv-Transformer: the Conv-Transformer plus attention prediction (PA Sec. 3.5, "
                                "Table 1)", _variant(1, conv_branch=True)),
    }
    examples = (CompositionExample("predictive", {"alpha": 0.5}),)
    lm_examples = {"predictive": {"conv_layers": 2, "alpha": 0.5}}

    def exact_start(self, section: PredictiveConfig) -> Optional[str]:
        return "alpha_warmup_steps"

    def customize(self, section: PredictiveConfig, cfg: ComposedConfig, components: Components) -> None:
        previous = components.logit_mixer
        heads = attention_heads(cfg)
        shared = make_mixer(section, heads, cfg) if section.share_conv else None

        def factory(side: str, index: int) -> Optional[nn.Module]:
            inherited = previous(side, index)
            if side not in section.sides or index == 0:
                return inherited
            if inherited is not None:
                raise ConfigError(f"predictive and another method both rewrite the attention logits of {side} "
                                  f"layer {index}; turn one of them off")
            return shared if shared is not None else make_mixer(section, heads, cfg)

        components.logit_mixer = factory


METHOD = _PredictiveMethod()
