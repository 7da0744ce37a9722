"""Each Triton kernel against its PyTorch reference path, alone, at the GPT-2-small shape it serves: time forward
and forward + backward, the bytes the kernel's design must move, the bandwidth that makes, peak memory, and how far
its outputs and gradients are from the reference's in the same run (docs/benchmarks.md).

Why beside ``bench_gpu.py``: a method's step ratio says a method is slow, not which of its kernels is; one GPU run
of PA on its kernels measured 44x the plain model with no hint of where (docs/gpu-runs/). Here each kernel is one
row, so the next GPU run names the slow one, and the error column says whether the kernels hold their reference's
numbers on real hardware (the suite checks them under Triton's interpreter).

Cases (``--cases``, default all), batch 8 x 1,024 tokens, 12 heads of 64, width 768, 4 streams, bf16 maps:

* ``cross-entropy``: the loss over 50,304 classes with smoothing 0.1 (eager only: inductor writes its own);
* ``logits-attention``: causal softmax-times-values from given logits, flash-style;
* ``pa-maps`` / ``res-maps``: Predictive Attention's whole map op (one 3 x 3 convolution over the previous layer's
  logits, Eq. 4's mix, the attention over the mixed logits), or the Res-Transformer's (no convolution); both
  outputs (attention and mixed logits) carry a gradient, as between two layers;
* ``hc-static`` / ``hc-dynamic``: a hyper-connection's pending depth connection fused with the next width connection,
  then the streams' sum (fp32 streams, a bf16 sublayer output).

Bytes are the design's (each kernel module's cost model): what its passes read and write, a causal map's upper half
not read; ``GB/s`` is those bytes over the median time, ``of peak`` against the datasheet bandwidth (a measured CPU
copy off a GPU). Timing: CUDA events, medians of interleaved rounds (the two paths alternate). ``--tiny`` runs toy
sizes on the CPU (under ``TRITON_INTERPRET=1`` the kernels run there too), the suite's dry run.

    python benchmarks/bench_kernels.py --json kernels.json
    TRITON_INTERPRET=1 python benchmarks/bench_kernels.py --tiny --device cpu
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from interlayer.accounting import PEAKS, measure_cpu_peak
from interlayer.kernels import cross_entropy, hyper_connections, logits_attention, predictive_maps
from interlayer.kernels.dispatch import interpreting, kernel_mode
from interlayer.tables import format_table

SIZES = {  # batch, heads, length, head size, width, streams, classes
    "gpt2": dict(B=8, H=12, T=1024, D=64, d=768, n=4, V=50304),
    # the dry run's (--tiny: the suite runs it twice, the kernels under Triton's interpreter, whose time grows with
    # the positions): every case's passes at toy sizes; the kernels' own tests cover their shapes and edges
    "tiny": dict(B=1, H=2, T=9, D=8, d=8, n=2, V=97),
    # the suite's machine-code audit: GPT-2 small's heads and widths on one sequence of 512 (the per-position figures
    # of a shorter map are the larger: its blocks on the diagonal and at the edges are more of it)
    "audit": dict(B=1, H=12, T=512, D=64, d=768, n=4, V=50304),
    # and at half its length: a layer's bytes are a quadratic in T without a constant term (cells, and rows of halo
    # or diagonal; the weights are kilobytes), so the two audits give GPT-2 small's bytes exactly
    "audit-half": dict(B=1, H=12, T=256, D=64, d=768, n=4, V=50304),
}
Outputs = tuple[Tensor, ...]


@dataclass
class Case:
    """A kernel's inputs (those with ``requires_grad`` get gradients), the function of them both paths run, and the
    bytes its kernels move forward and backward."""

    inputs: list[Tensor]
    run: Callable[..., Outputs]
    forward_bytes: float
    backward_bytes: float
    visible: Optional[list[Optional[Tensor]]] = None  # per output: the cells a model reads (its gradient's support)
    positions: float = 1.0  # what the machine-code audit counts per: map cells of all heads, or tokens


def _maps(s: dict[str, int], dtype: torch.dtype, device: torch.device, convolutions: int) -> Case:
    """One PA layer's maps from its queries and keys on (the logits ``S = q k^T`` and their backward are the layer's
    too: the kernels make them on and below the diagonal, the reference path by the library's product)."""
    B, H, T, D = s["B"], s["H"], s["T"], s["D"]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0, kind: torch.dtype = dtype) -> Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(device, kind).requires_grad_()

    q, k, prev, v = rand(B, H, T, D), rand(B, H, T, D, scale=D ** -0.5), rand(B, H, T, T), rand(B, H, T, D)
    weights = [rand(H, H, 3, 3, scale=0.1, kind=torch.float32) for _ in range(convolutions)]
    biases = [rand(H, scale=0.1, kind=torch.float32) for _ in range(convolutions)]
    alpha = torch.tensor(0.5, device=device)

    def run(q: Tensor, k: Tensor, prev: Tensor, v: Tensor, *params: Tensor) -> Outputs:
        return predictive_maps.predictive_attention_qk(q, k, 1.0, prev, v, params[:convolutions],
                                                       params[convolutions:], alpha, None, 0.0, True, None)

    e, cells, touched = dtype.itemsize, B * H * T * T, B * H * T * (T + 1) / 2
    values = 3 * B * H * T * D * e  # v read, the output written (forward); dO, v read and dv written (backward)
    # the design (predictive_maps_triton.py, causal_logits_triton.py): forward S written, the previous logits and S
    # read, M written, M read by the attention, a sign bit a cell; backward: M, the next layer's dM and the signs
    # read, dZ and dS written, dZ read twice and the input once, dA_prev written (with its zeros above the diagonal),
    # dS read twice for dq and dk
    convolve = 1 if convolutions else 0
    forward = 5 * e * touched + touched / 8 * convolve + values * 2 / 3
    backward = (4 * e + convolve * (e + 3 * e) + e + 2 * e) * touched + e * (cells - touched) + values
    lower = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return Case([q, k, prev, v, *weights, *biases], run, forward, backward, [None, lower], touched / H)


