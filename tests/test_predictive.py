"""Predictive Attention (PA Sec. 3.3, Eq. 4, Table 5): every option must visibly change the model."""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from interlayer import (
    ConfigError,
    count_madds,
    count_parameters,
    create_model,
    get_config,
    load_pretrained,
    save_pretrained,
)
from interlayer.methods.predictive import PredictiveMixer

BASE: dict[str, Any] = dict(arch="encoder_classifier", src_vocab_size=50, d_model=32, n_heads=4, d_ffn=64,
                            enc_layers=3, positions="relative", rel_max_distance=4, max_positions=16, num_classes=3,
                            pooling="mean", dropout=0.0, attn_impl="eager")
T = 8


def build(**fields: Any) -> torch.nn.Module:
    return create_model(dict(BASE, **fields)).eval()


def tokens(batch: int = 2) -> torch.Tensor:
    x = torch.randint(1, 50, (batch, T))
    x[1, 5:] = 0  # padding (pad_id 0) in the second sequence
    return x


def same_weights(pa: torch.nn.Module, plain: torch.nn.Module) -> None:
    """Copy the plain model's weights into ``pa`` (the conv weights are PA's own)."""
    missing, unexpected = pa.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all("logit_mixer" in k for k in missing)


def mixers(model: torch.nn.Module) -> list:
    return [layer.self_attn.logit_mixer for layer in model.encoder.layers]


