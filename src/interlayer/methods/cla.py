"""Cross-Layer Attention (Brandon, Mishra, Nrusimha, Panda & Ragan-Kelley, "Reducing Transformer Key-Value Cache
Size with Cross-Layer Attention", arXiv:2405.12981, NeurIPS 2024): adjacent layers share one set of keys and values.
The rest (options, parameter formulas, composition, what the paper has that interlayer does not): docs/methods/cla.md.

Paper map:

* **CLA** (Sec. 2, Fig. 1-2): a reusing layer has no key/value projections, caches nothing, and attends with the
  K/V of its group's first layer; its queries, attention and output projection are its own: :class:`SharedKV`.
* **Sharing factor** (Sec. 2.1, "CLA2", "CLA3"): ``sharing_factor`` adjacent layers per group (1: the plain model),
  :func:`group_leader`; the KV cache shrinks by the factor, "or slightly less" where it does not divide the depth.
* **Short group** (Fig. 2, CLA3 on 10 layers: ``{0}``, ``{1, 2, 3}``, ...): ``short_group="first"``; ``"last"`` is
  interlayer's earlier grouping. A factor above every stack's depth is refused (all make one group).
* **Separate layer norms** (Sec. 3.1, "separately-learnable affine layer-norm parameters for the KV projection blocks
  and Q projection blocks"): ``separate_kv_norm``, a K/V layer's own LayerNorm: :class:`SeparateKVNorm`.

Readings where the paper leaves room (each with its reason):

* Separate norms change the parametrisation, not the function (an affine map folds into the next projection): a
  leader's K/V no longer share their gain with its queries, so training and weight decay move them apart. Default
  on wherever the core pre-LN residual is; a post-LN block has no input norm to separate.
* Positions: shared keys are cached rotated and read at the same positions, so rotary sharing is exact; Shaw
  relative-position biases stay per layer, from each layer's queries.
* Stacks: the paper is decoder-only; ``sides`` (default: every self-attention stack); groups never cross stacks, nor
  Multi-Pass passes (a later pass's leader computes new K/V from its own input). Cross-attention: per layer (not the
  paper's subject).
* Crossformer pairs on a key or value projection (``kq``, ``qk``, ``kk``, ``vf``) are refused: they tie weights CLA
  deletes (it shares *computed* K/V); ``qq`` and ``ffn`` compose.
* MQA/GQA: the core is MHA (one K/V head per query head), which the paper also reports (MHA-CLA2, Sec. 3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Optional

from torch import Tensor, nn

from ..core.attention import KVCache, KVHistory
from ..core.components import Components, StackSide, SublayerKind
from ..core.layers import Residual
from ..errors import ConfigError
from .base import (
    KV_REFUSAL,
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

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

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
    return section_variant("cla", "CLA", KV_REFUSAL.format(label="CLA"), whole=True, **section)


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
    lm_examples = {"cla2": {"sharing_factor": 2}}

    def restructures(self, section: CLAConfig) -> bool:
        """A layer that reuses another's keys and values has no K/V projections for the checkpoint's."""
        return section.sharing_factor > 1

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
