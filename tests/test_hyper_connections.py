"""Hyper-connections (Zhu et al., ICLR 2025): n=1 static is the pre-norm model bit for bit, the static and dynamic
equations (Eq. 3-5, 10-13) against a loop written from them with random weights, causal and cache-exact in the LM,
the parameter count, and the refusals (post-LN, Multi-Pass, DenseFormer)."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from helpers.hyper_connections import randomise, stream_dtype_error
from helpers.lm import TINY as LM_FIELDS
from helpers.lm import assert_cache_matches, assert_causal, assert_seq2seq_cache_matches
from helpers.lm import lm as tiny_lm
from interlayer import ConfigError, count_madds, create_model

TINY = {**LM_FIELDS, "enc_layers": 3}
SMALL = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dec_layers=2, src_vocab_size=50, dropout=0.0,
             attn_dropout=0.0, norm_first=True)


def lm(**overrides):
    """The shared tiny LM (helpers.lm) at this file's depth."""
    return tiny_lm(**{"enc_layers": TINY["enc_layers"], **overrides})


def reference_hc(hc, H, sublayer):
    """One sublayer from the equations, with the module's parameters but none of its code."""
    n = H.shape[-2]
    a_m, a_r, b = hc.static_alpha[:, 0], hc.static_alpha[:, 1:], hc.static_beta
    if hc.dynamic:
        norm = hc.stream_norm
        h_bar = F.layer_norm(H, norm.normalized_shape, norm.weight, norm.bias, norm.eps)  # Eq. 10
        w = hc.dynamic_weight
        w_m, w_r, w_beta = w[:, 0], w[:, 1:n + 1], w[:, n + 1]
        b = hc.beta_scale * torch.tanh(h_bar @ w_beta) + b  # Eq. 11: (..., n)
        a_m = hc.alpha_scale * torch.tanh(h_bar @ w_m) + a_m  # Eq. 12: (..., n)
        a_r = hc.alpha_scale * torch.tanh(h_bar @ w_r) + a_r  # Eq. 13: (..., n, n)
        h0 = torch.einsum("...j,...jd->...d", a_m, H)  # Eq. 3: A_m^T H
        kept = torch.einsum("...jk,...jd->...kd", a_r, H)  # Eq. 4: A_r^T H
    else:
        h0 = torch.einsum("j,...jd->...d", a_m, H)
        kept = torch.einsum("jk,...jd->...kd", a_r, H)
    out = sublayer(hc.norm(h0))  # T includes the sublayer's pre-norm
    return b.unsqueeze(-1) * out.unsqueeze(-2) + kept  # Eq. 5: B^T T(h_0)^T + H'


def reference_encoder(stack, x, n, causal, padding=None):
    H = torch.stack([x] * n, dim=-2)  # the embedding copied into n streams
    for layer in stack.layers:
        H = reference_hc(layer.attn_block, H, lambda h: layer.self_attn(h, key_padding_mask=padding,
                                                                          causal=causal)[0])
        H = reference_hc(layer.ffn_block, H, layer.ffn)
    return stack.final_norm(H.sum(-2))  # summed, then the final norm


def test_rate_one_static_is_the_pre_norm_model_bit_for_bit():
    tokens = torch.randint(0, 40, (2, 9))
    assert torch.equal(lm(hyper_connections={"rate": 1, "dynamic": False})(tokens).logits, lm()(tokens).logits)
    for arch, extra in (("encoder_decoder", {}), ("encoder_classifier", {"num_classes": 3})):
        models = []
        for section in ({"hyper_connections": {"rate": 1, "dynamic": False}}, {}):
            torch.manual_seed(0)
            models.append(create_model("transformer_small", arch=arch, **SMALL, **extra, **section).eval())
        src = torch.randint(4, 50, (2, 7))
        outs = [m(src, src) if arch == "encoder_decoder" else m(src) for m in models]
        assert torch.equal(outs[0].logits, outs[1].logits)


