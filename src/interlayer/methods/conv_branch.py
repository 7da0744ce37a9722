"""Conv-Transformer block ("Predictive Attention Transformer: Improving Transformer with Attention Map Prediction",
anonymous, under double-blind review; Sec. 3.5, Fig. 4, App. B.1): the encoder self-attention replaced by half
self-attention, half convolution. Alone it is Table 1's Conv-Transformer; with ``predictive`` the PA-Conv-Transformer.

Paper map:

* **The split** (App. B.1): "one half of dimension for the convolutional layer and the other half for the
  self-attention layer", 4 heads: :class:`AttentionConvBlock` (``attn_dim`` = ``d_model / 2``, ``heads=4``), its
  attention half :class:`BranchAttention`, the halves' outputs concatenated back to ``d_model``.
* **The convolution** (Sec. 3.5): 1-D, window 3 for text; 3 x 3 over the token grid for images: :class:`TokenConv`
  (``kernel_size``; 2-D with ``grid_height`` x ``grid_width``, raster order).

Readings (Fig. 4 is an image; the text fixes only the split, the head count and the kernels): both halves read the
full ``d_model`` input, as in the attention-augmented convolution the paper builds on (Bello et al. 2019,
``Concat[Conv(X), MHA(X)]``). ``out_proj="none"``: no W^O, the reading that matches Table 1's 0.21M drop from the
Transformer (ours 3 x 66,048 = 0.198M; ``"attention"``, Bello's W^O on the attention half, gives 0.149M; ``"joint"``
a ``d x d`` projection after the concatenation, no saving). ``activation="relu"`` after the convolution: the paper's
conv layers are followed by a ReLU throughout (Sec. 3.3, Sec. 4.1.1). Prefix tokens (CLS) have no grid cell, so
their convolution output is zero, as 2-D relative positions treat them. Padded positions are zeroed before the
convolution. Encoder only (no ``"decoder"``, no causal LM): a centred kernel reads future tokens, and a causal one
is not the paper's block (the paper uses it in encoders and classifiers only). ``wants_prev_logits`` and the
intermediates are the attention half's, so the ``predictive`` logit mixer predicts its 4 heads' maps.

Options, parameter counts and presets (:mod:`interlayer.papers.predictive`): docs/methods/predictive.md, section
``conv_branch``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.attention import AttentionIntermediates, KVCache, MultiHeadAttention
from ..core.components import Components, StackSide
from ..errors import ConfigError
from .base import ComposedConfig, CompositionExample, MethodBase, NamedVariant, VariantContext, stack_sides


@dataclass
class ConvBranchConfig:
    """Half self-attention, half convolution (PA App. B.1); every field's reading is argued in the module doc."""

    # sizes of the saved tensors in every model (checkpoint.py)
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"attn_dim", "kernel_size"})

    heads: int = 4  # App. B.1: "The head number of self-attention is set as 4"
    attn_dim: Optional[int] = None  # width of the attention half; None: d_model // 2 (App. B.1 "one half")
    kernel_size: int = 3  # Sec. 3.5: window 3 (1-D text), 3 x 3 (2-D grid)
    activation: Literal["relu", "gelu", "none"] = "relu"
    out_proj: Literal["none", "attention", "joint"] = "none"
    sides: list[StackSide] = field(default_factory=lambda: ["encoder"])  # encoder only (module doc)

    def attention_width(self, cfg: ComposedConfig) -> int:
        return self.attn_dim if self.attn_dim is not None else cfg.d_model // 2

    def query_width(self, cfg: ComposedConfig) -> int:
        """Query/key width of the attention half: ``qk_dim`` scaled by the half's share of ``d_model``."""
        return cfg.qk_width * self.attention_width(cfg) // cfg.d_model

    def validate(self, cfg: ComposedConfig) -> None:
        stack_sides("conv_branch", self.sides, cfg, decoder_refused="a centred convolution reads future target "
                    "tokens and a causal one would need a convolution state in incremental decoding, which the "
                    "decoder's KVCache does not carry (the PA paper uses the block in encoders only)")
        if cfg.arch == "causal_lm":
            raise ConfigError("conv_branch cannot be used in a causal language model (arch='causal_lm'): its "
                              "centred convolution reads the next token, so a position would see the future (the "
                              "PA paper uses the block in encoders only); remove the conv_branch section")
        if self.heads < 1:
            raise ConfigError(f"conv_branch.heads={self.heads} must be at least 1")
        if self.attn_dim is None and cfg.d_model % 2:
            raise ConfigError(f"conv_branch.attn_dim=None splits d_model in half, but d_model={cfg.d_model} is odd;"
                              " set conv_branch.attn_dim to the attention half's width")
        width = self.attention_width(cfg)
        if not 0 < width < cfg.d_model:
            raise ConfigError(f"conv_branch.attn_dim={width} must lie strictly between 0 and d_model={cfg.d_model}"
                              " so that both branches have channels")
        if width % self.heads:
            valid = [h for h in range(1, width + 1) if width % h == 0]
            raise ConfigError(f"conv_branch.heads={self.heads} does not divide the attention half's width "
                              f"attn_dim={width}; valid heads: {valid}")
        qk_total = cfg.qk_width * width
        if qk_total % cfg.d_model or (qk_total // cfg.d_model) % self.heads:
            raise ConfigError(f"qk_dim={cfg.qk_dim} scaled to the attention half (qk_dim * attn_dim / d_model = "
                              f"{qk_total / cfg.d_model:g}) must be an integer divisible by conv_branch.heads="
                              f"{self.heads}")
        check_kernel("conv_branch.kernel_size", self.kernel_size, cfg.max_positions)
        if (cfg.grid_height > 0) != (cfg.grid_width > 0):
            raise ConfigError(f"conv_branch runs a 2-D convolution over the token grid, which needs both "
                              f"grid_height and grid_width; got {cfg.grid_height}x{cfg.grid_width} (set both, or "
                              f"both to 0 for the 1-D text convolution)")


def check_kernel(key: str, size: int, positions: Optional[int] = None) -> None:
    """A kernel ``size`` that centres every position (odd), and reaches no farther than ``positions`` (a model's
    ``max_positions``: ``2 positions - 1`` covers every offset; kernel_size=1000001 padded each sequence by 500,000
    and its weights filled the memory)."""
    if size < 1 or size % 2 == 0:
        raise ConfigError(f"{key}={size} must be a positive odd number (3, 5, ...) so that 'same' padding keeps "
                          "every position centred")
    if positions is not None and size > 2 * positions - 1:
        raise ConfigError(f"{key}={size} is wider than 2 x max_positions - 1 = {2 * positions - 1}, which already "
                          "reaches every position from every other; give a smaller odd size")


def attention_heads(cfg: ComposedConfig) -> int:
    """Heads of the encoder self-attention: the attention half's when this method is on, else ``n_heads``."""
    return cfg.conv_branch.heads if cfg.conv_branch is not None else cfg.n_heads


class BranchAttention(MultiHeadAttention):
    """Multi-head self-attention reading a ``d_in``-wide input and producing ``width`` channels.

    The core module's projections are kept (``q_proj`` is re-made to read ``d_in``; keys and values read it via
    ``kv_dim``), so the fused/eager paths, relative positions and logit mixers work unchanged. Without its own
    W^O (``out_proj=False``) the heads are simply concatenated (PA Eq. 5 without W^O) and ``out_proj`` is an
    identity.
    """

    def __init__(self, d_in: int, width: int, n_heads: int, *, qk_dim: int, out_proj: bool, dropout: float,
                 bias: bool, relative: Optional[nn.Module], logit_mixer: Optional[nn.Module], force_eager: bool
                 ) -> None:
        super().__init__(width, n_heads, kv_dim=d_in, qk_dim=qk_dim, dropout=dropout, bias=bias, relative=relative,
                         logit_mixer=logit_mixer, force_eager=force_eager)
        self.d_in = d_in
        self.q_proj = nn.Linear(d_in, qk_dim, bias=bias)
        nn.init.xavier_uniform_(self.q_proj.weight, gain=1 / math.sqrt(2))
        if bias:
            nn.init.zeros_(self.q_proj.bias)
        if not out_proj:
            self.out_proj = nn.Identity()

    def madds(self, t_q: int, t_k: int) -> int:
        total = t_q * self.d_in * self.qk_dim + t_k * self.kv_dim * (self.qk_dim + self.d_model)
        total += t_q * t_k * (self.qk_dim + self.d_model)
        if isinstance(self.out_proj, nn.Linear):
            total += t_q * self.d_model * self.d_model
        if self.relative is not None:
            total += self.relative.madds(t_q, t_k, self.n_heads)
        if self.logit_mixer is not None:
            total += self.logit_mixer.madds(t_q, t_k)
        return total


class TokenConv(nn.Module):
    """A 'same'-padded convolution over the sequence (1-D) or over the token grid (2-D, prefix tokens excluded)."""

    def __init__(self, d_in: int, d_out: int, kernel_size: int, *, grid: Optional[tuple[int, int]], bias: bool
                 ) -> None:
        super().__init__()
        self.grid = grid
        conv = nn.Conv1d if grid is None else nn.Conv2d
        self.conv = conv(d_in, d_out, kernel_size, padding=kernel_size // 2, bias=bias)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """``x`` (B, T, d_in) -> (B, T, d_out); padded positions are zeroed first so they cannot leak."""
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        if self.grid is None:
            return self.conv(x.transpose(1, 2)).transpose(1, 2)
        height, width = self.grid
        b, t, d = x.shape
        prefix = t - height * width
        if prefix < 0:
            raise ValueError(f"the 2-D convolution needs the {height}x{width} grid tokens (plus optional prefix "
                             f"tokens), got a sequence of {t}")
        cells = x[:, prefix:].transpose(1, 2).reshape(b, d, height, width)
        out = self.conv(cells).flatten(2).transpose(1, 2)
        return F.pad(out, (0, 0, prefix, 0))

    def madds(self, t: int) -> int:
        positions = t if self.grid is None else self.grid[0] * self.grid[1]
        return positions * self.conv.weight.numel()


_ACTIVATION_FNS = {"relu": F.relu, "gelu": F.gelu, "none": lambda x: x}


class AttentionConvBlock(nn.Module):
    """``Concat[Attention_half(x), act(Conv(x))]`` (optionally projected), a drop-in for the self-attention.

    Follows the attention protocol of :class:`~interlayer.core.attention.MultiHeadAttention`; the intermediates
    and ``wants_prev_logits`` are the attention half's. ``q_proj``/``k_proj``/``v_proj``/``out_proj`` read and
    write the attention half's projections, so weight-sharing methods that tie them work on this block too.
    """

    _DELEGATED = ("q_proj", "k_proj", "v_proj", "out_proj")

    def __init__(self, attention: BranchAttention, conv: TokenConv, activation: str, proj: Optional[nn.Linear]
                 ) -> None:
        super().__init__()
        self.attention = attention
        self.conv = conv
        self.activation = activation
        self.proj = proj

    def __getattr__(self, name: str) -> Any:
        if name in AttentionConvBlock._DELEGATED:
            return getattr(self.attention, name)
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in AttentionConvBlock._DELEGATED:
            setattr(self.attention, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def wants_prev_logits(self) -> bool:
        return self.attention.wants_prev_logits

    def forward(self, x: Tensor, memory: Optional[Tensor] = None, *, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False, prev_logits: Optional[Tensor] = None, need_intermediates: bool = False,
                cache: Optional[KVCache] = None) -> tuple[Tensor, Optional[AttentionIntermediates]]:
        if memory is not None or causal or cache is not None:
            raise ValueError("the attention + convolution block is encoder self-attention only (no memory, "
                             "causal mask or cache); conv_branch.sides=['encoder'] guarantees that")
        attended, inter = self.attention(x, key_padding_mask=key_padding_mask, prev_logits=prev_logits,
                                         need_intermediates=need_intermediates)
        convolved = _ACTIVATION_FNS[self.activation](self.conv(x, key_padding_mask))
        out = torch.cat([attended, convolved], dim=-1)
        return (self.proj(out) if self.proj is not None else out), inter

    def madds(self, t_q: int, t_k: int) -> int:
        proj = t_q * self.proj.in_features * self.proj.out_features if self.proj is not None else 0
        return self.attention.madds(t_q, t_k) + self.conv.madds(t_q) + proj


def build_block(section: ConvBranchConfig, cfg: ComposedConfig, components: Components, side: str, index: int
                ) -> AttentionConvBlock:
    """One block for layer ``index``; relative positions and the logit mixer come from the (late-bound) factories."""
    width, qk_dim = section.attention_width(cfg), section.query_width(cfg)
    attention = BranchAttention(cfg.d_model, width, section.heads, qk_dim=qk_dim,
                                out_proj=section.out_proj == "attention", dropout=cfg.attn_dropout, bias=cfg.bias,
                                relative=_relative(components, side, index, qk_dim // section.heads),
                                logit_mixer=components.logit_mixer(side, index),
                                force_eager=cfg.attn_impl == "eager")
    grid = (cfg.grid_height, cfg.grid_width) if cfg.grid_height > 0 else None
    conv = TokenConv(cfg.d_model, cfg.d_model - width, section.kernel_size, grid=grid, bias=cfg.bias)
    proj = None
    if section.out_proj == "joint":
        proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        nn.init.xavier_uniform_(proj.weight)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
    return AttentionConvBlock(attention, conv, section.activation, proj)


def _relative(components: Components, side: str, index: int, head_dim: int) -> Optional[nn.Module]:
    """The core relative-position module sized for the attention half's heads (a replaced factory is used as is)."""
    if components.relative == components.default_relative:
        return components.default_relative(side, index, head_dim)
    return components.relative(side, index)


def _conv_transformer(ctx: VariantContext) -> dict[str, Any]:
    ctx.transformer_fields("Conv-Transformer")
    return {"conv_branch": {}}


class _ConvBranchMethod(MethodBase):
    """Nothing to tie or add after the build: the block is complete once built."""

    name = "conv_branch"
    config_class = ConvBranchConfig
    variants = {"conv": NamedVariant("Conv-Transformer: half self-attention (4 heads), half convolution (PA Sec. "
                                     "3.5, Table 1)", _conv_transformer)}
    examples = (CompositionExample("conv_branch"),)
    lm_examples: dict[str, dict[str, Any]] = {}  # validate refuses a causal LM: the centred convolution reads ahead

    def restructures(self, section: ConvBranchConfig) -> bool:
        """Its attention + convolution block replaces the checkpoint's self-attention."""
        return True

    def customize(self, section: ConvBranchConfig, cfg: ComposedConfig, components: Components) -> None:
        previous = components.self_attention
        if previous != components.default_self_attention:
            raise ConfigError("conv_branch replaces the encoder self-attention with its attention + convolution "
                              "block, but another method already replaced it; turn one of them off")

        def factory(side: str, index: int) -> nn.Module:
            if side not in section.sides:
                return previous(side, index)
            return build_block(section, cfg, components, side, index)

        components.self_attention = factory


METHOD = _ConvBranchMethod()
