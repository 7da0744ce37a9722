"""Each method's model against the same model without the method: MAdds ratio, time ratio, peak memory.

For every case (a base model and the same model with one method on), the two models are built from the same seed,
trained with Adam in this one process on the same batch, and timed in rounds that alternate between them, so load
on the machine falls on both alike; the median round is reported. The cases are the sizes the efficiency issue
names: the main job's character LM (``make run``: d=64, 4 layers, 4 heads, 16 x 64 tokens), the SST text
classifier (64 x 64 tokens), the Fashion-MNIST ViT and Conv-Transformer (128 images) and ``transformer_iwslt_de_en``
(16 x 32 tokens).

* **MAdds ratio** is interlayer's analytic count (``count_madds``) of the method model over the base.
* **time ratio** is the median seconds per training step of the method model over the base's.
* **peak memory** is the CUDA allocator's high-water mark of one step on a GPU; on a CPU the growth of the process's
  peak resident set over one step is not separable per model, so it is not reported there.
* **target** is the efficiency issue's bar for the ratio (``time <= target``), where it sets one (with
  ``--compile``, its compiled bar: 1.25x for PA).
* With ``--compile``, both models are also timed eager in the same rounds, and **compiled vs eager** is each
  model's eager time over its compiled time (above 1: compiling pays).

    python benchmarks/bench_methods.py                        # eager, every case
    python benchmarks/bench_methods.py --compile --cases lm   # inductor, the LM cases
    python benchmarks/bench_methods.py --device cuda --precision bf16 --compile --json out.json

``--tiny`` shrinks every case to toy sizes with one round (a dry run of the script, not a measurement).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from interlayer import count_madds, create_model
from interlayer.core.generation import kv_cache_bytes_per_token
from interlayer.devices import resolve_device
from interlayer.tables import format_table
from interlayer.training.device import autocast, configure_tf32, resolve_precision

# The main job's language model (interlayer.compare.DEFAULT's model settings).
LM = dict(d_model=64, n_heads=4, d_ffn=256, enc_layers=4, dropout=0.0, attn_dropout=0.0, src_vocab_size=65)


@dataclass(frozen=True)
class Case:
    """One row: ``base`` and ``method`` are ``(preset, overrides)``; ``kind`` says what batch they take."""

    name: str
    kind: str  # "lm", "text", "image" or "seq2seq"
    base: tuple[str, dict[str, Any]]
    method: tuple[str, dict[str, Any]]
    batch: int
    length: int
    target: Optional[float] = None  # the time-ratio bar, absolute (None: no bar)
    target_per_madds: Optional[float] = None  # or relative: time ratio <= this x MAdds ratio
    target_plus_madds: Optional[float] = None  # or time ratio <= MAdds ratio + this
    target_compiled: Optional[float] = None  # the bar with --compile, where the issue sets its own


def cases() -> list[Case]:
    lm = ("gpt_shakespeare_char", LM)
    vit = ("vit_fashion_mnist", {})
    iwslt = ("pa_transformer_iwslt_de_en", dict(src_vocab_size=10000, predictive=None))
    text = ("transformer_text_cls", dict(src_vocab_size=16000, num_classes=5))
    return [
        Case("lm: causal PA", "lm", lm, (lm[0], dict(LM, predictive={})), 16, 64, target=1.35,
             target_compiled=1.25),
        Case("lm: Res-Transformer (PA conv_layers=0)", "lm", lm, (lm[0], dict(LM, predictive={"conv_layers": 0})),
             16, 64, target=1.2),
        Case("lm: attn_impl=eager (no mixer)", "lm", lm, (lm[0], dict(LM, attn_impl="eager")), 16, 64),
        Case("lm: LW-1x", "lm", lm, (lm[0], dict(LM, lightweight={})), 16, 64, target_plus_madds=0.1),
        # the cross-layer family (issue 33): each at most 1.15x its MAdds ratio; shared layers: MAdds ratio 1
        Case("lm: ALBERT all-shared layers", "lm", lm, (lm[0], dict(LM, layer_sharing={})), 16, 64,
             target_per_madds=1.15),
        Case("lm: MobileLLM block-wise sharing (A A B B)", "lm", lm,
             (lm[0], dict(LM, layer_sharing={"repeats": 2})), 16, 64, target_per_madds=1.15),
        Case("lm: ResFormer", "lm", lm, (lm[0], dict(LM, value_residual={})), 16, 64, target_per_madds=1.15),
        Case("lm: SVFormer", "lm", lm, (lm[0], dict(LM, value_residual={"mode": "svformer"})), 16, 64,
             target_per_madds=1.15),
        Case("lm: CLA2", "lm", lm, (lm[0], dict(LM, cla={"sharing_factor": 2})), 16, 64, target_per_madds=1.15),
        Case("lm: DenseFormer 1x1", "lm", lm, (lm[0], dict(LM, denseformer={})), 16, 64, target_per_madds=1.15),
        Case("lm: DenseFormer 2x2", "lm", lm, (lm[0], dict(LM, denseformer={"dilation": 2, "period": 2})), 16, 64,
             target_per_madds=1.15),
        Case("lm: hyper-connections DHCx4", "lm", lm, (lm[0], dict(LM, hyper_connections={})), 16, 64,
             target_per_madds=1.15),
        Case("lm: hyper-connections SHCx4", "lm", lm, (lm[0], dict(LM, hyper_connections={"dynamic": False})),
             16, 64, target_per_madds=1.15),
        Case("text: pa_transformer_text", "text", text, ("pa_transformer_text", text[1]), 64, 64, target=1.15,
             target_compiled=1.25),
        Case("vit: pa_vit_fashion_mnist", "image", vit, ("pa_vit_fashion_mnist", {}), 128, 0, target=1.35,
             target_compiled=1.25),
        Case("vit: lw_vit_fashion_mnist", "image", vit, ("lw_vit_fashion_mnist", {}), 128, 0, target_plus_madds=0.1),
        Case("vit: conv_transformer_fashion_mnist", "image", vit, ("conv_transformer_fashion_mnist", {}), 128, 0,
             target_per_madds=1.15),
        Case("vit: pa_conv_transformer_fashion_mnist", "image", vit, ("pa_conv_transformer_fashion_mnist", {}), 128,
             0, target_per_madds=1.25),
        # the method alone: the same Conv-Transformer without its attention + convolution block, or without PA
        Case("vit: conv_branch alone (Conv-Transformer without it as base)", "image",
             ("conv_transformer_fashion_mnist", {"conv_branch": None}), ("conv_transformer_fashion_mnist", {}), 128,
             0, target_per_madds=1.15),
        Case("vit: PA alone on the Conv-Transformer (Conv-Transformer as base)", "image",
             ("conv_transformer_fashion_mnist", {}), ("pa_conv_transformer_fashion_mnist", {}), 128, 0, target=1.35,
             target_compiled=1.25),
        Case("iwslt: pa_transformer_iwslt_de_en", "seq2seq", iwslt,
             ("pa_transformer_iwslt_de_en", dict(src_vocab_size=10000)), 16, 32, target=1.35,
             target_compiled=1.25),
    ]


def tiny(case: Case) -> Case:
    """The same case at toy sizes (for ``--tiny`` dry runs): two layers, narrow, short."""
    small = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=2)
    shrink = {"lm": small, "text": small, "seq2seq": dict(small, dec_layers=2), "image": {}}[case.kind]

    def scaled(side: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        return side[0], {**side[1], **shrink}

    return dataclasses.replace(case, base=scaled(case.base), method=scaled(case.method), batch=2,
                               length=min(case.length, 8) or 0)


def make_batch(case: Case, model: nn.Module, device: torch.device) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    if case.kind == "image":
        images = torch.randint(0, 256, (case.batch, 1, 28, 28), generator=gen, dtype=torch.uint8)
        return images.to(device), torch.randint(0, 10, (case.batch,), generator=gen).to(device)
    vocab = min(model.config.src_vocab_size, model.config.target_vocab)
    tokens = torch.randint(4, vocab, (case.batch, case.length + 1), generator=gen).to(device)
    if case.kind == "text":
        return tokens[:, :-1], torch.randint(0, 5, (case.batch,), generator=gen).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(case: Case) -> Callable[..., Tensor]:
    """``(model, inputs, targets) -> loss``: the task's cross-entropy plus the model's auxiliary losses."""

    def loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
        out = model(inputs, targets) if case.kind == "seq2seq" else model(inputs)
        logits = out.logits.float()
        value = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        for aux in out.aux_losses.values():
            value = value + aux
        return value

    return loss


def madds(case: Case, model: nn.Module) -> int:
    return count_madds(model, model.config.tokens if case.kind == "image" else case.length)


def step(model: nn.Module, loss: Callable, batch: tuple[Tensor, ...], optimizer: torch.optim.Optimizer,
         device: torch.device, precision: str) -> None:
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, precision):
        value = loss(model, *batch)
    value.backward()
    optimizer.step()


def timed(run: nn.Module, loss: Callable, batch: tuple[Tensor, ...], optimizer: torch.optim.Optimizer, steps: int,
          device: torch.device, precision: str) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step(run, loss, batch, optimizer, device, precision)
    sync()
    return (time.perf_counter() - start) / steps


def measure(case: Case, args: argparse.Namespace, device: torch.device, precision: str) -> dict[str, Any]:
    """Build both models, warm them up (compiling with ``--compile``), time interleaved rounds. With
    ``--compile`` the eager models are timed in the same rounds too (``base_eager``, ``method_eager``), so the
    gain of compiling is a ratio from one process."""
    loss = loss_fn(case)
    entries = {}
    for role, (preset, overrides) in (("base", case.base), ("method", case.method)):
        torch.manual_seed(0)
        model = create_model(preset, **overrides).to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        if args.compile:
            entries[f"{role}_eager"] = (model, model, optimizer)
        run = torch.compile(model, backend=args.compile_backend) if args.compile else model
        entries[role] = (model, run, optimizer)
    batch = make_batch(case, entries["base"][0], device)
    warm_up = {}
    for role, (_, run, optimizer) in entries.items():
        start = time.perf_counter()
        timed(run, loss, batch, optimizer, args.warmup, device, precision)
        warm_up[role] = time.perf_counter() - start
    times: dict[str, list[float]] = {role: [] for role in entries}
    for _ in range(args.rounds):
        for role, (_, run, optimizer) in entries.items():
            times[role].append(timed(run, loss, batch, optimizer, args.steps, device, precision))
    memory: dict[str, Optional[float]] = {role: None for role in entries}
    if device.type == "cuda":
        for role, (_, run, optimizer) in entries.items():
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            timed(run, loss, batch, optimizer, 1, device, precision)
            memory[role] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    median = {role: statistics.median(values) for role, values in times.items()}
    madds_ratio = madds(case, entries["method"][0]) / madds(case, entries["base"][0])
    # KV cache per token (language models): what value_residual=svformer and cla shrink
    kv_bytes = ({role: kv_cache_bytes_per_token(entries[role][0]) for role in ("base", "method")}
                if case.kind == "lm" else None)
    kv_ratio = kv_bytes["method"] / kv_bytes["base"] if kv_bytes else None
    time_ratio = median["method"] / median["base"]
    bound = (case.target_compiled if args.compile and case.target_compiled is not None else
             case.target if case.target is not None else
             case.target_per_madds * madds_ratio if case.target_per_madds is not None else
             madds_ratio + case.target_plus_madds if case.target_plus_madds is not None else None)
    compile_gain = ({role: median[f"{role}_eager"] / median[role] for role in ("base", "method")}
                    if args.compile else None)
    return {"case": case.name, "madds_ratio": madds_ratio, "time_ratio": time_ratio, "kv_cache_ratio": kv_ratio,
            "kv_bytes_per_token": kv_bytes,
            "base_ms": 1e3 * median["base"], "method_ms": 1e3 * median["method"],
            "eager_ms": {role: 1e3 * median[f"{role}_eager"] for role in ("base", "method")} if args.compile else None,
            "compile_speedup": compile_gain,
            "round_spread": {role: [1e3 * min(v), 1e3 * max(v)] for role, v in times.items()},
            "warmup_s": warm_up, "peak_mib": memory, "target": bound,
            "met": None if bound is None else time_ratio <= bound}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--compile-backend", help="torch.compile backend (default inductor; aot_eager with --tiny, "
                        "whose dry run checks the traced path, not inductor's code generation)")
    parser.add_argument("--cases", nargs="*", default=None,
                        help="only the cases whose name starts with one of these (lm, text, vit, iwslt)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation included)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU (default 1)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes, one round: a dry run, not a measurement")
    parser.add_argument("--json", help="also write the rows and the environment to this JSON file")
    args = parser.parse_args()
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    configure_tf32(device, True)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if args.tiny:
        args.rounds, args.steps, args.warmup = 1, 1, 1
    args.compile_backend = args.compile_backend or ("aot_eager" if args.tiny else "inductor")
    selected = [c for c in cases() if args.cases is None or any(c.name.startswith(p) for p in args.cases)]
    if args.tiny:
        selected = [tiny(c) for c in selected]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    load = " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
    compiled = f"{args.compile} ({args.compile_backend})" if args.compile else "False"
    print(f"## Method cost: {device} ({name}), {precision}, compile={compiled}, threads="
          f"{torch.get_num_threads()}, median of {args.rounds} rounds x {args.steps} steps, load before {load}\n",
          flush=True)
    rows, results = [], []
    for case in selected:
        result = measure(case, args, device, precision)
        results.append(result)
        target = "" if result["target"] is None else f"<= {result['target']:.2f} " + (
            "met" if result["met"] else "MISSED")
        memory = result["peak_mib"]
        gain = result["compile_speedup"]
        kv_bytes = result["kv_bytes_per_token"]
        kv = ("" if kv_bytes is None
              else f"{kv_bytes['base']:,} / {kv_bytes['method']:,} ({result['kv_cache_ratio']:.2f}x)")
        rows.append([case.name, f"{result['madds_ratio']:.2f}x", f"{result['time_ratio']:.2f}x", target, kv,
                     f"{result['base_ms']:.1f}", f"{result['method_ms']:.1f}",
                     "n/a" if memory["base"] is None else f"{memory['base']:,.0f} / {memory['method']:,.0f}"]
                    + ([f"{gain['base']:.2f}x / {gain['method']:.2f}x"] if gain else []))
        print(f"  {case.name}: MAdds {result['madds_ratio']:.2f}x, time {result['time_ratio']:.2f}x", flush=True)
    print()
    headers = ["case", "MAdds ratio", "time ratio", "target", "KV cache bytes/token (base / method)", "base ms/step",
               "method ms/step", "peak MiB (base / method)"]
    print(format_table(headers + (["compiled vs eager (base / method)"] if args.compile else []), rows))
    if args.json:
        environment = {"device": str(device), "device_name": name, "precision": precision, "compile": args.compile,
                       "compile_backend": args.compile_backend if args.compile else None,
                       "threads": torch.get_num_threads(), "torch": torch.__version__, "load_before": load,
                       "rounds": args.rounds, "steps": args.steps, "tiny": args.tiny}
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"environment": environment, "rows": results}, handle, indent=2)


if __name__ == "__main__":
    main()
