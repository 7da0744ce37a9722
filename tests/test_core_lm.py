"""The decoder-only language model: shapes and parameter counts of the presets, rotary positions, causality, the
KV cache and generation (greedy, sampling filters, batched prompts padded either side, EOS, the sliding context)."""
import math

import pytest
import torch

from interlayer import count_madds, count_parameters, create_model
from interlayer.core.generation import SamplingOptions, choose_tokens, generate
from interlayer.core.positions import RotaryEmbedding

TINY = dict(src_vocab_size=50, d_model=32, n_heads=4, d_ffn=64, enc_layers=3, max_positions=40, dropout=0.0,
            attn_dropout=0.0)


def tiny_lm(**overrides):
    torch.manual_seed(0)
    return create_model("gpt_shakespeare_char", **{**TINY, **overrides}).eval()


def gpt_layer_params(d: int, d_ffn: int, bias: bool) -> int:
    """One pre-LN GPT block: q, k, v, out (d x d), fc1 (d x d_ffn), fc2 (d_ffn x d), two LayerNorms."""
    weights = 4 * d * d + 2 * d * d_ffn
    biases = (4 * d + d_ffn + d) + 2 * d if bias else 0
    return weights + biases + 2 * d


@pytest.mark.parametrize("name, vocab, d, d_ffn, layers, positions, bias, expected", [
    # nanoGPT prints 10.65M for shakespeare_char: it leaves out the position table (256 x 384)
    ("gpt_shakespeare_char", 65, 384, 1536, 6, 256, False, 10_646_784 + 256 * 384),
    ("gpt2_small", 50257, 768, 3072, 12, 1024, True, 124_439_808),  # GPT-2 small as released (tied head)
])
def test_presets_have_the_published_parameter_counts(name, vocab, d, d_ffn, layers, positions, bias, expected):
    with torch.device("meta"):
        model = create_model(name)
    final_norm = d + (d if bias else 0)
    formula = vocab * d + positions * d + layers * gpt_layer_params(d, d_ffn, bias) + final_norm
    assert formula == expected
    assert count_parameters(model) == expected
    assert model.lm_head.weight is model.encoder.embed.tokens.weight  # tied, counted once
    cfg = model.config
    assert (cfg.enc_layers, cfg.n_heads, cfg.d_model, cfg.max_positions) == (layers, d // 64, d, positions)


def test_gpt_parameter_names_are_the_documented_ones():
    names = dict(tiny_lm().named_parameters(remove_duplicate=False))
    for name in ("encoder.embed.tokens.weight", "encoder.embed.positions.weight", "lm_head.weight",
                 "encoder.layers.2.self_attn.q_proj.weight", "encoder.layers.0.ffn.fc2.weight",
                 "encoder.layers.1.attn_block.norm.weight", "encoder.final_norm.weight"):
        assert name in names
    assert not any(name.endswith("bias") for name in names)  # bias=False: no Linear or LayerNorm biases


def test_madds_count_the_stack_and_the_output_projection():
    model = tiny_lm()
    t, d, v = 10, 32, 50
    per_layer = 4 * t * d * d + 2 * t * t * d + 2 * t * d * 64
    assert count_madds(model, t) == 3 * per_layer + t * d * v


# -- rotary positions ---------------------------------------------------------------------------------------
def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoFormer Eq. 34 as complex multiplication: pair (x_2i, x_2i+1) is the number x_2i + i x_2i+1, times
    exp(i m theta_i) (the form of Meta's LLaMA reference code), computed in float64."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rotation = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                           positions.double()[:, None] * theta)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * rotation).flatten(-2)


def test_rotary_matches_an_independent_reference_at_any_offset():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 64)
    x = torch.randn(2, 3, 7, 16)
    for offset in (0, 5):
        expected = reference_rope(x, torch.arange(offset, offset + 7))
        assert torch.allclose(rope(x, offset).double(), expected, atol=1e-5)


def test_rotary_logits_depend_only_on_the_distance():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 64)
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    near = rope(q, 0) @ rope(k, 0).transpose(-1, -2)
    far = rope(q, 30) @ rope(k, 30).transpose(-1, -2)
    assert torch.allclose(near, far, atol=1e-4)
    plain = q @ k.transpose(-1, -2)
    assert not torch.allclose(near, plain, atol=1e-2)  # the rotation does change the logits


