"""Conv-Transformer / PA-Conv-Transformer block (PA Sec. 3.5, App. B.1): half attention, half convolution."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
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
from interlayer.core.attention import MultiHeadAttention
from interlayer.methods.conv_branch import AttentionConvBlock
from interlayer.methods.predictive import PredictiveMixer

BASE: dict[str, Any] = dict(arch="encoder_classifier", src_vocab_size=50, d_model=32, n_heads=8, d_ffn=64,
                            enc_layers=2, positions="relative", rel_max_distance=4, max_positions=16, num_classes=3,
                            pooling="mean", dropout=0.0, attn_impl="eager")
T = 8


def build(**fields: Any) -> nn.Module:
    return create_model(dict(BASE, **fields)).eval()


def block(model: nn.Module, index: int = 0) -> AttentionConvBlock:
    return model.encoder.layers[index].self_attn


def test_block_structure_half_attention_half_conv() -> None:
    blk = block(build(conv_branch={}))
    assert isinstance(blk, AttentionConvBlock)
    att, conv = blk.attention, blk.conv.conv
    assert (att.q_proj.in_features, att.q_proj.out_features, att.k_proj.in_features) == (32, 16, 32)
    assert (att.v_proj.in_features, att.v_proj.out_features, att.n_heads) == (32, 16, 4)
    assert isinstance(att.out_proj, nn.Identity) and blk.proj is None
    assert isinstance(conv, nn.Conv1d) and conv.weight.shape == (16, 32, 3) and conv.padding == (1,)
    assert att.relative.embeddings.shape == (9, 4)


def test_output_is_concat_of_attention_half_and_relu_conv() -> None:
    blk = block(build(conv_branch={}))
    x = torch.randn(2, T, 32)
    out, _ = blk(x)
    attended, _ = blk.attention(x)
    convolved = F.relu(F.conv1d(x.transpose(1, 2), blk.conv.conv.weight, blk.conv.conv.bias, padding=1))
    torch.testing.assert_close(out, torch.cat([attended, convolved.transpose(1, 2)], dim=-1))
    assert (out[..., 16:] >= 0).all() and (out[..., 16:] == 0).any()


@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_activation_option(activation: str) -> None:
    blk = block(build(conv_branch={"activation": activation}))
    x = torch.randn(2, T, 32)
    raw = blk.conv(x)
    expected = raw if activation == "none" else F.gelu(raw)
    torch.testing.assert_close(blk(x)[0][..., 16:], expected)
    assert (blk(x)[0][..., 16:] < 0).any()


def test_out_proj_options_and_parameter_counts() -> None:
    plain = count_parameters(build())
    none, attention, joint = (build(conv_branch={"out_proj": p}) for p in ("none", "attention", "joint"))
    d, h = 32, 16
    per_layer = (4 * d * d + 4 * d) - (3 * (d * h + h) + (3 * d * h + h))  # Table 1's saving: no W^O at all
    assert plain - count_parameters(none) == 2 * per_layer
    assert count_parameters(attention) - count_parameters(none) == 2 * (h * h + h)
    assert isinstance(block(attention).attention.out_proj, nn.Linear)
    assert count_parameters(joint) - count_parameters(none) == 2 * (d * d + d)
    blk = block(joint)
    x = torch.randn(2, T, 32)
    inner = torch.cat([blk.attention(x)[0], F.relu(blk.conv(x))], dim=-1)
    torch.testing.assert_close(blk(x)[0], blk.proj(inner))


def test_attn_dim_heads_and_kernel_size() -> None:
    blk = block(build(conv_branch={"attn_dim": 8, "heads": 2, "kernel_size": 5}))
    assert blk.attention.q_proj.out_features == 8 and blk.attention.n_heads == 2
    assert blk.conv.conv.weight.shape == (24, 32, 5)
    x = torch.zeros(1, 9, 32)
    y = x.clone()
    y[0, 4] = torch.randn(32)
    changed = (blk.conv(y) - blk.conv(x)).abs().sum(-1)[0] > 0
    assert changed.tolist() == [False, False, True, True, True, True, True, False, False]


def test_qk_dim_scales_with_the_attention_half() -> None:
    blk = block(build(qk_dim=64, conv_branch={}))
    assert blk.attention.q_proj.out_features == 32 and blk.attention.v_proj.out_features == 16
    assert torch.isfinite(build(qk_dim=64, conv_branch={})(torch.randint(1, 50, (2, T))).logits).all()


def test_two_d_convolution_over_the_grid_excludes_the_prefix() -> None:
    model = build(positions="relative_2d", grid_height=3, grid_width=3, pooling="cls", conv_branch={})
    blk = block(model)
    assert isinstance(blk.conv.conv, nn.Conv2d) and blk.conv.conv.weight.shape == (16, 32, 3, 3)
    x = torch.randn(1, 10, 32)  # CLS + 3x3 grid
    y = x.clone()
    y[0, 1 + 2] = torch.randn(32)  # grid cell (0, 2)
    assert torch.equal(blk.conv(x)[0, 0], torch.zeros(16))  # CLS has no grid cell
    changed = ((blk.conv(y) - blk.conv(x)).abs().sum(-1)[0, 1:] > 0).view(3, 3)
    # cell (0,2) touches (0,1),(0,2),(1,1),(1,2); cell (1,0) follows it in raster order but is not a neighbour
    assert changed.tolist() == [[False, True, True], [False, True, True], [False, False, False]]
    assert torch.isfinite(model(inputs_embeds=x).logits).all()


def test_pa_conv_transformer_predicts_the_attention_half() -> None:
    conv_only = build(enc_layers=3, conv_branch={})
    pa = build(enc_layers=3, conv_branch={}, predictive={"alpha": 0.0})
    missing, unexpected = pa.load_state_dict(conv_only.state_dict(), strict=False)
    assert not unexpected and all("logit_mixer" in k for k in missing)
    mixer = block(pa, 1).attention.logit_mixer
    assert isinstance(mixer, PredictiveMixer) and mixer.convs[0].weight.shape == (4, 4, 3, 3)
    assert block(pa, 1).wants_prev_logits and not block(pa, 0).wants_prev_logits
    x = torch.randint(1, 50, (2, T))
    assert torch.equal(pa(x).logits, conv_only(x).logits)
    mixed = build(enc_layers=3, conv_branch={}, predictive={"alpha": 0.5})
    mixed.load_state_dict(pa.state_dict())
    att = mixed(x, need_intermediates=True).encoder.attentions
    assert att[1].logits.shape == (2, 4, T, T) and set(att[2].extras) == {"predicted", "self"}
    assert not torch.allclose(mixed(x).logits, conv_only(x).logits)


def test_projection_attributes_reach_the_attention_half() -> None:
    model = build(conv_branch={})
    first, second = block(model, 0), block(model, 1)
    assert first.q_proj is first.attention.q_proj and first.out_proj is first.attention.out_proj
    first.k_proj = second.attention.q_proj
    assert first.attention.k_proj is second.attention.q_proj and "k_proj" not in first._modules


def test_block_rejects_decoder_style_calls() -> None:
    blk = block(build(conv_branch={}))
    x = torch.randn(1, T, 32)
    with pytest.raises(ValueError, match="encoder self-attention only"):
        blk(x, causal=True)
    with pytest.raises(ValueError, match="encoder self-attention only"):
        blk(x, x)


def test_encoder_decoder_keeps_a_plain_decoder() -> None:
    model = create_model(dict(arch="encoder_decoder", src_vocab_size=50, d_model=32, n_heads=4, d_ffn=32,
                              enc_layers=2, dec_layers=2, dropout=0.0, conv_branch={})).eval()
    assert isinstance(model.encoder.layers[0].self_attn, AttentionConvBlock)
    assert all(type(layer.self_attn) is MultiHeadAttention for layer in model.decoder.layers)
    assert torch.isfinite(model(torch.randint(1, 50, (2, T)), torch.randint(1, 50, (2, 5))).logits).all()


@pytest.mark.parametrize("fields", [
    dict(conv_branch={}), dict(conv_branch={"out_proj": "attention", "kernel_size": 5}),
    dict(conv_branch={"out_proj": "joint"}, predictive={"conv_layers": 2}),
    dict(positions="relative_2d", grid_height=3, grid_width=3, pooling="cls", conv_branch={}, predictive={})])
def test_madds_match_the_flop_counter(fields: dict) -> None:
    model = build(**fields)
    t = 10 if fields.get("positions") == "relative_2d" else T
    x = torch.randint(1, 50, (1, t))
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert counter.get_total_flops() == 2 * count_madds(model, t)


@pytest.mark.parametrize("section,extra,key", [
    ({"heads": 3}, {}, "conv_branch.heads"), ({"heads": 0}, {}, "conv_branch.heads"),
    ({"attn_dim": 32}, {}, "conv_branch.attn_dim"), ({"attn_dim": 0}, {}, "conv_branch.attn_dim"),
    ({}, {"d_model": 33, "n_heads": 1}, "conv_branch.attn_dim"), ({"kernel_size": 2}, {}, "conv_branch.kernel_size"),
    ({"sides": ["decoder"]}, {}, "conv_branch.sides"), ({"sides": []}, {}, "conv_branch.sides"),
    ({"activation": "tanh"}, {}, "conv_branch.activation"), ({"out_proj": "both"}, {}, "conv_branch.out_proj"),
    ({"heads": 8}, {"qk_dim": 40}, "qk_dim"), ({}, {"grid_height": 3}, "grid_width")])
def test_invalid_settings_name_the_key(section: dict, extra: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(**extra, conv_branch=section)


def test_presets() -> None:
    conv, pa_conv = get_config("conv_transformer_text"), get_config("pa_conv_transformer_text")
    assert conv.conv_branch.heads == 4 and conv.predictive is None and conv.d_model == 256
    assert pa_conv.conv_branch.kernel_size == 3 and pa_conv.predictive.alpha == 0.1


def test_checkpoint_round_trip(tmp_path) -> None:
    model = build(conv_branch={"out_proj": "joint"}, predictive={"alpha": 0.5})
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    x = torch.randint(1, 50, (2, T))
    assert torch.equal(loaded(x).logits, model(x).logits)
