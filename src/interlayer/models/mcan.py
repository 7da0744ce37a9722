"""MCAN, the Modular Co-Attention Network for visual question answering (Yu, Yu, Cui, Tao & Tian, CVPR 2019,
"Deep Modular Co-Attention Networks for Visual Question Answering"), encoder-decoder variant, on the core.

The model the LW-Transformer paper's VQA rows (Sec. IV-A, Tables II-III) and Crossformer Sec. 3.2 / App. A.2 use:

* **Question**: word embedding (GloVe 300-d in MCAN; here learned, ``word_dim``) -> a one-layer LSTM of
  ``d_model`` units (MCAN Sec. 4.1) -> ``layers`` SA blocks: the core :class:`~interlayer.core.encoder.Encoder`
  without positions (the LSTM carries the order), post-LN.
* **Image**: region features (``image_input="features"``: e.g. bottom-up-attention 2048-d, ``feature_dim``) or
  pixels (``"pixels"``: :class:`PixelStem`, trained end to end, for Sort-of-CLEVR) -> a linear layer to ``d_model``
  -> ``layers`` SGA blocks: SA over the regions, then guided attention (GA) whose keys and values are the *final*
  question encoding (MCAN's encoder-decoder stacking, Fig. 5b), then the FFN. An SGA block is the core
  :class:`~interlayer.core.layers.DecoderLayer` with ``causal=False`` (the regions are a set, nothing is generated).
* Every block is post-LN, ``LN(x + dropout(f(x)))``, with dropout 0.1 on the residual branch, on the attention
  weights (MCAN's ``MHAtt`` drops the attention map) and after the FFN's ReLU (MCAN's ``MLP``).
* **AttFlat** on both outputs (MCAN Eq. 13): ``alpha = softmax(MLP(X))`` over the positions (padding excluded),
  ``MLP`` = Linear(d, flat_mlp) -> ReLU -> dropout -> Linear(flat_mlp, glimpses); the ``glimpses`` weighted sums
  ``sum_i alpha_i x_i`` are concatenated and mapped by a linear layer to ``fused_dim``.
* **Fusion and classifier** (MCAN Eq. 14-15): ``z = LayerNorm(x_flat + y_flat)``, logits ``W z`` over the answer
  vocabulary; the task applies the sigmoid and binary cross-entropy on the soft scores.

MCAN-small: d=512, 8 heads of 64, FFN 2048, 6 layers; MCAN-large: d=1024, 16 heads, FFN 4096 (MCAN Sec. 4.1).
Crossformer App. A.2 uses 4 layers.

The methods plug in through the core's factories exactly as in a seq2seq model: the question SA stack is the
``encoder`` side, the image SA of the SGA blocks the ``decoder`` side and GA the ``cross`` attention:

* **LW** (``lightweight``): G-MHA in every SA and GA, G-FFN in every block, WS, n x, G-LML, G-IL (LW Tables I-III).
  LW Table II's 44.1M is exactly this model's 12 blocks (6 SA + 6 SGA: 18 attentions, 12 FFNs); footnote 3: the
  paper does not count the embedding and LSTM (nor, by its 44.1M, the AttFlat and classifier layers).
* **Crossformer** (``crossformer``): HG/SG between adjacent blocks of a stack (Sec. 3.2), on the question SA
  stack and the image SGA stack (``sides``; ``"cross"`` adds the GA stack). ``soft_target="states"`` is refused:
  its recorder reads the decoder's padding from target tokens, and the image stack has none.
* **PA** (``predictive``): the attention-map CNN in the question SA blocks 2..L (``sides=["encoder"]``; a 1-D
  token order), and in the image SA blocks 2..L (``"decoder"``) only for ``image_input="pixels"``, where the
  regions are the cells of a grid in raster order, as PA's image models flatten an ``H x W`` grid (PA Sec. 3.1).
  Bottom-up regions are an unordered set, so a 3 x 3 kernel over their map would mix arbitrary neighbours: refused.
  GA is not predicted (its map pairs two different sequences; PA Eq. 4 chains self-attention maps of one).

Readings where the papers leave room:

* ``nn.LayerNorm`` (eps 1e-6) instead of MCAN's own LayerNorm, which divides by ``std + eps`` with the unbiased
  std: the same normalisation up to a factor ``sqrt(n/(n-1))`` absorbed by the gain.
* The LSTM is :class:`QuestionLSTM`, a loop over the time steps with ``nn.LSTM``'s parameters and gate order:
  TorchDynamo breaks the graph at ``nn.LSTM`` (``allow_rnn=False``), and padding is on the right, so the
  unpacked recurrence never lets a padded token reach a real one (MCAN does not pack either).
* Padding: question padding is given by ``question_padding`` (True = pad, on the right); region padding by
  ``image_padding`` (MCAN derives it from all-zero feature rows; here the data pipeline states it).
* ``PixelStem``: Santoro et al. 2017's Sort-of-CLEVR CNN ("4 convolutional layers each with 24 kernels, ReLU
  non-linearities, and batch normalization"; 3 x 3, stride 2, as the public implementations), 75 x 75 -> 5 x 5
  cells, each tagged with its (x, y) coordinates in [-1, 1] as the RN tags its objects: without a position the
  relational questions ("the shape closest to the red circle") could not be answered by attention over the cells.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds
from ..config import ModelConfig
from ..config_io import ConfigFile, MethodSlots, check_choices, checked_config, set_dotted
from ..core.attention import MultiHeadAttention
from ..core.components import Components
from ..core.decoder import decoder_layers, run_decoder_layers
from ..core.embedding import make_token_embedding
from ..core.encoder import Encoder, EncoderOutput
from ..core.hub import PretrainedMixin, track_ties
from ..core.models import AuxLossFn
from ..errors import ConfigError
from ..methods import METHODS
from ..methods.crossformer import CrossformerConfig
from ..methods.lightweight import LightweightConfig
from ..methods.predictive import PredictiveConfig
from .registry import Family, register_family, register_presets

MODEL_TYPE = "mcan"


@dataclass
class MCANConfig(ConfigFile):
    """An MCAN model (defaults: MCAN-small on VQA v2 inputs; see the module docstring for the paper map).

    ``vocab_size`` and ``num_answers`` are placeholders a task replaces with its vocabularies (id ``pad_id`` is the
    question padding). ``feature_dim``: width of a region feature (2048 for bottom-up attention), or for
    ``image_input="pixels"`` the channels of the :class:`PixelStem` (24 in the RN). ``image_size`` /
    ``image_channels`` / ``stem_layers``: the square images the stem reads and its depth; ``grid`` is the cell grid
    it leaves. ``max_regions`` is the region count MAdds are counted at for features (100, as LW Table II's 2.58G
    implies); ``max_question_len`` the longest question accepted (MCAN pads to 14 tokens). Method sections: the
    core's config classes, ``None`` when off; their ``encoder``/``decoder``/``cross`` sides are the question SA,
    the image SA and the guided attention.
    """

    # The options that size the saved tensors in every model (checkpoint.py's size check); the input's geometry, the
    # pixel stem's settings (pixels only), n_heads and d_ffn (lightweight's shared groups) are no such size
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({
        "vocab_size", "num_answers", "word_dim", "feature_dim", "d_model", "layers", "flat_mlp", "flat_glimpses",
        "fused_dim"})

    vocab_size: int = 20000
    num_answers: int = 3129
    word_dim: int = 300
    feature_dim: int = 2048
    image_input: Literal["features", "pixels"] = "features"
    image_size: int = 75
    image_channels: int = 3
    stem_layers: int = 4
    max_regions: int = 100
    d_model: int = 512
    n_heads: int = 8
    d_ffn: int = 2048
    layers: int = 6
    dropout: float = 0.1
    attn_dropout: float = 0.1
    flat_mlp: int = 512
    flat_glimpses: int = 1
    fused_dim: int = 1024
    max_question_len: int = 14
    pad_id: int = 0
    lightweight: Optional[LightweightConfig] = None
    crossformer: Optional[CrossformerConfig] = None
    predictive: Optional[PredictiveConfig] = None

    @property
    def model_type(self) -> str:
        return MODEL_TYPE

    @property
    def grid(self) -> tuple[int, int]:
        """The stem's cell grid: each 3 x 3, stride-2, padding-1 convolution maps a side ``s`` to ``ceil(s/2)``."""
        side = self.image_size
        for _ in range(self.stem_layers):
            side = (side + 1) // 2
        return side, side

    @property
    def regions(self) -> int:
        """Regions the image stack reads: the grid cells for pixels, ``max_regions`` for features."""
        return self.grid[0] * self.grid[1] if self.image_input == "pixels" else self.max_regions

    def core_config(self) -> ModelConfig:
        """The core config the blocks are built from: SA = encoder layers, SGA = non-causal decoder layers."""
        data = dict(arch="encoder_decoder", src_vocab_size=self.vocab_size, d_model=self.d_model,
                    n_heads=self.n_heads, d_ffn=self.d_ffn, enc_layers=self.layers, dec_layers=self.layers,
                    norm_first=False, layer_norm_eps=1e-6, positions="none",
                    max_positions=max(self.max_question_len, self.regions), dropout=self.dropout,
                    embed_dropout=0.0, attn_dropout=self.attn_dropout, act_dropout=self.dropout,
                    causal_decoder=False, pad_id=self.pad_id, tie_output=False,
                    **{name: _as_dict(getattr(self, name)) for name in SECTIONS})
        return checked_config(ModelConfig, data, "MCAN (question SA = encoder, enc_layers = dec_layers = layers)")

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the key of the first setting that cannot work."""
        check_choices(self, "")
        for key in ("vocab_size", "num_answers", "word_dim", "feature_dim", "image_channels", "stem_layers",
                    "max_regions", "layers", "flat_mlp", "flat_glimpses", "fused_dim", "max_question_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        if self.image_input == "pixels" and self.image_size < 2:
            raise ConfigError(f"image_size={self.image_size} must be at least 2 pixels for image_input='pixels'")
        if self.predictive is not None and "decoder" in self.predictive.sides and self.image_input != "pixels":
            raise ConfigError(f"predictive.sides={self.predictive.sides} includes 'decoder' (the image SA), but "
                              "image_input='features' gives an unordered set of regions, over whose attention map "
                              "a convolution mixes arbitrary neighbours; use predictive.sides=['encoder'], or "
                              "image_input='pixels' (a grid in raster order)")
        if self.crossformer is not None and self.crossformer.soft_target == "states":
            raise ConfigError("crossformer.soft_target='states' is not available in MCAN: its recorder reads the "
                              "decoder's padding from target tokens, and the image stack reads features; use "
                              "soft_target='weights'")
        self.core_config()


def _as_dict(section: Any) -> Optional[dict[str, Any]]:
    return None if section is None else dataclasses.asdict(section)


# The method sections MCAN takes: its config's fields that are method sections (the names are written once, in
# interlayer.methods).
SECTIONS: tuple[str, ...] = tuple(m.name for m in METHODS
                                  if m.name in {f.name for f in dataclasses.fields(MCANConfig)})


def mcan_config_from_dict(data: dict[str, Any], source: str = "config") -> MCANConfig:
    """Build and validate an :class:`MCANConfig`; errors name ``source`` and the dotted key."""
    return checked_config(MCANConfig, data, source)


# ----------------------------------------------------------------------------------------------------------------
# Modules
class QuestionLSTM(nn.Module):
    """A one-layer LSTM over ``(B, T, in)`` from zero states, as ``nn.LSTM(in, hidden, batch_first=True)``: the
    same parameter names, shapes, initialisation and gate order (i, f, g, o), so its outputs equal ``nn.LSTM``'s
    (tested), written as a loop so that the model compiles in one graph (see the module docstring)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        bound = hidden_size ** -0.5
        for param in self.parameters():
            nn.init.uniform_(param, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        gates_in = F.linear(x, self.weight_ih_l0, self.bias_ih_l0 + self.bias_hh_l0)
        h = x.new_zeros(x.shape[0], self.hidden_size)
        c = h
        outputs = []
        for t in range(x.shape[1]):
            i, f, g, o = (gates_in[:, t] + F.linear(h, self.weight_hh_l0)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)

    def madds(self, t: int) -> int:
        return t * (self.weight_ih_l0.numel() + self.weight_hh_l0.numel())


class PixelStem(nn.Module):
    """Images ``(B, C, S, S)`` (uint8 0..255 or floats in [0, 1]) -> ``(B, cells, channels + 2)`` cell features:
    ``stem_layers`` x (3 x 3 conv, stride 2, padding 1 -> ReLU -> BatchNorm), the RN's Sort-of-CLEVR CNN, then each
    cell's (x, y) centre in [-1, 1] appended (raster order: row by row)."""

    def __init__(self, cfg: MCANConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = cfg.image_channels
        for _ in range(cfg.stem_layers):
            layers += [nn.Conv2d(channels, cfg.feature_dim, 3, stride=2, padding=1), nn.ReLU(),
                       nn.BatchNorm2d(cfg.feature_dim)]
            channels = cfg.feature_dim
        self.convs = nn.Sequential(*layers)
        self.image_size = cfg.image_size

    def forward(self, images: Tensor) -> Tensor:
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images
        x = self.convs(x)
        b, _, h, w = x.shape
        ys = torch.linspace(-1.0, 1.0, h, device=x.device, dtype=x.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=x.device, dtype=x.dtype)
        coords = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).reshape(1, h * w, 2)
        return torch.cat([x.flatten(2).transpose(1, 2), coords.expand(b, -1, -1)], dim=-1)

    def madds(self) -> int:
        total, side = 0, self.image_size
        for conv in self.convs:
            if isinstance(conv, nn.Conv2d):
                side = (side + 1) // 2
                total += side * side * conv.weight.numel()
        return total


class AttFlat(nn.Module):
    """MCAN Eq. 13: ``glimpses`` softmax-weighted sums over the positions (padding gets weight exactly 0),
    concatenated and projected to ``out_dim``. Returns the flat vector and the weights ``(B, T, glimpses)``."""

    def __init__(self, d_model: int, hidden: int, glimpses: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(hidden, glimpses)
        self.merge = nn.Linear(d_model * glimpses, out_dim)

    def forward(self, x: Tensor, padding: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        scores = self.score(self.dropout(F.relu(self.fc(x))))
        if padding is not None:
            scores = scores.masked_fill(padding.unsqueeze(-1), torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=1)
        pooled = torch.einsum("btg,btd->bgd", weights, x).flatten(1)
        return self.merge(pooled), weights

    def madds(self, t: int) -> int:
        return (t * (self.fc.weight.numel() + self.score.weight.numel() + self.score.out_features
                     * self.fc.in_features) + self.merge.weight.numel())


class ImageDecoder(nn.Module):
    """The SGA stack: core decoder layers (non-causal) over the regions, guided by the final question encoding."""

    def __init__(self, cfg: ModelConfig, components: Components) -> None:
        super().__init__()
        self.layers = decoder_layers(cfg, components)

    def forward(self, x: Tensor, memory: Tensor, padding: Optional[Tensor], memory_padding: Optional[Tensor],
                need_intermediates: bool = False) -> Tensor:
        return run_decoder_layers(self.layers, x, memory, self_padding_mask=padding,
                                  memory_padding_mask=memory_padding, need_intermediates=need_intermediates)[0]

    def madds(self, regions: int, question_len: int) -> int:
        return sum(layer.madds(regions, question_len) for layer in self.layers)


@dataclass
class MCANOutput:
    logits: Tensor  # (B, num_answers), before the sigmoid
    region_attention: Tensor  # (B, R) the image AttFlat weights (mean over glimpses); 0 at padded regions
    question_attention: Tensor  # (B, Lq) the question AttFlat weights (mean over glimpses)
    encoder: EncoderOutput  # the question SA stack's output (intermediates when requested)
    aux_losses: dict[str, Tensor] = field(default_factory=dict)


class MCAN(nn.Module, PretrainedMixin):
    """MCAN (module docstring): ``MCAN(config)``; ``forward(question, question_padding, image, image_padding)``.

    ``mc_attention(True)`` keeps the attention-weight dropout of every SA and GA block on in eval mode, so that
    repeated forward passes sample attention weights (the 20 samples of PAvPU, Crossformer Sec. 3.2); everything
    else (residual and FFN dropout, AttFlat, BatchNorm) stays in eval mode. ``mc_attention(False)`` turns it off.
    """

    model_type = MODEL_TYPE

    def __init__(self, config: MCANConfig) -> None:
        super().__init__()
        config.validate()
        core = config.core_config()
        components = Components(core)
        for method, section in core.sections():
            method.customize(section, core, components)
        self.config = config
        self.core_config = core
        self.mc_attention_on = False
        self.words = make_token_embedding(config.vocab_size, config.word_dim, config.pad_id)
        self.lstm = QuestionLSTM(config.word_dim, config.d_model)
        self.stem = PixelStem(config) if config.image_input == "pixels" else None
        region_dim = config.feature_dim + (2 if self.stem is not None else 0)
        self.image_proj = nn.Linear(region_dim, config.d_model)
        self.encoder = Encoder(core, components, None)
        self.decoder = ImageDecoder(core, components)
        flat = dict(hidden=config.flat_mlp, glimpses=config.flat_glimpses, out_dim=config.fused_dim,
                    dropout=config.dropout)
        self.question_flat = AttFlat(config.d_model, **flat)
        self.image_flat = AttFlat(config.d_model, **flat)
        self.fusion_norm = nn.LayerNorm(config.fused_dim, eps=1e-6)
        self.classifier = nn.Linear(config.fused_dim, config.num_answers)
        self.aux_loss_fns: dict[str, AuxLossFn] = {}
        for method, section in core.sections():
            method.finalize(section, core, self)
        track_ties(self)  # each tied tensor once in state dicts

    def compute_aux_losses(self) -> dict[str, Tensor]:
        return {name: fn(self) for name, fn in self.aux_loss_fns.items()}

    def attention_modules(self) -> list[MultiHeadAttention]:
        return [m for m in self.modules() if isinstance(m, MultiHeadAttention)]

    def mc_attention(self, enabled: bool = True) -> None:
        """Sample attention weights in eval mode (see the class docstring); needs ``attn_dropout > 0``."""
        if enabled and self.config.attn_dropout == 0.0:
            raise ValueError("mc_attention(True) samples attention weights by dropout, but attn_dropout=0: every "
                             "sample would be the same; build the model with attn_dropout > 0 (MCAN uses 0.1)")
        self.mc_attention_on = enabled
        self.train(self.training)

    def train(self, mode: bool = True) -> "MCAN":
        super().train(mode)
        if self.mc_attention_on and not mode:
            for module in self.attention_modules():
                module.training = True  # its own flag only: the attention-weight dropout, not its submodules
        return self

    def region_feature_shape(self, image: Tensor) -> tuple[int, ...]:
        """The shape of the region features ``image`` gives before the projection to ``d_model``, the tensor
        ``feature_noise`` is added to: ``(B, cells, feature_dim + 2)`` for pixels, the input's own for features."""
        if self.stem is not None:
            return (image.shape[0], self.config.regions, self.config.feature_dim + 2)
        return tuple(image.shape)

    def encode_image(self, image: Tensor, feature_noise: Union[float, Tensor]) -> Tensor:
        """Region features ``(B, R, d_model)`` from features or pixels, with noise added to the region features
        first (Crossformer Sec. 3.2's noisy evaluation): a float is the standard deviation of Gaussian noise drawn
        here, a tensor is the noise itself (``region_feature_shape``), so that several passes can read the same
        noisy features."""
        cfg = self.config
        if self.stem is not None:
            expected = (cfg.image_channels, cfg.image_size, cfg.image_size)
            if image.dim() != 4 or tuple(image.shape[1:]) != expected:
                raise ValueError(f"image_input='pixels' expects images of shape (B, {', '.join(map(str, expected))})"
                                 f", got {tuple(image.shape)}")
            image = self.stem(image)
        elif image.dim() != 3 or image.shape[-1] != cfg.feature_dim:
            raise ValueError(f"image_input='features' expects region features of shape (B, R, {cfg.feature_dim}), "
                             f"got {tuple(image.shape)}")
        if isinstance(feature_noise, Tensor):
            if feature_noise.shape != image.shape:
                raise ValueError(f"feature_noise of shape {tuple(feature_noise.shape)} does not match the region "
                                 f"features {tuple(image.shape)} (region_feature_shape gives it)")
            image = image + feature_noise.to(image.dtype)
        elif feature_noise:
            image = image + feature_noise * torch.randn_like(image)
        return self.image_proj(image)

    def forward(self, question: Tensor, question_padding: Tensor, image: Tensor,
                image_padding: Optional[Tensor] = None, *, feature_noise: Union[float, Tensor] = 0.0,
                need_intermediates: bool = False) -> MCANOutput:
        """``question`` (B, Lq) token ids, right-padded; ``question_padding`` (B, Lq) True at padding; ``image``
        (B, R, feature_dim) or (B, C, S, S); ``image_padding`` (B, R) True at padded regions (features only)."""
        cfg = self.config
        if question.dim() != 2 or question_padding.shape != question.shape:
            raise ValueError(f"question must be (B, Lq) token ids with question_padding of the same shape, got "
                             f"{tuple(question.shape)} and {tuple(question_padding.shape)}")
        if question.shape[1] > cfg.max_question_len:
            raise ValueError(f"questions of {question.shape[1]} tokens exceed max_question_len="
                             f"{cfg.max_question_len}; truncate them or raise max_question_len")
        if image_padding is not None and (self.stem is not None or image_padding.shape != image.shape[:2]):
            raise ValueError(f"image_padding must be (B, R) for region features (image_input='features'), got "
                             f"{tuple(image_padding.shape)} for an image of shape {tuple(image.shape)}")
        words = self.lstm(self.words(question))
        regions = self.encode_image(image, feature_noise)
        enc = self.encoder(inputs_embeds=words, key_padding_mask=question_padding,
                           need_intermediates=need_intermediates)
        hidden = self.decoder(regions, enc.hidden, image_padding, question_padding, need_intermediates)
        question_flat, question_weights = self.question_flat(enc.hidden, question_padding)
        image_flat, image_weights = self.image_flat(hidden, image_padding)
        logits = self.classifier(self.fusion_norm(question_flat + image_flat))
        return MCANOutput(logits=logits, region_attention=image_weights.mean(-1),
                          question_attention=question_weights.mean(-1), encoder=enc,
                          aux_losses=self.compute_aux_losses())

    def madds(self, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
        """Multiply-adds for one question of ``src_len`` tokens (default ``max_question_len``) and ``tgt_len``
        regions (default ``config.regions``; for pixels it must be the grid's cell count)."""
        cfg = self.config
        t = cfg.max_question_len if src_len is None else src_len
        r = cfg.regions if tgt_len is None else tgt_len
        if self.stem is not None and r != cfg.regions:
            raise ValueError(f"this model reads {cfg.regions} grid cells per image; got tgt_len={r}")
        image = (self.stem.madds() if self.stem is not None else 0) + r * self.image_proj.weight.numel()
        return (self.lstm.madds(t) + self.encoder.madds(t) + image + self.decoder.madds(r, t)
                + self.question_flat.madds(t) + self.image_flat.madds(r) + self.classifier.weight.numel())


# ----------------------------------------------------------------------------------------------------------------
# Presets: MCAN-small / -large (MCAN Sec. 4.1) and the four-layer MCAN Crossformer starts from (App. A.2); the
# papers' methods on MCAN are theirs (interlayer.papers: predictive, crossformer, lightweight)
MCAN_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "mcan_small": ("MCAN-small (Yu et al. 2019; LW Table II's 'Transformer', 44.1M in its blocks): 6 SA + 6 SGA, "
                   "d=512, 8 heads, FFN 2048, 2048-d region features, 3,129 answers", {}),
    # the official large config (MILVLG/mcan-vqa, cfgs/large_model.yml): HIDDEN_SIZE 1024, MULTI_HEAD 8,
    # FLAT_MLP_SIZE 512, FLAT_OUT_SIZE 2048 (FF_SIZE = 4 x HIDDEN_SIZE in cfgs/base_cfgs.py)
    "mcan_large": ("MCAN-large (Yu et al. 2019, Sec. 4.1; the official cfgs/large_model.yml): 6 SA + 6 SGA, d=1024, "
                   "8 heads of 128, FFN 4096, AttFlat MLP 512 -> 2048",
                   dict(d_model=1024, n_heads=8, d_ffn=4096, flat_mlp=512, fused_dim=2048)),
    "mcan_4layer": ("Crossformer Table 4's BASE: the four-layer MCAN of App. A.2 (4 SA + 4 SGA, d=512)",
                    dict(layers=4)),
}



def _override(cfg: MCANConfig, overrides: dict[str, Any]) -> MCANConfig:
    return mcan_config_from_dict(set_dotted(cfg.to_dict(), overrides, is_section=lambda key: key in SECTIONS),
                                 source="overrides")


register_family(Family(
    name=MODEL_TYPE, title="MCAN (VQA)", tasks="vqa", config_class=MCANConfig,
    from_dict=mcan_config_from_dict, override=_override, build=MCAN,
    madds=lambda name, model, length: count_madds(model, None),
    madds_unit="MAdds @ 14 question tokens + 100 regions (pixels: the grid)", rank=5, model_types=(MODEL_TYPE,),
    claims=lambda data: data.get("model_type") == MODEL_TYPE or "num_answers" in data,
    method_slots=MethodSlots("MCAN", only=frozenset(SECTIONS))))  # its sections at the top, with a Transformer's keys
register_presets(MODEL_TYPE, MCAN_PRESETS)
