"""Predictive Attention's map pipeline (src/interlayer/kernels/predictive_maps.py): the Triton kernels against the
reference, the attention output, the mixed logits and every gradient, under Triton's interpreter on the CPU.

On a GPU both paths multiply in exact fp32 here (TF32 off for cuDNN and the kernels alike): two TF32 implementations
round a pre-activation near zero to opposite signs, and a ReLU then passes a gradient on one path that it stops on
the other (the first H200 run failed five tests so). The TF32 products users get are tested away from those kinks.
"""
from typing import Iterator

import pytest
import torch

from helpers.kernels import FP32, HALF, MODEL, half_tolerance, on_device  # noqa: F401 (on_device: the fixture)
from interlayer.kernels import predictive_maps as pm
from interlayer.kernels.dispatch import kernel_mode
from interlayer.kernels.predictive_cnn import hidden_cells

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("on_device"), pytest.mark.slow]  # CUDA on a GPU, else the interpreter: slow


@pytest.fixture(autouse=True)
def _exact_fp32() -> Iterator[None]:
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _case(*, dtype=torch.float32, b=2, h=3, t=20, d=16, convs=1, seed=0):
    torch.manual_seed(seed)
    s = (2 * torch.randn(b, h, t, t)).to(dtype).requires_grad_()
    prev = (2 * torch.randn(b, h, t, t)).to(dtype).requires_grad_()
    v = torch.randn(b, t, h, d).to(dtype).transpose(1, 2).requires_grad_()
    weights = [(0.3 * torch.randn(h, h, 3, 3)).requires_grad_() for _ in range(convs)]
    biases = [(0.1 * torch.randn(h)).requires_grad_() for _ in range(convs)]
    return s, prev, v, weights, biases


def _run(fn, inputs, grads):
    out, mixed = fn()
    g = torch.autograd.grad((out, mixed), inputs, grads, allow_unused=True)
    return out, mixed, g


