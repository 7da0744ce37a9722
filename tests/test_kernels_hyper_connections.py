"""The hyper-connection kernels (src/interlayer/kernels/hyper_connections*.py) against today's PyTorch path, run
under Triton's interpreter on CPUs (``TRITON_INTERPRET=1``, set by conftest.py) or on the GPU: the forward pass and
every gradient (streams, sublayer outputs, static matrices, dynamic weight, scales, stream norm), static and
dynamic, n = 1, 2, 4 (3 for the generic operator), odd widths and position counts, fp32 and fp16; a whole language
model; the compiled model without graph breaks; the dispatch; the cost model's byte counts. The interpreter is slow,
so every case is a few positions wide."""
from __future__ import annotations

import copy
import functools
from typing import Callable, Optional

import pytest
import torch
from torch.utils._pytree import tree_flatten

pytest.importorskip("triton")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from helpers.hyper_connections import randomise, randomise_mhc, stream_dtype_error  # noqa: E402
from helpers.lm import lm  # noqa: E402
from interlayer.kernels import hyper_connections as hck  # noqa: E402
from interlayer.kernels.dispatch import kernel_mode  # noqa: E402
from interlayer.methods.hyper_connections import HyperConnection, Streams  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def assert_close(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor], what: str,
                 rival: Optional[torch.Tensor] = None) -> None:
    """``actual`` within 1e-4 of ``expected`` relative to its largest entry; with ``rival`` (the reference path in
    the same 16-bit dtype, ``expected`` being its fp32 run), within twice the rival's own error instead."""
    assert actual is not None and expected is not None, f"{what}: a gradient is missing"
    scale = expected.detach().abs().max().item() + 1e-6
    error = (actual.detach().float() - expected.detach().float()).abs().max().item()
    bound = (1e-3 if expected.is_cuda else 1e-4) * scale  # a GPU sums in other orders (and TF32 convolutions)
    if rival is not None:
        bound = 2 * (rival.detach().float() - expected.detach().float()).abs().max().item() + 1e-3 * scale
    assert error <= bound, f"{what}: max error {error:.3g} > {bound:.3g} (scale {scale:.3g})"


