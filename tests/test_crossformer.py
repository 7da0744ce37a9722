"""Crossformer (soft and hard cross-layer guidance): ties, savings, the regulariser, checkpoints, validation."""
import copy
import math

import pytest
import torch
from torch import nn

from interlayer import (
    ConfigError,
    apply_overrides,
    build_model,
    config_from_dict,
    count_madds,
    count_parameters,
    create_model,
    get_config,
    load_pretrained,
    save_pretrained,
)
from interlayer.core.attention import MultiHeadAttention
from interlayer.methods import crossformer as cf
from interlayer.methods import lightweight
from interlayer.papers import crossformer as paper

TINY = dict(arch="encoder_decoder", src_vocab_size=40, d_model=16, n_heads=2, d_ffn=32, enc_layers=3, dec_layers=3,
            dropout=0.0)


def tiny(**section):
    return create_model(dict(TINY, crossformer=section))


def plain():
    return create_model(dict(TINY))


def tokens(batch=2, length=5):
    return torch.randint(1, TINY["src_vocab_size"], (batch, length))


def attn(model, i, stack="encoder", kind="self_attn"):
    return getattr(getattr(model, stack).layers[i], kind)


def ffn(model, i, stack="encoder"):
    return getattr(model, stack).layers[i].ffn


# --- hard guidance: which tensors are tied -------------------------------------------------------------------


@pytest.mark.parametrize("order", ["kq", "qk", "qq", "kk"])
def test_attention_orders_tie_layer_t_to_layer_t_plus_1(order):
    lower_attr, upper_attr = cf.ATTENTION_ORDERS[order]
    model = tiny(hard=[order])
    for stack in ("encoder", "decoder"):
        for i in range(2):
            lower = getattr(attn(model, i, stack), lower_attr)
            upper = getattr(attn(model, i + 1, stack), upper_attr)
            assert lower.weight is upper.weight and lower.bias is upper.bias
    # 2T query/key matrices become T+1 for every order: T-1 saved, so the Table 6 ablation is parameter-matched
    assert len({id(getattr(attn(model, i), name).weight) for i in range(3) for name in ("q_proj", "k_proj")}) == 4
    if lower_attr == upper_attr:  # qq / kk chain through the stack: one matrix serves every layer
        assert len({id(getattr(attn(model, i), lower_attr).weight) for i in range(3)}) == 1
    assert attn(model, 0).v_proj.weight is not attn(model, 1).v_proj.weight


def test_key_query_is_the_default_reading_of_eq3():
    model = tiny(hard=["kq"])
    assert model.encoder.layers[0].self_attn.k_proj.weight is model.encoder.layers[1].self_attn.q_proj.weight
    assert attn(model, 0).q_proj.weight is not attn(model, 1).q_proj.weight
    assert attn(model, 2).k_proj.weight is not attn(model, 2).q_proj.weight


def test_value_fusion_alternates_as_eq6():
    model = create_model(dict(TINY, enc_layers=4, crossformer={"hard": ["vf"]}))
    enc = [attn(model, i) for i in range(4)]
    assert enc[0].out_proj.weight is enc[1].out_proj.weight  # t = 1: W_F
    assert enc[1].v_proj.weight is enc[2].v_proj.weight  # t = 2: W_V
    assert enc[2].out_proj.weight is enc[3].out_proj.weight  # t = 3: W_F
    assert enc[0].v_proj.weight is not enc[1].v_proj.weight
    assert enc[1].out_proj.weight is not enc[2].out_proj.weight
    assert enc[0].out_proj.bias is enc[1].out_proj.bias


@pytest.mark.parametrize("order, odd, even", [("w2_w1", "fc2", "fc1"), ("w1_w2", "fc1", "fc2")])
def test_ffn_alternates_as_eq5_and_order_swaps_it(order, odd, even):
    model = create_model(dict(TINY, enc_layers=4, crossformer={"hard": ["ffn"], "ffn_order": order}))
    f = [ffn(model, i) for i in range(4)]
    for i in range(3):
        tied, free = (odd, even) if i % 2 == 0 else (even, odd)
        assert getattr(f[i], tied).weight is getattr(f[i + 1], tied).weight
        assert getattr(f[i], free).weight is not getattr(f[i + 1], free).weight


def test_include_bias_false_ties_weights_only():
    model = tiny(hard=["kq", "vf", "ffn"], include_bias=False)
    assert attn(model, 0).k_proj.weight is attn(model, 1).q_proj.weight
    assert attn(model, 0).k_proj.bias is not attn(model, 1).q_proj.bias
    assert ffn(model, 0).fc2.weight is ffn(model, 1).fc2.weight
    assert ffn(model, 0).fc2.bias is not ffn(model, 1).fc2.bias


def test_sides_select_the_stacks():
    enc_only = tiny(hard=["kq"], sides=["encoder"])
    assert attn(enc_only, 0).k_proj.weight is attn(enc_only, 1).q_proj.weight
    assert attn(enc_only, 0, "decoder").k_proj.weight is not attn(enc_only, 1, "decoder").q_proj.weight
    dec_only = tiny(hard=["kq"], sides=["decoder"])
    assert attn(dec_only, 0).k_proj.weight is not attn(dec_only, 1).q_proj.weight
    assert attn(dec_only, 0, "decoder").k_proj.weight is attn(dec_only, 1, "decoder").q_proj.weight
    default = tiny(hard=["kq"])
    assert attn(default, 0, "decoder", "cross_attn").k_proj.weight is not \
        attn(default, 1, "decoder", "cross_attn").q_proj.weight
    cross = tiny(hard=["kq", "vf"], sides=["cross"])
    cross0, cross1 = attn(cross, 0, "decoder", "cross_attn"), attn(cross, 1, "decoder", "cross_attn")
    assert cross0.k_proj.weight is cross1.q_proj.weight and cross0.out_proj.weight is cross1.out_proj.weight
    assert attn(cross, 0, "decoder").k_proj.weight is not attn(cross, 1, "decoder").q_proj.weight