def _attention(s: dict[str, int], dtype: torch.dtype, device: torch.device) -> Case:
    B, H, T, D = s["B"], s["H"], s["T"], s["D"]
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(B, H, T, T, generator=g).to(device, dtype).requires_grad_()
    v = torch.randn(B, H, T, D, generator=g).to(device, dtype).requires_grad_()

    def run(logits: Tensor, v: Tensor) -> Outputs:
        return (logits_attention.logits_attention(logits, v, None, causal=True),)

    e, cells, touched = dtype.itemsize, B * H * T * T, B * H * T * (T + 1) / 2
    values = B * H * T * D * e
    # forward: the touched logits read, v read, the output written; backward: the touched logits read, the whole
    # gradient written (zeros above the diagonal), dO and v read, dv written
    return Case([logits, v], run, e * touched + 2 * values, e * touched + e * cells + 3 * values,
                positions=touched / H)


def _cross_entropy(s: dict[str, int], dtype: torch.dtype, device: torch.device) -> Case:
    rows, classes = s["B"] * s["T"], s["V"]
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(rows, classes, generator=g).to(device, dtype).requires_grad_()
    target = torch.randint(0, classes, (rows,), generator=g)
    target[::17] = -100
    target = target.to(device)

    def run(logits: Tensor) -> Outputs:
        return (cross_entropy.smoothed_cross_entropy(logits, target, 0.1)[0],)

    size = rows * classes * dtype.itemsize
    # forward reads the logits; backward reads them, writes their grad
    return Case([logits], run, size, 2 * size, positions=rows)


def _hyper(s: dict[str, int], dtype: torch.dtype, device: torch.device, dynamic: bool) -> Case:
    n, d, positions = s["n"], s["d"], s["B"] * s["T"]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0, kind: torch.dtype = torch.float32) -> Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(device, kind).requires_grad_()

    streams, branch = rand(n, positions, d), rand(positions, d, kind=dtype)
    carry = (torch.rand(positions, n, n + 2, generator=g) / n).to(device)  # the previous sublayer's coefficients
    alpha, beta = rand(n, n + 1, scale=0.5), rand(n, scale=0.5)
    extra = [rand(d, n + 2, scale=0.02), rand(d), rand(d, scale=0.1), rand((), scale=0.1), rand((), scale=0.1)] \
        if dynamic else []

    def run(streams: Tensor, branch: Tensor, alpha: Tensor, beta: Tensor, *extra: Tensor) -> Outputs:
        params = hyper_connections.HCParams(alpha, beta, *extra)
        state = hyper_connections.Pending(streams, carry, branch)
        h0, after = hyper_connections.width_connection(state, params)
        total = hyper_connections.stream_sum(hyper_connections.depth_connection(after, h0.to(branch.dtype)))
        return h0, total

    c, y = positions * d, dtype.itemsize
    # the fused pass (module doc: H read, y read, H' and h0 written; backward: dH', dh0, H, y read, dH, dy written)
    # and the sum of the pending state (H', y read, the sum written; backward: its gradient read, dH', dy written)
    forward = c * (4 * n + y + 4 * n + 4) + c * (4 * n + y + 4)
    backward = c * (4 * n + 4 + 4 * n + y + 4 * n + y) + c * (4 + 4 * n + y)
    return Case([streams, branch, alpha, beta, *extra], run, forward, backward, positions=positions)