def manual_cnn(mixer: PredictiveMixer, prev: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """The CNN of Eq. 4 with padded rows/columns zeroed before the first and after every convolution."""
    cells = pad[:, None, None, :] | pad[:, None, :, None]
    x = prev.masked_fill(cells, 0.0)
    for conv in mixer.convs:
        x = F.relu(conv(x)).masked_fill(cells, 0.0)
    return x


def test_mixer_in_layers_1_to_n_minus_1_only_and_per_layer() -> None:
    model = build(predictive={})
    first, *rest = mixers(model)
    assert first is None and len(rest) == 2
    assert rest[0] is not rest[1] and rest[0].convs[0].weight is not rest[1].convs[0].weight
    assert rest[0].convs[0].weight.shape == (4, 4, 3, 3) and rest[0].alpha == 0.1
    assert count_parameters(model) - count_parameters(build()) == 2 * (4 * 4 * 9 + 4)


def test_share_conv_ties_one_module() -> None:
    model = build(predictive={"share_conv": True})
    _, one, two = mixers(model)
    assert one is two
    assert count_parameters(model) - count_parameters(build()) == 4 * 4 * 9 + 4


def test_alpha_zero_is_exactly_the_plain_model() -> None:
    plain = build()
    pa = build(predictive={"alpha": 0.0})
    same_weights(pa, plain)
    x = tokens()
    assert torch.equal(pa(x).logits, plain(x).logits)
    fused = create_model(dict(BASE, attn_impl="auto")).eval()
    fused.load_state_dict(plain.state_dict())
    torch.testing.assert_close(pa(x).logits, fused(x).logits)


def test_alpha_positive_changes_the_output_and_trains_the_cnn() -> None:
    plain = build()
    pa = build(predictive={"alpha": 0.5})
    same_weights(pa, plain)
    x = tokens()
    out = pa(x).logits
    assert not torch.allclose(out, plain(x).logits)
    out.sum().backward()
    for mixer in mixers(pa)[1:]:
        assert mixer.convs[0].weight.grad.abs().sum() > 0


def test_eq4_chain_self_predicted_and_combined() -> None:
    """extras['self'] is the layer's own logits, extras['predicted'] = ReLU(conv(masked A_prev)), logits = Eq. 4,
    and each layer predicts from the previous layer's *mixed* logits (the chain of Fig. 1(b))."""
    alpha = 0.3
    plain = build()
    pa = build(predictive={"alpha": alpha})
    same_weights(pa, plain)
    x = tokens()
    pad = x.eq(0)
    got = pa(x, need_intermediates=True).encoder.attentions
    ref = plain(x, need_intermediates=True).encoder.attentions
    assert got[0].extras == {} and torch.equal(got[0].logits, ref[0].logits)
    torch.testing.assert_close(got[1].extras["self"], ref[1].logits)  # layer 1's input is unchanged by PA
    for i in (1, 2):
        expected = manual_cnn(mixers(pa)[i], got[i - 1].logits, pad)
        torch.testing.assert_close(got[i].extras["predicted"], expected)
        torch.testing.assert_close(got[i].logits, alpha * expected + (1 - alpha) * got[i].extras["self"])
    assert (got[2].extras["predicted"] >= 0).all()  # ReLU after the conv (Sec. 3.3)


def test_res_transformer_conv_layers_zero_is_identity_cnn() -> None:
    model = build(predictive={"conv_layers": 0, "alpha": 0.4})
    assert count_parameters(model) == count_parameters(build())
    x = tokens()
    pad = x.eq(0)
    att = model(x, need_intermediates=True).encoder.attentions
    prev = att[0].logits.masked_fill(pad[:, None, None, :] | pad[:, None, :, None], 0.0)
    assert torch.equal(att[1].extras["predicted"], prev)
    torch.testing.assert_close(att[1].logits, 0.4 * prev + 0.6 * att[1].extras["self"])
    assert (att[1].extras["predicted"] < 0).any()  # no ReLU without a conv layer


@pytest.mark.parametrize("layers,kernel", [(2, 3), (1, 5)])
def test_conv_layers_and_kernel_size(layers: int, kernel: int) -> None:
    model = build(predictive={"conv_layers": layers, "kernel_size": kernel})
    mixer = mixers(model)[1]
    assert len(mixer.convs) == layers and mixer.convs[0].weight.shape == (4, 4, kernel, kernel)
    x = tokens()
    att = model(x, need_intermediates=True).encoder.attentions
    torch.testing.assert_close(att[1].extras["predicted"], manual_cnn(mixer, att[0].logits, x.eq(0)))


def test_dirac_init_predicts_relu_of_previous_logits() -> None:
    model = build(predictive={"init": "dirac"})
    assert torch.equal(mixers(model)[1].convs[0].bias, torch.zeros(4))
    x = tokens()
    pad = x.eq(0)
    att = model(x, need_intermediates=True).encoder.attentions
    prev = att[0].logits.masked_fill(pad[:, None, None, :] | pad[:, None, :, None], 0.0)
    torch.testing.assert_close(att[1].extras["predicted"], F.relu(prev))
    random = mixers(build(predictive={}))[1].convs[0]
    assert not torch.equal(random.weight, mixers(model)[1].convs[0].weight)


def test_leaky_relu_activation_is_evolving_attentions() -> None:
    """activation='leaky_relu': the prediction is LeakyReLU(conv(A_prev)) with slope 0.01 (Evolving Attention's
    att_conv), hidden cells still zero; the default stays PA's ReLU."""
    relu = build(predictive={"init": "dirac"})
    leaky = build(predictive={"init": "dirac", "activation": "leaky_relu"})
    leaky.load_state_dict(relu.state_dict())
    x = tokens()
    pad = x.eq(0)
    cells = pad[:, None, None, :] | pad[:, None, :, None]
    got = leaky(x, need_intermediates=True).encoder.attentions
    prev = got[0].logits.masked_fill(cells, 0.0)
    torch.testing.assert_close(got[1].extras["predicted"], F.leaky_relu(prev, 0.01).masked_fill(cells, 0.0))
    assert (got[1].extras["predicted"] < 0).any()
    assert (relu(x, need_intermediates=True).encoder.attentions[1].extras["predicted"] >= 0).all()


def test_qk_dim_and_relative_positions_work() -> None:
    plain = build(qk_dim=48)
    pa = build(qk_dim=48, predictive={"alpha": 0.0})
    same_weights(pa, plain)
    x = tokens()
    assert torch.equal(pa(x).logits, plain(x).logits)
    mixed = build(qk_dim=48, predictive={"alpha": 0.5})
    same_weights(mixed, plain)
    assert not torch.allclose(mixed(x).logits, plain(x).logits)


@pytest.mark.parametrize("fields", [
    dict(predictive={"alpha": 0.5, "conv_layers": 2}),
    # the PA-Conv-Transformer (PA Sec. 3.5): the padding must not leak through the convolution branch either
    dict(n_heads=8, enc_layers=2, conv_branch={}, predictive={"alpha": 0.5}),
], ids=["pa", "pa_conv_transformer"])
def test_padded_tokens_do_not_leak(fields: dict[str, Any]) -> None:
    model = build(**fields)
    x = torch.randint(1, 50, (2, T))
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, 5:] = True
    other = x.clone()
    other[1, 5:] = torch.randint(1, 50, (3,))
    first = model(x, key_padding_mask=pad).encoder.hidden
    second = model(other, key_padding_mask=pad).encoder.hidden
    assert not torch.equal(x, other)
    torch.testing.assert_close(first[~pad], second[~pad], rtol=0, atol=0)


