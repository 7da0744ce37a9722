"""Predictive Attention (PA Sec. 3.3, Eq. 4, Table 5): every option must visibly change the model."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from interlayer import (ConfigError, count_madds, count_parameters, create_model, get_config, load_pretrained,
                        save_pretrained)
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


def test_qk_dim_and_relative_positions_work() -> None:
    plain = build(qk_dim=48)
    pa = build(qk_dim=48, predictive={"alpha": 0.0})
    same_weights(pa, plain)
    x = tokens()
    assert torch.equal(pa(x).logits, plain(x).logits)
    mixed = build(qk_dim=48, predictive={"alpha": 0.5})
    same_weights(mixed, plain)
    assert not torch.allclose(mixed(x).logits, plain(x).logits)


def test_padded_tokens_do_not_leak() -> None:
    model = build(predictive={"alpha": 0.5, "conv_layers": 2})
    x = torch.randint(1, 50, (2, T))
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, 5:] = True
    other = x.clone()
    other[1, 5:] = torch.randint(1, 50, (3,))
    first = model(x, key_padding_mask=pad).encoder.hidden
    second = model(other, key_padding_mask=pad).encoder.hidden
    assert not torch.equal(x, other)
    torch.testing.assert_close(first[~pad], second[~pad], rtol=0, atol=0)


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


def test_all_padding_sequence_gives_no_nan_forward_or_backward() -> None:
    model = build(predictive={"alpha": 0.5})
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
    ({"sides": []}, "predictive.sides"), ({"sides": ["encoderr"]}, "predictive.sides")])
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
