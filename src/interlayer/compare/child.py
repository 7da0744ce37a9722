"""One run of a comparison, in its own process: :func:`entry` is the target the runner starts.

A process per run means a crash or an out-of-memory kill loses that run only, and the peak memory measured is
the run's own: ``ru_maxrss`` of this process, taken when the run starts and again at the end; the growth between
the two (the task's data, the model, optimiser state and activations) is recorded as ``peak_rss_growth_mb`` beside
the absolute ``peak_rss_mb``. A resumed run records each segment in ``compare_memory.json`` and its results take
the largest. Each segment also records its wall time and its process CPU time (user + system, all threads): the
CPU seconds do not depend on how loaded the machine was, so a run's cost can be planned from them.

Exit codes: 0 finished (``results.json`` written), 3 interrupted (Ctrl-C / SIGTERM: the engine saved
``checkpoint_last.safetensors`` and the run can resume), 4 interrupted before training began or while scoring; anything
else is a failure (the log holds the traceback).
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from ..errors import DamagedResults, RunStopped
from ..experiment import train
from ..fileio import read_json, write_json
from ..tasks import task_specs
from ..training.concurrency import die_with_parent
from .readback import check_results, read_memory

FINISHED, INTERRUPTED, STOPPED_OUTSIDE_TRAINING = 0, 3, 4
MEMORY_FILE = "compare_memory.json"
RESULTS_FILE = "results.json"


def read_results(run_dir: Path) -> Optional[dict[str, Any]]:
    """The run's ``results.json``; None when there is none. One that is no JSON object (a crash of an older
    interlayer, which wrote it in place, or a disk that filled) raises :class:`DamagedResults` naming the file, so
    that `compare` counts the run as unfinished and finishes it again instead of failing on it; one whose fields are
    not what a run writes is refused (:func:`~interlayer.compare.readback.check_results`, a ``DataError``)."""
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        return None
    return check_results(read_json(path, DamagedResults), path)


def _stop(signum: int, frame: Any) -> None:
    raise RunStopped(signal.Signals(signum).name)


def max_rss_mb() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value / (2 ** 20 if sys.platform == "darwin" else 2 ** 10)


def _record_memory(run_dir: Path, segment: dict[str, Any]) -> dict[str, float]:
    """Append this segment's memory to ``compare_memory.json``; return the largest over all segments."""
    path = run_dir / MEMORY_FILE
    segments = read_memory(path)
    segments.append(segment)
    write_json(path, segments)
    return {key: max(s[key] for s in segments) for key in ("peak_rss_mb", "peak_rss_growth_mb")}


def run_job(job: dict[str, Any]) -> int:
    """Train one run of a comparison in this process (``experiment.train`` with the job's task, preset, sets, seed and
    budget) and record its peak memory growth; ``results.json`` is written only for a finished run, so an interrupted
    one is continued by the next invocation. Returns the exit code the runner reads (:data:`FINISHED` or
    :data:`INTERRUPTED`)."""
    spec = task_specs()[job["task"]]
    if job.get("threads"):  # the runner's share of the cores; a config's train.threads still wins in the engine
        torch.set_num_threads(job["threads"])
    run_dir = Path(job["run_dir"])
    started, cpu_started, rss_before = time.perf_counter(), time.process_time(), max_rss_mb()
    results = train(spec, preset=job["preset"], sets=job["sets"], seed=job["seed"], max_minutes=job["max_minutes"],
                    run_dir=run_dir, resume=job["resume"], progress=False)
    peak = max_rss_mb()
    memory = _record_memory(run_dir, {"peak_rss_mb": peak, "peak_rss_growth_mb": peak - rss_before,
                                      "resumed": job["resume"], "status": results["status"],
                                      "wall_seconds": time.perf_counter() - started,
                                      "cpu_seconds": time.process_time() - cpu_started})
    if results["status"] != "finished":
        print(json.dumps(results, indent=2))
        return INTERRUPTED
    results.update(memory)
    write_json(run_dir / RESULTS_FILE, results)
    print(json.dumps(results, indent=2))
    return FINISHED


def entry(job: dict[str, Any], log: str) -> None:
    """The run process: its output goes to ``log``; its exit code is the outcome (module docstring). It dies with
    the ``compare`` process (:func:`~interlayer.training.concurrency.die_with_parent`): SIGTERM, so it saves."""
    die_with_parent(signal.SIGTERM, ancestor=job.get("parent"))
    with open(log, "a") as handle:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)
    try:
        code = run_job(job)
    except RunStopped as stop:
        print(f"stopped by {stop} outside the training loop; the run continues from its last checkpoint",
              file=sys.stderr)
        code = STOPPED_OUTSIDE_TRAINING
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    sys.exit(code)
