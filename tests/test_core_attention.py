"""Attention: fused and eager paths agree, masks never produce NaN, intermediates are the unmasked logits."""
import pytest
import torch
from torch import nn

from interlayer.core.attention import LogitMixer, MixerContext, MultiHeadAttention
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


# -- which SDPA call each configuration makes (the flash path where it applies) ------------------------------------
def _sdpa_calls(monkeypatch: pytest.MonkeyPatch, run) -> list[tuple]:
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        calls.append((None if attn_mask is None else (attn_mask.dtype, tuple(attn_mask.shape)), is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        run()
    return calls


def test_each_configuration_makes_the_cheapest_sdpa_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Causal without padding: ``is_causal`` and no mask (the flash kernel). Padded: one boolean mask, broadcast
    over heads (and over queries for an encoder: ``(B, 1, 1, T)``), for the memory-efficient kernel. A decoding
    step (one new query at the end): no mask at all. An encoder reading token ids always has its padding mask
    (whether a batch holds padding would be a question to the device, a host synchronisation): the broadcast one."""
    from interlayer import create_model

    lm = create_model("gpt_shakespeare_char", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, src_vocab_size=40,
                      max_positions=16).eval()
    ids = torch.randint(0, 40, (2, 9))
    assert _sdpa_calls(monkeypatch, lambda: lm(ids)) == [(None, True)] * 2
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, :3] = True
    assert _sdpa_calls(monkeypatch, lambda: lm(ids, padding_mask=pad)) == [((torch.bool, (2, 1, 9, 9)), False)] * 2
    cache = lm.new_cache()
    lm(ids, cache=cache)
    assert _sdpa_calls(monkeypatch, lambda: lm(ids[:, :1], cache=cache)) == [(None, False)] * 2
    encoder = create_model("transformer_text_cls", d_model=32, n_heads=4, d_ffn=64, enc_layers=2,
                           src_vocab_size=40, num_classes=2, positions="learned").eval()
    tokens = torch.randint(4, 40, (2, 9))
    assert _sdpa_calls(monkeypatch, lambda: encoder(tokens)) == [((torch.bool, (2, 1, 1, 9)), False)] * 2
    assert _sdpa_calls(monkeypatch, lambda: encoder(inputs_embeds=torch.randn(2, 9, 32))) == [(None, False)] * 2
    tokens[0, 6:] = encoder.config.pad_id
    assert _sdpa_calls(monkeypatch, lambda: encoder(tokens)) == [((torch.bool, (2, 1, 1, 9)), False)] * 2


def test_an_unpadded_translation_batch_takes_the_flash_path_and_the_same_numbers(monkeypatch) -> None:
    """The translation task knows on the host whether a batch's sources are padded: without padding the encoder
    and the cross-attention make no mask (what ``torch.nn.Transformer`` does with no mask), and the loss is the
    masked path's (an all-False mask means the same)."""
    from interlayer import create_model
    from interlayer.tasks.translation import TranslationTask
    from interlayer.training.config import TrainConfig

    torch.manual_seed(0)
    model = create_model("transformer_iwslt_de_en", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=2,
                         src_vocab_size=40, dropout=0.0, attn_dropout=0.0).eval()
    task = TranslationTask.__new__(TranslationTask)  # make_batch needs nothing of a corpus
    even = task.make_batch([[5, 6, 7, 2], [8, 9, 10, 2]], [[11, 12], [13, 14, 15]])
    ragged = task.make_batch([[5, 6, 7, 2], [8, 2]], [[11, 12], [13, 14, 15]])
    assert (even.src_padded, ragged.src_padded) == (False, True)
    flash = [(None, False)] * 2 + [(None, True), (None, False)] * 2  # encoder; decoder self, cross: no mask
    assert _sdpa_calls(monkeypatch, lambda: model(even.src, even.tgt_in, source_padded=even.src_padded)) == flash
    masked = _sdpa_calls(monkeypatch, lambda: model(ragged.src, ragged.tgt_in, source_padded=ragged.src_padded))
    assert [mask is not None for mask, _ in masked] == [True, True, False, True, False, True]
    with torch.no_grad():
        torch.testing.assert_close(model(even.src, even.tgt_in, source_padded=False).logits,
                                   model(even.src, even.tgt_in).logits)
    task.train_cfg = TrainConfig()
    assert _sdpa_calls(monkeypatch, lambda: task.loss(model, even)) == flash  # the task's loss passes it on


@pytest.mark.parametrize("causal", [False, True])
def test_a_float64_attention_keeps_float64_on_every_path(causal):
    """The eager path rounded float64 logits to float32 before the softmax (a 1e-8 error where float64 promises
    1e-16): every path against a float64 reference written out, padding and an all-padding row included."""
    from interlayer.kernels.logits_attention import reference as logits_reference

    torch.manual_seed(0)
    fused, eager = (attn.double() for attn in _pair())
    x = torch.randn(3, 7, 32, dtype=torch.float64) * 4
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, :] = True
    q, k, v = (proj(x).view(3, 7, 4, 8).transpose(1, 2) for proj in (eager.q_proj, eager.k_proj, eager.v_proj))
    logits = q @ k.transpose(-1, -2) / 8 ** 0.5
    allowed = ~pad[:, None, None, :] & (torch.ones(7, 7, dtype=torch.bool).tril() if causal else True)
    probs = torch.where(allowed, logits, -torch.inf).softmax(-1).nan_to_num(0.0)
    heads = (probs @ v).transpose(1, 2).reshape(3, 7, 32)
    expected = eager.out_proj(heads)
    for attn in (eager, fused):
        out, _ = attn(x, key_padding_mask=pad, causal=causal)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-13)
    torch.testing.assert_close(logits_reference(logits.contiguous(), v, pad, causal), probs @ v, rtol=0, atol=1e-13)


