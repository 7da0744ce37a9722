"""Image classifiers on the interlayer core: a small vision Transformer and the PA paper's Conv-Transformer.

Both models end in the core's :class:`~interlayer.core.models.EncoderClassifier`, fed through ``inputs_embeds``,
whose configuration is an ordinary :class:`~interlayer.config.ModelConfig` nested in :class:`VisionConfig`. So
every method section (``crossformer``, ``multipass``, ``predictive``, ``conv_branch``, ``lightweight``) applies to
the image encoder exactly as to a text encoder, through the same ``--set predictive.alpha=0.01`` overrides.

**ViT** (``backbone="vit"``; Dosovitskiy et al. 2021): non-overlapping ``p x p`` patches, linearly embedded
(a stride-``p`` convolution), an optional CLS token (encoder ``pooling="cls"``; ``"mean"`` pools all patch tokens
and adds no CLS), learned absolute positions or the 2-D relative positions of PA Eq. 3 (encoder
``positions="relative_2d"``; the CLS token gets zero bias), then the encoder and a linear head.

**Conv-Transformer** (``backbone="conv_transformer"``; PA Sec. 3.5 and 4.2.1, App. B.1/B.3.1). The paper's CIFAR
backbone is a stack of blocks with "64 filters at the beginning"; "for every 3 blocks, we reduce the image size
via a 2 x 2 average pooling layer and double the hidden size"; self-attention is used only "after the image size
is reduced to 8 x 8" (the memory is exhaustive at 32 x 32); a global average pooling feeds the classifier. Each
block is the text model's block with 3 x 3 kernels: a mixing sublayer, then two position-wise feed-forward layers
with a 4x bottleneck (Eq. 6). Our small-scale version for 28 x 28 inputs:

* a 3 x 3 stem convolution to ``stage_widths[0]`` channels ("64 filters at the beginning");
* one *CNN stage* per entry of ``stage_widths``, ``stage_blocks`` blocks each, whose mixing sublayer is a 3 x 3
  convolution + ReLU (the CNN row of Table 3 uses that block everywhere); each stage ends with a 2 x 2 average
  pooling and a 1 x 1 convolution to the next width (DenseNet's transition layer: the paper's network has
  "dense connections ... like DenseNet", App. B.3.1);
* the last stage is the core encoder at ``28 / 2^len(stage_widths)`` (7 x 7 for two stages, the analogue of the
  paper's 8 x 8) with ``conv_branch`` (half 4-head self-attention with 2-D relative positions, half 3 x 3
  convolution, App. B.1) and, for PA-Conv-Transformer, ``predictive`` with ``alpha = 0.01`` (Sec. 4.2.1);
* encoder ``pooling="mean"``: the global average pooling.

``attention=False`` turns the last stage into CNN blocks too: the CNN baseline of Table 3.

Readings where the paper is silent or does not fit a CPU budget, each a config field: the widths double per stage
as in the paper, but start at 16 (``stage_widths=[16, 32]``, encoder ``d_model=64``) instead of 64; the CNN stages
have ``stage_blocks=1`` block instead of 3 (the 28 x 28 convolutions dominate the cost), the attention stage keeps
3 (``enc_layers``); the DenseNet-style dense connections inside a stage are replaced by the core's residual
connections (the paper gives neither a growth rate nor how dense connections meet the attention blocks); the CNN
blocks use the encoder's normalisation order, dropout and activation, so one setting governs the whole network.

Pixels are normalised inside the model with ``pixel_mean``/``pixel_std`` (the training split's statistics, filled
in by the task), so a saved model scores raw images without any other asset. Inputs are ``(B, C, H, W)`` uint8
(0..255) or floats in ``[0, 1]``.

``input_size`` lets a model read images of another shape than its own: a pretrained ViT (224 x 224 RGB, say,
:mod:`interlayer.pretrained`) fine-tuned on 28 x 28 grey Fashion-MNIST. Grey images are repeated to the model's
channels and every image is resized bilinearly (``align_corners=False``, antialiased when shrinking, as PIL's
bilinear resampling that ``transformers``' image processors use) before the normalisation, which stays the
model's own (its pretraining statistics).
"""
from __future__ import annotations

import copy
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds
from ..build import build_model
from ..config import ModelConfig, is_section
from ..config_io import ConfigFile, MethodSlots, dataclass_from_dict, set_dotted
from ..core.components import Components
from ..core.feedforward import FeedForward
from ..core.hub import PretrainedMixin, track_ties
from ..core.layers import EncoderLayer
from ..core.models import ClassifierOutput, EncoderClassifier
from ..core.outputs import one_of
from ..errors import ConfigError
from ..methods.conv_branch import TokenConv, check_kernel
from .image_input import PixelNorm, check_pixels
from .registry import Family, register_family, register_presets

