"""Predictive Attention Transformer (PA-Transformer): a CNN predicts each layer's attention logits from the last's.

PA Sec. 3.3: the K attention maps of the previous block form an ``N x N`` image with K channels; "several
2D-convolutional layers with 3 x 3 kernels" with K output channels and "a ReLU activation after each
2D-convolutional layer" predict the next block's maps, which are mixed with the block's own logits (Eq. 4)::

    A = softmax(alpha * CNN(A_prev_logits) + (1 - alpha) * Attention(X)_logits)

"We do not apply convolution-based attention prediction to the first transformer block", so the mixer sits in
encoder layers 1..N-1. The mixed logits are what the next block receives (Fig. 1(b): a *chain* of prediction
modules), which the core does by handing each layer the logits its attention returns.

Choices where the paper leaves room (each documented on its config field):

* ``conv_layers`` (n): 1 by default (Sec. 4.1.1 "We use one convolutional layer in each prediction module";
  Table 5). n = 0 is Table 5's Res-Transformer: the CNN is the identity, ``A = softmax(a A_prev + (1-a) A)``.
* ``alpha``: 0.1, the value of Sec. 4.1.1 for SST, Yelp and IWSLT'14 (0.5 for SNLI, 0.2 for GLUE in App. B.2.2,
  0.01 on CIFAR, 0.5 on ImageNet). ``alpha = 0`` is exactly the plain Transformer (Sec. 5), ``alpha = 1`` uses the
  prediction alone.
* Convolution weights are per layer ("one prediction module per block", Fig. 1(b)); ``share_conv=True`` ties one
  module across all layers instead (a cheap ablation, not from the paper).
* Initialisation: "the additional parameters are initialized randomly" (Sec. 4.1.2), i.e. PyTorch's default conv
  init (``init="random"``). ``init="dirac"`` starts every conv as the identity per head with zero bias, so at
  step 0 the prediction is ``ReLU(A_prev)`` -- useful when adding PA to a trained checkpoint (an option, not the
  paper's). It does not start *at* the checkpoint: Eq. 4 then gives ``alpha ReLU(A_prev) + (1 - alpha) A``, which
  differs from ``A`` whenever ``alpha > 0`` (and no initialisation of the CNN helps: ``CNN = 0`` still scales the
  logits by ``1 - alpha``, a softmax temperature).
* Warm-up (``alpha_warmup_steps`` N, not in the paper): ``alpha_t = alpha * min(1, t / N)`` after ``t`` optimiser
  steps, so the model before the first update is exactly the model without prediction (an imported checkpoint
  computes what it computed, tested at 1e-6), PA grows in as the CNN trains, and from step N on Eq. 4 holds with
  the configured alpha. Chosen over a learned gate started at 0 (ReZero-like) because it leaves Eq. 4 and its alpha
  as the paper states them once the ramp is over, and over a fixed small alpha because the start is exact. ``t``
  is a buffer of every mixer (``steps_done``, a float on the model's device), advanced by the training engine
  after each optimiser step (:meth:`PredictiveMixer.optimizer_step_done`: an in-place add, no host sync in
  training or in ``forward``), saved with the weights, so a resumed run, a checkpoint and ``best/`` carry on from
  where they were. With ``beta`` set both weights ramp (``beta_t = beta * min(1, t / N)``), so EA starts exactly
  too. Outside the engine (a bare model, evaluation) ``t`` stays where it is: 0 for a freshly built model.
* Relative positions: the logits handed around include the relative-position bias (PA Eq. 2/3 put ``R`` inside
  the logits), so the CNN sees and predicts biased logits. ``qk_dim`` changes nothing here: the mixer only sees
  ``(B, heads, T, T)`` maps.
* Padding: the core's logits are unmasked, so padded rows and columns of ``A_prev`` (and any non-finite value)
  are zeroed before the first convolution, and the padded rows and columns again after every convolution
  (``PredictiveMixer.hidden_cells``); otherwise a 3 x 3 kernel would carry padded keys' logits, or with two or
  more layers the ReLU(bias) the previous convolution left in padded cells, into real positions. A sentence
  then gets the same prediction alone as padded in any batch. The core masks after the mixing. The mixer runs in
  fp32 (autocast off) and casts back, because the convolution sums 9K logits and bf16 keeps only about 3
  significant digits of each.
* ``beta``: None by default, which is Eq. 4 above, exactly. A number in [0, 1] switches to the published
  successor of this paper, Evolving Attention (Wang et al., "Evolving Attention with Residual Convolutions",
  ICML 2021; its code's ``EAAugmentedConv1d``, where the two weights are called ``beta`` and ``alpha`` as here).
  It moves the previous layer's map from the CNN's input alone into a residual connection *before* the CNN,
  and the CNN and the final mix both read that residual map::

      A_in = (1 - beta) * Attention(X)_logits + beta * A_prev_logits
      A    = softmax(alpha * CNN(A_in) + (1 - alpha) * A_in)

  Read against Eq. 4: the CNN's argument ``A_pre_logits`` becomes ``A_in``, and so does the second term
  ``Attention(X)_logits``. No value of ``beta`` gives Eq. 4 back (``beta = 0`` is Evolving Attention without
  its residual, ``alpha * CNN(A_self) + (1 - alpha) * A_self``; ``beta = 1`` ignores the layer's own logits),
  which is why "off" is None and not 0. ``A_prev`` is the previous layer's output logits, as in Eq. 4's chain
  and in ``EAAugmentedConv1d``, which returns the mixed logits to the next block. Padding and non-finite
  values are zeroed in the CNN's input exactly as for ``A_prev`` in Eq. 4; the residual term keeps ``A_in``
  as it is, as Eq. 4 keeps ``Attention(X)_logits``.
* ``activation``: ``"relu"`` after every convolution (PA Sec. 3.3, "a ReLU activation after each
  2D-convolutional layer"), the default also with ``beta``. ``"leaky_relu"`` is what Evolving Attention's code
  puts after its map convolution (``att_conv``: ``nn.LeakyReLU()``, slope 0.01), so negative predicted logits
  pass scaled by 0.01 instead of being zeroed; with ``beta`` set and ``activation="leaky_relu"`` the CNN is that
  code's. Hidden cells are zeroed after the activation either way.
* Decoder of an encoder-decoder: rejected (``sides`` may only be ``["encoder"]``). A centred 3 x 3 kernel over a
  causal map mixes in logits of future keys at ``(i, i+1)`` into the visible ``(i, i)``, and of future queries
  into earlier rows; the paper applies PA to encoders only (Sec. 4.1.1 "We only apply PA-Transformer
  architecture to the encoder"). A decoder built with ``causal_decoder=False`` attends both ways like an
  encoder, so there ``sides`` may include ``"decoder"`` (its self-attention; cross-attention maps are ``Tq x Tk``
  between two different sequences and never predicted): MCAN's image stack.
* Causal language model (``arch="causal_lm"``; not in the paper): ``kernel="causal"``, the default there. Along
  the query axis the kernel sees only the current and the ``k - 1`` earlier rows (padding ``k - 1`` rows above,
  none below); along the key axis it stays centred. Before every convolution the masked upper triangle (key
  after query) is zeroed, with the padding, so neither a later key nor a later query reaches a position: row
  ``i`` of every convolution's output depends on rows ``<= i`` of its input, whose non-zero cells are logits of
  tokens ``<= i``. The zeroed triangle is also what makes incremental decoding exact: a convolution at the new
  row reads the ``k - 1`` rows before it, which the layer's cache keeps (``KVCache.state["predictive_rows{n}"]``,
  one ``(B, K, k-1, T)`` block per convolution, its columns growing with the keys), and the columns that do not
  exist yet are the zeros the full forward pass has there. The centred kernel (``kernel="symmetric"``) is refused
  in a causal model. A causal kernel in an encoder is allowed (the prediction then reads earlier rows only; there
  is no triangle to zero, since the encoder attends both ways).

The prediction and the layer's own logits are kept in ``AttentionIntermediates.extras`` under ``predicted`` and
``self`` (the combined map is ``logits``), the three columns of PA Fig. 8.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.attention import KVCache, MixerContext
from ..core.components import Components, StackSide
from ..errors import ConfigError
from ..kernels import predictive_maps
from ..kernels.map_conv import VisibleCells, map_conv_relu
from ..kernels.precision import fp32_island
from .base import ComposedConfig, CompositionExample, MethodBase, NamedVariant, VariantContext, stack_sides
from .conv_branch import attention_heads, check_kernel


@dataclass
class PredictiveConfig:
    """Eq. 4 mixing weight and the prediction CNN (PA Sec. 3.3, Table 5)."""

    UNMEASURED_FIELDS: ClassVar[tuple[str, ...]] = ("alpha_warmup_steps",)  # a schedule, no size (checkpoint.py)
    alpha: float = 0.1  # Sec. 4.1.1: 0.1 on SST, Yelp and IWSLT'14 De-En
    conv_layers: int = 1  # Sec. 4.1.1 / Table 5: one 3x3 layer; 0 = Res-Transformer
    kernel_size: int = 3  # Sec. 3.3: 3 x 3 kernels
    share_conv: bool = False  # False: one prediction module per block (Fig. 1(b)); True: one for all layers
    init: Literal["random", "dirac"] = "random"  # Sec. 4.1.2: "initialized randomly"
    beta: Optional[float] = None  # None: Eq. 4; a number: Evolving Attention's residual weight (module doc)
    # > 0: alpha (and beta) ramp linearly from 0 over this many optimiser steps, so step 0 is the model without
    # prediction (an imported checkpoint exactly; module doc "Warm-up"); 0: the paper's constant alpha
    alpha_warmup_steps: int = 0
    # None: "causal" in a causal language model, "symmetric" (the paper's centred kernel) elsewhere (module doc)
    kernel: Optional[Literal["symmetric", "causal"]] = None
    # after every convolution: "relu", PA Sec. 3.3; "leaky_relu" (slope 0.01), Evolving Attention's code (module doc)
    activation: Literal["relu", "leaky_relu"] = "relu"
    # the encoder (Sec. 4.1.1); a decoder that attends both ways (causal_decoder=False) may take it too (module doc)
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
        if self.beta is not None and not 0.0 <= self.beta <= 1.0:
            raise ConfigError(f"predictive.beta={self.beta} must lie in [0, 1] (Evolving Attention's weight of the "
                              "previous layer's map in the CNN's input), or be null for PA's Eq. 4")
        check_kernel("predictive.kernel_size", self.kernel_size)
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


class PredictiveMixer(nn.Module):
    """PA Eq. 4 as a core logit mixer: ``alpha * CNN(A_prev) + (1 - alpha) * A_cur`` with heads as channels.

    With ``beta`` set, Evolving Attention's form instead: ``alpha * CNN(A_in) + (1 - alpha) * A_in`` with
    ``A_in = (1 - beta) * A_cur + beta * A_prev`` (module doc). ``causal_kernel``: the kernel reads the current
    and earlier query rows only (module doc, "Causal language model"). ``warmup_steps`` > 0: both weights ramp
    from 0 with the optimiser steps counted in the ``steps_done`` buffer (module doc, "Warm-up").
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

    @staticmethod
    def hidden_cells(maps: Tensor, key_padding_mask: Optional[Tensor], context: MixerContext = MixerContext()
                     ) -> Optional[Tensor]:
        """Boolean ``(B|1, 1, Tq, Tk)`` mask of the map cells the CNN must see as zero, or None when there are none.

        The one place that decides which cells are off limits: the rows and columns of padded tokens, and with
        causal attention the upper triangle (a key after its query). A cell outside it must hold zero before
        *every* convolution, not just the first: after a convolution a padded cell holds ``ReLU(bias + spill from
        real neighbours)``, and the next convolution would carry that into real cells, so a sentence's outputs
        would depend on the padding of its batch (Table 5's 2- and 3-layer rows), and a causal cell would carry a
        later token's logit. Zeroed cells are what a 3 x 3 kernel reads beyond the edge of an unpadded map, so a
        padded sentence gives the same prediction as the sentence alone. The maps' rows are the queries at
        positions ``context.q_offset ..`` (incremental decoding keeps earlier rows in the cache) and their columns
        every key so far.
        """
        t_q, t_k = maps.shape[-2:]
        if t_k != context.q_offset + t_q:
            raise ValueError(f"predictive attention needs self-attention maps (keys = earlier and current "
                             f"queries), got {t_q} query rows from position {context.q_offset} over {t_k} keys")
        hidden = None
        if key_padding_mask is not None:
            rows = key_padding_mask[:, context.q_offset:][:, None, :, None]
            hidden = rows | key_padding_mask[:, None, None, :]
        if context.causal:
            i = torch.arange(context.q_offset, t_k, device=maps.device)[:, None]
            later = (torch.arange(t_k, device=maps.device)[None, :] > i)[None, None]
            hidden = later if hidden is None else hidden | later
        return hidden

    def predict(self, prev_logits: Tensor, key_padding_mask: Optional[Tensor],
                context: MixerContext = MixerContext()) -> Tensor:
        """``CNN(A_prev)`` in fp32: non-finite entries zeroed first, :meth:`hidden_cells` zeroed before the first
        convolution and after every one (so also in the returned prediction).

        Two paths compute it, equal to rounding (``tests/test_predictive_fast.py``, forward and gradients):
        without a cache (training, evaluation, a prompt) each convolution is :func:`map_conv_relu`, whose backward
        is two small convolutions instead of the library's generic one; with a cache (incremental decoding, one
        row at a time, where the input rows kept from earlier steps are needed) the reference path
        :meth:`predict_reference` runs. ``fast=False`` on the mixer forces the reference path everywhere.
        """
        if not self.fast or context.cache is not None:
            return self.predict_reference(prev_logits, key_padding_mask, context)
        x = prev_logits.float()
        hidden = self.hidden_cells(x, key_padding_mask, context)
        keep = None if hidden is None else (~hidden).to(x.dtype)
        x = VisibleCells.apply(x, keep)
        for conv in self.convs:
            x = map_conv_relu(x, conv.weight.float(), conv.bias.float(), keep, self._padding(conv),
                              self.negative_slope)[0]
        return x

    def predict_reference(self, prev_logits: Tensor, key_padding_mask: Optional[Tensor],
                          context: MixerContext = MixerContext()) -> Tensor:
        """The CNN as the module doc states it, op by op with the library convolution (and the decoding cache):
        the definition the fast path of :meth:`predict` is tested against."""
        x = prev_logits.float()
        x = x.masked_fill(~torch.isfinite(x), 0.0)
        hidden = self.hidden_cells(x, key_padding_mask, context)
        x = _zero(x, hidden)
        for n, conv in enumerate(self.convs):
            x = _zero(F.leaky_relu(self._convolve(n, conv, x, context.cache), self.negative_slope), hidden)
        return x

    def _padding(self, conv: nn.Conv2d) -> list[int]:
        """``(left, right, top, bottom)`` zeros around the map: centred, or the causal kernel's ``k - 1`` rows
        above and none below (module doc, "Causal language model")."""
        k_rows, k_cols = conv.kernel_size
        if self.causal_kernel:
            return [k_cols // 2, k_cols // 2, k_rows - 1, 0]
        return [k_cols // 2, k_cols // 2, k_rows // 2, k_rows // 2]

    def _convolve(self, n: int, conv: nn.Conv2d, x: Tensor, cache: Optional[KVCache]) -> Tensor:
        """Convolution ``n`` of the CNN. The causal kernel pads ``k - 1`` rows above the map and none below; in
        incremental decoding those rows are the last ``k - 1`` input rows of this convolution from earlier steps,
        kept in ``cache.state`` and widened with zeros to the new keys (the upper triangle they gain is zero)."""
        weight, bias = conv.weight.float(), conv.bias.float()
        if not self.causal_kernel:
            return F.conv2d(x, weight, bias, padding=conv.padding)
        k_rows, k_cols = conv.kernel_size
        if cache is None:
            return F.conv2d(F.pad(x, (k_cols // 2, k_cols // 2, k_rows - 1, 0)), weight, bias)
        name = f"predictive_rows{n}"
        earlier = cache.state.get(name)
        if earlier is None:
            earlier = x.new_zeros(x.shape[0], x.shape[1], k_rows - 1, x.shape[3])
        rows = torch.cat([F.pad(earlier, (0, x.shape[3] - earlier.shape[3])), x], dim=2)
        cache.state[name] = rows[:, :, rows.shape[2] - (k_rows - 1):]
        return F.conv2d(F.pad(rows, (k_cols // 2, k_cols // 2, 0, 0)), weight, bias)

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
        """Whether :meth:`fused_attention` takes this case: the GPU kernels of
        :mod:`interlayer.kernels.predictive_maps` run here (the one dispatch rule), the convolution's causality is
        the attention's (the kernels tie them), and ``fast`` is on. Elsewhere the core runs :meth:`forward` and its
        own softmax: the reference path, and on CPUs the registered convolution operators below."""
        return (self.fast and causal == self.causal_kernel
                and predictive_maps.runs_kernel(prev_logits, v, [conv.weight for conv in self.convs]))

    def fused_attention(self, logits: Tensor, prev_logits: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                        causal: bool) -> tuple[Tensor, Tensor]:
        """Eq. 4 and the attention over its result in one op (:func:`~interlayer.kernels.predictive_maps.
        predictive_attention`): ``(softmax(M masked) @ v, M)``, the mixed logits ``M`` handed to the next layer.
        The weights travel as 0-dim device tensors, so the warm-up ramp changes them without a host round trip."""
        if prev_logits.shape != logits.shape or logits.shape[1] != self.heads:
            raise ValueError(f"predictive attention mixes maps of {self.heads} heads: got current logits "
                             f"{tuple(logits.shape)} and previous {tuple(prev_logits.shape)}")
        alpha, beta = self._weights()
        return predictive_maps.predictive_attention(
            logits, prev_logits, v, [conv.weight for conv in self.convs], [conv.bias for conv in self.convs],
            _device_scalar(alpha, logits.device), None if beta is None else _device_scalar(beta, logits.device),
            self.negative_slope, causal, key_padding_mask)

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


def _zero(maps: Tensor, cells: Optional[Tensor]) -> Tensor:
    return maps if cells is None else maps.masked_fill(cells, 0.0)


# nn.LeakyReLU's default, which Evolving Attention's ``att_conv`` uses (module doc)
LEAKY_SLOPE = 0.01


def make_mixer(section: PredictiveConfig, heads: int, cfg: ComposedConfig) -> PredictiveMixer:
    return PredictiveMixer(heads, alpha=section.alpha, conv_layers=section.conv_layers,
                           kernel_size=section.kernel_size, init=section.init, beta=section.beta,
                           causal_kernel=section.resolved_kernel(cfg) == "causal",
                           warmup_steps=section.alpha_warmup_steps,
                           negative_slope=LEAKY_SLOPE if section.activation == "leaky_relu" else 0.0)


# PA's alpha by task (Eq. 4): 0.1 for SST/Yelp/IWSLT (Sec. 4.1.1, the section's default), 0.5 for SNLI (Sec. 4.1.1;
# SICK is our stand-in), 0.2 for GLUE (App. B.2.2; MRPC), 0.01 for images (CIFAR, Sec. 4.2.1).
PA_ALPHA = {"sick": 0.5, "mrpc": 0.2, "fashion_mnist": 0.01}


def _variant(conv_layers: int, conv_branch: bool) -> Callable[[VariantContext], dict[str, Any]]:
    """``conv_layers`` convolutions per prediction module, alpha by task (:data:`PA_ALPHA`), on the plain block or
    on the Conv-Transformer's (``conv_branch``)."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        ctx.transformer_fields("PA")
        out: dict[str, Any] = {"predictive.conv_layers": conv_layers}
        if ctx.task in PA_ALPHA:
            out["predictive.alpha"] = PA_ALPHA[ctx.task]
        if conv_branch:
            out["conv_branch"] = {}
        return out

    return overrides


class _PredictiveMethod(MethodBase):
    """Nothing to tie or add after the build: the mixers are installed in the attention modules at build time."""

    name = "predictive"
    config_class = PredictiveConfig
    variants = {
        "pa": NamedVariant("PA-Transformer: one 3x3 conv per prediction module, alpha by task (PA Eq. 4, Sec. 4.1.1; "
                           "0.1 SST/IWSLT, 0.5 SICK, 0.2 MRPC, 0.01 images)", _variant(1, conv_branch=False)),
        "pa_res": NamedVariant("Res-Transformer: attention maps added without the CNN (PA Table 5, conv_layers=0)",
                               _variant(0, conv_branch=False)),
        "pa_conv": NamedVariant("PA-Conv-Transformer: the Conv-Transformer plus attention prediction (PA Sec. 3.5, "
                                "Table 1)", _variant(1, conv_branch=True)),
    }
    examples = (CompositionExample("predictive", {"alpha": 0.5}),)

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
