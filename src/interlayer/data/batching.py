"""Token-based batches with length bucketing (fairseq's ``--max-tokens``).

Examples are sorted by length so that a batch holds examples of similar size (little padding), batches are filled
up to ``max_tokens`` *padded* tokens (``batch size x longest example``), and the batch order is shuffled per epoch
from ``seed + epoch``. The order depends on nothing else, which is what lets a resumed run see exactly the batches
an uninterrupted one would have seen.
"""
from __future__ import annotations

import random
from typing import Sequence


def length_buckets(lengths: Sequence[int], max_tokens: int, *, max_sentences: int = 0) -> list[list[int]]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens, in length order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        size = lengths[index]
        if size > max_tokens:
            raise ValueError(f"example {index} has {size} tokens, more than max_tokens={max_tokens}; "
                             "raise max_tokens or filter long examples")
        grown = max(longest, size)
        if current and (grown * (len(current) + 1) > max_tokens or
                        (max_sentences and len(current) >= max_sentences)):
            batches.append(current)
            current, grown = [], size
        current.append(index)
        longest = grown
    if current:
        batches.append(current)
    return batches


def epoch_order(batches: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch in a shuffled order that depends only on ``(seed, epoch)``."""
    shuffled = list(batches)
    random.Random(seed * 100_003 + epoch).shuffle(shuffled)
    return shuffled
