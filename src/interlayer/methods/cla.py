"""Cross-Layer Attention (Brandon, Mishra, Nrusimha, Panda & Ragan-Kelley, "Reducing Transformer Key-Value Cache
Size with Cross-Layer Attention", arXiv:2405.12981, NeurIPS 2024): adjacent layers share one set of keys and values.

Paper map (section numbers of the paper):

* **CLA** (Sec. 2, Fig. 1-2): some layers compute fresh key/value projections; the others have *no* key/value
  projections and attend with the keys and values of the nearest earlier layer that computed them. The attention
  itself, the queries and the output projection are per layer as usual.
* **Sharing factor** (Sec. 2.1, "CLA2", "CLA3"): groups of ``sharing_factor`` adjacent layers share one K/V; the
  first layer of a group computes them. The KV cache (and the K/V activations of training) shrink by the factor,
  "or slightly less if the sharing factor does not evenly divide the number of layers" (Sec. 2.1): the paper
  allows a last group of fewer layers, and so does interlayer: ``sharing_factor=3`` on 4 layers makes groups
  ``{0, 1, 2}`` and ``{3}``, 2 KV layers instead of 4 (``cla3`` of ``compare`` on the 4-layer LM). ``1`` is the
  plain model exactly (no layer has a source).
* **Parameters** (Sec. 2.1: CLA "reduces the number of parameters" of the K/V projections): each layer that reuses
  K/V has no ``k_proj``/``v_proj``: ``d qk + d^2`` weights (``+ qk + d`` biases) fewer per such layer.
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
from typing import TYPE_CHECKING, Optional

from torch import Tensor, nn

from ..core.attention import KVCache, KVHistory
from ..core.components import Components
from ..errors import ConfigError
from .base import MethodBase, StackSide, add_kv_sources, check_core_self_attention, stack_sides

if TYPE_CHECKING:
    from ..config import ModelConfig

KV_PAIRS = ("kq", "qk", "kk", "vf")  # Crossformer pairs that tie a key or value projection


@dataclass
class CLAConfig:
    """``sharing_factor``: adjacent layers per K/V group (the paper's CLA2, CLA3; 1 = the plain model).
    ``sides``: the self-attention stacks (None: all of the model's)."""

    sharing_factor: int = 2
    sides: Optional[list[StackSide]] = None

    def resolved_sides(self, cfg: "ModelConfig") -> list[str]:
        return stack_sides("cla", self.sides, cfg)

    def validate(self, cfg: "ModelConfig") -> None:
        if self.sharing_factor < 1:
            raise ConfigError(f"cla.sharing_factor={self.sharing_factor} must be at least 1 (1 is the plain model; "
                              "the paper uses 2 and 3)")
        if cfg.crossformer is not None and self.sharing_factor > 1:
            pairs = [p for p in (*cfg.crossformer.hard, *cfg.crossformer.soft) if p in KV_PAIRS]
            if pairs:
                raise ConfigError(f"crossformer pairs {pairs} tie or regularise key/value projection weights of "
                                  "adjacent layers, but cla (sharing_factor="
                                  f"{self.sharing_factor}) shares the computed keys/values instead and removes the "
                                  "projections of every layer but the first of each group; keep only 'qq' / 'ffn' "
                                  "in crossformer, or remove the cla section")
        check_core_self_attention(cfg, "cla", self.resolved_sides(cfg))


def group_leader(index: int, sharing_factor: int) -> int:
    """The layer whose keys/values layer ``index`` attends with: the first of its group of ``sharing_factor``."""
    return index - index % sharing_factor


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


class _CLAMethod(MethodBase):
    name = "cla"
    config_class = CLAConfig

    def customize(self, section: CLAConfig, cfg: "ModelConfig", components: Components) -> None:
        """Every layer that does not lead its group gets a :class:`SharedKV` source (none at factor 1)."""

        def source(index: int) -> Optional[nn.Module]:
            leader = group_leader(index, section.sharing_factor)
            return None if leader == index else SharedKV(leader)

        add_kv_sources(components, section.resolved_sides(cfg), source)


METHOD = _CLAMethod()
