"""Attention-augmented ResNets (Bello, Zoph, Vaswani, Shlens & Le, "Attention Augmented Convolutional Networks",
ICCV 2019, arXiv:1904.09925), and Predictive Attention across their augmented layers (PA Sec. 4.2.2, Table 4).

Paper map (AA):

* **Attention-augmented convolution** (Sec. 3.3): ``AAConv(X) = Concat[Conv(X), MHA(X)]``, the convolution with
  ``F_out - d_v`` filters, the attention with ``d_k = kappa F_out`` key and ``d_v = upsilon F_out`` value channels
  over ``N_h`` heads: :class:`AugmentedConv`. **MHA** (Eq. 1-2): queries, keys and values are 1 x 1 projections of
  the map's pixels, ``W^O`` a 1 x 1 ``d_v x d_v`` mix: the core's attention reading ``F_in`` channels
  (:class:`~interlayer.methods.conv_branch.BranchAttention`, the Conv-Transformer's attention half), queries scaled
  by ``d_k^h ** -0.5``. **2-D relative logits** (Sec. 3.2, Eq. 3-4): ``l_ij = q_i^T (k_j + r^W_{jx-ix} +
  r^H_{jy-iy}) / sqrt(d_k^h)``, the embeddings shared by the heads: the core's
  :class:`~interlayer.core.positions.RelativePositionBias2D` (PA Eq. 3 is the same form).
* **Architecture** (Sec. 3.3-4.2): a batch normalisation after each augmented convolution, once per residual
  block (the bottleneck's 3 x 3, the basic block's second 3 x 3), in the stages ``augmented`` names (ImageNet: the
  last three, 28 x 28, 14 x 14 and 7 x 7), ``N_h = 8``; ``attention_pool`` stages attend over their input
  average-pooled 3 x 3 / 2 and upsample the result bilinearly (Sec. 3.3's memory saving, used on the largest map).
  A strided 3 x 3 (a stage's first bottleneck, ResNet v1.5) attends over its input pooled the same way.

**Predictive Attention** (``predictive``; PA Sec. 4.2.2): the augmented layers form one chain, each layer's logits
mixed by PA Eq. 4 with the method's CNN over the previous augmented layer's (mixed) logits, through the method's
public :func:`~interlayer.methods.predictive.make_mixer`; the first layer predicts nothing (PA Sec. 3.3). Where the
resolution changes between two augmented layers, the previous maps are resized (``map_resize``): docs page.
Readings (``kappa``, ``upsilon`` and which convolution is augmented): docs/vision-backbones.md.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds
from ..config import ModelConfig
from ..config_io import ConfigFile, MethodSlots, checked_config, set_dotted
from ..core.encoder import EncoderOutput
from ..core.hub import PretrainedMixin, track_ties
from ..core.models import ClassifierOutput
from ..core.positions import RelativePositionBias2D
from ..errors import ConfigError
from ..methods.conv_branch import BranchAttention
from ..methods.predictive import PredictiveConfig, make_mixer
from .image_input import PixelNorm, check_pixels, image_input
from .registry import Family, register_family, register_presets

MODEL_TYPE = "aa_resnet"
EXPANSION = {"basic": 1, "bottleneck": 4}


@dataclass
class AAResNetConfig(ConfigFile):
    """An (attention-augmented) ResNet classifier; defaults: AA-ResNet-50 at 224 x 224 (AA Sec. 4.2)."""

    UNMEASURED_FIELDS: ClassVar[tuple[str, ...]] = ("image_height", "image_width")
    # sizes every built model's tensors measure (the stem's input and output channels, the head's classes); the
    # per-stage lists and the attention's fractions are checked against the weights by the loader's shapes
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"channels", "stem_width", "num_classes"})

    model_type: Literal["aa_resnet"] = MODEL_TYPE
    image_height: int = 224
    image_width: int = 224
    channels: int = 3
    pixel_mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])
    pixel_std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    num_classes: int = 1000
    block: Literal["basic", "bottleneck"] = "bottleneck"
    layers: list[int] = field(default_factory=lambda: [3, 4, 6, 3])  # blocks per stage
    widths: list[int] = field(default_factory=lambda: [64, 128, 256, 512])  # 3 x 3 widths (bottleneck: x4 out)
    # "imagenet": 7 x 7 / 2 convolution + 3 x 3 / 2 max pooling (He et al.); "small": one 3 x 3 / 1 convolution
    # (He et al.'s CIFAR networks), for 28-32 pixel images
    stem: Literal["imagenet", "small"] = "imagenet"
    stem_width: int = 64
    augmented: list[bool] = field(default_factory=lambda: [False, True, True, True])  # stages with AA
    attention_pool: list[bool] = field(default_factory=lambda: [False, True, False, False])
    heads: int = 8  # N_h (AA Sec. 4.2)
    kappa: float = 0.2  # d_k / F_out (AA Sec. 4.2 as read: "kappa = 2 upsilon = 0.2")
    upsilon: float = 0.1  # d_v / F_out
    relative: bool = True  # 2-D relative logits (Eq. 3-4); False: none (AA's ablation)
    predictive: Optional[PredictiveConfig] = None  # PA across the augmented layers (PA Sec. 4.2.2)
    # "area": the previous maps averaged over the 2 x 2 (or larger) groups of queries and of keys that the next
    # resolution merges; "restart": the chain starts again at each new resolution (no prediction across it)
    map_resize: Literal["area", "restart"] = "area"

    @property
    def tokens(self) -> int:
        """The image's pixels (what ``count_madds(model, tokens)`` and the compare report are given)."""
        return self.image_height * self.image_width

    def stage_grids(self) -> list[tuple[int, int]]:
        """Each stage's output map, as the strided convolutions compute it."""
        h, w = self.image_height, self.image_width
        if self.stem == "imagenet":
            for _ in range(2):  # the 7 x 7 / 2 convolution and the 3 x 3 / 2 max pooling
                h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        grids = []
        for stage in range(len(self.layers)):
            if stage:
                h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
            grids.append((h, w))
        return grids

    def depths(self, stage: int) -> tuple[int, int]:
        """``(d_k, d_v)`` of stage ``stage``'s augmented convolutions: ``kappa`` and ``upsilon`` times its output
        filters, each rounded to a multiple of the heads (at least one channel per head)."""
        out = self.widths[stage]
        return tuple(max(self.heads, self.heads * round(r * out / self.heads))  # type: ignore[return-value]
                     for r in (self.kappa, self.upsilon))

    def attention_grid(self, stage: int) -> tuple[int, int]:
        h, w = self.stage_grids()[stage]
        return ((h - 1) // 2 + 1, (w - 1) // 2 + 1) if self.attention_pool[stage] else (h, w)

    def augmented_layers(self) -> int:
        return sum(n for n, on in zip(self.layers, self.augmented) if on)

    def mixer_config(self) -> ModelConfig:
        """The stand-in core config the predictive section is checked and built against: one encoder "layer" per
        augmented convolution (the chain PA Eq. 4 runs along)."""
        return ModelConfig(arch="encoder_classifier", src_vocab_size=1, num_classes=self.num_classes, d_model=8,
                           n_heads=1, d_ffn=8, enc_layers=self.augmented_layers(), positions="none",
                           predictive=copy.deepcopy(self.predictive))

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the key of the first setting that cannot work."""
        check_pixels(self)
        stages = len(self.layers)
        for key in ("widths", "augmented", "attention_pool"):
            if len(getattr(self, key)) != stages:
                raise ConfigError(f"{key}={getattr(self, key)} needs one entry per stage (layers={self.layers})")
        if not stages or min(self.layers) < 1 or min(self.widths) < 1:
            raise ConfigError(f"layers={self.layers} and widths={self.widths} must be positive, one per stage")
        for key in ("stem_width", "heads", "num_classes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        if not (0.0 < self.kappa and 0.0 < self.upsilon < 1.0):
            raise ConfigError(f"kappa={self.kappa} must be positive and upsilon={self.upsilon} in (0, 1): the "
                              "attention takes upsilon of the output filters from the convolution")
        for stage, on in enumerate(self.augmented):
            out = self.widths[stage]
            if on and self.depths(stage)[1] >= out:
                raise ConfigError(f"stage {stage + 1}: upsilon={self.upsilon} of its {out} filters leaves the "
                                  f"convolution none once rounded to heads={self.heads}; lower heads or upsilon")
        if self.attention_pool != [a and p for a, p in zip(self.augmented, self.attention_pool)]:
            raise ConfigError(f"attention_pool={self.attention_pool} pools the attention of stages that are not "
                              f"augmented={self.augmented}")
        if self.predictive is not None:
            if self.augmented_layers() < 2:
                raise ConfigError(f"predictive needs at least 2 augmented convolutions (the first never predicts, "
                                  f"PA Sec. 3.3); augmented={self.augmented} with layers={self.layers} has "
                                  f"{self.augmented_layers()}")
            if self.predictive.sides != ["encoder"] or self.predictive.kernel == "causal":
                raise ConfigError("predictive.sides and predictive.kernel have one meaning in an AA-ResNet: the "
                                  "augmented layers' chain with the centred kernel; leave them unset")
            self.mixer_config().validate()


def _from_dict(data: dict[str, Any], source: str) -> AAResNetConfig:
    return checked_config(AAResNetConfig, data, source)


def _override(cfg: AAResNetConfig, overrides: dict[str, Any]) -> AAResNetConfig:
    return _from_dict(set_dotted(cfg.to_dict(), overrides, is_section=lambda name: name == "predictive"),
                      "overrides")


# ----------------------------------------------------------------------------------------------------------------
# Layers
def resize_maps(maps: Tensor, source: tuple[int, int], target: tuple[int, int]) -> Tensor:
    """``(B, H, T, T)`` attention maps over a ``source`` grid as maps over a ``target`` grid: the logit between a
    merged query and a merged key is the mean of their members' logits (adaptive average pooling over the keys'
    grid, then over the queries'; a 2 x 2 merge averages each 2 x 2 group)."""
    b, heads = maps.shape[:2]
    (h1, w1), (h2, w2) = source, target
    x = F.adaptive_avg_pool2d(maps.reshape(b * heads * h1 * w1, 1, h1, w1), target)  # keys
    x = x.reshape(b * heads, h1, w1, h2 * w2).permute(0, 3, 1, 2)
    x = F.adaptive_avg_pool2d(x, target)  # queries: (B*H, keys, h2, w2)
    return x.reshape(b, heads, h2 * w2, h2 * w2).transpose(-1, -2)


class AugmentedConv(nn.Module):
    """``Concat[Conv(X), MHA(X)]`` (AA Sec. 3.3). The attention reads the input's pixels as tokens (pooled 3 x 3 /
    2 when the convolution strides, and again when ``pool``), and its output is upsampled to the convolution's
    map when pooled. ``forward(x, prev_logits, need_logits)`` returns the map and, when asked, the logits (mixed by
    the layer's PA mixer when it has one and ``prev_logits`` are given)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, grid: tuple[int, int], *, heads: int, key_depth: int,
                 value_depth: int, relative: bool, pool: bool, logit_mixer: Optional[nn.Module]) -> None:
        super().__init__()
        self.stride, self.pool, self.grid, self.value_depth = stride, pool, grid, value_depth
        self.conv = nn.Conv2d(in_ch, out_ch - value_depth, 3, stride=stride, padding=1, bias=False)
        position = RelativePositionBias2D(key_depth // heads, *grid) if relative else None
        self.attention = BranchAttention(in_ch, value_depth, heads, qk_dim=key_depth, out_proj=True, dropout=0.0,
                                         bias=True, relative=position, logit_mixer=logit_mixer, force_eager=False)

    def forward(self, x: Tensor, prev_logits: Optional[Tensor] = None, need_logits: bool = False,
                need_intermediates: bool = False) -> tuple[Tensor, Any]:
        conv = self.conv(x)
        a = F.avg_pool2d(x, 3, 2, 1) if self.stride > 1 else x
        a = F.avg_pool2d(a, 3, 2, 1) if self.pool else a
        b, _, h, w = a.shape
        out, inter = self.attention(a.flatten(2).transpose(1, 2), prev_logits=prev_logits,
                                    need_logits=need_logits and not need_intermediates,
                                    need_intermediates=need_intermediates)
        out = out.transpose(1, 2).reshape(b, self.value_depth, h, w)
        if self.pool:
            out = F.interpolate(out, size=conv.shape[-2:], mode="bilinear", align_corners=False)
        return torch.cat([conv, out], dim=1), inter

    def madds(self, cells: int) -> int:
        """``cells``: the output map's pixels; the attention runs over :attr:`grid`."""
        return cells * self.conv.weight.numel() + self.attention.madds(self.grid[0] * self.grid[1],
                                                                       self.grid[0] * self.grid[1])


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False)


