"""Honest size and compute accounting.

* :func:`count_parameters` counts every distinct parameter tensor once, so tied weights (shared embeddings,
  Crossformer's hard guidance, LW's group sharing, MPT's passes) are not double counted.
* :func:`count_madds` is analytic: each module reports the multiply-adds of its matrix products and
  convolutions for a forward pass at the given lengths (normalisations, softmax and element-wise work are not
  counted, the usual MAdds convention). A test checks it against ``torch.utils.flop_counter`` (FLOPs = 2 MAdds).
"""
from __future__ import annotations

import inspect
from typing import Optional

from torch import nn

from .errors import ConfigError


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        if trainable_only and not param.requires_grad:
            continue
        seen[id(param)] = param.numel()
    return sum(seen.values())


def count_madds(model: nn.Module, src_len: Optional[int] = None, tgt_len: Optional[int] = None) -> int:
    """Multiply-adds of one forward pass for one sequence (source ``src_len``, target ``tgt_len``).

    A model that fixes its own input size (an image model's patch grid, MCAN's regions) needs no length:
    ``count_madds(vit)``; a sequence model does, and is told so instead of failing inside its arithmetic.
    """
    first = next(iter(inspect.signature(model.madds).parameters.values()), None)
    if src_len is None and first is not None and first.default is inspect.Parameter.empty:
        raise ConfigError(f"count_madds({type(model).__name__}) needs src_len (its {first.name}): this model has no "
                          "fixed input size; pass it as the second argument, e.g. count_madds(model, 64)")
    return int(model.madds() if first is None else model.madds(src_len, tgt_len))
