"""The ``interlayer`` command line: a thin layer over the Python API (every command is a function call)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence

from .cli_args import (  # noqa: F401 (one_line: part of the command line's interface)
    MESSAGE_CHARS,
    _add_device_arguments,
    _device_sets,
    _parse_sets,
    _Parser,
    finite_float,
    one_line,
)
from .compare import DEFAULT as COMPARE_DEFAULT
from .compare import options as compare_options
from .errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DirectoryBusy,
    DivergenceError,
    PretrainedError,
    TokenizerError,
    WriteError,
)
from .fileio import atomic_directory, read_json, shorten, write_atomic, write_failure
from .kernels.dispatch import check_environment
from .tasks import task_commands, task_specs
from .tasks.translation import add_decode_arguments
from .training import distributed
from .training.cluster import add_launcher_arguments, launcher_from_args
from .training.concurrency import available_cores, sigterm_as_stop, stop_code


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one sub-command per entry of :data:`COMMANDS`, each task's own flags under ``train TASK``
    (``TaskSpec.add_arguments``), and the shared device, decoding and launcher options."""
    parser = _Parser(
        prog="interlayer",
        description="Crossformer, Multi-Pass, Predictive Attention and LW-Transformer on one Transformer core.",
        epilog="A bad input (config, data, model folder, a directory another process writes) is reported in one line "
               "with exit code 2; an unexpected error in one line with exit code 1 (--debug: with its traceback). "
               "See docs/reliability.md.")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of any error (give it before the command: interlayer --debug ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    models = sub.add_parser("models", help="list every model preset with parameters and MAdds",
                            description="Build every preset (or the named ones) of every model family "
                                        "(Transformer, text CNN, image, GAT, MCAN) and print parameters and the "
                                        "multiply-adds of one forward pass: at --length tokens for text, one "
                                        "image for the image models, the bundled graph for GAT, a question of 14 "
                                        "tokens and 100 regions for MCAN.")
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
        _add_device_arguments(task, training=True)
        spec.add_arguments(task)

    translate = sub.add_parser("translate", help="translate text with a trained model",
                               description="Translate one sentence per line from --input (default stdin) to "
                                           "--output (default stdout).")
    translate.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/best or RUN_DIR/averaged)")
    translate.add_argument("--input", help="file to translate (plain or .gz); default stdin")
    translate.add_argument("--output", help="file to write; default stdout")
    _add_device_arguments(translate, training=False)
    add_decode_arguments(translate)

    _add_generate_parser(sub)
    _add_export_parser(sub)
    _add_prepare_parser(sub)

    evaluate = sub.add_parser("evaluate", help="score a trained model on a task's test data (or given files)",
                              description="Score a saved model folder (RUN_DIR/best, RUN_DIR/averaged) with its "
                                          "task's metrics. Translation: sacreBLEU and chrF on detokenized text "
                                          "(--src/--ref, default the run's test set). Classification: accuracy "
                                          "(F1 where the task has it), per-class precision/recall and the "
                                          "confusion matrix (--data, default the run's test split).")
    evaluate.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/best or RUN_DIR/averaged)")
    evaluate.add_argument("--src", help="translation: source file (default: the run's test source)")
    evaluate.add_argument("--ref", help="translation: reference file (default: the run's test target)")
    evaluate.add_argument("--data", help="classification: a file in the task's format (default: its test split); "
                                         "language model: a UTF-8 text file (default: the run's valid and test); "
                                         "vqa: the folder of the run's data set files")
    evaluate.add_argument("--noise-std", type=finite_float, default=0.0, metavar="STD",
                          help="vqa: also score with Gaussian noise of this standard deviation on the image features "
                               "(Crossformer Sec. 3.2: 1.0)")
    _add_device_arguments(evaluate, training=False)
    add_decode_arguments(evaluate)

    compare = sub.add_parser(
        "compare", help="train variants side by side (same budget and seeds) and report them as the papers do",
        description="Train every variant for every seed, one process (or, with --launcher submitit, one SLURM job) "
                    "per run, under the same budget (--budget-steps optimiser steps, or --budget-minutes of "
                    "training, else the task's epoch limits), then write DIR/report.md, DIR/report.csv, "
                    "DIR/report.tex and a self-contained DIR/report.html (the table with mean ± std over seeds and "
                    "the difference to the baseline by the paired test where the seeds match, learning curves, "
                    "size/cost bars, and each method's own picture). Ctrl-C stops cleanly; the same command "
                    "continues. See docs/compare.md.")
    compare.add_argument("--task", help="task name (interlayer train --help lists them)")
    compare.add_argument("--variants", action="append", default=[], metavar="V1,V2,...",
                         help="named variants (--list-variants), presets, .json/.yaml configs, or "
                              "NAME=BASE+KEY=VALUE+...; the first is the baseline unless --baseline")
    compare.add_argument("--seeds", type=int,
                         help="seeds 1..N for every variant (default 1); a finished comparison may be given more")
    compare.add_argument("--budget-minutes", type=finite_float,
                         help="training minutes per run (train.max_minutes; validation excluded)")
    compare.add_argument("--budget-steps", type=int,
                         help="optimiser steps per run (train.max_steps): the same table on any load of the same "
                              "machine and software")
    compare_options.add_arguments(compare)
    compare.add_argument("--output", metavar="DIR", help="comparison directory (default runs/compare/TASK)")
    compare.add_argument("--preset", help="base preset of the named variants (default: the task's)")
    compare.add_argument("--baseline", metavar="NAME", help="the variant the others are compared with")
    compare.add_argument("--select", action="append", default=[], metavar="GROUP=V1,V2,...",
                         help="variants that are candidate values of one hyper-parameter (e.g. pa=pa,pa_a0.3): the "
                              "report names the one with the best validation mean and marks its row (repeatable; "
                              "report only, so it may be added to a comparison under way)")
    compare.add_argument("--margin", type=float, metavar="DELTA",
                         help="equivalence margin for the verdicts, absolute, in the units of the task's metric "
                              "(nats for lm's loss, percentage points for accuracy, BLEU points): a variant whose "
                              "difference to the baseline two one-sided tests place inside ±DELTA is 'equivalent' "
                              "(report only; default: no equivalence test)")
    compare.add_argument("--effect", type=float, metavar="DELTA",
                         help="the smallest difference of interest, absolute, in the units of the task's metric, "
                              "stated before the runs: an undecided verdict names the seeds per variant that detect "
                              "it with power 0.8 (report only; without it or --margin no seeds are planned: never "
                              "for the difference observed)")
    compare.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                         help="for every variant: a model field, train.KEY or data.KEY (repeatable)")
    compare.add_argument("--default", action="store_true",
                         help="the README's comparison: a character-level language model on the bundled "
                              "Shakespeare, baseline,pa,crossformer_kq,crossformer_sg,lw_1x, "
                              f"{COMPARE_DEFAULT['seeds']} seeds, {COMPARE_DEFAULT['budget_steps']} steps each, "
                              f"{COMPARE_DEFAULT['jobs']} jobs (docs/compare.md; any flag given overrides its part)")
    compare.add_argument("--jobs", type=int,
                         help="runs trained at once, each with cores/JOBS torch threads unless train.threads is set "
                              "(default 1; 2 with --default); keep it the same for every run of one comparison "
                              "(--launcher local only)")
    compare.add_argument("--list-variants", action="store_true", help="list the named variants and exit")
    _add_device_arguments(compare, training=True)
    add_launcher_arguments(compare, "run")
    _add_search_parser(sub)
    for name, command in task_commands().items():  # the tasks' own (TaskSpec.commands: interlayer caption, ...)
        command.add_arguments(sub.add_parser(name, help=command.help, description=command.description))
    return parser


