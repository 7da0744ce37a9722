"""The core against torch's reference Transformer, plus decoding, padding and tying properties."""
import pytest
import torch
from torch import nn

from interlayer import create_model
from interlayer.core.attention import MultiHeadAttention


def _copy_attention(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    ref.in_proj_weight.data = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]).detach()
    ref.in_proj_bias.data = torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]).detach()
    ref.out_proj.weight.data = ours.out_proj.weight.detach().clone()
    ref.out_proj.bias.data = ours.out_proj.bias.detach().clone()


def _copy_layer(ours, ref, cross: bool) -> None:
    _copy_attention(ours.self_attn, ref.self_attn)
    if cross:
        _copy_attention(ours.cross_attn, ref.multihead_attn)
    ref.linear1.load_state_dict(ours.ffn.fc1.state_dict())
    ref.linear2.load_state_dict(ours.ffn.fc2.state_dict())
    blocks = [ours.attn_block, ours.cross_block, ours.ffn_block] if cross else [ours.attn_block, ours.ffn_block]
    for block, norm in zip(blocks, [ref.norm1, ref.norm2, ref.norm3] if cross else [ref.norm1, ref.norm2]):
        norm.load_state_dict(block.norm.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_equal_torch_reference(norm_first):
    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=2,
                         src_vocab_size=50, dropout=0.0, norm_first=norm_first).eval()
    enc_ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    dec_ref = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    _copy_layer(model.encoder.layers[0], enc_ref, cross=False)
    _copy_layer(model.decoder.layers[0], dec_ref, cross=True)
    x, mem = torch.randn(2, 6, 32), torch.randn(2, 5, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    mem_pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    ours = model.encoder.layers[0](x, key_padding_mask=pad).hidden
    ref = enc_ref(x, src_key_padding_mask=pad)
    torch.testing.assert_close(ours[~pad], ref[~pad], rtol=1e-5, atol=1e-5)
    ours_dec, _, _ = model.decoder.layers[0](x, mem, memory_padding_mask=mem_pad)
    ref_dec = dec_ref(x, mem, tgt_mask=nn.Transformer.generate_square_subsequent_mask(6), tgt_is_causal=True,
                      memory_key_padding_mask=mem_pad)
    torch.testing.assert_close(ours_dec, ref_dec, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_equals_full_forward(positions, norm_first):
    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=2,
                         src_vocab_size=40, positions=positions, norm_first=norm_first).eval()
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]])
    tgt = torch.tensor([[1, 12, 13, 14, 15, 16], [1, 17, 18, 19, 20, 21]])
    full = model(src, tgt).logits
    enc = model.encode(src)
    cache = model.decoder.new_cache()
    steps = [model.decode(tgt[:, t : t + 1], enc, cache=cache).logits for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_cache_reorder_selects_hypotheses():
    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=1, dec_layers=2,
                         src_vocab_size=40).eval()
    src = torch.tensor([[5, 6, 7], [8, 9, 10]])
    tgt = torch.tensor([[1, 12, 13], [1, 17, 18]])
    enc = model.encode(src)
    cache = model.decoder.new_cache()
    model.decode(tgt[:, :2], enc, cache=cache)
    cache.reorder(torch.tensor([1, 1]))
    enc.hidden, enc.padding_mask = enc.hidden[[1, 1]], enc.padding_mask[[1, 1]]
    step = model.decode(tgt[[1, 1], 2:], enc, cache=cache).logits
    torch.testing.assert_close(step[0], model(src[[1]], tgt[[1]]).logits[0, 2:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step[0], step[1])


@pytest.mark.parametrize("preset", ["transformer_small", "transformer_text_cls"])
def test_padding_tokens_do_not_change_real_outputs(preset):
    model = create_model(preset, d_model=32, n_heads=4, d_ffn=64, src_vocab_size=40).eval()
    a = torch.tensor([[5, 6, 7, 0, 0]])
    b = torch.tensor([[5, 6, 7, 0, 0]])
    enc_a = model.encoder(a)
    model.encoder.embed.tokens.weight.data[0] += 3.0  # padding rows of the input change ...
    enc_b = model.encoder(b)
    torch.testing.assert_close(enc_a.hidden[:, :3], enc_b.hidden[:, :3])  # ... real positions do not


def test_pre_and_post_ln_differ_and_pre_ln_has_final_norm():
    post = create_model("transformer_small", norm_first=False)
    pre = create_model("transformer_small", norm_first=True)
    assert post.encoder.final_norm is None and pre.encoder.final_norm is not None
    assert pre.decoder.final_norm is not None


def test_shared_and_tied_embeddings_are_one_tensor():
    shared = create_model("transformer_small", share_embeddings=True, tie_output=True)
    assert shared.encoder.embed.tokens.weight is shared.decoder.embed.tokens.weight
    assert shared.decoder.output_projection.weight is shared.decoder.embed.tokens.weight
    separate = create_model("transformer_small", share_embeddings=False, tie_output=False, tgt_vocab_size=900)
    assert separate.decoder.output_projection.weight is not separate.decoder.embed.tokens.weight
    assert separate.decoder.output_projection.out_features == 900


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_pooling(pooling):
    model = create_model("transformer_text_cls", d_model=32, n_heads=4, d_ffn=64, num_classes=3, pooling=pooling,
                         src_vocab_size=40).eval()
    tokens = torch.tensor([[2, 5, 6, 0], [2, 7, 0, 0]])
    out = model(tokens)
    hidden = out.encoder.hidden
    want = hidden[:, 0] if pooling == "cls" else torch.stack([hidden[0, :3].mean(0), hidden[1, :2].mean(0)])
    torch.testing.assert_close(out.pooled, want)
    assert out.logits.shape == (2, 3)


def test_segments_and_inputs_embeds():
    model = create_model("transformer_text_cls", d_model=32, n_heads=4, d_ffn=64, n_segments=2,
                         src_vocab_size=40).eval()
    tokens = torch.tensor([[2, 5, 3, 6]])
    seg_a, seg_b = torch.tensor([[0, 0, 0, 1]]), torch.tensor([[0, 0, 0, 0]])
    assert not torch.allclose(model(tokens, segments=seg_a).logits, model(tokens, segments=seg_b).logits)
    torch.testing.assert_close(model(tokens).logits, model(tokens, segments=seg_b).logits)  # default: segment 0
    vectors = torch.randn(1, 4, 32)
    assert model(inputs_embeds=vectors, segments=seg_a).logits.shape == (1, 5)


def test_a_bidirectional_decoder_sees_later_positions_but_not_padding():
    """``causal_decoder=False``: position 0 depends on later targets; padded targets change nothing real."""
    from interlayer import ConfigError

    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=1, dec_layers=2,
                         src_vocab_size=50, dropout=0.0, causal_decoder=False).eval()
    causal = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=1, dec_layers=2,
                          src_vocab_size=50, dropout=0.0).eval()
    causal.load_state_dict(model.state_dict())
    src, tgt = torch.randint(1, 50, (2, 6)), torch.randint(1, 50, (2, 5))
    later = tgt.clone()
    later[:, 3] = (tgt[:, 3] % 40) + 5
    padded = tgt.clone()
    padded[1, 3:] = 0
    with torch.no_grad():
        first = model(src, tgt).logits[:, 0]
        assert not torch.allclose(model(src, later).logits[:, 0], first)
        assert torch.equal(causal(src, later).logits[:, 0], causal(src, tgt).logits[:, 0])
        out = model(src, padded).logits[1, :3]
        with_other_rows = model(src[1:], padded[1:, :3]).logits[0]
    torch.testing.assert_close(out, with_other_rows, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="causal_decoder=False"):
        create_model("transformer_text_cls", causal_decoder=False)