def fixed_maps() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Current and previous logits (1 x 2 heads x 4 x 4) and a padding mask hiding the last token."""
    cur = torch.arange(32, dtype=torch.float32).reshape(1, 2, 4, 4).sin() * 3
    prev = torch.arange(32, dtype=torch.float32).reshape(1, 2, 4, 4).cos() * 2
    return cur, prev, torch.tensor([[False, False, False, True]])


def fixed_mixer(beta: Optional[float] = None) -> PredictiveMixer:
    torch.manual_seed(0)
    return PredictiveMixer(2, alpha=0.3, conv_layers=2, kernel_size=3, init="random", beta=beta)


def test_beta_unset_is_eq4_exactly() -> None:
    """Default (beta=None): Eq. 4 with A_prev as the CNN's input and the layer's own logits as the second term,
    computed by hand, to the rounding of the fast path (its convolutions run in channels-last layout and the mix is
    one ``lerp``; tests/test_fast_paths.py pins it against the op-by-op reference)."""
    cur, prev, pad = fixed_maps()
    mixer = fixed_mixer()
    cells = pad[:, None, None, :] | pad[:, None, :, None]
    x = prev.masked_fill(cells, 0.0)
    for conv in mixer.convs:
        x = F.relu(F.conv2d(x, conv.weight, conv.bias, padding=1)).masked_fill(cells, 0.0)
    out, extras = mixer(cur, prev, pad)
    torch.testing.assert_close(extras["predicted"], x, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, 0.3 * x + (1.0 - 0.3) * cur, rtol=0, atol=1e-6)


def test_beta_is_evolving_attention() -> None:
    """beta=0.25: A_in = 0.75 A_cur + 0.25 A_prev is both the CNN's input and the second term (Evolving
    Attention), written out cell by cell for one output cell and checked in full against the hand formula."""
    cur, prev, pad = fixed_maps()
    mixer = fixed_mixer(beta=0.25)
    out, extras = mixer(cur, prev, pad)
    a_in = 0.75 * cur + 0.25 * prev
    keep = torch.ones(4, 4)
    keep[3, :] = keep[:, 3] = 0.0
    first, second = mixer.convs
    hidden = torch.zeros(2, 4, 4)
    for o in range(2):
        for i in range(3):
            for j in range(3):
                acc = first.bias[o].item()
                for c in range(2):
                    for di in (-1, 0, 1):
                        for dj in (-1, 0, 1):
                            if 0 <= i + di < 4 and 0 <= j + dj < 4:
                                acc += (first.weight[o, c, di + 1, dj + 1].item() * a_in[0, c, i + di, j + dj].item()
                                        * keep[i + di, j + dj].item())
                hidden[o, i, j] = max(acc, 0.0)
    acc = second.bias[1].item() + sum(second.weight[1, c, di + 1, dj + 1].item() * hidden[c, 1 + di, 2 + dj].item()
                                      for c in range(2) for di in (-1, 0, 1) for dj in (-1, 0, 1))
    expected_cell = 0.3 * max(acc, 0.0) + 0.7 * a_in[0, 1, 1, 2].item()
    assert out[0, 1, 1, 2].item() == pytest.approx(expected_cell, rel=1e-5, abs=1e-5)
    predicted = hidden[None]  # layer 1 by hand, then layer 2:
    predicted = F.relu(F.conv2d(predicted, second.weight, second.bias, padding=1)) * keep
    torch.testing.assert_close(extras["predicted"], predicted)
    torch.testing.assert_close(out, 0.3 * predicted + 0.7 * a_in)
    plain, _ = fixed_mixer()(cur, prev, pad)
    assert (out - plain).abs().max() > 0.1


def test_beta_zero_is_evolving_attention_without_its_residual_not_eq4() -> None:
    """beta=0 feeds the CNN the layer's own logits (Evolving Attention's no-residual ablation); Eq. 4 is beta=None."""
    cur, prev, pad = fixed_maps()
    out, extras = fixed_mixer(beta=0.0)(cur, prev, pad)
    own, _ = fixed_mixer()(cur, cur, pad)
    assert torch.equal(out, own)
    assert (out - fixed_mixer()(cur, prev, pad)[0]).abs().max() > 0.1


def test_beta_chains_through_the_encoder() -> None:
    """In a model, A_prev is the previous layer's *mixed* logits (the chain of Fig. 1(b), and what
    EAAugmentedConv1d returns to the next block)."""
    beta, alpha = 0.4, 0.3
    model = build(predictive={"alpha": alpha, "beta": beta, "conv_layers": 2})
    x = tokens()
    got = model(x, need_intermediates=True).encoder.attentions
    for i in (1, 2):
        a_in = (1 - beta) * got[i].extras["self"] + beta * got[i - 1].logits
        expected = manual_cnn(mixers(model)[i], a_in, x.eq(0))
        torch.testing.assert_close(got[i].extras["predicted"], expected)
        torch.testing.assert_close(got[i].logits, alpha * expected + (1 - alpha) * a_in)
    assert get_config("pa_transformer_text").predictive.beta is None
    assert get_config("pa_transformer_text", predictive={"beta": 0.5}).predictive.beta == 0.5


@pytest.mark.parametrize("conv_layers", [0, 1, 2, 3])
@pytest.mark.parametrize("extra", [{}, {"conv_branch": {}}], ids=["pa", "pa_conv"])
def test_a_sentence_alone_equals_the_sentence_padded_in_a_batch(conv_layers: int, extra: dict) -> None:
    """The outputs for a sentence must not depend on how much padding its batch has (Table 5's 2- and 3-layer
    rows): after the first convolution padded cells hold ReLU(bias + spill from real cells), and without the
    mask after every convolution the next one carries them back into real positions. The batch puts the
    sentence beside a longer one and a shorter one, padded to 12, three more than the longest needs."""
    torch.manual_seed(1)
    model = build(predictive={"alpha": 0.5, "conv_layers": conv_layers}, **extra)
    sentence = torch.randint(1, 50, (5,))
    batch = torch.zeros(3, 12, dtype=torch.long)
    batch[0, :9] = torch.randint(1, 50, (9,))
    batch[1, :5] = sentence
    batch[2, :7] = torch.randint(1, 50, (7,))
    alone, padded = model(sentence[None]), model(batch)
    torch.testing.assert_close(padded.encoder.hidden[1, :5], alone.encoder.hidden[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.logits[1], alone.logits[0], rtol=1e-5, atol=1e-5)


def test_mixer_zeroes_padding_and_non_finite_values_before_the_conv() -> None:
    mixer = PredictiveMixer(2, alpha=0.5, conv_layers=1, kernel_size=3, init="random")
    cur, prev = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    pad = torch.tensor([[False, False, False, True]])
    poisoned = prev.clone()
    poisoned[..., 3, :] = float("nan")
    poisoned[..., :, 3] = float("-inf")
    poisoned[0, 0, 0, 0] = float("inf")
    clean = prev.clone()
    clean[..., 3, :] = 0.0
    clean[..., :, 3] = 0.0
    clean[0, 0, 0, 0] = 0.0
    out, extras = mixer(cur, poisoned, pad)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(extras["predicted"], mixer(cur, clean, pad)[1]["predicted"])


@pytest.mark.parametrize("fields", [
    dict(predictive={"alpha": 0.5}),
    dict(n_heads=8, enc_layers=2, conv_branch={}, predictive={"alpha": 0.5}),  # PA-Conv-Transformer (Sec. 3.5)
], ids=["pa", "pa_conv_transformer"])
def test_all_padding_sequence_gives_no_nan_forward_or_backward(fields: dict[str, Any]) -> None:
    model = build(**fields)
    model.train()
    x = tokens(3)
    x[2] = 0
    out = model(x)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.encoder.hidden).all()
    out.logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_mixer_computes_in_fp32_and_casts_back() -> None:
    mixer = PredictiveMixer(4, alpha=0.3, conv_layers=1, kernel_size=3, init="random")
    cur, prev = (torch.randn(2, 4, 6, 6) * 8).bfloat16(), (torch.randn(2, 4, 6, 6) * 8).bfloat16()
    out, extras = mixer(cur, prev)
    reference, _ = mixer(cur.float(), prev.float())
    assert out.dtype == torch.bfloat16 and extras["predicted"].dtype == torch.bfloat16
    assert torch.equal(out, reference.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(mixer(cur, prev)[0], out)


@pytest.mark.parametrize("section", [{}, {"conv_layers": 2, "kernel_size": 5}, {"conv_layers": 0}])
def test_madds_match_the_flop_counter(section: dict) -> None:
    model = build(predictive=section)
    x = torch.randint(1, 50, (1, T))
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert counter.get_total_flops() == 2 * count_madds(model, T)
    k = section.get("kernel_size", 3)
    assert mixers(model)[1].madds(T, T) == section.get("conv_layers", 1) * T * T * 4 * 4 * k * k


@pytest.mark.parametrize("section,key", [
    ({"alpha": -0.1}, "predictive.alpha"), ({"alpha": 1.5}, "predictive.alpha"),
    ({"conv_layers": -1}, "predictive.conv_layers"), ({"kernel_size": 4}, "predictive.kernel_size"),
    ({"kernel_size": 0}, "predictive.kernel_size"), ({"init": "zeros"}, "predictive.init"),
    ({"sides": ["decoder"]}, "predictive.sides"), ({"sides": ["encoder", "decoder"]}, "predictive.sides"),
    ({"sides": []}, "predictive.sides"), ({"sides": ["encoderr"]}, "predictive.sides"),
    ({"beta": -0.5}, "predictive.beta"), ({"beta": 1.01}, "predictive.beta"), ({"beta": "yes"}, "predictive.beta")])
def test_invalid_settings_name_the_key(section: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(predictive=section)


def test_decoder_rejection_says_why_and_single_layer_is_rejected() -> None:
    with pytest.raises(ConfigError, match="future"):
        build(predictive={"sides": ["decoder"]})
    with pytest.raises(ConfigError, match="enc_layers"):
        build(enc_layers=1, predictive={})


def test_encoder_decoder_gets_pa_in_the_encoder_only() -> None:
    model = create_model("pa_transformer_iwslt_de_en", d_model=32, n_heads=4, d_ffn=32, enc_layers=2, dec_layers=2,
                         src_vocab_size=50)
    assert isinstance(model.encoder.layers[1].self_attn.logit_mixer, PredictiveMixer)
    assert all(layer.self_attn.logit_mixer is None for layer in model.decoder.layers)
    src, tgt = torch.randint(1, 50, (2, T)), torch.randint(1, 50, (2, 5))
    assert torch.isfinite(model(src, tgt).logits).all()


def test_presets() -> None:
    pa, res = get_config("pa_transformer_text"), get_config("res_transformer_text")
    assert (pa.enc_layers, pa.d_model, pa.n_heads, pa.d_ffn, pa.positions) == (3, 256, 8, 1024, "relative")
    assert (pa.predictive.alpha, pa.predictive.conv_layers) == (0.1, 1) and res.predictive.conv_layers == 0
    iwslt = get_config("pa_transformer_iwslt_de_en")
    assert (iwslt.enc_layers, iwslt.dec_layers, iwslt.d_model, iwslt.d_ffn) == (6, 6, 160, 160)
    overridden = get_config("pa_transformer_text", predictive={"alpha": 0.5})
    assert overridden.predictive.alpha == 0.5 and overridden.predictive.conv_layers == 1


def test_checkpoint_round_trip_keeps_shared_conv(tmp_path) -> None:
    model = build(predictive={"alpha": 0.5, "share_conv": True})
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    _, one, two = mixers(loaded)
    assert one is two
    x = tokens()
    assert torch.equal(loaded(x).logits, model(x).logits)


def test_a_bidirectional_decoder_may_take_pa_and_chains_its_logits() -> None:
    """``causal_decoder=False`` (MCAN's image stack): PA in decoder self-attention 2..L, fed layer 1's logits."""
    model = create_model("pa_transformer_iwslt_de_en", d_model=32, n_heads=4, d_ffn=32, enc_layers=2, dec_layers=3,
                         src_vocab_size=50, dropout=0.0, causal_decoder=False,
                         predictive={"sides": ["decoder"], "alpha": 0.4}).eval()
    layers = list(model.decoder.layers)
    assert layers[0].self_attn.logit_mixer is None and all(layer.self_attn.logit_mixer for layer in layers[1:])
    assert all(layer.self_attn.logit_mixer is None for layer in model.encoder.layers)
    src, tgt = torch.randint(1, 50, (2, T)), torch.randint(1, 50, (2, 5))
    with torch.no_grad():
        out = model.decode(tgt, model.encode(src), need_intermediates=True)
    for prev, now, layer in zip(out.self_attentions, out.self_attentions[1:], layers[1:]):
        predicted = layer.self_attn.logit_mixer.predict(prev.logits, None)
        torch.testing.assert_close(now.logits, 0.4 * predicted + 0.6 * now.extras["self"])
    with pytest.raises(ConfigError, match="dec_layers >= 2"):
        create_model("pa_transformer_iwslt_de_en", dec_layers=1, causal_decoder=False,
                     predictive={"sides": ["decoder"]})
