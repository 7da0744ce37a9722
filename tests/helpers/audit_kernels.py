"""Small kernels for tests/test_sass_audit.py, compiled and audited by ``python -m helpers.audit_kernels`` in a
process without Triton's interpreter (the suite's own process interprets kernels, tests/conftest.py), which prints
each audit's figures as JSON."""
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sass_audit  # noqa: E402

jit = triton.jit


@jit
def _rows(X, Y, n, W: tl.constexpr):
    cols = tl.arange(0, W)
    acc = tl.zeros([W], tl.float32)
    for i in range(0, n):
        acc += tl.load(X + i * W + cols).to(tl.float32)
    tl.store(Y + cols, acc)


@jit
def _shifted(X, Y, n, W: tl.constexpr):
    cols = tl.arange(0, W)
    acc = tl.zeros([W], tl.float32)
    for i in range(0, n):
        acc += tl.load(X + i * W + cols + 1).to(tl.float32)  # one element off: no vector load can read it
    tl.store(Y + cols, acc)


@jit
def _product(A, Y, M: tl.constexpr):
    i = tl.arange(0, M)
    a = tl.load(A + i[:, None] * M + i[None, :])
    tl.store(Y + i[:, None] * M + i[None, :], tl.dot(a, a))


@jit
def _twice(X, Y, W: tl.constexpr):
    cols = tl.arange(0, W)
    tl.store(Y + cols, _load(X, cols) + _load(X + W, cols))  # two calls of one helper on one line


@jit
def _load(X, cols):
    return tl.load(X + cols)


def audit(kernel, args, grid, warps, positions=1.0, **constexprs):
    """Compile for sm_90, shadow every program, return sass_audit.executed's figures (or the shadow's refusal)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime import jit as runtime

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = runtime.create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **constexprs, num_warps=warps)
    options, signature, consts, attrs = kernel._pack_args(backend, {**constexprs, "num_warps": warps}, bound,
                                                          specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, consts, attrs), target=target, options=options.__dict__)
    instrs, labels = sass_audit.disassemble(compiled.asm["cubin"])
    shadow = sass_audit.Shadower(kernel)
    shadow_args = sass_audit.shadow_args(kernel, args, constexprs)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    try:
        picked, whole = sass_audit.plan_programs(shadow, shadow_args, grid, 64)
        traces = [shadow.run(shadow_args, pid, grid) for pid in picked]
    except sass_audit.ShadowError as error:
        return {"refused": str(error)}
    return sass_audit.executed(instrs, labels, traces, grid[0] * grid[1] * grid[2], warps, positions, whole)


def main() -> None:
    x, y = torch.zeros(40, 1024, dtype=torch.bfloat16), torch.zeros(1024)
    a, out = torch.zeros(16, 16, dtype=torch.float16), torch.zeros(16, 16)
    print(json.dumps({
        **{f"rows {n}": audit(_rows, (x, y, n), (1,), 4, W=1024) for n in (8, 16, 32)},
        "shifted": audit(_shifted, (x, y, 8), (1,), 4, W=1024),
        "product 1 warp": audit(_product, (a, out), (1,), 1, M=16),
        "product 4 warps": audit(_product, (a, out), (1,), 4, M=16),
        "twice": audit(_twice, (torch.zeros(64), torch.zeros(32)), (1,), 1, W=32)}))


if __name__ == "__main__":
    main()