class ResidualBlock(nn.Module):
    """He et al.'s basic block (two 3 x 3) or bottleneck (1 x 1, 3 x 3 strided as in v1.5, 1 x 1 to 4x), each
    convolution followed by batch normalisation, the shortcut a strided 1 x 1 + BN where the shape changes; the
    augmented convolution (``augment``: :class:`AugmentedConv`'s keywords) replaces the block's 3 x 3 that AA
    augments."""

    def __init__(self, kind: str, in_ch: int, width: int, stride: int, grids: tuple[tuple[int, int], tuple[int, int]],
                 augment: Optional[dict[str, Any]]) -> None:
        """``grids``: the block's input and output maps."""
        super().__init__()
        out_ch = width * EXPANSION[kind]
        self.kind, (self.in_grid, self.grid) = kind, grids
        if kind == "basic":
            convs: list[nn.Module] = [_conv(in_ch, width, 3, stride), _conv(width, width, 3)]
            aa_index, aa_in, aa_stride = 1, width, 1
        else:
            convs = [_conv(in_ch, width, 1), _conv(width, width, 3, stride), _conv(width, out_ch, 1)]
            aa_index, aa_in, aa_stride = 1, width, stride
        self.aa_index = aa_index if augment is not None else None
        if augment is not None:
            convs[aa_index] = AugmentedConv(aa_in, width, aa_stride, **augment)
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList(nn.BatchNorm2d(conv_out(c)) for c in convs)
        self.shortcut = (nn.Sequential(_conv(in_ch, out_ch, 1, stride), nn.BatchNorm2d(out_ch))
                         if stride != 1 or in_ch != out_ch else None)
        # He et al.'s initialisation of the ResNet's own convolutions (the attention and a PA mixer keep theirs)
        plain = [c.conv if isinstance(c, AugmentedConv) else c for c in convs]
        for conv in plain + ([self.shortcut[0]] if self.shortcut is not None else []):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.norms[-1].weight)  # each block starts as the identity (Goyal et al. 2017)

    def forward(self, x: Tensor, prev_logits: Optional[Tensor], need_logits: bool, need_intermediates: bool
                ) -> tuple[Tensor, Any]:
        out, inter = x, None
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            if i == self.aa_index:
                out, inter = conv(out, prev_logits, need_logits, need_intermediates)
            else:
                out = conv(out)
            out = norm(out)
            if i + 1 < len(self.convs):
                out = F.relu(out)
        identity = x if self.shortcut is None else self.shortcut(x)
        return F.relu(out + identity), inter

    def madds(self) -> int:
        """Every convolution at its output map (a bottleneck's first 1 x 1 at the input's), the attention, the
        shortcut."""
        cells = self.grid[0] * self.grid[1]
        total = 0
        for i, conv in enumerate(self.convs):
            here = self.in_grid[0] * self.in_grid[1] if self.kind == "bottleneck" and i == 0 else cells
            total += conv.madds(here) if isinstance(conv, AugmentedConv) else here * conv.weight.numel()
        if self.shortcut is not None:
            total += cells * self.shortcut[0].weight.numel()
        return total


