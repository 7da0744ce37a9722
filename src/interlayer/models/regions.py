"""Transformers over image regions: the captioner and the referring-expression grounder of LW-Transformer's image
captioning and REC experiments (Luo et al., Sec. IV-A to IV-C: "the Transformer networks proposed in [1], [2]",
an encoder-decoder of d 512, FFN 2,048, 8 heads, 6 + 6 layers over bottom-up region features).

Both are built on the core, whose configuration is an ordinary :class:`~interlayer.config.ModelConfig` nested in
:class:`RegionConfig` under ``transformer``, so every method section (``lightweight``, ``crossformer``,
``predictive``, ...) reaches them through the core's factories, as on a text model, with the same ``--set
crossformer.hard=kq`` overrides (a key the region config lacks goes to ``transformer``).

* **Regions** (:class:`RegionEmbedding`): a region is its detector feature and its box, ``(x1/W, y1/H, x2/W, y2/H,
  area/(W H))``. Each is projected to ``d_model`` and layer-normed, and the two are averaged, then dropout: the
  object embedding of LXMERT (Tan & Bansal 2019, Sec. 2.1), the usual way a Transformer reads a detector's boxes.
  The regions are a set: no position is added to them.
* **Captioner** (``head="caption"``): the core encoder over the region embeddings (no token table, no positions),
  the core decoder over the words (causal, the token table tied to the output, sinusoidal positions), reading the
  encoder's output by cross-attention. ``encode`` / ``decoder`` are what the decoding (greedy, sampling, beam
  search: :mod:`interlayer.tasks.caption_decoding`) drives, as for translation.
* **Grounder** (``head="rec"``): the core encoder over the expression's words, then a stack of core decoder layers
  over the regions, non-causal (``causal_decoder=False``: self-attention among the regions, cross-attention to the
  expression, FFN; MCAN's SGA blocks, which the LW paper's baseline [2] is), then per region a score and a box
  offset (``box_regression``; DDPN's and MAttNet's region-based REC: the region that best overlaps the referred
  box is the class, the offset corrects its box, parameterised as Faster R-CNN's ``(dx, dy, dw, dh)``).

Method sides: the captioner's ``encoder`` side is the region stack and its ``decoder`` the word stack; the
grounder's ``encoder`` is the expression and its ``decoder`` the region stack. Predictive Attention's 3 x 3
convolution over a region stack's attention map mixes regions that are neighbours in the region order, which the
generated scenes give in raster order of the box centres (:mod:`interlayer.data.scenes`) and the COCO readers sort
the same way (:mod:`interlayer.data.caption_formats`); see docs/captioning.md.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Optional

import torch
from torch import Tensor, nn

from ..accounting import count_madds
from ..config import ModelConfig, is_section
from ..config_io import ConfigFile, MethodSlots, check_choices, dataclass_from_dict, set_dotted
from ..core.components import Components
from ..core.decoder import Decoder, decoder_layers, run_decoder_layers
from ..core.embedding import make_token_embedding
from ..core.encoder import Encoder, EncoderOutput
from ..core.hub import PretrainedMixin, track_ties
from ..core.models import AuxLossFn, Seq2SeqOutput
from ..errors import ConfigError
from .registry import Family, register_family, register_presets

Head = Literal["caption", "rec"]
BOX_FEATURES = 5  # x1/W, y1/H, x2/W, y2/H, area/(W H)
MODEL_TYPES = {"caption": "captioner", "rec": "grounder"}
# Core fields the head decides; setting them by hand could only contradict it.
DERIVED_FIELDS = ("arch", "causal_decoder", "share_embeddings")


def _default_transformer() -> ModelConfig:
    return ModelConfig(arch="encoder_decoder", src_vocab_size=10000)


@dataclass
class RegionConfig(ConfigFile):
    """A captioner or grounder: the region inputs, the text lengths, and the Transformer's ``ModelConfig``.

    ``feature_dim``: a region feature's width (2048 for bottom-up attention). ``max_regions``: the regions MAdds are
    counted at (and the most a batch may give). ``max_words``: the longest caption generated (without BOS / EOS) or
    expression read. ``transformer.src_vocab_size`` is the word vocabulary, which the task fills in.
    """

    UNMEASURED_FIELDS: ClassVar[tuple[str, ...]] = ("max_regions", "max_words")
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"feature_dim"})  # the region projection's input width

    head: Head = "caption"
    feature_dim: int = 2048
    max_regions: int = 100
    max_words: int = 20
    box_regression: bool = True  # rec: regress a box offset from the chosen region's box
    transformer: ModelConfig = field(default_factory=_default_transformer)

    @property
    def model_type(self) -> str:
        return MODEL_TYPES[self.head]

    def derive(self) -> None:
        """The core fields the head decides: an encoder-decoder, causal for captions and over a set for REC."""
        self.transformer.arch = "encoder_decoder"
        self.transformer.causal_decoder = self.head == "caption"
        self.transformer.share_embeddings = False

    def validate(self) -> None:
        check_choices(self, "")
        for key in ("feature_dim", "max_regions", "max_words"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        core = self.transformer
        needed = self.max_words + 2  # BOS ... EOS
        if core.max_positions < needed:
            raise ConfigError(f"max_positions={core.max_positions} is less than max_words + 2 = {needed} (the text "
                              "with BOS and EOS); raise max_positions or lower max_words")
        if core.positions == "relative_2d":
            raise ConfigError("positions='relative_2d' is for image grids; regions have boxes, and the text 1-D "
                              "positions: use sinusoidal, learned, relative or rotary")
        if self.head == "rec" and core.crossformer is not None and core.crossformer.soft_target == "states":
            raise ConfigError("crossformer.soft_target='states' is not available for REC: its recorder reads the "
                              "decoder's padding from target tokens, and the region stack reads regions; use "
                              "soft_target='weights'")
        core.validate()


def _apply(data: dict[str, Any], overrides: dict[str, Any]) -> RegionConfig:
    """``data`` with ``overrides`` set (a key the region config lacks reaches ``transformer``), derived, checked."""
    for key in overrides:
        name = key[len("transformer."):] if key.startswith("transformer.") else key
        if name in DERIVED_FIELDS:
            raise ConfigError(f"{key} is decided by head (an encoder-decoder, causal for captions, over a set of "
                              "regions for REC) and cannot be set")
    data = set_dotted(copy.deepcopy(data), overrides, is_section=is_section, nested=("transformer",),
                      aliases=ModelConfig.FIELD_ALIASES)
    cfg = dataclass_from_dict(RegionConfig, data)
    cfg.derive()
    cfg.validate()
    return cfg


def _from_dict(data: dict[str, Any], source: str) -> RegionConfig:
    try:
        return _apply({k: v for k, v in data.items() if k != "model_type"}, {})
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


REGION_FIELDS = tuple(f.name for f in fields(RegionConfig) if f.name != "transformer")


# ----------------------------------------------------------------------------------------------------------------
# Modules
class RegionEmbedding(nn.Module):
    """``(LN(W_f f) + LN(W_b b)) / 2`` then dropout (LXMERT's object embedding; module docstring)."""

    def __init__(self, feature_dim: int, d_model: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.feature = nn.Linear(feature_dim, d_model)
        self.box = nn.Linear(BOX_FEATURES, d_model)
        self.feature_norm = nn.LayerNorm(d_model, eps=eps)
        self.box_norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, features: Tensor, boxes: Tensor) -> Tensor:
        if features.dim() != 3 or features.shape[-1] != self.feature.in_features:
            raise ValueError(f"expected region features of shape (B, R, {self.feature.in_features}), got "
                             f"{tuple(features.shape)}")
        if boxes.shape != (*features.shape[:2], BOX_FEATURES):
            raise ValueError(f"expected boxes of shape (B, R, {BOX_FEATURES}) beside features of shape "
                             f"{tuple(features.shape)}, got {tuple(boxes.shape)}")
        x = self.feature_norm(self.feature(features)) + self.box_norm(self.box(boxes))
        return self.dropout(x / 2)

    def madds(self, regions: int) -> int:
        return regions * (self.feature.weight.numel() + self.box.weight.numel())


def _components(core: ModelConfig) -> Components:
    components = Components(core)
    for method, section in core.sections():
        method.customize(section, core, components)
    return components


def _finalize(core: ModelConfig, model: nn.Module) -> None:
    for method, section in core.sections():
        method.finalize(section, core, model)
    track_ties(model)  # each tied tensor once in state dicts


class _RegionModel(nn.Module, PretrainedMixin):
    aux_loss_fns: dict[str, AuxLossFn]

    def compute_aux_losses(self) -> dict[str, Tensor]:
        return {name: fn(self) for name, fn in self.aux_loss_fns.items()}


class Captioner(_RegionModel):
    """The captioner (module docstring): ``forward(features, boxes, region_padding, tokens)`` returns the core's
    :class:`~interlayer.core.models.Seq2SeqOutput` (logits over the words for ``tokens``, BOS first)."""

    model_type = "captioner"

    def __init__(self, config: RegionConfig) -> None:
        super().__init__()
        config.validate()
        core = config.transformer
        components = _components(core)
        self.config, self.pad_id = config, core.pad_id
        self.regions = RegionEmbedding(config.feature_dim, core.d_model, core.dropout, core.layer_norm_eps)
        encoder_class = components.encoder_class or Encoder
        self.encoder = encoder_class(dataclasses.replace(core, positions="none"), components, None)
        self.decoder = Decoder(core, components, make_token_embedding(core.src_vocab_size, core.d_model, core.pad_id))
        self.aux_loss_fns = {}
        _finalize(core, self)

    @property
    def max_positions(self) -> int:
        return self.config.transformer.max_positions

    def encode(self, features: Tensor, boxes: Tensor, region_padding: Optional[Tensor] = None, *,
               need_intermediates: bool = False) -> EncoderOutput:
        """The regions encoded, ``(B, R, d)``; ``region_padding`` (B, R) is True at padded regions."""
        return self.encoder(inputs_embeds=self.regions(features, boxes), key_padding_mask=region_padding,
                            need_intermediates=need_intermediates)

    def forward(self, features: Tensor, boxes: Tensor, region_padding: Optional[Tensor], tokens: Tensor, *,
                need_intermediates: bool = False) -> Seq2SeqOutput:
        enc = self.encode(features, boxes, region_padding, need_intermediates=need_intermediates)
        dec = self.decoder(tokens, enc.hidden, enc.padding_mask, need_intermediates=need_intermediates)
        exit_logits = None
        if enc.exits is not None:
            exit_logits = [dec.logits if e is enc.hidden else self.decoder(tokens, e, enc.padding_mask).logits
                           for e in enc.exits]
        return Seq2SeqOutput(logits=dec.logits, encoder=enc, decoder=dec, exit_logits=exit_logits,
                             aux_losses=self.compute_aux_losses())

    def madds(self, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
        """One image of ``src_len`` regions (default ``max_regions``) and a caption of ``tgt_len`` tokens (default
        ``max_words + 1``)."""
        regions = self.config.max_regions if src_len is None else src_len
        words = self.config.max_words + 1 if tgt_len is None else tgt_len
        return self.regions.madds(regions) + self.encoder.madds(regions) + self.decoder.madds(words, regions)


@dataclass
class GroundingOutput:
    scores: Tensor  # (B, R) one logit per region; the minimum float at padded regions
    offsets: Optional[Tensor]  # (B, R, 4) (dx, dy, dw, dh) per region, or None without box regression
    encoder: EncoderOutput  # the expression's
    aux_losses: dict[str, Tensor] = field(default_factory=dict)


class RegionStack(nn.Module):
    """The grounder's region stack: core decoder layers (non-causal) guided by the expression, with the methods'
    depth connection when one is installed."""

    def __init__(self, core: ModelConfig, components: Components) -> None:
        super().__init__()
        self.layers = decoder_layers(core, components)
        self.depth = components.depth_connection("decoder")
        self.final_norm = nn.LayerNorm(core.d_model, eps=core.layer_norm_eps, bias=core.bias) if core.norm_first \
            else None

    def forward(self, x: Tensor, memory: Tensor, padding: Optional[Tensor], memory_padding: Optional[Tensor],
                need_intermediates: bool = False) -> Tensor:
        x = run_decoder_layers(self.layers, x, memory, self_padding_mask=padding, memory_padding_mask=memory_padding,
                               need_intermediates=need_intermediates, depth=self.depth)[0]
        return self.final_norm(x) if self.final_norm is not None else x

    def madds(self, regions: int, words: int) -> int:
        depth = self.depth.madds(regions) if self.depth is not None else 0
        return sum(layer.madds(regions, words) for layer in self.layers) + depth


class Grounder(_RegionModel):
    """The REC model (module docstring): ``forward(tokens, features, boxes, region_padding)`` returns one score per
    region and, with ``box_regression``, a box offset per region."""

    model_type = "grounder"

    def __init__(self, config: RegionConfig) -> None:
        super().__init__()
        config.validate()
        core = config.transformer
        components = _components(core)
        self.config, self.pad_id = config, core.pad_id
        tokens = make_token_embedding(core.src_vocab_size, core.d_model, core.pad_id)
        self.encoder = (components.encoder_class or Encoder)(core, components, tokens)
        self.regions = RegionEmbedding(config.feature_dim, core.d_model, core.dropout, core.layer_norm_eps)
        self.decoder = RegionStack(core, components)
        self.score = nn.Linear(core.d_model, 1)
        self.box = nn.Linear(core.d_model, 4) if config.box_regression else None
        self.aux_loss_fns = {}
        _finalize(core, self)

    def forward(self, tokens: Tensor, features: Tensor, boxes: Tensor, region_padding: Optional[Tensor] = None, *,
                need_intermediates: bool = False) -> GroundingOutput:
        """``tokens`` (B, T) the expression's word ids, right-padded with ``pad_id``; ``features`` (B, R, F),
        ``boxes`` (B, R, 5), ``region_padding`` (B, R) True at padded regions."""
        if tokens.shape[1] > self.config.max_words:
            raise ValueError(f"expressions of {tokens.shape[1]} words exceed max_words={self.config.max_words}")
        enc = self.encoder(tokens, need_intermediates=need_intermediates)
        hidden = self.decoder(self.regions(features, boxes), enc.hidden, region_padding, enc.padding_mask,
                              need_intermediates)
        scores = self.score(hidden).squeeze(-1)
        if region_padding is not None:
            scores = scores.masked_fill(region_padding, torch.finfo(scores.dtype).min)
        return GroundingOutput(scores=scores, offsets=self.box(hidden) if self.box is not None else None,
                               encoder=enc, aux_losses=self.compute_aux_losses())

    def madds(self, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
        """One expression of ``src_len`` words (default ``max_words``) and ``tgt_len`` regions (default
        ``max_regions``)."""
        words = self.config.max_words if src_len is None else src_len
        regions = self.config.max_regions if tgt_len is None else tgt_len
        heads = regions * self.score.weight.numel() + (regions * self.box.weight.numel() if self.box else 0)
        return self.encoder.madds(words) + self.regions.madds(regions) + self.decoder.madds(regions, words) + heads


def build_region_model(cfg: RegionConfig) -> nn.Module:
    return Captioner(cfg) if cfg.head == "caption" else Grounder(cfg)


# ----------------------------------------------------------------------------------------------------------------
# Presets: the LW paper's baseline (Sec. IV-A: d 512, FFN 2,048, 8 heads of 64, 6 + 6 layers, post-LN, over
# 2,048-d bottom-up features) for each head, and a small one for 2 CPU cores on the generated scenes (whose
# features are 192 values: the task sets feature_dim from the data). The paper's LW rows on them are in
# interlayer.papers.lightweight. The small captioner keeps the paper's FFN of 4 d (512 for d 128): at 2 d its SCST
# levelled off 10 CIDEr-D lower on the scenes' validation split for about the same CPU time (docs/captioning.md).
_PAPER = dict(arch="encoder_decoder", src_vocab_size=10000, d_model=512, n_heads=8, d_ffn=2048, enc_layers=6,
              dec_layers=6, dropout=0.1, max_positions=64)
_SMALL = dict(arch="encoder_decoder", src_vocab_size=10000, d_model=128, n_heads=4, d_ffn=256, enc_layers=3,
              dec_layers=3, dropout=0.1, max_positions=64)
REGION_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "caption_transformer": ("LW Sec. IV-A's captioning baseline: encoder over 2048-d regions, causal decoder, d=512, "
                            "8 heads, FFN 2048, 6+6 layers", dict(head="caption", transformer=_PAPER)),
    "caption_transformer_small": ("a captioner for 2 CPU cores (generated scenes): d=128, 4 heads, FFN 512, 3+3 "
                                  "layers", dict(head="caption", feature_dim=192, max_regions=8, max_words=24,
                                                 transformer={**_SMALL, "d_ffn": 512})),
    "rec_transformer": ("LW Sec. IV-A's REC baseline: expression encoder, region stack with cross-attention, score "
                        "and box offset per region; d=512, 8 heads, FFN 2048, 6+6 layers",
                        dict(head="rec", max_words=15, transformer=_PAPER)),
    "rec_transformer_small": ("a REC model for 2 CPU cores (generated scenes): d=128, 4 heads, FFN 256, 3+3 layers",
                              dict(head="rec", feature_dim=192, max_regions=8, max_words=15, transformer=_SMALL)),
}

register_family(Family(
    name="region", title="Region Transformers (captioning, REC)", tasks="caption, rec", config_class=RegionConfig,
    from_dict=_from_dict, override=lambda cfg, overrides: _apply(cfg.to_dict(), overrides), build=build_region_model,
    madds=lambda name, model, length: count_madds(model, None), rank=6,
    madds_unit="MAdds @ max_regions regions + max_words words", model_types=tuple(MODEL_TYPES.values()),
    claims=lambda data: data.get("model_type") in MODEL_TYPES.values() or "head" in data,
    method_slots=MethodSlots("region model", at="transformer")))
register_presets("region", REGION_PRESETS)
