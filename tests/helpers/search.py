"""A fake MPT search objective: a smooth landscape over 4-layer permutations, no training (MPT Sec. 3.4).

``Scored`` is a module-level class so that spawned worker processes can unpickle it."""
from __future__ import annotations

import os
import time
from pathlib import Path

from interlayer.search.mpt import SearchSettings, TrialResult
from interlayer.search.sampler import Definition

N = 4
DEFINITION = Definition(n_layers=N, metric="score", higher_is_better=True)
TARGET = (0, 3, 1, 2)


def score(permutation) -> float:
    """A smooth landscape: minus the distance to TARGET (0 at TARGET)."""
    return -float(sum(abs(a - b) for a, b in zip(permutation, TARGET)))


class Scored:
    """Objective: the landscape score; writes the worker's pid into the trial's run directory."""

    def __init__(self, seconds: float = 0.0, barrier: int = 0, seconds_after_kill: float = 0.0) -> None:
        self.seconds, self.barrier, self.seconds_after_kill = seconds, barrier, seconds_after_kill

    def __call__(self, request):
        request.run_dir.mkdir(parents=True)
        (request.run_dir / "pid").write_text(str(os.getpid()))
        pids = request.settings.output / "pids"
        pids.mkdir(exist_ok=True)
        (pids / str(os.getpid())).touch()
        deadline = time.time() + 30
        while len(list(pids.iterdir())) < self.barrier and time.time() < deadline:
            time.sleep(0.05)  # every worker process holds a trial before the first one ends
        killed = (request.settings.output / "killed").exists()
        time.sleep(self.seconds_after_kill if killed else self.seconds)
        return TrialResult(score(request.permutation), {"score": score(request.permutation)}, 0.0, "test")


def search_settings(tmp_path: Path, **changes) -> SearchSettings:
    """Search settings writing under ``tmp_path/search``: 8 trials, 3 coarse, top 2, a 1 s heartbeat."""
    values = dict(task="sst5", trials=8, output=tmp_path / "search", coarse=3, top_k=2, heartbeat_seconds=1)
    values.update(changes)
    return SearchSettings(**values)
