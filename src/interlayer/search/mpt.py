"""Architecture search over Multi-Pass hard connections (MPT Sec. 3.4), on Optuna.

The space (MPT Sec. 3.2 "Hard Connections"): the permutations ``tau`` of the N encoder layers; outer (second-pass)
layer k receives inner (first-pass) layer ``tau_k`` (``multipass.connection='hard'``, routing as configured, (a)
by default, the paper's choice, Table 1). N! patterns: 720 for the paper's N=6.

The strategy (Sec. 3.4): "there is only one connection swap between neighbouring structures ... we perform a
coarse random search, and forgo search on neighbours of structures with bad results. We instead perform
fine-grained search around models with good performance." The paper gives no numbers; :func:`propose` reads it as

1. **reference**: the identity ``[0..N-1]`` (the default MPT, Table 1 "[0,1,2,3,4,5]") is enqueued as trial 0,
   the score every other pattern is compared with;
2. **coarse**: ``coarse`` distinct patterns drawn uniformly at random;
3. **refine**: a random single swap (two outer layers exchange their inner sources) of one of the ``top_k``
   best completed patterns, never a pattern within one swap of a **poor** pattern, i.e. one in the worst
   ``poor_fraction`` (default half) of the completed trials and not tied with a better one. Poor and good are
   disjoint: with few completed trials the top-k shrinks so that no poor pattern is refined;
4. **random**: when every such neighbourhood is used up, a random pattern that is not within one swap of a poor
   one (any untried pattern once those are gone too).

No pattern is proposed twice while it is queued, running or complete (a ``FAIL``ed trial: lost, interrupted or
crashed, frees its pattern). Every draw is a pure function of the study's history, the seed and the trial
number, and is written to the storage before training starts, so concurrent workers see each other's draws and
draw with different random streams; two draws that still collide (read the history in the same instant) are
caught when the trial starts, and the later trial is pruned without training.

Every trial trains one model with :func:`interlayer.experiment.train` (same seed, same budget, ``score_test=False``)
and is scored by its best *validation* metric; the test set is never read. The study lives in any Optuna RDB
storage (SQLite by default, PostgreSQL for many machines) with heartbeats, so the trial of a killed worker turns
``FAIL`` after the grace period and, optionally, is retried. See ``docs/search.md``.
"""
from __future__ import annotations

import datetime
import itertools
import json
import math
import multiprocessing
import os
import random
import socket
import sys
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import optuna
import sqlalchemy
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.study import MaxTrialsCallback, StudyDirection
from optuna.trial import FrozenTrial, Trial, TrialState

from ..core.config import ConfigError
from ..tables import format_table

PARAM = "permutation"  # the categorical parameter: "0,4,1,5,2,3"
PATTERN_ATTR = "mpt_search:permutation"  # system attr: the sampler's draw, visible to other workers at once
PHASE_ATTR = "phase"  # user attr: reference | coarse | refine | random | exhausted
CONDITIONS_ATTR = "conditions"  # study user attr: what every trial of the study must share
DEFINITION_ATTR = "definition"  # study user attr: N, metric and its direction
STRATEGY_ATTR = "strategy"  # study user attr: the last command's --trials and search knobs (for the report)
MAX_LAYERS = 7  # Optuna stores every categorical choice with every trial: 8! = 40,320 choices is 0.75 MB a trial
DEFAULT_STUDY = "mpt-search"
DEFAULT_OUTPUT = "runs/search/mpt-{task}"
HEARTBEAT_SECONDS = 60
DPI = 100


# -- patterns ------------------------------------------------------------------------------------------------------
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


# -- the search policy (pure: history in, pattern out) --------------------------------------------------------------
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
        if self.top_k < 1:
            raise ConfigError(f"--top-k={self.top_k} must be at least 1")
        if not 0.0 <= self.poor_fraction < 1.0:
            raise ConfigError(f"--poor-fraction={self.poor_fraction} must lie in [0, 1): the share of completed "
                              "trials whose neighbours are skipped")


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


