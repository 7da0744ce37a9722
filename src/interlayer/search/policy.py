"""The search policy of MPT Sec. 3.4, pure: the history of a study in, the next pattern out.

Patterns are the permutations ``tau`` of the N encoder layers (outer layer k receives inner layer ``tau_k``),
written ``"0,4,1,5,2,3"`` in the study. :func:`propose` is the strategy the module docstring of
:mod:`interlayer.search.mpt` describes (reference, coarse, refine, random); it knows nothing of Optuna beyond the
trial states, so it is tested on plain records.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

from optuna.trial import TrialState

from ..errors import ConfigError

MAX_LAYERS = 7  # Optuna stores every categorical choice with every trial: 8! = 40,320 choices is 0.75 MB a trial


def encode(permutation: Sequence[int]) -> str:
    """``[0, 4, 1, 5, 2, 3]`` -> ``"0,4,1,5,2,3"`` (the categorical value)."""
    return ",".join(str(int(v)) for v in permutation)


def decode(value: str) -> tuple[int, ...]:
    return tuple(int(v) for v in value.split(","))


def all_patterns(n_layers: int) -> list[str]:
    """Every permutation of ``0..N-1``, encoded, in lexicographic order (the identity first)."""
    return [encode(p) for p in itertools.permutations(range(n_layers))]


def swap_neighbours(pattern: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The N(N-1)/2 patterns one connection swap away: outer layers i and j exchange their inner sources."""
    out = []
    for i, j in itertools.combinations(range(len(pattern)), 2):
        swapped = list(pattern)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        out.append(tuple(swapped))
    return out


def within_one_swap(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Equal, or one swap apart (two permutations that differ in exactly two places differ by that swap)."""
    return sum(x != y for x, y in zip(a, b)) in (0, 2)


@dataclass(frozen=True)
class Record:
    """What the policy needs to know of one trial."""

    number: int
    pattern: tuple[int, ...]
    phase: str
    state: TrialState
    value: Optional[float] = None


@dataclass(frozen=True)
class Proposal:
    pattern: Optional[tuple[int, ...]]  # None: every pattern is taken
    phase: str


@dataclass(frozen=True)
class Strategy:
    """The knobs of Sec. 3.4's search (the paper gives none; defaults documented in docs/search.md)."""

    n_layers: int
    coarse: int
    top_k: int = 3
    poor_fraction: float = 0.5
    seed: int = 1

    def validate(self) -> None:
        if not 2 <= self.n_layers <= MAX_LAYERS:
            raise ConfigError(f"the encoder has {self.n_layers} layers; the search needs 2..{MAX_LAYERS} "
                              f"({MAX_LAYERS}! = {math.factorial(MAX_LAYERS):,} patterns; Optuna stores every "
                              "choice of the categorical parameter with each trial, so larger spaces bloat the "
                              "storage). Set enc_layers (the paper searches N=6)")
        if self.coarse < 0:
            raise ConfigError(f"--coarse={self.coarse} must not be negative")
        patterns = math.factorial(self.n_layers)
        # the default K stands for every pattern of a 2-layer encoder's 2 (the refinement takes at most those there are)
        if not 1 <= self.top_k <= max(patterns, 3):
            raise ConfigError(f"--top-k={_quoted(self.top_k)} must be 1..{patterns:,}: N={self.n_layers} encoder "
                              f"layers have {patterns:,} patterns, and the refinement works around the K best "
                              "completed ones (default 3)")
        if not 0.0 <= self.poor_fraction < 1.0:
            raise ConfigError(f"--poor-fraction={self.poor_fraction} must lie in [0, 1): the share of completed "
                              "trials whose neighbours are skipped")


def _quoted(number: int) -> str:
    """``number`` as a message shows it: its digits when it has few, else how many it has."""
    text = str(number)
    return text if len(text) <= 12 else f"{'-' if number < 0 else ''}(a number of {len(text.lstrip('-'))} digits)"


def rank_completed(records: Sequence[Record], higher_is_better: bool) -> list[Record]:
    """Completed trials, best first (ties: the earlier trial first; a diverged trial's infinite score last)."""
    done = [r for r in records if r.state == TrialState.COMPLETE and r.value is not None]
    sign = -1.0 if higher_is_better else 1.0
    return sorted(done, key=lambda r: (sign * r.value, r.number))


def good_and_poor(ranked: Sequence[Record], top_k: int, poor_fraction: float) -> tuple[list[Record], list[Record]]:
    """The ``top_k`` best and the worst ``floor(poor_fraction x completed)``, never overlapping; a trial tied with
    the last one kept out of the poor part is not poor either (a tie is no evidence against a pattern)."""
    cut = len(ranked) - int(len(ranked) * poor_fraction)
    if cut == 0:
        return [], []
    return list(ranked[: min(top_k, cut)]), [r for r in ranked[cut:] if r.value != ranked[cut - 1].value]


def propose(strategy: Strategy, records: Sequence[Record], *, number: int, higher_is_better: bool) -> Proposal:
    """The pattern for trial ``number`` given every other trial of the study (module docstring, steps 2-4)."""
    rng = random.Random(f"mpt-search:{strategy.seed}:{number}")
    live = [r for r in records if r.state != TrialState.FAIL]  # a failed (lost) trial frees its pattern
    taken = {r.pattern for r in live}
    untaken = [p for p in map(decode, all_patterns(strategy.n_layers)) if p not in taken]
    if not untaken:
        return Proposal(None, "exhausted")
    if sum(r.phase == "coarse" and r.state != TrialState.PRUNED for r in live) < strategy.coarse:
        return Proposal(rng.choice(untaken), "coarse")
    good, poor = good_and_poor(rank_completed(records, higher_is_better), strategy.top_k, strategy.poor_fraction)

    def near_poor(pattern: tuple[int, ...]) -> bool:
        return any(within_one_swap(pattern, p.pattern) for p in poor)

    candidates = {c for g in good for c in swap_neighbours(g.pattern) if c not in taken and not near_poor(c)}
    if candidates:
        return Proposal(rng.choice(sorted(candidates)), "refine")
    away = [p for p in untaken if not near_poor(p)]
    return Proposal(rng.choice(away or untaken), "random")


