"""Generation speed of a trained language model, with and without the KV cache.

Every setting continues the same prompts (the first characters of the validation plays) by the same number of
tokens with greedy decoding, alternating cached and uncached rounds; the tokens must be identical with and
without the cache, which the script checks and reports. New tokens per second are the median over the rounds.

    python benchmarks/bench_generate.py --checkpoint runs/lm/gpt_shakespeare_char-s1/best --new-tokens 200
    python benchmarks/bench_generate.py --checkpoint DIR --device cuda --json generate.json   # the GPU campaign
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from interlayer.core.generation import SamplingOptions
from interlayer.tables import format_table
from interlayer.tasks.language_modeling import LanguageModelingTask, LMData, load_language_model
from interlayer.training.config import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="language-model folder (RUN_DIR/best)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (default 16)")
    parser.add_argument("--new-tokens", type=int, default=200, help="tokens to generate (default 200)")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated (default 1,8)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per setting (default 3)")
    parser.add_argument("--device", default="cpu", help="where the model generates (default cpu; e.g. cuda)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to this JSON file")
    args = parser.parse_args()
    directory = Path(args.checkpoint)
    model, tokenizer = load_language_model(directory, args.device)
    device = next(model.parameters()).device
    # generation is asynchronous on a GPU: wait for it before reading the clock
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    data = LMData(**json.loads((directory / "data.json").read_text()))
    valid = LanguageModelingTask(data, TrainConfig(max_tokens=data.block_size), tokenizer=tokenizer).ids["valid"]
    if args.prompt_tokens + args.new_tokens > model.max_positions:
        parser.error(f"--prompt-tokens + --new-tokens must fit the model's {model.max_positions} positions, or the "
                     "context slides and the cache is dropped")
    rows, records = [], []
    for batch in (int(b) for b in args.batches.split(",")):
        starts = torch.arange(batch) * 1000
        prompts = valid[starts[:, None] + torch.arange(args.prompt_tokens)].to(device)
        seconds: dict[bool, list[float]] = {True: [], False: []}
        tokens: dict[bool, torch.Tensor] = {}
        for _ in range(args.rounds):
            for cache in (True, False):
                options = SamplingOptions(max_new_tokens=args.new_tokens, temperature=0, use_cache=cache)
                sync()
                start = time.perf_counter()
                tokens[cache] = model.generate(prompts, options).tokens
                sync()
                seconds[cache].append(time.perf_counter() - start)
        same = torch.equal(tokens[True], tokens[False])
        for cache in (True, False):
            median = statistics.median(seconds[cache])
            rows.append([str(batch), "yes" if cache else "no", f"{median:.2f}",
                         f"{batch * args.new_tokens / median:,.0f}", "yes" if same else "NO"])
            records.append({"batch": batch, "cache": cache, "seconds": median,
                            "new_tokens_per_s": batch * args.new_tokens / median, "same_tokens": same})
    print(f"{directory}: {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, greedy, "
          f"{torch.get_num_threads()} thread(s)")
    print(format_table(["batch", "cache", "seconds (median)", "new tokens/s", "same tokens"], rows))
    if args.json:
        args.json.write_text(json.dumps({"checkpoint": str(directory), "device": str(device),
                                         "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                                         "threads": torch.get_num_threads(), "settings": records}, indent=2) + "\n")


if __name__ == "__main__":
    main()