@pytest.mark.parametrize("dynamic", [False, True])
def test_at_initialisation_every_stream_is_the_pre_norm_state(dynamic):
    """Eq. 14: with B = 1 and A_r = I every stream carries h + sum of outputs; the sum is n times the plain state,
    which the final LayerNorm undoes (up to its eps)."""
    tokens = torch.randint(0, 40, (2, 9))
    model = lm(hyper_connections={"rate": 4, "dynamic": dynamic})
    plain = lm()
    assert torch.allclose(model(tokens).encoder.states[-1], 4 * plain(tokens).encoder.states[-1], atol=1e-5)
    assert torch.allclose(model(tokens).logits, plain(tokens).logits, atol=1e-4)


@pytest.mark.parametrize("rate,dynamic", [(4, True), (3, True), (4, False), (2, False)])
def test_lm_matches_the_equations_with_random_weights(rate, dynamic):
    model = lm(hyper_connections={"rate": rate, "dynamic": dynamic})
    randomise(model)
    tokens = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        expected = model.lm_head(reference_encoder(model.encoder, model.encoder.embed(tokens), rate, causal=True))
        assert torch.allclose(model(tokens).logits, expected, atol=1e-4)


def test_the_final_norm_reads_the_sum_of_the_streams():
    """Sec. 2.1 / Algorithm 1: the streams are summed, not averaged, before the final norm. The logits cannot show
    it (a LayerNorm undoes the scale up to its eps), so the final norm's input is compared with the reference sum."""
    model = lm(hyper_connections={"rate": 4})
    randomise(model)
    read = []
    model.encoder.final_norm.register_forward_pre_hook(lambda module, args: read.append(args[0]))
    tokens = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        model(tokens)
        x = model.encoder.embed(tokens)
        H = torch.stack([x] * 4, dim=-2)
        for layer in model.encoder.layers:
            H = reference_hc(layer.attn_block, H, lambda h: layer.self_attn(h, causal=True)[0])
            H = reference_hc(layer.ffn_block, H, layer.ffn)
    assert (read[0] - H.sum(-2)).norm() < 1e-5 * H.sum(-2).norm()  # relative: the random streams grow large


def test_classifier_encoder_matches_the_equations_with_padding():
    torch.manual_seed(0)
    model = create_model("transformer_small", arch="encoder_classifier", num_classes=3, **SMALL,
                         hyper_connections={"rate": 3}).eval()
    randomise(model)
    src = torch.randint(4, 50, (2, 7))
    src[1, 5:] = 0
    with torch.no_grad():
        enc = model.encoder(src)
        padding = src.eq(0)
        expected = reference_encoder(model.encoder, model.encoder.embed(src), 3, causal=False, padding=padding)
        assert torch.allclose(enc.hidden[~padding], expected[~padding], atol=1e-4)


def test_the_one_hot_input_follows_the_sublayer_index():
    """Eq. 14: A_m = e_{k mod n}, k counting the attention and FFN sublayers (or the layers, as an option)."""
    layers = lm(hyper_connections={"rate": 4}).encoder.layers
    picks = [int(block.static_alpha[:, 0].argmax()) for layer in layers for block in (layer.attn_block,
                                                                                       layer.ffn_block)]
    assert picks == [0, 1, 2, 3, 0, 1]
    layers = lm(hyper_connections={"rate": 4, "input_index": "layer"}).encoder.layers
    assert [int(layer.ffn_block.static_alpha[:, 0].argmax()) for layer in layers] == [0, 1, 2]


@pytest.mark.parametrize("dynamic", [False, True])
def test_lm_is_causal_and_the_cache_gives_the_full_forward(dynamic):
    model = lm(hyper_connections={"rate": 4, "dynamic": dynamic})
    randomise(model)
    with torch.no_grad():
        assert_causal(model)
        assert_cache_matches(model)


def test_encoder_decoder_incremental_decoding_gives_the_full_forward():
    torch.manual_seed(0)
    model = create_model("transformer_small", arch="encoder_decoder", **SMALL, hyper_connections={}).eval()
    randomise(model)
    assert_seq2seq_cache_matches(model)
    assert model.decoder.layers[0].cross_block.dynamic


