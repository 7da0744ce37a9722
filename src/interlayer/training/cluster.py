"""Training runs as cluster jobs, through ``submitit`` (FAIR's launcher, which Hydra's SLURM launcher wraps): the
options, the executor, what a job's state means, re-attaching to a job by its id, and the body every job runs.

``compare`` and ``search`` use it when given ``--launcher submitit`` (``pip install interlayer[slurm]``): each run
is one SLURM job; the runs of one submission go as one job array. The same code runs the jobs as processes on this
machine (``--slurm-cluster local``, submitit's ``LocalExecutor``: a dry run of the cluster path, which the tests
use) or inside this process (``debug``, submitit's ``DebugExecutor``).

**A job's body** (:func:`job_body`) runs a function (one training run) with:

* **the run's GPUs as data-parallel ranks**: a run with ``gpus_per_run`` N > 1 is N tasks on one node, each a rank
  (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` from submitit's
  ``TorchDistributedEnvironment``, as ``torchrun`` would set them), so the engine trains DDP as under torchrun;
* **threads** from ``SLURM_CPUS_PER_TASK`` when the job has no other setting;
* **the time limit turned into a clean stop**: submitit signals ``SIGUSR2`` ``signal_delay_s`` before the limit
  (90 s on SLURM), and the body answers with ``SIGTERM`` to itself, on which the engine finishes its step, saves
  ``checkpoint_last`` and returns "interrupted": the launcher submits the run again, resuming (submitit's own
  requeue would instead raise inside the training step, losing the steps since the last save);
* **no exception escapes**: the function's failure is caught, its traceback printed to the run's log, and the
  result is ``{"value", "error", "host"}`` (what the function returned, or why it failed), so the launcher reads
  every outcome the same way (and submitit's debug executor, which opens a debugger on an exception, stays usable
  in tests).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from ..errors import ConfigError
from ..fileio import load_yaml

Cluster = Literal["slurm", "local", "debug"]
JobState = Literal["pending", "running", "done", "cancelled", "lost"]
# SLURM states of a job that has not ended (sacct); anything else has ended, in success or not
INCOMPLETE = {"READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED", "CONFIGURING",
              "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
POLL_SECONDS = {"slurm": 30.0, "local": 0.5, "debug": 0.0}  # between looks at the jobs' states
LOCAL_TIME_MINUTES = 7 * 24 * 60  # a local job's limit without --slurm-time (submitit's own default is 2 minutes)


@dataclass
class LauncherSettings:
    """``--launcher submitit`` and its ``--slurm-*`` options."""

    cluster: Cluster = "slurm"
    partition: Optional[str] = None
    gpus_per_run: int = 1  # > 1: that many data-parallel ranks on one node
    # the job's time limit (submitit's timeout_min); required on SLURM, where submitit would otherwise give 5 minutes;
    # None elsewhere: no limit to speak of (LOCAL_TIME_MINUTES)
    time_minutes: Optional[int] = None
    array_parallelism: Optional[int] = None  # jobs of an array running at once; None: submitit's (256)
    extra: dict[str, Any] = field(default_factory=dict)  # --slurm-set KEY=VALUE: any sbatch option submitit knows

    def validate(self) -> None:
        checks = [(self.gpus_per_run >= 0, f"--slurm-gpus-per-run={self.gpus_per_run} must not be negative"),
                  (self.time_minutes is None or self.time_minutes >= 1,
                   f"--slurm-time={self.time_minutes} must be at least one minute"),
                  (self.array_parallelism is None or self.array_parallelism >= 1,
                   f"--slurm-array-parallelism={self.array_parallelism} must be at least 1"),
                  (self.cluster != "slurm" or self.time_minutes is not None,
                   "--launcher submitit needs --slurm-time on SLURM (e.g. --slurm-time 4:00:00): submitit would give "
                   "every job 5 minutes; a run longer than the limit saves and is submitted again, resuming")]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def describe(self) -> str:
        """One line for the report's environment: where the jobs ran and what each asked for."""
        where = {"slurm": "SLURM jobs", "local": "submitit local jobs (processes on this machine)",
                 "debug": "submitit debug jobs (in this process)"}[self.cluster]
        parts = [f"partition {self.partition}"] if self.partition else []
        parts.append(f"{self.gpus_per_run} GPU(s) per run")
        parts += [f"time limit {self.time_minutes} min"] if self.time_minutes else []
        parts += [f"at most {self.array_parallelism} at once"] if self.array_parallelism else []
        parts += [f"{key}={value}" for key, value in self.extra.items()]
        return f"{where}: {', '.join(parts)}"

    @property
    def tasks(self) -> int:
        """Processes per run: one per GPU (the ranks), one without GPUs."""
        return max(self.gpus_per_run, 1)