def test_rotary_model_has_no_position_table_and_sees_order():
    model = tiny_lm(positions="rotary")
    assert model.encoder.embed.positions is None
    attention = model.encoder.layers[0].self_attn
    assert isinstance(attention.relative, RotaryEmbedding)
    tokens = torch.tensor([[3, 4, 5, 6, 7]])
    swapped = torch.tensor([[4, 3, 5, 6, 7]])
    # with rotation the last position tells the order of the first two tokens apart (without positions it cannot)
    assert not torch.allclose(model(tokens).logits[0, -1], model(swapped).logits[0, -1], atol=1e-4)


# -- causality and the cache --------------------------------------------------------------------------------
POSITIONS = ["learned", "sinusoidal", "rotary", "relative", "none"]


@pytest.mark.parametrize("positions", POSITIONS)
def test_changing_a_later_token_leaves_earlier_outputs_exactly_unchanged(positions):
    model = tiny_lm(positions=positions)
    tokens = torch.randint(0, 50, (2, 12))
    later = tokens.clone()
    later[:, 7] = (later[:, 7] + 1) % 50
    a, b = model(tokens).logits, model(later).logits
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("eager", [False, True])
def test_cached_steps_equal_the_full_forward(positions, eager):
    model = tiny_lm(positions=positions, attn_impl="eager" if eager else "auto")
    tokens = torch.randint(0, 50, (2, 11))
    full = model(tokens).logits
    cache = model.new_cache()
    parts = [model(tokens[:, :4], cache=cache).logits]  # a prompt, then one token at a time
    parts += [model(tokens[:, i:i + 1], cache=cache).logits for i in range(4, 11)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_position_ids_give_left_padded_rows_their_own_positions():
    model = tiny_lm()
    tokens = torch.randint(0, 50, (1, 5))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], dim=1)
    mask = torch.tensor([[True] * 3 + [False] * 5])
    alone = model(tokens).logits
    ids = torch.tensor([[0, 0, 0, 0, 1, 2, 3, 4]])
    assert torch.allclose(model(padded, padding_mask=mask, position_ids=ids).logits[:, 3:], alone, atol=1e-5)
    shifted = model(padded, padding_mask=mask).logits[:, 3:]  # positions 3..7 instead: a different output
    assert not torch.allclose(shifted, alone, atol=1e-3)


# -- generation -----------------------------------------------------------------------------------------------
GREEDY = SamplingOptions(max_new_tokens=8, temperature=0)


@pytest.mark.parametrize("positions", ["learned", "rotary", "relative"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_prompts_padded_either_side_are_continued_as_alone(positions, side):
    model = tiny_lm(positions=positions)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 8], [11, 12, 13, 14]]
    alone = [generate(model, torch.tensor([p]), GREEDY).tokens[0] for p in prompts]
    width = max(map(len, prompts))
    rows, masks = [], []
    for p in prompts:
        pad = [0] * (width - len(p))
        rows.append(pad + p if side == "left" else p + pad)
        masks.append([True] * len(pad) + [False] * len(p) if side == "left" else [False] * len(p) + [True] * len(pad))
    batched = generate(model, torch.tensor(rows), GREEDY, padding_mask=torch.tensor(masks))
    for row, expected in zip(batched.tokens, alone):
        assert torch.equal(row, expected)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_cached_generation_equals_uncached(positions):
    model = tiny_lm(positions=positions)
    prompts = torch.randint(0, 50, (3, 5))
    cached = generate(model, prompts, SamplingOptions(max_new_tokens=12, temperature=0, use_cache=True))
    uncached = generate(model, prompts, SamplingOptions(max_new_tokens=12, temperature=0, use_cache=False))
    assert torch.equal(cached.tokens, uncached.tokens)