CASES: dict[str, Callable[[dict[str, int], torch.dtype, torch.device], Case]] = {
    "cross-entropy": _cross_entropy,
    "logits-attention": _attention,
    "pa-maps": lambda s, dt, dev: _maps(s, dt, dev, 1),
    "res-maps": lambda s, dt, dev: _maps(s, dt, dev, 0),
    "hc-static": lambda s, dt, dev: _hyper(s, dt, dev, False),
    "hc-dynamic": lambda s, dt, dev: _hyper(s, dt, dev, True),
}
# The kernels each case launches, by module (``kernels/NAME_triton.py``): every Triton module is some case's
# (tests/test_kernel_layout.py), and each case launches exactly these (tests/test_bench_kernels.py's dry run).
MODULES: dict[str, tuple[str, ...]] = {
    "cross-entropy": ("cross_entropy",),
    "logits-attention": ("logits_attention",),
    "pa-maps": ("causal_logits", "predictive_maps", "logits_attention"),
    "res-maps": ("causal_logits", "predictive_maps", "logits_attention"),
    "hc-static": ("hyper_connections",),
    "hc-dynamic": ("hyper_connections",),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1e3


def _pass(case: Case, mode: str, backward: bool, grads: Optional[list[Tensor]] = None
          ) -> tuple[Outputs, list[Optional[Tensor]]]:
    """One forward (and backward, with the fixed output gradients ``grads``) on ``mode``'s path."""
    for t in case.inputs:
        t.grad = None
    with kernel_mode(mode), torch.set_grad_enabled(backward):  # type: ignore[arg-type]
        outputs = case.run(*case.inputs)
        if backward:
            torch.autograd.backward(list(outputs), grads)
    return outputs, [t.grad for t in case.inputs]


def _error(ours: list[Optional[Tensor]], reference: list[Optional[Tensor]]) -> float:
    """The largest difference over the reference's largest magnitude, over every output or gradient."""
    worst = 0.0
    for a, b in zip(ours, reference):
        if a is None or b is None:
            if (a is None) != (b is None):
                raise AssertionError("one path gave a gradient the other did not")
            continue
        scale = max(b.detach().float().abs().max().item(), 1e-12)
        worst = max(worst, (a.detach().float() - b.detach().float()).abs().max().item() / scale)
    return worst


def measure(name: str, sizes: dict[str, int], dtype: torch.dtype, device: torch.device, rounds: int,
            bandwidth: float) -> dict[str, Any]:
    case = CASES[name](sizes, dtype, device)
    with torch.no_grad():
        probe = case.run(*case.inputs)
    g = torch.Generator(device="cpu").manual_seed(1)
    visible = case.visible or [None] * len(probe)
    grads = [torch.randn(o.shape, generator=g).to(device, o.dtype) for o in probe]
    grads = [grad if keep is None else grad * keep for grad, keep in zip(grads, visible)]
    del probe
    results = {mode: _pass(case, mode, True, grads) for mode in ("triton", "reference")}
    outputs = {mode: [o if keep is None else o * keep for o, keep in zip(results[mode][0], visible)]
               for mode in results}
    row: dict[str, Any] = {
        "error": _error([*outputs["triton"], *results["triton"][1]], [*outputs["reference"], *results["reference"][1]]),
        "forward_bytes": case.forward_bytes, "backward_bytes": case.backward_bytes}
    del results, outputs
    times: dict[tuple[str, str], list[float]] = {}
    peaks: dict[str, float] = {}
    for _ in range(rounds if device.type == "cuda" else 1):
        for mode in ("triton", "reference"):
            if device.type == "cuda":
                for t in case.inputs:  # the last pass's gradients are not this pass's memory
                    t.grad = None
                _sync(device)
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            times.setdefault((mode, "forward"), []).append(
                _timed(lambda mode=mode: _pass(case, mode, False), device))
            times.setdefault((mode, "training"), []).append(
                _timed(lambda mode=mode: _pass(case, mode, True, grads), device))
            if device.type == "cuda":
                peaks[mode] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    for (mode, what), values in times.items():
        row[f"{mode}_{what}_ms"] = statistics.median(values[1:] if len(values) > 2 else values)
    for what, moved in (("forward", case.forward_bytes), ("training", case.forward_bytes + case.backward_bytes)):
        ms = row[f"triton_{what}_ms"]
        row[f"{what}_speedup"] = row[f"reference_{what}_ms"] / ms
        row[f"{what}_gbps"] = moved / ms / 1e6
        row[f"{what}_of_peak"] = moved / ms / 1e-3 / bandwidth
    row["peak_mib"] = peaks or None
    return row


# -- what each kernel costs a GPU's multiprocessor, found without a GPU -----------------------------------------
# Hopper (sm_90; the H100 and H200 SXM): 132 multiprocessors of 65,536 registers, 64 resident warps, 32 resident
# blocks, 228 KiB of shared memory (1 KiB of it reserved per block).
SM90 = dict(sms=132, registers=65536, warps=64, blocks=32, shared=228 * 1024, reserved=1024)


def occupancy(registers: int, shared: int, warps: int, sm: dict[str, int] = SM90) -> int:
    """Blocks of ``warps`` warps one multiprocessor holds at once, given each thread's ``registers`` (allocated per
    warp in units of 256) and each block's ``shared`` bytes."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = sm["registers"] // (per_warp * warps) if per_warp else sm["blocks"]
    by_shared = sm["shared"] // (shared + sm["reserved"])
    return min(by_registers, sm["warps"] // warps, by_shared, sm["blocks"])


def resources(cases: list[str], sizes: dict[str, int], dtype: torch.dtype, arch: int, samples: int = 256
              ) -> dict[str, Any]:
    """Every kernel launch each case's forward and backward makes, compiled for ``arch`` by Triton's own ``ptxas``
    (no GPU needed, nothing runs: the launch is caught, the kernels' outputs are left unwritten): registers a thread,
    bytes spilled to the stack, shared memory, the blocks a multiprocessor holds and the waves the grid needs; and
    what the launch executes (:mod:`sass_audit`: warp-instructions, MMA instructions against the fewest its products
    need, 16-bit scalar loads in loops, barriers, the bytes its code loads and stores), per case and per position,
    with the bytes of the PyTorch operations the case runs besides (counted from their tensors).

    Spilled registers and low occupancy are what a memory-bound kernel cannot afford; a GPU run's timing then says
    how much they cost. This reads Triton's launch internals (3.x: ``create_function_from_signature``,
    ``JITFunction._pack_args``) and so names the Triton version it ran with."""
    import subprocess
    import tempfile
    from contextlib import ExitStack
    from pathlib import Path
    from unittest import mock

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime import jit

    if interpreting():  # the kernels were then made interpreted functions, which compile nothing
        raise SystemExit("bench_kernels.py --resources compiles the kernels: run it without TRITON_INTERPRET=1")
    if not (hasattr(jit, "create_function_from_signature") and hasattr(jit.JITFunction, "_pack_args")):
        raise SystemExit(f"bench_kernels.py --resources reads Triton 3.9's launch internals, which Triton "
                         f"{triton.__version__} does not have")
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found: dict[tuple, dict[str, Any]] = {}
    compiled: dict[tuple, Any] = {}
    current: dict[str, Any] = {"case": "", "launches": []}

    def compile_launch(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        binder = jit.create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
        key = (current["case"], fn.__name__, str(specialization), str(options))
        grid = grid(bound) if callable(grid) else grid
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        current["launches"].append((key, fn, args, kwargs, grid, int(options.num_warps)))
        programs = int(torch.tensor(list(grid)).prod())
        if key in found:
            found[key]["launches"] += 1
            return
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                options=options.__dict__)
        compiled[key] = kernel
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(kernel.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True,
                                   check=True).stdout
        fields = dict(item.split(":") for item in usage.split(f"Function {fn.__name__}:")[1].split())
        registers, stack = int(fields["REG"]), int(fields["STACK"])
        shared, warps = int(kernel.metadata.shared), int(options.num_warps)
        blocks = occupancy(registers, shared, warps)
        found[key] = {"case": current["case"], "kernel": fn.__name__, "launches": 1, "programs": programs,
                      "warps": warps, "registers": registers, "spilled_bytes": stack, "shared": shared,
                      "blocks_per_sm": blocks, "resident_warps": blocks * warps,
                      "waves": programs / max(blocks * SM90["sms"], 1),
                      "constexprs": {fn.arg_names[path[0]]: value for path, value in constexprs.items()}}

    def caught(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        compile_launch(self, *args, grid=grid, warmup=warmup, **kwargs)

    from interlayer.kernels import cross_entropy as ce
    from interlayer.kernels import hyper_connections as hc
    from interlayer.kernels import hyper_connections_triton as hc_triton
    from interlayer.kernels import logits_attention as la
    from interlayer.kernels import predictive_maps as pm

    def programs(positions: int, device: torch.device, per_sm: int) -> int:  # the persistent grid of sm_90's SMs
        return max(1, min(positions, per_sm * SM90["sms"]))

    audits: dict[str, Any] = {}
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(jit.JITFunction, "run", caught))
        stack.enter_context(mock.patch.object(hc_triton, "_programs", programs))
        for module in (ce, hc, la, pm):  # every launcher takes its kernel, whatever the device
            stack.enter_context(mock.patch.object(module, "use_triton", lambda *a, **k: True))
        for name in cases:
            current["case"], current["launches"] = name, []
            case = CASES[name](sizes, dtype, torch.device("cpu"))
            with TorchBytes() as torch_bytes:
                outputs = case.run(*case.inputs)
            grads = [torch.zeros_like(o) for o in outputs]
            with torch_bytes:  # gradients returned, not accumulated into .grad (a layer's inputs are no leaves)
                torch.autograd.grad(outputs, [t for t in case.inputs if t.requires_grad], grads, allow_unused=True)
            audits[name] = _audit(current["launches"], compiled, case.positions, samples, torch_bytes.bytes)
            audits[name]["torch_bytes_by_op"] = dict(torch_bytes.by_op)
            audits[name]["sizes"] = dict(sizes)
            del case, outputs, grads
    return {"triton": triton.__version__, "arch": f"sm_{arch}", "kernels": list(found.values()), "audit": audits}


def _audit(launches: list, compiled: dict, positions: float, samples: int, torch_bytes: float) -> dict[str, Any]:
    """Each launch's executed costs (sass_audit.py), summed by kernel and over the case."""
    import sass_audit

    kernels: dict[str, dict[str, Any]] = {}
    code: dict[tuple, tuple] = {}
    for key, fn, args, kwargs, grid, warps in launches:
        if key not in code:
            code[key] = sass_audit.disassemble(compiled[key].asm["cubin"])
        instrs, labels = code[key]
        shadow = sass_audit.Shadower(fn)
        shadow_args = sass_audit.shadow_args(fn, args, kwargs)
        picked, whole = sass_audit.plan_programs(shadow, shadow_args, grid, samples)
        traces = [shadow.run(shadow_args, pid, grid) for pid in picked]
        cost = sass_audit.executed(instrs, labels, traces, grid[0] * grid[1] * grid[2], warps, positions, whole)
        row = kernels.setdefault(f"{fn.fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}", {"launches": 0})
        row["launches"] += 1
        row.setdefault("by_launch", []).append({  # one launch's own figures, named by its compile-time switches
            "constexprs": {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, str))},
            "per_position": cost["per_position"]})
        for field, value in cost.items():
            if isinstance(value, (int, float)) and field not in ("positions", "sampled_programs", "mma_replication"):
                row[field] = row.get(field, 0) + value
    totals = {field: sum(row.get(field, 0) for row in kernels.values()) for field in (
        "instructions", "mma", "mma_work", "mma_work_needed", "barriers", "scalar_16bit_loads_in_loops",
        "bytes_loaded", "bytes_stored")}
    totals["torch_bytes"] = torch_bytes
    totals["bytes"] = totals["bytes_loaded"] + totals["bytes_stored"] + torch_bytes
    for row in kernels.values():
        row["per_position"] = {f: row[f] / positions for f in ("instructions", "mma", "barriers")}
        row["mma_replication"] = row["mma_work"] / row["mma_work_needed"] if row["mma_work_needed"] else 0.0
    return {"positions": positions, "kernels": kernels, "totals": totals,
            "per_position": {f: totals[f] / positions for f in ("instructions", "mma", "barriers")}}


