"""Generation speed with and without the KV cache, the cache's size, and the batch a memory budget holds.

Every setting continues the same prompts by the same number of tokens with greedy decoding:

* ``recompute``: no cache, each step reads the whole prefix again (``use_cache=False``);
* ``growing``: the KV cache grown by concatenation every step (``static_cache=False``, the old layout);
* ``static``: the KV cache allocated once and written in place (the default);
* ``compiled`` (``--compile``): the static cache's fixed-shape one-token step through ``torch.compile``
  (``mode="reduce-overhead"``, i.e. CUDA graphs, on a GPU).

Each setting runs once untimed first (one-time costs: allocator growth, kernels' first launch, compilation), then
``--rounds`` timed rounds taken in turn; new tokens per second are the median. Each setting's tokens must equal the
recomputing path's, which the script checks and reports (in IEEE fp32; in 16 bits, or with random weights' near-tied
logits, paths that round differently may pick different tokens). Beside the speed: the cache's bytes per token of
one sequence (``kv_cache_bytes_per_token``, in the model's dtype).

``--variants`` compares the model with the methods that shrink the cache: ``cla2`` (cross-layer attention, two
layers per key/value set) and ``svformer`` (single-value: every layer reads the first layer's values), built with
the model's shape and random weights (speed and memory do not depend on them). With ``--memory-budget GIB`` each
variant gets the largest batch whose weights, static cache (prompt + new tokens) and prompt activations fit the
budget, computed from the cache's bytes per token and the model's size and, on CUDA, checked by allocation (the
peak of a generation at that batch; the batch shrinks until the peak fits), and its speed at that batch.

The model is a trained one (``--checkpoint RUN_DIR/best``; its validation text gives the prompts) or a preset with
random weights (``--preset``, default ``gpt_shakespeare_char``; random prompts), so a GPU run needs no training.

    python benchmarks/bench_generate.py --batches 1,8                               # random gpt_shakespeare_char
    python benchmarks/bench_generate.py --checkpoint runs/lm/gpt_shakespeare_char-s1/best --new-tokens 200
    python benchmarks/bench_generate.py --device cuda --dtype bfloat16 --compile --variants plain,cla2,svformer \\
        --memory-budget 2 --json generate.json
    python benchmarks/bench_generate.py --tiny        # toy sizes, every part: the dry run a test runs
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch._dynamo

from interlayer import create_model
from interlayer.core.generation import SamplingOptions, kv_cache_bytes_per_token
from interlayer.tables import format_table
from interlayer.tasks.language_modeling import LanguageModelingTask, LMData, load_language_model
from interlayer.training.config import TrainConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
VARIANTS: dict[str, dict[str, Any]] = {"plain": {}, "cla2": {"cla": {"sharing_factor": 2}},
                                       "svformer": {"value_residual": {"mode": "svformer"}}}
SETTINGS: dict[str, dict[str, Any]] = {"recompute": dict(use_cache=False), "growing": dict(static_cache=False),
                                       "static": {}, "compiled": dict(compile=True)}
TINY_MODEL = dict(d_model=32, n_heads=2, d_ffn=64, enc_layers=2, max_positions=64)
GIB = 2 ** 30


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = DTYPES[args.dtype]
        # generation is asynchronous on a GPU: wait for it before reading the clock
        self.sync: Callable[[], None] = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self.valid: Optional[torch.Tensor] = None
        if args.checkpoint:
            model, tokenizer = load_language_model(Path(args.checkpoint))
            data = LMData(**json.loads((Path(args.checkpoint) / "data.json").read_text()))
            task = LanguageModelingTask(data, TrainConfig(max_tokens=data.block_size), tokenizer=tokenizer)
            self.valid = task.ids["valid"]
            self.config = model.config
        else:
            self.config = create_model(args.preset, **(TINY_MODEL if args.tiny else {})).config
        self.settings = [s for s in SETTINGS if s != "compiled" or args.compile]

    def model(self, variant: str) -> torch.nn.Module:
        """The variant on the device in the dtype: the checkpoint's own weights for ``plain``, else random."""
        if variant == "plain" and self.args.checkpoint:
            model, _ = load_language_model(Path(self.args.checkpoint))
        else:
            torch.manual_seed(0)
            model = create_model(self.config, dropout=0.0, attn_dropout=0.0, **VARIANTS[variant])
        return model.to(self.device, self.dtype).eval()

    def prompts(self, batch: int) -> torch.Tensor:
        length = self.args.prompt_tokens
        if self.valid is not None:  # the first characters of the validation text, 1,000 apart (wrapping)
            starts = (torch.arange(batch) * 1000) % (len(self.valid) - length)
            return self.valid[starts[:, None] + torch.arange(length)].to(self.device)
        vocab = self.config.src_vocab_size
        return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(batch)).to(self.device)

    def options(self, setting: str) -> SamplingOptions:
        backend = {"compile_backend": self.args.compile_backend} if setting == "compiled" else {}
        return SamplingOptions(max_new_tokens=self.args.new_tokens, temperature=0, **SETTINGS[setting], **backend)

    def timed(self, model: torch.nn.Module, prompts: torch.Tensor, setting: str) -> tuple[float, torch.Tensor]:
        options = self.options(setting)
        self.sync()
        start = time.perf_counter()
        tokens = model.generate(prompts, options).tokens
        self.sync()
        return time.perf_counter() - start, tokens

    def speeds(self, model: torch.nn.Module, variant: str, batch: int, per_token: int) -> list[dict[str, Any]]:
        """Every setting at one batch size: warmed up once, then ``rounds`` timed rounds in turn."""
        prompts = self.prompts(batch)
        tokens = {setting: self.timed(model, prompts, setting)[1] for setting in self.settings}  # the warm-up
        seconds: dict[str, list[float]] = {setting: [] for setting in self.settings}
        for _ in range(self.args.rounds):
            for setting in self.settings:
                elapsed, tokens[setting] = self.timed(model, prompts, setting)
                seconds[setting].append(elapsed)
        records = []
        for setting in self.settings:
            median = statistics.median(seconds[setting])
            records.append({"variant": variant, "batch": batch, "decoding": setting, "cache": setting != "recompute",
                            "seconds": median, "new_tokens_per_s": batch * self.args.new_tokens / median,
                            "same_tokens": torch.equal(tokens[setting], tokens["recompute"]),
                            "cache_bytes_per_token": per_token if setting != "recompute" else 0})
        recompute = records[0]["seconds"]
        for record in records:
            record["speedup_vs_recompute"] = recompute / record["seconds"]
        return records

    def budget(self, model: torch.nn.Module, variant: str, per_token: int) -> dict[str, Any]:
        """The largest batch that fits ``--memory-budget`` GiB, computed and (CUDA) checked, and its speed."""
        args, cfg = self.args, self.config
        budget = args.memory_budget * GIB
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        positions = min(args.prompt_tokens + args.new_tokens - 1, cfg.max_positions)
        element = torch.finfo(self.dtype).bits // 8
        # the prompt's largest activations: its logits, the feed-forward's hidden layer and a few model-wide tensors
        activations = args.prompt_tokens * (cfg.src_vocab_size + cfg.d_ffn + 4 * cfg.d_model) * element
        per_sequence = per_token * positions + activations
        batch = int((budget - weights) // per_sequence)
        record: dict[str, Any] = {"variant": variant, "budget_bytes": budget, "weights_bytes": weights,
                                  "cache_bytes_per_token": per_token, "cached_positions": positions,
                                  "bytes_per_sequence": per_sequence, "computed_batch": batch}
        if batch < 1:
            record.update(batch=0, note="the weights and one sequence do not fit the budget")
            return record
        if self.device.type == "cuda":
            batch, record["peak_bytes"] = self.checked_batch(model, batch, budget)
        record["batch"] = batch
        setting = "compiled" if args.compile else "static"
        prompts = self.prompts(batch)
        self.timed(model, prompts, setting)  # warm-up
        median = statistics.median(self.timed(model, prompts, setting)[0] for _ in range(args.rounds))
        record.update(decoding=setting, seconds=median, new_tokens_per_s=batch * args.new_tokens / median)
        return record

    def checked_batch(self, model: torch.nn.Module, batch: int, budget: int) -> tuple[int, int]:
        """``batch``, shrunk until a static-cache generation's peak allocation fits ``budget``; with that peak."""
        peak = budget + 1
        for _ in range(6):
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            model.generate(self.prompts(batch), self.options("static"))
            peak = torch.cuda.max_memory_allocated(self.device)
            if peak <= budget or batch == 1:
                break
            batch = max(1, int(batch * budget / peak * 0.98))
        return batch, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a trained language model's folder (RUN_DIR/best)")
    parser.add_argument("--preset", default="gpt_shakespeare_char",
                        help="without --checkpoint: this preset with random weights (default gpt_shakespeare_char)")
    parser.add_argument("--variants", default="plain", help=f"comma-separated, of {', '.join(VARIANTS)} (default "
                                                             "plain)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (default 16)")
    parser.add_argument("--new-tokens", type=int, default=200, help="tokens to generate (default 200)")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated (default 1,8)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per setting (default 3)")
    parser.add_argument("--device", default="cpu", help="where the model generates (default cpu; e.g. cuda)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32",
                        help="the model's parameters and cache (default float32)")
    parser.add_argument("--compile", action="store_true", help="also time the compiled fixed-shape step")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (default inductor)")
    parser.add_argument("--memory-budget", type=float, metavar="GIB",
                        help="also find each variant's largest batch within this many GiB, and its speed there")
    parser.add_argument("--tiny", action="store_true", help="toy model and sizes, every part (the dry run)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.tiny:
        args.variants, args.prompt_tokens, args.new_tokens, args.batches, args.rounds = "plain,cla2", 4, 4, "2", 1
        args.compile, args.compile_backend = True, "eager"
        args.memory_budget = args.memory_budget or 1 / 1024
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    # IEEE fp32 products: with TF32 the cached and recomputed logits differ by more than near-ties allow (random
    # weights give near-uniform logits), and "same tokens" would report a rounding flip as a difference
    torch.backends.cuda.matmul.allow_tf32 = False
    bench = Bench(args)
    if args.prompt_tokens + args.new_tokens > bench.config.max_positions:
        parser.error(f"--prompt-tokens + --new-tokens must fit the model's {bench.config.max_positions} positions, "
                     "or the context slides and the cache is dropped")
    # each variant and batch size compiles its own step: more than dynamo's default of 8 recompilations
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    settings, budgets = [], []
    for variant in variants:
        model = bench.model(variant)
        per_token = kv_cache_bytes_per_token(model)
        for batch in (int(b) for b in args.batches.split(",")):
            settings += bench.speeds(model, variant, batch, per_token)
        if args.memory_budget:
            budgets.append(bench.budget(model, variant, per_token))
        del model  # one variant's weights and caches on the device at a time (the budget's peak counts them)
        gc.collect()
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
        torch._dynamo.reset()  # and its compiled steps
    source = args.checkpoint or f"{args.preset} (random weights)"
    print(f"{source} on {bench.device}, {args.dtype}: {args.prompt_tokens}-token prompts, {args.new_tokens} new "
          f"tokens, greedy, {torch.get_num_threads()} thread(s)")
    print(format_table(["variant", "batch", "decoding", "seconds (median)", "new tokens/s", "x recompute",
                        "cache bytes/token", "same tokens"],
                       [[s["variant"], str(s["batch"]), s["decoding"], f"{s['seconds']:.3f}",
                         f"{s['new_tokens_per_s']:,.0f}", f"{s['speedup_vs_recompute']:.2f}",
                         f"{s['cache_bytes_per_token']:,}" if s["cache"] else "-",
                         "yes" if s["same_tokens"] else "NO"] for s in settings]))
    if budgets:
        print(f"\nthe largest batch within {args.memory_budget:g} GiB (weights + static cache of "
              f"{args.prompt_tokens + args.new_tokens - 1} positions + prompt activations"
              f"{'; checked by allocation' if bench.device.type == 'cuda' else ''}):")
        print(format_table(["variant", "cache bytes/token", "computed batch", "batch", "peak GiB", "new tokens/s"],
                           [[b["variant"], f"{b['cache_bytes_per_token']:,}", str(b["computed_batch"]),
                             str(b["batch"]), f"{b['peak_bytes'] / GIB:.2f}" if "peak_bytes" in b else "-",
                             f"{b['new_tokens_per_s']:,.0f}" if "new_tokens_per_s" in b else "-"] for b in budgets]))
    if args.json:
        args.json.write_text(json.dumps({
            "model": source, "device": str(bench.device), "dtype": args.dtype, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "threads": torch.get_num_threads(), "compile": args.compile,
            "compile_backend": args.compile_backend if args.compile else None, "settings": settings,
            "memory_budget_gib": args.memory_budget, "budget": budgets}, indent=2) + "\n")


if __name__ == "__main__":
    main()
