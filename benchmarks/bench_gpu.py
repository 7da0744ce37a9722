"""One command for the GPU figures: the plain model against its peers, every method against the plain model, and
decoding with and without the KV cache, at GPT-2 small on one H100/H200 (docs/benchmarks.md).

Parts (``--parts``, default all three):

* **peers** — a GPT-2-small decoder-only LM (12 layers, d=768, 12 heads, vocabulary 50,304, dropout 0, bf16
  autocast, fused AdamW, batch 16 x 1,024) as interlayer builds it and as its peers do: a minimal GPT-2 written
  here (nanoGPT's layout), Hugging Face ``GPT2LMHeadModel`` (SDPA attention) and x-transformers'
  ``TransformerWrapper(Decoder)``. Each is timed eager and compiled (the forward pass and the loss compiled as one
  function, as a trainer does it); interlayer also as its trainer steps it (``interlayer-train``: the whole step
  through :func:`interlayer.training.engine.compiled_step` when it exists). Interleaved rounds, median round.
* **methods** — each method on the same GPT-2-small-shaped LM (batch 8 x 1,024) against the model without it:
  time ratio (compiled; eager with ``--modes eager`` or ``--modes compiled,eager``), MAdds ratio, peak memory, and the issue's bar.
* **decode** — ``gpt_shakespeare_char`` (random weights: speed does not depend on them), 16-token prompts, 200 new
  greedy tokens, batch 1 and 8, with and without the cache.

MFU is the model's training FLOPs per token (nanoGPT's estimate, the same for every peer: 6 x the parameters without
the position table + 12 x layers x width x length for attention) x tokens/s over the datasheet bf16 dense peak
(H100/H200 SXM: 989.4 TFLOP/s); a measured 8192^3 bf16 matrix product is reported beside it.

    python benchmarks/bench_gpu.py --json gpu.json                    # everything, on cuda
    python benchmarks/bench_gpu.py --parts peers --profile --json p.json
    python benchmarks/bench_gpu.py --tiny --device cpu                # the suite's dry run: toy sizes, no timing

``--profile`` adds each compiled configuration's top CUDA kernels (``torch.profiler``) to the JSON and the log.
``--budget SECONDS`` stops starting new measurements once that much time has passed (the JSON is rewritten after
each measurement, so a run killed from outside keeps what it measured).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from interlayer import count_madds, create_model
from interlayer.core.generation import SamplingOptions
from interlayer.devices import resolve_device
from interlayer.tables import format_table
from interlayer.training.device import autocast, configure_tf32

DATASHEET_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}  # dense tensor-core peaks, FLOP/s
GPT2 = dict(vocab=50304, d=768, layers=12, heads=12, positions=1024)
TINY = dict(vocab=96, d=32, layers=2, heads=4, positions=16)
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


def lm_peers(size: dict[str, int]) -> dict[str, tuple[Callable[[], nn.Module], LossFn]]:
    """name -> (builder, loss): every peer is the same architecture (pre-LN GPT-2, biases, tanh GELU, tied head)."""
    def interlayer_model() -> nn.Module:
        return create_model("gpt2_small", **interlayer_size(size))

    def hf_model() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=size["vocab"], n_positions=size["positions"], n_embd=size["d"],
                         n_layer=size["layers"], n_head=size["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg, attn_implementation="sdpa") if _hf_takes_attn(GPT2LMHeadModel) else \
            GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")

    def x_model() -> nn.Module:
        from x_transformers import Decoder, TransformerWrapper
        return TransformerWrapper(num_tokens=size["vocab"], max_seq_len=size["positions"], tie_embedding=True,
                                  attn_layers=Decoder(dim=size["d"], depth=size["layers"], heads=size["heads"],
                                                      attn_flash=True))

    def minimal() -> nn.Module:
        return MinimalGPT(size["vocab"], size["d"], size["layers"], size["heads"], size["positions"])

    return {
        "interlayer": (interlayer_model, lambda m, x, y: _cross_entropy(m(x).logits, y)),
        "minimal-gpt2": (minimal, lambda m, x, y: _cross_entropy(m(x), y)),
        "hf-gpt2": (hf_model, lambda m, x, y: _cross_entropy(m(input_ids=x).logits, y)),
        "x-transformers": (x_model, lambda m, x, y: _cross_entropy(m(x), y)),
    }


def _hf_takes_attn(cls: type) -> bool:
    import inspect
    return "attn_implementation" in inspect.signature(cls.__init__).parameters


def interlayer_size(size: dict[str, int]) -> dict[str, Any]:
    return dict(src_vocab_size=size["vocab"], d_model=size["d"], enc_layers=size["layers"], n_heads=size["heads"],
                d_ffn=4 * size["d"], max_positions=size["positions"], dropout=0.0, attn_dropout=0.0)


# ---------------------------------------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    name: str
    overrides: dict[str, Any]
    bound: Optional[float] = None  # the time-ratio bar (absolute)
    bound_plus_madds: Optional[float] = None  # or: MAdds ratio + this
    bound_per_madds: Optional[float] = None  # or: MAdds ratio x this


METHODS = [
    Method("causal PA", {"predictive": {}}, bound=1.6),
    Method("Res-Transformer", {"predictive": {"conv_layers": 0}}, bound=1.35),
    Method("hyper-connections dynamic x4", {"hyper_connections": {}}, bound=1.15),
    Method("hyper-connections static x4", {"hyper_connections": {"dynamic": False}}, bound=1.10),
    Method("DenseFormer 1x1", {"denseformer": {}}, bound=1.05),
    Method("mHC x4", {"mhc": {}}, bound=1.10),  # mHC Sec. 4.3: 6.7% with fused kernels
    Method("MUDDFormer", {"muddformer": {}}, bound=1 / 0.90),  # MUDDFormer Table 4: 0.90x-0.96x throughput
    Method("Crossformer SG kq", {"crossformer": {"soft": ["kq"]}}, bound=1.03),
    Method("LW-1x", {"lightweight": {}}, bound_plus_madds=0.05),
    Method("ResFormer", {"value_residual": {}}, bound_per_madds=1.05),
    Method("SVFormer", {"value_residual": {"mode": "svformer"}}, bound_per_madds=1.05),
    Method("CLA2", {"cla": {"sharing_factor": 2}}, bound_per_madds=1.05),
    Method("Crossformer HG kq", {"crossformer": {"hard": ["kq"]}}, bound_per_madds=1.05),
    Method("ALBERT sharing", {"layer_sharing": {}}, bound_per_madds=1.05),
]


# ------------------------------------------------------------------------------------------------------- measuring
@dataclass
class Runner:
    """One model, its optimizer and the function one training step calls (compiled or not)."""

    name: str
    model: nn.Module
    loss: LossFn
    optimizer: torch.optim.Optimizer
    mode: str = "eager"  # "eager", "compiled" (forward + loss as one function) or "model-compiled" (the loss eager)
    backend: str = "inductor"
    step_loss: Callable[[Tensor, Tensor], Tensor] = field(init=False)

    def __post_init__(self) -> None:
        if self.mode == "model-compiled":
            compiled_model = torch.compile(self.model, backend=self.backend)
            self.step_loss = lambda x, y: self.loss(compiled_model, x, y)
        elif self.mode == "compiled":
            self.step_loss = torch.compile(lambda x, y: self.loss(self.model, x, y), backend=self.backend)
        else:
            self.step_loss = lambda x, y: self.loss(self.model, x, y)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = resolve_device(args.device)
        self.cuda = self.device.type == "cuda"
        self.started = time.perf_counter()
        self.result: dict[str, Any] = {"environment": self.environment(), "problems": []}

    # -- the environment and the ceiling
    def environment(self) -> dict[str, Any]:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else platform.processor()
        env = {"device": str(self.device), "device_name": name, "torch": torch.__version__,
               "cuda": torch.version.cuda, "python": platform.python_version(),
               "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()), "tiny": self.args.tiny,
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        try:
            import triton
            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
        env["peak_flops"] = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
        if self.device.type == "cuda" and not self.args.tiny:
            a = torch.randn(8192, 8192, device=self.device, dtype=torch.bfloat16)
            seconds = self.time_fn(lambda: a @ a, 10)
            env["matmul_8192_bf16_tflops"] = 2 * 8192 ** 3 / seconds / 1e12
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
        spent = time.perf_counter() - self.started
        if spent > self.args.budget:
            self.result["problems"].append(f"not measured (budget of {self.args.budget:.0f} s spent): {what}")
            return True
        return False

    def save(self) -> None:
        if self.args.json:
            with open(self.args.json, "w", encoding="utf-8") as handle:
                json.dump(self.result, handle, indent=2, default=str)

    # -- one training step
    def train_step(self, runner: Runner, batch: tuple[Tensor, Tensor]) -> None:
        runner.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, "bf16" if self.cuda else "fp32"):
            loss = runner.step_loss(*batch)
        loss.backward()
        runner.optimizer.step()

    def make_runner(self, name: str, build: Callable[[], nn.Module], loss: LossFn, mode: str) -> Runner:
        torch.manual_seed(0)
        model = build().to(self.device).train()
        fused = {"fused": True} if self.cuda else {}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
        # --tiny checks the traced path with aot_eager: a CPU inductor build takes minutes
        return Runner(name, model, loss, optimizer, mode, "aot_eager" if self.args.tiny else "inductor")

    def interleaved(self, runners: list[Runner], batch: tuple[Tensor, Tensor]) -> dict[str, dict[str, float]]:
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
            out[r.name] = {"ms": 1e3 * statistics.median(times[r.name]), "min_ms": 1e3 * min(times[r.name]),
                           "max_ms": 1e3 * max(times[r.name]), "warmup_s": warm[r.name], "peak_gib": peak}
        return out

    def profile(self, runner: Runner, batch: tuple[Tensor, Tensor], top: int = 25) -> list[dict[str, Any]]:
        """The step's CUDA kernels by total time (one step after warm-up)."""
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(2):
                self.train_step(runner, batch)
            self.sync()
        events = prof.key_averages()
        key = "device_time_total" if self.cuda else "cpu_time_total"
        rows = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)
        kernels = [{"name": e.key[:120], "calls": e.count // 2, "ms_per_step": getattr(e, key, 0) / 2e3}
                   for e in rows if getattr(e, key, 0) > 0 and (not self.cuda or e.device_type.name == "CUDA")][:top]
        total = sum(getattr(e, key, 0) for e in events if not self.cuda or e.device_type.name == "CUDA") / 2e3
        print(f"  profile {runner.name}: {total:.1f} ms of kernels per step", flush=True)
        for k in kernels[:12]:
            print(f"    {k['ms_per_step']:7.2f} ms  x{k['calls']:<4d} {k['name']}", flush=True)
        return [{"kernel_ms_per_step_total": total}] + kernels

    # -- the parts
    def lm_batch(self, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=gen).to(self.device)
        return tokens[:, :-1], tokens[:, 1:]

    def flops_per_token(self, size: dict[str, int], length: int, model: nn.Module) -> float:
        params = sum(p.numel() for n, p in model.named_parameters()
                     if "wpe" not in n and "positions" not in n and "pos_emb" not in n)
        return 6 * params + 12 * size["layers"] * size["d"] * length

    def peers(self) -> None:
        size = TINY if self.args.tiny else GPT2
        batch_size, length = (2, 16) if self.args.tiny else (self.args.peer_batch, size["positions"])
        batch = self.lm_batch(batch_size, length, size["vocab"])
        peak = self.result["environment"]["peak_flops"]
        rows, records = [], {}
        for name, (build, loss) in lm_peers(size).items():
            if self.over_budget(f"peer {name}"):
                break
            try:
                modes = ["eager", "compiled"] + (["model-compiled"] if name == "interlayer" else [])
                runners = [self.make_runner(f"{name} {mode}", build, loss, mode) for mode in modes]
            except ImportError as error:
                self.result["problems"].append(f"peer {name} not measured: {error}")
                continue
            measured = self.interleaved(runners, batch)
            fpt = self.flops_per_token(size, length, runners[0].model)
            for r in runners:
                m = measured[r.name]
                m["tokens_per_s"] = batch_size * length / (m["ms"] / 1e3)
                m["mfu"] = fpt * m["tokens_per_s"] / peak if peak else None
                records[r.name] = m
            if self.args.profile:
                for r in runners[1:]:
                    records[r.name]["profile"] = self.profile(r, batch)
            del runners
            self.empty()
            self.result["peers"] = records
            self.save()
        fastest = max((v["tokens_per_s"] for k, v in records.items()
                       if k.endswith("compiled") and not k.startswith("interlayer")), default=None)
        for name, m in records.items():
            rows.append([name, f"{m['ms']:.1f}", f"{m['tokens_per_s']:,.0f}",
                         "n/a" if m["mfu"] is None else f"{100 * m['mfu']:.1f}%",
                         "n/a" if m["peak_gib"] is None else f"{m['peak_gib']:.1f}",
                         "" if not fastest else f"{m['tokens_per_s'] / fastest:.2f}x"])
        print(f"\n## GPT-2 small, batch {batch_size} x {length}\n")
        print(format_table(["model", "ms/step", "tokens/s", "MFU", "peak GiB", "vs fastest compiled peer"], rows))

    def methods(self) -> None:
        size = TINY if self.args.tiny else GPT2
        batch_size, length = (2, 16) if self.args.tiny else (self.args.method_batch, size["positions"])
        batch = self.lm_batch(batch_size, length, size["vocab"])
        base_overrides = interlayer_size(size)
        loss = lm_peers(size)["interlayer"][1]
        modes = self.args.modes.split(",")
        selected = [m for m in METHODS if not self.args.methods or any(s in m.name for s in self.args.methods)]
        records = {}
        for tag in modes:
            base = self.make_runner(f"base {tag}", lambda: create_model("gpt2_small", **base_overrides), loss, tag)
            base_madds = count_madds(base.model, length)
            for method in selected:
                if self.over_budget(f"{method.name} {tag}"):
                    break
                runner = self.make_runner(f"{method.name} {tag}",
                                          lambda: create_model("gpt2_small", **base_overrides, **method.overrides),
                                          loss, tag)
                measured = self.interleaved([base, runner], batch)
                b, m = measured[base.name], measured[runner.name]
                madds_ratio = count_madds(runner.model, length) / base_madds
                bound = (method.bound if method.bound is not None else
                         madds_ratio + method.bound_plus_madds if method.bound_plus_madds is not None else
                         madds_ratio * method.bound_per_madds)
                record = {"mode": tag, "base_ms": b["ms"], "method_ms": m["ms"], "time_ratio": m["ms"] / b["ms"],
                          "madds_ratio": madds_ratio, "base_peak_gib": b["peak_gib"],
                          "method_peak_gib": m["peak_gib"], "bound": bound, "met": m["ms"] / b["ms"] <= bound,
                          "warmup_s": m["warmup_s"]}
                if self.args.profile:
                    record["profile"] = self.profile(runner, batch, top=15)
                records[f"{method.name} {tag}"] = record
                print(f"  {method.name} {tag}: {record['time_ratio']:.2f}x (bound {bound:.2f}), MAdds "
                      f"{madds_ratio:.2f}x, {m['ms']:.1f} ms vs {b['ms']:.1f} ms", flush=True)
                del runner
                self.empty()
                self.result["methods"] = records
                self.save()
            del base
            self.empty()
        rows = [[k, f"{v['time_ratio']:.2f}x", f"{v['bound']:.2f}", "met" if v["met"] else "MISSED",
                 f"{v['madds_ratio']:.2f}x", f"{v['method_ms']:.1f} / {v['base_ms']:.1f}",
                 "n/a" if v["base_peak_gib"] is None else f"{v['method_peak_gib']:.1f} / {v['base_peak_gib']:.1f}"]
                for k, v in records.items()]
        print(f"\n## Methods, GPT-2 small shape, batch {batch_size} x {length}\n")
        print(format_table(["method", "time ratio", "bound", "", "MAdds ratio", "ms (method / base)",
                            "peak GiB (method / base)"], rows))

    def decode(self) -> None:
        overrides = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=2) if self.args.tiny else {}
        torch.manual_seed(0)
        model = create_model("gpt_shakespeare_char", **overrides).to(self.device).eval()
        new = 8 if self.args.tiny else 200
        rows, records = [], []
        for batch in (1, 8):
            if self.over_budget(f"decode batch {batch}"):
                break
            prompts = torch.randint(0, 65, (batch, 16), generator=torch.Generator().manual_seed(batch))
            prompts = prompts.to(self.device)
            seconds: dict[bool, list[float]] = {True: [], False: []}
            tokens: dict[bool, Tensor] = {}
            for cache in (True, False):  # warm-up: the first call carries one-time costs
                model.generate(prompts, SamplingOptions(max_new_tokens=new, temperature=0, use_cache=cache))
            for _ in range(1 if self.args.tiny else 3):
                for cache in (True, False):
                    options = SamplingOptions(max_new_tokens=new, temperature=0, use_cache=cache)
                    self.sync()
                    start = time.perf_counter()
                    with torch.no_grad():
                        tokens[cache] = model.generate(prompts, options).tokens
                    self.sync()
                    seconds[cache].append(time.perf_counter() - start)
            same = torch.equal(tokens[True], tokens[False])
            for cache in (True, False):
                rate = batch * new / statistics.median(seconds[cache])
                records.append({"batch": batch, "cache": cache, "new_tokens_per_s": rate, "same_tokens": same})
                rows.append([str(batch), "yes" if cache else "no", f"{rate:,.0f}", "yes" if same else "NO"])
            self.result["decode"] = records
            self.save()
        print("\n## Decoding gpt_shakespeare_char, 16-token prompts, greedy\n")
        print(format_table(["batch", "cache", "new tokens/s", "same tokens"], rows))

    def empty(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default="peers,methods,decode")
    parser.add_argument("--methods", nargs="*", help="only the methods whose name contains one of these")
    parser.add_argument("--modes", default="compiled", help="methods: compiled, eager or both (compiled,eager)")
    parser.add_argument("--profile", action="store_true", help="record the top CUDA kernels of each configuration")
    parser.add_argument("--peer-batch", type=int, default=16)
    parser.add_argument("--method-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation included)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds after which nothing new is started")
    parser.add_argument("--tiny", action="store_true", help="toy sizes, one round: a dry run, not a measurement")
    parser.add_argument("--json", help="write every figure to this JSON file")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.steps, args.warmup = 1, 1, 1
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


if __name__ == "__main__":
    main()
