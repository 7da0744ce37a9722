"""The search report: a Markdown table of every trial, best first, and MPT Fig. 3's picture of a pattern.

Both are made from the study alone (no data, no training), so ``--report-only`` works on any machine that reaches
the storage.
"""
from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import optuna
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch
from optuna.trial import FrozenTrial, TrialState

from ..tables import format_table
from .policy import Record, encode, rank_completed
from .sampler import (
    CONDITIONS_ATTR,
    DEFINITION_ATTR,
    PHASE_ATTR,
    STRATEGY_ATTR,
    Definition,
    study_records,
    trial_pattern,
)

DPI = 100


def _minutes(trial: FrozenTrial) -> Optional[float]:
    if trial.datetime_start is None:
        return None
    end = trial.datetime_complete or datetime.datetime.now()
    return (end - trial.datetime_start).total_seconds() / 60


def _note(trial: FrozenTrial) -> str:
    notes = []
    if "failed_trial" in trial.system_attrs:
        notes.append(f"retry of trial {trial.system_attrs['failed_trial']}")
    if trial.state == TrialState.FAIL:
        if "error" in trial.user_attrs:
            notes.append(f"error: {trial.user_attrs['error']}")
        elif trial.user_attrs.get("interrupted"):
            notes.append("interrupted (Ctrl-C/SIGTERM)")
        else:
            notes.append("lost: no heartbeat (worker killed or machine down)")
    elif trial.state == TrialState.RUNNING:
        notes.append(f"running on {trial.user_attrs.get('host', '?')}")
    elif trial.state == TrialState.COMPLETE:
        notes.append(trial.user_attrs.get("stop_reason", ""))
    return "; ".join(n for n in notes if n).replace("|", "/")


def _fmt(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4g}"


def report_text(study: optuna.Study, storage_label: str) -> tuple[str, Optional[Record]]:
    """The Markdown report of a search study and its best completed trial (None before any completed)."""
    definition = Definition(**study.user_attrs[DEFINITION_ATTR])
    trials = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING and trial_pattern(t)]
    shown = [t for t in trials if t.state != TrialState.PRUNED]
    ranked = rank_completed(study_records(shown), definition.higher_is_better)
    order = {r.number: i for i, r in enumerate(ranked)}
    shown.sort(key=lambda t: (order.get(t.number, len(order)), t.number))
    rows = [[str(order[t.number] + 1) if t.number in order else "", str(t.number), f"[{trial_pattern(t)}]",
             t.user_attrs.get(PHASE_ATTR, ""), _fmt(t.value if t.state == TrialState.COMPLETE else None),
             t.state.name, "" if _minutes(t) is None else f"{_minutes(t):.2f}", _note(t)] for t in shown]
    table = format_table(["rank", "trial", "permutation", "phase", f"valid {definition.metric}", "state", "minutes",
                          "note"], rows)
    strategy = study.user_attrs.get(STRATEGY_ATTR, {})
    lines = [f"# Multi-Pass hard-connection search: study `{study.study_name}`", "",
             _describe(study.user_attrs[CONDITIONS_ATTR], definition, strategy, storage_label), "",
             _counts(trials, strategy.get("trials")), ""]
    lines += _headline(ranked, tuple(range(definition.n_layers)), definition)
    lines += ["", "![best pattern](best_pattern.png)" if ranked else "", "", table, ""]
    return "\n".join(lines), (ranked[0] if ranked else None)


def _describe(conditions: dict[str, Any], definition: Definition, strategy: dict[str, Any], storage: str) -> str:
    sets = " ".join(f"--set {k}={v}" for k, v in conditions["sets"].items()) or "no --set"
    budget = conditions["budget_minutes"]
    knobs = (f"coarse {strategy['coarse']}, top-k {strategy['top_k']}, poor = the worst "
             f"{strategy['poor_fraction']:g} of the completed trials" if strategy else "not recorded")
    return (f"Task `{conditions['task']}`, preset `{conditions['preset']}` ({sets}); N = {definition.n_layers} "
            f"encoder layers, {math.factorial(definition.n_layers):,} hard patterns (`multipass.connection=hard`). "
            f"Every trial: seed {conditions['seed']}, "
            + (f"{budget:g} training minutes" if budget else "the task's training limits (no time budget)")
            + f"; score: the best epoch's validation {definition.metric} "
            f"({'higher' if definition.higher_is_better else 'lower'} is better); the test set is never used. "
            f"Strategy (MPT Sec. 3.4): {knobs}. Storage `{storage}`.")


