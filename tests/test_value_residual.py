"""Value residual learning (ResFormer, SVFormer; Zhou et al., arXiv:2410.17897): the plain model at lambda_1 = 0,
lambda_2 = 1, a from-scratch reference of V_n' = lambda_1 V_1 + lambda_2 V_n, the paper's naming (and V_n' = V_1),
the old ``lambdas`` key read with its old meaning, causality and the KV cache in the language model, parameter
counts, cache bytes, compilation and the refused pairs."""
import pytest
import torch
import torch._dynamo

from helpers.kv import reference_layers, reference_logits
from helpers.lm import TINY, T, assert_cache_matches, assert_causal, assert_padded_generation_matches, lm
from interlayer import ConfigError, create_model
from interlayer.core.generation import kv_cache_bytes_per_token


def resformer_rule(model):
    def rule(i, k, v, ks, vs):
        if i == 0:
            return k, v
        src = model.encoder.layers[i].self_attn.kv_source
        return k, src.lambda_own * v + src.lambda_first * vs[0]
    return rule


def svformer_rule(i, k, v, ks, vs):
    return (k, v) if i == 0 else (k, vs[0])


def randomise_lambdas(model):
    with torch.no_grad():
        for layer in model.encoder.layers[1:]:
            for p in (layer.self_attn.kv_source.lambda_own, layer.self_attn.kv_source.lambda_first):
                p.copy_(torch.rand_like(p) * 2 - 0.5)


@pytest.mark.parametrize("learnable", [False, True])
@pytest.mark.parametrize("arch", ["causal_lm", "encoder_decoder", "encoder_classifier"])
def test_lambda_1_zero_lambda_2_one_is_the_plain_model_exactly(arch, learnable):
    extra = {"num_classes": 3} if arch == "encoder_classifier" else {}
    torch.manual_seed(0)
    plain = create_model("transformer_small", arch=arch, **TINY, **extra).eval()
    torch.manual_seed(0)
    res = create_model("transformer_small", arch=arch, **TINY, **extra,
                       value_residual={"lambda_1": 0.0, "lambda_2": 1.0, "learnable": learnable}).eval()
    res.load_state_dict(plain.state_dict(), strict=not learnable)
    tokens = torch.randint(4, 40, (2, T))
    tokens[1, 9:] = 0
    run = (lambda m: m(tokens, tokens[:, :7])) if arch == "encoder_decoder" else (lambda m: m(tokens))
    assert torch.equal(run(plain).logits, run(res).logits)
    # and the default (0.5, 0.5) is not the plain model
    res2 = create_model("transformer_small", arch=arch, **TINY, **extra, value_residual={}).eval()
    res2.load_state_dict(plain.state_dict())
    assert not torch.allclose(run(plain).logits, run(res2).logits)


@pytest.mark.parametrize("attn_impl", ["auto", "eager"])
@pytest.mark.parametrize("granularity", ["layer", "head"])
def test_resformer_matches_the_equation_forward_and_gradient(granularity, attn_impl):
    model = lm(value_residual={"learnable": True, "granularity": granularity}, attn_impl=attn_impl)
    randomise_lambdas(model)
    tokens = torch.randint(0, 40, (2, T))
    out = model(tokens).logits
    ref = reference_logits(model, tokens, resformer_rule(model))
    assert torch.allclose(out, ref, atol=1e-5)
    params = [model.encoder.layers[2].self_attn.kv_source.lambda_first, model.encoder.layers[0].self_attn.v_proj.weight]
    got = torch.autograd.grad(out.square().sum(), params)
    want = torch.autograd.grad(ref.square().sum(), params)
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))


@pytest.mark.parametrize("attn_impl", ["auto", "eager"])
def test_svformer_matches_the_equation_forward_and_gradient(attn_impl):
    model = lm(value_residual={"mode": "svformer"}, attn_impl=attn_impl)
    assert all(layer.self_attn.v_proj is None for layer in model.encoder.layers[1:])
    tokens = torch.randint(0, 40, (2, T))
    out = model(tokens).logits
    ref = reference_logits(model, tokens, svformer_rule)
    assert torch.allclose(out, ref, atol=1e-5)
    weight = model.encoder.layers[0].self_attn.v_proj.weight
    assert torch.allclose(torch.autograd.grad(out.square().sum(), weight)[0],
                          torch.autograd.grad(ref.square().sum(), weight)[0], atol=1e-5)


MODES = {"resformer": {}, "resformer_head": {"learnable": True, "granularity": "head"},
         "svformer": {"mode": "svformer"}}


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("mode", list(MODES))
def test_causal_and_the_cache_equals_the_full_forward(mode, positions):
    model = lm(value_residual=MODES[mode], positions=positions)
    if "resformer_head" == mode:
        randomise_lambdas(model)
    assert_causal(model)
    assert_cache_matches(model)


@pytest.mark.parametrize("mode", list(MODES))
def test_padded_prompts_generate_as_alone_with_and_without_cache(mode):
    model = lm(value_residual=MODES[mode], positions="rotary")
    assert_padded_generation_matches(model)


def test_parameter_counts_follow_the_paper():
    d, h, n = TINY["d_model"], TINY["n_heads"], TINY["enc_layers"]
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    base = lm()
    plain, bias = count(base), d * base.config.bias  # the nanoGPT preset has no biases
    assert count(lm(value_residual={})) == plain
    assert count(lm(value_residual={"learnable": True})) == plain + 2 * (n - 1)
    assert count(lm(value_residual={"learnable": True, "granularity": "head"})) == plain + 2 * h * (n - 1)
    assert count(lm(value_residual={"mode": "svformer"})) == plain - (n - 1) * (d * d + bias)
    assert count(lm(value_residual={"mode": "svformer"}, bias=True)) == count(lm(bias=True)) - (n - 1) * (d * d + d)