def _add_generate_parser(sub: argparse._SubParsersAction) -> None:
    generate = sub.add_parser("generate", help="continue a prompt with a trained language model",
                              description="Sample continuations of --prompt from a model trained with `interlayer "
                                          "train lm` (greedy with --temperature 0; the KV cache unless --no-cache).")
    generate.add_argument("--checkpoint", required=True, help="language-model folder (RUN_DIR/best)")
    generate.add_argument("--prompt", default="\n", help="text to continue (default: a newline, as nanoGPT)")
    generate.add_argument("--max-new-tokens", type=int, default=500, help="tokens to add (default 500)")
    generate.add_argument("--temperature", type=finite_float, default=0.8, help="0 = greedy (default 0.8, nanoGPT's)")
    generate.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens; 0 = all "
                                                                 "(default 200, nanoGPT's)")
    generate.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus sampling mass; 1 = off (default)")
    generate.add_argument("--num-samples", type=int, default=1, help="continuations to print (default 1)")
    generate.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    generate.add_argument("--no-cache", action="store_true", help="re-read the whole context every step")
    _add_device_arguments(generate, training=False)


# generate holds every new token until it prints the continuation, and beyond the model's context each token costs
# a full pass over a sliding window: a bound keeps a typo (--max-new-tokens 100000000) from running for days into
# memory exhaustion with nothing printed.
MAX_NEW_TOKENS = 100_000
# The samples are generated as one batch (one row each): --num-samples 100000000 asked for 38 GB at once.
MAX_SAMPLES = 1_000
# The seeds every random generator takes (numpy's are 32-bit); train.seed has the same range.
SEED_RANGE = range(2 ** 32)