@pytest.mark.parametrize("rate,dynamic", [(1, False), (4, False), (4, True), (2, True)])
def test_parameter_count_is_the_papers(rate, dynamic):
    """App. B, Eq. 21-25: n (n + 2) per hyper-connection (B, A_m, A_r), 2 L of them; DHC adds d (n + 2) (W_beta,
    W_m, W_r), s_alpha, s_beta and the stream norm (no bias in this preset: d)."""
    d, sublayers = TINY["d_model"], 2 * TINY["enc_layers"]
    model = lm(hyper_connections={"rate": rate, "dynamic": dynamic})
    added = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in lm().parameters())
    per_sublayer = rate * (rate + 2) + ((d * (rate + 2) + 2 + d) if dynamic else 0)
    assert added == sublayers * per_sublayer


@pytest.mark.parametrize("dynamic", [False, True])
def test_madds_count_the_width_connection_and_dynamic_projection_as_the_flop_counter_does(dynamic):
    """Per position and sublayer: ``[A_m | A_r]^T H``, n (n+1) d, and with DHC ``norm(H) W``, n d (n+2)."""
    from torch.utils.flop_counter import FlopCounterMode
    model = lm(hyper_connections={"rate": 4, "dynamic": dynamic}, attn_impl="eager")
    tokens = torch.randint(0, 40, (1, 9))
    with FlopCounterMode(display=False) as counter:
        model(tokens)
    assert counter.get_total_flops() == 2 * count_madds(model, 9)
    per_position = 4 * 5 * 32 + (4 * 32 * 6 if dynamic else 0)
    added = count_madds(model, 9) - count_madds(lm(attn_impl="eager"), 9)
    assert added == 2 * TINY["enc_layers"] * 9 * per_position


def test_static_matrices_get_no_weight_decay_and_the_dynamic_weights_do():
    """Sec. 4 "Implementation": no weight decay on the static component, the usual on the dynamic one."""
    from interlayer.training.config import TrainConfig
    from interlayer.training.optimizer import parameter_groups
    model = lm(hyper_connections={"rate": 4})
    names = {id(p): n for n, p in model.named_parameters()}
    groups = parameter_groups(model, TrainConfig(optimizer="adamw", weight_decay=0.1))
    spared = {names[id(p)].rsplit(".", 1)[-1] for g in groups if g.get("weight_decay") == 0.0 for p in g["params"]}
    assert spared == {"static_alpha", "static_beta"}
    assert len(parameter_groups(lm(), TrainConfig(optimizer="adamw", weight_decay=0.1))) == 1


def test_refusals_name_the_reason():
    with pytest.raises(ConfigError, match="norm_first=True"):
        lm(hyper_connections={}, norm_first=False)
    with pytest.raises(ConfigError, match=r"hyper_connections\.rate=0"):
        lm(hyper_connections={"rate": 0})
    with pytest.raises(ConfigError, match="multipass"):
        lm(hyper_connections={}, multipass={})
    with pytest.raises(ConfigError, match="denseformer"):
        lm(hyper_connections={}, denseformer={})


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    model = lm(hyper_connections={"rate": 4}).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, 40, (2, 9)))
    assert explanation.graph_break_count == 0, [str(r.reason) for r in explanation.break_reasons]


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("stream_dtype,low,high", [("bfloat16", 1e-4, 3e-2), ("float16", 1e-5, 5e-3)])
def test_16_bit_streams_are_stored_so_and_stay_close_to_float32(dynamic, stream_dtype, low, high):
    """``stream_dtype`` (off by default) keeps the n streams in 16 bits: the state is in that dtype, and the logits
    differ from float32 streams' by about the dtype's rounding at each sublayer (measured on this tiny model: about
    0.6% bfloat16, 0.1% float16, docs/methods/hyper_connections.md): more than nothing (the option is not
    ignored), less than the bound (nor broken); the gradients stay finite."""
    error, states_dtype, finite = stream_dtype_error("hyper_connections", {"dynamic": dynamic}, stream_dtype)
    assert states_dtype == getattr(torch, stream_dtype) and finite
    assert low < error < high, error
