"""Several runs at once on one machine (``compare --jobs``, ``search --workers``): their share of the cores, and
stopping them together.

* The time budgets of both are wall-clock minutes, so runs that oversubscribe the cores train less and score
  differently; each of N concurrent runs therefore gets an equal share of the cores this process may use.
* A SIGINT or SIGTERM sent to the parent alone (``kill PID``, a scheduler) must stop its run processes as a
  terminal's Ctrl-C does, or they would train on unattended; :class:`ForwardedInterrupts` passes it on.
"""
from __future__ import annotations

import multiprocessing.process
import os
import signal
from typing import Any, Optional


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one, which containers narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_run(concurrent: int) -> Optional[int]:
    """Torch threads for each of ``concurrent`` runs at once (at least 1); None for a single run (torch's own
    default, all cores)."""
    return max(1, available_cores() // concurrent) if concurrent > 1 else None


class ForwardedInterrupts:
    """While active, SIGINT/SIGTERM set :attr:`requested` and are passed on as SIGINT to the live processes in
    :attr:`processes` (whose engines save and stop at the end of their step).

    The processes usually get a terminal's Ctrl-C themselves too (same process group); a second delivery only
    sets their stop flag again. Outside the main thread (no signal handlers possible) nothing is installed.
    """

    def __init__(self) -> None:
        self.requested = False
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGINT)

    def __enter__(self) -> "ForwardedInterrupts":
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:
            self._previous = {}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