def conv_out(conv: nn.Module) -> int:
    """Output channels of a block's convolution (an augmented one: the convolution's and the attention's)."""
    return conv.conv.out_channels + conv.value_depth if isinstance(conv, AugmentedConv) else conv.out_channels


class AAResNet(nn.Module, PretrainedMixin):
    """Pixel normalisation -> stem -> the stages' residual blocks (augmented where the config says) -> global
    average pooling -> a linear head. ``forward`` returns the core's :class:`ClassifierOutput`: ``encoder.hidden``
    is the last map as ``(B, pixels, channels)`` tokens, ``encoder.states`` every block's, and with
    ``need_intermediates`` ``encoder.attentions`` holds every augmented layer's attention (in chain order)."""

    model_type = MODEL_TYPE

    def __init__(self, cfg: AAResNetConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.norm = PixelNorm(cfg.pixel_mean, cfg.pixel_std)
        small = cfg.stem == "small"
        self.stem_conv = _conv(cfg.channels, cfg.stem_width, 3 if small else 7, 1 if small else 2)
        self.stem_norm = nn.BatchNorm2d(cfg.stem_width)
        self.stem_pool = not small
        grids = cfg.stage_grids()
        mixer_cfg = cfg.mixer_config() if cfg.predictive is not None else None
        nn.init.kaiming_normal_(self.stem_conv.weight, mode="fan_out", nonlinearity="relu")
        blocks, in_ch, chain, in_grid = [], cfg.stem_width, 0, grids[0]
        self.block_grids: list[Optional[tuple[int, int]]] = []  # each block's attention grid (None: no attention)
        for stage, (count, width) in enumerate(zip(cfg.layers, cfg.widths)):
            key_depth, value_depth = cfg.depths(stage)
            for i in range(count):
                augment = None
                if cfg.augmented[stage]:
                    mixer = (make_mixer(cfg.predictive, cfg.heads, mixer_cfg)
                             if mixer_cfg is not None and chain > 0 else None)
                    augment = dict(grid=cfg.attention_grid(stage), heads=cfg.heads, key_depth=key_depth,
                                   value_depth=value_depth, relative=cfg.relative, pool=cfg.attention_pool[stage],
                                   logit_mixer=mixer)
                    chain += 1
                stride = 2 if stage and i == 0 else 1
                blocks.append(ResidualBlock(cfg.block, in_ch, width, stride, (in_grid, grids[stage]), augment))
                in_grid = grids[stage]
                self.block_grids.append(augment["grid"] if augment is not None else None)
                in_ch = width * EXPANSION[cfg.block]
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(in_ch, cfg.num_classes)
        # whether the next augmented block mixes in block i's logits (PA on, the chain not restarted between them)
        augmented = [i for i, grid in enumerate(self.block_grids) if grid is not None]
        following = dict(zip(augmented, augmented[1:]))
        self.logits_wanted = [cfg.predictive is not None and i in following and (
            cfg.map_resize == "area" or self.block_grids[following[i]] == self.block_grids[i])
            for i in range(len(blocks))]
        track_ties(self)

    def forward(self, images: Optional[Tensor] = None, *, pixel_values: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_intermediates: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False,
                return_dict: Optional[bool] = None) -> Union[ClassifierOutput, tuple[Tensor, ...]]:
        """``images`` or HF's ``pixel_values`` ``(B, channels, image_height, image_width)``, uint8 or in [0, 1];
        ``labels`` (B,) give ``output.loss``; ``return_dict=False`` returns the output's tuple."""
        x = self.norm(image_input(self.config, images, pixel_values))
        x = F.relu(self.stem_norm(self.stem_conv(x)))
        if self.stem_pool:
            x = F.max_pool2d(x, 3, 2, 1)
        need_intermediates = need_intermediates or output_attentions
        embedded = x.flatten(2).transpose(1, 2)
        states, attentions = [], []
        prev, prev_grid = None, None
        for index, (block, grid) in enumerate(zip(self.blocks, self.block_grids)):
            given = None
            if grid is not None and prev is not None:
                given = prev if prev_grid == grid else (
                    resize_maps(prev, prev_grid, grid) if self.config.map_resize == "area" else None)
            x, inter = block(x, given, self.logits_wanted[index], need_intermediates)
            if grid is not None:
                prev, prev_grid = (inter.logits if inter is not None else None), grid
                attentions.append(inter)
            states.append(x.flatten(2).transpose(1, 2))
        hidden = states[-1]
        pooled = hidden.mean(dim=1)
        enc = EncoderOutput(hidden=hidden, padding_mask=None, states=states, mids=states,
                            attentions=attentions if need_intermediates else [], embedded=embedded)
        out = ClassifierOutput(logits=self.head(pooled), encoder=enc, pooled=pooled)
        out = out.with_hf_extras(labels, output_hidden_states, output_attentions, self.training)
        return out.to_tuple() if return_dict is False else out

    def madds(self, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
        """Multiply-adds for one image (convolutions, the attention's products and relative logits, PA's CNN, the
        head; normalisation and pooling are not counted). ``src_len``, if given, must be ``config.tokens``."""
        cfg = self.config
        if src_len is not None and src_len != cfg.tokens:
            raise ValueError(f"this AA-ResNet reads {cfg.tokens} pixels; got src_len={src_len}")
        stride = self.stem_conv.stride[0]
        cells = ((cfg.image_height - 1) // stride + 1) * ((cfg.image_width - 1) // stride + 1)
        stem = cells * self.stem_conv.weight.numel()
        return stem + sum(block.madds() for block in self.blocks) + self.head.weight.numel()


# ----------------------------------------------------------------------------------------------------------------
# Presets. The ImageNet networks as AA Sec. 4.2 builds them (224 x 224; the last three stages augmented, the
# 28 x 28 stage's attention pooled to 14 x 14, N_h = 8, kappa = 2 upsilon = 0.2, ResNet-34 kappa = upsilon = 0.25).
# The CPU preset for 28 x 28 grey images: He et al.'s small-image stem (one 3 x 3 convolution, 16 channels) and
# three stages of two basic blocks, 16 / 32 / 64 wide at 28 / 14 / 7, the last two augmented (14 x 14 and 7 x 7: the
# analogue of ImageNet's last stages), the 14 x 14 stage's attention pooled to 7 x 7 as AA pools its largest (its
# 196 x 196 maps cost 4x the step of the whole network on 2 CPU cores), 4 heads, kappa = 0.5 and upsilon = 0.25 (at
# these widths AA's 0.2 / 0.1 would leave one or two channels per head; docs/vision-backbones.md).
AA_IMAGENET: dict[str, Any] = dict(block="bottleneck", layers=[3, 4, 6, 3])
AA_FASHION_MNIST: dict[str, Any] = dict(
    image_height=28, image_width=28, channels=1, pixel_mean=[0.0], pixel_std=[1.0], num_classes=10, block="basic",
    layers=[2, 2, 2], widths=[16, 32, 64], stem="small", stem_width=16, augmented=[False, True, True],
    attention_pool=[False, True, False], heads=4, kappa=0.5, upsilon=0.25)
AA_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "aa_resnet34": ("AA-ResNet-34 (AA Sec. 4.2, PA Table 4): basic blocks 3-4-6-3, the last 3 stages augmented, "
                    "8 heads, kappa = upsilon = 0.25", dict(AA_IMAGENET, block="basic", kappa=0.25, upsilon=0.25)),
    "aa_resnet50": ("AA-ResNet-50 (AA Sec. 4.2, PA Table 4): bottlenecks 3-4-6-3, the last 3 stages augmented, "
                    "8 heads, kappa = 0.2, upsilon = 0.1", dict(AA_IMAGENET)),
    "aa_resnet101": ("AA-ResNet-101 (AA Sec. 4.2, PA Table 4): bottlenecks 3-4-23-3, as AA-ResNet-50",
                     dict(AA_IMAGENET, layers=[3, 4, 23, 3])),
    "aa_resnet_fashion_mnist": (
        "AA-ResNet for 28x28 grey images: 3x3 stem, basic blocks 2-2-2 at 16/32/64 channels, the 14x14 (attention "
        "pooled to 7x7) and 7x7 stages augmented, 4 heads, kappa 0.5, upsilon 0.25", dict(AA_FASHION_MNIST)),
}

register_family(Family(
    name=MODEL_TYPE, title="Attention-augmented ResNets", tasks="image, fashion_mnist", config_class=AAResNetConfig,
    from_dict=_from_dict, override=_override, build=AAResNet,
    madds=lambda name, model, length: count_madds(model), madds_unit="MAdds per image", rank=4,
    model_types=(MODEL_TYPE,), claims=lambda data: data.get("model_type") == MODEL_TYPE,
    method_slots=MethodSlots("AA-ResNet", at=None)))  # PA on AA-ResNets: the pa_* presets
register_presets(MODEL_TYPE, AA_PRESETS)
