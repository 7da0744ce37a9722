"""Layer sharing (ALBERT Sec. 3.1, Table 4; MobileLLM Sec. 2.3, Fig. 6): every order against a from-scratch loop
over the unique blocks, the plain model at repeats=1, the parameter formula, the KV cache, MPT's tied stack,
checkpoints, composition and compilation. Models are tiny (d=32, 4 layers) so the file runs in seconds."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn

from interlayer import (
    ConfigError,
    build_model,
    config_from_dict,
    count_madds,
    count_parameters,
    load_pretrained,
    save_pretrained,
)
from interlayer.checkpoint import tie_map
from interlayer.core.lm import CausalLM
from interlayer.methods.layer_sharing import LayerSharingConfig, repeat_blocks

V, L = 40, 4
LM: dict[str, Any] = dict(arch="causal_lm", src_vocab_size=V, d_model=32, n_heads=4, d_ffn=64, enc_layers=L,
                          max_positions=32, dropout=0.0, attn_dropout=0.0, positions="learned", norm_first=True,
                          tie_output=True)
SEQ2SEQ: dict[str, Any] = dict(arch="encoder_decoder", src_vocab_size=V, d_model=32, n_heads=4, d_ffn=64,
                               enc_layers=L, dec_layers=L, dropout=0.0, attn_dropout=0.0)
# The block each executed layer runs, written out from MobileLLM Fig. 6 (not computed by the module).
EXPECTED = {("immediate", 2): [0, 0, 1, 1], ("all_over", 2): [0, 1, 0, 1], ("reverse", 2): [0, 1, 1, 0],
            ("immediate", None): [0, 0, 0, 0], ("all_over", None): [0, 0, 0, 0], ("immediate", 1): [0, 1, 2, 3]}
ORDERS = [("immediate", 2), ("all_over", 2), ("reverse", 2), ("immediate", None)]


def build(base: dict[str, Any], seed: int = 0, **fields: Any) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(config_from_dict({**base, **fields})).eval()


def randomise(model: nn.Module) -> nn.Module:
    """Every parameter away from its init (LayerNorm gains and biases included), each shared tensor once."""
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model


def layer_params(d: int, f: int) -> tuple[int, int]:
    """(attention + its LayerNorm, FFN + its LayerNorm) of one pre-LN layer with biases, from the shapes."""
    return 4 * (d * d + d) + 2 * d, (d * f + f) + (f * d + d) + 2 * d


def reference_lm(model: CausalLM, blocks: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """The language model computed by a loop over the executed layers, layer i running unique block
    ``blocks[i]`` (the first layer of each block holds its weights)."""
    owner = {b: blocks.index(b) for b in set(blocks)}
    layers = model.encoder.layers
    x = model.encoder.embed(tokens)
    for b in blocks:
        x = layers[owner[b]](x, causal=True).hidden
    return model.lm_head(model.encoder.final_norm(x))


@pytest.mark.parametrize("order,repeats", ORDERS)
def test_each_order_is_a_loop_over_its_unique_blocks_forward_and_gradient(order, repeats):
    model = randomise(build(LM, layer_sharing={"order": order, "repeats": repeats}))
    blocks = EXPECTED[(order, repeats)]
    tokens = torch.randint(0, V, (2, 9))
    ours = model(tokens).logits
    ref = reference_lm(model, blocks, tokens)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    # The layers of a block hold one tensor: its gradient is the sum over every run of the block.
    (grad_ours,) = torch.autograd.grad(ours.square().sum(), model.encoder.layers[0].ffn.fc1.weight)
    (grad_ref,) = torch.autograd.grad(ref.square().sum(), model.encoder.layers[0].ffn.fc1.weight)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=1e-5, atol=1e-6)
    unique = {id(layer.ffn.fc1.weight) for layer in model.encoder.layers}
    assert len(unique) == len(set(blocks))


def test_reference_differs_when_the_order_is_wrong():
    """The reference loop tells the orders apart (so the test above would catch A B A B run for A A B B)."""
    model = randomise(build(LM, layer_sharing={"order": "immediate", "repeats": 2}))
    tokens = torch.randint(0, V, (2, 9))
    assert not torch.allclose(model(tokens).logits, reference_lm(model, [0, 1, 0, 1], tokens), atol=1e-3)


@pytest.mark.parametrize("arch", [LM, SEQ2SEQ])
def test_one_repeat_is_the_plain_model(arch):
    plain, shared = build(arch), build(arch, layer_sharing={"repeats": 1})
    assert count_parameters(plain) == count_parameters(shared) and tie_map(plain) == tie_map(shared)
    tokens = torch.randint(1, V, (2, 7))
    args = (tokens, tokens) if arch is SEQ2SEQ else (tokens,)
    assert torch.equal(plain(*args).logits, shared(*args).logits)


@pytest.mark.parametrize("share", ["all", "attention", "ffn"])
@pytest.mark.parametrize("order,repeats", ORDERS)
def test_parameter_count_is_unique_blocks_times_block_plus_the_rest(share, order, repeats):
    d, f = LM["d_model"], LM["d_ffn"]
    attn, ffn = layer_params(d, f)
    outside = V * d + LM["max_positions"] * d + 2 * d  # token table (= head), positions, final LayerNorm
    blocks = len(set(EXPECTED[(order, repeats)]))
    per_part = {"all": (blocks, blocks), "attention": (blocks, L), "ffn": (L, blocks)}[share]
    model = build(LM, layer_sharing={"share": share, "order": order, "repeats": repeats})
    expected = per_part[0] * attn + per_part[1] * ffn + outside
    assert count_parameters(model) == expected
    assert sum(p.numel() for p in model.parameters()) == expected  # what the optimizer and DDP see
    assert count_madds(model, 9) == count_madds(build(LM), 9)  # enc_layers counts executed layers


@pytest.mark.parametrize("share", ["all", "attention", "ffn"])
@pytest.mark.parametrize("order,repeats", ORDERS)
def test_language_model_is_causal_and_cache_exact(share, order, repeats):
    model = randomise(build(LM, layer_sharing={"share": share, "order": order, "repeats": repeats}))
    tokens = torch.randint(0, V, (2, 12))
    later = tokens.clone()
    later[:, 6] = (later[:, 6] + 1) % V
    full, changed = model(tokens).logits, model(later).logits
    assert torch.equal(full[:, :6], changed[:, :6]) and not torch.allclose(full[:, 6:], changed[:, 6:])
    cache = model.new_cache()
    assert len(cache) == L  # one cache per executed layer: a block's keys differ at each run
    steps = [model(tokens[:, :3], cache=cache).logits] + [model(tokens[:, i:i + 1], cache=cache).logits
                                                           for i in range(3, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_shared_decoder_ties_cross_attention_and_decodes_incrementally():
    model = randomise(build(SEQ2SEQ, layer_sharing={"share": "attention", "repeats": 2}))
    enc, dec = model.encoder.layers, model.decoder.layers
    assert dec[0].cross_attn.q_proj.weight is dec[1].cross_attn.q_proj.weight
    assert dec[0].cross_block.norm.weight is dec[1].cross_block.norm.weight
    assert dec[1].ffn.fc1.weight is not dec[0].ffn.fc1.weight
    assert enc[2].self_attn.v_proj.weight is enc[3].self_attn.v_proj.weight is not enc[0].self_attn.v_proj.weight
    src = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]])
    tgt = torch.tensor([[1, 12, 13, 14, 15, 16], [1, 17, 18, 19, 20, 21]])
    full = model(src, tgt).logits
    memory, cache = model.encode(src), model.decoder.new_cache()
    steps = [model.decode(tgt[:, t:t + 1], memory, cache=cache).logits for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_sides_limit_sharing_to_one_stack():
    model = build(SEQ2SEQ, layer_sharing={"sides": ["decoder"]})
    assert model.decoder.layers[0].ffn.fc1.weight is model.decoder.layers[3].ffn.fc1.weight
    assert model.encoder.layers[0].ffn.fc1.weight is not model.encoder.layers[1].ffn.fc1.weight


@pytest.mark.parametrize("arch", ["causal_lm", "encoder_classifier"])
def test_repeat_all_over_twice_is_multipass_tied_stack(arch):
    """MPT Table 2's "6+6-layer (tied weights)" baseline: same parameters, same outputs."""
    base = dict(LM, arch=arch, **({"num_classes": 3, "tie_output": False} if arch != "causal_lm" else {}))
    mpt = randomise(build(base, enc_layers=2, multipass={"passes": 2, "connection": "tied_stack"}))
    shared = build(base, layer_sharing={"order": "all_over", "repeats": 2})
    assert count_parameters(mpt) == count_parameters(shared)
    shared.load_state_dict(mpt.state_dict(), strict=False)  # layers 0-1 hold the blocks; 2-3 are their aliases
    assert shared.encoder.layers[2].self_attn.q_proj.weight is shared.encoder.layers[0].self_attn.q_proj.weight
    tokens = torch.randint(1, V, (2, 9))
    tokens[1, -2:] = 0
    torch.testing.assert_close(shared(tokens).logits, mpt(tokens).logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("order", ["immediate", "reverse"])
def test_save_and_load_keep_the_sharing_and_the_outputs(tmp_path, order):
    model = randomise(build(LM, layer_sharing={"order": order, "repeats": 2}))
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert tie_map(loaded) == tie_map(model) and count_parameters(loaded) == count_parameters(model)
    blocks = EXPECTED[(order, 2)]
    layers = loaded.encoder.layers
    assert all(layer.self_attn.k_proj.weight is layers[blocks.index(b)].self_attn.k_proj.weight
               for layer, b in zip(layers, blocks))
    tokens = torch.randint(0, V, (2, 9))
    assert torch.equal(loaded(tokens).logits, model(tokens).logits)
    reloaded = CausalLM.from_pretrained(tmp_path)
    assert torch.equal(reloaded(tokens).logits, model(tokens).logits)


def test_predictive_mixers_are_shared_by_the_layers_of_a_block_that_have_one():
    model = build(LM, layer_sharing={"repeats": 2}, predictive={"alpha": 0.5})
    layers = model.encoder.layers
    mixer = [dict(layer.self_attn.logit_mixer.named_parameters()) if layer.self_attn.logit_mixer else None
             for layer in layers]
    assert mixer[0] is None  # PA Sec. 3.3: no mixer in the first layer
    assert all(mixer[2][k] is mixer[3][k] for k in mixer[2])  # block B: one mixer for its two runs
    assert all(mixer[1][k] is not mixer[2][k] for k in mixer[1])  # block A's lives in its second run only
    albert = build(LM, layer_sharing={}, predictive={"alpha": 0.5})
    mixers = [layer.self_attn.logit_mixer for layer in albert.encoder.layers[1:]]
    assert all(m1.convs[0].weight is m2.convs[0].weight for m1, m2 in zip(mixers, mixers[1:]))
    randomise(model)
    tokens = torch.randint(0, V, (2, 10))
    full, cache = model(tokens).logits, model.new_cache()
    steps = [model(tokens[:, :4], cache=cache).logits] + [model(tokens[:, i:i + 1], cache=cache).logits
                                                           for i in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_crossformer_on_the_other_part_composes():
    model = build(LM, layer_sharing={"share": "ffn", "repeats": 2}, crossformer={"hard": ["kq"]})
    layers = model.encoder.layers
    assert layers[0].self_attn.k_proj.weight is layers[1].self_attn.q_proj.weight
    assert layers[0].ffn.fc2.weight is layers[1].ffn.fc2.weight
    assert layers[1].ffn.fc2.weight is not layers[2].ffn.fc2.weight
    split = build(SEQ2SEQ, layer_sharing={"sides": ["decoder"]}, crossformer={"hard": ["kq"], "sides": ["encoder"]})
    assert split.encoder.layers[0].self_attn.k_proj.weight is split.encoder.layers[1].self_attn.q_proj.weight
    assert split.decoder.layers[0].self_attn.k_proj.weight is split.decoder.layers[1].self_attn.k_proj.weight
    with pytest.raises(ConfigError, match="the decoder stack"):
        build(SEQ2SEQ, layer_sharing={"sides": ["decoder"]}, crossformer={"hard": ["kq"], "sides": ["cross"]})


@pytest.mark.parametrize("fields,message", [
    (dict(layer_sharing={"repeats": 3}), r"layer_sharing.repeats=3 must divide enc_layers=4.*\[1, 2, 4\]"),
    (dict(layer_sharing={"repeats": 0}), r"layer_sharing.repeats=0 must be a positive integer"),
    (dict(layer_sharing={"sides": ["decoder"]}), r"layer_sharing.sides=\['decoder'\].*no decoder"),
    (dict(layer_sharing={}, crossformer={"hard": ["kq"]}), r"layer_sharing.share='all' and crossformer.hard"),
    (dict(layer_sharing={"share": "attention"}, crossformer={"soft": ["vf"]}),
     r"layer_sharing.share='attention' and crossformer.soft=\['vf'\].*share='ffn'"),
    (dict(layer_sharing={"share": "ffn"}, crossformer={"hard": ["ffn", "kq"]}), r"\['ffn'\]"),
])
def test_invalid_settings_name_the_key(fields, message):
    with pytest.raises(ConfigError, match=message):
        build(LM, **fields)


def test_mobilellm_reading_of_depth_doubles_the_layers_at_the_same_parameters():
    cfg = config_from_dict(dict(LM, enc_layers=2))
    deep = repeat_blocks(cfg, repeats=2)
    assert deep.enc_layers == 4 and deep.layer_sharing == LayerSharingConfig(repeats=2)
    assert count_parameters(build_model(deep)) == count_parameters(build_model(cfg))
    assert count_madds(build_model(deep), 9) > count_madds(build_model(cfg), 9)


@pytest.mark.slow
@pytest.mark.parametrize("section", [{"repeats": 2}, {"share": "attention", "order": "reverse", "repeats": 2}])
def test_compiles_without_graph_breaks(section):
    torch._dynamo.reset()
    model = build(LM, layer_sharing=section).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, V, (2, 9)))
    assert explanation.graph_break_count == 0, [str(r.reason) for r in explanation.break_reasons]


