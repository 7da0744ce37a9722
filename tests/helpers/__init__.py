"""Plain functions and constants that more than one test module uses (fixtures are in ``tests/conftest.py``).

A test module imports what it shares from here, never from another test module: each test file then runs on its
own and the suite has no order between files (``tests/test_test_layout.py`` checks it). pytest puts ``tests/`` on
``sys.path`` (``rootdir`` import mode ``prepend``, no ``__init__.py`` in ``tests/``), so ``import helpers`` works
in ``make test`` and in a single-file run alike. The submodules are named after the test module each came from,
or after what they hold (``tiny_runs``: the smallest run of each task).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

SRC = Path(__file__).resolve().parents[2] / "src"  # the checkout's sources, for PYTHONPATH of child processes
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# A small plain-text book for the language-model task: 60 short lines.
TEXT = "".join(f"Line {i}: to be, or not to be; that is the question {i * 7}.\n" for i in range(60))


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations ``fn()`` runs, as ``torch.utils.flop_counter`` counts them (2 per multiply-add)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def set_args(items: Iterable[str]) -> list[str]:
    """``KEY=VALUE`` items as command-line arguments: ``--set KEY=VALUE`` each."""
    return [arg for item in items for arg in ("--set", item)]
