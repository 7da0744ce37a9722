"""Decoding speed of a trained translation model: greedy and beam 5, with and without the incremental cache.

All four settings translate the same sentences (default: the 1,000 of Multi30k test_2016_flickr) in one process;
outputs with and without the cache must be identical, which the script checks and reports.

    python benchmarks/bench_decode.py --checkpoint runs/translation/transformer_multi30k-s1/best
"""
from __future__ import annotations

import argparse
import time

import torch

from interlayer.data.parallel import bundled_dir, read_parallel
from interlayer.tables import format_table
from interlayer.tasks.translation import load_translator, score, translate
from interlayer.tasks.translation_decoding import DecodeOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="translation model folder (RUN_DIR/best)")
    parser.add_argument("--src", default=str(bundled_dir("multi30k") / "test_2016_flickr.de.gz"))
    parser.add_argument("--ref", default=str(bundled_dir("multi30k") / "test_2016_flickr.en.gz"))
    parser.add_argument("--limit", type=int, default=1000, help="number of sentences")
    args = parser.parse_args()
    model, vocab = load_translator(args.checkpoint)
    pair = read_parallel(args.src, args.ref)
    source, reference = pair.source[: args.limit], pair.target[: args.limit]
    rows, outputs = [], {}
    for beam in (1, 5):
        for cache in (True, False):
            start = time.perf_counter()
            hyps = translate(model, vocab, source, DecodeOptions(beam=beam, use_cache=cache))
            seconds = time.perf_counter() - start
            outputs[(beam, cache)] = hyps
            words = sum(len(h.split()) for h in hyps)
            rows.append([f"{'greedy' if beam == 1 else f'beam {beam}'}", "yes" if cache else "no",
                         f"{seconds:.1f}", f"{len(source) / seconds:.1f}", f"{words / seconds:.0f}",
                         f"{score(hyps, reference)['bleu']:.2f}"])
    same = all(outputs[(b, True)] == outputs[(b, False)] for b in (1, 5))
    print(f"{len(source)} sentences, {torch.get_num_threads()} threads; cache and no-cache outputs identical: "
          f"{same}\n")
    print(format_table(["decoding", "cache", "seconds", "sentences/s", "words/s", "BLEU"], rows))


if __name__ == "__main__":
    main()