Backbone = Literal["vit", "conv_transformer"]
BACKBONES: tuple[str, ...] = typing.get_args(Backbone)
# Encoder fields that the image geometry decides; setting them by hand could only contradict it.
DERIVED_ENCODER_FIELDS = ("grid_height", "grid_width", "max_positions")


def _default_encoder() -> ModelConfig:
    return ModelConfig(arch="encoder_classifier", src_vocab_size=1, num_classes=10)


@dataclass
class VisionConfig(ConfigFile):
    """An image model: the input geometry, the backbone's own settings, and the encoder's ``ModelConfig``.

    The field names are disjoint from :class:`ModelConfig`'s, so a flat override such as ``d_model=64`` or
    ``patch_size=7`` reaches the right place (``encoder.KEY`` also works).
    """

    # The options that size the saved tensors of every backbone (checkpoint.py's size check); the input's geometry
    # and each backbone's own settings are no such size
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"channels"})

    backbone: Backbone = "vit"
    image_height: int = 28
    image_width: int = 28
    channels: int = 1
    pixel_mean: list[float] = field(default_factory=lambda: [0.0])  # per channel, in [0, 1] pixel units
    pixel_std: list[float] = field(default_factory=lambda: [1.0])
    patch_size: int = 4  # vit: 28 x 28 -> a 7 x 7 grid of 4 x 4 patches
    stage_widths: list[int] = field(default_factory=lambda: [32, 64])  # conv_transformer: the CNN stages
    stage_blocks: int = 3  # conv_transformer: blocks per CNN stage ("for every 3 blocks", Sec. 4.2.1)
    conv_kernel: int = 3  # conv_transformer: the CNN blocks' kernel (3 x 3, Sec. 3.5)
    attention: bool = True  # conv_transformer: False makes the last stage CNN blocks too (Table 3's CNN)
    # [channels, height, width] of the images the model is given when they differ from its own (grey repeated to
    # ``channels``, then resized to image_height x image_width); empty: the images have the model's shape
    input_size: list[int] = field(default_factory=list)
    encoder: ModelConfig = field(default_factory=_default_encoder)

    @property
    def model_type(self) -> str:
        return self.backbone

    @property
    def down_sampling(self) -> int:
        """How much smaller (per side) the encoder's token grid is than the image."""
        return self.patch_size if self.backbone == "vit" else 2 ** len(self.stage_widths)

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_height // self.down_sampling, self.image_width // self.down_sampling

    @property
    def num_classes(self) -> int:
        """The encoder's classes (what every image model's config says as ``num_classes``)."""
        return self.encoder.num_classes

    @property
    def has_cls_token(self) -> bool:
        return self.backbone == "vit" and self.encoder.pooling == "cls"

    @property
    def tokens(self) -> int:
        """Sequence length the encoder runs on (grid cells, plus the CLS token)."""
        return self.grid[0] * self.grid[1] + int(self.has_cls_token)

    def derive_geometry(self) -> None:
        """Set the encoder's token grid and position count from the image size and the down-sampling."""
        self.encoder.grid_height, self.encoder.grid_width = self.grid
        self.encoder.max_positions = self.tokens

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first setting that cannot work, naming the key (``backbone`` is
        checked by its ``Literal`` type when the config is read)."""
        check_pixels(self)
        if self.input_size and (len(self.input_size) != 3 or min(self.input_size) < 1
                                or self.input_size[0] not in (1, self.channels)):
            raise ConfigError(f"input_size={self.input_size} must be [channels, height, width] of positive sizes with "
                              f"1 (grey, repeated) or channels={self.channels} channels; [] for images of the "
                              "model's own shape")
        self._validate_backbone()
        self._validate_encoder()

    def _validate_backbone(self) -> None:
        if self.backbone == "vit":
            if self.patch_size < 1 or self.image_height % self.patch_size or self.image_width % self.patch_size:
                valid = [p for p in range(1, min(self.image_height, self.image_width) + 1)
                         if self.image_height % p == 0 and self.image_width % p == 0]
                raise ConfigError(f"patch_size={self.patch_size} must divide the image size "
                                  f"{self.image_height}x{self.image_width}; valid: {valid}")
            return
        if any(w < 1 for w in self.stage_widths):
            raise ConfigError(f"stage_widths={self.stage_widths} must be positive channel counts")
        if self.stage_blocks < 1:
            raise ConfigError(f"stage_blocks={self.stage_blocks} must be at least 1")
        check_kernel("conv_kernel", self.conv_kernel)
        step = self.down_sampling
        if self.image_height % step or self.image_width % step:
            raise ConfigError(f"stage_widths={self.stage_widths} halves the image {len(self.stage_widths)} times, "
                              f"which needs a size divisible by {step}; got {self.image_height}x{self.image_width}"
                              f" (use fewer stages)")
        if self.encoder.pooling != "mean":
            raise ConfigError("backbone='conv_transformer' ends in a global average pooling (PA Sec. 4.2.1) and "
                              f"has no CLS token: set pooling='mean', got pooling={self.encoder.pooling!r}")
        if not self.attention and self.encoder.sections():
            names = ", ".join(method.name for method, _ in self.encoder.sections())
            raise ConfigError(f"attention=False builds the CNN baseline (no attention in any block), but the "
                              f"sections {names} act on attention; remove them or set attention=true")

    def _validate_encoder(self) -> None:
        enc = self.encoder
        if enc.arch != "encoder_classifier":
            raise ConfigError(f"arch={enc.arch!r}: an image model classifies; use arch='encoder_classifier'")
        if enc.n_segments:
            raise ConfigError(f"n_segments={enc.n_segments}: images have no segments; set n_segments=0")
        if (enc.grid_height, enc.grid_width) != self.grid:
            raise ConfigError(f"grid_height x grid_width = {enc.grid_height}x{enc.grid_width} but the "
                              f"{self.image_height}x{self.image_width} image down-sampled by {self.down_sampling} "
                              f"gives {self.grid[0]}x{self.grid[1]}; these fields are derived, leave them unset")
        if enc.max_positions < self.tokens:
            raise ConfigError(f"max_positions={enc.max_positions} is smaller than the {self.tokens} tokens "
                              "the encoder reads")
        enc.validate()



VISION_FIELDS = tuple(f.name for f in fields(VisionConfig) if f.name != "encoder")


# ----------------------------------------------------------------------------------------------------------------
# Presets and overrides
# The ViT baseline, sized for the bar "at least 88% on the full Fashion-MNIST test set within 20 minutes on 2 CPU
# cores" (docs/classification-image.md has the timings): 7 x 7 patches of 4 x 4, d=64, 4 heads, 4 pre-LN layers,
# GELU, FFN 2x, learned positions, a CLS token; no dropout (0.14M parameters against 54k images, a 12-epoch
# budget and label smoothing already regularise, and dropout costs about a fifth of the step time on CPU). The
# papers' image models over it and over the Conv-Transformer stages are in interlayer.papers (predictive,
# lightweight).
VIT_ENCODER: dict[str, Any] = dict(arch="encoder_classifier", src_vocab_size=1, num_classes=10, d_model=64,
                                   n_heads=4, d_ffn=128, enc_layers=4, norm_first=True, activation="gelu",
                                   positions="learned", pooling="cls", dropout=0.0)
VIT: dict[str, Any] = dict(backbone="vit", patch_size=4, encoder=VIT_ENCODER)


def with_encoder(base: dict[str, Any], **encoder: Any) -> dict[str, Any]:
    """An image preset's fields with ``encoder`` fields (a method section, a depth) set over ``base``'s."""
    return dict(base, encoder=dict(base["encoder"], **encoder))


VISION_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "vit_fashion_mnist": (
        "ViT baseline for 28x28 grey images: 4x4 patches, d=64, 4 heads, 4 pre-LN layers, FFN 128, CLS token", VIT),
}


def _apply(data: dict[str, Any], overrides: dict[str, Any]) -> VisionConfig:
    """``data`` with ``overrides`` set (a key the vision config lacks reaches the encoder: ``d_model``,
    ``predictive.alpha``; or name it: ``encoder.d_model``), the geometry derived, validated."""
    for key in overrides:
        name = key[len("encoder."):] if key.startswith("encoder.") else key
        if name.partition(".")[0] in DERIVED_ENCODER_FIELDS:
            raise ConfigError(f"{key} is derived from the image size and the down-sampling (patch_size or "
                              "stage_widths) and cannot be set")
    data = set_dotted(copy.deepcopy(data), overrides, is_section=is_section, nested=("encoder",),
                      aliases=ModelConfig.FIELD_ALIASES, implied=ModelConfig.FIELD_IMPLIED)
    cfg = dataclass_from_dict(VisionConfig, data)
    cfg.derive_geometry()  # the encoder's pooling decides whether a CLS token adds a position
    cfg.validate()
    return cfg


def _from_dict(data: dict[str, Any], source: str) -> VisionConfig:
    """A preset's, file's or dict's config with its geometry derived; errors prefixed with ``source``."""
    try:
        return _apply(data, {})
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