def test_kv_cache_bytes():
    d, n = TINY["d_model"], TINY["enc_layers"]
    plain = kv_cache_bytes_per_token(lm())
    assert plain == n * 2 * d * 4
    assert kv_cache_bytes_per_token(lm(value_residual={})) == plain
    assert kv_cache_bytes_per_token(lm(value_residual={"mode": "svformer"})) == (n * d + d) * 4


def test_multipass_keeps_v1_per_pass():
    """Pass 2 of a tied stack mixes in pass 2's own first-layer values (each run of the stack has its history)."""
    model = lm(value_residual={"learnable": True}, multipass={"connection": "tied_stack"})
    randomise_lambdas(model)
    tokens = torch.randint(0, 40, (2, T))
    rule = resformer_rule(model)
    x = reference_layers(model, reference_layers(model, model.encoder.embed(tokens), rule), rule)
    assert torch.allclose(model(tokens).logits, model.lm_head(model.encoder.final_norm(x)), atol=1e-5)


@pytest.mark.parametrize("learnable", [False, True])
def test_warm_up_starts_as_the_plain_model_and_ramps_to_the_lambdas(learnable):
    """From the plain model's lambda_1 = 0, lambda_2 = 1 to the configured 0.5 and 0.5 over N steps: the plain model
    bit for bit before the first step, lambda_1 = 0.25, lambda_2 = 0.75 half-way, the configured pair from step N on;
    the engine's hook advances it."""
    torch.manual_seed(0)
    plain = lm()
    warm = lm(value_residual={"lambda_warmup_steps": 4, "learnable": learnable})
    warm.load_state_dict(plain.state_dict(), strict=False)
    tokens = torch.randint(0, 40, (2, T))
    assert torch.equal(warm(tokens).logits, plain(tokens).logits)

    def step(n):
        for module in warm.modules():
            if hasattr(module, "optimizer_step_done"):
                for _ in range(n):
                    module.optimizer_step_done()

    for steps, (on_first, on_own) in ((2, (0.25, 0.75)), (2, (0.5, 0.5)), (3, (0.5, 0.5))):
        step(steps)
        fixed = lm(value_residual={"lambda_1": on_first, "lambda_2": on_own})
        fixed.load_state_dict(plain.state_dict(), strict=False)
        assert torch.allclose(warm(tokens).logits, fixed(tokens).logits, atol=1e-6)
    assert warm.state_dict()["encoder.layers.1.self_attn.kv_source.steps_done"] == 7  # saved with the weights


@pytest.mark.slow
@pytest.mark.parametrize("mode", [*MODES, "warm_up"])
def test_compiles_without_graph_breaks(mode):
    torch._dynamo.reset()
    model = lm(value_residual=MODES.get(mode, {"lambda_warmup_steps": 10})).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, 40, (2, T)))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("section, words", [
    ({"lambdas": [0.5]}, "value_residual.lambdas"),
    ({"lambda_1": "a"}, "value_residual.lambda_1"),
    ({"lambdas": [0.5, 0.5], "lambda_1": 1.0}, "give only lambda_1"),
    ({"mode": "svformer", "learnable": True}, "mode='svformer'"),
    ({"granularity": "head"}, "value_residual.granularity='head'"),
    ({"sides": ["decoder"]}, "has no decoder"),
    ({"lambda_warmup_steps": -1}, "lambda_warmup_steps=-1 must be >= 0"),
    ({"mode": "svformer", "lambda_warmup_steps": 5}, "cannot start as the plain model"),
])
def test_bad_settings_are_refused(section, words):
    with pytest.raises(ConfigError, match=words):
        lm(value_residual=section)


def test_lambda_1_weighs_v1_as_the_paper_writes_it():
    """The paper's V_n' = lambda_{n,1} V_1 + lambda_{n,2} V_n: lambda_1 is the weight on the first layer's values."""
    model = lm(value_residual={"lambda_1": 5.0, "lambda_2": 1.0})  # Sparse-ResFormer's lambda_{n,1} = 5
    source = model.encoder.layers[1].self_attn.kv_source
    assert float(source.lambda_first) == 5.0 and float(source.lambda_own) == 1.0
    tokens = torch.randint(0, 40, (2, T))
    assert torch.allclose(model(tokens).logits, reference_logits(model, tokens, resformer_rule(model)), atol=1e-5)


def test_the_old_lambdas_key_keeps_its_meaning_with_a_warning():
    """A config saved with ``lambdas = [on V_n, on V_1]`` loads as the same model, under the paper's names."""
    from interlayer.config import ModelConfig, config_from_dict

    data = ModelConfig(arch="causal_lm", value_residual={}).to_dict()
    data["value_residual"] = {"lambdas": [0.9, 0.1]}
    with pytest.warns(DeprecationWarning, match="lambda_1=0.1, lambda_2=0.9"):
        cfg = config_from_dict(data)
    assert (cfg.value_residual.lambda_1, cfg.value_residual.lambda_2) == (0.1, 0.9)
    with pytest.warns(DeprecationWarning):
        old = lm(value_residual={"lambdas": [0.9, 0.1]})
    assert float(old.encoder.layers[2].self_attn.kv_source.lambda_own) == pytest.approx(0.9)


def test_pairs_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match="crossformer 'vf'"):
        lm(value_residual={"mode": "svformer"}, crossformer={"hard": ["vf"]})
    with pytest.raises(ConfigError, match="lightweight.attention"):
        lm(value_residual={}, lightweight={"groups": 2})
    lm(value_residual={}, crossformer={"hard": ["kq", "vf", "ffn"]})  # ResFormer keeps every projection
