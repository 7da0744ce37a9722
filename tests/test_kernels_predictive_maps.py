"""Predictive Attention's map pipeline (src/interlayer/kernels/predictive_maps.py): the Triton kernels against the
reference, the attention output, the mixed logits and every gradient, under Triton's interpreter on the CPU."""
import pytest
import torch

from helpers.kernels import FP32, HALF, MODEL, half_tolerance, on_device  # noqa: F401 (on_device: the fixture)
from interlayer.kernels import predictive_maps as pm
from interlayer.kernels.dispatch import kernel_mode

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("on_device")  # CUDA on a GPU machine, else the interpreter


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


def _compare(*, causal, convs, padded=False, beta=None, slope=0.0, dtype=torch.float32, h=3, t=20, seed=0):
    s, prev, v, weights, biases = _case(dtype=dtype, h=h, t=t, convs=convs, seed=seed)
    pad = None
    if padded:
        pad = torch.zeros(2, t, dtype=torch.bool)
        pad[0, t - 3:] = True
        pad[1, :2] = True
    alpha = torch.tensor(0.3)
    beta_t = None if beta is None else torch.tensor(beta)
    inputs = (s, prev, v, *weights, *biases)
    torch.manual_seed(1)
    grads = (torch.randn(2, h, t, 16).to(dtype), torch.randn(2, h, t, t).to(dtype))
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
    hidden = pm.hidden_cells(mixed.shape, pad, causal, mixed.device)
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
def test_a_causal_mixed_map_is_zero_above_the_diagonal_never_uninitialised_memory(convs, monkeypatch) -> None:
    """Nothing reads M above a causal diagonal, but it is the next layer's input and what a user may inspect: the
    kernel writes zeros there (whole tiles it skips included), whatever memory it was given, and S's gradient there
    is zero to match."""
    s, prev, v, weights, biases = _case(convs=convs, t=37)
    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real(t, **kw).fill_(float("nan")))
    with kernel_mode("triton"):
        out, mixed = pm.predictive_attention(s, prev, v, weights, biases, torch.tensor(0.3), None, 0.0, True, None)
    upper = torch.ones(37, 37, dtype=torch.bool).triu(1)
    assert torch.equal(mixed.detach()[..., upper], torch.zeros_like(mixed.detach()[..., upper]))
    assert torch.isfinite(mixed).all()
    grad_s, = torch.autograd.grad(mixed, s, torch.ones_like(mixed))
    assert torch.equal(grad_s[..., upper], torch.zeros_like(grad_s[..., upper]))
    assert (grad_s[..., ~upper] != 0).all()


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


def test_maps_too_large_for_32_bit_offsets_take_the_reference() -> None:
    weight = [torch.empty(64, 64, 3, 3, device="meta")]
    assert pm.covers(torch.empty(2, 64, 4096, 4096, device="meta"), weight)  # 2^30 cells a batch element
    assert not pm.covers(torch.empty(1, 64, 8192, 8192, device="meta"), weight)  # 2^32: past 32-bit offsets
