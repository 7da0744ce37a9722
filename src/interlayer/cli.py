"""The ``interlayer`` command line: a thin layer over the Python API (every command is a function call)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from pathlib import Path

from . import count_madds, count_parameters, create_model, get_config, list_presets
from .checkpoint import CheckpointError
from .core.config import ConfigError
from .data.text import DataError, read_lines
from .decoding import DecodeOptions
from .experiment import train
from .tasks import task_specs
from .tasks.translation import add_decode_arguments, decode_options, load_translator, translate
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

    train = sub.add_parser("train", help="train a model on a task",
                           description="Train a preset or config on a task; each task has its own flags "
                                       "(interlayer train TASK --help).")
    tasks = train.add_subparsers(dest="task", required=True, metavar="TASK")
    for spec in task_specs().values():
        task = tasks.add_parser(spec.name, help=spec.description,
                                description=f"Train on {spec.description}. Keys given with --set go to the model "
                                            "config; train.KEY and data.KEY reach the training and data settings "
                                            "(e.g. --set d_model=256 --set train.lr=5e-4).")
        task.add_argument("--preset", default=spec.default_preset,
                          help=f"preset name or .json/.yaml model config (default {spec.default_preset})")
        task.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                          help="override a model field, or train.KEY / data.KEY (repeatable)")
        task.add_argument("--seed", type=int, default=1, help="random seed (data order, init, dropout)")
        task.add_argument("--max-minutes", type=float, help="training budget in minutes (validation excluded)")
        task.add_argument("--run-dir", help="where the run is written (default runs/TASK/PRESET-sSEED)")
        task.add_argument("--resume", action="store_true", help="continue the run in --run-dir where it stopped")
        task.add_argument("--no-progress", action="store_true", help="no progress bar (logs are still written)")
        spec.add_arguments(task)

    translate = sub.add_parser("translate", help="translate text with a trained model",
                               description="Translate one sentence per line from --input (default stdin) to "
                                           "--output (default stdout).")
    translate.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/best or RUN_DIR/averaged)")
    translate.add_argument("--input", help="file to translate (plain or .gz); default stdin")
    translate.add_argument("--output", help="file to write; default stdout")
    add_decode_arguments(translate)

    evaluate = sub.add_parser("evaluate", help="score a trained model on a task's test data (or given files)",
                              description="Score a saved model folder (RUN_DIR/best, RUN_DIR/averaged) with its "
                                          "task's metrics. Translation: sacreBLEU and chrF on detokenized text "
                                          "(--src/--ref, default the run's test set). Classification: accuracy "
                                          "(F1 where the task has it), per-class precision/recall and the "
                                          "confusion matrix (--data, default the run's test split).")
    evaluate.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/best or RUN_DIR/averaged)")
    evaluate.add_argument("--src", help="translation: source file (default: the run's test source)")
    evaluate.add_argument("--ref", help="translation: reference file (default: the run's test target)")
    evaluate.add_argument("--data", help="classification: a file in the task's format (default: its test split)")
    add_decode_arguments(evaluate)
    return parser


def _train(args: argparse.Namespace) -> None:
    spec = task_specs()[args.task]
    data_sets, options = spec.options_from_args(args)
    sets = {**_parse_sets(args.sets), **data_sets}
    run_dir = Path(args.run_dir or f"runs/{args.task}/{Path(args.preset).stem}-s{args.seed}")
    results = train(spec, preset=args.preset, sets=sets, seed=args.seed, max_minutes=args.max_minutes,
                    run_dir=run_dir, resume=args.resume, progress=not args.no_progress, options=options)
    print(json.dumps(results, indent=2))


def _translate(args: argparse.Namespace) -> None:
    model, vocab = load_translator(Path(args.checkpoint))
    lines = read_lines(args.input) if args.input else [line.rstrip("\n") for line in sys.stdin]
    out = translate(model, vocab, lines, DecodeOptions(**decode_options(args)))
    text = "\n".join(out) + ("\n" if out else "")
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)


def _evaluate(args: argparse.Namespace) -> None:
    directory = Path(args.checkpoint)
    info = directory / "task.json"
    if not info.is_file():
        raise FileNotFoundError(f"{directory} has no task.json: pass a model folder written by `interlayer train` "
                                "(RUN_DIR/best or RUN_DIR/averaged)")
    name = json.loads(info.read_text())["task"]
    spec = task_specs()[name]
    if spec.evaluate is None:
        raise ConfigError(f"task {name!r} has no evaluate command")
    print(spec.evaluate(directory, args))


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
        elif args.command == "train":
            _train(args)
        elif args.command == "translate":
            _translate(args)
        elif args.command == "evaluate":
            _evaluate(args)
    except (ConfigError, DataError, CheckpointError, FileNotFoundError, FileExistsError) as err:
        print(f"interlayer: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
