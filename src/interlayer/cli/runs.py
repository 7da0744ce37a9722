"""The commands that train: ``train TASK`` (one run), ``compare`` (variants side by side under one budget) and
``search mpt`` (Multi-Pass permutations), each a call of :func:`interlayer.experiment.train`,
:func:`interlayer.compare.run_compare` (through ``compare.options.run``) or :func:`interlayer.search.mpt.run_search`."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Sequence

from ..compare import DEFAULT as COMPARE_DEFAULT
from ..compare import options as compare_options
from ..errors import ConfigError
from ..tasks import task_specs
from ..tasks.base import TaskCommand
from ..training import distributed
from ..training.cluster import add_launcher_arguments, launcher_from_args
from ..training.concurrency import stop_code
from .args import add_device_arguments, device_sets, finite_float, parse_sets
from .exits import EXPECTED_ERRORS


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    for spec in task_specs().values():
        task = tasks.add_parser(spec.name, help=spec.description,
                                description=f"Train on {spec.description}. Keys given with --set go to the model "
                                            "config; train.KEY and data.KEY reach the training and data settings "
                                            "(e.g. --set d_model=256 --set train.lr=5e-4).")
        task.add_argument("--preset",
                          help=f"preset name or .json/.yaml model config (default {spec.default_preset})")
        task.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                          help="override a model field, or train.KEY / data.KEY (repeatable); with --resume only "
                               "the keys that may change on resume (docs/training.md)")
        task.add_argument("--seed", type=int, help="random seed (data order, init, dropout; default 1)")
        task.add_argument("--max-minutes", type=finite_float, help="training budget in minutes (validation excluded)")
        task.add_argument("--run-dir", help="where the run is written (default runs/TASK/PRESET-sSEED; "
                                            "runs/TASK/CHECKPOINT-sSEED with --pretrained)")
        task.add_argument("--resume", action="store_true", help="continue the run in --run-dir where it stopped")
        task.add_argument("--allow-data-change", action="store_true", help="--resume on data whose files differ from "
                                                                           "the run's (refused otherwise)")
        task.add_argument("--no-progress", action="store_true", help="no progress bar (logs are still written)")
        add_device_arguments(task, training=True)
        spec.add_arguments(task)


def _train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Exit code 0 when the run finished; 128 + the signal's number when a signal stopped it (SIGINT 130, SIGTERM
    143), as a shell reports a process the signal killed, so scripts and schedulers see the run did not finish."""
    from ..experiment import train
    from ..training.engine import BEST_DIR

    spec = task_specs()[args.task]
    try:
        data_sets, options = spec.options_from_args(args)
        options = {**options, "allow_data_change": True} if args.allow_data_change else options
        sets = {**parse_sets(args.sets), **data_sets, **device_sets(args)}
    except EXPECTED_ERRORS as err:  # under torchrun every rank learns of it and stops with the same message
        env = distributed.environment()
        distributed.initialise(env)
        distributed.agree(env, err)
        raise
    preset = args.preset or spec.default_preset
    model_name = Path(getattr(args, "pretrained", None) or preset).stem  # a fine-tuning run: the checkpoint
    run_dir = Path(args.run_dir or f"runs/{args.task}/{model_name}-s{1 if args.seed is None else args.seed}")
    # where things go, on stderr (stdout carries the results' JSON)
    print(f"interlayer: {'resuming' if args.resume else 'training'} {args.task} in {run_dir}", file=sys.stderr)
    results = train(spec, preset=args.preset, sets=sets, seed=args.seed, max_minutes=args.max_minutes,
                    run_dir=run_dir, resume=args.resume, progress=not args.no_progress, options=options,
                    command=["interlayer", *argv])
    print(json.dumps(results, indent=2))
    if results["status"] == "finished":
        best = run_dir / BEST_DIR
        print(f"interlayer: best checkpoint: {best if best.is_dir() else 'none written'}; results: "
              f"{run_dir / 'results.json'}", file=sys.stderr)
        return 0
    return 128 + signal.Signals[results.get("signal", "SIGINT")]


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help="task name (interlayer train --help lists them)")
    parser.add_argument("--variants", action="append", default=[], metavar="V1,V2,...",
                        help="named variants (--list-variants), presets, .json/.yaml configs, or "
                             "NAME=BASE+KEY=VALUE+...; the first is the baseline unless --baseline")
    parser.add_argument("--seeds", type=int,
                        help="seeds 1..N for every variant (default 1); a finished comparison may be given more")
    parser.add_argument("--budget-minutes", type=finite_float,
                        help="training minutes per run (train.max_minutes; validation excluded)")
    parser.add_argument("--budget-steps", type=int,
                        help="optimiser steps per run (train.max_steps): the same table on any load of the same "
                             "machine and software")
    compare_options.add_arguments(parser)
    parser.add_argument("--output", metavar="DIR", help="comparison directory (default runs/compare/TASK)")
    parser.add_argument("--preset", help="base preset of the named variants (default: the task's)")
    parser.add_argument("--baseline", metavar="NAME", help="the variant the others are compared with")
    parser.add_argument("--select", action="append", default=[], metavar="GROUP=V1,V2,...",
                        help="variants that are candidate values of one hyper-parameter (e.g. pa=pa,pa_a0.3): the "
                             "report names the one with the best validation mean and marks its row (repeatable; "
                             "report only, so it may be added to a comparison under way)")
    parser.add_argument("--margin", type=float, metavar="DELTA",
                        help="equivalence margin for the verdicts, absolute, in the units of the task's metric "
                             "(nats for lm's loss, percentage points for accuracy, BLEU points): a variant whose "
                             "difference to the baseline two one-sided tests place inside ±DELTA is 'equivalent' "
                             "(report only; default: no equivalence test)")
    parser.add_argument("--effect", type=float, metavar="DELTA",
                        help="the smallest difference of interest, absolute, in the units of the task's metric, "
                             "stated before the runs: an undecided verdict names the seeds per variant that detect "
                             "it with power 0.8 (report only; without it or --margin no seeds are planned: never "
                             "for the difference observed)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="for every variant: a model field, train.KEY or data.KEY (repeatable)")
    parser.add_argument("--default", action="store_true",
                        help="the README's comparison: a character-level language model on the bundled "
                             "Shakespeare, baseline,pa,crossformer_kq,crossformer_sg,lw_1x, "
                             f"{COMPARE_DEFAULT['seeds']} seeds, {COMPARE_DEFAULT['budget_steps']} steps each, "
                             f"{COMPARE_DEFAULT['jobs']} jobs (docs/compare.md; any flag given overrides its part)")
    parser.add_argument("--jobs", type=int,
                        help="runs trained at once, each with cores/JOBS torch threads unless train.threads is set "
                             "(default 1; 2 with --default); keep it the same for every run of one comparison "
                             "(--launcher local only)")
    parser.add_argument("--list-variants", action="store_true", help="list the named variants and exit")
    add_device_arguments(parser, training=True)
    add_launcher_arguments(parser, "run")


def _compare(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ..compare import DEFAULT, DEFAULT_OUTPUT, describe_named, make_settings, parse_selections
    from ..tables import format_table

    if args.list_variants:
        print(format_table(["variant", "what it is"], describe_named()))
        return 0
    chosen = {"task": args.task, "variants": args.variants, "seeds": args.seeds,
              "budget_minutes": args.budget_minutes, "budget_steps": args.budget_steps, "sets": args.sets,
              "jobs": args.jobs}
    if args.default:
        chosen = {key: value if value not in (None, []) else DEFAULT[key] for key, value in chosen.items()}
        if compare_options.replaces_steps(args) and args.budget_steps is None:
            chosen["budget_steps"] = None  # minutes, FLOPs or tokens asked for instead of the default's steps
        chosen["sets"] = chosen["sets"] if args.sets else compare_options.default_sets(chosen["sets"], args)
    missing = [f"--{key}" for key in ("task", "variants") if not chosen[key]]
    if missing:
        raise ConfigError(f"compare needs {' and '.join(missing)} (or --default for the README's comparison)")
    seeds = 1 if chosen["seeds"] is None else chosen["seeds"]  # --seeds 0 is refused, not taken for the default
    settings = make_settings(chosen["task"], chosen["variants"], seeds=seeds, budget_minutes=chosen["budget_minutes"],
                             preset=args.preset, baseline=args.baseline,
                             sets={**parse_sets(chosen["sets"]), **device_sets(args)},
                             budget_steps=chosen["budget_steps"], **compare_options.budgets(args))
    sweep = compare_options.sweep_options(args)
    output = Path(args.output or (DEFAULT_OUTPUT if sweep is None else compare_options.SWEEP_OUTPUT).format(
        task=settings.task))
    launcher = launcher_from_args(args)
    if launcher is not None and args.jobs is not None:
        raise ConfigError("--jobs applies to --launcher local; with submitit every run is its own job (limit how many "
                          "run at once with --slurm-array-parallelism)")
    result = compare_options.run(settings, sweep, output, command=["interlayer", *argv],
                                 jobs=1 if chosen["jobs"] is None or launcher is not None else chosen["jobs"],
                                 selections=parse_selections(args.select), margin=args.margin, launcher=launcher,
                                 effect=args.effect)
    if result.interrupted:
        return stop_code(result.signal)  # 130 for Ctrl-C, 143 for SIGTERM
    return 1 if result.failed else 0


def _search_arguments(parser: argparse.ArgumentParser) -> None:
    spaces = parser.add_subparsers(dest="space", required=True, metavar="SPACE")
    mpt = spaces.add_parser(
        "mpt", help="permutations of the Multi-Pass hard connections (MPT Sec. 3.4)",
        description="Train the task's model with multipass.connection=hard for permutations of its N encoder layers "
                    "(the identity first, then a coarse random phase, then single swaps around the best patterns, "
                    "skipping neighbours of poor ones), each with the same seed and budget, scored on the "
                    "validation set; write DIR/report.md and DIR/best_pattern.png. The same command resumes the "
                    "study; run it on several machines with one --storage/--study to share the work.")
    mpt.add_argument("--task", help="task name (interlayer train --help lists them)")
    mpt.add_argument("--preset", help="preset or .json/.yaml model config (default: the task's)")
    mpt.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                     help="for every trial: a model field, train.KEY or data.KEY (repeatable)")
    mpt.add_argument("--trials", type=int, help="complete trials wanted in total, over all workers and runs")
    mpt.add_argument("--coarse", type=int, help="random patterns before refinement (default (trials-1)//2)")
    mpt.add_argument("--top-k", type=int, default=3, help="refine around the K best patterns (default 3)")
    mpt.add_argument("--poor-fraction", type=finite_float, default=0.5,
                     help="the worst share of completed trials whose neighbours are skipped (default 0.5)")
    mpt.add_argument("--budget-minutes", type=finite_float, help="training minutes per trial (validation excluded)")
    mpt.add_argument("--storage", metavar="URL", help="Optuna database URL (default sqlite:///DIR/study.db; "
                                                      "postgresql://USER:PASSWORD@HOST/DB for many machines)")
    mpt.add_argument("--study", default="mpt-search", help="study name in the storage (default mpt-search)")
    mpt.add_argument("--output", metavar="DIR", help="search directory (default runs/search/mpt-TASK)")
    mpt.add_argument("--workers", type=int, default=1,
                     help="worker processes on this machine (default 1); with --launcher submitit: trials in flight at "
                          "once, each its own job")
    mpt.add_argument("--seed", type=int, default=1, help="seed of every trial's training and of the sampler")
    mpt.add_argument("--retry-lost", type=int, default=0, metavar="R",
                     help="re-run a lost trial (worker killed, machine down) up to R times (default 0)")
    mpt.add_argument("--heartbeat", type=int, default=60, metavar="SECONDS",
                     help="heartbeat interval; a trial silent for twice this is lost (default 60)")
    mpt.add_argument("--report-only", action="store_true", help="rewrite the report from the storage and exit")
    add_device_arguments(mpt, training=True)
    add_launcher_arguments(mpt, "trial")


def _search(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ..search.mpt import DEFAULT_OUTPUT, SearchSettings, run_search, write_report

    needed = [("--output or --task", args.output or args.task)] if args.report_only else [
        ("--task", args.task), ("--trials", args.trials)]
    missing = [flag for flag, value in needed if value is None]
    if missing:
        raise ConfigError(f"search mpt needs {' and '.join(missing)}")
    output = Path(args.output or DEFAULT_OUTPUT.format(task=args.task))
    settings = SearchSettings(
        task=args.task or "", trials=1 if args.trials is None else args.trials, output=output, preset=args.preset,
        sets={**parse_sets(args.sets), **device_sets(args)},
        coarse=args.coarse, top_k=args.top_k, poor_fraction=args.poor_fraction, budget_minutes=args.budget_minutes,
        storage=args.storage, study=args.study, seed=args.seed, workers=args.workers, retry_lost=args.retry_lost,
        heartbeat_seconds=args.heartbeat)
    if args.report_only:
        print(write_report(settings))
        return 0
    launcher = launcher_from_args(args)
    if launcher is None:
        outcome = run_search(settings)
    else:
        from ..search.launch import run_search_jobs

        outcome = run_search_jobs(settings, launcher)
    print(outcome.report)
    return {"done": 0, "interrupted": stop_code(outcome.signal), "failed": 1}[outcome.status]


TRAIN = TaskCommand(
    help="train a model on a task",
    description="Train a preset or config on a task; each task has its own flags (interlayer train TASK --help).",
    add_arguments=_train_arguments, run=_train)
COMPARE = TaskCommand(
    help="train variants side by side (same budget and seeds) and report them as the papers do",
    description="Train every variant for every seed, one process (or, with --launcher submitit, one SLURM job) per "
                "run, under the same budget (--budget-steps optimiser steps, or --budget-minutes of training, else "
                "the task's epoch limits), then write DIR/report.md, DIR/report.csv, DIR/report.tex and a "
                "self-contained DIR/report.html (the table with mean ± std over seeds and the difference to the "
                "baseline by the paired test where the seeds match, learning curves, size/cost bars, and each "
                "method's own picture). Ctrl-C stops cleanly; the same command continues. See docs/compare.md.",
    add_arguments=_compare_arguments, run=_compare)
SEARCH = TaskCommand(
    help="architecture search on Optuna (Multi-Pass hard connections)",
    description="Search an architecture space with many short trainings scored on the validation set. See "
                "docs/search.md.",
    add_arguments=_search_arguments, run=_search)
