"""interlayer against ``torch.nn.Transformer`` and x-transformers, on any device, precision and with compile; then
each method's preset against the same model without the method.

Part 1 builds the three peers at a paper size (``transformer_iwslt_de_en``: 6+6 post-LN layers, d=512, 4 heads,
FFN 1024; ``transformer_base``: 8 heads, FFN 2048) with the same shared, tied 10k vocabulary, sinusoidal/absolute
positions and dropout 0.1, and trains them in this one process on the same unpadded batches (B x T source and
target tokens; no peer builds a padding mask, interlayer by ``source_padded=False``), interleaved round by round
so that load on the machine falls on all alike; the median round is reported. Model FLOP utilisation is the
model's training FLOPs (6 x MAdds of interlayer's analytic count per token pair, the same architecture for all
three) per second over the device's peak for the precision: the datasheet peak of a known GPU, else a measured
matrix-product peak (the CPU's fp32 ``torch.mm`` rate, measured here).
Peak memory is the CUDA allocator's high-water mark per peer (not measurable per peer on the CPU).

Part 2 times each method's preset and the preset with that method's section removed, interleaved likewise, and
prints the time ratio beside the MAdds ratio: PA's extra time against its extra MAdds, LW's speed-up against its
MAdds reduction.

    python benchmarks/bench_compare.py --device cpu --precision fp32 [--compile]
    python benchmarks/bench_compare.py --device cuda --precision bf16 --compile --batch 64 --length 64 --json out.json

``--json PATH`` also writes every figure the tables show, unrounded, for the GPU campaign (docs/gpu-campaign.md).

x-transformers is not a dependency of interlayer: ``make bench`` installs it (requirements/bench.txt).
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from interlayer import count_madds, count_parameters, create_model, get_config
from interlayer.core.positions import SinusoidalPositions
from interlayer.devices import resolve_device
from interlayer.tables import format_table
from interlayer.training.device import autocast, configure_tf32, resolve_precision

VOCAB = 10_000
# dense (no sparsity) tensor-core peaks, TFLOP/s, from NVIDIA's datasheets (SXM parts)
DATASHEET = {"H100": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}, "H200": {"bf16": 989.4, "fp16": 989.4,
                                                                          "fp32": 494.7},
             "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}}  # fp32 = TF32 tensor cores


class TorchSeq2Seq(nn.Module):
    """``nn.Transformer`` with the embeddings, sinusoidal positions and tied output layer interlayer's model has."""

    def __init__(self, d: int, heads: int, layers: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.scale = d ** 0.5
        self.embed = nn.Embedding(VOCAB, d, padding_idx=0)
        self.positions = SinusoidalPositions(d, 1024)
        self.transformer = nn.Transformer(d, heads, layers, layers, ffn, dropout=dropout, batch_first=True)
        self.out = nn.Linear(d, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.embed(src) * self.scale + self.positions(src.shape[1])
        y = self.embed(tgt) * self.scale + self.positions(tgt.shape[1])
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        return self.out(self.transformer(x, y, tgt_mask=mask, tgt_is_causal=True))


def peers(preset: str) -> dict[str, tuple[nn.Module, Callable]]:
    """The three models of one size, each with its loss function ``(model, src, tgt_in, tgt_out) -> loss``."""
    from x_transformers import XTransformer

    cfg = get_config(preset, src_vocab_size=VOCAB, dropout=0.1, attn_dropout=0.1, act_dropout=0.1)
    ours = create_model(cfg)
    theirs = TorchSeq2Seq(cfg.d_model, cfg.n_heads, cfg.enc_layers, cfg.d_ffn, 0.1)
    mult = cfg.d_ffn // cfg.d_model
    # post-LN, sinusoidal positions (x-transformers' carry one learned scale), one token table for source, target
    # and output: the architecture of the other two
    side = dict(depth=cfg.enc_layers, heads=cfg.n_heads, attn_dim_head=cfg.d_model // cfg.n_heads, max_seq_len=1024,
                ff_mult=mult, pre_norm=False,
                attn_dropout=0.1, ff_dropout=0.1, layer_dropout=0.0, scaled_sinu_pos_emb=True)
    xt = XTransformer(dim=cfg.d_model, tie_token_emb=True, enc_num_tokens=VOCAB, dec_num_tokens=VOCAB,
                      **{f"enc_{k}": v for k, v in side.items()}, **{f"dec_{k}": v for k, v in side.items()})
    xt.decoder.net.to_logits.weight = xt.decoder.net.token_emb.emb.weight  # XTransformer has no flag for this tie

    def ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))

    # the batches are unpadded and the peers get no mask; interlayer is told so as the translation task tells it
    return {"interlayer": (ours, lambda m, s, ti, to: ce(m(s, ti, source_padded=False).logits, to)),
            "torch.nn.Transformer": (theirs, lambda m, s, ti, to: ce(m(s, ti), to)),
            # x-transformers shifts the target itself: it reads tgt[:, :-1] and predicts tgt[:, 1:]
            "x-transformers": (xt, lambda m, s, ti, to: m(s, torch.cat([ti[:, :1], to], dim=1)))}


