"""The commands that show what the package holds, training nothing: ``models`` (every preset, its parameters and
MAdds), ``tables`` (the papers' tables beside our builds) and ``config`` (a preset's resolved config)."""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from ..tasks.base import TaskCommand
from .args import parse_sets


def _models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="presets to show (default: all)")
    parser.add_argument("--length", type=int, default=64, help="sequence length for MAdds (default 64)")


# Each handler imports what only it uses: a command loads its own code (and `interlayer --help` nobody's).
def _models(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from ..models.registry import model_catalog

    print(model_catalog(args.length, args.names))


def _tables(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from ..papers import paper_tables

    print(paper_tables())


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="preset name or .json/.yaml config file")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field; dotted keys reach a method section (crossformer.hard=kq,ffn)")
    parser.add_argument("--output", help="write to this .json/.yaml file instead of printing")


def _config(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from ..models.registry import get_config

    cfg = get_config(args.preset, **parse_sets(args.sets))
    if args.output:
        cfg.save(args.output)
    else:
        print(json.dumps(cfg.to_dict(), indent=2))


MODELS = TaskCommand(
    help="list every model preset with parameters and MAdds",
    description="Build every preset (or the named ones) of every model family (Transformer, text CNN, image, GAT, "
                "MCAN) and print parameters and the multiply-adds of one forward pass: at --length tokens for text, "
                "one image for the image models, the bundled graph for GAT, a question of 14 tokens and 100 regions "
                "for MCAN.",
    add_arguments=_models_arguments, run=_models)
TABLES = TaskCommand(
    help="the papers' parameter tables beside our counts",
    description="Print each method's published parameter tables beside the counts of our builds.",
    add_arguments=lambda parser: None, run=_tables)
CONFIG = TaskCommand(
    help="print a preset's full config (JSON), with overrides",
    description="Resolve a preset or config file plus --set overrides and print or save it.",
    add_arguments=_config_arguments, run=_config)