def _compare(*, causal, convs, padded=False, beta=None, slope=0.0, dtype=torch.float32, h=3, t=20, seed=0, b=2):
    s, prev, v, weights, biases = _case(dtype=dtype, b=b, h=h, t=t, convs=convs, seed=seed)
    pad = None
    if padded:
        pad = torch.zeros(2, t, dtype=torch.bool)
        pad[0, t - 3:] = True
        pad[1, :2] = True
    alpha = torch.tensor(0.3)
    beta_t = None if beta is None else torch.tensor(beta)
    inputs = (s, prev, v, *weights, *biases)
    torch.manual_seed(1)
    grads = (torch.randn(b, h, t, 16).to(dtype), torch.randn(b, h, t, t).to(dtype))
    if causal:  # what the next layer's backward hands back: nothing above the diagonal
        grads = (grads[0], grads[1].tril())
    if padded:
        grads[1].masked_fill_(pad[:, None, :, None] | pad[:, None, None, :], 0.0)
    with kernel_mode("triton"):
        out, mixed, g = _run(lambda: pm.predictive_attention(s, prev, v, weights, biases, alpha, beta_t, slope, causal,
                                                              pad), inputs, grads)
    ref_out, ref_mixed, ref_g = _run(lambda: pm.reference(s, prev, v, weights, biases, alpha, beta_t, slope, causal,
                                                          pad), inputs, grads)
    tol = FP32 if dtype == torch.float32 else half_tolerance(dtype)
    torch.testing.assert_close(out, ref_out, **tol)
    hidden = hidden_cells(mixed.shape, pad, causal, mixed.device)
    visible = ~hidden if hidden is not None else torch.ones_like(mixed, dtype=torch.bool)
    torch.testing.assert_close(torch.where(visible, mixed, 0), torch.where(visible, ref_mixed, 0), **tol)
    names = ["S", "A_prev", "v"] + [f"weight{i}" for i in range(convs)] + [f"bias{i}" for i in range(convs)]
    for name, a, b in zip(names, g, ref_g):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a / scale, b / scale, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("convs", [0, 1, 2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_every_depth_of_cnn_causal_and_centred(convs, causal) -> None:
    _compare(causal=causal, convs=convs)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_rows_and_columns(causal) -> None:
    _compare(causal=causal, convs=2, padded=True)


@pytest.mark.parametrize("convs", [0, 1, 2])
def test_evolving_attention_beta_and_leaky_relu(convs) -> None:
    _compare(causal=True, convs=convs, beta=0.4, slope=0.01)


@pytest.mark.parametrize("dtype", HALF)
def test_odd_sizes_and_many_heads_in_half_precision(dtype) -> None:
    _compare(causal=True, convs=1, dtype=dtype, h=12, t=37)


def test_nonfinite_previous_logits_read_as_zero() -> None:
    s, prev, v, weights, biases = _case(convs=1)
    with torch.no_grad():
        prev[0, 0, 5, 3] = float("inf")
        prev[1, 2, 7, 7] = float("nan")
    args = (weights, biases, torch.tensor(0.3), None, 0.0, True, None)
    with kernel_mode("triton"):
        out, mixed = pm.predictive_attention(s, prev, v, *args)
    ref_out, _ = pm.reference(s, prev, v, *args)
    torch.testing.assert_close(out, ref_out, **FP32)


@pytest.mark.parametrize("convs", [0, 1])
def test_above_a_causal_diagonal_the_mixed_map_is_unread_and_its_gradients_are_zero(convs, monkeypatch) -> None:
    """The kernels write M on and below a causal diagonal only (nothing reads it above: the attention masks it, the
    next layer's CNN reads it as zero), whatever memory they were given: a NaN-filled buffer changes neither the
    next layer's outputs nor any gradient, and the layer's logits get a zero gradient there (a matrix product reads
    that gradient whole)."""
    t = 100  # more than one block of 64 columns: blocks wholly above the diagonal, not only the diagonal's
    s, prev, v, weights, biases = _case(convs=convs, t=t, b=1, h=2)
    real, real_empty = torch.empty_like, torch.empty
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real(t, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(
        float("nan") if kw.get("dtype", torch.get_default_dtype()).is_floating_point else 0))
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    args = (weights, biases, torch.tensor(0.3), None, 0.0, True, None)
    with kernel_mode("triton"):
        out, mixed = pm.predictive_attention(s, prev, v, *args)
        assert torch.isfinite(out).all() and torch.isfinite(mixed[..., ~upper]).all()
        # the next layer on the map as the kernels left it, and on the same map with zeros above the diagonal
        nxt = [pm.predictive_attention(s.detach(), m, v.detach(), *args)
               for m in (mixed, mixed.masked_fill(upper, 0.0))]
    torch.testing.assert_close(nxt[0][0], nxt[1][0], rtol=0, atol=0)
    torch.testing.assert_close(nxt[0][1][..., ~upper], nxt[1][1][..., ~upper], rtol=0, atol=0)
    grad_s, grad_prev = torch.autograd.grad(nxt[0][0].sum() + nxt[0][1][..., ~upper].sum() + out.sum(), (s, prev))
    assert torch.isfinite(grad_s).all() and torch.isfinite(grad_prev).all()
    assert torch.equal(grad_s[..., upper], torch.zeros_like(grad_s[..., upper]))
    assert torch.equal(grad_prev[..., upper], torch.zeros_like(grad_prev[..., upper]))  # a product may read it whole
    assert (grad_s[..., ~upper] != 0).all()


@pytest.mark.parametrize("causal", [True, False])
def test_word_pairs_and_unmasked_rows_of_a_wide_16_bit_map(causal) -> None:
    """An even-width 16-bit map is read as 32-bit words (each row's columns at the taps' offsets from word halves),
    and a map wider than two blocks has rows that no mask touches: both against the reference. (Two heads: the
    heads' mixing is every other test's; under the interpreter a third head costs the suite 20 s.)"""
    _compare(causal=causal, convs=1, dtype=torch.float16, h=2, t=136, b=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 products run on a GPU's tensor cores")
def test_tf32_products_on_a_gpu_agree_away_from_the_activation_kinks() -> None:
    """What users get (cuDNN's and the kernels' TF32): biases of one unit with small weights keep every
    pre-activation a unit from zero, on both sides, so the two roundings cannot disagree on a ReLU."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    b, h, t = 2, 12, 200
    s = (2 * torch.randn(b, h, t, t)).to(torch.bfloat16).requires_grad_()
    prev = (2 * torch.randn(b, h, t, t)).to(torch.bfloat16).requires_grad_()
    v = torch.randn(b, h, t, 64).to(torch.bfloat16).requires_grad_()
    weights = [(0.01 * torch.randn(h, h, 3, 3)).requires_grad_()]
    biases = [torch.where(torch.arange(h) % 2 == 0, 1.0, -1.0).requires_grad_()]
    args = (weights, biases, torch.tensor(0.3), None, 0.0, True, None)
    torch.manual_seed(1)
    grads = (torch.randn(b, h, t, 64).to(torch.bfloat16), torch.randn(b, h, t, t).to(torch.bfloat16).tril())
    inputs = (s, prev, v, *weights, *biases)
    with kernel_mode("triton"):
        out, mixed, g = _run(lambda: pm.predictive_attention(s, prev, v, *args), inputs, grads)
    ref_out, ref_mixed, ref_g = _run(lambda: pm.reference(s, prev, v, *args), inputs, grads)
    tol = half_tolerance(torch.bfloat16)
    lower = torch.ones(t, t, dtype=torch.bool).tril()
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(mixed[..., lower], ref_mixed[..., lower], **tol)
    for name, a, r in zip(["S", "A_prev", "v", "weight", "bias"], g, ref_g):
        scale = max(1.0, float(r.abs().max()))
        torch.testing.assert_close(a / scale, r / scale, **tol, msg=lambda m: f"{name}: {m}")


def test_pa_fuses_where_its_kernels_run_and_only_there() -> None:
    """PredictiveMixer.fuses, the core's question (LogitMixer.fuses): True where the kernels take the maps and the
    convolution's causality is the attention's; False on the reference path, with ``fast`` off or a mismatch."""
    from interlayer.methods.predictive import PredictiveMixer

    mixer = PredictiveMixer(3, alpha=0.3, conv_layers=1, kernel_size=3, init="random", causal_kernel=True)
    s, prev, v, _, _ = _case()
    with kernel_mode("triton"):
        assert mixer.fuses(prev, v, causal=True)
        assert not mixer.fuses(prev, v, causal=False)
        mixer.fast = False
        assert not mixer.fuses(prev, v, causal=True)
    mixer.fast = True
    with kernel_mode("reference"):
        assert not mixer.fuses(prev, v, causal=True)


# -- whole models: the method's fast path against its reference path ------------------------------------------
def _model_grads(model, run, mode):
    model.zero_grad(set_to_none=True)
    with kernel_mode(mode):
        loss = run(model)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], **FP32)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], **MODEL, msg=lambda m: f"{name}: {m}")


def test_a_causal_pa_language_model_takes_the_kernels_and_equals_its_reference_path(monkeypatch) -> None:
    from interlayer import create_model
    from interlayer.kernels import logits_attention

    torch.manual_seed(0)
    model = create_model("gpt_shakespeare_char", d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dropout=0.0,
                         attn_dropout=0.0, src_vocab_size=40, max_positions=24,
                         predictive={"conv_layers": 2, "alpha": 0.3, "alpha_warmup_steps": 4})
    for _ in range(2):  # mid-ramp: alpha is a device tensor, 0.15
        model.encoder.layers[1].self_attn.logit_mixer.optimizer_step_done()
        model.encoder.layers[2].self_attn.logit_mixer.optimizer_step_done()
    ids = torch.randint(0, 40, (2, 21))
    calls = {"maps": 0, "logits": 0}
    for module, name, key in ((pm, "forward_op", "maps"), (logits_attention, "_forward_op", "logits")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, key=key: calls.__setitem__(key, calls[key] + 1)
                            or real(*a))

    def run(m):
        return m(input_ids=ids, labels=ids).loss

    reference = _model_grads(model, run, "reference")
    assert calls == {"maps": 0, "logits": 0}
    fast = _model_grads(model, run, "triton")
    assert calls == {"maps": 2, "logits": 1}  # layer 0 hands its logits on; layers 1 and 2 predict
    _assert_same(fast, reference)


def test_a_padded_pa_encoder_with_relative_positions_takes_the_kernels() -> None:
    from interlayer import create_model

    torch.manual_seed(0)
    model = create_model("pa_transformer_text", d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dropout=0.0,
                         attn_dropout=0.0, embed_dropout=0.0, src_vocab_size=50, num_classes=3)
    tokens = torch.randint(4, 50, (3, 19))
    tokens[0, 12:] = model.config.pad_id
    labels = torch.tensor([0, 2, 1])

    def run(m):
        return torch.nn.functional.cross_entropy(m(tokens).logits, labels)

    _assert_same(_model_grads(model, run, "triton"), _model_grads(model, run, "reference"))


def test_the_fast_path_compiles_without_graph_breaks() -> None:
    from interlayer import create_model

    model = create_model("gpt_shakespeare_char", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dropout=0.0,
                         attn_dropout=0.0, src_vocab_size=40, max_positions=20, predictive={})
    ids = torch.randint(0, 40, (2, 17))
    with kernel_mode("triton"):
        explained = torch._dynamo.explain(lambda x: model(input_ids=x, labels=x).loss)(ids)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_maps_too_large_for_32_bit_offsets_or_too_many_heads_take_the_reference() -> None:
    weight = [torch.empty(16, 16, 3, 3, device="meta")]
    assert pm.covers(torch.empty(2, 16, 8192, 8192, device="meta"), weight)  # 2^30 cells a batch element
    assert not pm.covers(torch.empty(1, 16, 16384, 16384, device="meta"), weight)  # 2^32: past 32-bit offsets
    assert not pm.covers(torch.empty(1, 17, 64, 64, device="meta"), [torch.empty(17, 17, 3, 3, device="meta")])