def test_named_variants_plan_on_the_language_model_task(tmp_path):
    """``compare --task lm``: albert/mobilellm at the base's depth (fewer parameters, same MAdds), mobilellm_deep at
    twice the depth (the base's parameters)."""
    from interlayer.compare import build_plan, make_settings

    path = tmp_path / "book.txt"
    path.write_text("".join(f"Line {i}: to be, or not to be.\n" for i in range(40)))
    sets = {"data.path": str(path), "d_model": "32", "n_heads": "4", "d_ffn": "64", "enc_layers": "4",
            "data.block_size": "16"}
    names = "baseline,albert,mobilellm,mobilellm_all_over,mobilellm_deep"
    plan = {p.variant.name: p for p in build_plan(make_settings("lm", [names], seeds=1, budget_steps=4,
                                                               sets=sets)).variants}
    base = plan["baseline"]
    for name in ("albert", "mobilellm", "mobilellm_all_over"):
        assert plan[name].madds == base.madds and plan[name].parameters < base.parameters
    assert plan["albert"].parameters < plan["mobilellm"].parameters == plan["mobilellm_all_over"].parameters
    assert plan["mobilellm"].model["layer_sharing"] == {"share": "all", "repeats": 2, "order": "immediate",
                                                        "sides": None}
    assert plan["mobilellm_deep"].model["enc_layers"] == 8 and plan["mobilellm_deep"].parameters == base.parameters
