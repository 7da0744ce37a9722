"""The core Transformer's configuration: one typed dataclass, nothing about the papers.

Design notes
------------
* One flat dataclass (nanoGPT style) so that ``--set d_model=256`` works without knowing a nesting scheme.
* ``validate()`` rejects combinations that cannot work, naming the key and the valid choices, so a bad config
  fails at construction time instead of as a shape error three modules deep.
* Types do the checking: a choice field is a ``Literal[...]`` and :func:`~interlayer.config_io.coerce` (every
  loader) and :func:`~interlayer.config_io.check_choices` (every ``validate``) refuse anything else with one
  message, so the valid values are written once, in the annotation. The coercer lives in
  :mod:`interlayer.config_io`, below the core, so that every config family uses it without importing another.
* The method sections (Crossformer, Multi-Pass, ...) live in :mod:`interlayer.config`, which extends this class;
  the core only ever reads the fields declared here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

from ..config_io import check_choices, check_finite
from ..errors import ConfigError
from .hf_names import HFConfigNames

# The most positions a model reads: its position tables (sinusoidal, rotary, learned) hold a row for each
MAX_POSITIONS = 2 ** 16
MAX_LAYERS = 1024  # the most layers of a stack: enc_layers=10000000 built layers until the memory ran out
Arch = Literal["encoder_decoder", "encoder_classifier", "causal_lm"]
Positions = Literal["sinusoidal", "learned", "relative", "relative_2d", "rotary", "none"]
# Absolute positions: "zero" numbers the tokens 0..T-1; "after_pad" numbers the non-padding tokens from pad_id + 1
# and gives padding the row pad_id (RoBERTa/XLM-R; fairseq's make_positions)
PositionStart = Literal["zero", "after_pad"]
Activation = Literal["relu", "gelu", "gelu_tanh"]
Pooling = Literal["cls", "mean"]
# "auto": fused SDPA when no option needs the logits; "eager": always explicit
AttnImpl = Literal["auto", "eager"]


@dataclass
class TransformerConfig(HFConfigNames):
    """Hyper-parameters of a plain Transformer (Vaswani et al. 2017) and its common variants.

    Field groups: architecture (``arch``, sizes), embeddings and positions, regularisation, heads for
    classification. ``qk_dim`` lets the query/key projection be wider or narrower than ``d_model``
    (LW-Transformer's Table I expands it); ``None`` means ``d_model``.

    ``arch="causal_lm"`` is a decoder-only language model (GPT): the encoder's layer stack run with a causal mask,
    ``enc_layers`` deep, its token table tied to the output when ``tie_output``; ``dec_layers`` is unused.
    ``bias`` switches the biases of every linear layer *and* LayerNorm (nanoGPT's ``bias`` flag).
    ``positions="rotary"`` rotates queries and keys (RoPE, Su et al. 2021) in every self-attention.
    ``transformers``' names (``vocab_size``, ``hidden_size``, ``eos_token_id``, ...) are properties:
    :mod:`interlayer.core.hf_names`.
    """

    # The options that are a dimension or a count of the saved tensors in every model: the weights bound them
    # (checkpoint.py's size check). The others size a tensor only under another option (max_positions: a learned
    # table; dec_layers: an encoder-decoder; d_ffn: no tensor is that wide when lightweight's G-FFN and G-IL share
    # their groups; qk_dim, num_classes, ...) or none (n_heads splits the projections, whatever their number), and
    # validate() bounds them.
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"src_vocab_size", "d_model", "enc_layers", "n_segments"})

    arch: Arch = "encoder_decoder"
    src_vocab_size: int = 8000
    tgt_vocab_size: Optional[int] = None  # None: same as src_vocab_size
    d_model: int = 512
    n_heads: int = 8
    d_ffn: int = 2048
    enc_layers: int = 6
    dec_layers: int = 6
    qk_dim: Optional[int] = None
    activation: Activation = "relu"
    norm_first: bool = False  # False: post-LN (Vaswani, fairseq default); True: pre-LN (+ a final LayerNorm)
    # False: the decoder's self-attention sees every position, padding masked (a stack over a set that is not
    # generated, e.g. MCAN's image regions); a translation model so configured would see its own targets
    causal_decoder: bool = True
    layer_norm_eps: float = 1e-5
    bias: bool = True

    positions: Positions = "sinusoidal"
    max_positions: int = 1024
    rel_max_distance: int = 16  # Shaw et al. 2018 clip distance k
    grid_height: int = 0  # for positions="relative_2d": the token grid (PA Eq. 3); prefix tokens (CLS) allowed
    grid_width: int = 0
    position_start: PositionStart = "zero"
    embed_scale: bool = True  # multiply token embeddings by sqrt(d_model) (Vaswani et al., fairseq)
    embed_layer_norm: bool = False  # LayerNorm after summing embeddings (BERT)
    share_embeddings: bool = False  # one table for source and target (needs one vocabulary)
    tie_output: bool = True  # decoder input embedding == output projection
    n_segments: int = 0  # >0 adds segment (token-type) embeddings, for sentence pairs
    pad_id: int = 0

    dropout: float = 0.1
    embed_dropout: Optional[float] = None  # dropout on the summed input embeddings; None: ``dropout``
    attn_dropout: float = 0.0
    act_dropout: float = 0.0

    num_classes: int = 0  # encoder_classifier only
    pooling: Pooling = "cls"
    classifier_hidden: int = 0  # >0: a tanh hidden layer before the class projection (BERT pooler)

    attn_impl: AttnImpl = "auto"

    @property
    def target_vocab(self) -> int:
        return self.tgt_vocab_size or self.src_vocab_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def qk_width(self) -> int:
        return self.qk_dim or self.d_model

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first setting that cannot work."""
        check_finite(self)
        check_choices(self)
        for key in ("src_vocab_size", "d_model", "n_heads", "d_ffn", "max_positions"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        if self.max_positions > MAX_POSITIONS:
            raise ConfigError(f"max_positions={self.max_positions} is more than {MAX_POSITIONS:,}, the longest "
                              "sequence interlayer builds position tables for (a table of every position is made "
                              "with the model); give 1..65536")
        for key in ("enc_layers", "dec_layers"):
            if getattr(self, key) > MAX_LAYERS:
                raise ConfigError(f"{key}={getattr(self, key)} is more than {MAX_LAYERS:,}, the deepest stack "
                                  "interlayer builds (DeepNet's 1,000-layer model has 500 a stack); a typo?")
        if self.enc_layers < 1:
            raise ConfigError(f"enc_layers={self.enc_layers} must be at least 1")
        if self.arch == "encoder_decoder" and self.dec_layers < 1:
            raise ConfigError(f"dec_layers={self.dec_layers} must be at least 1 for arch='encoder_decoder'")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                              f"valid n_heads divide d_model, e.g. {_divisors(self.d_model)}")
        if self.qk_width % self.n_heads:
            raise ConfigError(f"qk_dim={self.qk_dim} is not divisible by n_heads={self.n_heads}")
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"layer_norm_eps={self.layer_norm_eps} must be positive (it keeps LayerNorm's division "
                              "away from zero; 1e-5 is usual)")
        for key in ("dropout", "attn_dropout", "act_dropout", "embed_dropout"):
            if getattr(self, key) is not None and not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{key}={getattr(self, key)} must lie in [0, 1)")
        if self.share_embeddings and self.tgt_vocab_size not in (None, self.src_vocab_size):
            raise ConfigError(f"share_embeddings=True needs one vocabulary, but src_vocab_size={self.src_vocab_size}"
                              f" and tgt_vocab_size={self.tgt_vocab_size}; set tgt_vocab_size=None or "
                              f"share_embeddings=False")
        if self.positions == "relative_2d" and (self.grid_height <= 0 or self.grid_width <= 0):
            raise ConfigError("positions='relative_2d' needs grid_height and grid_width (the token grid), "
                              f"got {self.grid_height}x{self.grid_width}")
        if self.positions == "relative_2d" and self.arch != "encoder_classifier":
            raise ConfigError(f"positions='relative_2d' is for image grids; arch={self.arch!r} models 1-D text. "
                              "Use arch='encoder_classifier' or positions='relative'")
        if self.positions == "rotary" and (self.qk_width // self.n_heads) % 2:
            raise ConfigError(f"positions='rotary' rotates pairs of query/key features, so the per-head query "
                              f"width must be even; got qk_dim={self.qk_width} / n_heads={self.n_heads} = "
                              f"{self.qk_width // self.n_heads}")
        if self.positions in ("relative", "relative_2d") and self.rel_max_distance < 1:
            raise ConfigError(f"rel_max_distance={self.rel_max_distance} must be at least 1")
        first = self.pad_id + 1
        if self.position_start == "after_pad" and (self.positions != "learned" or self.max_positions <= first):
            raise ConfigError(f"position_start='after_pad' numbers learned positions from pad_id + 1 = {first}; it "
                              f"needs positions='learned' (got {self.positions!r}) and max_positions > {first} (got "
                              f"{self.max_positions})")
        if not self.causal_decoder and self.arch != "encoder_decoder":
            raise ConfigError(f"causal_decoder=False makes a decoder bidirectional, but arch={self.arch!r} has no "
                              "decoder; leave causal_decoder=True")
        if self.arch == "encoder_classifier" and self.num_classes < 2:
            raise ConfigError(f"arch='encoder_classifier' needs num_classes >= 2, got {self.num_classes}")
        if not 0 <= self.pad_id < self.src_vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} must be a token id below src_vocab_size={self.src_vocab_size}")


def _divisors(n: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16, 32) if n % d == 0]


