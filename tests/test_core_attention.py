"""Attention: fused and eager paths agree, masks never produce NaN, intermediates are the unmasked logits."""
import pytest
import torch

from interlayer.core.attention import MultiHeadAttention
from interlayer.core.positions import RelativePositionBias, RelativePositionBias2D


def _pair(**kwargs):
    fused = MultiHeadAttention(32, 4, **kwargs).eval()
    eager = MultiHeadAttention(32, 4, force_eager=True, **kwargs).eval()
    eager.load_state_dict(fused.state_dict())
    return fused, eager


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("relative", [False, True])
def test_fused_and_eager_paths_agree(causal, relative):
    kwargs = {"relative": RelativePositionBias(8, 3)} if relative else {}
    fused, eager = _pair(**kwargs)
    if relative:
        eager.relative.load_state_dict(fused.relative.state_dict())
    x = torch.randn(3, 7, 32)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, :] = True  # an all-padding sequence
    out_f, inter_f = fused(x, key_padding_mask=pad, causal=causal)
    out_e, _ = eager(x, key_padding_mask=pad, causal=causal)
    assert inter_f is None
    torch.testing.assert_close(out_f, out_e, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(out_f).all()
    assert torch.equal(out_f[2], fused.out_proj.bias.expand(7, 32))  # no key to attend: zero before out_proj


def test_intermediates_hold_unmasked_logits_and_masked_probs():
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    _, inter = attn(x, key_padding_mask=pad, need_intermediates=True)
    q = attn.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    torch.testing.assert_close(inter.logits, q @ k.transpose(-1, -2) / 8**0.5)
    assert torch.isfinite(inter.logits).all()
    assert torch.all(inter.probs[1, :, :, 3:] == 0)
    torch.testing.assert_close(inter.probs.sum(-1), torch.ones(2, 4, 5))


def test_gradients_through_all_padding_rows_are_finite():
    attn = MultiHeadAttention(16, 2, force_eager=True)
    x = torch.randn(2, 4, 16, requires_grad=True)
    pad = torch.tensor([[True] * 4, [False, False, True, True]])
    out, _ = attn(x, key_padding_mask=pad, causal=True)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_qk_width_differs_from_model_width():
    attn = MultiHeadAttention(32, 4, qk_dim=64)
    assert attn.q_proj.weight.shape == (64, 32) and attn.v_proj.weight.shape == (32, 32)
    out, inter = attn(torch.randn(1, 3, 32), need_intermediates=True)
    assert out.shape == (1, 3, 32) and inter.q.shape[-1] == 16


def test_relative_bias_matches_shaw_definition():
    rel = RelativePositionBias(4, 2)
    q = torch.randn(1, 1, 5, 4)
    bias = rel(q, 0, 5)
    for i in range(5):
        for j in range(5):
            e = rel.embeddings[max(-2, min(2, j - i)) + 2]
            torch.testing.assert_close(bias[0, 0, i, j], q[0, 0, i] @ e)
    torch.testing.assert_close(rel(q[:, :, 3:], 3, 5), bias[:, :, 3:])  # query offset while decoding


def test_relative_2d_bias_matches_pa_eq3_and_ignores_prefix():
    rel = RelativePositionBias2D(4, 2, 3)
    q = torch.randn(1, 2, 7, 4)  # 1 CLS token + a 2x3 grid
    bias = rel(q, 0, 7)
    assert torch.all(bias[:, :, 0] == 0) and torch.all(bias[:, :, :, 0] == 0)
    for i in range(6):
        for j in range(6):
            hi, wi, hj, wj = i // 3, i % 3, j // 3, j % 3
            want = q[0, 1, i + 1] @ rel.e_h[hj - hi + 1] + q[0, 1, i + 1] @ rel.e_w[wj - wi + 2]
            torch.testing.assert_close(bias[0, 1, i + 1, j + 1], want)
    with pytest.raises(ValueError, match="grid"):
        rel(q[:, :, :4], 0, 4)