def test_classifier_defaults_to_its_encoder():
    cfg = dict(TINY, arch="encoder_classifier", num_classes=3, crossformer={"hard": ["kq", "ffn"]})
    model = create_model(cfg)
    assert attn(model, 0).k_proj.weight is attn(model, 1).q_proj.weight
    assert model(tokens()).logits.shape == (2, 3)


def test_hard_guidance_is_the_plain_model_with_equal_weights():
    """HG changes nothing but the tying: a plain model loaded with HG's weights computes the same function,
    and untying one matrix (a different W_K(0)) changes the output."""
    hg = tiny(hard=["kq", "vf", "ffn"]).eval()
    base = plain().eval()
    base.load_state_dict(hg.state_dict())
    src, tgt = tokens(), tokens()
    torch.testing.assert_close(base(src, tgt).logits, hg(src, tgt).logits)
    with torch.no_grad():
        base.encoder.layers[0].self_attn.k_proj.weight.normal_()
    assert not torch.allclose(base(src, tgt).logits, hg(src, tgt).logits)


def test_shared_tensor_gets_the_gradient_of_both_roles():
    """W_K(t) = W_Q(t+1) is one parameter: its gradient is the sum of what the key of layer t and the query of
    layer t+1 would receive in the untied model with the same values."""
    hg = tiny(hard=["kq"], sides=["encoder"])
    base = plain()
    base.load_state_dict(hg.state_dict())
    src = tokens()
    shared = attn(hg, 0).k_proj.weight
    (g_shared,) = torch.autograd.grad(hg.encode(src).hidden.square().sum(), shared)
    g_key, g_query = torch.autograd.grad(base.encode(src).hidden.square().sum(),
                                         [attn(base, 0).k_proj.weight, attn(base, 1).q_proj.weight])
    torch.testing.assert_close(g_shared, g_key + g_query)
    assert g_key.abs().sum() > 0 and g_query.abs().sum() > 0


def test_hard_guidance_leaves_madds_unchanged():
    cfg = dict(TINY, attn_impl="eager")
    assert count_madds(create_model(dict(cfg, crossformer={"hard": ["kq", "vf", "ffn"]})), 7, 5) == \
        count_madds(create_model(cfg), 7, 5)


# --- parameter savings (Sec. 2.2 "Model properties") ----------------------------------------------------------


def _meta_count(fields):
    with torch.device("meta"):
        return count_parameters(build_model(config_from_dict(fields)))


D, DF = 512, 2048
BIG = dict(arch="encoder_decoder", src_vocab_size=100, d_model=D, n_heads=8, d_ffn=DF, dec_layers=2)


@pytest.mark.parametrize("layers", [2, 3, 4, 5])
@pytest.mark.parametrize("include_bias", [True, False])
def test_savings_are_exact_at_d512(layers, include_bias):
    base = _meta_count(dict(BIG, enc_layers=layers))
    expected_paper = {"kq": 1, "qq": 1, "vf": 1, "ffn": 4}  # d_m^2 per tie, bias-free (Sec. 2.2)
    for pair, per_tie in expected_paper.items():
        for order in (("w2_w1", "w1_w2") if pair == "ffn" else ("w2_w1",)):
            section = {"hard": [pair], "sides": ["encoder"], "include_bias": include_bias, "ffn_order": order}
            saved = base - _meta_count(dict(BIG, enc_layers=layers, crossformer=section))
            assert saved == cf.hard_savings(pair, layers, D, DF, bias=include_bias, ffn_order=order)
            if not include_bias:
                assert saved == per_tie * (layers - 1) * D * D
    everything = {"hard": ["kq", "vf", "ffn"], "sides": ["encoder"], "include_bias": False}
    assert base - _meta_count(dict(BIG, enc_layers=layers, crossformer=everything)) == 6 * (layers - 1) * D * D


def test_ffn_savings_with_biases_depend_on_parity():
    saved = {t: cf.hard_savings("ffn", t, D, DF) for t in (4, 5)}
    assert saved[4] == 2 * (D * DF + D) + 1 * (D * DF + DF)  # W2 tied at t=1,3; W1 at t=2
    assert saved[5] == 2 * (D * DF + D) + 2 * (D * DF + DF)  # W2 at t=1,3; W1 at t=2,4
    assert cf.hard_savings("ffn", 4, D, DF, ffn_order="w1_w2") == 2 * (D * DF + DF) + 1 * (D * DF + D)
    assert cf.hard_savings("kq", 4, D, DF, qk_dim=256) == 3 * (D * 256 + 256)


def test_savings_follow_qk_dim():
    fields = dict(TINY, qk_dim=8, enc_layers=4)
    hg = create_model(dict(fields, crossformer={"hard": ["kq"], "sides": ["encoder"]}))
    assert count_parameters(create_model(fields)) - count_parameters(hg) == cf.hard_savings("kq", 4, 16, 32, qk_dim=8)


# --- ties survive checkpoints -----------------------------------------------------------------------------------


