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

**Checked before anything is written** (:func:`check_launcher`): submitit installed, ``sbatch`` and ``srun`` on the
PATH, the options accepted by submitit; a submission ``sbatch`` refuses is one line naming its message
(:func:`submit_all`), and the files submitit had staged for it are removed.

**A job id names the job it was recorded for, or nothing** (:func:`job_identity`): a local job's id is its
controller's pid, which the system gives to another process once the controller has ended; the record keeps the
controller's start time (and the boot) beside the id, and a re-attached job whose pid now names another process,
or no submitit controller, is lost, not followed for ever. SLURM's job ids are unique on their cluster (they grow
to ``MaxJobId``, 67,043,328 by default, before they wrap), and the record names the cluster kind.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import socket
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from ..errors import ConfigError, DataError
from ..fileio import load_yaml, read_json

Cluster = Literal["slurm", "local", "debug"]
JobState = Literal["pending", "running", "done", "cancelled", "lost"]
# SLURM states of a job that has not ended (sacct); anything else has ended, in success or not
INCOMPLETE = {"READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED", "CONFIGURING",
              "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
JOBS_FILE = "jobs.json"  # the launcher's record of every job it submitted, in the command's output folder
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
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if settings.cluster == "slurm" and missing:
        raise ConfigError(f"--launcher submitit: no {' or '.join(missing)} on this machine's PATH; run the command on "
                          "a SLURM login node, or try the cluster path here with --slurm-cluster local")
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


def check_launcher(settings: LauncherSettings) -> None:
    """Everything that can refuse ``--launcher submitit`` before a job is submitted (submitit, ``sbatch`` and
    ``srun``, the options), checked by making the executor in a scratch folder, so that a refused command writes
    nothing into its output folder (it wrote ``compare.json``, a lock and ``slurm/`` first)."""
    with tempfile.TemporaryDirectory(prefix="interlayer-launcher-check-") as scratch:
        make_executor(settings, Path(scratch))


def submit_all(executor: Any, folder: Path, calls: list[tuple[Any, ...]]) -> list[Any]:
    """Submit ``calls`` (a function and its arguments each) as one job array of ``executor`` (files under
    ``folder``); the jobs. A submission ``sbatch`` refuses (a partition, an account, a limit) raises
    :class:`ConfigError` with its message, and the files submitit staged for it in ``folder`` are removed."""
    submitit = require_submitit()
    existed = folder.is_dir()
    staged = set(folder.iterdir()) if existed else set()
    printed = io.StringIO()  # submitit prints sbatch's complaint itself: it goes into the one line instead
    try:
        with contextlib.redirect_stderr(printed), executor.batch():
            jobs = [executor.submit(*call) for call in calls]
    except submitit.core.utils.FailedJobError as err:
        for leftover in (set(folder.iterdir()) if folder.is_dir() else set()) - staged:
            if leftover.is_file():
                leftover.unlink()
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        message = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"the cluster refused the submission: {message}; check --slurm-partition, --slurm-set "
                          "and --slurm-time against what your account may ask for") from None
    sys.stderr.write(printed.getvalue())
    return jobs


def remove_stray_folder(folder: Path) -> None:
    """Remove ``folder/%j`` if it is an empty folder: submitit's local controller makes its folder argument before
    formatting the job id into it, which left a stray ``slurm/%j`` beside the jobs' own ``slurm/<job id>/``. Called
    once the jobs followed have ended, when every controller has started (a controller starting later would make
    it again)."""
    stray = Path(folder) / "%j"
    if stray.is_dir() and not stray.is_symlink() and not any(stray.iterdir()):
        stray.rmdir()


def _process_identity(pid: str) -> Optional[str]:
    """``BOOT:START`` of process ``pid``: the boot's id and the process's start time in clock ticks since boot
    (``/proc/PID/stat``, field 22), which together name one process for ever; None where /proc cannot tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        start = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, ValueError, IndexError):
        return None
    return f"{boot}:{start}"


def job_identity(settings: LauncherSettings, job: Any) -> Optional[str]:
    """What the record keeps beside a job's id so that a later command follows that job and no other (module
    docstring): a local job's controller process (:func:`_process_identity`); None for SLURM and debug jobs."""
    return _process_identity(job.job_id) if settings.cluster == "local" else None


def attach(settings: LauncherSettings, folder: Path, job_id: str, tasks: int, identity: Optional[str] = None) -> Any:
    """The job ``job_id`` submitted by an earlier invocation, to follow it again (its state, its result);
    ``identity``: what :func:`job_identity` recorded for it (None in a record written before it was kept)."""
    submitit = require_submitit()
    job_class = {"slurm": submitit.SlurmJob, "local": submitit.local.local.LocalJob}.get(settings.cluster)
    if job_class is None:  # a debug job lived in its process, which is gone
        return None
    job = job_class(folder=Path(folder) / "%j", job_id=job_id, tasks=list(range(tasks)))
    job.interlayer_controller = identity  # what _local_alive checks the pid against
    return job


def read_job_record(path: Path, key: str) -> dict[str, Any]:
    """``jobs.json``, the launcher's record (``{key: {name: {"job_id", "tasks", "cluster", ...}}}``: ``key`` is
    ``runs`` for compare, ``trials`` for search), checked entry by entry; an empty record when there is none. A
    record that is not what the launcher writes is refused naming the entry: following or skipping a job on its
    word would lose a run or train one twice."""
    if not path.is_file():
        return {key: {}}
    fix = ("restore it, or delete it once none of its jobs is pending or running (squeue): the runs it names are "
           "then submitted again, and a finished run is never trained twice")
    try:
        record = read_json(path, DataError)
    except DataError as err:
        raise DataError(f"{err}; it was edited or damaged: {fix}") from None
    entries = record.get(key)
    if not isinstance(entries, dict):
        raise DataError(f"{path}: no mapping {key!r} of each {key[:-1]} to its job; it was edited or damaged: {fix}")
    for name, entry in entries.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("job_id"), str) and entry["job_id"]
                and isinstance(entry.get("tasks", 1), int) and entry.get("tasks", 1) >= 1
                and entry.get("cluster", "slurm") in ("slurm", "local", "debug")
                and isinstance(entry.get("submissions", []), list)):
            raise DataError(f"{path}: the entry of {name!r} is {str(entry)[:80]!r}, not a job (job_id a text, tasks a "
                            f"count, cluster slurm, local or debug); it was edited or damaged: {fix}")
    return record


def _has_results(job: Any) -> bool:
    return all(job.task(t).paths.result_pickle.exists() for t in range(job.num_tasks))


def _local_alive(job: Any) -> bool:
    """Whether the local job's controller process (an orphan of an earlier invocation) still runs: its pid names a
    live process (no zombie: a container's init may not reap it) that is a submitit controller and, where the
    record keeps it, the very process that was started for the job (:func:`_process_identity`): a pid the system
    gave to another process since is not followed as if it were the job."""
    pid = job.job_id
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return True  # no /proc (macOS): the pid's existence is all there is to go by
    expected = getattr(job, "interlayer_controller", None)
    return b"submitit.local._local" in command and (expected is None or _process_identity(pid) == expected)


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
            return "running" if _local_alive(job) else "lost"
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
