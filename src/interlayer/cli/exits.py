"""The command line's exit codes: how every command's outcome and error becomes one line on stderr and a code a
shell or a scheduler reads (0 done, 1 an unexpected error, 2 bad input, 3 diverged, 128 + N stopped by signal N;
:func:`interlayer.cli.main` lists them). A command runs inside :func:`exit_code`, which knows no command."""
from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Callable, Optional

from ..errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DirectoryBusy,
    DivergenceError,
    TokenizerError,
    WriteError,
)
from ..fileio import write_failure
from ..kernels.dispatch import check_environment
from ..training import distributed
from ..training.concurrency import sigterm_as_stop, stop_code
from .args import one_line

# Bad input, named by the message: exit code 2 and one line. A WriteError (read-only file system, permission,
# full disk) is the machine's situation, named with the file: exit code 2 too.
EXPECTED_ERRORS = (ConfigError, DataError, CheckpointError, TokenizerError, DirectoryBusy, FileNotFoundError,
                   FileExistsError, WriteError)
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


def _quiet_stdout() -> None:
    """After a broken pipe (``interlayer models | head``), point stdout at /dev/null so that the interpreter's
    final flush does not fail again with "Exception ignored ... BrokenPipeError" (Python docs, signal module)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is no file (a test's capture): nothing to flush there
        pass


def _error_line(message: str) -> None:
    """``interlayer: error: MESSAGE`` on stderr in one write: the ranks of a distributed run print the same line
    into one pipe, and a message and its newline written apart interleave there."""
    sys.stderr.write(f"interlayer: error: {one_line(message)}\n")
    sys.stderr.flush()


def _leaving(code: int) -> int:
    """``code``, after making sure that a rank of a distributed run ends with it: every rank has printed the same
    message (training/distributed.py, ``agree``) and is shutting down, which takes PyTorch a moment; torchrun
    sends SIGTERM to the ranks still running when the first one has exited. A rank past its error ignores it (the
    interpreter's shutdown keeps an ignored signal ignored, where it would drop a handler) and exits with ``code``
    a moment later, instead of being reported as killed."""
    try:
        enabled = distributed.environment().enabled
    except ConfigError:  # the environment's own error, reported already: one process
        enabled = False
    if enabled:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        distributed.leave()
    return code


def exit_code(run: Callable[[], Optional[int]], command: str, debug: bool) -> int:
    """Run ``command``'s handler (``run``: its exit code, None for 0) after checking the environment variables the
    commands read, with SIGTERM stopping it as Ctrl-C does, and turn what it raised into the exit code and one
    line on stderr (``debug``: with the traceback)."""
    try:
        check_environment(), distributed.environment()  # the variables commands read, before any writes
        with sigterm_as_stop():
            code = run() or 0
        sys.stdout.flush()  # a reader that went away fails here, not in the interpreter's flush at exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE_EXIT
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM stopping as Ctrl-C does (SignalStop)
        signum = getattr(stop, "signal", signal.SIGINT)
        said = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"interlayer: {said}", file=sys.stderr)
        return stop_code(signum)
    except EXPECTED_ERRORS as err:
        if debug:
            traceback.print_exc()
        _error_line(str(err))
        return _leaving(2)
    except DivergenceError as err:
        print(f"interlayer: error: {err}", file=sys.stderr)
        return 3
    except Exception as err:  # noqa: BLE001 (one line unless --debug)
        # a write the machine refused outside fileio's writers (the mkdir of a run directory, a log file): the
        # machine's situation, named with its file, exit code 2
        failure = write_failure(getattr(err, "filename", None), err) if isinstance(err, OSError) else None
        if failure is not None:
            if debug:
                traceback.print_exc()
            _error_line(str(failure))
            return _leaving(2)
        if debug:
            raise
        print(f"interlayer: internal error: {type(err).__name__}: {one_line(str(err))}\n"
              f"interlayer: run it again with --debug (interlayer --debug {command} ...) for the traceback",
              file=sys.stderr)
        return _leaving(1)