def parse_time(text: str) -> int:
    """``--slurm-time`` in SLURM's formats (``sbatch --time``): ``minutes``, ``minutes:seconds``,
    ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``, ``days-hours:minutes:seconds``; as whole
    minutes (seconds round up)."""
    try:
        days, dash, clock = text.strip().partition("-") if "-" in text else ("0", "", text.strip())
        parts = [int(p) for p in clock.split(":")]
        if not 1 <= len(parts) <= 3 or min(parts) < 0 or int(days) < 0:
            raise ValueError
        if dash:  # days-hours[:minutes[:seconds]]
            hours, minutes, seconds = (parts + [0, 0])[:3]
        else:  # minutes, minutes:seconds, hours:minutes:seconds
            hours, minutes, seconds = [0, *parts, 0][:3] if len(parts) < 3 else parts
        total = (int(days) * 24 + hours) * 60 + minutes + (1 if seconds else 0)
        if total < 1:
            raise ValueError
        return total
    except ValueError:
        raise ConfigError(f"--slurm-time {text!r}: give SLURM's time (90, 1:30:00, 2-00:00:00: minutes, "
                          "hours:minutes:seconds, days-hours:minutes:seconds)") from None


def parse_slurm_sets(pairs: list[str]) -> dict[str, Any]:
    """``--slurm-set KEY=VALUE`` items: submitit's SLURM parameters (sbatch's options with ``_`` for ``-``:
    ``mem_gb=64``, ``constraint=a100``, ``qos=high``, ``account=proj``), values read as YAML (numbers, booleans)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--slurm-set expects KEY=VALUE (e.g. --slurm-set mem_gb=64), got {pair!r}")
        out[key.strip()] = load_yaml(value, f"--slurm-set {key.strip()}", inline=True) if value else ""
    return out


# -- the command line's options (compare and search) -----------------------------------------------------------
def _slurm_time(text: str) -> int:
    """An argparse type: ``--slurm-time`` in minutes (:func:`parse_time`)."""
    try:
        return parse_time(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--slurm-time ")) from None


def add_launcher_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    """``--launcher`` and the ``--slurm-*`` options of ``compare`` and ``search`` (``unit``: what one job trains:
    a run, a trial)."""
    group = parser.add_argument_group("launcher", f"where each {unit} trains (docs/compare.md, 'On a SLURM cluster')")
    group.add_argument("--launcher", choices=("local", "submitit"), default="local",
                       help=f"local: processes on this machine (default); submitit: each {unit} one SLURM job, "
                            "submitted as a job array and followed until it ends (pip install interlayer[slurm])")
    group.add_argument("--slurm-partition", metavar="NAME", help="the partition (default: the cluster's)")
    group.add_argument("--slurm-gpus-per-run", type=int, default=1, metavar="N",
                       help=f"GPUs per {unit} (default 1; N > 1: N data-parallel ranks on one node; 0: CPU only)")
    group.add_argument("--slurm-time", type=_slurm_time, metavar="TIME",
                       help=f"the time limit of each {unit}'s job, as sbatch takes it (90, 4:00:00, 1-00:00:00; "
                            "required on SLURM); a run that reaches it saves and is submitted again, resuming")
    group.add_argument("--slurm-array-parallelism", type=int, metavar="K",
                       help="jobs of one array running at once (default: submitit's, 256)")
    group.add_argument("--slurm-set", action="append", default=[], metavar="KEY=VALUE",
                       help="any other sbatch option submitit knows, '-' written '_' (mem_gb=64, cpus_per_task=8, "
                            "constraint=a100, account=NAME, qos=NAME; repeatable)")
    group.add_argument("--slurm-cluster", choices=("slurm", "local", "debug"), default="slurm",
                       help="slurm (default); local: the same jobs as processes on this machine (submitit's local "
                            "executor, a dry run of the cluster path); debug: in this process")


def launcher_from_args(args: argparse.Namespace) -> Optional[LauncherSettings]:
    """The launcher settings of ``--launcher submitit``, or None for the local launcher (whose ``--slurm-*``
    options would do nothing, so they are refused)."""
    given = [f"--{name.replace('_', '-')}" for name in ("slurm_partition", "slurm_time", "slurm_array_parallelism")
             if getattr(args, name) is not None] + (["--slurm-set"] if args.slurm_set else [])
    if args.launcher == "local":
        if given:
            raise ConfigError(f"{', '.join(given)} apply to --launcher submitit only")
        return None
    launcher = LauncherSettings(cluster=args.slurm_cluster, partition=args.slurm_partition,
                                gpus_per_run=args.slurm_gpus_per_run, time_minutes=args.slurm_time,
                                array_parallelism=args.slurm_array_parallelism,
                                extra=parse_slurm_sets(args.slurm_set))
    launcher.validate()
    return launcher


def require_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher submitit needs the submitit package: pip install interlayer[slurm] (or pip "
                          "install submitit)") from None
    return submitit


def make_executor(settings: LauncherSettings, folder: Path, name: str = "interlayer") -> Any:
    """A submitit executor writing its files under ``folder/<job id>/``, with the run's resources; ``name`` is
    the jobs' name (``squeue`` shows it)."""
    submitit = require_submitit()
    settings.validate()
    if settings.cluster == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("--launcher submitit: no sbatch on this machine's PATH; run compare on a SLURM login node, "
                          "or try the cluster path here with --slurm-cluster local")
    executor = submitit.AutoExecutor(folder=Path(folder) / "%j", cluster=settings.cluster)
    parameters: dict[str, Any] = {"name": name, "nodes": 1, "tasks_per_node": settings.tasks,
                                  "gpus_per_node": settings.gpus_per_run or None,  # no GPU line for a CPU job
                                  "timeout_min": settings.time_minutes or LOCAL_TIME_MINUTES,
                                  "slurm_partition": settings.partition,
                                  "slurm_array_parallelism": settings.array_parallelism}
    parameters.update({f"slurm_{key}": value for key, value in settings.extra.items()})
    try:
        executor.update_parameters(**{k: v for k, v in parameters.items() if v is not None})
    except (NameError, AssertionError, ValueError, TypeError) as err:
        raise ConfigError(f"--slurm-set / --slurm-*: submitit refuses them: {str(err).splitlines()[0]}") from None
    return executor


