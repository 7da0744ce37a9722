"""Cross-Layer Attention (Brandon et al., arXiv:2405.12981): factor 1 is the plain model, a from-scratch reference
of groups sharing the first layer's K/V, causality and the KV cache in the language model, parameter counts, cache
bytes (factor 2 halves it), the short group first (Fig. 2) or last, the K/V projections' own layer norms (Sec. 3.1),
Multi-Pass, compilation and the refused pairs."""
import pytest
import torch
import torch._dynamo

from helpers.kv import reference_layers, reference_logits
from helpers.lm import TINY, T, assert_cache_matches, assert_causal, assert_padded_generation_matches, lm
from interlayer import ConfigError, create_model
from interlayer.core.generation import kv_cache_bytes_per_token
from interlayer.methods.cla import group_leader


def leaders(factor, n_layers=TINY["enc_layers"], short_group="first"):
    """The group leaders written out: the short group (n_layers % factor layers) first or last, then full groups."""
    short = n_layers % factor
    sizes = ([short] if short and short_group == "first" else []) + [factor] * (n_layers // factor) + (
        [short] if short and short_group == "last" else [])
    starts = [sum(sizes[:g]) for g in range(len(sizes))]
    return [max(s for s in starts if s <= i) for i in range(n_layers)]


def cla_rule(factor, short_group="first"):
    lead = leaders(factor, short_group=short_group)

    def rule(i, k, v, ks, vs):
        return (k, v) if lead[i] == i else (ks[lead[i]], vs[lead[i]])
    return rule


