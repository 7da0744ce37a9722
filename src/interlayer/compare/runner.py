"""Train every (variant, seed) of a plan, one process each, and survive Ctrl-C.

Directory layout (``DIR`` is ``--output``)::

    DIR/compare.json              settings, resolved models, every invocation's command
    DIR/status.json               the last outcome of every run (finished, interrupted, failed + exit code)
    DIR/runs/<variant>-s<seed>/   an ordinary run directory (run.json, best/, train.csv, valid.csv, results.json)
    DIR/logs/<variant>-s<seed>.log   the run's output, appended over attempts
    DIR/report.md, report.html, summary.json, figures/

A run with ``results.json`` is finished and skipped; one with ``checkpoint_last.safetensors`` is resumed (``--resume``);
one with only ``run.json`` never reached its first checkpoint and is resumed too, which starts it over
(:func:`interlayer.experiment.train`, under the run's lock); the rest are started. Nothing is deleted here: a run
directory whose lock a live process holds (an orphan of an earlier ``compare`` killed where
``PR_SET_PDEATHSIG`` is missing) fails with that process named, and the other runs go on.
Ctrl-C (or SIGTERM) is passed to the running processes, whose engines finish their step, save and exit; no further
run is started and the caller writes a partial report. Running the same command again continues.

``jobs`` runs train at once (``--jobs``). Each then gets ``cores // jobs`` torch threads (at least one) unless its
config sets ``train.threads``: on a small machine two one-thread runs finish a comparison sooner than two two-thread
runs one after the other, because a small model uses a second thread poorly. Under a time budget the thread count
changes how far a run gets, so every run of one comparison should be made with the same ``--jobs``.

Processes come from a multiprocessing *forkserver* that has imported torch and interlayer once, so a run starts
in milliseconds instead of paying the imports (several seconds) again; each run is still its own process, forked
from a server that never trained anything, so a crash, a kill or memory growth stays with that run. Where there is
no forkserver (Windows) runs are spawned as fresh interpreters.

Runs die with ``compare`` (Linux), even when it is killed with SIGKILL and can forward nothing: the server gets
SIGKILL when ``compare`` dies (:mod:`.server`), and each run SIGTERM when the server dies (``PR_SET_PDEATHSIG``,
:func:`~interlayer.training.concurrency.die_with_parent`), on which it saves and stops.
"""
from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..errors import DamagedResults
from ..fileio import write_json
from ..training.concurrency import ForwardedInterrupts, threads_per_run
from ..training.engine import LAST, LEGACY_LAST
from . import child
from .child import FINISHED, INTERRUPTED, STOPPED_OUTSIDE_TRAINING, read_results
from .plan import Plan, PlannedVariant
from .readback import read_status

RUNS, LOGS, STATUS_FILE = "runs", "logs", "status.json"
RUN_FILE = "run.json"


def run_name(variant: str, seed: int) -> str:
    return f"{variant}-s{seed}"


@dataclass
class RunOutcome:
    """How one run of a comparison ended in this invocation, for the summary line and ``status.json``."""

    name: str
    status: str  # finished | skipped | interrupted | failed | cancelled (a cluster job)
    seconds: float = 0.0
    detail: str = ""


@dataclass
class _Active:
    """A run process that has been started and not yet joined."""

    name: str
    label: str
    run_dir: Path
    log: Path
    process: multiprocessing.process.BaseProcess
    started: float
    gpu: Optional[int] = None


def run_state(run_dir: Path) -> str:
    """finished | resumable | stale (a run.json but no checkpoint: nothing to resume) | new."""
    try:
        if read_results(run_dir) is not None:
            return "finished"
    except DamagedResults:  # unfinished: a resume re-scores the finished checkpoint and writes the file again
        pass
    # a legacy pickle checkpoint counts too, so that the engine refuses it with its reason instead of the run
    # directory being silently deleted and trained again
    if any((run_dir / name).is_file() for name in (LAST, LEGACY_LAST)) and (run_dir / RUN_FILE).is_file():
        return "resumable"
    if (run_dir / RUN_FILE).is_file():
        return "stale"
    return "new"