class TorchBytes:
    """Counts the bytes the PyTorch operations it sees read and write (every tensor argument and result, once per
    operation; views and allocations move nothing), the interlayer operators' insides included (their kernels'
    launches are counted from the machine code instead)."""

    FREE = {"view", "_unsafe_view", "t", "transpose", "expand", "permute", "as_strided", "slice", "select",
            "unsqueeze", "squeeze", "detach", "alias", "empty", "empty_like", "empty_strided", "new_empty",
            "new_empty_strided", "lift_fresh", "_reshape_alias", "reshape", "unbind", "split", "clone_free"}

    def __new__(cls) -> "TorchBytes":
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            bytes = 0.0
            by_op: dict = {}

            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None
                                   ) -> Any:
                kwargs = kwargs or {}
                if func.namespace == "interlayer":  # what the operator runs inside it besides its kernels
                    from torch._library.custom_ops import OPDEFS

                    with self:
                        return OPDEFS[func._schema.name]._init_fn(*args, **kwargs)
                out = func(*args, **kwargs)
                if func.__name__.split(".")[0] not in cls.FREE:
                    tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out))
                               if isinstance(t, Tensor)]
                    moved = sum(t.numel() * t.element_size() for t in tensors)
                    self.bytes += moved
                    self.by_op[func.__name__] = self.by_op.get(func.__name__, 0) + moved
                return out

        return Mode()  # type: ignore[return-value]


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                        help="the maps' and logits' dtype (default bf16 on CUDA; fp32 on the CPU)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds on a GPU (the first is warm-up)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (the suite's dry run)")
    parser.add_argument("--sizes", choices=sorted(SIZES), help="the sizes (default gpt2; --tiny: tiny)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--samples", type=int, default=256,
                        help="--resources: at most this many programs of a launch are shadowed (sass_audit.py)")
    parser.add_argument("--resources", type=int, metavar="ARCH", nargs="?", const=90,
                        help="instead of timing: compile every launch for sm_ARCH (default 90: H100/H200) and report "
                             "registers, spills, shared memory and occupancy (no GPU needed)")
    args = parser.parse_args(argv)
    if args.resources:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype or "bf16"]
        sizes = SIZES[args.sizes or ("tiny" if args.tiny else "gpt2")]
        audit = resources(args.cases, sizes, dtype, args.resources, args.samples)
        rows = [[k["case"], k["kernel"], k["launches"], k["programs"], k["warps"], k["registers"],
                 k["spilled_bytes"], k["shared"], k["resident_warps"], f"{k['waves']:.1f}"] for k in audit["kernels"]]
        print(f"# bench_kernels --resources: {audit['arch']}, Triton {audit['triton']}, {dtype}, sizes {sizes}")
        print(format_table(["case", "kernel", "launches", "programs", "warps", "registers", "spilled B",
                            "shared B", "warps/SM", "waves"], rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(audit, f, indent=1)
        return audit
    device = torch.device(args.device)
    if device.type != "cuda" and not interpreting():
        parser.error(f"--device {args.device}: the kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((p for key, p in PEAKS.items() if key in name), None)
        bandwidth = peak.bandwidth if peak else float("nan")
    else:
        name, bandwidth = "cpu", measure_cpu_peak().bandwidth
    sizes = SIZES["tiny" if args.tiny else "gpt2"]
    result: dict[str, Any] = {"environment": {"device": name, "torch": torch.__version__, "dtype": str(dtype),
                                              "sizes": sizes, "bandwidth": bandwidth,
                                              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())},
                              "cases": {}}
    for case in args.cases:
        result["cases"][case] = measure(case, sizes, dtype, device, args.rounds, bandwidth)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    rows = [[case, f"{r['triton_forward_ms']:.3f}", f"{r['forward_speedup']:.2f}x", f"{r['forward_of_peak']:.0%}",
             f"{r['triton_training_ms']:.3f}", f"{r['training_speedup']:.2f}x", f"{r['training_of_peak']:.0%}",
             f"{r['error']:.1e}"] for case, r in result["cases"].items()]
    print(f"# bench_kernels: {name}, {dtype}, sizes {sizes}")
    print(format_table(["kernel", "fwd ms", "vs reference", "of bandwidth", "fwd+bwd ms", "vs reference",
                        "of bandwidth", "max error"], rows))
    return result


if __name__ == "__main__":
    main()
