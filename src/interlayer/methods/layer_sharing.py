"""Depth recurrence by weight sharing: ALBERT's cross-layer sharing (Lan et al., "ALBERT: A Lite BERT for
Self-supervised Learning of Language Representations", ICLR 2020, arXiv:1909.11942) and MobileLLM's block-wise
repetition (Liu et al., "MobileLLM: Optimizing Sub-billion Parameter Language Models for On-Device Use Cases", ICML
2024, arXiv:2402.14905): ``L`` executed layers run ``B = L / repeats`` unique blocks in an ``order``. The rest
(options, parameter count, Multi-Pass's tied stack, composition, what is not here): docs/methods/layer_sharing.md.

Paper map:

* **ALBERT** (Sec. 3.1, "share all parameters across layers"): the default, ``repeats=None`` (one block per stack),
  ``share="all"``; Table 4's "shared-attention" / "shared-FFN": ``share="attention"`` / ``share="ffn"``.
* **MobileLLM** (Sec. 2.3, Fig. 6): ``repeats=2`` (MobileLLM-LS), ``order`` ``"immediate"`` A A B B (the paper's
  choice: the block's weights are still in the cache), ``"all_over"`` A B A B, ``"reverse"`` A B B A:
  :func:`block_indices`, tied by :func:`share_stack`. Parameters: ``B * block + (outside the stack)``, as both count.

Readings where the papers leave room (each with its reason):

* ``enc_layers`` counts executed layers (ALBERT's), so sharing changes the parameters, never the compute: the honest
  comparison, at equal MAdds. MobileLLM's count (blocks, each run ``repeats`` times) is :func:`repeat_blocks`.
* A sublayer's LayerNorm belongs to it (as in BERT's checkpoints): ``"attention"`` ties the self- and
  cross-attention with their norms, ``"ffn"`` the FFN and its norm, ``"all"`` every parameter a layer holds.
* Tied by parameter name, so a module only some layers have (PA's mixer, none in layer 0) is shared by the layers of
  a block that have it; buffers (PA's warm-up counter) stay per layer.
* ``reverse`` with more than two repeats (the paper shows 2): odd-numbered runs go backwards (A B C C B A A B C).
* A block keeps its first executed layer's initial values; layer modules stay distinct (own KV cache, as a repeated
  block's keys differ at each run). Every stack by default, each with its own blocks (neither paper has a decoder
  of an encoder-decoder). Crossformer pairs on a shared part are refused (a pair may fall in one block; ties would
  chain across blocks); disjoint parts compose.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Optional

from torch import nn

from ..core.components import StackSide
from ..errors import ConfigError, VariantError
from .base import ComposedConfig, CompositionExample, Conflict, MethodBase, NamedVariant, VariantContext, stack_sides

Share = Literal["all", "attention", "ffn"]
Order = Literal["immediate", "all_over", "reverse"]

# The submodules of a layer each choice ties ("" is the whole layer). Absent ones (an encoder layer has no
# cross-attention) are skipped.
PARTS: dict[str, tuple[str, ...]] = {"all": ("",), "attention": ("self_attn", "attn_block", "cross_attn",
                                                                  "cross_block"),
                                     "ffn": ("ffn", "ffn_block")}
# What Crossformer's pairs touch (its kq/qk/qq/kk/vf act on attention modules, "ffn" on the FFN).
_CROSSFORMER_PART = {"kq": "attention", "qk": "attention", "qq": "attention", "kk": "attention", "vf": "attention",
                     "ffn": "ffn"}


@dataclass
class LayerSharingConfig:
    """Which parameters the executed layers share, and how layers map onto blocks.

    * ``share``: ``all`` (ALBERT Sec. 3.1, default), ``attention`` or ``ffn`` (ALBERT Table 4's ablations).
    * ``repeats``: how many executed layers each block serves; ``None`` = all of a stack's layers (ALBERT), ``2``
      MobileLLM-LS, ``1`` no sharing (the plain model). It must divide every shared stack's depth.
    * ``order``: ``immediate`` (A A B B, MobileLLM's choice), ``all_over`` (A B A B) or ``reverse`` (A B B A);
      MobileLLM Fig. 6. Irrelevant with one block.
    * ``sides``: the stacks to share (``encoder``, ``decoder``); ``None`` = every stack of the model.
    """

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

    share: Share = "all"
    repeats: Optional[int] = None
    order: Order = "immediate"
    sides: Optional[list[StackSide]] = None

    def resolved_sides(self, cfg: ComposedConfig) -> list[str]:
        return stack_sides("layer_sharing", self.sides, cfg)

    def validate(self, cfg: ComposedConfig) -> None:
        if self.repeats is not None and (isinstance(self.repeats, bool) or not isinstance(self.repeats, int)
                                         or self.repeats < 1):
            raise ConfigError(f"layer_sharing.repeats={self.repeats!r} must be a positive integer (2 is "
                              "MobileLLM's, 1 the plain model) or null for one block shared by every layer (ALBERT)")
        for side in self.resolved_sides(cfg):
            key, depth = _depth(cfg, side)
            if self.repeats is not None and depth % self.repeats:
                raise ConfigError(f"layer_sharing.repeats={self.repeats} must divide {key}={depth}: each of the "
                                  f"{key} executed layers runs one of {key}/repeats unique blocks (valid repeats: "
                                  f"{[r for r in range(1, depth + 1) if depth % r == 0]})")
        _check_crossformer(self, cfg)

    def block_indices(self, n_layers: int) -> list[int]:
        """The block each of ``n_layers`` executed layers runs (MobileLLM Fig. 6), e.g. 4 layers, 2 repeats:
        immediate ``[0, 0, 1, 1]``, all_over ``[0, 1, 0, 1]``, reverse ``[0, 1, 1, 0]``."""
        return block_indices(n_layers, n_layers if self.repeats is None else self.repeats, self.order)


def block_indices(n_layers: int, repeats: int, order: str) -> list[int]:
    """Executed layer -> unique block, for ``n_layers / repeats`` blocks in ``order`` (see the module docstring)."""
    blocks = n_layers // repeats
    if order == "immediate":
        return [i // repeats for i in range(n_layers)]
    if order == "all_over":
        return [i % blocks for i in range(n_layers)]
    return [i % blocks if (i // blocks) % 2 == 0 else blocks - 1 - i % blocks for i in range(n_layers)]


def _depth(cfg: ComposedConfig, side: str) -> tuple[str, int]:
    return ("enc_layers", cfg.enc_layers) if side == "encoder" else ("dec_layers", cfg.dec_layers)


def _check_crossformer(section: LayerSharingConfig, cfg: ComposedConfig) -> None:
    """Refuse Crossformer pairs on the parts this section shares, on a stack both act on (module docstring)."""
    other = getattr(cfg, "crossformer", None)
    if other is None:
        return
    shared = set(section.resolved_sides(cfg))
    guided = {"decoder" if side == "cross" else side for side in other.resolved_sides(cfg)}
    stacks = sorted(shared & guided)
    if not stacks:
        return
    for key, pairs in (("crossformer.hard", other.hard), ("crossformer.soft", other.soft)):
        clash = [pair for pair in pairs if section.share in ("all", _CROSSFORMER_PART[pair])]
        if clash:
            raise ConfigError(
                f"layer_sharing.share={section.share!r} and {key}={list(pairs)} both act on the {clash} weights of "
                f"the {'/'.join(stacks)} stack: Crossformer ties or regularises layer t's matrix toward layer "
                f"t+1's, but with shared layers t and t+1 may run one block (the pair would pull W_K toward W_Q of "
                "one layer) and the ties would chain across blocks; share only the other part (layer_sharing.share="
                f"{'ffn' if _CROSSFORMER_PART[clash[0]] == 'attention' else 'attention'!r}), drop {clash} from "
                f"{key}, or keep them on different stacks (layer_sharing.sides, crossformer.sides)")


def share_stack(layers: nn.ModuleList, blocks: list[int], parts: tuple[str, ...], key: str) -> None:
    """Make every layer's parameters under ``parts`` the ones of the first layer of its block that has them.

    Tied by name: ``layers[i].<part>.<name>`` becomes the ``nn.Parameter`` of the first layer of the same block
    holding ``<part>.<name>``, so a module present in only some layers (PA's mixer) is shared by those.
    """
    canonical: dict[tuple[int, str], nn.Parameter] = {}
    for i, (layer, block) in enumerate(zip(layers, blocks, strict=True)):
        for part in parts:
            if part and not hasattr(layer, part):
                continue
            module = layer.get_submodule(part) if part else layer
            for name, param in list(module.named_parameters(remove_duplicate=False)):
                path = f"{part}.{name}" if part else name
                first = canonical.setdefault((block, path), param)
                if first is param:
                    continue
                if first.shape != param.shape:
                    raise ConfigError(f"{key}: layer {i}'s {path} has shape {tuple(param.shape)}, but the block it "
                                      f"runs has {tuple(first.shape)}; the layers of a block must be built alike")
                owner, _, attr = path.rpartition(".")
                setattr(layer.get_submodule(owner) if owner else layer, attr, first)


def stacks(section: LayerSharingConfig, cfg: ComposedConfig, model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """``(side, layers)`` of every stack the section shares: ``encoder.layers``, ``decoder.layers``."""
    return [(side, getattr(model, side).layers) for side in section.resolved_sides(cfg)]


def repeat_blocks(cfg: Any, repeats: int = 2, order: Order = "immediate", share: Share = "all",
                  sides: Optional[list[StackSide]] = None) -> Any:
    """MobileLLM's reading of depth: ``cfg``'s ``enc_layers`` (and ``dec_layers`` for a shared decoder) count
    unique blocks, each run ``repeats`` times, so the returned config executes ``repeats`` times as many layers
    with the same parameters (MobileLLM-LS: same size, ``repeats`` x the compute)."""
    section = LayerSharingConfig(share=share, repeats=repeats, order=order, sides=sides)
    resolved = section.resolved_sides(cfg)
    depths = {key: depth * repeats for key, depth in (_depth(cfg, side) for side in resolved)}
    return dataclasses.replace(cfg, **depths, layer_sharing=section)


def _variant(deep: bool = False, **section: Any) -> Callable[[VariantContext], dict]:
    """Shared layers at the base's executed depth (fewer parameters, same compute), or with ``deep`` MobileLLM's
    reading: the base's layers become unique blocks run ``repeats`` times (same parameters, more compute)."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        if ctx.excludes("layer_sharing"):
            raise VariantError(f"layer sharing has no {ctx.slots.name} form here: ALBERT and MobileLLM share one "
                               "Transformer stack; compare it on a Transformer task")
        fields = ctx.transformer_fields("layer sharing")
        out: dict[str, Any] = {"layer_sharing": dict(section)}
        if deep:
            out["enc_layers"] = fields["enc_layers"] * section["repeats"]
            if fields.get("arch") == "encoder_decoder":
                out["dec_layers"] = fields["dec_layers"] * section["repeats"]
        return out

    return overrides


class _LayerSharingMethod(MethodBase):
    name = "layer_sharing"
    config_class = LayerSharingConfig
    ties_only = True  # each executed layer computes as a plain one; only its parameters are another layer's
    variants = {
        "albert": NamedVariant("ALBERT cross-layer sharing: every layer runs one block, all parameters shared, same "
                               "depth and compute (ALBERT Sec. 3.1, Table 4 'all-shared')", _variant()),
        "mobilellm": NamedVariant("MobileLLM immediate block-wise sharing A A B B: enc_layers/2 unique blocks each "
                                  "run twice in a row, same depth and compute (MobileLLM Sec. 2.3, Fig. 6)",
                                  _variant(repeats=2, order="immediate")),
        "mobilellm_all_over": NamedVariant("MobileLLM repeat-all-over sharing A B A B: the stack of enc_layers/2 "
                                           "blocks run twice (MobileLLM Fig. 6; MPT's 'tied weights' stack)",
                                           _variant(repeats=2, order="all_over")),
        "mobilellm_deep": NamedVariant("MobileLLM-LS as the paper counts depth: each base layer a unique block run "
                                       "twice in a row, so the base's parameters at twice its layers and compute "
                                       "(MobileLLM Sec. 2.3)", _variant(deep=True, repeats=2, order="immediate")),
    }
    examples = (CompositionExample("layer_sharing"),)  # ALBERT: every layer of each stack runs one block
    # share='all' ties the very matrices a hard pair ties, or a soft pair compares (validate)
    conflicts = (Conflict("crossformer", "layer_sharing.share='all' and crossformer.hard"),
                 Conflict("crossformer_soft", "layer_sharing.share='all' and crossformer.soft"))
    lm_examples = {"layer_sharing": {}}

    def restructures(self, section: LayerSharingConfig) -> bool:
        """Tying layers ties matrices the checkpoint holds apart (one run per block is no sharing)."""
        return section.repeats != 1

    def finalize(self, section: LayerSharingConfig, cfg: ComposedConfig, model: nn.Module) -> None:
        """Tie each stack's layers onto its unique blocks (module docstring): one ``nn.Parameter`` per block."""
        for side, layers in stacks(section, cfg, model):
            share_stack(layers, section.block_indices(len(layers)), PARTS[section.share],
                        f"layer_sharing.share={section.share!r} ({side})")


METHOD = _LayerSharingMethod()
