"""``search mpt --launcher submitit``: every trial one SLURM job, the study driven from here (Optuna's ask and
tell), so the jobs never touch the study's database (:mod:`interlayer.training.cluster`).

The driver asks the study for a trial (the sampler draws its pattern as for a local worker:
:meth:`~interlayer.search.sampler.MPTSearchSampler.before_trial`), submits its training as a job, and tells the
study the job's validation score when it ends; ``--workers`` trials are in flight at once, and those that start
together go as one job array. The rules of the local workers hold: an exhausted space stops the search, a pattern
drawn twice is pruned untrained, a diverged trial is complete with the worst score, a failed or cancelled job fails
its trial (its pattern is free again). The driver keeps each in-flight trial's heartbeat, so if the driver dies its
trials turn ``FAIL`` after the grace period as a lost worker's do.

``OUTPUT/jobs.json`` records each trial's job. A driver started again (the same command) follows the jobs of
trials still ``RUNNING`` instead of drawing new trials for them, and tells their results when they end; Ctrl-C
stops the driver, not the jobs.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import optuna
from optuna.trial import TrialState

from ..errors import ConfigError
from ..fileio import write_json
from ..training.cluster import (
    JOBS_FILE,
    POLL_SECONDS,
    LauncherSettings,
    attach,
    check_launcher,
    job_body,
    job_identity,
    job_result,
    job_state,
    make_executor,
    read_job_record,
    refresh,
    remove_stray_folder,
    submit_all,
)
from ..training.concurrency import ForwardedInterrupts
from .mpt import (
    Objective,
    SearchOutcome,
    SearchSettings,
    TrialRequest,
    TrialResult,
    _earlier_holder,
    _first_heartbeat,
    completed_count,
    open_study,
    start_study,
    train_trial,
    write_report,
)
from .policy import decode
from .sampler import PARAM, PHASE_ATTR, Definition

SUBMITIT_FOLDER = "slurm"


def run_search_jobs(settings: SearchSettings, launcher: LauncherSettings, objective: Objective = train_trial,
                    definition: Optional[Definition] = None) -> SearchOutcome:
    """``search mpt --launcher submitit``: :func:`~interlayer.search.mpt.run_search` with every trial a job
    (module docstring); ``objective`` must be importable by the jobs (a module-level function or class). What can
    refuse the launcher and the job record is checked before the study is made or opened."""
    check_launcher(launcher)
    read_job_record(Path(settings.output) / JOBS_FILE, "trials")
    settings, stored = start_study(settings, definition)
    jobs = TrialJobs(settings, launcher, objective)
    status = jobs.run(stored)
    return SearchOutcome(status, write_report(settings), signal=jobs.stop_signal)


def trial_in_job(job: dict[str, Any]) -> Optional[TrialResult]:
    """A trial inside its job: the objective's result, or None when a signal stopped the training (the time
    limit, a preemption: the trial fails and its pattern is free again)."""
    try:
        return job["objective"](job["request"])
    except KeyboardInterrupt:
        return None


@dataclass
class _InFlight:
    trial: optuna.trial.Trial
    job: Any
    state: str


class TrialJobs:
    """The driver of a study whose trials are cluster jobs (module docstring)."""

    def __init__(self, settings: SearchSettings, launcher: LauncherSettings, objective: Objective) -> None:
        self.settings, self.launcher, self.objective = settings, launcher, objective
        self.output = Path(settings.output)
        self.folder = self.output / SUBMITIT_FOLDER
        self.executor = make_executor(launcher, self.folder, f"search-{settings.study}")
        self.record_path = self.output / JOBS_FILE
        self.record: dict[str, Any] = read_job_record(self.record_path, "trials")
        self.flight: dict[int, _InFlight] = {}
        self.exhausted = False  # every pattern is queued, running or complete
        self.stop_signal: Optional[int] = None  # the signal that stopped the driver (SIGINT, SIGTERM), if one did

    def run(self, definition: Optional[Definition] = None) -> str:
        """Drive the study until ``settings.trials`` trials are complete: ``"done"`` or ``"interrupted"``."""
        study, definition = open_study(self.settings, definition)
        self.study, self.definition = study, definition
        self._follow_earlier(study)
        with ForwardedInterrupts() as interrupts, warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for optimize(); this driver keeps them itself, every poll
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            while not interrupts.requested:
                for flight in self.flight.values():
                    _first_heartbeat(flight.trial)  # the driver is alive: so are its trials
                if not self.exhausted:
                    wanted = self.settings.trials - completed_count(study) - len(self.flight)
                    self._start(min(wanted, self.settings.workers - len(self.flight)))
                if not self.flight:
                    break
                if self.launcher.cluster == "slurm":
                    refresh([f.job for f in self.flight.values()])
                for number, flight in list(self.flight.items()):
                    if self._look(flight):
                        del self.flight[number]
                if self.flight and not interrupts.requested:
                    time.sleep(POLL_SECONDS[self.launcher.cluster])
        self.stop_signal = interrupts.signal
        remove_stray_folder(self.folder)
        if self.flight:
            print(f"[search] stopped waiting; {len(self.flight)} trial job(s) go on; the same command follows them "
                  "again", flush=True)
            return "interrupted"
        return "done" if self.exhausted or completed_count(study) >= self.settings.trials else "interrupted"

    # -- starting trials -------------------------------------------------------------------------------------------
    def _start(self, count: int) -> None:
        """Ask for ``count`` trials (fewer when the space is exhausted) and submit them as one array."""
        requests = []
        while len(requests) < count:
            trial = self.study.ask()
            pattern = trial.suggest_categorical(PARAM, self.study.sampler.choices)
            if trial.user_attrs.get(PHASE_ATTR) == "exhausted":
                self.study.tell(trial, state=TrialState.PRUNED)
                self.exhausted = True
                break
            holder = _earlier_holder(trial, pattern)
            if holder is not None:
                trial.set_user_attr("duplicate_of", holder)
                self.study.tell(trial, state=TrialState.PRUNED)
                continue
            _first_heartbeat(trial)
            run_dir = self.output / "trials" / str(trial.number)
            trial.set_user_attr("run_dir", str(run_dir.resolve()))
            requests.append((trial, TrialRequest(trial.number, list(decode(pattern)), run_dir, self.settings,
                                                 self.definition)))
        if not requests:
            return
        log_in_job = self.launcher.cluster != "debug"
        try:
            jobs = submit_all(self.executor, self.folder, [
                (job_body, trial_in_job, {"request": request, "objective": self.objective},
                 str(self.output / "logs" / f"trial-{trial.number}.log") if log_in_job else None)
                for trial, request in requests])
        except ConfigError:  # the cluster refused them: the trials end FAIL, their patterns free again
            for trial, _ in requests:
                trial.set_user_attr("error", "the cluster refused the submission")
                self.study.tell(trial, state=TrialState.FAIL)
            raise
        for (trial, _), job in zip(requests, jobs):
            trial.set_user_attr("job_id", job.job_id)
            self.record["trials"][str(trial.number)] = {"job_id": job.job_id, "tasks": self.launcher.tasks,
                                                        "cluster": self.launcher.cluster,
                                                        "identity": job_identity(self.launcher, job)}
            self.flight[trial.number] = _InFlight(trial, job, "pending")
        write_json(self.record_path, self.record)
        print(f"[search] submitted trial(s) {', '.join(str(t.number) for t, _ in requests)} "
              f"({self.launcher.describe()}): jobs {', '.join(job.job_id for job in jobs)}", flush=True)

    def _follow_earlier(self, study: optuna.Study) -> None:
        """Follow the jobs of trials an earlier driver left RUNNING."""
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            entry = self.record["trials"].get(str(trial.number))
            if entry is None or entry.get("cluster", self.launcher.cluster) != self.launcher.cluster:
                continue  # a local worker's trial, or a job on another cluster than this command's
            job = attach(self.launcher, self.folder, entry["job_id"], entry["tasks"], entry.get("identity"))
            if job is None:
                continue
            live = optuna.trial.Trial(study, trial._trial_id)
            self.flight[trial.number] = _InFlight(live, job, job_state(job))
            print(f"[search] trial {trial.number}: job {entry['job_id']} followed again", flush=True)

    # -- ending trials -------------------------------------------------------------------------------------------
    def _look(self, flight: _InFlight) -> bool:
        """Tell the study a trial whose job has ended; True then."""
        state = job_state(flight.job)
        number, job_id = flight.trial.number, flight.job.job_id
        if state in ("pending", "running"):
            if state != flight.state:
                print(f"[search] trial {number}: job {job_id} {state}", flush=True)
                flight.state = state
            return False
        result, error = (None, f"job {job_id} {state}") if state in ("cancelled", "lost") else job_result(flight.job)
        try:
            if isinstance(result, TrialResult):
                self._complete(flight.trial, result)
            else:
                reason = error or f"job {job_id} stopped by a signal (time limit or preemption)"
                flight.trial.set_user_attr("error" if error else "interrupted", reason[:500] if error else True)
                self.study.tell(flight.trial, state=TrialState.FAIL)
                print(f"[search] trial {number} failed: {reason}", flush=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            print(f"[search] trial {number}: already ended (declared lost while no driver kept its heartbeat); job "
                  f"{job_id}'s result is dropped", flush=True)
        return True

    def _complete(self, trial: optuna.trial.Trial, result: TrialResult) -> None:
        trial.set_user_attr("valid", result.valid)
        trial.set_user_attr("train_minutes", result.train_minutes)
        trial.set_user_attr("stop_reason", result.stop_reason)
        value = result.score
        if math.isnan(value):  # a diverged pattern is a (poor) result, as for a local worker
            trial.set_user_attr("stop_reason", f"{self.definition.metric} is NaN (diverged); scored as the worst")
            value = -math.inf if self.definition.higher_is_better else math.inf
        self.study.tell(trial, value)
        best = self.study.best_trial
        print(f"[search] trial {trial.number} [{trial.params[PARAM]}]: {self.definition.metric} {value:.4g}; best "
              f"{best.value:.4g} (trial {best.number}); {completed_count(self.study)}/{self.settings.trials} "
              "complete", flush=True)
