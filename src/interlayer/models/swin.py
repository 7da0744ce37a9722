"""Swin Transformer (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows", ICCV
2021, arXiv:2103.14030) in the core's terms: LW-Transformer's image baseline (LW Sec. IV-A, Table IX).

Paper map (Sec. 3):

* **Patch partition + linear embedding** (Sec. 3.1, Fig. 3): non-overlapping ``p x p`` patches, a stride-``p``
  convolution to ``C`` channels, then a LayerNorm (the official code's ``patch_norm``).
* **Swin Transformer block** (Sec. 3.1, Eq. 3): the core's pre-LN :class:`~interlayer.core.layers.EncoderLayer`,
  its self-attention the core's :class:`~interlayer.core.attention.MultiHeadAttention` (or the module a method puts
  in its place) run inside non-overlapping ``M x M`` windows (W-MSA, Sec. 3.2) by :class:`WindowedAttention`, its
  MLP the core's :class:`~interlayer.core.feedforward.FeedForward` (4x, GELU).
* **Shifted windows** (Sec. 3.2, Fig. 4): every second block rolls the map by ``floor(M/2)`` (the cyclic shift) and
  masks the logits of token pairs that were not neighbours before it: :func:`shift_mask`.
* **Relative position bias** (Sec. 3.2, Eq. 4): ``softmax(QK^T / sqrt(d) + B)`` with ``B`` read from a learned
  ``(2M-1)^2 x heads`` table: :class:`WindowBias`, a core ``relative`` module (it returns the logit bias), which
  also adds the shift mask.
* **Patch merging** (Sec. 3.1): the features of each 2 x 2 group concatenated (4C), LayerNorm, a linear layer to 2C.
* **Architecture variants** (Sec. 3.3): Swin-T ``C=96, depths (2, 2, 6, 2), heads (3, 6, 12, 24), M=7``; Swin-S
  ``(2, 2, 18, 2)``; a stage whose map fits in one window takes the map as its window and is not shifted (Swin-T's
  last stage, 7 x 7), as the official code does.

Each stage's blocks come from the factories of a per-stage core config (:meth:`SwinConfig.stage_config`: width,
heads, MLP width, depth) customised by the methods, so ``lightweight`` (LW-Transformer's G-MHA and G-FFN, Sec. IV-A)
reaches Swin through its public section exactly as it reaches the ViT. Readings, the CPU preset and the test against
``timm``'s Swin (same weights, same logits): docs/vision-backbones.md.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds
from ..build import customized_components
from ..config import ModelConfig, is_section
from ..config_io import ConfigFile, MethodSlots, checked_config, set_dotted
from ..core.components import Components
from ..core.encoder import EncoderOutput
from ..core.hub import PretrainedMixin, track_ties
from ..core.layers import EncoderLayer, Residual
from ..core.models import ClassifierOutput
from ..errors import ConfigError
from ..methods.lightweight import LightweightConfig
from .image_input import PixelNorm, check_pixels, image_input
from .registry import Family, register_family, register_presets

MODEL_TYPE = "swin"
# The logit the official code adds where the shifted windows join tokens that were not neighbours: finite in
# every float type (the core's most-negative-float convention would round to -inf in fp16/bf16 casts).
MASKED_LOGIT = -100.0


@dataclass
class SwinConfig(ConfigFile):
    """A Swin Transformer classifier (defaults: Swin-T at 224 x 224 on ImageNet-1K, Sec. 3.3)."""

    UNMEASURED_FIELDS: ClassVar[tuple[str, ...]] = ("image_height", "image_width", "padding")
    # sizes every built model's tensors measure (the patch embedding's channels, kernel and width, the head's
    # classes); the per-stage lists are checked against the weights by the loader's shapes
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"channels", "patch_size", "embed_dim", "num_classes"})

    model_type: Literal["swin"] = MODEL_TYPE
    image_height: int = 224
    image_width: int = 224
    channels: int = 3
    pixel_mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])  # ImageNet's, in [0, 1] units
    pixel_std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    padding: int = 0  # zero pixels added on every side before the patches (28 x 28 -> 32 x 32 with 2)
    num_classes: int = 1000
    patch_size: int = 4
    embed_dim: int = 96  # C: stage i is C * 2^i wide
    depths: list[int] = field(default_factory=lambda: [2, 2, 6, 2])
    heads: list[int] = field(default_factory=lambda: [3, 6, 12, 24])
    window: int = 7  # M
    mlp_ratio: float = 4.0
    dropout: float = 0.0  # after the attention's projection, inside and after the MLP (the official proj/mlp drop)
    attn_dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth, rising linearly over the blocks to this rate (Swin-T trains with 0.2)
    layer_norm_eps: float = 1e-5
    attn_impl: Literal["auto", "eager"] = "auto"
    lightweight: Optional[LightweightConfig] = None  # LW-Transformer's G-MHA / G-FFN in every block (Sec. IV-A)

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid of the first stage."""
        return ((self.image_height + 2 * self.padding) // self.patch_size,
                (self.image_width + 2 * self.padding) // self.patch_size)

    @property
    def tokens(self) -> int:
        """Tokens of the first stage (what ``count_madds(model, tokens)`` and the compare report are given)."""
        return self.grid[0] * self.grid[1]

    def stage_grid(self, stage: int) -> tuple[int, int]:
        return self.grid[0] >> stage, self.grid[1] >> stage

    def stage_window(self, stage: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(window, shift of the shifted blocks) per dimension: a map that fits in one window is one unshifted
        window (the official code's rule)."""
        grid = self.stage_grid(stage)
        window = tuple(min(self.window, g) for g in grid)
        shift = tuple(0 if g <= self.window else self.window // 2 for g in grid)
        return window, shift  # type: ignore[return-value]

    def stage_config(self, stage: int) -> ModelConfig:
        """The core config of stage ``stage``'s blocks: its width ``C * 2^stage``, heads, MLP width and depth, pre-LN
        with GELU, and the method sections; the factories built from it make the blocks."""
        width = self.embed_dim * 2 ** stage
        return ModelConfig(arch="encoder_classifier", src_vocab_size=1, num_classes=self.num_classes, d_model=width,
                           n_heads=self.heads[stage], d_ffn=int(width * self.mlp_ratio), enc_layers=self.depths[stage],
                           norm_first=True, activation="gelu", positions="none", pooling="mean",
                           dropout=self.dropout, act_dropout=self.dropout, attn_dropout=self.attn_dropout,
                           layer_norm_eps=self.layer_norm_eps, attn_impl=self.attn_impl,
                           lightweight=copy.deepcopy(self.lightweight))

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the key of the first setting that cannot work."""
        check_pixels(self)
        for key in ("patch_size", "embed_dim", "window", "num_classes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        if self.padding < 0:
            raise ConfigError(f"padding={self.padding} must not be negative")
        if not self.depths or len(self.heads) != len(self.depths) or min(self.depths) < 1 or min(self.heads) < 1:
            raise ConfigError(f"depths={self.depths} and heads={self.heads} need one positive entry per stage each")
        if self.mlp_ratio <= 0 or not 0.0 <= self.drop_path < 1.0:
            raise ConfigError(f"mlp_ratio={self.mlp_ratio} must be positive and drop_path={self.drop_path} in [0, 1)")
        height, width = self.image_height + 2 * self.padding, self.image_width + 2 * self.padding
        step = self.patch_size * 2 ** (len(self.depths) - 1)
        if height % step or width % step:
            raise ConfigError(f"the {height}x{width} image (padding={self.padding} included) must be divisible by "
                              f"patch_size x 2^(stages-1) = {step}: {len(self.depths)} stages halve the patch grid "
                              f"{len(self.depths) - 1} times (change padding, patch_size or the number of stages)")
        for stage in range(len(self.depths)):
            grid = self.stage_grid(stage)
            if any(g > self.window and g % self.window for g in grid):
                raise ConfigError(f"window={self.window} must divide stage {stage + 1}'s {grid[0]}x{grid[1]} map "
                                  "(or be at least as large: one window)")
            width_here = self.embed_dim * 2 ** stage
            try:
                self.stage_config(stage).validate()
            except ConfigError as err:
                raise ConfigError(f"stage {stage + 1} (width {width_here}, heads={self.heads[stage]}): {err}") from None


def _from_dict(data: dict[str, Any], source: str) -> SwinConfig:
    return checked_config(SwinConfig, data, source)


def _override(cfg: SwinConfig, overrides: dict[str, Any]) -> SwinConfig:
    return _from_dict(set_dotted(cfg.to_dict(), overrides, is_section=is_section), "overrides")


# ----------------------------------------------------------------------------------------------------------------
# Windows
def window_partition(x: Tensor, window: tuple[int, int]) -> Tensor:
    """``(B, H, W, C)`` -> ``(B * windows, M_h * M_w, C)``: windows in raster order, tokens raster inside each."""
    b, h, w, c = x.shape
    x = x.view(b, h // window[0], window[0], w // window[1], window[1], c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window[0] * window[1], c)


def window_reverse(windows: Tensor, window: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """:func:`window_partition`'s inverse: ``(B * windows, M_h * M_w, C)`` -> ``(B, H, W, C)``."""
    h, w = grid
    c = windows.shape[-1]
    x = windows.view(-1, h // window[0], w // window[1], window[0], window[1], c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


def relative_index(window: tuple[int, int]) -> Tensor:
    """``(N, N)`` rows of the ``(2M_h-1)(2M_w-1)`` bias table: query ``i`` and key ``j`` at offset ``i - j``
    (row offset first), the official code's layout, so its tables load unchanged."""
    rows = torch.arange(window[0]).repeat_interleave(window[1])
    cols = torch.arange(window[1]).repeat(window[0])
    dy = rows[:, None] - rows[None, :] + window[0] - 1
    dx = cols[:, None] - cols[None, :] + window[1] - 1
    return dy * (2 * window[1] - 1) + dx


def shift_mask(grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> Tensor:
    """``(windows, N, N)``: 0 where two tokens of a window of the rolled map were neighbours before the roll,
    :data:`MASKED_LOGIT` where the roll brought them together from opposite edges (Sec. 3.2, Fig. 4)."""
    def regions(size: int, win: int, sh: int) -> Tensor:  # 0: untouched, 1: the last window's rest, 2: rolled in
        index = torch.arange(size)
        return (index >= size - win).long() + (index >= size - sh).long() * int(sh > 0)

    labels = regions(grid[0], window[0], shift[0])[:, None] * 3 + regions(grid[1], window[1], shift[1])[None, :]
    windows = window_partition(labels[None, :, :, None].float(), window).squeeze(-1)
    differ = windows[:, :, None] != windows[:, None, :]
    return torch.zeros(differ.shape).masked_fill_(differ, MASKED_LOGIT)


class WindowBias(nn.Module):
    """Eq. 4's relative position bias ``B`` of one block, plus the shifted blocks' mask, as a core ``relative``
    module: called with the (scaled) queries of all windows ``(B * windows, heads, N, d)`` it returns the logit bias,
    ``(1, heads, N, N)`` or, with the mask, ``(B * windows, heads, N, N)``. The table is the official code's
    ``relative_position_bias_table`` (truncated normal, std 0.02, as there)."""

    def __init__(self, heads: int, window: tuple[int, int], mask: Optional[Tensor]) -> None:
        super().__init__()
        self.heads = heads
        self.table = nn.Parameter(torch.empty((2 * window[0] - 1) * (2 * window[1] - 1), heads))
        nn.init.trunc_normal_(self.table, std=0.02)
        self.register_buffer("index", relative_index(window), persistent=False)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        n = self.index.shape[0]
        if q.shape[2] != n or k_len != n or q_offset != 0:
            raise ValueError(f"window attention reads whole windows of {n} tokens; got {q.shape[2]} queries over "
                             f"{k_len} keys")
        bias = self.table[self.index.view(-1)].view(n, n, self.heads).permute(2, 0, 1)
        if self.mask is None:
            return bias.unsqueeze(0).to(q.dtype)
        windows = self.mask.shape[0]
        full = bias[None, None] + self.mask[None, :, None]  # (1, windows, heads, N, N)
        return full.expand(q.shape[0] // windows, -1, -1, -1, -1).reshape(q.shape[0], self.heads, n, n).to(q.dtype)

    def madds(self, t_q: int, t_k: int, n_heads: int) -> int:
        return 0  # a table lookup and additions


class WindowedAttention(nn.Module):
    """W-MSA / SW-MSA (Sec. 3.2): ``attention`` (any core self-attention module: the core's, G-MHA) run on each
    window of the ``grid`` alone, after a cyclic shift by ``shift`` and rolled back after; it follows the core
    attention protocol, so it is the self-attention of a core :class:`EncoderLayer`. Intermediates, when asked for,
    are the inner module's, one map per window (batch ``B * windows``)."""

    wants_prev_logits = False  # no logit mixer reaches across windows

    def __init__(self, attention: nn.Module, grid: tuple[int, int], window: tuple[int, int],
                 shift: tuple[int, int]) -> None:
        super().__init__()
        self.attention = attention
        self.grid, self.window, self.shift = grid, window, shift

    def forward(self, x: Tensor, memory: Optional[Tensor] = None, *, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False, prev_logits: Optional[Tensor] = None, need_intermediates: bool = False,
                cache: Optional[Any] = None) -> tuple[Tensor, Any]:
        if memory is not None or key_padding_mask is not None or causal or cache is not None:
            raise ValueError("window attention is the unmasked self-attention of an image's token grid")
        b, t, c = x.shape
        grid = x.view(b, *self.grid, c)
        if any(self.shift):
            grid = torch.roll(grid, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        out, inter = self.attention(window_partition(grid, self.window), need_intermediates=need_intermediates)
        grid = window_reverse(out, self.window, self.grid)
        if any(self.shift):
            grid = torch.roll(grid, shifts=self.shift, dims=(1, 2))
        return grid.reshape(b, t, c), inter

    def madds(self, t_q: int, t_k: int) -> int:
        n = self.window[0] * self.window[1]
        return t_q // n * self.attention.madds(n, n)


class DropPathResidual(Residual):
    """The pre-LN residual ``x + drop_path(dropout(f(LN(x))))``: stochastic depth (Huang et al. 2016), which drops
    a sample's whole branch with probability ``rate`` in training and scales the kept ones by ``1 / (1 - rate)``,
    as Swin's recipe trains (Sec. 4.1: 0.2 for Swin-T)."""

    def __init__(self, d_model: int, dropout: float, eps: float, rate: float) -> None:
        super().__init__(d_model, dropout, norm_first=True, eps=eps)
        self.rate = rate

    def combine(self, carry: Any, branch_out: Tensor) -> Tensor:
        out = self.dropout(branch_out)
        if self.training and self.rate > 0.0:
            keep = 1.0 - self.rate
            out = out * out.new_empty((out.shape[0],) + (1,) * (out.dim() - 1)).bernoulli_(keep).div_(keep)
        return carry + out


class PatchMerging(nn.Module):
    """Sec. 3.1: each 2 x 2 group's features concatenated in the official code's order (rows then columns:
    ``(0,0), (1,0), (0,1), (1,1)``), LayerNorm over the 4C, a linear layer without bias to 2C."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * width, eps=eps)
        self.reduction = nn.Linear(4 * width, 2 * width, bias=False)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        b, _, c = x.shape
        h, w = grid
        x = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h * w // 4, 4 * c)
        return self.reduction(self.norm(x))

    def madds(self, t: int) -> int:
        return t // 4 * self.reduction.weight.numel()


class SwinStage(nn.Module):
    """Patch merging (from the second stage on), then the stage's blocks: core :class:`EncoderLayer` s whose
    attention, MLP and residuals come from the stage's customised factories (the methods' replacements included),
    the attention wrapped in :class:`WindowedAttention`, shifted in every second block."""

    def __init__(self, cfg: SwinConfig, stage: int, rates: list[float]) -> None:
        super().__init__()
        stage_cfg = cfg.stage_config(stage)
        width, heads = stage_cfg.d_model, stage_cfg.n_heads
        self.grid = cfg.stage_grid(stage)
        self.merge = PatchMerging(width // 2, cfg.layer_norm_eps) if stage else None
        window, shift = cfg.stage_window(stage)
        masks = [None, shift_mask(self.grid, window, shift) if any(shift) else None]

        def base(components: Components) -> None:
            def relative(side: str, index: int, head_dim: Optional[int] = None) -> nn.Module:
                return WindowBias(heads, window, masks[index % 2])

            components.relative = relative
            components.residual = lambda side, index, kind: DropPathResidual(
                width, cfg.dropout, cfg.layer_norm_eps, rates[index])

        components = customized_components(stage_cfg, base)
        self.blocks = nn.ModuleList(
            EncoderLayer(WindowedAttention(components.self_attention("encoder", i), self.grid, window,
                                           shift if i % 2 else (0, 0)),
                         components.ffn("encoder", i), width, dropout=cfg.dropout, norm_first=True,
                         eps=cfg.layer_norm_eps, residuals=(components.residual("encoder", i, "attn"),
                                                            components.residual("encoder", i, "ffn")))
            for i in range(stage_cfg.enc_layers))

    def forward(self, x: Tensor, need_intermediates: bool, records: dict[str, list]) -> Tensor:
        if self.merge is not None:
            x = self.merge(x, (self.grid[0] * 2, self.grid[1] * 2))
        for block in self.blocks:
            out = block(x, need_intermediates=need_intermediates)
            x = out.hidden
            records["states"].append(x)
            records["mids"].append(out.mid)
            records["attentions"].append(out.attention)
        return x

    def madds(self) -> int:
        t = self.grid[0] * self.grid[1]
        return (self.merge.madds(4 * t) if self.merge is not None else 0) + sum(b.madds(t) for b in self.blocks)


class SwinClassifier(nn.Module, PretrainedMixin):
    """Pixel normalisation (and ``padding``) -> patch embedding -> the stages -> LayerNorm -> the mean over the last
    stage's tokens -> a linear head. ``forward`` returns the core's :class:`ClassifierOutput`, whose ``encoder``
    holds the last stage's normalised tokens (``hidden``), every block's output (``states``, of the stages' widths)
    and, with ``need_intermediates``, every block's window attention."""

    model_type = MODEL_TYPE

    def __init__(self, cfg: SwinConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.norm = PixelNorm(cfg.pixel_mean, cfg.pixel_std)
        self.patch_embed = nn.Conv2d(cfg.channels, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)
        self.embed_norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        total = sum(cfg.depths)
        rates = [cfg.drop_path * i / max(total - 1, 1) for i in range(total)]  # the official linspace(0, rate)
        starts = [sum(cfg.depths[:s]) for s in range(len(cfg.depths))]
        self.stages = nn.ModuleList(SwinStage(cfg, s, rates[starts[s]:starts[s] + cfg.depths[s]])
                                    for s in range(len(cfg.depths)))
        width = cfg.embed_dim * 2 ** (len(cfg.depths) - 1)
        self.final_norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(width, cfg.num_classes)
        track_ties(self)

    def forward(self, images: Optional[Tensor] = None, *, pixel_values: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_intermediates: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False,
                return_dict: Optional[bool] = None) -> Union[ClassifierOutput, tuple[Tensor, ...]]:
        """``images`` or HF's ``pixel_values`` ``(B, channels, image_height, image_width)``, uint8 or in [0, 1];
        ``labels`` (B,) give ``output.loss``; ``return_dict=False`` returns the output's tuple."""
        cfg = self.config
        images = image_input(cfg, images, pixel_values)
        pad = cfg.padding
        x = self.norm(F.pad(images, (pad, pad, pad, pad)) if pad else images)
        x = self.embed_norm(self.patch_embed(x).flatten(2).transpose(1, 2))
        need_intermediates = need_intermediates or output_attentions
        records: dict[str, list] = {"states": [], "mids": [], "attentions": []}
        embedded = x
        for stage in self.stages:
            x = stage(x, need_intermediates, records)
        hidden = self.final_norm(x)
        pooled = hidden.mean(dim=1)
        enc = EncoderOutput(hidden=hidden, padding_mask=None, states=records["states"], mids=records["mids"],
                            attentions=records["attentions"] if need_intermediates else [], embedded=embedded)
        out = ClassifierOutput(logits=self.head(pooled), encoder=enc, pooled=pooled)
        out = out.with_hf_extras(labels, output_hidden_states, output_attentions, self.training)
        return out.to_tuple() if return_dict is False else out

    def madds(self, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
        """Multiply-adds for one image (matrix products and convolutions; Sec. 3.3's FLOPs count these): the patch
        embedding, every stage and the head. ``src_len``, if given, must be ``config.tokens``."""
        if src_len is not None and src_len != self.config.tokens:
            raise ValueError(f"this Swin model reads {self.config.tokens} patch tokens; got src_len={src_len}")
        embed = self.config.tokens * self.patch_embed.weight.numel()
        return embed + sum(stage.madds() for stage in self.stages) + self.head.weight.numel()


# ----------------------------------------------------------------------------------------------------------------
# Presets. Swin-T and Swin-S as Sec. 3.3 sizes them (ImageNet-1K, 224 x 224); the CPU preset for 28 x 28 grey
# images (docs/vision-backbones.md has the reasons): zero-padded to 32 x 32, 2 x 2 patches (a 16 x 16 grid), 4 x 4
# windows, three stages (16 x 16, 8 x 8, 4 x 4: the last is one unshifted window), C=32, depths 2-2-2, heads 2-4-8
# (16 features per head, as the ViT baseline), no dropout or stochastic depth (12 epochs regularise little).
SWIN_T: dict[str, Any] = dict(embed_dim=96, depths=[2, 2, 6, 2], heads=[3, 6, 12, 24], window=7, drop_path=0.2)
SWIN_FASHION_MNIST: dict[str, Any] = dict(
    image_height=28, image_width=28, channels=1, pixel_mean=[0.0], pixel_std=[1.0], padding=2, num_classes=10,
    patch_size=2, embed_dim=32, depths=[2, 2, 2], heads=[2, 4, 8], window=4)
SWIN_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "swin_t": ("Swin-T (Liu et al. Sec. 3.3): C=96, depths 2-2-6-2, heads 3-6-12-24, 7x7 windows, 224x224, ImageNet "
               "classes; LW Table IX's baseline", dict(SWIN_T)),
    "swin_s": ("Swin-S (Sec. 3.3): Swin-T with 18 blocks in stage 3, stochastic depth 0.3",
               dict(SWIN_T, depths=[2, 2, 18, 2], drop_path=0.3)),
    "swin_fashion_mnist": (
        "Swin for 28x28 grey images: padded to 32, 2x2 patches, 4x4 windows, C=32, depths 2-2-2, heads 2-4-8",
        dict(SWIN_FASHION_MNIST)),
}

register_family(Family(
    name=MODEL_TYPE, title="Swin Transformer", tasks="image, fashion_mnist", config_class=SwinConfig,
    from_dict=_from_dict, override=_override, build=SwinClassifier,
    madds=lambda name, model, length: count_madds(model), madds_unit="MAdds per image", rank=4,
    model_types=(MODEL_TYPE,), claims=lambda data: data.get("model_type") == MODEL_TYPE,
    method_slots=MethodSlots("Swin", at=None)))  # LW on Swin: the lw_swin_* presets
register_presets(MODEL_TYPE, SWIN_PRESETS)
