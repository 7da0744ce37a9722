"""What a Triton kernel spends on a Hopper GPU, read from its machine code without a GPU: executed instructions,
MMA instructions against the fewest the kernel's products need, scalar 16-bit global loads in its loops, barriers,
and the bytes its code loads and stores (benchmarks/bench_kernels.py --resources; docs/benchmarks.md).

Two halves meet per program of a launch:

* **The machine code.** The launch is compiled for sm_90 by Triton's own ``ptxas`` and disassembled with the
  ``nvdisasm`` Triton ships (``-gi``: every instruction with its source line and the chain of inlined calls that
  led there). Instructions are cut into basic blocks; a backward branch marks a loop.
* **The launch's own control flow.** Each sampled program of the real launch (its grid, its arguments) runs in a
  *shadow* of ``triton.language``: program ids, index arithmetic, masks and addresses are computed exactly with
  NumPy, floating-point data is only a shape (nothing is multiplied), so a program of a GPT-2-sized launch takes
  milliseconds. Python's line tracer counts how often each source line runs, keyed by the same chain of calls the
  disassembler prints; every ``tl.dot`` records its shape and every load and store the distinct addresses it
  touches. Control flow may depend on program ids, sizes and constants, never on loaded data (a shadowed value
  in a branch raises).

A basic block inside a loop runs as often as the most common count of the source lines of its instructions that
ran, a block outside every loop once if any of its lines ran (a block whose instructions carry no line as often as
the block before it), so loop trip counts come from the launch itself and change when a kernel's loop does; a loop
the compiler unrolled U times (a main copy and a remainder, :func:`unroll_factors`) runs count // U and count % U
times. Lines are the unit, so a kernel calls a helper once a line (the shadow refuses two calls on one line). Every
warp of a program runs the same blocks (branches in these kernels are on program-level scalars): executed
warp-instructions are the per-program count times the program's warps, averaged over the sampled programs and
multiplied by the grid.

Bytes are distinct addresses loaded and stored: over all the programs of one index of the uniform axes when those
were traced whole (a cell two programs read, a convolution's halo, counts once, as a cache the programs share would
fetch it once), else over each sampled program, summed.
"""
from __future__ import annotations

import ast
import collections
import functools
import re
import subprocess
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import triton
import triton.language as tl

NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
Chain = tuple[tuple[str, int], ...]  # (file, line) from the kernel's own frame to the innermost inlined call