def test_save_and_load_pretrained_keep_ties_and_outputs(tmp_path):
    model = tiny(hard=["kq", "vf", "ffn"], soft=["qq"]).eval()
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert loaded.encoder.layers[0].self_attn.k_proj.weight is loaded.encoder.layers[1].self_attn.q_proj.weight
    assert loaded.decoder.layers[1].ffn.fc1.weight is loaded.decoder.layers[2].ffn.fc1.weight
    assert count_parameters(loaded) == count_parameters(model)
    src, tgt = tokens(), tokens()
    out, ref = loaded(src, tgt), model(src, tgt)
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out.aux_losses["crossformer_sg"], ref.aux_losses["crossformer_sg"])


def test_state_dict_round_trip_keeps_ties():
    model = tiny(hard=["kq", "vf", "ffn"]).eval()
    fresh = build_model(copy.deepcopy(model.config)).eval()
    fresh.load_state_dict(model.state_dict())
    assert fresh.encoder.layers[0].self_attn.k_proj.weight is fresh.encoder.layers[1].self_attn.q_proj.weight
    assert fresh.encoder.layers[0].self_attn.out_proj.bias is fresh.encoder.layers[1].self_attn.out_proj.bias
    src, tgt = tokens(), tokens()
    torch.testing.assert_close(fresh(src, tgt).logits, model(src, tgt).logits)


# --- soft guidance (Eq. 1-2) --------------------------------------------------------------------------------------


def _sg(model):
    return model.aux_loss_fns["crossformer_sg"](model)


def test_soft_guidance_is_logged_as_its_own_aux_loss():
    model = tiny(soft=["kq"])
    out = model(tokens(), tokens())
    assert set(out.aux_losses) == {"crossformer_sg"}
    assert out.aux_losses["crossformer_sg"] > 0
    assert "crossformer_sg" not in tiny(hard=["kq"]).aux_loss_fns


def test_soft_gradient_reaches_only_the_lower_layer():
    model = tiny(soft=["kq"], sides=["encoder"])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    _sg(model).backward()
    for i in range(3):
        q = attn(model, i).q_proj
        assert q.weight.grad is None and q.bias.grad is None  # the guide (layer t+1) is stop-gradient
    for i in range(2):
        assert attn(model, i).k_proj.weight.grad.abs().sum() > 0
        assert attn(model, i).k_proj.bias.grad.abs().sum() > 0
    assert attn(model, 2).k_proj.weight.grad is None  # the top layer has nothing above it
    assert all(p.grad is None for p in model.decoder.parameters())


@pytest.mark.parametrize("order, odd, even", [("w2_w1", "fc2", "fc1"), ("w1_w2", "fc1", "fc2")])
def test_soft_ffn_and_value_fusion_follow_the_alternation(order, odd, even):
    model = tiny(soft=["ffn", "vf"], sides=["encoder"], ffn_order=order)
    _sg(model).backward()
    assert getattr(ffn(model, 0), odd).weight.grad.abs().sum() > 0
    assert getattr(ffn(model, 0), even).weight.grad is None
    assert getattr(ffn(model, 1), even).weight.grad.abs().sum() > 0
    assert getattr(ffn(model, 1), odd).weight.grad is None
    assert attn(model, 0).out_proj.weight.grad.abs().sum() > 0 and attn(model, 0).v_proj.weight.grad is None
    assert attn(model, 1).v_proj.weight.grad.abs().sum() > 0 and attn(model, 1).out_proj.weight.grad is None