def attach(settings: LauncherSettings, folder: Path, job_id: str, tasks: int) -> Any:
    """The job ``job_id`` submitted by an earlier invocation, to follow it again (its state, its result)."""
    submitit = require_submitit()
    job_class = {"slurm": submitit.SlurmJob, "local": submitit.local.local.LocalJob}.get(settings.cluster)
    if job_class is None:  # a debug job lived in its process, which is gone
        return None
    return job_class(folder=Path(folder) / "%j", job_id=job_id, tasks=list(range(tasks)))


def _has_results(job: Any) -> bool:
    return all(job.task(t).paths.result_pickle.exists() for t in range(job.num_tasks))


def _local_alive(pid: str) -> bool:
    """Whether the local job's controller process (an orphan of an earlier invocation) still runs: it exists and
    is no zombie (a container's init may not reap it)."""
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def job_state(job: Any) -> JobState:
    """pending, running, done (its result says how it went), cancelled (``scancel``, or the local executor's
    cancel), or lost (a local job of an earlier invocation that died without a result)."""
    submitit = require_submitit()
    if isinstance(job, submitit.local.debug.DebugJob):
        if job.cancelled:
            return "cancelled"
        job.done()  # a debug job runs here, when first asked
        return "done"
    local = isinstance(job, submitit.local.local.LocalJob)
    raw = str(job.state if local else job.watcher.get_state(job.job_id, mode="cache")).upper()
    if raw.startswith("CANCELLED") or raw == "INTERRUPTED":
        return "cancelled"
    if _has_results(job):
        return "done"
    if local:
        if job._process is None:  # re-attached: the controller is not our child
            return "running" if _local_alive(job.job_id) else "lost"
        return "running" if raw == "RUNNING" else "done"
    if raw not in INCOMPLETE:
        return "done"
    return "running" if raw in ("RUNNING", "COMPLETING") else "pending"


def refresh(jobs: list[Any]) -> None:
    """One query of the cluster for every job's state (sacct, through submitit's shared watcher)."""
    watched = {type(job).watcher for job in jobs if hasattr(type(job), "watcher")}
    for watcher in watched:
        watcher.update()


def job_result(job: Any) -> tuple[Any, Optional[str]]:
    """What the job's function returned (:func:`job_body`), or ``(None, why)`` when it failed or the job ended
    without a result (killed for memory or time, its node failed)."""
    try:
        result = job.results()[0]
    except Exception as err:  # submitit's UncompletedJobError / FailedJobError, with the log's end
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        return None, " | ".join(lines[:2] + lines[-2:]) if len(lines) > 4 else " | ".join(lines)
    if not isinstance(result, dict) or "value" not in result:
        return None, f"unexpected job result {result!r}"
    return result["value"], result.get("error")


def _stop_before_the_limit(signum: int, frame: Any) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def job_body(function: Callable[[dict[str, Any]], Any], job: dict[str, Any], log: Optional[str]) -> dict[str, Any]:
    """What a job runs: ``function(job)`` with the job's ranks, threads, time-limit signal and log (module
    docstring); returns ``{"value", "error", "host"}``. ``log``: append stdout and stderr to this file (None: leave
    them, for a debug job in the launcher's own process)."""
    import submitit

    environment = submitit.JobEnvironment()
    if environment.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        os.environ.setdefault("LOCAL_RANK", str(environment.local_rank))
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and not job.get("threads"):
        job = {**job, "threads": int(cpus)}
    signal.signal(environment._usr_sig(), _stop_before_the_limit)
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        handle = open(log, "a")
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
    try:
        value, error = function(job), None
    except Exception as err:  # noqa: BLE001 (every failure becomes a result; the traceback goes to the log)
        traceback.print_exc()
        value, error = None, f"{type(err).__name__}: {err}"
    sys.stdout.flush(), sys.stderr.flush()
    return {"value": value, "error": error, "host": socket.gethostname()}