def _prompt_text(prompt: str) -> str:
    """``--prompt`` as text: bytes that were not UTF-8 reach Python as lone surrogates (``surrogateescape``)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        raw = prompt.encode("utf-8", "surrogateescape")
        raise ConfigError(f"--prompt is not valid UTF-8 (byte {err.start}: {raw[err.start:err.start + 4]!r}); give "
                          "the prompt as UTF-8 text") from None
    return prompt


def _generate(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .core.generation import SamplingOptions
    from .tasks.language_modeling import generate_text

    if not 1 <= args.num_samples <= MAX_SAMPLES:
        raise ConfigError(f"--num-samples={args.num_samples} must be 1..{MAX_SAMPLES:,}: the samples are generated "
                          "as one batch; for more, run the command again with other --seed values")
    if args.seed not in SEED_RANGE:
        raise ConfigError(f"--seed={shorten(str(args.seed))} is outside 0..{SEED_RANGE[-1]}, the seeds every random "
                          "generator accepts (as train.seed); give a seed in that range")
    if args.max_new_tokens > MAX_NEW_TOKENS:
        raise ConfigError(f"--max-new-tokens={args.max_new_tokens} is more than {MAX_NEW_TOKENS:,}: the continuation "
                          "is printed when it is complete, and past the model's context every token re-reads a "
                          "sliding window; ask for fewer (or call model.generate from Python in pieces)")
    prompt = _prompt_text(args.prompt)
    options = SamplingOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, use_cache=False if args.no_cache else None)
    try:
        options.validate(vocab_size=1 << 62)  # the token ids are checked against the model when it is loaded
    except ValueError as err:
        raise ConfigError(f"generate: {err}") from None
    samples = generate_text(Path(args.checkpoint), prompt, options, seed=args.seed, samples=args.num_samples,
                            device=args.device)
    print("\n---------------\n".join(samples))


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="write a trained model as a folder transformers loads",
                            description="Export RUN_DIR's best model (or a model folder) to OUT_DIR for transformers: "
                                        "config.json, model.safetensors, the run's tokenizer, the labels' names, "
                                        "generation_config.json for a language model and a model card "
                                        "(README.md). A model no transformers family computes (Predictive "
                                        "Attention, value residuals, LW, Multi-Pass, ...) is written for "
                                        "interlayer's transformers classes (AutoModel... load it after `import "
                                        "interlayer`; with --with-code also without interlayer), and the command "
                                        "says so. See docs/pretrained.md.")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its best/ is exported) or a model folder")
    export.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write")
    export.add_argument("--family", help="bert, roberta, distilbert, vit or gpt2 (default: the one that fits)")
    export.add_argument("--no-tokenizer", action="store_true",
                        help="export without the run's tokenizer (one transformers cannot load is refused otherwise)")
    export.add_argument("--with-code", action="store_true",
                        help="for a model no transformers family computes: also copy interlayer's model code into "
                             "the folder, so that it loads with trust_remote_code=True where interlayer is not "
                             "installed")
    export.add_argument("--overwrite", action="store_true",
                        help="replace OUT_DIR's contents when it is not empty (it is replaced as a whole, once the "
                             "export is complete: files of an earlier export do not remain); without it a non-empty "
                             "OUT_DIR is refused")


def _export(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .checkpoint import CONFIG_FILE
    from .models.registry import load_pretrained
    from .pretrained.export import export
    from .training.engine import BEST_DIR
    source, target = Path(args.run_dir), Path(args.out_dir)
    folder = source / BEST_DIR if os.path.lexists(source / BEST_DIR / CONFIG_FILE) else source
    if not os.path.lexists(folder / CONFIG_FILE):
        raise FileNotFoundError(f"{source} is neither a run directory with a {BEST_DIR}/ model nor a model folder "
                                f"({CONFIG_FILE} is missing): pass the directory `interlayer train` wrote")
    _check_export_target(source, target, args.overwrite)
    model = load_pretrained(folder)
    with atomic_directory(target, replace=args.overwrite) as staging:
        try:
            report = export(model, staging, family=args.family, tokenizer=False if args.no_tokenizer else None,
                            with_code=args.with_code)
        except PretrainedError as err:
            raise ConfigError(str(err)) from None
    if report.format == "transformers":
        note = " (a transformers family's own classes need no code: --with-code changes nothing)" \
            if args.with_code else ""
        print(f"wrote {report.architecture} for transformers to {target}{note}")
    else:
        carried = (", and with trust_remote_code=True without interlayer (the folder carries its code)"
                   if report.with_code else " (--with-code: also without interlayer)")
        print(f"wrote {report.architecture} (interlayer's class for transformers) to {target} ({report.reason}); "
              f"transformers loads it after `import interlayer`{carried}; interlayer.load_pretrained loads it too")


def _check_export_target(source: Path, target: Path, overwrite: bool) -> None:
    """Refuse an export target that is (or lies below) a file, that overlaps the run or folder being exported
    (``export RUN RUN/best`` would replace the model it reads), or that holds files, unless ``--overwrite``."""
    for path in (target, *target.parents):
        if path.exists() and not path.is_dir():
            where = "is a file" if path == target else f"cannot be a folder: {path} is a file"
            raise ConfigError(f"the export target {target} {where}; give a folder to write (a new one, or an empty "
                              "one; --overwrite replaces a folder's contents)")
    out, read = target.resolve(), source.resolve()
    if out == read or out.is_relative_to(read) or read.is_relative_to(out):
        relation = "is" if out == read else "lies inside" if out.is_relative_to(read) else "holds"
        raise ConfigError(f"the export target {target} {relation} {source}, the run or model folder being exported: "
                          "writing there would replace what the export reads; choose a folder outside it")
    entries = sorted(entry.name for entry in target.iterdir()) if target.is_dir() else []
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} in all)" if len(entries) > 5 else "")
        raise ConfigError(f"the export target {target} is not empty ({shown}); pass --overwrite to replace its "
                          "contents, or choose a new or empty folder")


def _add_prepare_parser(sub: argparse._SubParsersAction) -> None:
    prepare = sub.add_parser("prepare", help="tokenize a corpus once, into token files train lm reads",
                             description="Turn text into the token files `interlayer train lm --data DIR` reads "
                                         "memory-mapped. See docs/language-modeling.md.")
    kinds = prepare.add_subparsers(dest="kind", required=True, metavar="TASK")
    lm = kinds.add_parser(
        "lm", help="UTF-8 text -> nanoGPT .bin files or llm.c shards",
        description="Read a UTF-8 file or folder as `train lm` reads it (split files, or documents split by "
                    "--valid-fraction/--test-fraction), tokenize each split with --tokenizer in parallel, and write "
                    "nanoGPT's train.bin/val.bin/test.bin (or llm.c shards) and meta.json into a new folder, "
                    "atomically; the same text gives the same bytes. Training on the folder trains on the ids "
                    "`train lm` would have made from the text.")
    lm.add_argument("source", metavar="SOURCE", help="a UTF-8 text file, a folder of .txt files, or a folder with "
                                                     "train.txt and valid.txt (test.txt optional)")
    lm.add_argument("--output", required=True, metavar="DIR", help="the folder to write (must not exist, or be empty)")
    lm.add_argument("--tokenizer", default="char", metavar="char|bpe|DIR",
                    help="char (default; the corpus's characters), bpe (a byte-level BPE trained on the training "
                         "split), an interlayer run folder, or a GPT-2-style Hugging Face tokenizer folder "
                         "(vocab.json + merges.txt, or tokenizer.json)")
    lm.add_argument("--vocab-size", type=int, default=4096, help="bpe: the vocabulary to train (default 4096)")
    lm.add_argument("--format", choices=("nanogpt", "shards"), default="nanogpt",
                    help="nanogpt: train.bin, val.bin, test.bin (default); shards: llm.c's tokens_train_000000.bin, "
                         "... with a 256-int header each")
    lm.add_argument("--shard-tokens", type=int, default=100_000_000, help="shards: ids per shard (default 10^8)")
    lm.add_argument("--valid-fraction", type=finite_float, default=0.05,
                    help="without split files: the share of the text held out for validation (default 0.05)")
    lm.add_argument("--test-fraction", type=finite_float, default=0.05,
                    help="... and for test, after validation (default 0.05)")
    lm.add_argument("--keep-gutenberg", action="store_true", help="keep Project Gutenberg's headers and footers")
    lm.add_argument("--workers", type=int, default=available_cores(),
                    help="processes tokenizing at once (default: every core this process may use, here %(default)s)")
    lm.add_argument("--no-progress", action="store_true", help="no progress bar")


def _prepare(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .data.prepare_lm import PrepareSettings, prepare
    from .tasks.language_modeling import tokenizer_of

    tokenizer = args.tokenizer if args.tokenizer in ("char", "bpe") else tokenizer_of(args.tokenizer)
    meta = prepare(PrepareSettings(
        source=args.source, output=Path(args.output), tokenizer=tokenizer, vocab_size=args.vocab_size,
        layout=args.format, shard_tokens=args.shard_tokens, valid_fraction=args.valid_fraction,
        test_fraction=args.test_fraction, gutenberg=not args.keep_gutenberg, workers=args.workers,
        progress=not args.no_progress))
    counts = ", ".join(f"{split} {count:,}" for split, count in meta["tokens"].items())
    print(f"wrote {args.output}: {counts} tokens of a {meta['vocab_size']}-token {meta['tokenizer']['kind']} "
          f"vocabulary; train with: interlayer train lm --data {args.output}")


def _add_search_parser(sub: argparse._SubParsersAction) -> None:
    search = sub.add_parser("search", help="architecture search on Optuna (Multi-Pass hard connections)",
                            description="Search an architecture space with many short trainings scored on the "
                                        "validation set. See docs/search.md.")
    spaces = search.add_subparsers(dest="space", required=True, metavar="SPACE")
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
    _add_device_arguments(mpt, training=True)
    add_launcher_arguments(mpt, "trial")


# Each handler imports what only it uses: a command loads its own code (and `interlayer --help` nobody's).
def _models(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .models.registry import model_catalog

    print(model_catalog(args.length, args.names))


def _tables(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .papers import paper_tables

    print(paper_tables())


def _config(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .models.registry import get_config

    cfg = get_config(args.preset, **_parse_sets(args.sets))
    if args.output:
        cfg.save(args.output)
    else:
        print(json.dumps(cfg.to_dict(), indent=2))


def _train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Exit code 0 when the run finished; 128 + the signal's number when a signal stopped it (SIGINT 130, SIGTERM
    143), as a shell reports a process the signal killed, so scripts and schedulers see the run did not finish."""
    from .experiment import train
    from .training.engine import BEST_DIR

    spec = task_specs()[args.task]
    try:
        data_sets, options = spec.options_from_args(args)
        options = {**options, "allow_data_change": True} if args.allow_data_change else options
        sets = {**_parse_sets(args.sets), **data_sets, **_device_sets(args)}
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


