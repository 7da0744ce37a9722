"""Cross-Layer Attention (Brandon et al., arXiv:2405.12981): factor 1 is the plain model, a from-scratch reference
of groups sharing the first layer's K/V, causality and the KV cache in the language model, parameter counts, cache
bytes (factor 2 halves it), a last group of fewer layers, Multi-Pass, compilation and the refused pairs."""
import pytest
import torch
import torch._dynamo

from interlayer import ConfigError, create_model
from interlayer.core.generation import kv_cache_bytes_per_token
from helpers.kv import reference_layers, reference_logits
from helpers.lm import T, TINY, assert_cache_matches, assert_causal, assert_padded_generation_matches, lm


def cla_rule(factor):
    def rule(i, k, v, ks, vs):
        leader = (i // factor) * factor
        return (k, v) if leader == i else (ks[leader], vs[leader])
    return rule


@pytest.mark.parametrize("arch", ["causal_lm", "encoder_decoder", "encoder_classifier"])
def test_factor_one_is_the_plain_model_exactly(arch):
    extra = {"num_classes": 3} if arch == "encoder_classifier" else {}
    torch.manual_seed(0)
    plain = create_model("transformer_small", arch=arch, **TINY, **extra).eval()
    torch.manual_seed(0)
    cla = create_model("transformer_small", arch=arch, **TINY, **extra, cla={"sharing_factor": 1}).eval()
    cla.load_state_dict(plain.state_dict())
    tokens = torch.randint(4, 40, (2, T))
    tokens[1, 9:] = 0
    run = (lambda m: m(tokens, tokens[:, :7])) if arch == "encoder_decoder" else (lambda m: m(tokens))
    assert torch.equal(run(plain).logits, run(cla).logits)


@pytest.mark.parametrize("attn_impl", ["auto", "eager"])
@pytest.mark.parametrize("factor", [2, 3, 4])
def test_groups_share_the_first_layers_keys_and_values(factor, attn_impl):
    model = lm(cla={"sharing_factor": factor}, attn_impl=attn_impl)
    owners = [layer.self_attn.k_proj is not None for layer in model.encoder.layers]
    assert owners == [i % factor == 0 for i in range(TINY["enc_layers"])]
    assert all((layer.self_attn.v_proj is not None) == own for layer, own in zip(model.encoder.layers, owners))
    tokens = torch.randint(0, 40, (2, T))
    out = model(tokens).logits
    ref = reference_logits(model, tokens, cla_rule(factor))
    assert torch.allclose(out, ref, atol=1e-5)
    weight = model.encoder.layers[0].self_attn.k_proj.weight  # reaches the loss through every layer of group 0
    assert torch.allclose(torch.autograd.grad(out.square().sum(), weight)[0],
                          torch.autograd.grad(ref.square().sum(), weight)[0], atol=1e-5)


def test_the_decoder_side_shares_too():
    torch.manual_seed(0)
    model = create_model("transformer_small", arch="encoder_decoder", **TINY, dec_layers=4,
                         cla={"sharing_factor": 2}).eval()
    assert [layer.self_attn.k_proj is None for layer in model.decoder.layers] == [False, True, False, True]
    assert [layer.cross_attn.k_proj is None for layer in model.decoder.layers] == [False] * 4
    src, tgt = torch.randint(4, 40, (2, 9)), torch.randint(4, 40, (2, 7))
    full = model(src, tgt).logits
    memory = model.encoder(src)
    cache = model.decoder.new_cache()
    steps = [model.decoder(tgt[:, i:i + 1], memory.hidden, memory.padding_mask, cache=cache).logits
             for i in range(7)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    assert all(layer.self_attn.k is None for layer in cache.layers[1::2])


@pytest.mark.parametrize("positions", ["learned", "rotary", "relative"])
@pytest.mark.parametrize("factor", [2, 3])
def test_causal_and_the_cache_equals_the_full_forward(factor, positions):
    model = lm(cla={"sharing_factor": factor}, positions=positions)
    assert_causal(model)
    cache = assert_cache_matches(model)
    assert [c.k is not None for c in cache] == [i % factor == 0 for i in range(TINY["enc_layers"])]


def test_padded_prompts_generate_as_alone_with_and_without_cache():
    model = lm(cla={"sharing_factor": 2}, positions="rotary", value_residual={"mode": "svformer"})
    assert_padded_generation_matches(model)


@pytest.mark.parametrize("bias", [False, True])
def test_each_reusing_layer_has_no_kv_projections(bias):
    d, n = TINY["d_model"], TINY["enc_layers"]
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    plain = count(lm(bias=bias))
    per_layer = 2 * d * d + (2 * d if bias else 0)
    assert count(lm(cla={"sharing_factor": 2}, bias=bias)) == plain - (n // 2) * per_layer
    assert count(lm(cla={"sharing_factor": 3}, bias=bias)) == plain - 2 * per_layer  # groups {0,1,2}, {3}


def test_kv_cache_bytes_shrink_by_the_factor():
    plain = kv_cache_bytes_per_token(lm())
    assert kv_cache_bytes_per_token(lm(cla={"sharing_factor": 2})) * 2 == plain
    assert kv_cache_bytes_per_token(lm(cla={"sharing_factor": 4})) * 4 == plain
    assert kv_cache_bytes_per_token(lm(cla={"sharing_factor": 3})) * 2 == plain  # 2 KV layers of 4 (Sec. 2.1)


def test_multipass_shares_inside_each_pass():
    model = lm(cla={"sharing_factor": 2}, multipass={"connection": "tied_stack"})
    tokens = torch.randint(0, 40, (2, T))
    rule = cla_rule(2)
    x = reference_layers(model, reference_layers(model, model.encoder.embed(tokens), rule), rule)
    assert torch.allclose(model(tokens).logits, model.lm_head(model.encoder.final_norm(x)), atol=1e-5)


def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    model = lm(cla={"sharing_factor": 2}).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, 40, (2, T)))
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_bad_settings_and_pairs_are_refused():
    with pytest.raises(ConfigError, match="cla.sharing_factor=0"):
        lm(cla={"sharing_factor": 0})
    for pair in ("kq", "qk", "kk", "vf"):
        with pytest.raises(ConfigError, match="shares the computed keys/values"):
            lm(cla={"sharing_factor": 2}, crossformer={"hard": [pair]})
    with pytest.raises(ConfigError, match="conv_branch"):
        create_model("transformer_small", **TINY, num_classes=3, cla={}, conv_branch={})
    model = lm(cla={"sharing_factor": 2}, crossformer={"hard": ["qq", "ffn"]})  # weights of q / FFN: compose
    assert model.encoder.layers[0].self_attn.q_proj.weight is model.encoder.layers[1].self_attn.q_proj.weight


def test_compare_variants_resolve_on_the_main_jobs_language_model(tmp_path):
    """resformer, resformer_learnable, svformer, cla2 and cla3 build on ``compare --task lm``'s 4-layer model;
    cla3 there has groups {0, 1, 2} and {3}."""
    from interlayer.compare import build_plan, make_settings

    path = tmp_path / "book.txt"
    path.write_text("".join(f"Line {i}: to be, or not to be.\n" for i in range(40)))
    sets = {"data.path": str(path), "d_model": "64", "n_heads": "4", "d_ffn": "256", "enc_layers": "4",
            "data.block_size": "16"}
    plan = build_plan(make_settings("lm", ["baseline,resformer,resformer_learnable,svformer,cla2,cla3"], seeds=1,
                                    budget_steps=4, sets=sets))
    models = {p.variant.name: p.model for p in plan.variants}
    assert models["cla3"]["cla"] == {"sharing_factor": 3, "sides": None}
    assert models["svformer"]["value_residual"]["mode"] == "svformer"
    assert models["resformer_learnable"]["value_residual"]["learnable"] is True