def randomise_norms(model):
    """Every LayerNorm's affine parameters drawn away from 1 and 0, so a norm read in the wrong place shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))


@pytest.mark.parametrize("arch", ["causal_lm", "encoder_decoder", "encoder_classifier"])
def test_factor_one_is_the_plain_model_exactly(arch):
    extra = {"num_classes": 3} if arch == "encoder_classifier" else {}
    torch.manual_seed(0)
    plain = create_model("transformer_small", arch=arch, **TINY, **extra).eval()
    torch.manual_seed(0)
    cla = create_model("transformer_small", arch=arch, **TINY, **extra,
                       cla={"sharing_factor": 1, "separate_kv_norm": False}).eval()
    cla.load_state_dict(plain.state_dict())
    tokens = torch.randint(4, 40, (2, T))
    tokens[1, 9:] = 0
    run = (lambda m: m(tokens, tokens[:, :7])) if arch == "encoder_decoder" else (lambda m: m(tokens))
    assert torch.equal(run(plain).logits, run(cla).logits)


@pytest.mark.parametrize("attn_impl", ["auto", "eager"])
@pytest.mark.parametrize("factor", [2, 3, 4])
def test_groups_share_the_first_layers_keys_and_values(factor, attn_impl):
    model = lm(cla={"sharing_factor": factor}, attn_impl=attn_impl)
    randomise_norms(model)
    owners = [layer.self_attn.k_proj is not None for layer in model.encoder.layers]
    assert owners == [lead == i for i, lead in enumerate(leaders(factor))]
    assert [hasattr(layer.attn_block, "kv_norm") for layer in model.encoder.layers] == owners
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
    randomise_norms(model)
    assert_causal(model)
    cache = assert_cache_matches(model)
    assert [c.k is not None for c in cache] == [lead == i for i, lead in enumerate(leaders(factor))]


def test_padded_prompts_generate_as_alone_with_and_without_cache():
    model = lm(cla={"sharing_factor": 2}, positions="rotary", value_residual={"mode": "svformer"})
    assert_padded_generation_matches(model)


@pytest.mark.parametrize("bias", [False, True])
def test_each_reusing_layer_has_no_kv_projections_and_each_kv_layer_its_own_norm(bias):
    """Sec. 2.1: a reusing layer has no K/V projections; Sec. 3.1: a K/V layer has its own LayerNorm for them
    (gamma and beta: 2 d, or d without biases)."""
    d, n = TINY["d_model"], TINY["enc_layers"]
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    plain = count(lm(bias=bias))
    per_layer = 2 * d * d + (2 * d if bias else 0)
    kv_norm = 2 * d if bias else d
    assert count(lm(cla={"sharing_factor": 2}, bias=bias)) == plain - (n // 2) * per_layer + (n // 2) * kv_norm
    assert count(lm(cla={"sharing_factor": 3}, bias=bias)) == plain - 2 * per_layer + 2 * kv_norm  # {0}, {1,2,3}
    shared = {"sharing_factor": 2, "separate_kv_norm": False}
    assert count(lm(cla=shared, bias=bias)) == plain - (n // 2) * per_layer


def test_the_short_group_is_first_by_default_as_in_fig_2():
    """Fig. 2: CLA3 on 10 layers puts layer 0 alone, then {1,2,3}, {4,5,6}, {7,8,9}; "last" is the other way."""
    assert [group_leader(i, 3, 10) for i in range(10)] == [0, 1, 1, 1, 4, 4, 4, 7, 7, 7]
    assert [group_leader(i, 3, 10, "last") for i in range(10)] == [0, 0, 0, 3, 3, 3, 6, 6, 6, 9]
    model = lm(cla={"sharing_factor": 3}, enc_layers=10)
    assert [layer.self_attn.k_proj is not None for layer in model.encoder.layers] == [
        True, True, False, False, True, False, False, True, False, False]
    model = lm(cla={"sharing_factor": 3, "short_group": "last"})
    randomise_norms(model)
    assert [layer.self_attn.k_proj is not None for layer in model.encoder.layers] == [True, False, False, True]
    tokens = torch.randint(0, 40, (2, T))
    assert torch.allclose(model(tokens).logits, reference_logits(model, tokens, cla_rule(3, "last")), atol=1e-5)
    with pytest.raises(ConfigError, match="short_group"):
        lm(cla={"short_group": "middle"})


def test_the_kv_projections_read_their_own_norm():
    """Sec. 3.1: the leader's key/value projections read ``kv_norm(x)``, its query projection the block's pre-norm;
    with ``separate_kv_norm=False`` both read the pre-norm (the reference then uses it for all three)."""
    model = lm(cla={"sharing_factor": 2})
    randomise_norms(model)
    tokens = torch.randint(0, 40, (2, T))
    ref = reference_logits(model, tokens, cla_rule(2))
    assert torch.allclose(model(tokens).logits, ref, atol=1e-5)
    kv_norm = model.encoder.layers[0].attn_block.kv_norm.weight
    grad, = torch.autograd.grad(model(tokens).logits.square().sum(), kv_norm)
    ref_grad, = torch.autograd.grad(ref.square().sum(), kv_norm)
    assert torch.allclose(grad, ref_grad, atol=1e-4) and grad.abs().sum() > 0
    with torch.no_grad():  # the norm matters: a K/V norm set apart from the pre-norm changes the output
        model.encoder.layers[0].attn_block.kv_norm.weight.mul_(2.0)
    assert not torch.allclose(model(tokens).logits, ref, atol=1e-3)


def test_separate_norms_only_where_a_pre_norm_is():
    """Post-LN blocks and hyper-connections have no core pre-norm to separate: none is added, and asking for it is
    refused with the reason."""
    torch.manual_seed(0)
    post = create_model("transformer_small", arch="encoder_classifier", num_classes=3, **TINY, cla={})
    assert not any(hasattr(layer.attn_block, "kv_norm") for layer in post.encoder.layers)
    assert not any(hasattr(layer.attn_block, "kv_norm") for layer in lm(cla={}, hyper_connections={}).encoder.layers)
    with pytest.raises(ConfigError, match="separate_kv_norm.*norm_first"):
        create_model("transformer_small", arch="encoder_classifier", num_classes=3, **TINY,
                     cla={"separate_kv_norm": True})
    with pytest.raises(ConfigError, match="separate_kv_norm.*replaced the residual"):
        lm(cla={"separate_kv_norm": True}, mhc={})


def test_kv_cache_bytes_shrink_by_the_factor():
    plain = kv_cache_bytes_per_token(lm())
    assert kv_cache_bytes_per_token(lm(cla={"sharing_factor": 2})) * 2 == plain
    assert kv_cache_bytes_per_token(lm(cla={"sharing_factor": 4})) * 4 == plain
    assert kv_cache_bytes_per_token(lm(cla={"sharing_factor": 3})) * 2 == plain  # {0}, {1,2,3}: 2 KV layers of 4


def test_multipass_shares_inside_each_pass():
    model = lm(cla={"sharing_factor": 2}, multipass={"connection": "tied_stack"})
    tokens = torch.randint(0, 40, (2, T))
    rule = cla_rule(2)
    x = reference_layers(model, reference_layers(model, model.encoder.embed(tokens), rule), rule)
    assert torch.allclose(model(tokens).logits, model.lm_head(model.encoder.final_norm(x)), atol=1e-5)


@pytest.mark.slow
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
    cla3 there has groups {0} and {1, 2, 3} (the short group first, Fig. 2)."""
    from interlayer.compare import build_plan, make_settings

    path = tmp_path / "book.txt"
    path.write_text("".join(f"Line {i}: to be, or not to be.\n" for i in range(40)))
    sets = {"data.path": str(path), "d_model": "64", "n_heads": "4", "d_ffn": "256", "enc_layers": "4",
            "data.block_size": "16"}
    plan = build_plan(make_settings("lm", ["baseline,resformer,resformer_learnable,svformer,cla2,cla3"], seeds=1,
                                    budget_steps=4, sets=sets))
    models = {p.variant.name: p.model for p in plan.variants}
    assert models["cla3"]["cla"] == {"sharing_factor": 3, "short_group": "first", "separate_kv_norm": None,
                                     "sides": None}
    assert models["svformer"]["value_residual"]["mode"] == "svformer"
    assert models["resformer_learnable"]["value_residual"]["learnable"] is True


def test_a_factor_beyond_the_depth_is_refused_naming_the_largest_useful_value():
    """cla.sharing_factor=1000000 on 4 layers was silently one group (issue 43): every factor from the depth on makes
    that same group, so the depth is the largest useful value."""
    with pytest.raises(ConfigError, match=r"cla\.sharing_factor=1000000 is larger than the depth \(enc_layers=4\): 4 "
                                          r"already makes each stack one group .* the largest useful value; give "
                                          r"1\.\.4"):
        lm(cla={"sharing_factor": 1_000_000})
    assert lm(cla={"sharing_factor": 4}).config.cla.sharing_factor == 4  # the depth itself: one group, accepted
    with pytest.raises(ConfigError, match=r"larger than the depth \(enc_layers=2 and dec_layers=3\): 3 already"):
        create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=3,
                     cla={"sharing_factor": 4})
    create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=3,
                 cla={"sharing_factor": 3})  # useful on the decoder; the encoder is one group