def gpus_for_runs(device: Optional[str]) -> list[int]:
    """The GPUs runs are spread over: every visible CUDA device when the runs' ``train.device`` is ``auto`` (the
    default) or ``cuda``; none when it names one device (``cuda:1``, ``cpu``), which every run then uses."""
    if (device or "auto").strip().lower() not in ("auto", "cuda") or not torch.cuda.is_available():
        return []
    return list(range(torch.cuda.device_count()))


def least_busy(gpus: list[int], busy: list[Optional[int]]) -> Optional[int]:
    """The GPU running the fewest of the active runs (the lowest index on a tie), or None without GPUs."""
    return min(gpus, key=busy.count) if gpus else None


def process_context() -> BaseContext:
    """The forkserver (module docstring), its server preloaded with the run's imports and tied to this process's
    life (:mod:`.server`); else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["interlayer.compare.server", "interlayer.compare.child", "torch._dynamo"])
    return context


def _describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"


def _tail(path: Path, lines: int = 3) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return " | ".join(line.strip() for line in text[-lines:])


def overall_eta(runs_left: int, jobs: int, mean_seconds: float) -> float:
    """Seconds until ``runs_left`` runs (those running included) end, ``jobs`` at a time, each taking the mean
    time of the runs that ended in this session: whole waves of ``jobs`` runs."""
    return math.ceil(runs_left / max(jobs, 1)) * mean_seconds


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


class Runner:
    """Trains a plan's missing runs on this machine, ``jobs`` at a time, each in its own process (so a crash or memory
    growth stays with that run) with ``cores / jobs`` torch threads and, on GPUs, a device of its own; records each
    outcome in ``status.json``. Ctrl-C is forwarded to the runs, which save and stop; the next invocation continues
    them. :class:`~interlayer.compare.launcher.SubmititRunner` is the cluster's counterpart."""

    def __init__(self, plan: Plan, output: Path, *, jobs: int = 1, echo: Callable[[str], None] = print) -> None:
        self.plan, self.output, self.jobs, self.echo = plan, Path(output), jobs, echo
        self.threads = threads_per_run(jobs)
        self.gpus = gpus_for_runs(str(plan.settings.sets.get("train.device", "auto")))
        self.context = process_context()
        self.status_path = self.output / STATUS_FILE
        self.status = read_status(self.status_path)
        self.stop_signal: Optional[int] = None  # the signal that stopped run_all (SIGINT, SIGTERM), if one did

    def run_dir(self, variant: str, seed: int) -> Path:
        return self.output / RUNS / run_name(variant, seed)

    def run_all(self) -> tuple[list[RunOutcome], bool]:
        """Train what is missing, ``jobs`` at a time; returns the outcomes and whether the comparison was
        interrupted. Outcomes are in the order the runs ended."""
        runs = self.plan.runs()
        pending = [(f"[{index}/{len(runs)}] {variant.variant.name} seed {seed}", variant, seed)
                   for index, (variant, seed) in enumerate(runs, 1)]
        outcomes: list[RunOutcome] = []
        active: dict[int, _Active] = {}
        with ForwardedInterrupts() as interrupts:
            while pending or active:
                while pending and len(active) < self.jobs and not interrupts.requested:
                    gpu = least_busy(self.gpus, [run.gpu for run in active.values()])
                    started = self._start(*pending.pop(0), gpu=gpu)
                    if isinstance(started, RunOutcome):
                        outcomes.append(started)
                        self._save_status(started)
                    else:
                        active[started.process.sentinel] = started
                interrupts.processes = [run.process for run in active.values()]
                if not active:
                    break
                for sentinel in multiprocessing.connection.wait(list(active)):
                    outcome = self._finish(active.pop(sentinel), interrupts.requested)
                    outcomes.append(outcome)
                    self._save_status(outcome)
                    ran = [o.seconds for o in outcomes if o.status != "skipped"]
                    left = len(pending) + len(active)
                    if left and ran and not interrupts.requested:
                        self.echo(f"compare: {len(runs) - left}/{len(runs)} runs done; about "
                                  f"{_minutes(overall_eta(left, self.jobs, sum(ran) / len(ran)))} left "
                                  f"({len(ran)} run(s) took {sum(ran) / len(ran):.0f} s on average, "
                                  f"{self.jobs} at a time)")
        self.stop_signal = interrupts.signal
        return outcomes, interrupts.requested

    def _start(self, label: str, variant: PlannedVariant, seed: int, gpu: Optional[int] = None
               ) -> "RunOutcome | _Active":
        """Start the run's process (on GPU ``gpu`` when given), or say why it needs none (finished earlier)."""
        name = run_name(variant.variant.name, seed)
        run_dir = self.run_dir(variant.variant.name, seed)
        state = run_state(run_dir)
        if state == "finished":
            self.echo(f"{label}: finished earlier, skipped")
            return RunOutcome(name, "skipped")
        if state == "stale":
            self.echo(f"{label}: {run_dir} stopped before its first checkpoint; starting it over")
        budget = self.plan.settings.budget_minutes
        sets = variant.sets if gpu is None else {**variant.sets, "train.device": f"cuda:{gpu}"}
        job = {"task": self.plan.spec.name, "preset": variant.variant.preset, "sets": sets, "seed": seed,
               "max_minutes": budget, "run_dir": str(run_dir), "resume": state in ("resumable", "stale"),
               "threads": self.threads, "parent": os.getpid()}
        log = self.output / LOGS / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        verb = "resuming" if state == "resumable" else "training"
        notes = ([f"budget {budget:g} min"] if budget else []) + ([f"{self.threads} thread(s)"] if self.threads else [])
        notes += [f"GPU {gpu}"] if gpu is not None else []
        self.echo(f"{label}: {verb}" + (f" ({', '.join(notes)})" if notes else "") + f"; log {log}")
        with log.open("a") as handle:
            handle.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {verb} {name}\n")
        process = self.context.Process(target=child.entry, args=(job, str(log)), name=name)
        process.start()
        return _Active(name, label, run_dir, log, process, time.perf_counter(), gpu)

    def _finish(self, run: _Active, stop_requested: bool) -> RunOutcome:
        run.process.join()
        seconds = time.perf_counter() - run.started
        return self._outcome(run.name, run.process.exitcode, seconds, run.run_dir, run.log, run.label, stop_requested)

    def _outcome(self, name: str, code: int, seconds: float, run_dir: Path, log: Path, label: str,
                 stop_requested: bool) -> RunOutcome:
        if code == FINISHED:
            results = read_results(run_dir) or {}
            metric = f"test_{self.plan.task.metric}"
            score = f"{metric} {results[metric]:.4g}" if isinstance(results.get(metric), (int, float)) else ""
            self.echo(f"{label}: finished in {seconds:.0f} s ({results.get('stop_reason', '')}) {score}".rstrip())
            return RunOutcome(name, "finished", seconds)
        if stop_requested or code in (INTERRUPTED, STOPPED_OUTSIDE_TRAINING):  # saved, or stopped before training
            self.echo(f"{label}: interrupted after {seconds:.0f} s; the same command resumes it")
            return RunOutcome(name, "interrupted", seconds)
        detail = f"{_describe_exit(code)}: {_tail(log)}"
        self.echo(f"{label}: FAILED ({detail}); see {log}. The other runs go on.")
        return RunOutcome(name, "failed", seconds, detail)

    def _save_status(self, outcome: RunOutcome) -> None:
        save_status(self.status_path, self.status, outcome)


def save_status(path: Path, status: dict[str, Any], outcome: RunOutcome) -> None:
    """Record ``outcome`` in ``status`` (the last outcome of each run) and write it to ``status.json``."""
    if outcome.status == "skipped":
        return
    status[outcome.name] = {"status": outcome.status, "seconds": outcome.seconds, "detail": outcome.detail,
                            "updated": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(path, status)
