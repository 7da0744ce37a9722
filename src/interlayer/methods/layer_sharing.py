"""Depth recurrence by weight sharing: ALBERT's cross-layer sharing and MobileLLM's block-wise repetition.

Two papers, one mechanism: a stack of ``L`` executed layers whose parameters come from ``B = L / repeats``
unique blocks, assigned to the layers by an ``order``.

* **ALBERT** (Lan et al., ICLR 2020, arXiv:1909.11942), Sec. 3.1 "Cross-layer parameter sharing": "share all
  parameters across layers", the default here (``repeats=None``: one block for every layer of a stack). Table 4's
  ablations share only the attention parameters ("shared-attention") or only the FFN ("shared-FFN"):
  ``share="attention"`` / ``share="ffn"``.
* **MobileLLM** (Liu et al., ICML 2024, arXiv:2402.14905), Sec. 2.3 "Layer sharing", Fig. 6: ``B`` unique blocks
  run with repetition. ``order="immediate"`` repeats each block at once (A A B B C C; the paper's choice: the
  repeated block's weights are still in the cache, so the second run moves no weights), ``"all_over"`` runs the
  whole stack again (A B C A B C), ``"reverse"`` runs it again backwards (A B C C B A). ``repeats=2`` as in the
  paper's MobileLLM-LS.

The parameter count is ``B * (block parameters) + (everything outside the stack)`` (embeddings, the final norm, a
head), as both papers count it (tested); the arithmetic is that of the ``L`` executed layers.

Readings chosen where the papers leave room (each with the reason):

* **``enc_layers`` counts executed layers** (ALBERT's reading: ALBERT-base has 12 layers and one layer's
  parameters). So switching ``layer_sharing`` on changes only the parameter count, never the compute, and a
  comparison against the baseline at the same ``enc_layers`` is at equal MAdds with fewer parameters: the honest
  comparison of what sharing costs. MobileLLM reads it the other way (its 30-block 125M model runs 60 layers with
  ``repeats=2``: same parameters, double compute); that reading is :func:`repeat_blocks`, which multiplies
  ``enc_layers``/``dec_layers`` by ``repeats`` and switches the section on (the ``mobilellm_deep`` compare
  variant).
* **What a sublayer's "parameters" are.** A sublayer's LayerNorm belongs to it (BERT's ``attention/output/
  LayerNorm`` sits in the attention block, ``output/LayerNorm`` in the FFN block), so ``share="attention"`` ties
  the self-attention, its norm and, in a decoder layer, the cross-attention and its norm; ``share="ffn"`` the FFN
  and its norm; ``share="all"`` every parameter the layer holds, whatever module a method put there.
* **Modules only some layers of a group have.** Predictive Attention puts a logit mixer in layers 1..L-1, not
  layer 0 (PA Sec. 3.3). Sharing ties each parameter *name* across the layers of a group that hold it, so the
  mixer is shared by the layers of a group that have one (with ``share="all"``/``"attention"``): under ALBERT
  that is PA's own ``share_conv=True``; under A A B B, block A's mixer exists only in its second run (layer 1),
  block B's is one module for layers 2 and 3. Buffers (PA's warm-up step counter) stay per layer.
* **Several repeats of ``reverse``** (the paper shows 2): odd-numbered runs go backwards (A B C C B A A B C).
* **Initialisation**: a block keeps the initial values of its first executed layer; the copies of later layers
  are dropped. The layer modules stay distinct (only their parameters are one tensor), so each executed layer has
  its own KV cache in the language model (a repeated block's keys differ at each run), its own dropout and
  intermediates, and checkpoints store each shared tensor once with its aliases (``checkpoint.tie_map``).
* **Sides**: every stack of the model by default (the encoder; the decoder of an encoder-decoder too, each with
  its own blocks); ``sides`` narrows it. Neither paper has a decoder of an encoder-decoder (ALBERT is an
  encoder, MobileLLM a decoder-only LM, which is interlayer's ``encoder`` stack run causally).

Relation to Multi-Pass: ``order="all_over", repeats=2, share="all"`` over ``2N`` layers computes exactly what
``multipass={"passes": 2, "connection": "tied_stack"}`` computes over ``N`` (MPT Table 2's "6+6-layer (tied
weights)" baseline), with the same parameters (tested). ``layer_sharing`` also keeps the KV cache (MPT's
encoder does not) and lets Predictive Attention's logits flow from layer N-1 into layer N (MPT restarts them at
each pass); ``multipass`` is the one to use for per-pass exits and losses.

Composition: Crossformer's hard and soft guidance tie or pull together sub-weights of *adjacent* layers; where
they touch what this section shares, a guided pair may be one block (pulling W_K toward W_Q of one layer, a
different model) and ties chain across blocks, so that pair is refused naming both sections; disjoint parts
(``share="ffn"`` with ``kq``/``vf``, ``share="attention"`` with ``ffn``) compose.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

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
        if ctx.is_mcan:
            raise VariantError("layer sharing has no MCAN form here: ALBERT and MobileLLM share one Transformer "
                               "stack; compare it on a Transformer task")
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

    def finalize(self, section: LayerSharingConfig, cfg: ComposedConfig, model: nn.Module) -> None:
        """Tie each stack's layers onto its unique blocks (module docstring): one ``nn.Parameter`` per block."""
        for side, layers in stacks(section, cfg, model):
            share_stack(layers, section.block_indices(len(layers)), PARTS[section.share],
                        f"layer_sharing.share={section.share!r} ({side})")


METHOD = _LayerSharingMethod()
