"""What produced a comparison's numbers, for the report's reader to judge whether a re-run should match them:
interlayer's commit, torch and Python, the device, the threads, the wall time and the machine's load."""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .plan import Plan


@dataclass(frozen=True)
class Environment:
    """What produced the numbers, for the report's reader to judge whether a re-run should match them."""

    commit: str  # interlayer's git commit ("+ local changes" when the work tree differs), or why it is unknown
    torch: str
    device: str
    threads: str  # torch threads per run and runs at a time
    wall_seconds: Optional[float]  # this invocation of compare, planning to report
    load: str  # the 1-minute load average at the start and at the end

    def lines(self) -> list[str]:
        wall = "–" if self.wall_seconds is None else f"{self.wall_seconds / 60:.1f} min ({self.wall_seconds:.0f} s)"
        return [f"interlayer commit {self.commit}", f"torch {self.torch}, Python {platform.python_version()}",
                f"device: {self.device}", f"threads: {self.threads}", f"wall time of this invocation: {wall}",
                f"load average (1 min): {self.load}"]


def git_commit() -> str:
    """The commit of the interlayer source in use, if it is a git checkout."""
    source = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout, or git is missing)"
    return head + (" + local changes" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def comparison_environment(plan: Plan, threads: Optional[int], jobs: int, wall_seconds: Optional[float],
                load_at_start: Optional[float], cluster: Optional[str] = None) -> Environment:
    """The environment of a comparison that has just run: ``threads`` is the runner's torch threads per run (a
    config's ``train.threads`` wins), ``jobs`` the runs at a time; ``cluster`` where the runs ran when they were
    cluster jobs (the runs' own logs name their nodes)."""
    device = str(plan.settings.sets.get("train.device", "auto"))
    if cluster is not None:
        device_text = f"{device} on {cluster}"
    elif device in ("auto", "cuda") and torch.cuda.is_available():
        device_text = f"{device}: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} GPU(s))"
    else:
        device_text = f"{device}: CPU, {cpu_name()}, {os.cpu_count()} logical core(s)"
    per_run = plan.settings.sets.get("train.threads") or threads or (
        "the job's cores (SLURM_CPUS_PER_TASK, else all)" if cluster else torch.get_num_threads())
    end = load_average()
    load = " -> ".join("–" if v is None else f"{v:.2f}" for v in (load_at_start, end)) + " (start -> end)"
    return Environment(git_commit(), torch.__version__, device_text, f"{per_run} torch thread(s) per run, {jobs} "
                       "run(s) at a time", wall_seconds, load)