def test_generation_beyond_the_context_slides_the_window_like_nanogpt():
    model = tiny_lm(max_positions=8)
    prompt = torch.randint(0, 50, (1, 6))
    out = generate(model, prompt, SamplingOptions(max_new_tokens=6, temperature=0))
    sequence = torch.cat([prompt, out.tokens], dim=1)
    for i in range(6):  # token i was chosen from the last 8 tokens before it, numbered from 0
        context = sequence[:, max(0, 6 + i - 8):6 + i]
        assert model(context).logits[0, -1].argmax() == out.tokens[0, i]


def test_eos_stops_each_row_and_fills_it():
    model = tiny_lm()
    prompts = torch.randint(0, 50, (2, 4))
    free = generate(model, prompts, GREEDY).tokens
    eos = int(free[0, 2])
    stopped = generate(model, prompts, SamplingOptions(max_new_tokens=8, temperature=0, eos_id=eos))
    first = int((free[0] == eos).nonzero()[0])
    assert stopped.lengths[0] == first + 1
    assert torch.equal(stopped.tokens[0, :first + 1], free[0, :first + 1])
    assert (stopped.tokens[0, first:] == eos).all()


def test_sampling_filters_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)

    def draws(**kw):
        return {int(choose_tokens(logits, SamplingOptions(**kw), gen)) for _ in range(300)}

    assert draws(top_k=2) == {0, 1}
    assert draws(top_k=200) == {0, 1, 2, 3}  # more than the vocabulary: every token (nanoGPT's top_k=200)
    assert draws(top_p=0.75) == {0, 1}  # 0.5 < 0.75 <= 0.8: the two most likely tokens
    assert draws(top_p=0.5) == {0}
    assert draws(temperature=1.0) == {0, 1, 2, 3}
    assert draws(temperature=0) == {0}
    # a low temperature sharpens: token 0 nearly always
    low = [int(choose_tokens(logits, SamplingOptions(temperature=0.05), gen)) for _ in range(200)]
    assert low.count(0) >= 199


def test_seeded_sampling_is_reproducible():
    model = tiny_lm()
    prompts = torch.randint(0, 50, (2, 3))
    options = SamplingOptions(max_new_tokens=10, temperature=1.0, top_k=10)
    a = generate(model, prompts, options, generator=torch.Generator().manual_seed(3)).tokens
    b = generate(model, prompts, options, generator=torch.Generator().manual_seed(3)).tokens
    assert torch.equal(a, b)


@pytest.mark.parametrize("options, message", [
    (SamplingOptions(top_p=0.0), "top_p"), (SamplingOptions(top_k=-1), "top_k"),
    (SamplingOptions(temperature=-1), "temperature"), (SamplingOptions(eos_id=50), "eos_id")])
def test_bad_sampling_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny_lm(), torch.zeros(1, 2, dtype=torch.long), options)


def test_all_padding_prompt_is_refused():
    with pytest.raises(ValueError, match=r"prompt\(s\) \[1\] are all padding"):
        generate(tiny_lm(), torch.zeros(2, 3, dtype=torch.long), GREEDY,
                 padding_mask=torch.tensor([[False] * 3, [True] * 3]))


def test_initial_loss_is_near_uniform():
    """N(0, 0.02) tied embeddings: the untrained model predicts close to uniformly (nanoGPT's sanity check)."""
    model = tiny_lm()
    tokens = torch.randint(0, 50, (4, 20))
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), tokens[:, 1:].reshape(-1))
    assert abs(float(loss.detach()) - math.log(50)) < 0.1