# -- the Optuna sampler --------------------------------------------------------------------------------------------
def trial_pattern(trial: FrozenTrial) -> Optional[str]:
    """The pattern of a trial in any state: suggested, drawn by the sampler, or enqueued."""
    if PARAM in trial.params:
        return trial.params[PARAM]
    return trial.system_attrs.get(PATTERN_ATTR) or trial.system_attrs.get("fixed_params", {}).get(PARAM)


def study_records(trials: Sequence[FrozenTrial], *, exclude: Optional[int] = None) -> list[Record]:
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


# -- settings and the study ----------------------------------------------------------------------------------------
@dataclass
class SearchSettings:
    """One ``interlayer search mpt`` command (``sets`` as ``--set`` strings: model fields, train.KEY, data.KEY)."""

    task: str
    trials: int
    output: Path
    preset: Optional[str] = None
    sets: dict[str, str] = field(default_factory=dict)
    coarse: Optional[int] = None  # default (trials - 1) // 2: half the trials, the identity included
    top_k: int = 3
    poor_fraction: float = 0.5
    budget_minutes: Optional[float] = None
    storage: Optional[str] = None  # default sqlite:///OUTPUT/study.db
    study: str = DEFAULT_STUDY
    seed: int = 1
    workers: int = 1
    retry_lost: int = 0  # re-run a lost trial's pattern this many times
    heartbeat_seconds: int = HEARTBEAT_SECONDS  # a RUNNING trial is lost after 2 x this without a heartbeat

    def validate(self) -> None:
        checks = [(self.trials >= 1, f"--trials={self.trials} must be at least 1"),
                  (self.workers >= 1, f"--workers={self.workers} must be at least 1"),
                  (self.retry_lost >= 0, f"--retry-lost={self.retry_lost} must not be negative"),
                  (self.heartbeat_seconds >= 1, f"--heartbeat={self.heartbeat_seconds} must be at least 1 second"),
                  (self.budget_minutes is None or self.budget_minutes > 0,
                   f"--budget-minutes={self.budget_minutes} must be positive")]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        fixed = sorted(k for k in self.sets if k in ("multipass.connection", "multipass.permutation", "multipass"))
        if fixed:
            raise ConfigError(f"--set {', '.join(fixed)}: the search sets multipass.connection=hard and "
                              "multipass.permutation itself; remove these (other multipass.* keys are kept)")

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(Path(self.output) / 'study.db').resolve()}"

    def strategy(self, n_layers: int) -> Strategy:
        coarse = (self.trials - 1) // 2 if self.coarse is None else self.coarse
        return Strategy(n_layers, coarse, self.top_k, self.poor_fraction, self.seed)

    def conditions(self) -> dict[str, Any]:
        """What every trial of one study shares (a worker with other conditions is refused)."""
        return {"task": self.task, "preset": self.preset, "sets": {k: str(v) for k, v in sorted(self.sets.items())},
                "seed": self.seed, "budget_minutes": self.budget_minutes}


@dataclass(frozen=True)
class Definition:
    """What the data and the model decide: the encoder depth N and the validation metric with its direction."""

    n_layers: int
    metric: str
    higher_is_better: bool


def task_spec(name: str) -> Any:
    """The task's :class:`~interlayer.tasks.TaskSpec` (imported late: the tasks import torch and their data code)."""
    from ..tasks import task_specs

    specs = task_specs()
    if name not in specs:
        raise ConfigError(f"unknown --task {name!r}; known tasks: {', '.join(specs)}")
    return specs[name]


def with_preset(settings: SearchSettings) -> SearchSettings:
    """The settings with the task's default preset named, so that a study records what it trains."""
    return replace(settings, preset=settings.preset or task_spec(settings.task).default_preset)