# -- the machine code ---------------------------------------------------------------------------------------------
_INSTR = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(?:(@!?U?P[0-9T]+)\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
_TARGET = re.compile(r"\((\.L_x_\d+)\)")
MMA_OPS = ("HMMA", "HGMMA", "IMMA", "WGMMA")


def mma_work(op: str) -> int:
    """Multiply-adds one warp's execution of an MMA instruction does: ``HMMA.16816`` 16 x 8 x 16; a warpgroup's
    ``HGMMA.64xNxK`` is executed by its four warps together, so a quarter of 64 x N x K each."""
    group = re.match(r"HGMMA\.(\d+)x(\d+)x(\d+)", op)
    if group:
        m, n, k = (int(x) for x in group.groups())
        return m * n * k // 4
    warp = re.match(r"[HI]MMA\.(16)(8)(\d+)", op)
    if warp:
        return 16 * 8 * int(warp.group(3))
    return 0
SCALAR_16 = re.compile(r"^LDG\.E\.(U16|S16|16)(\.|$)")  # a 2-byte global load: one element a lane


@dataclass
class Instr:
    op: str
    args: str
    chain: Optional[Chain]


def disassemble(cubin: bytes) -> tuple[list[Instr], dict[str, int]]:
    """The kernel's instructions, each with its chain of source lines (outermost call first), and the index each
    label points at."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([str(NVDISASM), "-c", "-gi", handle.name], capture_output=True, text=True,
                              check=True).stdout
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    pending: list[tuple[str, int]] = []  # the '//##' lines since the last instruction, innermost first
    chain: Optional[Chain] = None
    for raw in text.splitlines():
        found = _LINE.search(raw)
        if found:
            pending.append((found.group(1), int(found.group(2))))
            if found.group(3) is None:  # the outermost frame closes a chain
                chain, pending = tuple(reversed(pending)), []
            continue
        label = _LABEL.match(raw)
        if label:
            labels[label.group(1)] = len(instrs)
            continue
        ins = _INSTR.match(raw)
        if ins:
            instrs.append(Instr(ins.group(3), ins.group(4), chain))
    return instrs, labels


def _is_branch(ins: Instr) -> bool:
    return ins.op.startswith(("BRA", "EXIT", "RET", "BRX", "JMP"))


def basic_blocks(instrs: Sequence[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every basic block: leaders are the first instruction, branch targets and whatever
    follows a branch."""
    leaders = {0, *labels.values()}
    leaders.update(n + 1 for n, ins in enumerate(instrs) if _is_branch(ins))
    cuts = sorted(x for x in leaders if x < len(instrs))
    return [(a, b) for a, b in zip(cuts, cuts[1:] + [len(instrs)])]


def loop_spans(instrs: Sequence[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """``[head, back edge]`` of every loop: a branch to a label at or before it."""
    spans = []
    for n, ins in enumerate(instrs):
        target = _TARGET.search(ins.args) if ins.op.startswith("BRA") else None
        if target and labels[target.group(1)] <= n:
            spans.append((labels[target.group(1)], n))
    return spans


def unroll_factors(chains: Sequence[Optional[Chain]], loops: Sequence[tuple[int, int]]
                   ) -> dict[tuple[int, int], tuple[int, bool]]:
    """Loops the compiler unrolled: ``span -> (U, main)``. A loop over a runtime trip count unrolled U times is two
    disjoint loops in the machine code, the main one holding U copies of the body's lines and the remainder one copy;
    a source line executed h times then runs h // U times in the first and h % U in the second. Two disjoint loops
    are one loop's versions when their most frequent source line is the same; U is the ratio of its copies."""
    def own(span: tuple[int, int]) -> collections.Counter:
        inner = [other for other in loops if other != span and span[0] <= other[0] and other[1] <= span[1]]
        return collections.Counter(chains[i] for i in range(span[0], span[1] + 1)
                                   if chains[i] is not None and not any(h <= i <= e for h, e in inner))
    lines = {span: own(span) for span in loops}
    out: dict[tuple[int, int], tuple[int, bool]] = {}
    for span, counted in lines.items():
        for other, theirs in lines.items():
            if not counted or set(counted) != set(theirs) or not (other[1] < span[0] or span[1] < other[0]):
                continue  # versions of one loop run the same source lines, in disjoint code
            line, copies = counted.most_common(1)[0]
            ratio = copies / theirs[line]
            if ratio >= 1.5 and abs(ratio - round(ratio)) < 0.1:
                out[span], out[other] = (round(ratio), True), (round(ratio), False)
    return out


# -- the shadow of triton.language -------------------------------------------------------------------------------
class ShadowError(RuntimeError):
    """The shadow met something it cannot follow (control flow on loaded data, an unknown operation)."""


_INDEX_KINDS = "biu"  # NumPy kinds the shadow computes exactly: booleans and integers


class Shadow:
    """A value of the shadowed kernel: ``data`` (a NumPy array: indices, masks, byte addresses of pointers) or
    None for floating-point (or loaded) data, of which only the shape is kept."""

    __slots__ = ("shape", "data", "elem", "pointer")

    def __init__(self, shape: tuple[int, ...], data: Optional[np.ndarray], dtype: Any, pointer: bool = False):
        self.shape, self.data, self.elem, self.pointer = tuple(shape), data, dtype, pointer

    # exact values for control flow
    def _scalar(self) -> Any:
        if self.data is None:
            raise ShadowError("a branch or loop bound depends on data the kernel loaded or computed in floating "
                              "point; the shadow follows control flow on indices only")
        return self.data.reshape(-1)[0].item() if self.data.size == 1 else self.data

    def __bool__(self) -> bool:
        value = self._scalar()
        if isinstance(value, np.ndarray):
            raise ShadowError("a branch on a block of values")
        return bool(value)

    def __index__(self) -> int:
        return int(self._scalar())

    __int__ = __index__

    def __getitem__(self, index: Any) -> "Shadow":
        probe = np.empty(self.shape, dtype=np.int8)[index]
        return Shadow(probe.shape, None if self.data is None else self.data[index], self.elem, self.pointer)

    def to(self, dtype: Any, bitcast: bool = False, **_: Any) -> "Shadow":
        if self.pointer:
            return Shadow(self.shape, self.data, dtype.element_ty if isinstance(dtype, tl.pointer_type) else dtype,
                          True)
        if self.data is None or bitcast:
            return Shadow(self.shape, None, dtype)
        data = np.trunc(self.data) if self.data.dtype.kind == "f" and _exact(dtype) else self.data
        return Shadow(self.shape, data.astype(_np(dtype)), dtype)

    @property
    def T(self) -> "Shadow":  # noqa: N802 (Triton's name)
        return trans(self)

    @property
    def dtype(self) -> Any:
        """Triton's view: a pointer's dtype has ``element_ty``."""
        return _PointerType(self.elem) if self.pointer else self.elem


class _PointerType:
    def __init__(self, element: Any) -> None:
        self.element_ty = element


def _np(dtype: Any) -> Any:
    name = str(dtype)
    return {"int1": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
            "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64}.get(name, np.float64)


def _exact(dtype: Any) -> bool:
    return str(dtype) in ("int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _size(dtype: Any) -> int:
    name = str(dtype)
    if name == "int1":
        return 1
    return max(1, int(re.sub(r"\D", "", name) or 32) // 8)


def _wrap(value: Any) -> Shadow:
    if isinstance(value, Shadow):
        return value
    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, (bool, np.bool_)):
        return Shadow((), np.array(value), tl.int1)
    if isinstance(value, (int, np.integer)):
        return Shadow((), np.array(value, dtype=np.int64), tl.int64)
    if isinstance(value, float):  # exact: a scalar computed from indices may steer control flow (a sqrt of an id)
        return Shadow((), np.array(value, dtype=np.float64), tl.float32)
    raise ShadowError(f"the shadow cannot take {type(value).__name__} values")


@functools.lru_cache(maxsize=4096)
def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


def _binary(op: Callable[[Any, Any], Any], a: Any, b: Any, *, compare: bool = False) -> Any:
    if isinstance(a, (int, float, bool)) and isinstance(b, (int, float, bool)) and not isinstance(a, Shadow):
        return op(a, b)
    x, y = _wrap(a), _wrap(b)
    shape = _broadcast(x.shape, y.shape)
    if x.pointer or y.pointer:  # pointer + offset: byte addresses
        pointer, offset = (x, y) if x.pointer else (y, x)
        if offset.data is None:
            raise ShadowError("a pointer offset computed from loaded data")
        step = _size(pointer.elem)
        sign = -1 if (op is _SUB and y is offset) else 1
        return Shadow(shape, pointer.data + sign * offset.data.astype(np.int64) * step, pointer.elem, True)
    if x.data is None or y.data is None:
        return Shadow(shape, None, tl.int1 if compare else (x.elem if x.data is None else y.elem))
    result = op(x.data, y.data)
    dtype = tl.int1 if compare else (x.elem if str(x.elem) != "int64" or str(y.elem) == "int64" else y.elem)
    return Shadow(shape, np.asarray(result), dtype)


def _SUB(a: Any, b: Any) -> Any:  # noqa: N802 (marks subtraction for pointer arithmetic)
    return a - b


def _floordiv(a: Any, b: Any) -> Any:  # Triton's integer division truncates toward zero, as C does
    return np.trunc(np.true_divide(a, b)).astype(np.result_type(a, b)) if isinstance(a, np.ndarray) or isinstance(
        b, np.ndarray) else int(a / b)


def _mod(a: Any, b: Any) -> Any:
    return a - _floordiv(a, b) * b


def _shift_right(a: Any, b: Any) -> Any:
    return a >> b


for _name, _fn, _cmp in (
        ("__add__", lambda a, b: a + b, False), ("__sub__", _SUB, False), ("__mul__", lambda a, b: a * b, False),
        ("__floordiv__", _floordiv, False), ("__truediv__", _floordiv, False), ("__mod__", _mod, False),
        ("__and__", lambda a, b: a & b, False), ("__or__", lambda a, b: a | b, False),
        ("__xor__", lambda a, b: a ^ b, False), ("__lshift__", lambda a, b: a << b, False),
        ("__rshift__", _shift_right, False), ("__lt__", lambda a, b: a < b, True),
        ("__le__", lambda a, b: a <= b, True), ("__gt__", lambda a, b: a > b, True),
        ("__ge__", lambda a, b: a >= b, True), ("__eq__", lambda a, b: a == b, True),
        ("__ne__", lambda a, b: a != b, True)):
    setattr(Shadow, _name, (lambda fn, cmp: lambda self, other: _binary(fn, self, other, compare=cmp))(_fn, _cmp))
    if not _cmp:
        setattr(Shadow, "__r" + _name[2:], (lambda fn: lambda self, other: _binary(fn, other, self))(_fn))
Shadow.__hash__ = None  # type: ignore[assignment]
Shadow.__neg__ = lambda self: _binary(lambda a, b: a - b, 0, self)  # type: ignore[attr-defined]
Shadow.__invert__ = lambda self: Shadow(self.shape, None if self.data is None else ~self.data,  # type: ignore
                                        self.elem)


@dataclass
class ProgramTrace:
    """What one program did: line-chain counts, the products it asked for, the distinct bytes it touched."""

    hits: collections.Counter = field(default_factory=collections.Counter)
    dots: list[tuple[int, int, int, str]] = field(default_factory=list)
    loaded: dict[int, list] = field(default_factory=dict)  # element size -> arrays of the addresses touched
    stored: dict[int, list] = field(default_factory=dict)

    def bytes(self, which: dict[int, list]) -> int:
        """Distinct bytes: each element size's distinct addresses times that size."""
        return sum(size * len(np.unique(np.concatenate(arrays))) for size, arrays in which.items())


_TRACE: list[ProgramTrace] = []  # the program being shadowed


_MEMORY: list[tuple[int, int, np.ndarray]] = []  # (start, end, bytes) of each argument tensor's storage


def _touch(which: str, pointer: Shadow, mask: Any) -> Shadow:
    """Records the distinct addresses a load or store touches; a load of integers reads their values (a target
    class, a padding mask: what the kernel's addresses and masks may be built from), of floats a shape."""
    if not isinstance(pointer, Shadow) or not pointer.pointer:
        raise ShadowError(f"tl.{'load' if which == 'loaded' else 'store'} of a non-pointer")
    shape = pointer.shape
    if mask is not None:  # as Triton: the pointer and the mask broadcast together
        m = _wrap(mask)
        if m.data is None:
            raise ShadowError("a load or store masked by loaded floating-point data")
        shape = _broadcast(pointer.shape, m.shape)
    everywhere = np.broadcast_to(pointer.data, shape)
    keep = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(m.data, shape).astype(bool)
    pointer = Shadow(shape, everywhere, pointer.elem, pointer.pointer)
    size = _size(pointer.elem)
    getattr(_TRACE[-1], which).setdefault(size, []).append(everywhere[keep].reshape(-1))
    if which == "stored" or not _exact(pointer.elem):
        return Shadow(pointer.shape, None, pointer.elem)
    values = np.zeros(pointer.shape, dtype=_np(pointer.elem))
    for address in np.unique(everywhere[keep]):
        found = next(((start, data) for start, end, data in _MEMORY if start <= address < end), None)
        if found is None:  # integers read from a float tensor (its bits): data, not values
            return Shadow(pointer.shape, None, pointer.elem)
        start, data = found
        chunk = data[address - start:address - start + size].view(_np(pointer.elem))[0]
        values[keep & (everywhere == address)] = chunk
    return Shadow(pointer.shape, values, pointer.elem)


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, tl.constexpr) else value


def _shape(value: Any) -> tuple[int, ...]:
    return value.shape if isinstance(value, Shadow) else ()


def program_id(axis: int) -> Shadow:
    return Shadow((), np.array(_PID[-1][_unwrap(axis)], dtype=np.int64), tl.int32)


def num_programs(axis: int) -> Shadow:
    return Shadow((), np.array(_GRID[-1][_unwrap(axis)], dtype=np.int64), tl.int32)


_PID: list[tuple[int, int, int]] = []
_GRID: list[tuple[int, int, int]] = []


def arange(start: Any, end: Any) -> Shadow:
    return Shadow((_unwrap(end) - _unwrap(start),), np.arange(_unwrap(start), _unwrap(end), dtype=np.int64),
                  tl.int32)


def full(shape: Sequence[Any], value: Any, dtype: Any) -> Shadow:
    shape = tuple(_unwrap(s) for s in shape)
    value = _unwrap(value)
    exact = isinstance(value, (int, bool, float)) and (_exact(dtype) or not shape)  # float blocks: a shape only
    return Shadow(shape, np.full(shape, value, dtype=_np(dtype)) if exact else None, dtype)


def zeros(shape: Sequence[Any], dtype: Any) -> Shadow:
    return full(shape, 0, dtype)


def load(pointer: Any, mask: Any = None, other: Any = None, **_: Any) -> Shadow:
    return _touch("loaded", pointer, mask)


def store(pointer: Any, value: Any, mask: Any = None, **_: Any) -> None:
    _touch("stored", pointer, mask)


def dot(a: Shadow, b: Shadow, acc: Any = None, input_precision: Any = None, **_: Any) -> Shadow:
    (m, k), (_, n) = a.shape[-2:], b.shape[-2:]
    batch = int(np.prod(a.shape[:-2])) if len(a.shape) > 2 else 1
    if _unwrap(input_precision) != "ieee":  # IEEE fp32 products run on the FMA units, not as MMA instructions
        _TRACE[-1].dots.append((batch * m, n, k, str(a.elem)))
    return Shadow(a.shape[:-1] + (n,), None, tl.float32)


def where(condition: Any, a: Any, b: Any) -> Shadow:
    c, x, y = _wrap(condition), _wrap(a), _wrap(b)
    shape = _broadcast(c.shape, x.shape, y.shape)
    if c.data is not None and x.data is not None and y.data is not None:
        return Shadow(shape, np.where(c.data, x.data, y.data), x.elem)
    return Shadow(shape, None, x.elem if x.data is None else y.elem)


def _elementwise(*values: Any, **_: Any) -> Shadow:
    shadows = [_wrap(v) for v in values if isinstance(v, (Shadow, int, float, bool, tl.constexpr))]
    return Shadow(_broadcast(*[s.shape for s in shadows]), None, shadows[0].elem)


def _exact_or_shape(fn: Callable[..., Any]) -> Callable[..., Shadow]:
    def apply(*values: Any, **_: Any) -> Shadow:
        shadows = [_wrap(v) for v in values]
        if all(s.data is not None for s in shadows):
            return Shadow(_broadcast(*[s.shape for s in shadows]), np.asarray(fn(*[s.data for s in shadows])),
                          shadows[0].elem)
        return _elementwise(*values)
    return apply


def _reduce(value: Shadow, axis: Any = None, keep_dims: Any = False, **_: Any) -> Shadow:
    axis, keep = _unwrap(axis), bool(_unwrap(keep_dims))
    if axis is None:
        shape = (1,) * len(value.shape) if keep else ()
    else:
        axis %= len(value.shape)
        shape = tuple(1 if i == axis else s for i, s in enumerate(value.shape) if keep or i != axis)
    return Shadow(shape, None, value.elem)


def reshape(value: Shadow, shape: Sequence[Any], can_reorder: bool = False) -> Shadow:
    shape = tuple(_unwrap(s) for s in shape)
    return Shadow(shape, None if value.data is None else value.data.reshape(shape), value.elem, value.pointer)


def trans(value: Shadow, *dims: Any) -> Shadow:
    order = [_unwrap(d) for d in dims] or list(reversed(range(len(value.shape))))
    order = order[0] if len(order) == 1 and isinstance(order[0], (list, tuple)) else order
    data = None if value.data is None else np.transpose(value.data, order)
    return Shadow(tuple(value.shape[i] for i in order), data, value.elem, value.pointer)


def join(a: Shadow, b: Shadow) -> Shadow:
    data = None if a.data is None or b.data is None else np.stack(np.broadcast_arrays(a.data, b.data), -1)
    return Shadow(_broadcast(a.shape, b.shape) + (2,), data, a.elem)


def split(value: Shadow) -> tuple[Shadow, Shadow]:
    half = Shadow(value.shape[:-1], None if value.data is None else value.data[..., 0], value.elem)
    other = Shadow(value.shape[:-1], None if value.data is None else value.data[..., 1], value.elem)
    return half, other


def broadcast_to(value: Any, shape: Sequence[Any]) -> Shadow:
    v = _wrap(value)
    shape = tuple(_unwrap(s) for s in shape)
    return Shadow(shape, None if v.data is None else np.broadcast_to(v.data, shape), v.elem, v.pointer)


def expand_dims(value: Shadow, axis: Any) -> Shadow:
    axis = _unwrap(axis)
    data = None if value.data is None else np.expand_dims(value.data, axis)
    shape = list(value.shape)
    shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, 1)
    return Shadow(tuple(shape), data, value.elem, value.pointer)


def cdiv(a: Any, b: Any) -> Any:
    return (a + b - 1) // b


def _identity(value: Any, *_: Any, **__: Any) -> Any:
    return value


def _ranges(*args: Any, **_: Any) -> range:
    return range(*[int(_unwrap(a)) for a in args])


def _cast(value: Any, dtype: Any, bitcast: bool = False, **_: Any) -> Shadow:
    return _wrap(value).to(dtype, bitcast=bitcast)


def shadow_language() -> types.SimpleNamespace:
    """The shadow's ``tl``: Triton's dtypes and constexpr, and the operations above."""
    names = {n: getattr(tl, n) for n in dir(tl) if isinstance(getattr(tl, n), tl.dtype) or n in (
        "constexpr", "pointer_type", "dtype")}
    exact = {n: _exact_or_shape(f) for n, f in (
        ("maximum", np.maximum), ("minimum", np.minimum), ("abs", np.abs), ("exp", np.exp), ("exp2", np.exp2),
        ("log", np.log), ("log2", np.log2), ("sqrt", np.sqrt), ("rsqrt", lambda x: 1 / np.sqrt(x)),
        ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("fma", lambda a, b, c: a * b + c),
        ("fdiv", np.true_divide), ("div_rn", np.true_divide), ("cos", np.cos), ("sin", np.sin),
        ("floor", np.floor), ("ceil", np.ceil), ("clamp", np.clip))}
    shaped = {n: _elementwise for n in ("umulhi", "erf")}
    reductions = {n: _reduce for n in ("sum", "max", "min", "argmax", "argmin", "xor_sum", "reduce")}
    return types.SimpleNamespace(
        **names, **exact, **shaped, **reductions, program_id=program_id, num_programs=num_programs, arange=arange,
        full=full, zeros=zeros, load=load, store=store, dot=dot, where=where, reshape=reshape, trans=trans,
        permute=trans, join=join, split=split, broadcast_to=broadcast_to, expand_dims=expand_dims, cdiv=cdiv,
        multiple_of=_identity, max_contiguous=_identity, static_assert=lambda *a, **k: None,
        debug_barrier=lambda: None, range=_ranges, static_range=_ranges, cast=_cast, zeros_like=lambda v, **k:
        Shadow(v.shape, None, v.elem), math=types.SimpleNamespace(**shaped, **exact))


# -- running one program in the shadow, with its source lines counted ---------------------------------------------
@functools.lru_cache(maxsize=None)
def _statement_starts(path: str) -> dict[int, int]:
    """Each line of a source file -> the first line of the innermost simple statement (or clause header) holding it,
    so a line number from the disassembler and one from Python's tracer name the same statement."""
    starts: dict[int, int] = {}
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if not isinstance(node, ast.stmt) or isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        body = getattr(node, "body", None)
        end = body[0].lineno - 1 if body else node.end_lineno or node.lineno
        for line in range(node.lineno, max(end, node.lineno) + 1):
            if starts.get(line, -1) < node.lineno:
                starts[line] = node.lineno
    return starts


_SHADOWED: dict[tuple[str, str], str] = {}  # (folder name, file name) -> the file the shadow runs


def _relocated(path: str) -> str:
    """The shadowed file a compiled line names. Triton's cache is keyed by a kernel's source and line numbers, not
    by its folder, so a kernel compiled in another checkout of the same code comes back naming that checkout's
    path: the same lines of another copy."""
    here = Path(path)
    return _SHADOWED.get((here.parent.name, here.name), path)


@functools.lru_cache(maxsize=None)
def normalise(chain: Optional[Chain]) -> Optional[Chain]:
    if chain is None:
        return None
    located = [(_relocated(path), line) for path, line in chain]
    return tuple((path, _statement_starts(path).get(line, line)) if Path(path).is_file() else (path, line)
                 for path, line in located)


class Shadower:
    """Runs programs of one kernel (a ``@triton.jit`` function of a module) in the shadow."""

    def __init__(self, kernel: Any) -> None:
        module = sys.modules[kernel.fn.__module__]
        self.files = {module.__file__}
        here = Path(module.__file__)
        if _SHADOWED.get((here.parent.name, here.name)) != module.__file__:
            _SHADOWED[(here.parent.name, here.name)] = module.__file__
            normalise.cache_clear()
        shadow_globals = dict(vars(module))
        shadow_globals["tl"] = shadow_language()
        shadow_globals["triton"] = types.SimpleNamespace(cdiv=cdiv, language=shadow_globals["tl"], jit=_identity)
        for name, value in vars(module).items():
            if isinstance(value, triton.runtime.jit.JITFunction):
                shadow_globals[name] = types.FunctionType(value.fn.__code__, shadow_globals, name,
                                                          value.fn.__defaults__, value.fn.__closure__)
            elif isinstance(value, tl.constexpr):
                shadow_globals[name] = value.value
        self.function = shadow_globals[kernel.fn.__name__]
        self.params = list(kernel.arg_names)

    def run(self, args: dict[str, Any], pid: tuple[int, int, int], grid: tuple[int, int, int]) -> ProgramTrace:
        trace = ProgramTrace()
        _TRACE.append(trace)
        _PID.append(pid)
        _GRID.append(grid)
        files = self.files

        calls: dict[Chain, int] = {}  # a chain's call sites by bytecode offset: one call a source line
        current: dict[types.FrameType, int] = {}  # each frame's statement: its lines' events count once a run

        def local(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                statement = _statement_starts(frame.f_code.co_filename).get(frame.f_lineno, frame.f_lineno)
                if current.get(frame) == statement:  # the next physical line of a statement spanning several
                    return local
                current[frame] = statement
                chain, sites = [], []
                f: Optional[types.FrameType] = frame
                while f is not None and f.f_code is not _RUN_CODE:
                    if f.f_code.co_filename in files:
                        chain.append((f.f_code.co_filename, f.f_lineno))
                        sites.append(f.f_lasti)
                    f = f.f_back
                key = normalise(tuple(reversed(chain)))
                trace.hits[key] += 1
                site = hash(tuple(sites[1:]))
                if calls.setdefault(key, site) != site and len(chain) > 1:
                    raise ShadowError(f"{chain[1][0]}:{chain[1][1]} calls a @triton.jit helper twice on one line; "
                                      "the machine code names lines, not calls, so write one call a line")
            return local

        def global_trace(frame: types.FrameType, event: str, arg: Any) -> Any:
            return local if frame.f_code.co_filename in files else None

        sys.settrace(global_trace)
        errors = np.seterr(all="ignore")  # index arithmetic may overflow where masked lanes point anywhere
        try:
            _call(self.function, args)
        finally:
            sys.settrace(None)
            np.seterr(**errors)
            _TRACE.pop()
            _PID.pop()
            _GRID.pop()
        return trace


def _call(function: Callable[..., Any], args: dict[str, Any]) -> None:
    function(**args)


_RUN_CODE = _call.__code__


def shadow_args(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The launch's arguments as the shadow takes them: tensors as pointers (their addresses), numbers as exact
    scalars, constexprs as plain values."""
    import torch

    bound = dict(zip(kernel.arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k in kernel.arg_names})
    out: dict[str, Any] = {}
    _MEMORY.clear()
    for name, value in bound.items():
        param = kernel.params[kernel.arg_names.index(name)]
        if param.is_constexpr:
            out[name] = value
        elif isinstance(value, torch.Tensor):
            dtype = getattr(tl, {torch.bool: "int1"}.get(value.dtype, str(value.dtype).replace("torch.", "")))
            out[name] = Shadow((), np.array(value.data_ptr(), dtype=np.int64), dtype, True)
            if not value.dtype.is_floating_point and value.device.type == "cpu":  # integers may be read for values
                storage = value.untyped_storage()
                data = np.frombuffer(bytes(storage), dtype=np.uint8)
                _MEMORY.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes(), data))
        elif isinstance(value, bool):
            out[name] = Shadow((), np.array(value), tl.int1)
        elif isinstance(value, int):
            out[name] = Shadow((), np.array(value, dtype=np.int64), tl.int32 if abs(value) < 2**31 else tl.int64)
        elif isinstance(value, float):
            out[name] = Shadow((), None, tl.float32)
        elif value is None:
            out[name] = None
        else:
            raise ShadowError(f"argument {name}: the shadow cannot take {type(value).__name__}")
    return out


def plan_programs(shadow: Shadower, args: dict[str, Any], grid: tuple[int, int, int], budget: int, seed: int = 0
                  ) -> tuple[list[tuple[int, int, int]], bool]:
    """The programs to shadow, and whether they are every program of the grid's non-uniform axes.

    An axis along which three random pairs of programs run the same source lines as often is taken as uniform (a
    batch, a batch of heads): its first index stands for all. The other axes are covered whole when they hold at most
    ``budget`` programs, else sampled ``budget`` times, one program drawn from each of equal runs of their ids."""
    rng = np.random.default_rng(seed)
    uniform = []
    for axis in range(3):
        if grid[axis] > 1:
            for _ in range(3):
                pid = [int(rng.integers(g)) for g in grid]
                other = list(pid)
                other[axis] = (pid[axis] + 1 + int(rng.integers(grid[axis] - 1))) % grid[axis]
                if shadow.run(args, tuple(pid), grid).hits != shadow.run(args, tuple(other), grid).hits:
                    break
            else:
                uniform.append(axis)
    free = [axis for axis in range(3) if axis not in uniform and grid[axis] > 1]
    count = int(np.prod([grid[axis] for axis in free])) if free else 1
    if count <= budget:
        ids = list(range(count))
    else:
        edges = np.linspace(0, count, budget + 1).astype(np.int64)
        ids = [int(rng.integers(a, b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]
    picked = []
    for linear in ids:
        pid = [0, 0, 0]
        for axis in reversed(free):
            pid[axis] = linear % grid[axis]
            linear //= grid[axis]
        picked.append((pid[0], pid[1], pid[2]))
    return picked, count <= budget


# -- the two halves together ----------------------------------------------------------------------------------------
def executed(instrs: Sequence[Instr], labels: dict[str, int], traces: Sequence[ProgramTrace], programs: int,
             warps: int, positions: float, union: bool = False) -> dict[str, Any]:
    """Per launch: executed warp-instructions (all, MMA, 16-bit scalar loads in loops), barriers (a synchronisation
    of a program's warps counts once), the multiply-adds its MMA instructions do against those its products need
    (more: warps repeating each other's work, or tiles padded past the products' shapes), and the bytes its programs
    load and store, each as a total over the grid and per position. ``union``: the traces are every program of the
    grid's non-uniform axes (:func:`plan_programs`), so the bytes are the distinct addresses of all of them together
    (a cell two programs read counts once, as a cache shared by the programs would fetch it once), scaled to the
    grid; else each program's distinct bytes, summed."""
    blocks = basic_blocks(instrs, labels)
    loops = loop_spans(instrs, labels)
    chains = [normalise(ins.chain) for ins in instrs]
    innermost = [min((span for span in loops if span[0] <= a <= span[1]), key=lambda span: span[1] - span[0],
                     default=None) for a, _ in blocks]
    unrolled = unroll_factors(chains, loops)
    totals = collections.Counter()
    for trace in traces:
        previous = 1
        for (a, b), span in zip(blocks, innermost):
            counts = [hits for hits in (trace.hits.get(c, 0) for c in chains[a:b] if c is not None) if hits]
            count = collections.Counter(counts).most_common(1)[0][0] if counts else previous
            previous = count
            if span is None:  # straight-line code runs once if at all: a line the compiler copied out of a loop
                count = min(count, 1)  # (a pipelined loop's first steps) keeps its loop's count, the copy does not
            elif span in unrolled:  # a loop the compiler unrolled U times runs count // U times, its remainder
                factor, main = unrolled[span]  # loop the rest
                count = count // factor if main else count % factor
            block = instrs[a:b]
            totals["instructions"] += count * len(block)
            totals["mma"] += count * sum(ins.op.startswith(MMA_OPS) for ins in block)
            totals["mma_work"] += count * sum(mma_work(ins.op) for ins in block)
            totals["barriers"] += count * sum(ins.op.startswith("BAR.SYNC") for ins in block)
            if span is not None:
                totals["scalar_16bit_loads_in_loops"] += count * sum(bool(SCALAR_16.match(ins.op)) for ins in block)
        for m, n, k, _ in trace.dots:
            totals["mma_work_needed"] += m * n * k
    scale = programs / max(len(traces), 1)
    if union:  # the traced programs cover the grid's distinct work: their distinct bytes, scaled
        for which in ("loaded", "stored"):
            merged: dict[int, list] = {}
            for trace in traces:
                for size, arrays in getattr(trace, which).items():
                    merged.setdefault(size, []).extend(arrays)
            totals[f"bytes_{which}"] = ProgramTrace().bytes(merged)
    else:
        for trace in traces:
            totals["bytes_loaded"] += trace.bytes(trace.loaded)
            totals["bytes_stored"] += trace.bytes(trace.stored)
    # every warp issues its own instructions; a barrier is one synchronisation of the program's warps, counted once
    per_warp = ("instructions", "mma", "mma_work", "scalar_16bit_loads_in_loops")
    out = {key: totals[key] * scale * (warps if key in per_warp else 1) for key in (
        "instructions", "mma", "mma_work", "mma_work_needed", "barriers", "scalar_16bit_loads_in_loops",
        "bytes_loaded", "bytes_stored")}
    out["mma_replication"] = out["mma_work"] / out["mma_work_needed"] if out["mma_work_needed"] else 0.0
    out["static_scalar_16bit_loads_in_loops"] = sum(
        bool(SCALAR_16.match(instrs[i].op)) for h, e in loops for i in range(h, e + 1))
    out["per_position"] = {key: out[key] / positions for key in ("instructions", "mma", "barriers")}
    out["positions"] = positions
    out["sampled_programs"] = len(traces)
    return out