# ----------------------------------------------------------------------------------------------------------------
# Modules
class ConvMixer(nn.Module):
    """A ``k x k`` convolution + ReLU over the token grid in the place of self-attention: the CNN block.

    Follows the core attention protocol (so it sits in a core :class:`EncoderLayer`) and never produces logits.
    """

    wants_prev_logits = False

    def __init__(self, width: int, kernel_size: int, grid: tuple[int, int], bias: bool) -> None:
        super().__init__()
        self.conv = TokenConv(width, width, kernel_size, grid=grid, bias=bias)

    def forward(self, x: Tensor, memory: Optional[Tensor] = None, *, key_padding_mask: Optional[Tensor] = None,
                causal: bool = False, prev_logits: Optional[Tensor] = None, need_intermediates: bool = False,
                cache: Optional[Any] = None) -> tuple[Tensor, None]:
        return F.relu(self.conv(x, key_padding_mask)), None

    def madds(self, t_q: int, t_k: int) -> int:
        return self.conv.madds(t_q)


class ConvStage(nn.Module):
    """``blocks`` CNN blocks at one resolution, then (if ``out_width``) 2 x 2 average pooling + 1 x 1 conv."""

    def __init__(self, encoder_cfg: ModelConfig, width: int, blocks: int, grid: tuple[int, int], kernel_size: int,
                 out_width: Optional[int]) -> None:
        super().__init__()
        self.grid = grid
        self.blocks = nn.ModuleList(
            EncoderLayer(ConvMixer(width, kernel_size, grid, encoder_cfg.bias),
                         FeedForward(width, 4 * width, activation=encoder_cfg.activation,
                                     act_dropout=encoder_cfg.act_dropout, bias=encoder_cfg.bias),
                         width, dropout=encoder_cfg.dropout, norm_first=encoder_cfg.norm_first,
                         eps=encoder_cfg.layer_norm_eps)
            for _ in range(blocks))
        self.transition = nn.Conv2d(width, out_width, 1, bias=encoder_cfg.bias) if out_width else None

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (B, C, H, W) -> (B, C', H/2, W/2), or (B, C, H, W) when the stage has no transition."""
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        for block in self.blocks:
            tokens = block(tokens).hidden
        x = tokens.transpose(1, 2).reshape(b, c, h, w)
        if self.transition is None:
            return x
        return self.transition(F.avg_pool2d(x, 2))

    def madds(self) -> int:
        cells = self.grid[0] * self.grid[1]
        total = sum(block.madds(cells) for block in self.blocks)
        if self.transition is not None:
            total += cells // 4 * self.transition.weight.numel()
        return total


def build_encoder_classifier(cfg: ModelConfig, mixer_factory: Optional[Callable[[str, int], nn.Module]] = None
                             ) -> EncoderClassifier:
    """The core classifier without a token table (it reads ``inputs_embeds``).

    ``mixer_factory(side, i)``, if given, replaces the default self-attention before the methods customise the
    factories (the CNN baseline's convolution blocks).
    """
    def base(components: Components) -> None:
        if mixer_factory is not None:
            components.self_attention = mixer_factory

    return build_model(cfg, with_tokens=False, base=base)


class PatchEmbedding(nn.Module):
    """ViT input: ``p x p`` patches linearly embedded (a stride-``p`` conv), raster order, optional CLS first."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        d_model = cfg.encoder.d_model
        self.cells = cfg.grid[0] * cfg.grid[1]
        self.proj = nn.Conv2d(cfg.channels, d_model, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.empty(1, 1, d_model)) if cfg.has_cls_token else None
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        if self.cls_token is None:
            return tokens
        return torch.cat([self.cls_token.expand(len(tokens), -1, -1), tokens], dim=1)

    def madds(self) -> int:
        return self.cells * self.proj.weight.numel()


class ConvStem(nn.Module):
    """Conv-Transformer input: stem conv, then the CNN stages, each halving the resolution (PA Sec. 4.2.1)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        enc = cfg.encoder
        widths = list(cfg.stage_widths) + [enc.d_model]
        self.pixels = cfg.image_height * cfg.image_width
        self.stem = nn.Conv2d(cfg.channels, widths[0], cfg.conv_kernel, padding=cfg.conv_kernel // 2,
                              bias=enc.bias)
        height, width = cfg.image_height, cfg.image_width
        stages = []
        for channels, out in zip(widths[:-1], widths[1:]):
            stages.append(ConvStage(enc, channels, cfg.stage_blocks, (height, width), cfg.conv_kernel, out))
            height, width = height // 2, width // 2
        self.stages = nn.ModuleList(stages)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return x.flatten(2).transpose(1, 2)

    def madds(self) -> int:
        return self.pixels * self.stem.weight.numel() + sum(stage.madds() for stage in self.stages)


class ImageClassifier(nn.Module, PretrainedMixin):
    """Pixel normalisation -> ``embed`` (patches or CNN stages) -> the core :class:`EncoderClassifier`.

    ``forward(images)`` returns the core's :class:`ClassifierOutput` (``logits``, ``exit_logits``,
    ``aux_losses``, ``encoder`` with its intermediates), so training losses and analyses work unchanged.
    """

    main_input_name = "pixel_values"  # what transformers.Trainer counts FLOPs by

    def __init__(self, cfg: VisionConfig, embed: nn.Module, classifier: EncoderClassifier) -> None:
        super().__init__()
        self.config = cfg
        self.model_type = cfg.model_type
        self.norm = PixelNorm(cfg.pixel_mean, cfg.pixel_std)
        self.embed = embed
        self.classifier = classifier
        track_ties(self)  # each tied tensor once in state dicts

    @property
    def encoder(self) -> nn.Module:
        """The core encoder (``model.encoder.exit_pass = 1`` etc. work as on text models)."""
        return self.classifier.encoder

    def forward(self, images: Optional[Tensor] = None, *, pixel_values: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_intermediates: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False,
                return_dict: Optional[bool] = None) -> Union[ClassifierOutput, tuple[Tensor, ...]]:
        """``images`` or HF's ``pixel_values`` (B, C, H, W), normalised here (``config.pixel_mean``/``std``: pass
        pixels in [0, 1], not an image processor's normalised output); ``labels`` (B,) give ``output.loss``;
        ``return_dict=False`` returns the output's tuple."""
        images = one_of(images, pixel_values, "images", "pixel_values")
        cfg = self.config
        expected = tuple(cfg.input_size) or (cfg.channels, cfg.image_height, cfg.image_width)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"expected images of shape (B, {', '.join(map(str, expected))}), got "
                             f"{tuple(images.shape)}")
        return self.classifier(inputs_embeds=self.embed(self.norm(self.adapt(images))), labels=labels,
                               need_intermediates=need_intermediates, output_hidden_states=output_hidden_states,
                               output_attentions=output_attentions, return_dict=return_dict)

    def adapt(self, images: Tensor) -> Tensor:
        """Images of ``input_size`` as the model's own shape, in [0, 1] (see the module docstring)."""
        cfg = self.config
        if not cfg.input_size:
            return images
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        x = x.expand(-1, cfg.channels, -1, -1)
        size = (cfg.image_height, cfg.image_width)
        if tuple(x.shape[2:]) == size:
            return x
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)

    def madds(self, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
        """Multiply-adds for one image. The sequence length is fixed by the image size: ``src_len``, if given
        (``count_madds(model, n)``), must be the encoder's token count ``config.tokens``."""
        if src_len is not None and src_len != self.config.tokens:
            raise ValueError(f"this image model's encoder always reads {self.config.tokens} tokens; got "
                             f"src_len={src_len}")
        return self.embed.madds() + self.classifier.madds(self.config.tokens)


def build_vision_model(cfg: VisionConfig) -> ImageClassifier:
    """A ViT or a (PA-)Conv-Transformer / CNN from its validated config."""
    cfg.validate()
    enc = cfg.encoder
    if cfg.backbone == "vit":
        return ImageClassifier(cfg, PatchEmbedding(cfg), build_encoder_classifier(enc))
    mixer_factory = None
    if not cfg.attention:
        def mixer_factory(side: str, index: int) -> nn.Module:
            return ConvMixer(enc.d_model, cfg.conv_kernel, cfg.grid, enc.bias)
    return ImageClassifier(cfg, ConvStem(cfg), build_encoder_classifier(enc, mixer_factory))


register_family(Family(
    name="image", title="Image models", tasks="fashion_mnist", config_class=VisionConfig, from_dict=_from_dict,
    override=lambda cfg, overrides: _apply(cfg.to_dict(), overrides), build=build_vision_model,
    madds=lambda name, model, length: count_madds(model, model.config.tokens), madds_unit="MAdds per image",
    rank=2, model_types=BACKBONES, claims=lambda data: "backbone" in data or "encoder" in data,
    method_slots=MethodSlots("image model", at="encoder")))
register_presets("image", VISION_PRESETS)