def _counts(trials: Sequence[FrozenTrial], requested: Optional[int]) -> str:
    count = {s: sum(t.state == s for t in trials) for s in TrialState}
    phases: dict[str, int] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE:
            phase = t.user_attrs.get(PHASE_ATTR, "?")
            phases[phase] = phases.get(phase, 0) + 1
    by_phase = ", ".join(f"{k} {v}" for k, v in phases.items()) or "none"
    return (f"Trials: {count[TrialState.COMPLETE]} complete of {requested or '?'} requested ({by_phase}), "
            f"{count[TrialState.RUNNING]} running, {count[TrialState.FAIL]} failed or lost, "
            f"{count[TrialState.PRUNED]} draws skipped untrained (a concurrent duplicate, or every pattern taken).")


def _headline(ranked: Sequence[Record], identity: tuple[int, ...], definition: Definition) -> list[str]:
    """Best, identity, and the best pattern other than the identity against it (the search's question)."""
    if not ranked:
        return ["No trial has completed yet."]
    metric, best = definition.metric, ranked[0]
    lines = [f"- best: [{encode(best.pattern)}] (trial {best.number}, {best.phase}): {metric} {best.value:.4g}"]
    reference = next((r for r in ranked if r.pattern == identity), None)
    if reference is None:
        return lines + [f"- identity [{encode(identity)}]: not complete yet"]
    lines.append(f"- identity [{encode(identity)}] (trial {reference.number}): {metric} {reference.value:.4g}")
    other = next((r for r in ranked if r.pattern != identity), None)
    if other is not None:
        gain = (other.value - reference.value) * (1 if definition.higher_is_better else -1)
        lines.append(f"- best other than the identity: [{encode(other.pattern)}] (trial {other.number}): {metric} "
                     f"{other.value:.4g}, {gain:+.4g} {'better' if gain > 0 else 'worse' if gain < 0 else 'equal'} "
                     f"({'at least' if gain >= 0 else 'below'} the identity's score). One seed per pattern: confirm "
                     "a small gap with several seeds (the maximum of many noisy scores is biased upwards).")
    return lines


def draw_pattern(permutation: Sequence[int], path: Path, title: str) -> None:
    """MPT Fig. 3 style: the inner (first-pass) stack left, the outer (second-pass) stack right, layer 0 at the
    bottom, the embedding feeding both; an arrow from inner ``tau_k`` to outer k, coloured by the path it makes
    (Sec. 4.2: deep inner -> shallow outer lengthens the longest path, shallow inner -> deep outer adds a short
    one)."""
    n = len(permutation)
    fig = Figure(figsize=(7.0, 2.2 + 0.8 * (n + 1)), dpi=DPI)
    ax = fig.add_axes((0.02, 0.8 / (2.2 + 0.8 * (n + 1)), 0.96, 1 - 1.4 / (2.2 + 0.8 * (n + 1))))
    ax.set_xlim(-1.6, 7.6)
    ax.set_ylim(-1.6, n + 0.3)
    ax.axis("off")
    width, height, inner_x, outer_x = 2.0, 0.56, 0.0, 5.0
    colours = {"long": "#c0392b", "short": "#2471a3", "same": "#7f8c8d"}

    def box(x: float, y: float, text: str, colour: str) -> None:
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height, boxstyle="round,pad=0.04",
                                    facecolor=colour, edgecolor="black", linewidth=1.0))
        ax.text(x, y, text, ha="center", va="center", fontsize=9)

    def arrow(start: tuple[float, float], end: tuple[float, float], colour: str = "black", lw: float = 1.0) -> None:
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=colour, lw=lw,
                                                              shrinkA=0, shrinkB=0))

    box((inner_x + outer_x) / 2, -1.0, "embedding", "#eeeeee")
    for x, name, colour in ((inner_x, "inner", "#fdebd0"), (outer_x, "outer", "#d6eaf8")):
        arrow(((inner_x + outer_x) / 2 + (x - 2.5) * 0.2, -1.0 + height / 2), (x, -height / 2))
        for k in range(n):
            label = f"{name} {k}" if name == "inner" else f"outer {k} \u2190 inner {permutation[k]}"
            box(x, k, label, colour)
            if k + 1 < n:
                arrow((x, k + height / 2), (x, k + 1 - height / 2))
    for k, j in enumerate(permutation):
        kind = "long" if j > k else "short" if j < k else "same"
        arrow((inner_x + width / 2, j), (outer_x - width / 2, k), colours[kind], lw=1.8)
    ax.text(inner_x, n - 0.2, "pass 1 (inner)", ha="center", fontsize=10, weight="bold")
    ax.text(outer_x, n - 0.2, "pass 2 (outer)", ha="center", fontsize=10, weight="bold")
    handles = [Line2D([], [], color=colours["long"], lw=2, label="deeper inner \u2192 shallower outer (long path)"),
               Line2D([], [], color=colours["short"], lw=2, label="shallower inner \u2192 deeper outer (short path)"),
               Line2D([], [], color=colours["same"], lw=2, label="same depth (default MPT)")]
    fig.legend(handles=handles, loc="lower center", fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=DPI)


