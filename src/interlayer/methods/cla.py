"""Cross-Layer Attention (Brandon, Mishra, Nrusimha, Panda & Ragan-Kelley, "Reducing Transformer Key-Value Cache
Size with Cross-Layer Attention", arXiv:2405.12981, NeurIPS 2024): adjacent layers share one set of keys and values.

Paper map (section numbers of the paper):

* **CLA** (Sec. 2, Fig. 1-2): some layers compute fresh key/value projections; the others have *no* key/value
  projections and attend with the keys and values of the nearest earlier layer that computed them. The attention
  itself, the queries and the output projection are per layer as usual.
* **Sharing factor** (Sec. 2.1, "CLA2", "CLA3"): groups of ``sharing_factor`` adjacent layers share one K/V; the
  first layer of a group computes them. The KV cache (and the K/V activations of training) shrink by the factor,
  "or slightly less if the sharing factor does not evenly divide the number of layers" (Sec. 2.1). Where the
  factor does not divide the depth, Fig. 2 (CLA3 on a 10-layer model) puts the short group *first*: layer 0 alone,
  then ``{1, 2, 3}``, ``{4, 5, 6}``, ``{7, 8, 9}``. ``short_group="first"`` (the default) is that; ``"last"`` puts it
  at the end (``{0, 1, 2}``, ..., ``{9}``), what interlayer did before. ``sharing_factor=3`` on 4 layers makes
  ``{0}``, ``{1, 2, 3}``, 2 KV layers instead of 4 either way (``cla3`` of ``compare`` on the 4-layer LM). ``1`` is
  the plain model (no layer has a source). A factor larger than every stack's depth is refused naming the depth,
  the largest useful value (any larger one gives the same single group per stack).
* **Separate layer-norm parameters** (Sec. 3.1: "separately-learnable affine layer-norm parameters for the KV
  projection blocks and Q projection blocks"): in a pre-LN block one LayerNorm feeds the query, key and value
  projections; with ``separate_kv_norm`` every layer that computes K/V normalises its input once more with a
  LayerNorm of its own for the key and value projections (the statistics are the same, the affine ``gamma, beta``
  differ), and the block's pre-norm feeds the query projection only. Reading: a LayerNorm's affine map could be
  absorbed in the projection that follows, so this adds no function the plain block lacks; what it changes is the
  parametrisation: a group leader's K/V, which every layer of its group reads, no longer share their normalisation
  gain with the leader's own queries, so training (and weight decay) move them apart. Reusing layers have no KV
  projection block, so only their Q-side norm remains. Default ``None``: as the paper wherever the core pre-LN
  residual is there (pre-LN, and no method replacing the residual connection); in a post-LN block there is no input
  norm to separate. Parameters: ``+2 d`` per K/V layer (``+d`` without biases; tested).
* **Parameters** (Sec. 2.1: CLA "reduces the number of parameters" of the K/V projections): each layer that reuses
  K/V has no ``k_proj``/``v_proj``: ``d qk + d^2`` weights (``+ qk + d`` biases) fewer per such layer; the separate
  K/V layer norms add ``2 d`` (``d``) per K/V layer.
* **KV cache** (Sec. 2.1): a reusing layer stores nothing; its cache entry stays empty
  (:func:`interlayer.core.generation.kv_cache_bytes_per_token` measures the shrinkage).

Readings chosen where the text leaves a choice (each with the reason):

* **Rotary / relative positions**: the shared keys are stored rotated to their positions (as the core caches them),
  and every layer of a group reads them at the same positions, so the sharing is exact under rotary positions too;
  relative-position biases (Shaw) are per layer and computed from each layer's queries.
* **Stacks**: the paper trains decoder-only models. ``sides`` (default: every self-attention stack of the model)
  applies CLA to the encoder (classifier, encoder-decoder's encoder) and the decoder's self-attention; groups never
  cross stacks. Cross-attention keys/values are left per layer (not the paper's subject).
* **Multi-Pass**: sharing stays inside one pass: each run of the stack keeps its own history, since a later pass's
  group leader computes new K/V from its own input (sharing across passes would feed pass 1's K/V to pass 2).
* **Crossformer** hard/soft guidance ties *weights* of adjacent layers (``kq``: layer t's key projection is layer
  t+1's query projection), while CLA shares *computed* keys/values and deletes the reusing layers' projections:
  pairs that touch a key or value projection (``kq``, ``qk``, ``kk``, ``vf``) are refused, ``qq`` and ``ffn``
  compose.
* **MQA / GQA**: the paper pairs CLA with MQA; the core has one K/V head per query head (MHA), which the paper also
  reports (MHA-CLA2, Sec. 3). See docs/methods/cla.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

from torch import Tensor, nn

from ..core.attention import KVCache, KVHistory
from ..core.components import Components, StackSide, SublayerKind
from ..core.layers import Residual
from ..errors import ConfigError
from .base import (
    KV_MCAN,
    ComposedConfig,
    CompositionExample,
    Conflict,
    MethodBase,
    NamedVariant,
    VariantContext,
    add_kv_sources,
    check_core_self_attention,
    section_variant,
    stack_sides,
)

KV_PAIRS = ("kq", "qk", "kk", "vf")  # Crossformer pairs that tie a key or value projection
ShortGroup = Literal["first", "last"]


@dataclass
class CLAConfig:
    """``sharing_factor``: adjacent layers per K/V group (the paper's CLA2, CLA3; 1 = the plain model).
    ``short_group``: where the group of fewer layers goes when the factor does not divide the depth (Fig. 2: first).
    ``separate_kv_norm``: the K/V projections' own layer-norm parameters (Sec. 3.1; None: where a pre-norm is).
    ``sides``: the self-attention stacks (None: all of the model's)."""

    sharing_factor: int = 2
    short_group: ShortGroup = "first"
    separate_kv_norm: Optional[bool] = None
    sides: Optional[list[StackSide]] = None

    def resolved_sides(self, cfg: ComposedConfig) -> list[str]:
        return stack_sides("cla", self.sides, cfg)

    def validate(self, cfg: ComposedConfig) -> None:
        if self.sharing_factor < 1:
            raise ConfigError(f"cla.sharing_factor={self.sharing_factor} must be at least 1 (1 is the plain model; "
                              "the paper uses 2 and 3)")
        depths = {side: cfg.enc_layers if side == "encoder" else cfg.dec_layers for side in self.resolved_sides(cfg)}
        deepest = max(depths.values())
        if self.sharing_factor > deepest:  # every factor from the depth on makes the same single group
            shown = " and ".join(f"{'enc' if side == 'encoder' else 'dec'}_layers={depth}"
                                 for side, depth in depths.items())
            raise ConfigError(f"cla.sharing_factor={self.sharing_factor} is larger than the depth ({shown}): "
                              f"{deepest} already makes each stack one group sharing the first layer's keys and "
                              f"values, the largest useful value; give 1..{deepest}")
        if self.separate_kv_norm and not cfg.norm_first:
            raise ConfigError("cla.separate_kv_norm=true gives the K/V projections their own input layer norm, but "
                              "norm_first=False (post-LN) blocks have no input norm; set norm_first=True or leave "
                              "separate_kv_norm unset")
        if cfg.crossformer is not None and self.sharing_factor > 1:
            pairs = [p for p in (*cfg.crossformer.hard, *cfg.crossformer.soft) if p in KV_PAIRS]
            if pairs:
                raise ConfigError(f"crossformer pairs {pairs} tie or regularise key/value projection weights of "
                                  "adjacent layers, but cla (sharing_factor="
                                  f"{self.sharing_factor}) shares the computed keys/values instead and removes the "
                                  "projections of every layer but the first of each group; keep only 'qq' / 'ffn' "
                                  "in crossformer, or remove the cla section")
        check_core_self_attention(cfg, "cla", self.resolved_sides(cfg))


def group_leader(index: int, sharing_factor: int, n_layers: int, short_group: ShortGroup = "first") -> int:
    """The layer whose keys/values layer ``index`` attends with: the first of its group. Groups have
    ``sharing_factor`` layers, but for the ``n_layers % sharing_factor`` layers of the short group, first or last."""
    short = n_layers % sharing_factor if short_group == "first" else 0
    return 0 if index < short else index - (index - short) % sharing_factor


class SeparateKVNorm(Residual):
    """The core pre-LN residual of a layer that computes keys/values, with a LayerNorm of its own for the key and
    value projections (Sec. 3.1): :meth:`split` gives the self-attention ``(query input, key input, value
    input)``, the block's pre-norm for the first, ``kv_norm`` for the other two."""

    def __init__(self, d_model: int, dropout: float, eps: float, bias: bool) -> None:
        super().__init__(d_model, dropout, True, eps, bias)
        self.kv_norm = nn.LayerNorm(d_model, eps=eps, bias=bias)

    def split(self, x: Tensor, branch_add: Optional[Tensor] = None) -> tuple[Any, Any]:
        branch = x if branch_add is None else x + branch_add
        kv = self.kv_norm(branch)
        return (self.norm(branch), kv, kv), x

    def split_inputs(self, x: Tensor, inputs: tuple[Tensor, ...], branch_add: Optional[Tensor] = None
                     ) -> tuple[tuple[Tensor, ...], Any]:
        q, k, v = (t if branch_add is None else t + branch_add for t in inputs)
        return (self.norm(q), self.kv_norm(k), self.kv_norm(v)), x


class SharedKV(nn.Module):
    """A layer that attends with layer ``source``'s keys and values; it has no K/V projection and caches nothing."""

    projects_keys = False
    projects_values = False

    def __init__(self, source: int) -> None:
        super().__init__()
        self.source = source

    def extra_repr(self) -> str:
        return f"source={self.source}"

    def forward(self, k: Optional[Tensor], v: Optional[Tensor], history: KVHistory, cache: Optional[KVCache]
                ) -> tuple[Tensor, Tensor]:
        return history[self.source]


def _variant(**section: Any) -> Callable[[VariantContext], dict[str, Any]]:
    return section_variant("cla", "CLA", KV_MCAN.format(label="CLA"), whole=True, **section)


class _CLAMethod(MethodBase):
    name = "cla"
    config_class = CLAConfig
    variants = {
        "cla2": NamedVariant("Cross-Layer Attention, sharing factor 2: pairs of layers share one K/V, half the KV "
                             "cache (Brandon et al. 2024, Sec. 2)", _variant(sharing_factor=2)),
        "cla3": NamedVariant("Cross-Layer Attention, sharing factor 3; a first group of fewer layers where 3 does not "
                             "divide the depth, as the paper's Fig. 2 (Brandon et al. 2024, Sec. 2.1)",
                             _variant(sharing_factor=3)),
    }
    examples = (CompositionExample("cla", {"sharing_factor": 2}),)
    # check_core_self_attention, and validate: a pair would tie the projections CLA leaves out
    conflicts = (Conflict("lightweight", "lightweight.attention"), Conflict("conv_branch", "conv_branch"),
                 Conflict("crossformer", "shares the computed keys/values"),
                 Conflict("crossformer_soft", "shares the computed keys/values"))

    def customize(self, section: CLAConfig, cfg: ComposedConfig, components: Components) -> None:
        """Every layer that does not lead its group gets a :class:`SharedKV` source (none at factor 1); with
        separate K/V norms, every layer that leads one gets a :class:`SeparateKVNorm` attention residual."""
        sides = section.resolved_sides(cfg)

        def leader(side: StackSide, index: int) -> int:
            depth = cfg.enc_layers if side == "encoder" else cfg.dec_layers
            return group_leader(index, section.sharing_factor, depth, section.short_group)

        for side in sides:  # add_kv_sources takes a rule by layer; each stack has its own depth
            add_kv_sources(components, [side], lambda index, side=side: (
                None if leader(side, index) == index else SharedKV(leader(side, index))))
        replaced = components.residual != components.default_residual
        if section.separate_kv_norm and replaced:
            raise ConfigError("cla.separate_kv_norm=true gives the K/V projections their own input layer norm in the "
                              "core pre-LN residual, but another method (hyper_connections or mhc) replaced the "
                              "residual connections; leave separate_kv_norm unset or remove one section")
        if not (section.separate_kv_norm or (section.separate_kv_norm is None and cfg.norm_first and not replaced)):
            return
        previous = components.residual

        def residual(side: StackSide, index: int, kind: SublayerKind) -> nn.Module:
            if kind == "attn" and side in sides and leader(side, index) == index:
                return SeparateKVNorm(cfg.d_model, cfg.dropout, cfg.layer_norm_eps, cfg.bias)
            return previous(side, index, kind)

        components.residual = residual


METHOD = _CLAMethod()
