"""Every exception class of the package, in one place: the bottom module, which imports nothing of interlayer.

They live here, below the core, so that data, training, comparison and the command line name them without
importing the module that raises them (the CLI catches a tokenizer's error without loading Hugging Face code), and
the core imports them without reaching up. ``tests/test_errors.py`` checks that no other module defines one.

Three kinds:

* a user's mistake, reported by the CLI as one line and exit code 2: :class:`ConfigError` (a setting),
  :class:`DataError` (a data file), :class:`CheckpointError` (a saved model), and their refinements;
* a bad situation of the machine, reported the same way: :class:`WriteError`, :class:`DirectoryBusy`;
* signals between parts of the package, never shown to a user: :class:`RunStopped`, :class:`SignalStop`,
  :class:`TooManyTensors`.

``interlayer.ConfigError`` and ``interlayer.CheckpointError`` stay the public names of the first two.
"""
from __future__ import annotations

import signal


class ConfigError(ValueError):
    """A configuration that cannot work; the message names the key, the value and what would be valid."""


class KernelUnavailable(ConfigError, RuntimeError):
    """``INTERLAYER_KERNELS=triton`` where a kernel cannot run (no Triton, no CUDA tensors, a case it does not cover):
    a setting that cannot work (exit code 2 on the command line), and the ``RuntimeError`` it was before."""


class VariantError(ConfigError):
    """A ``compare --variants`` entry that cannot be parsed, or cannot apply to the task's model."""


class UnsupportedGenerationOption(ValueError):
    """A ``generate`` option :func:`~interlayer.core.hf_generation.generate_like_hf` does not implement."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the requested model; the message says what differs."""


class PretrainedError(CheckpointError):
    """A checkpoint that is not a supported Hugging Face model, or a model that cannot become one."""


class DataError(ValueError):
    """A data file that cannot be used as it is; the message names the file, the line and what was expected."""


class TokenizerError(DataError):
    """A vocabulary or tokenizer configuration that cannot give the checkpoint's tokenisation; the message says
    why (a :class:`DataError`, a ``ValueError``: a bad input wherever it is met)."""


class DamagedResults(Exception):
    """A compare run's ``results.json`` that cannot be read (empty, cut short, not a JSON object): the message names
    it. ``compare`` counts such a run as unfinished and finishes it again."""


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss or gradients; the message names the step and what was kept."""


class WriteError(OSError):
    """A file or folder that could not be written (read-only file system, permission, full disk); the message
    names it and what to do (a bad situation of the user's machine, not a bug: exit code 2)."""


class DiskFullError(WriteError):
    """A file could not be written for lack of space; the message names it and the free space (a bad situation of
    the user's machine, not a bug: exit code 2)."""


class DirectoryBusy(RuntimeError):
    """Another live process holds the directory's lock; the message names it (pid, host, start) and what to do."""


class RunStopped(Exception):
    """SIGINT/SIGTERM met by a compare run process outside the engine's loop (which handles them itself by saving
    and returning); the message is the signal's name."""


class SignalStop(KeyboardInterrupt):
    """SIGINT or SIGTERM where a command stops as on Ctrl-C (any command's SIGTERM, a search's SIGINT too): a
    ``KeyboardInterrupt``, so that whatever handles Ctrl-C handles it, that remembers which signal it was for the
    exit code (128 + its number: 130 for SIGINT, 143 for SIGTERM, as a shell reports a process the signal killed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = int(signum)


class TooManyTensors(BaseException):
    """Stops a shapes-only build that registers more tensors than the saved weights could hold (a BaseException,
    so that no ``except Exception`` of a builder swallows it; :func:`interlayer.checkpoint.build_on_meta`)."""
