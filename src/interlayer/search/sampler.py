"""The Optuna side of the search: where a study keeps its patterns, and the sampler that draws them.

The draw happens in :meth:`MPTSearchSampler.before_trial` and is written to the trial at once, so concurrent
workers see each other's draws (see :mod:`interlayer.search.mpt`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from .policy import Record, Strategy, all_patterns, decode, encode, propose

PARAM = "permutation"  # the categorical parameter: "0,4,1,5,2,3"
PATTERN_ATTR = "mpt_search:permutation"  # system attr: the sampler's draw, visible to other workers at once
PHASE_ATTR = "phase"  # user attr: reference | coarse | refine | random | exhausted
CONDITIONS_ATTR = "conditions"  # study user attr: what every trial of the study must share
DEFINITION_ATTR = "definition"  # study user attr: N, metric and its direction
STRATEGY_ATTR = "strategy"  # study user attr: the last command's --trials and search knobs (for the report)


@dataclass(frozen=True)
class Definition:
    """What the data and the model decide: the encoder depth N and the validation metric with its direction."""

    n_layers: int
    metric: str
    higher_is_better: bool



def trial_pattern(trial: FrozenTrial) -> Optional[str]:
    """The pattern of a trial in any state: suggested, drawn by the sampler, or enqueued."""
    if PARAM in trial.params:
        return trial.params[PARAM]
    return trial.system_attrs.get(PATTERN_ATTR) or trial.system_attrs.get("fixed_params", {}).get(PARAM)


def study_records(trials: Sequence[FrozenTrial], *, exclude: Optional[int] = None) -> list[Record]:
    """The study's trials that have a pattern, as the strategy reads them (number, pattern, phase, state, value: the
    last only for completed trials), but for trial ``exclude`` (the one being sampled)."""
    records = []
    for t in trials:
        pattern = trial_pattern(t)
        if t.number == exclude or not pattern:
            continue
        value = t.value if t.state == TrialState.COMPLETE else None
        records.append(Record(t.number, decode(pattern), t.user_attrs.get(PHASE_ATTR, ""), t.state, value))
    return records


class MPTSearchSampler(BaseSampler):
    """Sec. 3.4's coarse-then-refine random search as an Optuna sampler of the ``permutation`` parameter.

    As Optuna's own ``GridSampler`` does, the draw happens in :meth:`before_trial` and is written to the trial's
    system attributes at once, so a worker drawing next sees it (RUNNING trials count as taken); the phase is a
    user attribute. Enqueued and retried trials keep their pattern (and the phase they were given). Any other
    parameter an objective may suggest is drawn by a seeded :class:`~optuna.samplers.RandomSampler`.
    """

    def __init__(self, strategy: Strategy) -> None:
        strategy.validate()
        self.strategy = strategy
        self.choices = all_patterns(strategy.n_layers)
        self._fallback = RandomSampler(seed=strategy.seed)

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial_pattern(trial) is not None:
            if PHASE_ATTR not in trial.user_attrs:
                study._storage.set_trial_user_attr(trial._trial_id, PHASE_ATTR, "enqueued")
            return
        records = study_records(study.get_trials(deepcopy=False), exclude=trial.number)
        proposal = propose(self.strategy, records, number=trial.number,
                           higher_is_better=study.direction == StudyDirection.MAXIMIZE)
        drawn = encode(proposal.pattern) if proposal.pattern is not None else self.choices[0]
        study._storage.set_trial_system_attr(trial._trial_id, PATTERN_ATTR, drawn)
        study._storage.set_trial_user_attr(trial._trial_id, PHASE_ATTR, proposal.phase)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if param_name != PARAM:
            return self._fallback.sample_independent(study, trial, param_name, param_distribution)
        return trial.system_attrs[PATTERN_ATTR]


