"""Several runs at once on one machine (``compare --jobs``, ``search --workers``): their share of the cores,
stopping them together, and one writer per directory.

* The time budgets of both are wall-clock minutes, so runs that oversubscribe the cores train less and score
  differently; each of N concurrent runs therefore gets an equal share of the cores this process may use.
* A SIGINT or SIGTERM sent to the parent alone (``kill PID``, a scheduler) must stop its run processes as a
  terminal's Ctrl-C does, or they would train on unattended; :class:`ForwardedInterrupts` passes it on, and
  remembers which it was, for the command's exit code (130 for SIGINT, 143 for SIGTERM); :class:`StopSignals`
  turns either into a ``KeyboardInterrupt`` that remembers it, where a command works in its own process.
* A SIGKILL of the parent cannot be forwarded: its children would train on as orphans beside the next attempt.
  :func:`die_with_parent` makes the kernel send them SIGTERM when their parent goes (module docs below).
* Two processes writing one run directory (two ``compare`` commands, a ``train --resume`` beside a running run)
  interleave their CSV rows and overwrite each other's checkpoints. :class:`DirectoryLock` gives a directory one
  writer for its whole life and names the owner to anyone else.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import errno
import fcntl
import json
import multiprocessing.process
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..errors import DirectoryBusy, SignalStop

LOCK_FILE = "writer.lock"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one, which containers narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_run(concurrent: int) -> Optional[int]:
    """Torch threads for each of ``concurrent`` runs at once (at least 1); None for a single run (torch's own
    default, all cores)."""
    return max(1, available_cores() // concurrent) if concurrent > 1 else None


class _SignalHandlers:
    """SIGINT and SIGTERM sent to :meth:`_handle` while the block runs, the previous handlers put back after; outside
    the main thread (no signal handlers possible) nothing is installed."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:
            self._previous = {}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class ForwardedInterrupts(_SignalHandlers):
    """While active, SIGINT/SIGTERM set :attr:`requested` and are passed on as SIGINT to the live processes in
    :attr:`processes` (whose engines save and stop at the end of their step); :attr:`signal` is the first of them
    received (None while none was).

    The processes usually get a terminal's Ctrl-C themselves too (same process group); a second delivery only
    sets their stop flag again. Outside the main thread (no signal handlers possible) nothing is installed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requested = False
        self.signal: Optional[int] = None
        self.processes: list[multiprocessing.process.BaseProcess] = []

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal = self.signal or signum
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGINT)



def _raise_stopped(signum: int, frame: Any) -> None:
    raise SignalStop(signum)


@contextlib.contextmanager
def sigterm_as_stop() -> Iterator[None]:
    """In the block, SIGTERM raises :class:`~interlayer.errors.SignalStop` (a ``KeyboardInterrupt``) in the main
    thread, as SIGINT raises ``KeyboardInterrupt``, where no handler was set: a command stopped by a scheduler or
    ``kill`` then runs its cleanup (``prepare lm``'s partial folder, ``export``'s staging folder, a pool's workers) and
    exits with 143 and one line, where the default action killed it on the spot. Training, ``compare`` and ``search``
    install their own handlers while they run (they save, or forward the signal to their runs; :class:`StopSignals`)."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class StopSignals(_SignalHandlers):
    """While active, SIGINT and SIGTERM raise :class:`~interlayer.errors.SignalStop` (a ``KeyboardInterrupt``
    naming the signal): a SIGTERM stops the work as Ctrl-C does, with its cleanup, instead of ending the process on
    the spot, and the caller learns which signal it was. The engine installs its own handlers while it trains
    (saving and stopping after the step) and puts these back after. Outside the main thread nothing is installed.
    """

    def _handle(self, signum: int, frame: Any) -> None:
        raise SignalStop(signum)


def stop_code(signum: Optional[int]) -> int:
    """The exit code of a command a signal stopped: 128 + its number, as a shell reports a process the signal
    killed (130 for SIGINT, 143 for SIGTERM); SIGINT's when the signal is not known."""
    return 128 + int(signum or signal.SIGINT)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _describe(owner: dict[str, Any]) -> str:
    return (f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')} (a {owner.get('what', 'writer')}, "
            f"started {owner.get('started', '?')})")


class DirectoryLock:
    """An exclusive lock on ``directory`` (the file ``writer.lock`` in it), held by one writer for its life.

    The lock is ``fcntl.flock`` on that file, so the kernel releases it when the holder exits in any way, SIGKILL
    included; the file holds the owner (pid, host, start time, what it is) only to name it. A second writer is
    refused with :class:`DirectoryBusy` naming the owner. A lock file that still names an owner while nobody holds
    the lock was left by a process that died without releasing it: it is taken over, and ``warn`` says whose it
    was. A clean release empties the file. The file is never deleted: a process that opened it before a deletion
    could lock the orphaned inode while a third process locks a new file, and both would write.

    ``flock`` locks belong to an open file, not a process, so two locks taken in one process also exclude each
    other, and a child forked while the lock is held shares it. Over NFS, Linux emulates ``flock`` with POSIX
    byte-range locks, which the server arbitrates between hosts.
    """

    def __init__(self, directory: Path, what: str, *, warn: Callable[[str], None] = _to_stderr) -> None:
        self.directory, self.what, self.warn = Path(directory), what, warn
        self.path = self.directory / LOCK_FILE
        self._fd: Optional[int] = None

    @staticmethod
    def _read_owner(fd: int) -> dict[str, Any]:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        if not text:
            return {}
        try:
            owner = json.loads(text)
        except json.JSONDecodeError:
            return {"pid": "?", "host": "?", "started": f"unreadable lock file: {text[:60]!r}"}
        return owner if isinstance(owner, dict) else {}

    def _refusal(self, owner: dict[str, Any]) -> DirectoryBusy:
        if not owner:
            return DirectoryBusy(f"{self.directory} is being written by another process that has just taken "
                                 f"{self.path} (its owner is not recorded yet); wait for it to finish or stop it")
        pid = owner.get("pid")
        text = (f"{self.directory} is being written by another process: {_describe(owner)}; wait for it to finish "
                f"or stop it (kill {pid}): two writers would mix their logs and overwrite each other's checkpoints")
        if owner.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
            text += (f". pid {pid} has exited, but a process it started still holds {self.path} (an orphaned child?"
                     f" `fuser {self.path}` names it)")
        return DirectoryBusy(text)

    def acquire(self) -> "DirectoryLock":
        """Take the lock (creating the directory) or raise :class:`DirectoryBusy`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            owner = self._read_owner(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise self._refusal(owner) from None
            raise
        previous = self._read_owner(fd)
        if previous:
            self.warn(f"interlayer: warning: taking over {self.path}: its owner, {_describe(previous)}, is no longer "
                      "running (it was killed or crashed); this process writes the directory now")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
                  "started": datetime.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty the owner record and unlock (a clean exit leaves nothing to take over)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def die_with_parent(sig: int = signal.SIGTERM, *, ancestor: Optional[int] = None) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux ``prctl(PR_SET_PDEATHSIG)``).

    Why this and not a process group: a SIGKILL of the parent reaches no one else, whatever the group, and a
    ``killpg`` needs a survivor to send it; only the kernel sees the parent go. A ``compare`` run process is the
    child of multiprocessing's forkserver, which exits as soon as the ``compare`` process that started it is gone
    (its end of a pipe closes), so the signal follows the death of ``compare`` by a moment. SIGTERM rather than
    SIGKILL: the engine then finishes its step and writes ``checkpoint_last.pt``, so the next ``compare`` resumes
    the run exactly instead of losing its last steps.

    The request covers deaths after the call; one that came before is caught afterwards: the parent pid changed
    during the call, or ``ancestor`` (the pid of the process that asked for this one, e.g. ``compare`` behind the
    forkserver) is gone already. Elsewhere than Linux this does nothing (docs/reliability.md).
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(code)}")
    if os.getppid() != parent or (ancestor is not None and not _pid_alive(ancestor)):
        os.kill(os.getpid(), sig)
