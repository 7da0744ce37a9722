"""``interlayer prepare lm``: a corpus tokenized once, into the token files ``train lm --data DIR`` reads
memory-mapped (a call of :func:`interlayer.data.prepare_lm.prepare`)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ..tasks.base import TaskCommand
from ..training.concurrency import available_cores
from .args import finite_float


def _prepare_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="TASK")
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
    from ..data.prepare_lm import PrepareSettings, prepare
    from ..tasks.language_modeling import tokenizer_of

    tokenizer = args.tokenizer if args.tokenizer in ("char", "bpe") else tokenizer_of(args.tokenizer)
    meta = prepare(PrepareSettings(
        source=args.source, output=Path(args.output), tokenizer=tokenizer, vocab_size=args.vocab_size,
        layout=args.format, shard_tokens=args.shard_tokens, valid_fraction=args.valid_fraction,
        test_fraction=args.test_fraction, gutenberg=not args.keep_gutenberg, workers=args.workers,
        progress=not args.no_progress))
    counts = ", ".join(f"{split} {count:,}" for split, count in meta["tokens"].items())
    print(f"wrote {args.output}: {counts} tokens of a {meta['vocab_size']}-token {meta['tokenizer']['kind']} "
          f"vocabulary; train with: interlayer train lm --data {args.output}")


PREPARE = TaskCommand(
    help="tokenize a corpus once, into token files train lm reads",
    description="Turn text into the token files `interlayer train lm --data DIR` reads memory-mapped. See "
                "docs/language-modeling.md.",
    add_arguments=_prepare_arguments, run=_prepare)
