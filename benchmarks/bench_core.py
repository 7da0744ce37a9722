"""Training-throughput benchmark of the core against ``torch.nn.Transformer``, then every preset.

Part 1 trains, in this one process, our plain encoder-decoder (d=256, 3+3 layers, 4 heads, FFN 1024, 8k vocabulary)
and ``torch.nn.Transformer`` of the same size with the same embeddings and output layer, on batches of 64 x 24
tokens; rounds alternate between the two so machine noise hits both alike, and the median round is reported.
Part 2 builds every preset and reports parameters, MAdds per sequence, training tokens/s and peak memory; each
preset runs in a fresh subprocess so its peak resident memory (ru_maxrss, minus the process's size before the
model was built) is its own.

    python benchmarks/bench_core.py                  # both parts
    python benchmarks/bench_core.py --part 1         # only the comparison with torch
    python benchmarks/bench_core.py --presets transformer_small crossformer_all_iwslt
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from interlayer import count_madds, count_parameters, create_model, list_models
from interlayer.core.positions import SinusoidalPositions
from interlayer.tables import format_table, human

BATCH, LENGTH, VOCAB = 64, 24, 8000


class TorchSeq2Seq(nn.Module):
    """``nn.Transformer`` with the embeddings, sinusoidal positions and tied output layer our model has."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 256, padding_idx=0)
        self.positions = SinusoidalPositions(256, 1024)
        self.transformer = nn.Transformer(256, 4, 3, 3, 1024, dropout=0.1, batch_first=True)
        self.out = nn.Linear(256, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.embed(src) * 16 + self.positions(src.shape[1])
        y = self.embed(tgt) * 16 + self.positions(tgt.shape[1])
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        h = self.transformer(x, y, tgt_mask=mask, tgt_is_causal=True, src_key_padding_mask=src.eq(0),
                             memory_key_padding_mask=src.eq(0))
        return self.out(h)


def make_batch(cfg, batch: int, length: int) -> dict:
    vocab = cfg.src_vocab_size
    tokens = torch.randint(4, vocab, (batch, length))
    tokens[: batch // 4, length - 4 :] = cfg.pad_id  # some padding, as in real batches
    if cfg.arch == "encoder_decoder":
        return {"args": (tokens, torch.randint(4, cfg.target_vocab, (batch, length))), "kwargs": {}}
    if cfg.positions == "relative_2d":
        cells = cfg.grid_height * cfg.grid_width
        return {"args": (), "kwargs": {"inputs_embeds": torch.randn(batch, cells, cfg.d_model)}}
    kwargs = {"segments": torch.zeros_like(tokens)} if cfg.n_segments else {}
    return {"args": (tokens,), "kwargs": kwargs}


def loss_of(model: nn.Module, batch: dict) -> torch.Tensor:
    out = model(*batch["args"], **batch["kwargs"])
    logits = out if isinstance(out, torch.Tensor) else out.logits
    target = torch.randint(0, logits.shape[-1], logits.shape[:-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    if not isinstance(out, torch.Tensor):
        loss = loss + sum(out.aux_losses.values(), torch.zeros(()))
    return loss


def train_steps(model: nn.Module, batch: dict, steps: int, optimizer: torch.optim.Optimizer) -> float:
    """Seconds for ``steps`` optimiser steps."""
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, batch).backward()
        optimizer.step()
    return time.perf_counter() - start


def part_one(rounds: int, steps: int) -> None:
    torch.manual_seed(0)
    # nn.Transformer applies its dropout to attention weights and FFN activations too: match it exactly.
    ours = create_model("transformer_small", attn_dropout=0.1, act_dropout=0.1).train()
    theirs = TorchSeq2Seq().train()
    src = torch.randint(4, VOCAB, (BATCH, LENGTH))
    tgt = torch.randint(4, VOCAB, (BATCH, LENGTH))
    batch = {"args": (src, tgt), "kwargs": {}}
    optims = {name: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98))
              for name, m in (("interlayer", ours), ("torch.nn.Transformer", theirs))}
    models = {"interlayer": ours, "torch.nn.Transformer": theirs}
    for name, model in models.items():
        train_steps(model, batch, 3, optims[name])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(train_steps(model, batch, steps, optims[name]))
    tokens = BATCH * LENGTH * steps  # target tokens per round (fairseq's wps convention)
    speed = {name: tokens / statistics.median(seconds) for name, seconds in times.items()}
    rows = [[name, f"{count_parameters(model):,}", f"{speed[name]:,.0f}",
             f"{speed[name] / speed['torch.nn.Transformer']:.2f}x"] for name, model in models.items()]
    print(f"## Part 1: training throughput, batch {BATCH} x {LENGTH} tokens, {torch.get_num_threads()} threads, "
          f"median of {rounds} rounds x {steps} steps\n")
    print(format_table(["model", "parameters", "target tokens/s", "vs torch"], rows))


def worker(name: str, steps: int) -> None:
    """Run in a subprocess: train one preset and print one JSON line."""
    torch.manual_seed(0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = create_model(name).train()
    cfg = model.config
    batch = make_batch(cfg, BATCH, LENGTH)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    train_steps(model, batch, 2, optimizer)
    seconds = train_steps(model, batch, steps, optimizer)
    seq = batch["kwargs"]["inputs_embeds"].shape[1] if "inputs_embeds" in batch["kwargs"] else LENGTH
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"name": name, "params": count_parameters(model), "madds": count_madds(model, seq),
                      "tokens_per_s": BATCH * seq * steps / seconds, "peak_mib": (peak - before) / 1024}))


def part_two(names: list[str], steps: int) -> None:
    """One row per preset, printed as soon as it is measured (a long run shows its progress)."""
    print(f"\n## Part 2: every preset, training batch {BATCH} x {LENGTH} tokens (image presets: their grid), "
          f"{steps} timed steps\n")
    headers = ["preset", "parameters", f"MAdds/seq @{LENGTH}", "tokens/s", "peak MiB (RSS growth)"]
    print(format_table(headers, []), flush=True)
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--steps", str(steps)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            row = [name, "error", "", "", proc.stderr.strip().splitlines()[-1][:60]]
        else:
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            row = [name, f"{r['params']:,}", human(r["madds"]), f"{r['tokens_per_s']:,.0f}",
                   f"{r['peak_mib']:,.0f}"]
        print("| " + " | ".join(map(str, row)) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", type=int, choices=(1, 2))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--presets", nargs="*")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    if args.part in (None, 1):
        part_one(args.rounds, args.steps)
    if args.part in (None, 2):
        part_two(args.presets or list_models(family="transformer"), args.steps)


if __name__ == "__main__":
    main()