def _translate(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from .data.text import read_lines, read_stream_lines
    from .tasks.translation import decode_options, load_translator, translate
    from .tasks.translation_decoding import DecodeOptions

    model, vocab = load_translator(Path(args.checkpoint), args.device)
    source = args.input or "<stdin>"
    lines = read_lines(args.input) if args.input else read_stream_lines(sys.stdin.buffer, source)
    out = translate(model, vocab, lines, DecodeOptions(**decode_options(args)), source=source)
    text = "\n".join(out) + ("\n" if out else "")
    if args.output:
        write_atomic(args.output, text)  # a failed write leaves no half of it (and names the file)
    else:
        sys.stdout.write(text)


def _evaluate(args: argparse.Namespace, argv: Sequence[str]) -> None:
    directory = Path(args.checkpoint)
    info = directory / "task.json"
    if not os.path.lexists(info):
        raise FileNotFoundError(f"{directory} has no task.json: pass a model folder written by `interlayer train` "
                                "(RUN_DIR/best or RUN_DIR/averaged)")
    name = read_json(info, CheckpointError, within=directory).get("task")
    specs = task_specs()
    if name not in specs:
        raise CheckpointError(f"{info} names the task {name!r}; known tasks: {', '.join(specs)} (pass a model "
                              "folder written by `interlayer train`)")
    print(specs[name].evaluate(directory, args))


def _compare(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .compare import DEFAULT, DEFAULT_OUTPUT, describe_named, make_settings, parse_selections
    from .tables import format_table

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
                             sets={**_parse_sets(chosen["sets"]), **_device_sets(args)},
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


def _search(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .search.mpt import DEFAULT_OUTPUT, SearchSettings, run_search, write_report

    needed = [("--output or --task", args.output or args.task)] if args.report_only else [
        ("--task", args.task), ("--trials", args.trials)]
    missing = [flag for flag, value in needed if value is None]
    if missing:
        raise ConfigError(f"search mpt needs {' and '.join(missing)}")
    output = Path(args.output or DEFAULT_OUTPUT.format(task=args.task))
    settings = SearchSettings(
        task=args.task or "", trials=1 if args.trials is None else args.trials, output=output, preset=args.preset,
        sets={**_parse_sets(args.sets), **_device_sets(args)},
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
        from .search.launch import run_search_jobs

        outcome = run_search_jobs(settings, launcher)
    print(outcome.report)
    return {"done": 0, "interrupted": stop_code(outcome.signal), "failed": 1}[outcome.status]


# The handler of each command: (parsed args, the command line after the program name) -> exit code (None: 0).
COMMANDS: dict[str, Callable[[argparse.Namespace, Sequence[str]], Optional[int]]] = {
    "models": _models, "tables": _tables, "config": _config, "train": _train, "translate": _translate,
    "evaluate": _evaluate, "generate": _generate, "export": _export, "compare": _compare, "search": _search,
    "prepare": _prepare}

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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; the exit code: 0 done, 2 bad input (one line naming what and where), 3 training diverged
    (non-finite loss or gradients; the step is named), 1 an unexpected
    error (one line; ``--debug`` adds the traceback), 130/143 stopped by SIGINT/SIGTERM, 141 the reader of stdout
    went away (``| head``: ends quietly, as a program killed by SIGPIPE), compare/search: 1 when a run failed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        check_environment(), distributed.environment()  # the variables commands read, before any writes
        with sigterm_as_stop():
            code = (COMMANDS.get(args.command) or task_commands()[args.command].run)(args, argv) or 0
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
        if args.debug:
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
            if args.debug:
                traceback.print_exc()
            _error_line(str(failure))
            return _leaving(2)
        if args.debug:
            raise
        print(f"interlayer: internal error: {type(err).__name__}: {one_line(str(err))}\n"
              f"interlayer: run it again with --debug (interlayer --debug {args.command} ...) for the traceback",
              file=sys.stderr)
        return _leaving(1)


if __name__ == "__main__":
    sys.exit(main())
