"""Imported only inside multiprocessing's forkserver, the first module :func:`.runner.process_context` preloads
there: it ties the server's life to the ``compare`` process that started it.

The run processes are children of the server, not of ``compare``, and the server stays up while any of them lives
(each holds a descriptor that keeps it up, so that it could start processes of its own). A run that asked for a
signal at its parent's death (:func:`~interlayer.training.concurrency.die_with_parent`) would thus wait for a server
that waits for the run, and both would outlive a ``compare`` killed with SIGKILL. Killing the server when
``compare`` dies breaks the circle: the server gets SIGKILL (it holds nothing to save), and its runs get SIGTERM,
finish their step, save ``checkpoint_last.pt`` and exit.

Caveat (Linux): the kernel sends the signal when the *thread* that started the server ends. ``compare`` starts it
from the thread that runs the comparison, which waits for every run; a program that runs comparisons from several
threads at once should give each its own process.
"""
from __future__ import annotations

import signal

from ..training.concurrency import die_with_parent

die_with_parent(signal.SIGKILL)
