"""The ``interlayer`` command line: a thin layer over the Python API (every command is a function call).

One module per job: :mod:`~interlayer.cli.args` the argument helpers every parser is built from (``--set`` pairs,
the device flags, finite numbers, one-line usage errors); one module per group of commands, each command's
arguments beside its handler (:mod:`~interlayer.cli.catalog`: models, tables, config; :mod:`~interlayer.cli.runs`:
train, compare, search; :mod:`~interlayer.cli.trained`: translate, generate, export, evaluate;
:mod:`~interlayer.cli.prepare`: prepare); :mod:`~interlayer.cli.exits` what an outcome or an error becomes (one
line, an exit code). This module lists the commands (:data:`COMMANDS`, then each task's own,
``TaskSpec.commands``), builds the parser and dispatches. ``python -m interlayer.cli`` runs :func:`main` (as
``torchrun ... -m interlayer.cli`` does).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ..tasks import task_commands
from ..tasks.base import TaskCommand
from . import catalog, prepare, runs, trained
from .args import CommandParser
from .exits import exit_code

# The command line's own commands, in the order `interlayer --help` lists them (each task's own come after).
COMMANDS: dict[str, TaskCommand] = {
    "models": catalog.MODELS, "tables": catalog.TABLES, "config": catalog.CONFIG, "train": runs.TRAIN,
    "translate": trained.TRANSLATE, "generate": trained.GENERATE, "export": trained.EXPORT,
    "prepare": prepare.PREPARE, "evaluate": trained.EVALUATE, "compare": runs.COMPARE, "search": runs.SEARCH}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one sub-command per entry of :data:`COMMANDS` and per task's own command, each task's
    own flags under ``train TASK`` (``TaskSpec.add_arguments``)."""
    parser = CommandParser(
        prog="interlayer",
        description="Crossformer, Multi-Pass, Predictive Attention and LW-Transformer on one Transformer core.",
        epilog="A bad input (config, data, model folder, a directory another process writes) is reported in one line "
               "with exit code 2; an unexpected error in one line with exit code 1 (--debug: with its traceback). "
               "See docs/reliability.md.")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of any error (give it before the command: interlayer --debug ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in {**COMMANDS, **task_commands()}.items():
        command.add_arguments(sub.add_parser(name, help=command.help, description=command.description))
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; the exit code: 0 done, 2 bad input (one line naming what and where), 3 training diverged
    (non-finite loss or gradients; the step is named), 1 an unexpected
    error (one line; ``--debug`` adds the traceback), 130/143 stopped by SIGINT/SIGTERM, 141 the reader of stdout
    went away (``| head``: ends quietly, as a program killed by SIGPIPE), compare/search: 1 when a run failed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    command = COMMANDS.get(args.command) or task_commands()[args.command]
    return exit_code(lambda: command.run(args, argv), args.command, args.debug)
