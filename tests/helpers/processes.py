"""Real processes, for the tests where a process is the point (a lock across processes, a signal to ``train`` or
``compare``, a closed pipe): the command line in a child interpreter, waiting for what it does, and what it
leaves (a run directory's lock, a process gone)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from interlayer.training.concurrency import LOCK_FILE

from . import SRC


def cli_process(args: list[str], cwd: Path, **kwargs: Any) -> subprocess.Popen:
    """``interlayer ARGS`` in a child interpreter that imports the checkout's sources (``Popen`` keywords pass on)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", "import sys; from interlayer.cli import main; sys.exit(main())",
                             *args], cwd=cwd, env=env, **kwargs)


def wait_for(condition: Callable[[], Any], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.1)


def gone(pid: int) -> bool:
    """The process no longer runs (never existed, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def lock_owner(directory: Path) -> dict:
    """What the lock of ``directory`` says of its owner (``{}``: no lock, or released)."""
    text = (directory / LOCK_FILE).read_text() if (directory / LOCK_FILE).is_file() else ""
    return json.loads(text) if text.strip() else {}


def dead_pid() -> int:
    """The id of a process that has exited (a child that printed its pid and ended)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)