def _equalise_kq(model):
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            for lower, upper in zip(stack.layers[:-1], stack.layers[1:], strict=True):
                lower.self_attn.k_proj.weight.copy_(upper.self_attn.q_proj.weight)
                lower.self_attn.k_proj.bias.copy_(upper.self_attn.q_proj.bias)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("norm", ["power", "root"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_soft_loss_is_zero_with_zero_gradient_when_weights_are_equal(p, norm, reduction):
    model = tiny(soft=["kq"], p=p, sg_norm=norm, reduction=reduction)
    _equalise_kq(model)
    loss = _sg(model)
    loss.backward()
    assert loss.item() == 0.0
    grad = attn(model, 0).k_proj.weight.grad
    assert torch.isfinite(grad).all() and grad.abs().sum() == 0


def _manual(model, p, norm, reduction, include_bias=True):
    total = 0.0
    for stack in (model.encoder, model.decoder):
        for lower, upper in zip(stack.layers[:-1], stack.layers[1:], strict=True):
            k, q = lower.self_attn.k_proj, upper.self_attn.q_proj
            diff = [(k.weight - q.weight).flatten()] + ([k.bias - q.bias] if include_bias else [])
            d = torch.cat(diff).detach().double()
            s = d.abs().pow(p).sum() if reduction == "sum" else d.abs().pow(p).mean()
            total += float(s if norm == "power" else s ** (1 / p))
    return total


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("norm", ["power", "root"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_soft_loss_value_matches_its_definition(p, norm, reduction):
    model = tiny(soft=["kq"], p=p, sg_norm=norm, reduction=reduction, alpha=0.5)
    assert _sg(model).item() == pytest.approx(0.5 * _manual(model, p, norm, reduction), rel=1e-5)


def test_soft_loss_changes_with_alpha_p_and_bias():
    values = {}
    variants = {"base": {}, "alpha": {"alpha": 0.02}, "p1": {"p": 1}, "nobias": {"include_bias": False}}
    for name, extra in variants.items():
        torch.manual_seed(0)
        model = tiny(soft=["kq"], **extra)
        with torch.no_grad():
            for layer in model.encoder.layers:
                layer.self_attn.k_proj.bias.normal_()
        values[name] = _sg(model).item()
    assert values["alpha"] == pytest.approx(2 * values["base"])
    assert values["p1"] != pytest.approx(values["base"])
    assert values["nobias"] < values["base"]


def test_soft_guidance_pulls_the_lower_layer_toward_the_upper_one():
    model = tiny(soft=["kq"], sides=["encoder"], alpha=1.0)
    upper_before = attn(model, 1).q_proj.weight.detach().clone()
    start = _sg(model).item()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        _sg(model).backward()
        opt.step()
    assert _sg(model).item() < start
    assert torch.equal(attn(model, 1).q_proj.weight, upper_before)


def test_soft_guidance_survives_deepcopy():
    model = tiny(soft=["kq"])
    clone = copy.deepcopy(model)
    with torch.no_grad():
        attn(clone, 0).k_proj.weight.add_(1.0)
    assert _sg(clone).item() != pytest.approx(_sg(model).item())


# --- validation and composition --------------------------------------------------------------------------------


@pytest.mark.parametrize("section, extra, message", [
    ({}, {}, r"at least one pair in crossformer.hard or crossformer.soft"),
    ({"hard": ["kv"]}, {}, r"crossformer.hard\[0\]='kv' is not valid"),
    ({"hard": ["kq", "kq"]}, {}, r"crossformer.hard=.*more than once"),
    ({"hard": ["kq", "qq"]}, {}, r"2 attention orders"),
    ({"hard": ["kq"], "soft": ["kq", "ffn"]}, {}, r"crossformer.soft=.*repeats \['kq'\].*identically zero"),
    ({"soft": ["kq"], "p": 3}, {}, r"crossformer.p=3 is not valid; choose 1 \(L1\) or 2 \(L2\)"),
    ({"soft": ["kq"], "alpha": -0.1}, {}, r"crossformer.alpha=-0.1 must be a finite number >= 0"),
    ({"soft": ["kq"], "ffn_order": "w2w1"}, {}, r"crossformer.ffn_order='w2w1' is not valid"),
    ({"soft": ["kq"], "sg_norm": "l2"}, {}, r"crossformer.sg_norm='l2'"),
    ({"soft": ["kq"], "reduction": "avg"}, {}, r"crossformer.reduction='avg'"),
    ({"hard": ["kq"], "sides": ["encoder", "middle"]}, {}, r"crossformer.sides\[1\]='middle' is not valid"),
    ({"hard": ["kq"], "sides": []}, {}, r"crossformer.sides is empty"),
    ({"hard": ["kq"]}, {"enc_layers": 1}, r"at least 2 layers, but enc_layers=1"),
    ({"hard": ["kq"], "sides": ["decoder"]}, {"dec_layers": 1}, r"dec_layers=1"),
    ({"hard": ["ffn"], "sides": ["cross"]}, {}, r"crossformer.hard includes 'ffn'.*no FFN stack"),
    ({"hard": ["kq"], "sides": ["decoder"]}, {"arch": "encoder_classifier", "num_classes": 2},
     r"arch='encoder_classifier' has no decoder"),
])
def test_invalid_settings_are_rejected_naming_the_key(section, extra, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(dict(TINY, **extra, crossformer=section))


def test_direct_construction_is_validated_too():
    cfg = get_config(dict(TINY))
    cfg.crossformer = cf.CrossformerConfig(hard=["xx"])
    with pytest.raises(ConfigError, match=r"crossformer.hard\[0\]='xx'"):
        cfg.validate()


def test_one_layer_side_is_fine_when_not_guided():
    model = create_model(dict(TINY, dec_layers=1, crossformer={"hard": ["kq"], "sides": ["encoder"]}))
    assert attn(model, 0).k_proj.weight is attn(model, 1).q_proj.weight


def test_overrides_from_the_command_line():
    cfg = apply_overrides(get_config(dict(TINY)), {"crossformer.hard": "kq,vf", "crossformer.include_bias": "false"})
    assert cfg.crossformer.hard == ["kq", "vf"] and cfg.crossformer.include_bias is False
    assert create_model(dict(TINY), crossformer={"hard": ["ffn"]}).config.crossformer.hard == ["ffn"]


def test_qk_dim_works_with_key_query():
    model = create_model(dict(TINY, qk_dim=8, crossformer={"hard": ["kq"]}))
    assert attn(model, 0).k_proj.weight is attn(model, 1).q_proj.weight
    assert attn(model, 0).k_proj.weight.shape == (8, 16)
    assert model(tokens(), tokens()).logits.shape == (2, 5, 40)


class _GroupAttention(nn.Module):
    """Stands for a method's attention without plain q/k/v/out projections (LW group-wise, conv-branch block)."""

    def __init__(self, d_model):
        super().__init__()
        self.inner = MultiHeadAttention(d_model, 2)


class _GroupedLinear(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, d_model // 2, d_model // 2))


class _GroupedProjectionAttention(MultiHeadAttention):
    """A MultiHeadAttention subclass whose projections are grouped (not nn.Linear), like LW's G-MHA."""

    def __init__(self, d_model):
        super().__init__(d_model, 2)
        self.k_proj = _GroupedLinear(d_model)


class _GroupFFN(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.grouped = nn.Linear(d_model // 2, d_model // 2)


@pytest.fixture
def fake_lightweight(monkeypatch):
    """Make the lightweight section install non-plain modules, independently of its real options."""
    def install(attention=_GroupAttention, feed_forward=False):
        def customize(section, cfg, components):
            if attention:
                components.self_attention = lambda side, i: attention(cfg.d_model)
            if feed_forward:
                components.ffn = lambda side, i: _GroupFFN(cfg.d_model)
        monkeypatch.setattr(lightweight.METHOD, "validate", lambda section, cfg: None)
        monkeypatch.setattr(lightweight.METHOD, "customize", customize)
        monkeypatch.setattr(lightweight.METHOD, "finalize", lambda section, cfg, model: None)
    return install


def test_attention_pairs_are_rejected_when_another_method_replaces_attention(fake_lightweight):
    fake_lightweight(attention=_GroupAttention)
    for pairs in (["kq"], ["vf"]):
        with pytest.raises(ConfigError, match=r"the lightweight section replaces layer 0's attention module with "
                                              r"_GroupAttention, which is not a MultiHeadAttention"):
            config_from_dict(dict(TINY, lightweight={}, crossformer={"soft": pairs}))
    cfg = config_from_dict(dict(TINY, lightweight={}, crossformer={"hard": ["ffn"]}))
    assert cfg.crossformer.hard == ["ffn"]


def test_grouped_projections_are_rejected_but_untouched_ones_are_not(fake_lightweight):
    fake_lightweight(attention=_GroupedProjectionAttention)
    with pytest.raises(ConfigError, match=r"crossformer.hard includes 'kq'.*whose k_proj is a _GroupedLinear"):
        config_from_dict(dict(TINY, lightweight={}, crossformer={"hard": ["kq"]}))
    model = create_model(dict(TINY, lightweight={}, crossformer={"hard": ["qq", "vf"]}))
    assert attn(model, 0).q_proj.weight is attn(model, 2).q_proj.weight


def test_ffn_pair_is_rejected_when_another_method_replaces_the_ffn(fake_lightweight):
    fake_lightweight(attention=None, feed_forward=True)
    with pytest.raises(ConfigError, match=r"crossformer.hard includes 'ffn'.*_GroupFFN"):
        config_from_dict(dict(TINY, lightweight={}, crossformer={"hard": ["ffn"]}))
    config_from_dict(dict(TINY, lightweight={}, crossformer={"hard": ["kq", "vf"]}))


def test_mismatched_projections_are_refused_when_tying():
    model = plain()
    attn(model, 1).q_proj = nn.Linear(16, 8)
    with pytest.raises(ConfigError, match=r"encoder.layers.0.self_attn.k_proj <- encoder.layers.1.self_attn.q_proj"):
        cf.METHOD.finalize(cf.CrossformerConfig(hard=["kq"]), model.config, model)


@pytest.mark.parametrize("other", ["multipass", "predictive"])
def test_hard_guidance_composes_with_multipass_and_predictive(other):
    fields = dict(TINY, arch="encoder_classifier", num_classes=3)
    alone = create_model(dict(fields, **{other: {}}))
    model = create_model(dict(fields, **{other: {}}, crossformer={"hard": ["kq", "vf", "ffn"]}))
    assert attn(model, 0).k_proj.weight is attn(model, 1).q_proj.weight
    assert ffn(model, 0).fc2.weight is ffn(model, 1).fc2.weight
    saved = sum(cf.hard_savings(pair, 3, 16, 32) for pair in ("kq", "vf", "ffn"))
    assert count_parameters(alone) - count_parameters(model) == saved
    assert torch.isfinite(model(tokens()).logits).all()


# --- presets and the paper's tables -----------------------------------------------------------------------------


def test_presets_reproduce_the_baselines_and_exact_savings():
    iwslt = _meta_count(get_config("crossformer_iwslt_transformer").to_dict())
    assert round(iwslt / 1e6) == 52
    wmt = _meta_count(get_config("crossformer_wmt_en_de_transformer").to_dict())
    assert round(wmt / 1e6) == 61
    ffn_saving = 2 * cf.hard_savings("ffn", 6, 512, 2048)  # encoder and decoder FFN stacks
    assert iwslt - _meta_count(get_config("crossformer_iwslt_ffn").to_dict()) == ffn_saving
    kq_saving = 3 * cf.hard_savings("kq", 6, 512, 2048)  # encoder, decoder and cross-attention stacks
    assert wmt - _meta_count(get_config("crossformer_wmt_en_de_key_query").to_dict()) == kq_saving
    assert wmt - _meta_count(get_config("crossformer_wmt_en_de_value").to_dict()) == \
        3 * cf.hard_savings("vf", 6, 512, 2048)
    sg = get_config("crossformer_iwslt_sg_key_query").crossformer
    assert (sg.alpha, sg.p, sg.soft_target, sg.reduction) == (0.01, 2, "weights", "sum")
    assert sg.sides == get_config("crossformer_iwslt_key_query").crossformer.sides == ["encoder", "decoder", "cross"]
    assert get_config("crossformer_wmt_en_de_all_16l").enc_layers == 16


# Tables 1-3 rows (paper #Params, millions) and the preset named after each; Table 3 is Table 2's with 36 encoder
# layers. Written out here, not read from the module.
PAPER_ROWS = [("crossformer_iwslt_ffn", {}, 39), ("crossformer_iwslt_value", {}, 48),
              ("crossformer_iwslt_key_query", {}, 48), ("crossformer_wmt_en_de_ffn", {}, 47),
              ("crossformer_wmt_en_de_value", {}, 57), ("crossformer_wmt_en_de_key_query", {}, 57),
              ("crossformer_wmt_en_de_all_16l", {}, 60), ("crossformer_wmt_en_de_ffn", {"enc_layers": 36}, 111),
              ("crossformer_wmt_en_de_value", {"enc_layers": 36}, 142),
              ("crossformer_wmt_en_de_key_query", {"enc_layers": 36}, 142)]


@pytest.mark.parametrize("name, overrides, paper", PAPER_ROWS)
def test_each_preset_named_after_a_row_is_the_closest_choice_of_stacks(name, overrides, paper):
    """Guiding the cross-attention stack or not: the preset takes whichever is nearer the row's #Params."""
    def distance(sides):
        fields = get_config(name, **overrides).to_dict()
        fields["crossformer"]["sides"] = sides
        return abs(_meta_count(fields) / 1e6 - paper)

    preset = distance(get_config(name).crossformer.sides)
    assert preset <= min(distance(None), distance(["encoder", "decoder", "cross"])), name


@pytest.mark.slow
def test_paper_tables_list_ours_beside_the_paper():
    tables = paper.paper_tables()
    assert [title.split(":")[0] for title, _, _ in tables] == ["Crossformer Table 1", "Crossformer Table 2",
                                                                "Crossformer Table 3"]
    assert all(headers == ["model", "ours", "paper", "diff", "saved d_m^2/block"] for _, headers, _ in tables)
    rows = {row[0]: row for _, _, table in tables for row in table}
    assert rows["crossformer_iwslt_transformer"][1:4] == ["52.07M", "52M", "+0.07M"]
    assert rows["crossformer_iwslt_key_query"][1:4] == ["48.13M", "48M", "+0.13M"]
    assert rows["crossformer_iwslt_key_query (self-attention only)"][1] == "49.44M"
    assert rows["crossformer_wmt_en_de_key_query (36L enc)"][1] == "143.28M"
    assert math.isclose(float(rows["crossformer_iwslt_ffn"][4]), 4 * 10 / 12, abs_tol=0.01)


# --- Table 6 orders: the ties written out by hand -----------------------------------------------------------------


def _partition(model, names, layers, stack="encoder", kind="ffn"):
    """Group ``"i.name"`` labels by the identity of their weight: which matrices are one parameter."""
    groups: dict[int, set[str]] = {}
    for i in range(layers):
        block = ffn(model, i, stack) if kind == "ffn" else attn(model, i, stack)
        for name in names:
            groups.setdefault(id(getattr(block, name).weight), set()).add(f"{i}.{name}")
    return sorted(sorted(group) for group in groups.values())


# Table 6, self-attention rows ("Query Query", "Key Key", "Query Key", "Key Query"): the lower layer's first-named
# matrix is the upper layer's second-named one, for t = 1, 2 of a 3-layer stack (q = q_proj, k = k_proj).
ATTENTION_TIES = {
    "qq": [{"0.q_proj", "1.q_proj", "2.q_proj"}, {"0.k_proj"}, {"1.k_proj"}, {"2.k_proj"}],
    "kk": [{"0.k_proj", "1.k_proj", "2.k_proj"}, {"0.q_proj"}, {"1.q_proj"}, {"2.q_proj"}],
    "qk": [{"0.q_proj", "1.k_proj"}, {"1.q_proj", "2.k_proj"}, {"0.k_proj"}, {"2.q_proj"}],
    "kq": [{"0.k_proj", "1.q_proj"}, {"1.k_proj", "2.q_proj"}, {"0.q_proj"}, {"2.k_proj"}],
}
# Table 6, FFN rows, and Eq. 6 for value-fusion, in a 4-layer stack (t = 1, 2, 3 is the lower index 0, 1, 2).
ALTERNATION_TIES = {
    ("ffn", "w2_w1"): [{"0.fc2", "1.fc2"}, {"1.fc1", "2.fc1"}, {"2.fc2", "3.fc2"}, {"0.fc1"}, {"3.fc1"}],
    ("ffn", "w1_w2"): [{"0.fc1", "1.fc1"}, {"1.fc2", "2.fc2"}, {"2.fc1", "3.fc1"}, {"0.fc2"}, {"3.fc2"}],
    ("vf", "w2_w1"): [{"0.out_proj", "1.out_proj"}, {"1.v_proj", "2.v_proj"}, {"2.out_proj", "3.out_proj"},
                      {"0.v_proj"}, {"3.v_proj"}],
}


@pytest.mark.parametrize("order", list(ATTENTION_TIES))
def test_table6_attention_orders_tie_exactly_the_expected_matrices(order):
    model = tiny(hard=[order])
    for stack in ("encoder", "decoder"):
        assert _partition(model, ("q_proj", "k_proj"), 3, stack, "attn") == \
            sorted(sorted(group) for group in ATTENTION_TIES[order])


@pytest.mark.parametrize("pair, ffn_order", list(ALTERNATION_TIES))
def test_table6_ffn_orders_and_eq6_tie_exactly_the_expected_matrices(pair, ffn_order):
    model = create_model(dict(TINY, enc_layers=4, crossformer={"hard": [pair], "ffn_order": ffn_order}))
    names, kind = (("fc1", "fc2"), "ffn") if pair == "ffn" else (("v_proj", "out_proj"), "attn")
    assert _partition(model, names, 4, kind=kind) == sorted(sorted(g) for g in ALTERNATION_TIES[pair, ffn_order])


# SG on weights for each Table 6 order: (matrix of layer t, matrix of layer t+1) written out by hand.
SOFT_ORDERS = {"qq": ("q_proj", "q_proj"), "kk": ("k_proj", "k_proj"), "qk": ("q_proj", "k_proj"),
               "kq": ("k_proj", "q_proj")}


@pytest.mark.parametrize("order", list(SOFT_ORDERS))
def test_table6_orders_regularise_the_expected_matrices(order):
    lower_name, upper_name = SOFT_ORDERS[order]
    model = tiny(soft=[order], sides=["encoder"], alpha=1.0)
    expected = 0.0
    for i in range(2):
        lower, upper = getattr(attn(model, i), lower_name), getattr(attn(model, i + 1), upper_name)
        with torch.no_grad():
            expected += float((lower.weight - upper.weight).pow(2).sum() + (lower.bias - upper.bias).pow(2).sum())
    loss = _sg(model)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    for i in range(3):
        for name in ("q_proj", "k_proj"):
            grad = getattr(attn(model, i), name).weight.grad
            assert (grad is not None) == (name == lower_name and i < 2), (order, i, name)


# --- soft guidance on states (soft_target="states") ---------------------------------------------------------------


def _merge(heads):
    """(B, H, T, d_h) per-head tensor -> (B, T, H d_h), the projection's output layout."""
    b, h, t, d = heads.shape
    return heads.transpose(1, 2).reshape(b, t, h * d)


def _masked_sum(lower, upper, padding):
    keep = (~padding).unsqueeze(-1).double()
    diff = (lower.double() - upper.double()) * keep
    return float(diff.detach().pow(2).sum()), float(keep.sum()) * lower.shape[-1]


def _padded_batch():
    src, tgt = tokens(3, 6), tokens(3, 5)
    src[1, -2:] = 0
    src[2, -4:] = 0
    tgt[2, -3:] = 0
    return src, tgt


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("passes", [1, 2])
def test_state_guidance_equals_keys_against_next_queries_from_the_intermediates(reduction, passes):
    """Eq. 1 on states: K(t) of every layer against Q(t+1), over the real positions, from the attention
    intermediates of the same forward. Every MPT pass counts; a link's mean pools its passes:
    sum / (real positions x width x passes)."""
    extra = {"multipass": {"passes": passes}} if passes > 1 else {}
    model = create_model(dict(TINY, **extra, crossformer={"soft": ["kq"], "soft_target": "states", "alpha": 0.5,
                                                          "reduction": reduction})).eval()
    src, tgt = _padded_batch()
    out = model(src, tgt, need_intermediates=True)
    assert len(out.encoder.attentions) == 3 * passes
    expected = 0.0
    for attentions, padding in ((out.encoder.attentions, src.eq(0)), (out.decoder.self_attentions, tgt.eq(0))):
        for i in range(2):  # links (0, 1) and (1, 2) of each stack
            sums = [_masked_sum(_merge(attentions[3 * run + i].k), _merge(attentions[3 * run + i + 1].q), padding)
                    for run in range(len(attentions) // 3)]
            total, count = sum(t for t, _ in sums), sum(c for _, c in sums)
            expected += total if reduction == "sum" else total / count
    assert out.aux_losses["crossformer_sg"].item() == pytest.approx(0.5 * expected, rel=1e-5)


@pytest.mark.parametrize("ffn_order", ["w2_w1", "w1_w2"])
def test_state_guidance_of_value_fusion_and_ffn_follows_the_alternation(ffn_order):
    """vf: the fusion outputs A V W_F of layers t, t+1 at odd t, the values V at even t (Eq. 6); ffn: the outputs
    of the alternated FFN matrices (W_1's before the activation), Eq. 5. Computed here from each layer's parts."""
    fields = dict(TINY, arch="encoder_classifier", num_classes=3, enc_layers=4)
    model = create_model(dict(fields, crossformer={"soft": ["vf", "ffn"], "soft_target": "states",
                                                   "ffn_order": ffn_order, "alpha": 1.0})).eval()
    src = _padded_batch()[0]
    out = model(src, need_intermediates=True)
    layers = model.encoder.layers
    fusion = [layers[i].self_attn.out_proj(_merge(out.encoder.attentions[i].probs @ out.encoder.attentions[i].v))
              for i in range(4)]
    values = [_merge(out.encoder.attentions[i].v) for i in range(4)]
    ffn_in = [layers[i].ffn_block.split(out.encoder.mids[i])[0] for i in range(4)]
    fc1 = [layers[i].ffn.fc1(ffn_in[i]) for i in range(4)]
    fc2 = [layers[i].ffn(ffn_in[i]) for i in range(4)]
    odd, even = (fc2, fc1) if ffn_order == "w2_w1" else (fc1, fc2)
    pairs = [(fusion[0], fusion[1]), (values[1], values[2]), (fusion[2], fusion[3]),  # t = 1, 2, 3 (vf)
             (odd[0], odd[1]), (even[1], even[2]), (odd[2], odd[3])]  # t = 1, 2, 3 (ffn)
    expected = sum(_masked_sum(lower, upper, src.eq(0))[0] for lower, upper in pairs)
    assert out.aux_losses["crossformer_sg"].item() == pytest.approx(expected, rel=1e-5)


def _states_model(**section):
    fields = dict(TINY, crossformer=dict({"soft_target": "states"}, **section))
    return create_model(fields).eval()


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("soft, sides", [(["kq", "vf", "ffn"], None), (["qq", "kk", "vf"], ["cross"])])
def test_state_guidance_ignores_padding(reduction, soft, sides):
    """A sentence pair alone and the same pair padded (source and target) give the same term."""
    model = _states_model(soft=soft, sides=sides, reduction=reduction)
    src, tgt = tokens(1, 5), tokens(1, 4)
    alone = model(src, tgt).aux_losses["crossformer_sg"]
    padded_src = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    padded_tgt = torch.cat([tgt, torch.zeros(1, 2, dtype=torch.long)], 1)
    padded = model(padded_src, padded_tgt).aux_losses["crossformer_sg"]
    torch.testing.assert_close(padded, alone)
    batch = model(torch.cat([padded_src, tokens(1, 8)]), torch.cat([padded_tgt, tokens(1, 6)]))
    assert batch.aux_losses["crossformer_sg"].item() != pytest.approx(alone.item())  # the other row counts


def test_state_gradient_reaches_layer_t_and_below_never_the_guide():
    model = _states_model(soft=["kq"], sides=["encoder"])
    model(*_padded_batch()).aux_losses["crossformer_sg"].backward()
    assert model.encoder.embed.tokens.weight.grad.abs().sum() > 0  # K(t) depends on everything below layer t
    assert attn(model, 0).q_proj.weight.grad.abs().sum() > 0 and ffn(model, 0).fc2.weight.grad.abs().sum() > 0
    assert attn(model, 1).k_proj.weight.grad.abs().sum() > 0
    assert attn(model, 1).q_proj.weight.grad is None  # layer 1's query only guides (stop-gradient)
    assert all(p.grad is None for p in model.encoder.layers[2].parameters())
    assert all(p.grad is None for p in model.decoder.parameters())
    weights = tiny(soft=["kq"], sides=["encoder"])
    weights(*_padded_batch()).aux_losses["crossformer_sg"].backward()
    assert weights.encoder.embed.tokens.weight.grad is None  # the weights target touches only W_K(t)


def test_state_gradient_stops_at_a_guide_computed_by_the_forward():
    """FFN states are the forward's own outputs (in the graph): the guide's must be detached. W_2-W_1 order:
    fc2 outputs of layers 0 and 1, then fc1 outputs of layers 1 and 2."""
    model = _states_model(soft=["ffn"], sides=["encoder"])
    model(*_padded_batch()).aux_losses["crossformer_sg"].backward()
    assert ffn(model, 1).fc1.weight.grad.abs().sum() > 0 and ffn(model, 0).fc2.weight.grad.abs().sum() > 0
    assert ffn(model, 1).fc2.weight.grad is None  # layer 1's fc2 output only guides layer 0's
    assert all(p.grad is None for p in model.encoder.layers[2].parameters())


def test_state_guidance_keeps_the_fused_attention_path(monkeypatch):
    """The q/k/v states are re-projected from the attention's input instead of requesting the intermediates,
    which would switch every guided attention to the eager path."""
    def refuse(*args, **kwargs):
        raise AssertionError("the eager attention path ran")

    model = _states_model(soft=["qq", "kk", "vf", "ffn"], sides=["encoder", "decoder", "cross"])
    monkeypatch.setattr(MultiHeadAttention, "_eager", refuse)
    assert model(*_padded_batch()).aux_losses["crossformer_sg"] > 0


def test_states_are_recorded_only_inside_the_models_forward():
    model = _states_model(soft=["kq", "vf"])
    guidance = model.aux_loss_fns["crossformer_sg"]
    src, tgt = _padded_batch()
    model(src, tgt)
    assert guidance.recorder.states == {} and not guidance.recorder.armed  # dropped after the forward
    enc = model.encode(src)
    model.decode(tgt, enc)
    assert guidance.recorder.states == {}  # encode/decode (generation) keep nothing
    with pytest.raises(RuntimeError, match=r"exists only inside model\(...\)"):
        guidance(model)
    with torch.no_grad():
        assert model(src, tgt).aux_losses["crossformer_sg"] > 0  # validation still reports it


def test_state_guidance_survives_deepcopy_and_checkpoints(tmp_path):
    model = _states_model(soft=["kq", "ffn"])
    src, tgt = _padded_batch()
    reference = model(src, tgt).aux_losses["crossformer_sg"]
    clone = copy.deepcopy(model)
    torch.testing.assert_close(clone(src, tgt).aux_losses["crossformer_sg"], reference)
    assert clone.aux_loss_fns["crossformer_sg"].recorder is not model.aux_loss_fns["crossformer_sg"].recorder
    save_pretrained(model, tmp_path)
    torch.testing.assert_close(load_pretrained(tmp_path).eval()(src, tgt).aux_losses["crossformer_sg"], reference)


@pytest.mark.parametrize("section, message", [
    ({"hard": ["kq"], "soft_target": "states"}, r"soft_target='states' .* crossformer.soft is empty"),
    ({"soft": ["kq"], "soft_target": "states", "include_bias": False}, r"include_bias=False does nothing"),
    ({"soft": ["qq", "kq"], "soft_target": "states", "sides": ["encoder", "cross"]}, r"no common positions"),
    ({"soft": ["kq"], "soft_target": "activations"}, r"crossformer.soft_target='activations' is not valid"),
])
def test_invalid_state_settings_are_rejected(section, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(dict(TINY, crossformer=section))


def test_reduction_is_read_from_configs_saved_with_its_old_name():
    from interlayer.config import config_from_dict

    data = get_config("transformer_small", crossformer={"soft": ["kq"], "reduction": "mean"}).to_dict()
    data["crossformer"]["sg_reduction"] = data["crossformer"].pop("reduction")
    assert config_from_dict(data).crossformer.reduction == "mean"
    data["crossformer"]["reduction"] = "sum"
    with pytest.raises(ConfigError, match="old name of crossformer.reduction"):
        config_from_dict(data)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_state_guidance_on_the_causal_lm_ignores_padding(reduction):
    """The causal LM runs its stack through encoder.process, not the encoder's forward: the padding comes from the
    model's own padding_mask (issue 29). Causal attention keeps the real positions' states as they are alone."""
    model = create_model(dict(arch="causal_lm", src_vocab_size=40, d_model=16, n_heads=2, d_ffn=32, enc_layers=3,
                              crossformer={"soft": ["kq", "ffn"], "soft_target": "states",
                                           "reduction": reduction})).eval()
    real = tokens(1, 5)
    alone = model(real).aux_losses["crossformer_sg"]
    padded = torch.cat([real, tokens(1, 3)], 1)
    mask = torch.zeros_like(padded, dtype=torch.bool)
    mask[:, 5:] = True
    torch.testing.assert_close(model(padded, padding_mask=mask).aux_losses["crossformer_sg"], alone)
