"""The four methods on the decoder-only language model: each is applied (ties, replaced modules, mixers) and none
lets a position see a later token: changing token t+1 leaves every output at positions <= t exactly unchanged, with
and without the KV cache, and cached decoding equals the full forward pass."""
import pytest
import torch

from helpers.lm import (
    CHANGED,
    LM_EXAMPLES,
    T,
    assert_cache_matches,
    assert_causal,
    assert_padded_generation_matches,
    lm,
)
from interlayer import ConfigError
from interlayer.methods import METHODS
from interlayer.methods.lightweight import GroupedFeedForward, GroupedMultiHeadAttention
from interlayer.methods.multipass import MultiPassEncoder

CROSSFORMER = {
    **{f"hard_{pair}": {"hard": [pair]} for pair in ("kq", "qk", "qq", "kk", "vf", "ffn")},
    "hard_all": {"hard": ["kq", "vf", "ffn"]},
    "hard_ffn_w1_w2": {"hard": ["ffn"], "ffn_order": "w1_w2"},
    "soft_all": {"soft": ["kq", "vf", "ffn"]},
}


@pytest.mark.parametrize("name", list(CROSSFORMER))
def test_crossformer_on_the_decoder_is_applied_and_causal(name):
    model = lm(crossformer=CROSSFORMER[name])
    layers = model.encoder.layers
    section = model.config.crossformer
    if "kq" in section.hard:
        assert layers[0].self_attn.k_proj.weight is layers[1].self_attn.q_proj.weight  # Eq. 3 on the LM's stack
    if "ffn" in section.hard:
        first = "fc2" if section.ffn_order == "w2_w1" else "fc1"
        assert getattr(layers[0].ffn, first).weight is getattr(layers[1].ffn, first).weight
    if section.soft:
        model.train()
        assert float(model(torch.randint(0, 40, (1, 5))).aux_losses["crossformer_sg"].detach()) > 0
        model.eval()
    assert_causal(model)
    assert_cache_matches(model)


LIGHTWEIGHT = {"lw_1x": {"groups": 2}, "lw_1x_nows": {"groups": 2, "share_weights": False},
               "lw_2x": {"groups": 2, "qk_expansion": 2}, "lw_mini_glml": {"groups": 4, "group_merge": True,
                                                                           "group_intermediate": True}}


@pytest.mark.parametrize("name", list(LIGHTWEIGHT))
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_lightweight_on_the_decoder_is_applied_and_causal(name, positions):
    model = lm(lightweight=LIGHTWEIGHT[name], positions=positions)
    layer = model.encoder.layers[0]
    assert isinstance(layer.self_attn, GroupedMultiHeadAttention) and isinstance(layer.ffn, GroupedFeedForward)
    assert layer.self_attn.qk_dim == LIGHTWEIGHT[name].get("qk_expansion", 1) * 32
    assert_causal(model)
    assert_cache_matches(model)


@pytest.mark.parametrize("connection", ["default", "soft", "hard", "tied_stack"])
def test_multipass_on_the_decoder_is_causal_in_every_pass(connection):
    section = {"passes": 2, "connection": connection}
    if connection == "hard":
        section["permutation"] = [0, 3, 1, 2]
    model = lm(multipass=section)
    assert isinstance(model.encoder, MultiPassEncoder)
    out = model(torch.randint(0, 40, (1, T)), need_intermediates=True)
    assert len(out.encoder.attentions) == 8  # both passes ran
    assert_causal(model)


def test_multipass_generation_reads_without_a_cache():
    model = lm(multipass={"passes": 2, "connection": "soft"})
    assert not model.supports_cache
    with pytest.raises(ValueError, match="Multi-Pass"):
        model.new_cache()
    from interlayer.core.generation import SamplingOptions

    prompt = torch.randint(0, 40, (1, 4))
    out = model.generate(prompt, SamplingOptions(max_new_tokens=3, temperature=0))
    assert out.tokens[0, 0] == model(prompt).logits[0, -1].argmax()


def test_conv_branch_is_refused_in_a_causal_model():
    with pytest.raises(ConfigError, match="conv_branch cannot be used in a causal language model"):
        lm(conv_branch={})


# -- every method: its declared language-model examples (Method.lm_examples) -----------------------------------
@pytest.mark.parametrize("example", list(LM_EXAMPLES))
def test_every_language_model_example_is_causal(example):
    assert_causal(lm(**LM_EXAMPLES[example]))


