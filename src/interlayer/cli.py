"""The ``interlayer`` command line: a thin layer over the Python API (every command is a function call)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from . import count_madds, count_parameters, create_model, get_config, list_presets
from .core.config import ConfigError
from .registry import PRESETS
from .tables import format_table, human


def model_table(length: int, names: Optional[Sequence[str]] = None) -> str:
    """Every preset (or ``names``) with its parameters and the MAdds of one forward pass at ``length`` tokens."""
    rows = []
    for name in names or list_presets():
        model = create_model(name)
        cfg = model.config
        grid = cfg.grid_height * cfg.grid_width if cfg.positions == "relative_2d" else 0
        tokens = grid or length
        rows.append([name, cfg.arch, f"{count_parameters(model):,}", human(count_parameters(model)),
                     human(count_madds(model, tokens)) + ("" if not grid else f" (grid {tokens})")])
    return format_table(["preset", "arch", "parameters", "params", f"MAdds @ {length}"], rows)


def paper_tables() -> str:
    from .methods import conv_branch, crossformer, lightweight, multipass, predictive

    parts = []
    for module in (crossformer, multipass, predictive, conv_branch, lightweight):
        for title, headers, rows in getattr(module, "paper_tables", lambda: [])():
            parts.append(f"## {title}\n\n{format_table(headers, rows)}")
    return "\n\n".join(parts)


def _parse_sets(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value (e.g. --set d_model=256 or --set crossformer.hard=kq), "
                              f"got {pair!r}")
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interlayer",
        description="Crossformer, Multi-Pass, Predictive Attention and LW-Transformer on one Transformer core.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    models = sub.add_parser("models", help="list the presets with parameters and MAdds",
                            description="Build every preset (or the named ones) and print parameters and the "
                                        "multiply-adds of one forward pass at --length tokens.")
    models.add_argument("names", nargs="*", help="presets to show (default: all)")
    models.add_argument("--length", type=int, default=64, help="sequence length for MAdds (default 64)")

    sub.add_parser("tables", help="the papers' parameter tables beside our counts",
                   description="Print each method's published parameter tables beside the counts of our builds.")

    config = sub.add_parser("config", help="print a preset's full config (JSON), with overrides",
                            description="Resolve a preset or config file plus --set overrides and print or save it.")
    config.add_argument("preset", help="preset name or .json/.yaml config file")
    config.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field; dotted keys reach a method section (crossformer.hard=kq,ffn)")
    config.add_argument("--output", help="write to this .json/.yaml file instead of printing")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "models":
            unknown = [n for n in args.names if n not in PRESETS]
            if unknown:
                raise ConfigError(f"unknown preset(s) {unknown}; known: {', '.join(list_presets())}")
            print(model_table(args.length, args.names))
        elif args.command == "tables":
            print(paper_tables())
        elif args.command == "config":
            cfg = get_config(args.preset, **_parse_sets(args.sets))
            if args.output:
                cfg.save(args.output)
            else:
                print(json.dumps(cfg.to_dict(), indent=2))
    except ConfigError as err:
        print(f"interlayer: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
