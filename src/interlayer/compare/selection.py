"""Hyper-parameters chosen on validation inside a comparison: ``--select GROUP=V1,V2,...``.

The papers tune some values per task (PA's alpha, Sec. 4.1.1: "chosen on the validation set"); the honest way
to report such a method is to train every candidate, pick the one with the best *validation* mean, and quote
that candidate's *test* numbers, never the best test number. ``--select pa=pa_a0.1,pa_a0.3`` names such a group
of variants; the report then says which one the validation metric chose and marks its row.

A choice only concerns the report: it is not part of the directory's identity (``compare.json``), so it can be
added to, or changed in, the command of a comparison that is already under way or finished. A group is decided
only once every run of every candidate has finished (so all means are over the same seeds); until then the
report says which runs are missing. Ties go to the candidate listed first.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Optional, Protocol, Sequence

from ..errors import ConfigError


@dataclass(frozen=True)
class Selection:
    """One ``--select GROUP=V1,V2,...``: the group's name and its candidate variants, in the order given (ties go to the
    first)."""

    group: str
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class Choice:
    """A group decided (``chosen``) or not yet (``missing`` runs), with each candidate's mean validation metric."""

    selection: Selection
    valid: dict[str, Optional[float]]  # candidate -> mean validation metric over its finished runs
    chosen: Optional[str]  # None until every run of every candidate has finished
    missing: tuple[str, ...]  # runs still to finish before the group is decided


def parse_selections(entries: Sequence[str]) -> list[Selection]:
    """``["pa=pa,pa_a0.3", "lw=lw_1x,lw_2x"]`` -> selections; the format is checked here, the names against the
    comparison's variants by :func:`check_selections`."""
    selections: list[Selection] = []
    for entry in entries:
        group, sep, rest = entry.partition("=")
        candidates = tuple(c.strip() for c in rest.split(",") if c.strip())
        if not sep or not group.strip():
            raise ConfigError(f"--select expects GROUP=VARIANT,VARIANT,... (e.g. --select pa=pa,pa_a0.3), "
                              f"got {entry!r}")
        if len(candidates) < 2:
            raise ConfigError(f"--select {entry!r}: a choice needs at least two variants, got {list(candidates)}")
        if len(set(candidates)) != len(candidates):
            raise ConfigError(f"--select {entry!r} lists a variant twice")
        selections.append(Selection(group.strip(), candidates))
    groups = [s.group for s in selections]
    repeated = sorted({g for g in groups if groups.count(g) > 1})
    if repeated:
        raise ConfigError(f"--select names the group(s) {repeated} more than once")
    return selections


def check_selections(selections: Sequence[Selection], variants: Sequence[str]) -> None:
    """Every candidate is a variant of the comparison, and no variant is a candidate of two groups."""
    seen: dict[str, str] = {}
    for selection in selections:
        unknown = [c for c in selection.candidates if c not in variants]
        if unknown:
            raise ConfigError(f"--select {selection.group}: {unknown} not among the variants of this comparison "
                              f"({', '.join(variants)})")
        for candidate in selection.candidates:
            if candidate in seen:
                raise ConfigError(f"--select: variant {candidate!r} is a candidate of both {seen[candidate]!r} and "
                                  f"{selection.group!r}")
            seen[candidate] = selection.group


class _Run(Protocol):
    name: str
    state: str


class Candidate(Protocol):
    """What a choice reads of a variant's summary (:class:`~interlayer.compare.records.VariantSummary`; this module
    does not import it, so that ``compare``'s run processes, which import the package, do not load the records and
    their imports)."""

    name: str
    valid: list[float]
    runs: list[_Run]


def choose(selection: Selection, summaries: Sequence[Candidate], higher_is_better: bool) -> Choice:
    """The candidate with the best mean validation metric, once all their runs have finished."""
    by_name = {s.name: s for s in summaries}
    valid = {c: fmean(by_name[c].valid) if by_name[c].valid else None for c in selection.candidates}
    missing = tuple(r.name for c in selection.candidates for r in by_name[c].runs if r.state != "finished")
    if missing or any(v is None for v in valid.values()):
        return Choice(selection, valid, None, missing)
    sign = 1.0 if higher_is_better else -1.0
    best = max(selection.candidates, key=lambda c: (sign * valid[c], -selection.candidates.index(c)))
    return Choice(selection, valid, best, ())


def choice_lines(choices: Sequence[Choice], metric: str) -> list[str]:
    """One sentence per group for the report."""
    lines = []
    for choice in choices:
        scores = ", ".join(f"{c} {'–' if v is None else f'{v:.2f}'}" for c, v in choice.valid.items())
        if choice.chosen is None:
            lines.append(f"**{choice.selection.group}**: not decided yet, {len(choice.missing)} run(s) of its "
                         f"candidates unfinished ({', '.join(choice.missing)}); validation {metric} so far: {scores}.")
        else:
            lines.append(f"**{choice.selection.group}**: **{choice.chosen}**, the best mean validation {metric} "
                         f"({scores}); its row is the group's result, the others' test numbers are not to be "
                         "quoted as the method's.")
    return lines
