"""Architecture search over Multi-Pass hard connections (MPT Sec. 3.4), on Optuna.

The space (MPT Sec. 3.2 "Hard Connections"): the permutations ``tau`` of the N encoder layers; outer (second-pass)
layer k receives inner (first-pass) layer ``tau_k`` (``multipass.connection='hard'``, routing as configured, (a)
by default, the paper's choice, Table 1). N! patterns: 720 for the paper's N=6.

The strategy (Sec. 3.4): "there is only one connection swap between neighbouring structures ... we perform a
coarse random search, and forgo search on neighbours of structures with bad results. We instead perform
fine-grained search around models with good performance." The paper gives no numbers; :func:`.policy.propose`
reads it as

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

import contextlib
import fcntl
import json
import math
import multiprocessing
import os
import signal
import socket
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import RDBStorage
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, Trial, TrialState

from ..config_io import dataclass_from_dict
from ..errors import ConfigError, SignalStop
from ..fileio import write_atomic
from ..training.concurrency import (
    ForwardedInterrupts,
    StopSignals,
    available_cores,
    die_with_parent,
    stop_code,
    threads_per_run,
)
from ..training.config import TrainConfig
from .policy import Strategy, decode, encode
from .report import draw_pattern, report_text
from .sampler import (
    CONDITIONS_ATTR,
    DEFINITION_ATTR,
    PARAM,
    PHASE_ATTR,
    STRATEGY_ATTR,
    Definition,
    MPTSearchSampler,
    trial_pattern,
)
from .storage import check_study_file, make_storage, redact

DEFAULT_STUDY = "mpt-search"
DEFAULT_OUTPUT = "runs/search/mpt-{task}"
HEARTBEAT_SECONDS = 60


# -- settings and the study ----------------------------------------------------------------------------------------
@dataclass
class SearchSettings:
    """One ``interlayer search mpt`` command (``sets``: model fields, train.KEY, data.KEY, as ``--set`` text or typed
    values: ``--compile`` gives ``train.compile=True``)."""

    task: str
    trials: int
    output: Path
    preset: Optional[str] = None
    sets: dict[str, Any] = field(default_factory=dict)
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
                  (1 <= self.workers <= available_cores(),
                   f"--workers={self.workers} must be 1..{available_cores()} (processes training at once, at most one "
                   "a core this process may use)"),
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
        sets = {k: v if isinstance(v, str) else json.dumps(v) for k, v in sorted(self.sets.items())}  # as --set text
        return {"task": self.task, "preset": self.preset, "sets": sets,
                "seed": self.seed, "budget_minutes": self.budget_minutes}


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
    from ..experiment import split_overrides

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


def _load(storage: RDBStorage, name: str, sampler: Optional[BaseSampler] = None) -> Optional[optuna.Study]:
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        return None


STUDY_LOCK = "study.lock"


@contextlib.contextmanager
def _creation_lock(output: Path) -> Iterator[None]:
    """Hold ``OUTPUT/study.lock`` (waiting for it) while the storage's tables and the study are made: Optuna's
    schema creation is not safe against a second process doing the same at once, so two searches started together
    on a new ``--output`` failed with a database error. Held only for that moment: the workers then share the study
    as before. The kernel releases the lock when its holder dies, whatever the way."""
    output.mkdir(parents=True, exist_ok=True)
    with (output / STUDY_LOCK).open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def open_study(settings: SearchSettings, definition: Optional[Definition] = None) -> tuple[optuna.Study, Definition]:
    """Load the study (checking this command's conditions against it) or create it, enqueueing the identity.

    A new study refuses an ``--output`` whose ``trials/`` already holds runs (they belong to another study and
    would collide with the new trial numbers). Storage and study are made under :func:`_creation_lock`.
    """
    settings = with_preset(settings)
    output = Path(settings.output)
    if settings.storage_url.startswith("sqlite"):
        check_study_file(settings)  # another program's database: refused before the lock file is made beside it
    if settings.storage is None and not os.path.lexists(output / "study.db"):
        # a new study in the default SQLite file: whatever can refuse it is checked before the file, and the lock
        # beside it, are made, so that a refused command leaves neither behind
        _check_no_foreign_trials(settings)
        definition = definition or resolve_definition(settings)
        _check_space(settings, definition.n_layers)
    with _creation_lock(output):
        return _open_study(settings, definition)


def _check_no_foreign_trials(settings: SearchSettings) -> None:
    """A new study refuses an ``--output`` whose ``trials/`` holds runs: they belong to another study and would
    collide with the new trial numbers."""
    trials_dir = Path(settings.output) / "trials"
    if trials_dir.is_dir() and any(trials_dir.iterdir()):
        raise ConfigError(f"{trials_dir} holds trial runs of another study, but study {settings.study!r} does "
                          f"not exist in {redact(settings.storage_url)}; choose another --output (or "
                          "--storage/--study of the study those runs belong to)")


def _open_study(settings: SearchSettings, definition: Optional[Definition]) -> tuple[optuna.Study, Definition]:
    storage = make_storage(settings)
    study = _load(storage, settings.study)
    if study is None:
        _check_no_foreign_trials(settings)
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
    if results["status"] != "finished":  # the engine saved and stopped on SIGINT/SIGTERM: stop as Ctrl-C does
        raise SignalStop(signal.Signals[results.get("signal", "SIGINT")])
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
               ) -> tuple[str, Optional[int]]:
    """One worker: run trials until the study has ``settings.trials`` complete ones; ``("done", None)`` or
    ``("interrupted", SIGNAL)`` (Ctrl-C's SIGINT or a SIGTERM, between trials or inside one: the running trial ends
    FAIL and its pattern is free again; :class:`~interlayer.training.concurrency.StopSignals`).

    Stopping counts COMPLETE trials only (``MaxTrialsCallback``), so a trial lost by another worker never stops
    the study short; trials other workers are running when the count is reached still finish and are kept.
    """
    if threads:
        import torch

        torch.set_num_threads(threads)
    with StopSignals():
        try:
            study, definition = open_study(settings)
            if completed_count(study) >= settings.trials:
                return "done", None
            sampler: MPTSearchSampler = study.sampler  # type: ignore[assignment]
            callbacks = [MaxTrialsCallback(settings.trials, states=(TrialState.COMPLETE,)),
                         _announcer(settings, definition)]
            while True:
                try:
                    study.optimize(lambda t: _run_trial(t, settings, definition, objective, sampler.choices),
                                   callbacks=callbacks, gc_after_trial=True)
                except optuna.exceptions.UpdateFinishedTrialError as err:  # our heartbeat was late: declared lost
                    print(f"[search] {err}: another worker declared this trial lost (its heartbeats stopped for "
                          f"over {2 * settings.heartbeat_seconds} s); its result is dropped, the worker goes on",
                          flush=True)
                    continue
                return "done", None
        except KeyboardInterrupt as stop:
            return "interrupted", getattr(stop, "signal", signal.SIGINT)


def _worker_process(settings: SearchSettings, objective: Objective, threads: Optional[int]) -> None:
    # A SIGKILLed search forwards nothing: the kernel then sends SIGINT, which ends the trial as Ctrl-C does
    die_with_parent(signal.SIGINT)
    status, stopped = run_worker(settings, objective, threads=threads)
    sys.exit(stop_code(stopped) if status == "interrupted" else 0)


@dataclass
class SearchOutcome:
    status: str  # done | interrupted | failed
    report: str
    worker_exit_codes: list[int] = field(default_factory=list)
    signal: Optional[int] = None  # what stopped an interrupted search (SIGINT, SIGTERM): the exit code 128 + it


def start_study(settings: SearchSettings, definition: Optional[Definition] = None
                ) -> tuple[SearchSettings, Definition]:
    """The command's first step, whoever trains the trials: the settings with the preset named (resolved once:
    the workers need not import the tasks to learn it) and checked, the study created or resumed, this command's
    search knobs recorded for the report."""
    settings = with_preset(settings)
    settings.validate()
    study, stored = open_study(settings, definition)  # makes --output (a refused command makes nothing)
    study.set_user_attr(STRATEGY_ATTR, {"trials": settings.trials, **asdict(settings.strategy(stored.n_layers))})
    return settings, stored


def run_search(settings: SearchSettings, objective: Objective = train_trial,
               definition: Optional[Definition] = None) -> SearchOutcome:
    """The whole command: create or resume the study, run ``settings.workers`` workers on this machine (each its
    own process when more than one), then write ``report.md`` and ``best_pattern.png`` from the storage.

    ``definition`` skips reading the data to learn N and the metric (tests, or a caller that knows them). With
    several workers each gets ``cores // workers`` torch threads
    (:func:`~interlayer.training.concurrency.threads_per_run`) unless ``train.threads`` is set, so that they do
    not oversubscribe the cores (the time budget is wall-clock: oversubscription changes the scores).
    """
    settings, _ = start_study(settings, definition)
    if settings.workers == 1:
        (status, stopped), codes = run_worker(settings, objective), []
    else:
        status, codes, stopped = _run_processes(settings, objective)
    return SearchOutcome(status, write_report(settings), codes, stopped)


def _run_processes(settings: SearchSettings, objective: Objective) -> tuple[str, list[int], Optional[int]]:
    """The workers as processes: the status, their exit codes, and the signal that stopped the search (this
    process's, else a worker's own: ``kill WORKER``)."""
    threads = None if "train.threads" in settings.sets else threads_per_run(settings.workers)
    context = multiprocessing.get_context("spawn")  # no forked copies of torch/sqlalchemy state
    workers = [context.Process(target=_worker_process, args=(settings, objective, threads),
                               name=f"search-worker-{i}") for i in range(settings.workers)]
    # Ctrl-C, or a SIGINT/SIGTERM to this process alone, reaches the workers: they stop their trial (FAIL, its
    # pattern free again) after the current step, and we wait for them
    with ForwardedInterrupts() as interrupts:
        for worker in workers:
            worker.start()
        interrupts.processes = workers
        for worker in workers:
            worker.join()
    codes = [w.exitcode for w in workers]
    stopped = interrupts.signal or next((code - 128 for code in codes if code in (130, 143)), None)
    if stopped is not None:
        return "interrupted", codes, stopped
    return ("failed" if any(codes) else "done"), codes, None


def write_report(settings: SearchSettings) -> str:
    """Write ``OUTPUT/report.md`` and ``OUTPUT/best_pattern.png`` from the storage alone (``--report-only``) and
    return the Markdown. Trials whose heartbeat is older than the grace period are marked FAIL first."""
    database = Path(settings.output) / "study.db"
    if settings.storage is None and not os.path.lexists(database):  # opening it would make an empty one
        raise ConfigError(f"{database} does not exist: no search was started in {settings.output}; check --output "
                          "(or --storage/--study)")
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
    write_atomic(output / "report.md", text)
    if best is not None:
        metric = study.user_attrs[DEFINITION_ATTR]["metric"]
        draw_pattern(best.pattern, output / "best_pattern.png",
                     f"best searched pattern [{encode(best.pattern)}] (N={len(best.pattern)}, trial {best.number}):"
                     f" valid {metric} {best.value:.4g}")
    return text