def resolve_definition(settings: SearchSettings) -> Definition:
    """Build the task (reads the data, e.g. trains the BPE) and resolve the model with the identity pattern, so
    that a bad ``--set`` or data path fails before any worker starts."""
    from ..config import dataclass_from_dict
    from ..experiment import split_overrides
    from ..training import TrainConfig

    spec = task_spec(settings.task)
    model_sets, train_sets, data_sets = split_overrides(settings.sets)
    train_cfg = dataclass_from_dict(TrainConfig, {**spec.train_defaults, **train_sets}, "train.")
    train_cfg.validate()
    task = spec.make_task(dataclass_from_dict(spec.data_class, data_sets, "data."), train_cfg, None)
    preset = settings.preset or spec.default_preset
    cfg = spec.resolve_model(preset, model_sets, task)
    n_layers = getattr(cfg, "enc_layers", None)
    if n_layers is None:
        raise ConfigError(f"--preset {preset} is not a Transformer encoder; the MPT search permutes encoder layers")
    spec.resolve_model(preset, {**model_sets, "multipass.connection": "hard",
                                "multipass.permutation": list(range(n_layers))}, task)
    return Definition(n_layers, task.metric, bool(task.higher_is_better))


def make_storage(settings: SearchSettings) -> RDBStorage:
    """An RDB storage with heartbeats: a RUNNING trial silent for 2 heartbeats turns FAIL (and is retried
    ``retry_lost`` times).

    SQLite ignores the row locks (``SELECT ... FOR UPDATE``) Optuna relies on, so two workers could pop the same
    queued trial; every SQLite transaction therefore starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's recipe for
    serialisable pysqlite transactions), serialising the workers' short reads and writes, and waits up to a minute
    for the lock. PostgreSQL needs none of this.
    """
    url = settings.storage_url
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the search prints its own lines; errors propagate
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
    sqlite = url.startswith("sqlite")
    engine = {"connect_args": {"timeout": 60, "isolation_level": None}} if sqlite else {"pool_pre_ping": True}
    retry = RetryHeartbeatStaleTrialCallback(max_retry=settings.retry_lost) if settings.retry_lost else None
    try:
        storage = RDBStorage(url, engine_kwargs=engine, heartbeat_interval=settings.heartbeat_seconds,
                             grace_period=2 * settings.heartbeat_seconds, heartbeat_stale_trial_callback=retry)
    except ModuleNotFoundError as err:
        raise ConfigError(f"--storage {redact(url)} needs the database driver {err.name!r} (PostgreSQL: pip install "
                          "psycopg2-binary)") from err
    except Exception as err:  # sqlalchemy: bad URL, unreachable server, wrong password
        raise ConfigError(f"--storage {redact(url)}: {type(err).__name__}: {err}") from err
    if sqlite:
        sqlalchemy.event.listen(storage.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    return storage


def redact(url: str) -> str:
    """The storage URL without its password (it goes into reports and logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy understands: show the scheme only
        return url.split("://", 1)[0] + "://..."


def _load(storage: RDBStorage, name: str, sampler: Optional[BaseSampler] = None) -> Optional[optuna.Study]:
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        return None


def open_study(settings: SearchSettings, definition: Optional[Definition] = None) -> tuple[optuna.Study, Definition]:
    """Load the study (checking this command's conditions against it) or create it, enqueueing the identity.

    A new study refuses an ``--output`` whose ``trials/`` already holds runs (they belong to another study and
    would collide with the new trial numbers).
    """
    settings = with_preset(settings)
    storage = make_storage(settings)
    study = _load(storage, settings.study)
    if study is None:
        trials_dir = Path(settings.output) / "trials"
        if trials_dir.is_dir() and any(trials_dir.iterdir()):
            raise ConfigError(f"{trials_dir} holds trial runs of another study, but study {settings.study!r} does "
                              f"not exist in {redact(settings.storage_url)}; choose another --output (or "
                              "--storage/--study of the study those runs belong to)")
        definition = definition or resolve_definition(settings)
        _check_space(settings, definition.n_layers)
        direction = "maximize" if definition.higher_is_better else "minimize"
        study = optuna.create_study(study_name=settings.study, storage=storage, direction=direction,
                                    load_if_exists=True)
        if CONDITIONS_ATTR not in study.user_attrs:
            study.set_user_attr(CONDITIONS_ATTR, settings.conditions())
            study.set_user_attr(DEFINITION_ATTR, asdict(definition))
    stored = Definition(**study.user_attrs[DEFINITION_ATTR])
    _check_conditions(settings, study)
    _check_space(settings, stored.n_layers)
    if definition is not None and definition != stored:
        raise ConfigError(f"study {settings.study!r} searches {stored}, not {definition}")
    _enqueue_identity(study, stored.n_layers)
    sampler = MPTSearchSampler(settings.strategy(stored.n_layers))
    return _load(storage, settings.study, sampler), stored


def _check_space(settings: SearchSettings, n_layers: int) -> None:
    settings.strategy(n_layers).validate()
    if settings.trials > math.factorial(n_layers):
        raise ConfigError(f"--trials={settings.trials}: N={n_layers} encoder layers have only "
                          f"{math.factorial(n_layers)} patterns")


def _check_conditions(settings: SearchSettings, study: optuna.Study) -> None:
    stored, ours = study.user_attrs.get(CONDITIONS_ATTR), settings.conditions()
    if stored is None:
        raise ConfigError(f"study {settings.study!r} in {redact(settings.storage_url)} was not made by "
                          "`interlayer search mpt`; choose another --study")
    differ = {k: (stored.get(k), ours[k]) for k in ours if stored.get(k) != ours[k]}
    if differ:
        shown = "; ".join(f"{k}: study has {a!r}, this command {b!r}" for k, (a, b) in differ.items())
        raise ConfigError(f"study {settings.study!r} in {redact(settings.storage_url)} was started with other "
                          f"settings ({shown}). All trials of a study must be trained alike: repeat the first "
                          "command's --task/--preset/--set/--seed/--budget-minutes, or use another --study")


def _enqueue_identity(study: optuna.Study, n_layers: int) -> None:
    """Trial 0 is the identity, the default MPT that every pattern is compared with: queued unless a trial that
    has not failed holds it (so an interrupted or lost identity is queued again; two workers enqueueing it at the
    same instant are resolved by the duplicate check)."""
    identity = encode(range(n_layers))
    live = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE))
    if not any(trial_pattern(t) == identity for t in live):
        study.enqueue_trial({PARAM: identity}, user_attrs={PHASE_ATTR: "reference"})


# -- trials --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRequest:
    number: int
    permutation: list[int]
    run_dir: Path
    settings: SearchSettings
    definition: Definition


@dataclass(frozen=True)
class TrialResult:
    score: float  # the definition's metric on the validation set (best epoch)
    valid: dict[str, float] = field(default_factory=dict)
    train_minutes: Optional[float] = None
    stop_reason: str = ""


Objective = Callable[[TrialRequest], TrialResult]


def train_trial(request: TrialRequest) -> TrialResult:
    """One pattern trained by :func:`experiment.train` under the study's seed and budget, scored on validation.

    The run is ``OUTPUT/trials/<number>`` (an ordinary run directory). A run stopped by Ctrl-C/SIGTERM raises
    :class:`KeyboardInterrupt`: the trial ends FAIL and its pattern may be drawn again.
    """
    from ..experiment import train

    s = request.settings
    sets = {**s.sets, "multipass.connection": "hard", "multipass.permutation": json.dumps(request.permutation)}
    results = train(task_spec(s.task), preset=s.preset, sets=sets, seed=s.seed, max_minutes=s.budget_minutes,
                    run_dir=request.run_dir, progress=False, score_test=False)
    if results["status"] != "finished":
        raise KeyboardInterrupt(f"trial {request.number} stopped by a signal ({results.get('stop_reason')})")
    valid = results["best_valid"]
    return TrialResult(float(valid[request.definition.metric]), valid, results["train_minutes"],
                       results["stop_reason"])


def _earlier_holder(trial: Trial, pattern: str) -> Optional[int]:
    """The number of an earlier RUNNING/COMPLETE trial with the same pattern (a draw that raced with ours)."""
    for other in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE)):
        if other.number < trial.number and trial_pattern(other) == pattern:
            return other.number
    return None


def _first_heartbeat(trial: Trial) -> None:
    """Record the trial's heartbeat now, before any work. Optuna's heartbeat thread records the first one
    concurrently, and its stale check skips RUNNING trials that have none: a worker killed before that first write
    would leave its trial RUNNING for ever instead of lost."""
    storage = trial.study._storage
    if getattr(storage, "get_heartbeat_interval", lambda: None)() is not None:
        storage.record_heartbeat(trial._trial_id)


def _run_trial(trial: Trial, settings: SearchSettings, definition: Definition, objective: Objective,
               choices: list[str]) -> float:
    pattern = trial.suggest_categorical(PARAM, choices)
    if trial.user_attrs.get(PHASE_ATTR) == "exhausted":
        trial.study.stop()
        raise optuna.TrialPruned("every pattern is queued, running or complete")
    holder = _earlier_holder(trial, pattern)
    if holder is not None:
        trial.set_user_attr("duplicate_of", holder)
        raise optuna.TrialPruned(f"pattern {pattern} was drawn by trial {holder} at the same time")
    _first_heartbeat(trial)
    run_dir = Path(settings.output) / "trials" / str(trial.number)
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("run_dir", str(run_dir.resolve()))
    request = TrialRequest(trial.number, list(decode(pattern)), run_dir, settings, definition)
    try:
        result = objective(request)
    except KeyboardInterrupt:
        trial.set_user_attr("interrupted", True)
        raise
    except Exception as err:
        trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:500])
        raise
    trial.set_user_attr("valid", result.valid)
    trial.set_user_attr("train_minutes", result.train_minutes)
    trial.set_user_attr("stop_reason", result.stop_reason)
    if math.isnan(result.score):  # a diverged pattern is a (poor) result, not a failure: the worst score
        trial.set_user_attr("stop_reason", f"{definition.metric} is NaN (diverged); scored as the worst")
        return -math.inf if definition.higher_is_better else math.inf
    return result.score


def _announcer(settings: SearchSettings, definition: Definition) -> Callable[[optuna.Study, FrozenTrial], None]:
    def announce(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state != TrialState.COMPLETE:
            return
        best = study.best_trial
        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        print(f"[search] trial {trial.number} ({trial.user_attrs.get(PHASE_ATTR)}) [{trial.params[PARAM]}]: "
              f"{definition.metric} {trial.value:.4g}; best {best.value:.4g} (trial {best.number}); "
              f"{done}/{settings.trials} complete", flush=True)

    return announce


def completed_count(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def run_worker(settings: SearchSettings, objective: Objective = train_trial, *, threads: Optional[int] = None
               ) -> str:
    """One worker: run trials until the study has ``settings.trials`` complete ones; ``"done"`` or
    ``"interrupted"`` (Ctrl-C/SIGTERM: the running trial ends FAIL and its pattern is free again).

    Stopping counts COMPLETE trials only (``MaxTrialsCallback``), so a trial lost by another worker never stops
    the study short; trials other workers are running when the count is reached still finish and are kept.
    """
    if threads:
        import torch

        torch.set_num_threads(threads)
    study, definition = open_study(settings)
    if completed_count(study) >= settings.trials:
        return "done"
    sampler: MPTSearchSampler = study.sampler  # type: ignore[assignment]
    callbacks = [MaxTrialsCallback(settings.trials, states=(TrialState.COMPLETE,)), _announcer(settings, definition)]
    while True:
        try:
            study.optimize(lambda t: _run_trial(t, settings, definition, objective, sampler.choices),
                           callbacks=callbacks, gc_after_trial=True)
        except KeyboardInterrupt:
            return "interrupted"
        except optuna.exceptions.UpdateFinishedTrialError as err:  # our heartbeat was late: declared lost
            print(f"[search] {err}: another worker declared this trial lost (its heartbeats stopped for over "
                  f"{2 * settings.heartbeat_seconds} s); its result is dropped, the worker goes on", flush=True)
            continue
        return "done"


def _worker_process(settings: SearchSettings, objective: Objective, threads: Optional[int]) -> None:
    sys.exit(130 if run_worker(settings, objective, threads=threads) == "interrupted" else 0)


@dataclass
class SearchOutcome:
    status: str  # done | interrupted | failed
    report: str
    worker_exit_codes: list[int] = field(default_factory=list)


def run_search(settings: SearchSettings, objective: Objective = train_trial,
               definition: Optional[Definition] = None) -> SearchOutcome:
    """The whole command: create or resume the study, run ``settings.workers`` workers on this machine (each its
    own process when more than one), then write ``report.md`` and ``best_pattern.png`` from the storage.

    ``definition`` skips reading the data to learn N and the metric (tests, or a caller that knows them). With
    several workers each gets ``cpu_count // workers`` torch threads unless ``train.threads`` is set, so that they
    do not oversubscribe the cores (the time budget is wall-clock: oversubscription changes the scores).
    """
    settings = with_preset(settings)  # resolved once: the workers need not import the tasks to learn it
    settings.validate()
    Path(settings.output).mkdir(parents=True, exist_ok=True)
    study, stored = open_study(settings, definition)
    study.set_user_attr(STRATEGY_ATTR, {"trials": settings.trials, **asdict(settings.strategy(stored.n_layers))})
    if settings.workers == 1:
        status, codes = run_worker(settings, objective), []
    else:
        status, codes = _run_processes(settings, objective)
    return SearchOutcome(status, write_report(settings), codes)


def _run_processes(settings: SearchSettings, objective: Objective) -> tuple[str, list[int]]:
    threads = None if "train.threads" in settings.sets else max(1, (os.cpu_count() or 1) // settings.workers)
    context = multiprocessing.get_context("spawn")  # no forked copies of torch/sqlalchemy state
    workers = [context.Process(target=_worker_process, args=(settings, objective, threads),
                               name=f"search-worker-{i}") for i in range(settings.workers)]
    for worker in workers:
        worker.start()
    interrupted = False
    while True:  # Ctrl-C reaches the workers too; they finish their step, and we wait for them
        try:
            for worker in workers:
                worker.join()
            break
        except KeyboardInterrupt:
            interrupted = True
    codes = [w.exitcode for w in workers]
    if interrupted or 130 in codes:
        return "interrupted", codes
    return ("failed" if any(codes) else "done"), codes


# -- report --------------------------------------------------------------------------------------------------------
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


def write_report(settings: SearchSettings) -> str:
    """Write ``OUTPUT/report.md`` and ``OUTPUT/best_pattern.png`` from the storage alone (``--report-only``) and
    return the Markdown. Trials whose heartbeat is older than the grace period are marked FAIL first."""
    study = _load(make_storage(settings), settings.study)
    if study is None:
        raise ConfigError(f"no study {settings.study!r} in {redact(settings.storage_url)}; check --storage/--study "
                          "(--output decides the default SQLite file)")
    if CONDITIONS_ATTR not in study.user_attrs:
        raise ConfigError(f"study {settings.study!r} was not made by `interlayer search mpt`")
    optuna.storages.fail_stale_trials(study)
    text, best = report_text(study, redact(settings.storage_url))
    output = Path(settings.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.md").write_text(text)
    if best is not None:
        metric = study.user_attrs[DEFINITION_ATTR]["metric"]
        draw_pattern(best.pattern, output / "best_pattern.png",
                     f"best searched pattern [{encode(best.pattern)}] (N={len(best.pattern)}, trial {best.number}):"
                     f" valid {metric} {best.value:.4g}")
    return text
