"""One command for the GPU figures: the plain model against its peers, every method against the plain model, and
decoding with and without the KV cache, each beside the cost model's bound (docs/benchmarks.md).

Parts (``--parts``, default all three):

* **peers** — a GPT-2-small decoder-only LM (12 layers, d=768, 12 heads, vocabulary 50,304, dropout 0, bf16
  autocast, fused AdamW, batch 16 x 1,024) as interlayer builds it and as its peers do: a minimal GPT-2 written
  here (nanoGPT's layout), Hugging Face ``GPT2LMHeadModel`` (SDPA attention) and x-transformers'
  ``TransformerWrapper(Decoder)``, each eager and compiled (the forward pass and the cross-entropy compiled as one
  function). interlayer also as its trainer steps it (``task loss``: the language-modelling task's loss terms,
  ``core.losses``, compiled with the model, what ``train.compile`` does) and as ``model(input_ids, labels=)``.
* **methods** — each method on the same LM shape (``--shape gpt2``: batch 8 x 1,024; ``--shape char``:
  ``gpt_shakespeare_char``'s 6 layers, d=384, batch 64 x 256) against the model without it, in the same rounds:
  time ratio, MAdds ratio, peak memory, the issue's bar, and the cost model's bound ratio. ``--modes`` compiled
  and/or eager; ``--kernel-modes triton,reference`` times each method with its Triton kernels forced on and on its
  PyTorch reference path (``INTERLAYER_KERNELS``), so a kernel's gain is a ratio from one process (``auto``, the
  default, is what a user gets: the kernels a GPU run has cleared, ``kernels.dispatch.VALIDATED``); a method no
  kernel serves is timed in the first mode only.
* **decode** — ``gpt_shakespeare_char`` (random weights: speed does not depend on them; IEEE fp32 products, so the
  two paths' tokens can be compared), 16-token prompts, 200 new greedy tokens, batch 1 and 8, with and without
  the cache.

Every time is the median of interleaved rounds (the configurations of one table alternate, so load falls on all
alike). MFU is the model's training FLOPs per token (nanoGPT's estimate, the same for every peer: 6 x the
parameters without the position table + 12 x layers x width x length) x tokens/s over the datasheet bf16 dense
peak (H100/H200 SXM: 989.4 TFLOP/s); a measured 8192^3 bf16 matrix product is reported beside it. The bound is
:func:`interlayer.accounting.step_cost`'s: ``max(FLOPs / peak, bytes it must move / bandwidth)``.

    python benchmarks/bench_gpu.py --json gpu.json                    # everything, on cuda
    python benchmarks/bench_gpu.py --parts methods --methods PA hyper --kernel-modes auto,reference
    python benchmarks/bench_gpu.py --tiny --device cpu                # the suite's dry run: toy sizes, no timing

``--profile`` adds each compiled configuration's top CUDA kernels (``torch.profiler``) to the JSON and the log.
``--budget SECONDS`` stops starting new measurements once that much time has passed (the JSON is rewritten after
each measurement, so a run killed from outside keeps what it measured).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from interlayer import count_madds, create_model
from interlayer.accounting import PEAKS, Peak, measure_cpu_peak, step_cost
from interlayer.core.generation import SamplingOptions
from interlayer.core.losses import label_smoothed_nll, total_loss
from interlayer.devices import resolve_device
from interlayer.kernels.dispatch import kernel_mode
from interlayer.tables import format_table
from interlayer.training.device import autocast, configure_tf32

SHAPES = {
    "gpt2": dict(vocab=50304, d=768, layers=12, heads=12, positions=1024, peer_batch=16, method_batch=8),
    "char": dict(vocab=65, d=384, layers=6, heads=6, positions=256, peer_batch=64, method_batch=64),
    "tiny": dict(vocab=96, d=32, layers=2, heads=4, positions=16, peer_batch=2, method_batch=2),
}
LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]


# ----------------------------------------------------------------------------------------------------------- peers
class MinimalGPT(nn.Module):
    """GPT-2 as nanoGPT writes it: fused q/k/v projection, SDPA with ``is_causal``, tanh GELU, tied head."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, positions: int) -> None:
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(d), qkv=nn.Linear(d, 3 * d), proj=nn.Linear(d, d), ln2=nn.LayerNorm(d),
            fc=nn.Linear(d, 4 * d), out=nn.Linear(4 * d, d))) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: Tensor) -> Tensor:
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh"))
        return self.head(self.ln_f(x))


