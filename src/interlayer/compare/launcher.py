"""``compare --launcher submitit``: every run of the comparison as one SLURM job, submitted as a job array, followed
until it ends, and re-attached to when ``compare`` itself was stopped or killed (:mod:`interlayer.training.cluster`).

What is where::

    DIR/jobs.json                 every run's job: its id, tasks, cluster, all its submissions (the record)
    DIR/slurm/<job id>/           submitit's files: the pickled job, its result, submitit's log
    DIR/logs/<variant>-s<seed>.log   the run's own output, appended over submissions (as with --launcher local)

**One job per run, never a finished run twice.** A run with ``results.json`` is skipped. A run whose recorded
job is still pending or running (submitted by an earlier ``compare`` that was stopped, killed or lost its login
session) is followed again, not submitted; any other run is submitted (a failed, cancelled or interrupted one
resumes from its checkpoint). The job itself checks ``results.json`` before training, so even a run submitted
twice (a ``compare`` killed between ``sbatch`` and writing the record) trains once; and the run's directory lock
keeps two jobs from training it at the same time.

**Waiting.** ``compare`` looks at the jobs' states (every 30 s on SLURM, through one ``sacct`` call for all of them)
and prints each change and a count (pending, running, ended). A run that stopped at its time limit (the job body
turns submitit's warning signal into the engine's clean stop: a checkpoint, then "interrupted") is submitted again at
once and resumes, up to :data:`MAX_SUBMISSIONS` submissions per run. Ctrl-C stops the waiting, not the jobs: the
report is written from what has finished, and the same command follows the jobs again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..fileio import write_json
from ..training.cluster import (
    JOBS_FILE,
    POLL_SECONDS,
    LauncherSettings,
    attach,
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
from .child import FINISHED, INTERRUPTED, STOPPED_OUTSIDE_TRAINING, read_results, run_job
from .plan import Plan, PlannedVariant
from .readback import read_status
from .runner import LOGS, RUNS, STATUS_FILE, RunOutcome, run_name, run_state, save_status

SUBMITIT_FOLDER = "slurm"
MAX_SUBMISSIONS = 20  # per run and invocation: a run that keeps reaching its time limit resumes this often


def train_in_job(job: dict[str, Any]) -> int:
    """A run inside its job: finished already (results.json) -> nothing to do; else trained, resuming whatever an
    earlier submission saved (:func:`~interlayer.compare.child.run_job`)."""
    state = run_state(Path(job["run_dir"]))
    if state == "finished":
        print(f"{job['run_dir']} has finished already (results.json); nothing to train", flush=True)
        return FINISHED
    return run_job({**job, "resume": state in ("resumable", "stale")})


@dataclass
class _Tracked:
    """A run whose job is being followed."""

    name: str
    label: str
    run_dir: Path
    log: Path
    job: Any
    state: str
    since: float


class SubmititRunner:
    """The runs of ``plan`` as submitit jobs (module docstring); the interface of :class:`.runner.Runner`."""

    def __init__(self, plan: Plan, output: Path, launcher: LauncherSettings, *,
                 echo: Callable[[str], None] = print) -> None:
        self.plan, self.output, self.launcher, self.echo = plan, Path(output), launcher, echo
        self.folder = self.output / SUBMITIT_FOLDER
        self.executor = make_executor(launcher, self.folder, f"compare-{self.output.resolve().name}")
        self.record_path = self.output / JOBS_FILE
        self.record: dict[str, Any] = read_job_record(self.record_path, "runs")
        self.status_path = self.output / STATUS_FILE
        self.status = read_status(self.status_path)
        # local jobs share this machine: one thread each; a cluster job uses its own cores (SLURM_CPUS_PER_TASK)
        self.threads = 1 if launcher.cluster == "local" else None
        self.jobs = launcher.array_parallelism or len(plan.runs())
        self.tracked: dict[str, _Tracked] = {}
        self.stop_signal: Optional[int] = None  # the signal that stopped the waiting (SIGINT, SIGTERM), if one did

    def run_all(self) -> tuple[list[RunOutcome], bool]:
        """Submit or re-attach every unfinished run, wait for the jobs; the outcomes in the order the runs ended,
        and whether the waiting was interrupted (the jobs go on)."""
        runs = self.plan.runs()
        outcomes: list[RunOutcome] = []
        missing = []
        for index, (variant, seed) in enumerate(runs, 1):
            label = f"[{index}/{len(runs)}] {variant.variant.name} seed {seed}"
            name = run_name(variant.variant.name, seed)
            run_dir = self.output / RUNS / name
            if run_state(run_dir) == "finished":
                self.echo(f"{label}: finished earlier, skipped")
                outcomes.append(RunOutcome(name, "skipped"))
            elif not self._reattach(name, label, run_dir):
                missing.append((label, variant, seed))
        self._submit(missing)
        with ForwardedInterrupts() as interrupts:
            counts: Optional[dict[str, int]] = None
            while self.tracked and not interrupts.requested:
                if self.launcher.cluster == "slurm":
                    refresh([t.job for t in self.tracked.values()])
                again = []
                for tracked in list(self.tracked.values()):
                    outcome = self._look(tracked)
                    if outcome is None:
                        continue
                    del self.tracked[tracked.name]
                    outcomes.append(outcome)
                    save_status(self.status_path, self.status, outcome)
                    if outcome.status == "interrupted" and self._may_resubmit(tracked.name):
                        again.append(tracked)
                if again:
                    self.echo(f"compare: submitting {len(again)} interrupted run(s) again; they resume")
                    self._submit([self._planned(t) for t in again])
                counts = self._progress(counts, len(runs), outcomes)
                if self.tracked and not interrupts.requested:
                    time.sleep(POLL_SECONDS[self.launcher.cluster])
        remove_stray_folder(self.folder)
        if interrupts.requested and self.tracked:
            ids = ", ".join(t.job.job_id for t in self.tracked.values())
            self.echo(f"compare: stopped waiting; {len(self.tracked)} job(s) go on ({ids}); the same command follows "
                      "them again (or cancel them: scancel)")
        self.stop_signal = interrupts.signal
        return outcomes, interrupts.requested

    # -- submitting and re-attaching ---------------------------------------------------------------------------
    def _reattach(self, name: str, label: str, run_dir: Path) -> bool:
        """Follow the run's recorded job again if it is still pending or running."""
        entry = self.record["runs"].get(name)
        if entry is None or entry.get("cluster", self.launcher.cluster) != self.launcher.cluster:
            return False  # never submitted, or on another cluster than this command's
        job = attach(self.launcher, self.folder, entry["job_id"], entry.get("tasks", 1), entry.get("identity"))
        state = job_state(job) if job is not None else "lost"
        if state not in ("pending", "running"):
            return False
        self.echo(f"{label}: job {entry['job_id']} {state} (submitted by an earlier invocation), followed again")
        self.tracked[name] = _Tracked(name, label, run_dir, self._log(name), job, state, time.time())
        return True

    def _log(self, name: str) -> Path:
        return self.output / LOGS / f"{name}.log"

    def _planned(self, tracked: _Tracked) -> tuple[str, PlannedVariant, int]:
        variant, _, seed = tracked.name.rpartition("-s")
        return tracked.label, self.plan.variant(variant), int(seed)

    def _submit(self, items: list[tuple[str, PlannedVariant, int]]) -> None:
        """Submit the runs as one job array and record the jobs before following them."""
        if not items:
            return
        budget = self.plan.settings.budget_minutes
        log_in_job = self.launcher.cluster != "debug"  # a debug job runs here: its output stays ours
        calls = []
        for _label, variant, seed in items:
            name = run_name(variant.variant.name, seed)
            job = {"task": self.plan.spec.name, "preset": variant.variant.preset, "sets": variant.sets,
                   "seed": seed, "max_minutes": budget, "run_dir": str(self.output / RUNS / name),
                   "threads": self.threads}
            calls.append((job_body, train_in_job, job, str(self._log(name)) if log_in_job else None))
        jobs = submit_all(self.executor, self.folder, calls)
        for (label, variant, seed), job in zip(items, jobs):
            name = run_name(variant.variant.name, seed)
            log = self._log(name)
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as handle:
                handle.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} submitted {name}: job {job.job_id}\n")
            entry = self.record["runs"].setdefault(name, {"submissions": []})
            entry.update(job_id=job.job_id, tasks=self.launcher.tasks, cluster=self.launcher.cluster,
                         identity=job_identity(self.launcher, job))
            entry["submissions"].append({"job_id": job.job_id, "at": time.strftime("%Y-%m-%d %H:%M:%S")})
            self.tracked[name] = _Tracked(name, label, self.output / RUNS / name, self._log(name), job, "pending",
                                          time.time())
        write_json(self.record_path, self.record)
        self.echo(f"compare: submitted {len(jobs)} run(s) ({self.launcher.describe()}): jobs "
                  f"{', '.join(job.job_id for job in jobs)}; logs in {self.output / LOGS}")

    def _may_resubmit(self, name: str) -> bool:
        return self.launcher.cluster != "debug" and len(self.record["runs"][name]["submissions"]) < MAX_SUBMISSIONS

    # -- following -------------------------------------------------------------------------------------------------
    def _look(self, tracked: _Tracked) -> Optional[RunOutcome]:
        """The run's outcome once its job has ended; None while it is pending or running (a change is printed)."""
        state = job_state(tracked.job)
        if state in ("pending", "running"):
            if state != tracked.state:
                self.echo(f"{tracked.label}: job {tracked.job.job_id} {state}")
                tracked.state, tracked.since = state, time.time()
            return None
        seconds = time.time() - tracked.since
        job_id = tracked.job.job_id
        if state == "cancelled":
            detail = f"job {job_id} was cancelled (scancel, or a cancel of the local job)"
            self.echo(f"{tracked.label}: CANCELLED ({detail}); the same command submits it again")
            return RunOutcome(tracked.name, "cancelled", seconds, detail)
        if state == "lost":
            detail = f"job {job_id} ended without a result (its process is gone)"
            self.echo(f"{tracked.label}: lost ({detail}); the same command submits it again")
            return RunOutcome(tracked.name, "interrupted", seconds, detail)
        code, error = job_result(tracked.job)
        if code == FINISHED and read_results(tracked.run_dir) is not None:
            results = read_results(tracked.run_dir) or {}
            metric = f"test_{self.plan.task.metric}"
            score = f" {metric} {results[metric]:.4g}" if isinstance(results.get(metric), (int, float)) else ""
            self.echo(f"{tracked.label}: job {job_id} finished ({results.get('stop_reason', '')}){score}")
            return RunOutcome(tracked.name, "finished", seconds)
        if code in (INTERRUPTED, STOPPED_OUTSIDE_TRAINING):
            self.echo(f"{tracked.label}: job {job_id} stopped (time limit or signal) after saving its checkpoint")
            return RunOutcome(tracked.name, "interrupted", seconds, f"job {job_id} stopped by a signal")
        detail = f"job {job_id}: {error or f'exit code {code}'}"
        self.echo(f"{tracked.label}: FAILED ({detail}); see {tracked.log}. The other runs go on.")
        return RunOutcome(tracked.name, "failed", seconds, detail)

    def _progress(self, last: Optional[dict[str, int]], total: int, outcomes: list[RunOutcome]
                  ) -> dict[str, int]:
        counts = {state: sum(t.state == state for t in self.tracked.values()) for state in ("pending", "running")}
        for status in ("finished", "skipped", "failed", "cancelled", "interrupted"):
            counts[status] = sum(o.status == status for o in outcomes)
        if counts != last:
            shown = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
            self.echo(f"compare: {total} runs: {shown}")
        return counts