def timed_steps(model: nn.Module, loss_fn: Callable, batch: tuple, optimizer: torch.optim.Optimizer,
                steps: int, device: torch.device, precision: str) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = loss_fn(model, *batch)
        loss.backward()
        optimizer.step()
    sync()
    return time.perf_counter() - start


def matmul_peak(device: torch.device, precision: str) -> tuple[float, str]:
    """TFLOP/s the device reaches: its datasheet figure for a known GPU, else a measured large ``torch.mm``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in DATASHEET.items():
            if key in name:
                return peaks[precision], f"datasheet {key} {precision}"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    n = 4096 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - start) / 10)
    return 2 * n ** 3 / best / 1e12, f"measured {n}x{n} mm, {torch.get_num_threads()} threads"


def _call_compiled(compiled_loss: Callable, _model: nn.Module, *batch: torch.Tensor) -> torch.Tensor:
    return compiled_loss(*batch)


def interleave(models: dict[str, tuple[nn.Module, Callable]], batch: tuple, args: argparse.Namespace,
               device: torch.device, precision: str) -> dict[str, float]:
    """Median seconds per step of each model, rounds alternating between them."""
    compiled = {}
    for name, (model, loss_fn) in models.items():
        model.to(device).train()
        if args.compile:
            # The loss is compiled with its model: x-transformers computes its loss inside its forward, so
            # compiling the models alone would leave the other two peers' cross-entropy (a log-softmax over the
            # vocabulary, forward and backward) eager, a few per cent of their step.
            compiled_loss = torch.compile(functools.partial(loss_fn, model), backend=args.compile_backend)
            loss_fn = functools.partial(_call_compiled, compiled_loss)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
        compiled[name] = (model, loss_fn, optimizer)
        timed_steps(model, loss_fn, batch, optimizer, 2, device, precision)  # warm-up (and compilation)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (run, loss_fn, optimizer) in compiled.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times[name].append(timed_steps(run, loss_fn, batch, optimizer, args.steps, device, precision)
                               / args.steps)
    return {name: statistics.median(values) for name, values in times.items()}


def part_one(args: argparse.Namespace, device: torch.device, precision: str) -> dict[str, Any]:
    """Prints the peers' table per size; returns its figures by size and model."""
    peak, source = matmul_peak(device, precision)
    record: dict[str, Any] = {"peak_tflops": peak, "peak_source": source, "sizes": {}}
    print(f"## Part 1: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"{precision}, compile={args.compile}, batch {args.batch} x {args.length} tokens (unpadded), median of "
          f"{args.rounds} rounds x {args.steps} steps; peak {peak:.3g} TFLOP/s ({source})\n")
    for preset in args.sizes:
        torch.manual_seed(0)
        models = peers(preset)
        src = torch.randint(4, VOCAB, (args.batch, args.length), device=device)
        tgt = torch.randint(4, VOCAB, (args.batch, args.length + 1), device=device)
        batch = (src, tgt[:, :-1], tgt[:, 1:])
        seconds = interleave(models, batch, args, device, precision)
        memory = {}
        if device.type == "cuda":  # one more step each, alone, for its allocator high-water mark
            for name, (model, loss_fn) in models.items():
                torch.cuda.reset_peak_memory_stats(device)
                timed_steps(model, loss_fn, batch, torch.optim.SGD(model.parameters(), lr=0.0), 1, device, precision)
                memory[name] = torch.cuda.max_memory_allocated(device) / 2 ** 20
        flops = 6 * count_madds(models["interlayer"][0], args.length) * args.batch  # fwd + bwd, per step
        rows = []
        figures = record["sizes"][preset] = {}
        for name, (model, _) in models.items():
            tokens = args.batch * args.length / seconds[name]
            figures[name] = {"parameters": count_parameters(model), "seconds_per_step": seconds[name],
                             "target_tokens_per_s": tokens,
                             "speedup_vs_torch": seconds["torch.nn.Transformer"] / seconds[name],
                             "speedup_vs_x_transformers": seconds["x-transformers"] / seconds[name],
                             "mfu": flops / seconds[name] / (peak * 1e12), "peak_mib": memory.get(name)}
            rows.append([name, f"{count_parameters(model):,}", f"{tokens:,.0f}",
                         f"{seconds['torch.nn.Transformer'] / seconds[name]:.2f}x",
                         f"{seconds['x-transformers'] / seconds[name]:.2f}x",
                         f"{100 * flops / seconds[name] / (peak * 1e12):.1f}%",
                         f"{memory[name]:,.0f}" if memory else "n/a (CPU)"])
        print(f"### {preset}\n")
        print(format_table(["model", "parameters", "target tokens/s", "vs torch", "vs x-transformers", "MFU",
                            "peak MiB"], rows) + "\n")
    return record