def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _task_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """The language-modelling task's loss (tasks/language_modeling.py): its terms through ``core.losses``."""
    return total_loss(model(inputs), lambda logits: label_smoothed_nll(logits, targets, 0.0))[0]


def interlayer_size(size: dict[str, int]) -> dict[str, Any]:
    return dict(src_vocab_size=size["vocab"], d_model=size["d"], enc_layers=size["layers"], n_heads=size["heads"],
                d_ffn=4 * size["d"], max_positions=size["positions"], dropout=0.0, attn_dropout=0.0)


def lm_peers(size: dict[str, int]) -> dict[str, tuple[Callable[[], nn.Module], dict[str, LossFn]]]:
    """name -> (builder, {label: loss}): every peer is the same architecture (pre-LN GPT-2, biases, tanh GELU,
    tied head); interlayer is also stepped as its trainer and ``labels=`` step it."""
    def interlayer_model() -> nn.Module:
        return create_model("gpt2_small", **interlayer_size(size))

    def hf_model() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=size["vocab"], n_positions=size["positions"], n_embd=size["d"],
                         n_layer=size["layers"], n_head=size["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0)
        if "attn_implementation" in inspect.signature(GPT2LMHeadModel.__init__).parameters:
            return GPT2LMHeadModel(cfg, attn_implementation="sdpa")
        return GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")

    def x_model() -> nn.Module:
        from x_transformers import Decoder, TransformerWrapper
        return TransformerWrapper(num_tokens=size["vocab"], max_seq_len=size["positions"], tie_embedding=True,
                                  attn_layers=Decoder(dim=size["d"], depth=size["layers"], heads=size["heads"],
                                                      attn_flash=True))

    def minimal() -> nn.Module:
        return MinimalGPT(size["vocab"], size["d"], size["layers"], size["heads"], size["positions"])

    return {
        "interlayer": (interlayer_model, {
            "": lambda m, x, y: _cross_entropy(m(x).logits, y),
            "task loss": _task_loss,
            "labels=": lambda m, x, y: m(input_ids=x, labels=x).loss}),
        "minimal-gpt2": (minimal, {"": lambda m, x, y: _cross_entropy(m(x), y)}),
        "hf-gpt2": (hf_model, {"": lambda m, x, y: _cross_entropy(m(input_ids=x).logits, y)}),
        "x-transformers": (x_model, {"": lambda m, x, y: _cross_entropy(m(x), y)}),
    }


# ---------------------------------------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    name: str
    overrides: dict[str, Any]
    bound: Optional[float] = None  # the issue's time-ratio bar (absolute)
    bound_plus_madds: Optional[float] = None  # or: MAdds ratio + this
    bound_per_madds: Optional[float] = None  # or: MAdds ratio x this
    kernels: bool = False  # whether a Triton kernel of interlayer.kernels can run it (else one kernel mode is timed)
    memory_bar: Optional[float] = None  # the issue's peak-memory ratio bar
    # the bench_kernels.py case of one of its layers (or sublayers) and how many of those the GPT-2 shape has: the
    # additive estimate's extra bytes and instructions (benchmarks/kernel_costs.json, the offline audit)
    audit: Optional[tuple[str, int]] = None

    def bar(self, madds_ratio: float) -> float:
        if self.bound is not None:
            return self.bound
        if self.bound_plus_madds is not None:
            return madds_ratio + self.bound_plus_madds
        return madds_ratio * (self.bound_per_madds or 1.0)


METHODS = [
    Method("causal PA", {"predictive": {}}, bound=1.6, kernels=True, memory_bar=1.5, audit=("pa-maps", 11)),
    Method("Res-Transformer", {"predictive": {"conv_layers": 0}}, bound=1.35, kernels=True, audit=("res-maps", 11)),
    Method("hyper-connections dynamic x4", {"hyper_connections": {}}, bound=1.15, kernels=True,
           audit=("hc-dynamic", 24)),
    Method("hyper-connections static x4", {"hyper_connections": {"dynamic": False}}, bound=1.10, kernels=True,
           audit=("hc-static", 24)),
    Method("DenseFormer 1x1", {"denseformer": {}}, bound=1.05),
    Method("mHC x4", {"mhc": {}}, bound=1.10, kernels=True),  # Sec. 4.3: 6.7% fused; its mixes on the HC kernels
    Method("MUDDFormer", {"muddformer": {}}, bound=1 / 0.90),  # MUDDFormer Table 4: 0.90x-0.96x throughput
    Method("Crossformer SG kq", {"crossformer": {"soft": ["kq"]}}, bound=1.03),
    Method("LW-1x", {"lightweight": {}}, bound_plus_madds=0.05),
    Method("ResFormer", {"value_residual": {}}, bound_per_madds=1.05),
    Method("SVFormer", {"value_residual": {"mode": "svformer"}}, bound_per_madds=1.05),
    Method("CLA2", {"cla": {"sharing_factor": 2}}, bound_per_madds=1.05),
    Method("Crossformer HG kq", {"crossformer": {"hard": ["kq"]}}, bound_per_madds=1.05),
    Method("ALBERT sharing", {"layer_sharing": {}}, bound_per_madds=1.05),
]


COSTS = Path(__file__).with_name("kernel_costs.json")  # bench_kernels.py --resources at GPT-2 small, offline


def additive_estimate(method: Method, base_ms: float, extra_bytes: float, peak: Peak) -> Optional[dict[str, Any]]:
    """The time the method's step should take if it costs the plain step plus its own work, done alone: the
    measured base step + the extra bytes over the bandwidth + the extra warp-instructions over the issue rate
    (what its kernels execute, from the offline machine-code audit; without one, the cost model's byte difference
    alone). Additive, so an estimate, not a bound: it assumes nothing of the extra overlaps the plain step."""
    instructions = 0.0
    if method.audit is not None and COSTS.is_file():
        case, count = method.audit
        audit = json.loads(COSTS.read_text())["audit"].get(case)
        if audit is not None:
            extra_bytes = audit["totals"]["bytes"] * count
            instructions = audit["totals"]["instructions"] * count
    seconds = extra_bytes / peak.bandwidth + (instructions / peak.issue if peak.issue else 0.0)
    return {"ms": base_ms + 1e3 * seconds, "extra_bytes": extra_bytes, "extra_warp_instructions": instructions,
            "source": "audit" if instructions else "cost model"}


# ------------------------------------------------------------------------------------------------------- measuring
@dataclass
class Runner:
    """One model, its optimizer, the function one training step calls (eager, compiled) and its kernel mode."""

    name: str
    model: nn.Module
    loss: LossFn
    optimizer: torch.optim.Optimizer
    compiled: bool
    backend: str
    kernels: str = "auto"
    step_loss: Callable[[Tensor, Tensor], Tensor] = field(init=False)

    def __post_init__(self) -> None:
        fn = lambda x, y: self.loss(self.model, x, y)  # noqa: E731
        self.step_loss = torch.compile(fn, backend=self.backend) if self.compiled else fn


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = resolve_device(args.device)
        self.cuda = self.device.type == "cuda"
        self.precision = "bf16" if self.cuda else "fp32"
        self.started = time.perf_counter()
        self.result: dict[str, Any] = {"environment": self.environment(), "problems": []}

    # -- the environment and the ceiling
    def environment(self) -> dict[str, Any]:
        name = torch.cuda.get_device_name(self.device) if self.cuda else (platform.processor() or "CPU")
        env: dict[str, Any] = {
            "device": str(self.device), "device_name": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "tiny": self.args.tiny, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "kernels_env": os.environ.get("INTERLAYER_KERNELS", "auto")}
        try:
            import triton
            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
        self.peak: Peak = next((p for key, p in PEAKS.items() if key in name), None) or measure_cpu_peak()
        env["peak"] = {"name": self.peak.name, "flops": self.peak.flops, "bandwidth": self.peak.bandwidth}
        if self.cuda and not self.args.tiny:
            a = torch.randn(8192, 8192, device=self.device, dtype=torch.bfloat16)
            env["matmul_8192_bf16_tflops"] = 2 * 8192 ** 3 / self.time_fn(lambda: a @ a, 10) / 1e12
        return env

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time_fn(self, fn: Callable[[], Any], repeats: int) -> float:
        fn()
        self.sync()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        self.sync()
        return (time.perf_counter() - start) / repeats

    def over_budget(self, what: str) -> bool:
        if time.perf_counter() - self.started > self.args.budget:
            self.result["problems"].append(f"not measured (budget of {self.args.budget:.0f} s spent): {what}")
            return True
        return False

    def save(self) -> None:
        if self.args.json:
            with open(self.args.json, "w", encoding="utf-8") as handle:
                json.dump(self.result, handle, indent=2, default=str)

    def empty(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    # -- one training step
    def train_step(self, runner: Runner, batch: tuple[Tensor, Tensor]) -> None:
        runner.optimizer.zero_grad(set_to_none=True)
        with kernel_mode(runner.kernels), autocast(self.device, self.precision):  # type: ignore[arg-type]
            loss = runner.step_loss(*batch)
        loss.backward()
        runner.optimizer.step()

    def make_runner(self, name: str, build: Callable[[], nn.Module], loss: LossFn, compiled: bool,
                    kernels: str = "auto") -> Runner:
        torch.manual_seed(0)
        model = build().to(self.device).train()
        fused = {"fused": True} if self.cuda else {}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
        # --tiny checks the traced path with aot_eager: a CPU inductor build takes minutes
        return Runner(name, model, loss, optimizer, compiled, "aot_eager" if self.args.tiny else "inductor", kernels)

    def interleaved(self, runners: list[Runner], batch: tuple[Tensor, Tensor]) -> dict[str, dict[str, Any]]:
        """Warm each up (compiling), then time rounds that alternate between them; median round, peak memory."""
        warm: dict[str, float] = {}
        for r in runners:
            start = time.perf_counter()
            for _ in range(self.args.warmup):
                self.train_step(r, batch)
            self.sync()
            warm[r.name] = time.perf_counter() - start
        times: dict[str, list[float]] = {r.name: [] for r in runners}
        for _ in range(self.args.rounds):
            for r in runners:
                times[r.name].append(self.time_fn(lambda: self.train_step(r, batch), self.args.steps))
        out = {}
        for r in runners:
            peak = None
            if self.cuda:
                self.sync()
                torch.cuda.reset_peak_memory_stats(self.device)
                self.train_step(r, batch)
                self.sync()
                peak = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
            cost = step_cost(r.model, batch[0].shape[0], batch[0].shape[1], precision=self.precision) \
                if hasattr(r.model, "madds") else None
            bound = cost.bound(self.peak, self.precision) if cost is not None else None
            serial = cost.serial_bound(self.peak, self.precision) if cost is not None else None
            ms = 1e3 * statistics.median(times[r.name])
            out[r.name] = {"ms": ms, "min_ms": 1e3 * min(times[r.name]), "max_ms": 1e3 * max(times[r.name]),
                           "warmup_s": warm[r.name], "peak_gib": peak,
                           "bound_ms": None if bound is None else 1e3 * bound,
                           "serial_bound_ms": None if serial is None else 1e3 * serial,
                           "bound_by": None if cost is None else cost.bound_by(self.peak, self.precision),
                           "bytes": None if cost is None else cost.bytes}
            out[r.name]["ops"] = self.interlayer_ops(r, batch)
            if self.args.profile and r.compiled:
                out[r.name]["profile"] = self.profile(r, batch)
        return out

    def interlayer_ops(self, runner: Runner, batch: tuple[Tensor, Tensor]) -> dict[str, int]:
        """The ``interlayer::`` operators one step calls (the kernels' ops; none: every map ran on the reference
        path), so a run in ``auto`` mode cannot pass for a kernel measurement."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self.train_step(runner, batch)
            self.sync()
        return {e.key: e.count for e in prof.key_averages() if e.key.startswith("interlayer::")}

    def profile(self, runner: Runner, batch: tuple[Tensor, Tensor], top: int = 25) -> list[dict[str, Any]]:
        """The step's CUDA kernels by total time (two steps after warm-up)."""
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(2):
                self.train_step(runner, batch)
            self.sync()
        key = "device_time_total" if self.cuda else "cpu_time_total"
        events = [e for e in prof.key_averages() if not self.cuda or e.device_type.name == "CUDA"]
        rows = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)
        kernels = [{"name": e.key[:120], "calls": e.count // 2, "ms_per_step": getattr(e, key, 0) / 2e3}
                   for e in rows if getattr(e, key, 0) > 0][:top]
        total = sum(getattr(e, key, 0) for e in events) / 2e3
        print(f"  profile {runner.name}: {total:.1f} ms of kernels per step", flush=True)
        for k in kernels[:10]:
            print(f"    {k['ms_per_step']:7.2f} ms  x{k['calls']:<4d} {k['name']}", flush=True)
        return [{"kernel_ms_per_step_total": total}] + kernels

    def lm_batch(self, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=gen).to(self.device)
        return tokens[:, :-1], tokens[:, 1:]

    def size(self, shape: str) -> dict[str, int]:
        return SHAPES["tiny" if self.args.tiny else shape]

    # -- the parts
    def peers(self) -> None:
        size = self.size("gpt2")
        batch_size, length = size["peer_batch"], size["positions"]
        batch = self.lm_batch(batch_size, length, size["vocab"])
        records: dict[str, dict[str, Any]] = {}
        for name, (build, losses) in lm_peers(size).items():
            if self.args.peers and name not in self.args.peers:
                continue
            if self.over_budget(f"peer {name}"):
                break
            try:
                runners = [self.make_runner(f"{name} eager", build, losses[""], False)]
                runners += [self.make_runner(f"{name} {label} compiled".replace("  ", " "), build, loss, True)
                            for label, loss in losses.items()]
            except ImportError as error:
                self.result["problems"].append(f"peer {name} not measured: {error}")
                continue
            measured = self.interleaved(runners, batch)
            params = sum(p.numel() for n, p in runners[0].model.named_parameters()
                         if not any(k in n for k in ("wpe", "positions", "pos_emb")))
            flops_per_token = 6 * params + 12 * size["layers"] * size["d"] * length
            for key, m in measured.items():
                m["tokens_per_s"] = batch_size * length / (m["ms"] / 1e3)
                m["mfu"] = flops_per_token * m["tokens_per_s"] / self.peak.flops_for(self.precision)
                records[key] = m
            del runners
            self.empty()
            self.result["peers"] = records
            self.save()
        fastest = max((v["tokens_per_s"] for k, v in records.items()
                       if k.endswith("compiled") and not k.startswith("interlayer")), default=None)
        rows = [[name, f"{m['ms']:.1f}", f"{m['tokens_per_s']:,.0f}", f"{100 * m['mfu']:.1f}%",
                 "n/a" if m["peak_gib"] is None else f"{m['peak_gib']:.1f}",
                 "" if not fastest else f"{m['tokens_per_s'] / fastest:.2f}x",
                 "" if m["bound_ms"] is None else f"{m['bound_ms']:.1f} ({m['ms'] / m['bound_ms']:.2f}x)"]
                for name, m in records.items()]
        print(f"\n## GPT-2 small, batch {batch_size} x {length}, {self.precision}\n")
        print(format_table(["model", "ms/step", "tokens/s", "MFU", "peak GiB", "vs fastest compiled peer",
                            "bound ms (time / bound)"], rows))

    def methods(self) -> None:
        size = self.size(self.args.shape)
        batch_size, length = size["method_batch"], size["positions"]
        batch = self.lm_batch(batch_size, length, size["vocab"])
        base_overrides = interlayer_size(size)
        selected = [m for m in METHODS if not self.args.methods or any(s in m.name for s in self.args.methods)]
        kernel_modes = self.args.kernel_modes.split(",")
        records: dict[str, dict[str, Any]] = {}
        for tag in self.args.modes.split(","):
            compiled = tag == "compiled"
            base = self.make_runner(f"base {tag}", lambda: create_model("gpt2_small", **base_overrides), _task_loss,
                                    compiled)
            base_madds = count_madds(base.model, length)
            for method in selected:
                if self.over_budget(f"{method.name} {tag}"):
                    break
                runners = [base] + [self.make_runner(
                    f"{method.name} {tag}" + ("" if k == "auto" else f" ({k})"),
                    lambda m=method: create_model("gpt2_small", **base_overrides, **m.overrides), _task_loss,
                    compiled, k) for k in (kernel_modes if method.kernels else kernel_modes[:1])]
                measured = self.interleaved(runners, batch)
                b = measured[base.name]
                madds_ratio = count_madds(runners[1].model, length) / base_madds
                for runner in runners[1:]:
                    m = measured[runner.name]
                    bar = method.bar(madds_ratio)
                    extra = sum(m["bytes"].values()) - sum(b["bytes"].values()) if m["bytes"] and b["bytes"] else 0.0
                    estimate = additive_estimate(method, b["ms"], extra, self.peak)
                    memory = (m["peak_gib"] / b["peak_gib"]) if m["peak_gib"] and b["peak_gib"] else None
                    record = {"shape": self.args.shape, "mode": tag, "kernels": runner.kernels, "base_ms": b["ms"],
                              "method_ms": m["ms"], "time_ratio": m["ms"] / b["ms"], "madds_ratio": madds_ratio,
                              "base_peak_gib": b["peak_gib"], "method_peak_gib": m["peak_gib"],
                              "memory_ratio": memory, "memory_bar": method.memory_bar,
                              "memory_met": None if memory is None or method.memory_bar is None
                              else memory <= method.memory_bar,
                              "estimate": estimate, "over_estimate": estimate is not None
                              and m["ms"] > 1.25 * estimate["ms"], "ops": m.get("ops"),
                              "bound_ratio": m["bound_ms"] / b["bound_ms"], "bound_ms": m["bound_ms"],
                              "serial_bound_ratio": m["serial_bound_ms"] / b["serial_bound_ms"],
                              "bytes": m["bytes"], "bar": bar, "met": m["ms"] / b["ms"] <= bar,
                              "warmup_s": m["warmup_s"], "profile": m.get("profile")}
                    records[runner.name] = record
                    flag = " OVER ITS ESTIMATE" if record["over_estimate"] else ""
                    print(f"  {runner.name}: {record['time_ratio']:.2f}x (bar {bar:.2f}; additive estimate "
                          f"{estimate['ms'] / b['ms']:.2f}x{flag}), MAdds {madds_ratio:.2f}x, {m['ms']:.1f} vs "
                          f"{b['ms']:.1f} ms, memory {memory or float('nan'):.2f}x, ops {record['ops']}", flush=True)
                del runners
                self.empty()
                self.result.setdefault("methods", {}).update(records)
                self.save()
            del base
            self.empty()
        rows = [[k, f"{v['time_ratio']:.2f}x", f"{v['bar']:.2f}", "met" if v["met"] else "MISSED",
                 f"{v['estimate']['ms'] / v['base_ms']:.2f}x" + (" (over)" if v["over_estimate"] else ""),
                 f"{v['madds_ratio']:.2f}x", f"{v['method_ms']:.1f} / {v['base_ms']:.1f}",
                 "n/a" if v["memory_ratio"] is None else f"{v['memory_ratio']:.2f}x"
                 + ("" if v["memory_bar"] is None else f" (bar {v['memory_bar']:.2f})"),
                 ", ".join(f"{op} x{n}" for op, n in (v["ops"] or {}).items()) or "none"]
                for k, v in records.items()]
        print(f"\n## Methods, {self.args.shape} shape, batch {batch_size} x {length}, {self.precision}\n")
        print(format_table(["method", "time ratio", "bar", "", "additive estimate", "MAdds ratio",
                            "ms (method / base)", "peak memory", "interlayer ops a step (the path that ran)"], rows))

    def decode(self) -> None:
        """Greedy decoding three ways, each warmed up first: recomputing the prefix, the static KV cache, and the
        cache with the compiled fixed-shape step (CUDA graphs on a GPU; the eager backend with ``--tiny``)."""
        overrides = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=2) if self.args.tiny else {}
        torch.manual_seed(0)
        model = create_model("gpt_shakespeare_char", **overrides).to(self.device).eval()
        new = 8 if self.args.tiny else 200
        settings = {"recompute": dict(use_cache=False), "cache": dict(use_cache=True),
                    "cache compiled": dict(use_cache=True, compile=True,
                                           compile_backend="eager" if self.args.tiny else "inductor")}
        rows, records = [], []
        # IEEE fp32 products: with TF32 the cached and recomputed logits differ by more than near-ties allow
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for batch in (1, 8):
                if self.over_budget(f"decode batch {batch}"):
                    break
                prompts = torch.randint(0, 65, (batch, 16), generator=torch.Generator().manual_seed(batch))
                prompts = prompts.to(self.device)
                options = {name: SamplingOptions(max_new_tokens=new, temperature=0, **kw)
                           for name, kw in settings.items()}
                seconds: dict[str, list[float]] = {name: [] for name in settings}
                tokens: dict[str, Tensor] = {}
                with torch.no_grad():
                    for name in settings:  # warm-up: the first call carries one-time costs (compilation)
                        model.generate(prompts, options[name])
                    for _ in range(1 if self.args.tiny else 3):
                        for name in settings:
                            self.sync()
                            start = time.perf_counter()
                            tokens[name] = model.generate(prompts, options[name]).tokens
                            self.sync()
                            seconds[name].append(time.perf_counter() - start)
                for name in settings:
                    rate = batch * new / statistics.median(seconds[name])
                    same = torch.equal(tokens[name], tokens["recompute"])
                    records.append({"batch": batch, "setting": name, "cache": name != "recompute",
                                    "new_tokens_per_s": rate, "same_tokens": same,
                                    "vs_recompute": statistics.median(seconds["recompute"]) /
                                    statistics.median(seconds[name])})
                    rows.append([str(batch), name, f"{rate:,.0f}", f"{records[-1]['vs_recompute']:.2f}x",
                                 "yes" if same else "NO"])
                self.result["decode"] = records
                self.save()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        print("\n## Decoding gpt_shakespeare_char, 16-token prompts, 200 new greedy tokens, fp32\n")
        print(format_table(["batch", "setting", "new tokens/s", "vs recompute", "same tokens as recompute"], rows))


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default="peers,methods,decode", help="comma-separated: peers, methods, decode")
    parser.add_argument("--methods", nargs="*", help="only the methods whose name contains one of these")
    parser.add_argument("--peers", nargs="*",
                        help="only these peers (interlayer, minimal-gpt2, hf-gpt2, x-transformers)")
    parser.add_argument("--shape", choices=["gpt2", "char"], default="gpt2", help="the methods' model shape")
    parser.add_argument("--modes", default="compiled", help="methods: compiled, eager, or compiled,eager")
    parser.add_argument("--kernel-modes", default="auto",
                        help="methods: auto (the cleared kernels), triton (every kernel), reference, or a list")
    parser.add_argument("--profile", action="store_true", help="record the top CUDA kernels of each compiled step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation included)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds after which nothing new is started")
    parser.add_argument("--tiny", action="store_true", help="toy sizes, one round: a dry run, not a measurement")
    parser.add_argument("--json", help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    if args.tiny:
        args.rounds, args.steps, args.warmup = 1, 1, 1
    # Every runner compiles the same step function for another model; dynamo keys its cache by the function's code,
    # so past its default recompile limit (8) the later models would silently run eager.
    torch._dynamo.config.cache_size_limit = 512
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 512
    bench = Bench(args)
    configure_tf32(bench.device, True)
    env = bench.result["environment"]
    print(f"# bench_gpu: {env['device_name']} ({env['device']}), torch {env['torch']}, CUDA {env['cuda']}, "
          f"triton {env['triton']}, load {env['load_before']}, matmul "
          f"{env.get('matmul_8192_bf16_tflops', float('nan')):.0f} TFLOP/s", flush=True)
    for part in args.parts.split(","):
        getattr(bench, part.strip())()
        bench.save()
    bench.result["seconds"] = time.perf_counter() - bench.started
    bench.save()
    if bench.result["problems"]:
        print("\nproblems:\n" + "\n".join(f"- {p}" for p in bench.result["problems"]))
    return bench.result


if __name__ == "__main__":
    main()
