"""Honest size and compute accounting.

* :func:`count_parameters` counts every distinct parameter tensor once, so tied weights (shared embeddings,
  Crossformer's hard guidance, LW's group sharing, MPT's passes) are not double counted.
* :func:`count_madds` is analytic: each module reports the multiply-adds of its matrix products and
  convolutions for a forward pass at the given lengths (normalisations, softmax and element-wise work are not
  counted, the usual MAdds convention). A test checks it against ``torch.utils.flop_counter`` (FLOPs = 2 MAdds).
"""
from __future__ import annotations

from typing import Optional

from torch import nn


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        if trainable_only and not param.requires_grad:
            continue
        seen[id(param)] = param.numel()
    return sum(seen.values())


def count_madds(model: nn.Module, src_len: int, tgt_len: Optional[int] = None) -> int:
    """Multiply-adds of one forward pass for one sequence (source ``src_len``, target ``tgt_len``)."""
    return int(model.madds(src_len, tgt_len))