def _tanh_mix(h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """A sublayer for the chains below: a fixed mixing matrix and a tanh."""
    return torch.tanh(h @ m)


def run_chain(blocks: list[HyperConnection], sublayers: list[Callable], x: torch.Tensor, mode: str
              ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """Streams in, the sublayers with their hyper-connections, streams out; a loss that reads both the output and
    a recorded intermediate state. Returns ``(output, record, gradients of the sublayer outputs, gradients of the
    input and the parameters)``."""
    n = blocks[0].rate
    x = x.detach().clone().requires_grad_(True)
    for block in blocks:
        block.zero_grad()
    outputs = []
    with kernel_mode(mode):
        state, _ = Streams(n).start(x)
        for i, (block, sublayer) in enumerate(zip(blocks, sublayers)):
            branch, carry = block.split(state)
            y = sublayer(branch)
            y.retain_grad()
            outputs.append(y)
            state = block.combine(carry, y)
            if i == 0:
                record = Streams(n).view(state)
        out = Streams(n).finish(state, None)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device, dtype=torch.float32).view(out.shape)
    ((out.float() * weights).sum() + record.float().square().sum()).backward()
    grads = {"input": x.grad, **{f"{i}.{name}": p.grad for i, block in enumerate(blocks)
                                 for name, p in block.named_parameters() if not name.startswith("norm.")}}
    return out.detach(), record.detach(), [y.grad for y in outputs], grads


CHAINS = [  # (dynamic, n, d, (batch, time), dtype, norm bias)
    (False, 1, 40, (1, 7), torch.float32, True),
    (False, 2, 33, (1, 5), torch.float16, True),
    (False, 4, 40, (3, 1), torch.float32, True),
    (True, 1, 33, (1, 5), torch.float32, True),
    (True, 2, 40, (1, 3), torch.float16, True),
    (True, 4, 33, (1, 5), torch.float32, True),
    (True, 4, 40, (3, 1), torch.float16, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("dynamic,n,d,shape,dtype,bias", CHAINS)
def test_two_sublayers_match_the_reference_forward_and_every_gradient(dynamic, n, d, shape, dtype, bias):
    """The first width connection (no depth connection pending), the fused depth + width connection of the second
    sublayer, a recorded intermediate state and the final sum of the streams. In fp16 both paths are compared with
    the reference run in fp32: the kernels (fp32 inside) must be at least about as close as the reference path."""
    torch.manual_seed(0)
    blocks = [HyperConnection(d, n, k, dynamic=dynamic, scale_init=0.01, dropout=0.0, eps=1e-5, bias=bias)
              for k in range(2)]
    for block in blocks:
        randomise(block)
    mixers = [torch.randn(d, d, device=DEVICE) / d ** 0.5 for _ in blocks]
    x = torch.randn(*shape, d, device=DEVICE)

    def run(mode: str, precision: torch.dtype):
        copies = [copy.deepcopy(block).to(DEVICE, precision) for block in blocks]
        sublayers = [functools.partial(_tanh_mix, m=m.to(precision)) for m in mixers]
        return run_chain(copies, sublayers, x.to(precision), mode)

    out, record, dys, grads = run("triton", dtype)
    truth = run("reference", torch.float32)
    rival = run("reference", dtype) if dtype != torch.float32 else (None, None, [None, None], {})
    assert out.dtype == dtype
    assert_close(out, truth[0], "output", rival[0])
    assert_close(record, truth[1], "recorded state", rival[1])
    for i, dy in enumerate(dys):
        assert_close(dy, truth[2][i], f"sublayer {i} output's gradient", rival[2][i])
    assert grads.keys() == truth[3].keys() and len(grads) == 1 + 2 * (6 + bias if dynamic else 2)
    for name in grads:
        assert_close(grads[name], truth[3][name], f"{name}'s gradient", rival[3].get(name))


@pytest.mark.slow
def test_the_generic_operator_takes_any_per_position_coefficients():
    """``hc_mix`` as another multi-stream residual (mHC) would call it: coefficients per position (here n = 3, not a
    power of two), the depth connection with the next width connection, each alone, and their gradients."""
    torch.manual_seed(0)
    n, positions, d = 3, 5, 33
    inputs = {"streams": torch.randn(n, positions, d), "branch": torch.randn(positions, d),
              "carry": torch.randn(positions, n, n + 2), "coef": torch.randn(positions, n, n + 2)}

    def reference(streams, branch, carry, coef):
        mixed = streams
        if branch is not None:  # Z_i = carry[i, n+1] y + sum_j carry[j, 1+i] H_j
            mixed = (torch.einsum("pji,jpd->ipd", carry[..., 1:n + 1], streams)
                     + carry[..., n + 1].t()[..., None] * branch)
        return mixed, (torch.einsum("pj,jpd->pd", coef[..., 0], mixed) if coef is not None else None)

    for used in (("streams", "branch", "carry", "coef"), ("streams", "branch", "carry"), ("streams", "coef")):
        leaves = [{k: v.to(DEVICE).requires_grad_(True) if k in used else None for k, v in inputs.items()}
                  for _ in range(2)]
        mixed, h0 = hck.hc_mix(*leaves[0].values(), True)
        ref_mixed, ref_h0 = reference(*leaves[1].values())
        losses = []
        for z, h in ((mixed, h0), (ref_mixed, ref_h0)):
            loss = (z * torch.linspace(-1, 1, z.numel(), device=DEVICE).view(z.shape)).sum() if "branch" in used else 0
            losses.append(loss + (h.square().sum() if "coef" in used else 0))
        for loss in losses:
            loss.backward()
        if "branch" in used:
            assert_close(mixed, ref_mixed, f"{used}: mixed streams")
        else:
            assert mixed.numel() == 0
        if "coef" in used:
            assert_close(h0, ref_h0, f"{used}: h0")
        else:
            assert h0.numel() == 0
        for k in used:
            assert_close(leaves[0][k].grad, leaves[1][k].grad, f"{used}: {k}'s gradient")


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_language_model_loss_gradients_and_records_match_the_reference(dynamic):
    """Against the reference path in float64: some parameters' gradients are sums that mostly cancel (the scales',
    about 1e-4 of their terms), where the reference path in float32 is itself off by about 1e-4 of the gradient."""
    model = lm(hyper_connections={"rate": 4, "dynamic": dynamic}, enc_layers=1).to(DEVICE).train()
    randomise(model)
    tokens = torch.randint(0, 40, (1, 5), device=DEVICE)
    results = {}
    for mode, dtype in (("triton", torch.float32), ("reference", torch.float64)):
        model.zero_grad()
        model.to(dtype)
        with kernel_mode(mode):
            out = model(tokens, labels=tokens)
            out.loss.backward()
            states = [s.detach() for s in (*out.encoder.states, *out.encoder.mids)]
        results[mode] = (out.loss.detach(), states, {k: p.grad.clone() for k, p in model.named_parameters()})
    (loss, states, grads), (ref_loss, ref_states, ref_grads) = results["triton"], results["reference"]
    assert_close(loss, ref_loss, "loss")
    for state, ref_state in zip(states, ref_states, strict=True):
        assert_close(state, ref_state, "recorded state")
    for name, grad in grads.items():
        assert_close(grad, ref_grads[name], f"{name}'s gradient")


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_mhc_runs_on_the_kernels_and_matches_its_reference_path(dynamic, monkeypatch):
    """mHC's mixes (Sinkhorn-projected, computed outside) go through the same kernels as HC's: the loss, every
    gradient and the records equal the reference path's (in float64), and the kernel operator ran (static mHC: one
    fused pass a sublayer; dynamic: the pending state written first, its coefficients read from the streams)."""
    calls = []
    mix = hck.hc_mix
    monkeypatch.setattr(hck, "hc_mix", lambda *args: calls.append(1) or mix(*args))
    model = lm(mhc={"rate": 4, "dynamic": dynamic}, enc_layers=1).to(DEVICE).train()
    randomise_mhc(model, scale=0.5)
    tokens = torch.randint(0, 40, (1, 5), device=DEVICE)
    results = {}
    for mode, dtype in (("triton", torch.float32), ("reference", torch.float64)):
        model.zero_grad()
        model.to(dtype)
        with kernel_mode(mode):
            out = model(tokens, labels=tokens)
            out.loss.backward()
            states = [s.detach() for s in (*out.encoder.states, *out.encoder.mids)]
        results[mode] = (out.loss.detach(), states, {k: p.grad.clone() for k, p in model.named_parameters()})
        if mode == "triton":
            # one a sublayer (dynamic: the second's pending state written first), the stack's end, each record
            assert len(calls) == (4 if dynamic else 3) + len(states)
    (loss, states, grads), (ref_loss, ref_states, ref_grads) = results["triton"], results["reference"]
    assert_close(loss, ref_loss, "loss")
    for state, ref_state in zip(states, ref_states, strict=True):
        assert_close(state, ref_state, "recorded state")
    for name, grad in grads.items():
        assert_close(grad, ref_grads[name], f"{name}'s gradient")


@pytest.mark.slow
@pytest.mark.parametrize("method,section", [("hyper_connections", {"dynamic": True}), ("mhc", {})])
def test_16_bit_streams_on_the_kernels(method, section):
    """The option of 16-bit streams on the kernel path: the kernels read and write the streams in their dtype
    (computing in float32), and the model stays as close to float32 streams as on the reference path
    (test_hyper_connections.py's bounds)."""
    with kernel_mode("triton"):
        error, states_dtype, finite = stream_dtype_error(method, section, "float16", layers=1, length=3,
                                                         device=DEVICE)
    assert states_dtype == torch.float16 and finite
    assert 1e-5 < error < 5e-3, error


@pytest.mark.slow
def test_the_compiled_model_has_no_graph_break_and_the_kernels_gradients():
    """``fullgraph=True`` fails on any graph break; ``aot_eager`` traces the backward too, through the backward
    operators' fake implementations."""
    import torch._dynamo
    torch._dynamo.reset()
    model = lm(hyper_connections={"rate": 2}, enc_layers=1).to(DEVICE).train()
    randomise(model)
    tokens = torch.randint(0, 40, (1, 3), device=DEVICE)
    with kernel_mode("triton"):
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        loss = compiled(tokens, labels=tokens).loss
        loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    with kernel_mode("reference"):
        ref_loss = model(tokens, labels=tokens).loss
        ref_loss.backward()
    assert_close(loss, ref_loss, "loss")
    for name, p in model.named_parameters():
        assert_close(grads[name], p.grad, f"{name}'s gradient")


@pytest.mark.slow
def test_the_fake_implementations_give_the_real_outputs_layouts():
    """What torch.compile traces with (each operator's fake implementation) must give every output the real
    output's shape, dtype and strides: inductor checks the strides at run time (a transposed gradient once failed
    there, and torch.library.opcheck does not look)."""
    n, positions, d = 2, 3, 8
    streams, branch = torch.randn(n, positions, d, device=DEVICE), torch.randn(positions, d, device=DEVICE)
    carry, coef = torch.randn(positions, n, n + 2, device=DEVICE), torch.randn(positions, n, n + 2, device=DEVICE)
    params = [torch.randn(shape, device=DEVICE) for shape in ((n, n + 1), (n,), (d, n + 2), (d,), (d,), (), ())]
    grads = [torch.randn(n, positions, d, device=DEVICE), torch.randn(positions, d, device=DEVICE)]
    calls = [(torch.ops.interlayer.hc_mix, (streams, branch, carry, coef, True)),
             (torch.ops.interlayer.hc_mix_backward, (*grads, streams, branch, carry, coef)),
             (torch.ops.interlayer.hc_dynamic, (streams, branch, carry, *params, 1e-5)),
             (torch.ops.interlayer.hc_dynamic_backward, (*grads, coef, streams, branch, carry, *params, 1e-5)),
             (torch.ops.interlayer.hc_dynamic_backward, (None, grads[1], None, streams, None, None, *params[:4], None,
                                                         *params[5:], 1e-5))]
    for op, args in calls:
        real = tree_flatten(op(*args))[0]
        with FakeTensorMode() as mode:
            fake = tree_flatten(op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]))[0]
        assert [(t.shape, t.dtype, t.stride()) for t in fake] == [(t.shape, t.dtype, t.stride()) for t in real], op


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_one_dispatch_rule_picks_the_path(dynamic):
    """reference never runs a kernel; triton runs it (the depth connection stays pending) and refuses a case it does
    not cover rather than measure the fallback; auto keeps CPU tensors on today's path; a pending state that meets
    today's path is written out as the kernel writes it."""
    block = HyperConnection(8, 2, 0, dynamic=dynamic, scale_init=0.01, dropout=0.0, eps=1e-5, bias=True)
    randomise(block)
    block.to(DEVICE)
    streams, y = torch.randn(2, 3, 8, device=DEVICE), torch.randn(3, 8, device=DEVICE)
    with kernel_mode("reference"):
        assert isinstance(block.combine(block.split(streams)[1], y), torch.Tensor)
    with kernel_mode("triton"):
        pending = block.combine(block.split(streams)[1], y)
        assert isinstance(pending, hck.Pending)
        written, total = block.split(pending)[0], Streams(2).view(pending)
        with pytest.raises(RuntimeError, match="does not cover"):
            block.double().split(streams.double())
    block.float()
    with kernel_mode("reference"):
        assert_close(block.split(pending)[0], written, "next input")
        assert_close(Streams(2).view(pending), total, "sum of the streams")
    with kernel_mode("auto"):
        cpu = block.cpu()
        assert isinstance(cpu.combine(cpu.split(streams.cpu())[1], y.cpu()), torch.Tensor)
    assert hck.covers(torch.zeros(4, 1, 2048)) and not hck.covers(torch.zeros(4, 1, 2049))
    assert not hck.covers(torch.zeros(4, 1, 8), torch.zeros(1, 8, dtype=torch.float64))


def test_the_records_are_computed_when_read():
    """The stack records each layer's state as the sum of its streams only when someone reads it
    (core.encoder.StateViews): otherwise every forward would pay an extra pass over the n streams per sublayer."""
    model = lm(hyper_connections={"rate": 4}, enc_layers=2)
    calls = []
    depth = model.encoder.depth
    original = depth.view
    depth.view = lambda h: calls.append(1) or original(h)
    out = model(torch.randint(0, 40, (1, 4)))
    assert calls == []
    assert len(out.encoder.states) == 2 and torch.allclose(out.encoder.states[-1], out.encoder.states[1])
    assert len(calls) == 1
    assert len(out.encoder.mids[:]) == 2 and len(calls) == 3


class ByteCounter(TorchDispatchMode):
    """What each operator reads and writes, counted as the bytes of its tensor arguments and results (views are
    free; an expanded tensor counts its storage): the traffic of an eager run whose every operator goes to memory."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace in ("aten", "interlayer") and not func.is_view:
            tensors = {id(t): t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)}
            self.total += sum(t.untyped_storage().nbytes() if 0 in t.stride() else t.numel() * t.element_size()
                              for t in tensors.values())
        return out


def traffic(mode: str, dynamic: bool, sublayers: int, positions: int, n: int = 4, d: int = 768) -> int:
    """Bytes moved by ``sublayers`` hyper-connected sublayers (a bf16 cast standing for each sublayer) over
    ``positions`` positions under bf16 autocast, forward and backward, on fake tensors (nothing is computed)."""
    with FakeTensorMode(), DEVICE:
        blocks = [HyperConnection(d, n, k, dynamic=dynamic, scale_init=0.01, dropout=0.0, eps=1e-5, bias=True)
                  for k in range(sublayers)]
        x = torch.randn(positions, d, requires_grad=True)
        with kernel_mode(mode), ByteCounter() as counter:
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                state, _ = Streams(n).start(x)
                for block in blocks:
                    branch, carry = block.split(state)
                    state = block.combine(carry, branch.to(torch.bfloat16))
                out = Streams(n).finish(state, None)
            out.float().sum().backward()
    return counter.total


@pytest.mark.slow
@pytest.mark.parametrize("mode,dynamic,expected", [("triton", False, 126.8), ("triton", True, 126.6),
                                                   ("reference", False, 434.0), ("reference", True, 1757.9)])
def test_the_cost_model_figures_are_the_bytes_the_operators_move(mode, dynamic, expected):
    """docs/methods/hyper_connections.md's table: bytes per position and sublayer, in units of C = d = 768 (n = 4, fp32
    streams, bf16 sublayer outputs, forward + backward), the sublayer's own LayerNorm and cast included. Marginal
    counts (the difference of 4 and 2 sublayers, of 48 and 16 positions), so the parameters and the stack's ends,
    paid once, drop out."""
    per_sublayer = [(traffic(mode, dynamic, 4, p) - traffic(mode, dynamic, 2, p)) / 2 for p in (48, 16)]
    per_position = (per_sublayer[0] - per_sublayer[1]) / 32
    assert per_position / 768 == pytest.approx(expected, abs=0.1)