class _AddPrevious(LogitMixer):
    """A logit mixer with the protocol's two required methods only: ``logits + prev_logits``, no fused op."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def forward(self, logits, prev_logits, key_padding_mask=None, context=MixerContext()):
        self.calls.append("forward")
        return logits + prev_logits, {}

    def madds(self, t_q: int, t_k: int) -> int:
        return t_q * t_k


class _FusedAddPrevious(_AddPrevious):
    """The same mixer with a fused op, taken in every case."""

    def fuses(self, prev_logits, v, causal):
        self.calls.append("fuses")
        return True

    def fused_attention(self, q, k, scale, bias, prev_logits, v, key_padding_mask, causal):
        self.calls.append("fused_attention")
        mixed = torch.matmul(q * scale, k.transpose(-2, -1)) + prev_logits
        return torch.softmax(mixed, dim=-1) @ v, mixed


def test_a_logit_mixer_that_does_not_override_fuses_takes_the_eager_path():
    """``LogitMixer.fuses`` is False unless a mixer says otherwise: the core then makes the logits, calls the mixer
    and runs its own softmax; a mixer whose ``fuses`` says True gets ``fused_attention`` and nothing else. Both give
    the same numbers (the mixed logits handed on, and the output)."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    x, prev = torch.randn(2, 5, 32), torch.randn(2, 4, 5, 5)
    eager, fused = _AddPrevious(), _FusedAddPrevious()
    results = []
    for mixer in (eager, fused):
        attn.logit_mixer = mixer
        out, inter = attn(x, prev_logits=prev, need_logits=True)
        results.append((out, inter.logits))
    assert eager.calls == ["forward"] and fused.calls == ["fuses", "fused_attention"]
    torch.testing.assert_close(results[0], results[1])


def test_a_logit_mixer_must_be_one():
    with pytest.raises(TypeError, match=r"an instance of interlayer\.core\.attention\.LogitMixer .*got Identity"):
        MultiHeadAttention(32, 4, logit_mixer=nn.Identity())
