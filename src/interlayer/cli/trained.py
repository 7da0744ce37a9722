"""The commands over a trained model: ``translate``, ``generate`` (a language model's continuations), ``evaluate``
(a saved model scored by its task) and ``export`` (a folder transformers loads)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from ..errors import CheckpointError, ConfigError, PretrainedError
from ..fileio import atomic_directory, read_json, shorten, write_atomic
from ..tasks import task_specs
from ..tasks.base import TaskCommand
from ..tasks.translation import add_decode_arguments
from .args import add_device_arguments, finite_float


def _translate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/best or RUN_DIR/averaged)")
    parser.add_argument("--input", help="file to translate (plain or .gz); default stdin")
    parser.add_argument("--output", help="file to write; default stdout")
    add_device_arguments(parser, training=False)
    add_decode_arguments(parser)


def _translate(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from ..data.text import read_lines, read_stream_lines
    from ..tasks.translation import decode_options, load_translator, translate
    from ..tasks.translation_decoding import DecodeOptions

    model, vocab = load_translator(Path(args.checkpoint), args.device)
    source = args.input or "<stdin>"
    lines = read_lines(args.input) if args.input else read_stream_lines(sys.stdin.buffer, source)
    out = translate(model, vocab, lines, DecodeOptions(**decode_options(args)), source=source)
    text = "\n".join(out) + ("\n" if out else "")
    if args.output:
        write_atomic(args.output, text)  # a failed write leaves no half of it (and names the file)
    else:
        sys.stdout.write(text)


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/best or RUN_DIR/averaged)")
    parser.add_argument("--src", help="translation: source file (default: the run's test source)")
    parser.add_argument("--ref", help="translation: reference file (default: the run's test target)")
    parser.add_argument("--data", help="classification: a file in the task's format (default: its test split); "
                                       "language model: a UTF-8 text file (default: the run's valid and test); "
                                       "vqa: the folder of the run's data set files")
    parser.add_argument("--noise-std", type=finite_float, default=0.0, metavar="STD",
                        help="vqa: also score with Gaussian noise of this standard deviation on the image features "
                             "(Crossformer Sec. 3.2: 1.0)")
    add_device_arguments(parser, training=False)
    add_decode_arguments(parser)


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


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="language-model folder (RUN_DIR/best)")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline, as nanoGPT)")
    parser.add_argument("--max-new-tokens", type=int, default=500, help="tokens to add (default 500)")
    parser.add_argument("--temperature", type=finite_float, default=0.8, help="0 = greedy (default 0.8, nanoGPT's)")
    parser.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens; 0 = all "
                                                               "(default 200, nanoGPT's)")
    parser.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus sampling mass; 1 = off (default)")
    parser.add_argument("--num-samples", type=int, default=1, help="continuations to print (default 1)")
    parser.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    parser.add_argument("--no-cache", action="store_true", help="re-read the whole context every step")
    add_device_arguments(parser, training=False)


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
    from ..core.generation import SamplingOptions
    from ..tasks.language_modeling import generate_text

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


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its best/ is exported) or a model folder")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write")
    parser.add_argument("--family", help="bert, roberta, distilbert, vit or gpt2 (default: the one that fits)")
    parser.add_argument("--no-tokenizer", action="store_true",
                        help="export without the run's tokenizer (one transformers cannot load is refused otherwise)")
    parser.add_argument("--with-code", action="store_true",
                        help="for a model no transformers family computes: also copy interlayer's model code into "
                             "the folder, so that it loads with trust_remote_code=True where interlayer is not "
                             "installed")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT_DIR's contents when it is not empty (it is replaced as a whole, once the "
                             "export is complete: files of an earlier export do not remain); without it a non-empty "
                             "OUT_DIR is refused")


def _export(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from ..checkpoint import CONFIG_FILE
    from ..models.registry import load_pretrained
    from ..pretrained.export import export
    from ..training.engine import BEST_DIR
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


TRANSLATE = TaskCommand(
    help="translate text with a trained model",
    description="Translate one sentence per line from --input (default stdin) to --output (default stdout).",
    add_arguments=_translate_arguments, run=_translate)
GENERATE = TaskCommand(
    help="continue a prompt with a trained language model",
    description="Sample continuations of --prompt from a model trained with `interlayer train lm` (greedy with "
                "--temperature 0; the KV cache unless --no-cache).",
    add_arguments=_generate_arguments, run=_generate)
EXPORT = TaskCommand(
    help="write a trained model as a folder transformers loads",
    description="Export RUN_DIR's best model (or a model folder) to OUT_DIR for transformers: config.json, "
                "model.safetensors, the run's tokenizer, the labels' names, generation_config.json for a language "
                "model and a model card (README.md). A model no transformers family computes (Predictive Attention, "
                "value residuals, LW, Multi-Pass, ...) is written for interlayer's transformers classes "
                "(AutoModel... load it after `import interlayer`; with --with-code also without interlayer), and "
                "the command says so. See docs/pretrained.md.",
    add_arguments=_export_arguments, run=_export)
EVALUATE = TaskCommand(
    help="score a trained model on a task's test data (or given files)",
    description="Score a saved model folder (RUN_DIR/best, RUN_DIR/averaged) with its task's metrics. Translation: "
                "sacreBLEU and chrF on detokenized text (--src/--ref, default the run's test set). Classification: "
                "accuracy (F1 where the task has it), per-class precision/recall and the confusion matrix (--data, "
                "default the run's test split).",
    add_arguments=_evaluate_arguments, run=_evaluate)