def test_a_method_without_language_model_examples_has_no_causal_form():
    """Empty ``lm_examples`` is a declared fact, not an omission: the method refuses a causal model (the conv
    branch's centred convolution reads the next token). The examples' names are unique over the methods."""
    for method in METHODS:
        for example in method.examples if not method.lm_examples else ():
            with pytest.raises(ConfigError, match="cannot be used in a causal language model"):
                lm(**{method.name: example.section}, **example.core)
    names = [name for method in METHODS for name in method.lm_examples]
    assert sorted(names) == sorted(LM_EXAMPLES) and len(set(names)) == len(names)


# -- Predictive Attention with the causal kernel ----------------------------------------------------------------
@pytest.mark.parametrize("conv_layers", [1, 2, 3])
@pytest.mark.parametrize("beta", [None, 0.5])
def test_causal_predictive_attention_does_not_leak_and_caches_exactly(conv_layers, beta):
    model = lm(predictive={"conv_layers": conv_layers, "alpha": 0.5, "beta": beta})
    mixer = model.encoder.layers[1].self_attn.logit_mixer
    assert mixer.causal_kernel and len(mixer.convs) == conv_layers
    assert_causal(model)
    assert_cache_matches(model)


@pytest.mark.parametrize("conv_layers", [1, 2, 3])
def test_causal_predictive_attention_does_not_leak_inside_a_cached_chunk(conv_layers):
    """A prompt, then a chunk of several new tokens read at once through the cache (the rows kept from the
    prompt, the triangle zeroed inside the chunk): changing a token of the chunk leaves the earlier ones alone."""
    model = lm(predictive={"conv_layers": conv_layers, "alpha": 0.5})
    tokens = torch.randint(0, 40, (2, T))
    later = tokens.clone()
    later[:, CHANGED] = (later[:, CHANGED] + 1) % 40
    outputs = []
    for sequence in (tokens, later):
        cache = model.new_cache()
        model(sequence[:, :3], cache=cache)
        outputs.append(model(sequence[:, 3:], cache=cache).logits)
    a, b = outputs
    assert torch.equal(a[:, :CHANGED - 3], b[:, :CHANGED - 3])
    assert not torch.allclose(a[:, CHANGED - 3:], b[:, CHANGED - 3:])
    assert torch.allclose(a, model(tokens).logits[:, 3:], atol=1e-5)


def test_causal_predictive_generation_is_the_same_cached_batched_or_alone():
    model = lm(predictive={"conv_layers": 2, "alpha": 0.5}, positions="rotary")
    assert_padded_generation_matches(model)


def test_symmetric_prediction_kernel_is_refused_in_a_causal_model():
    with pytest.raises(ConfigError, match="predictive.kernel='symmetric' cannot be used in a causal language model"):
        lm(predictive={"kernel": "symmetric"})


def test_the_causal_kernel_in_an_encoder_reads_earlier_rows_only():
    from interlayer.methods.predictive import PredictiveMixer

    torch.manual_seed(0)
    causal = PredictiveMixer(2, alpha=1.0, conv_layers=2, kernel_size=3, init="random", causal_kernel=True)
    centred = PredictiveMixer(2, alpha=1.0, conv_layers=2, kernel_size=3, init="random")
    centred.load_state_dict(causal.state_dict())
    cur, prev = torch.randn(1, 2, 6, 6), torch.randn(1, 2, 6, 6)
    changed = prev.clone()
    changed[:, :, 4:] += 1.0  # rows 4 and 5 of the previous map
    a, b = causal(cur, prev)[0], causal(cur, changed)[0]
    assert torch.equal(a[:, :, :4], b[:, :, :4]) and not torch.allclose(a[:, :, 4:], b[:, :, 4:])
    assert not torch.allclose(centred(cur, prev)[0][:, :, :4], centred(cur, changed)[0][:, :, :4])


@pytest.mark.parametrize("other", [{"lightweight": {"groups": 2}}, {"crossformer": {"hard": ["kq"]}},
                                   {"multipass": {"passes": 2, "connection": "soft"}}])
def test_causal_predictive_attention_composes_without_leaking(other):
    model = lm(predictive={"conv_layers": 1, "alpha": 0.5}, **other)
    assert_causal(model)