# LW's presets are MCAN models (interlayer.models.mcan), which this translation benchmark cannot feed; the model
# measured here is the former seq2seq ``lw_transformer_1x``: Transformer-Base's shape, a 10k shared vocabulary,
# LW-Transformer1x (k=2, G-MHA + G-FFN + WS).
_LW_SEQ2SEQ = ("transformer_base (10k vocab) + lightweight", dict(get_config("transformer_base").to_dict(),
                                                                  src_vocab_size=10000, lightweight={}))
METHOD_PRESETS = {"predictive": "pa_transformer_iwslt_de_en", "lightweight": _LW_SEQ2SEQ,
                  "crossformer": "crossformer_iwslt_key_query", "multipass": "mpt_soft_small"}


def part_two(args: argparse.Namespace, device: torch.device, precision: str) -> list[dict[str, Any]]:
    """Prints each method's time ratio beside its MAdds ratio; returns the same figures, one dict per preset."""
    print(f"## Part 2: each method's preset against the preset without the method, {precision}, "
          f"compile={args.compile}, batch {args.batch} x {args.length}\n")
    rows, records = [], []
    for section, entry in METHOD_PRESETS.items():
        label, preset = entry if isinstance(entry, tuple) else (entry, entry)
        torch.manual_seed(0)
        cfg = get_config(preset)
        with_method = create_model(preset)
        without = create_model(preset, **{section: None})
        src = torch.randint(4, cfg.src_vocab_size, (args.batch, args.length), device=device)
        tgt = torch.randint(4, cfg.target_vocab, (args.batch, args.length + 1), device=device)
        batch = (src, tgt[:, :-1], tgt[:, 1:])

        def loss_fn(m, s, ti, to):
            out = m(s, ti) if cfg.arch == "encoder_decoder" else m(s)
            target = to if cfg.arch == "encoder_decoder" else torch.zeros_like(s[:, 0])  # class 0
            logits = out.logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            return loss + sum(out.aux_losses.values(), torch.zeros((), device=loss.device))

        seconds = interleave({"method": (with_method, loss_fn), "base": (without, loss_fn)}, batch, args, device,
                             precision)
        madds = count_madds(with_method, args.length) / count_madds(without, args.length)
        time_ratio = seconds["method"] / seconds["base"]
        verdict = (f"extra time / extra MAdds = {(time_ratio - 1) / (madds - 1):.2f}" if madds > 1.001 else
                   f"speed-up / MAdds reduction = {(1 / time_ratio) / (1 / madds):.2f}" if madds < 0.999 else
                   "same MAdds")
        rows.append([label, section, f"{madds:.3f}", f"{time_ratio:.3f}", verdict])
        records.append({"preset": label, "method": section, "madds_ratio": madds, "time_ratio": time_ratio,
                        "seconds_per_step": seconds})
    print(format_table(["preset", "method removed for the base", "MAdds ratio", "time ratio", ""], rows))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend with --compile (default inductor; 'eager' checks tracing alone)")
    parser.add_argument("--sizes", nargs="*", default=["transformer_iwslt_de_en", "transformer_base"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--part", type=int, choices=(1, 2))
    parser.add_argument("--no-tf32", action="store_true", help="IEEE fp32 matrix products on GPUs")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to this JSON file")
    args = parser.parse_args()
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    configure_tf32(device, not args.no_tf32)
    record: dict[str, Any] = {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "torch": torch.__version__, "precision": precision, "compile": args.compile,
        "compile_backend": args.compile_backend if args.compile else None, "batch": args.batch,
        "length": args.length, "rounds": args.rounds, "steps": args.steps}
    if args.part in (None, 1):
        record["peers"] = part_one(args, device, precision)
    if args.part in (None, 2):
        record["methods"] = part_two(args, device, precision)
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
