"""LW-Transformer: G-MHA (Eq. 6), G-FFN (Eq. 7-8), weight sharing, n x (Table I), G-LML / G-IL (Table III).

Every option is checked against an independent reference or a property that fails when the option does nothing:
Eq. 6 against k separate attentions, group independence for the fully group-wise variants, closed-form parameter
counts, the exact plain model at k=1, MAdds against torch's FLOP counter, incremental decoding.
"""
import pytest
import torch
from torch import nn

from helpers import count_flops
from interlayer import (
    ConfigError,
    count_madds,
    count_parameters,
    create_model,
    get_config,
    load_pretrained,
    save_pretrained,
)
from interlayer.core.attention import LogitMixer, MultiHeadAttention
from interlayer.core.components import Components
from interlayer.core.models import EncoderClassifier
from interlayer.methods.lightweight import METHOD, GroupedFeedForward, GroupedLinear, GroupedMultiHeadAttention
from interlayer.papers import lightweight
from interlayer.papers.lightweight import layer_counts

D, H, DF, V = 32, 4, 64, 50
TINY = dict(d_model=D, n_heads=H, d_ffn=DF, enc_layers=2, dec_layers=2, src_vocab_size=V, dropout=0.0)


def _model(lw=None, **core):
    fields = dict(TINY, **core)
    if fields.get("arch") == "encoder_classifier":
        fields.setdefault("num_classes", 3)
    if lw is not None:
        fields["lightweight"] = lw
    return create_model("transformer_small", **fields).eval()


def _tokens(b=3, t=7, pad_last=2):
    tokens = torch.randint(1, V, (b, t))
    tokens[-1, t - pad_last:] = 0
    return tokens


def _run(model, src, tgt=None):
    return model(src, tgt).logits if model.config.arch == "encoder_decoder" else model(src).logits


# --- k = 1 is exactly the plain Transformer -------------------------------------------------------------------

@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("core", [dict(), dict(arch="encoder_classifier", positions="relative", norm_first=True)])
def test_one_group_is_exactly_the_plain_model(share, core):
    """Mapping plain -> LW at k=1 is the identity on names and shapes (GroupedLinear uses nn.Linear's layout)."""
    plain = _model(**core)
    lw = _model(dict(groups=1, share_weights=share), **core)
    assert count_parameters(lw) == count_parameters(plain)
    assert {k: v.shape for k, v in lw.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    assert isinstance(lw.encoder.layers[0].self_attn, GroupedMultiHeadAttention)
    assert isinstance(lw.encoder.layers[0].ffn, GroupedFeedForward)
    lw.load_state_dict(plain.state_dict())
    src, tgt = _tokens(), _tokens(t=5, pad_last=0)
    assert torch.equal(_run(lw, src, tgt), _run(plain, src, tgt))


def test_one_group_with_expansion_is_the_plain_model_with_wider_queries():
    """n x at k=1 is the core's qk_dim = n d_model (Table I: "+18.8M for 3x" in the original MHA)."""
    plain = _model(qk_dim=3 * D, positions="relative")
    lw = _model(dict(groups=1, qk_expansion=3), positions="relative")
    assert count_parameters(lw) == count_parameters(plain)
    lw.load_state_dict(plain.state_dict())
    src, tgt = _tokens(), _tokens(t=5, pad_last=0)
    assert torch.equal(_run(lw, src, tgt), _run(plain, src, tgt))


# --- G-MHA (Eq. 6), weight sharing, n x ------------------------------------------------------------------------

def _block(proj: GroupedLinear, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    j = 0 if proj.blocks == 1 else i
    rows = slice(j * proj.group_out, (j + 1) * proj.group_out)
    return proj.weight[rows], proj.bias[rows]


def _eq6_reference(attn: GroupedMultiHeadAttention, x, memory, key_padding_mask):
    """Eq. 6 literally: k separate MHA(X_i) with h/k heads each, concatenated, then the dense W_O (Eq. 3)."""
    k, d_g = attn.groups, attn.d_model // attn.groups
    outs = []
    for i in range(k):
        group = MultiHeadAttention(d_g, attn.n_heads // k, qk_dim=attn.qk_dim // k, force_eager=True)
        for name in ("q_proj", "k_proj", "v_proj"):
            weight, bias = _block(getattr(attn, name), i)
            getattr(group, name).weight.data, getattr(group, name).bias.data = weight, bias
        group.out_proj.weight.data, group.out_proj.bias.data = torch.eye(d_g), torch.zeros(d_g)
        cols = slice(i * d_g, (i + 1) * d_g)
        mem_i = None if memory is None else memory[..., cols]
        outs.append(group(x[..., cols], mem_i, key_padding_mask=key_padding_mask)[0])
    return attn.out_proj(torch.cat(outs, -1))


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("expansion", [1, 2])
@pytest.mark.parametrize("cross", [False, True])
def test_grouped_attention_is_eq6(share, expansion, cross):
    attn = GroupedMultiHeadAttention(D, H, groups=2, share_weights=share, qk_expansion=expansion).eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 6, D) if cross else None
    pad = torch.zeros(2, 6 if cross else 5, dtype=torch.bool)
    pad[1, -2:] = True
    ours, _ = attn(x, memory, key_padding_mask=pad)
    torch.testing.assert_close(ours, _eq6_reference(attn, x, memory, pad))
    assert attn.scale == (expansion * D // H) ** -0.5  # Eq. 1 with the per-head query/key width


@pytest.mark.parametrize("share, weight_shape", [(False, (2 * 24, 4)), (True, (24, 4))])
def test_weight_sharing_uses_one_matrix_for_all_groups(share, weight_shape):
    """WS: one (out/k, in/k) matrix; its gradient is the sum of what k separate copies would receive."""
    shared = GroupedLinear(8, 48, groups=2, shared=share)
    assert tuple(shared.weight.shape) == weight_shape
    separate = GroupedLinear(8, 48, groups=2, shared=False)
    with torch.no_grad():
        separate.weight.copy_(shared.weight.repeat(2 // shared.blocks, 1))
        separate.bias.copy_(shared.bias.repeat(2 // shared.blocks))
    x = torch.randn(3, 8)
    torch.testing.assert_close(shared(x), separate(x))
    shared(x).square().sum().backward()
    separate(x).square().sum().backward()
    expected = separate.weight.grad.view(2, 24, 4).sum(0) if share else separate.weight.grad
    torch.testing.assert_close(shared.weight.grad, expected)


def _cross_group_gradient(module, x) -> float:
    """|d(output group 0) / d(input group 1)|: zero iff group 0 of the output never sees group 1 of the input."""
    x = x.clone().requires_grad_(True)
    out = module(x)[0] if isinstance(module, MultiHeadAttention) else module(x)
    out[..., : x.shape[-1] // 2].sum().backward()
    return x.grad[..., x.shape[-1] // 2:].abs().sum().item()


@pytest.mark.parametrize("groups, merge_groups, isolated", [(2, 1, False), (1, 2, False), (2, 2, True)])
def test_group_merge_makes_attention_fully_group_wise(groups, merge_groups, isolated):
    """G-MHA keeps the dense W_O for cross-group exchange (Sec. III-B); G-LML (Table III) removes it."""
    attn = GroupedMultiHeadAttention(D, H, groups=groups, merge_groups=merge_groups).eval()
    assert (_cross_group_gradient(attn, torch.randn(2, 5, D)) == 0) == isolated


@pytest.mark.parametrize("intermediate_groups, output_groups, isolated", [(1, 2, False), (2, 1, False),
                                                                           (2, 2, True)])
def test_intermediate_layer_makes_ffn_fully_group_wise(intermediate_groups, output_groups, isolated):
    """G-FFN groups only W2, W1 stays dense (Eq. 7-8); G-IL (Table III) groups W1 too."""
    ffn = GroupedFeedForward(D, DF, intermediate_groups=intermediate_groups, output_groups=output_groups)
    assert (_cross_group_gradient(ffn, torch.randn(2, 5, D)) == 0) == isolated


def test_grouped_ffn_is_eq7_eq8():
    ffn = GroupedFeedForward(D, DF, output_groups=2, share_weights=False).eval()
    x = torch.randn(2, 5, D)
    h = torch.relu(x @ ffn.fc1.weight.t() + ffn.fc1.bias)  # Eq. 7, dense
    blocks = [h[..., i * DF // 2:(i + 1) * DF // 2] @ _block(ffn.fc2, i)[0].t() + _block(ffn.fc2, i)[1]
              for i in range(2)]  # Eq. 8, tau(H_i) = H_i W2_i + b2_i
    torch.testing.assert_close(ffn(x), torch.cat(blocks, -1))
    assert tuple(ffn.fc1.weight.shape) == (DF, D) and tuple(ffn.fc2.weight.shape) == (2 * D // 2, DF // 2)


# --- parameter counts ------------------------------------------------------------------------------------------

def _grouped(i, o, k, s):
    """A group-wise linear layer: s stored blocks of (o/k x i/k) plus biases (Eq. 5); k = s = 1 is dense."""
    return s * ((o // k) * (i // k) + o // k)


def _expected_layer_params(k, n, share, attention=True, ffn=True, merge=False, inter=False, d=D, df=DF):
    def s(on):
        return 1 if share or not on else k

    def g(on):
        return k if on else 1
    mha = (2 * _grouped(d, n * d, g(attention), s(attention)) + _grouped(d, d, g(attention), s(attention))
           + _grouped(d, d, g(merge), s(merge)))
    feed = _grouped(d, df, g(inter), s(inter)) + _grouped(df, d, g(ffn), s(ffn))
    norm = 2 * d
    return (mha + feed + 2 * norm) + (2 * mha + feed + 3 * norm)  # one encoder + one decoder layer


@pytest.mark.parametrize("k, n, share, opts", [
    (2, 1, False, {}), (2, 1, True, {}), (4, 1, True, {}), (4, 1, False, {}), (2, 3, True, {}), (4, 2, False, {}),
    (2, 1, True, dict(merge=True)), (2, 1, True, dict(inter=True)), (4, 2, False, dict(merge=True, inter=True)),
    (2, 1, False, dict(ffn=False)), (2, 2, True, dict(attention=False)),
])
def test_parameter_counts_follow_the_formulas(k, n, share, opts):
    names = dict(merge="group_merge", inter="group_intermediate", attention="attention", ffn="ffn")
    section = dict(groups=k, qk_expansion=n, share_weights=share, **{names[o]: v for o, v in opts.items()})
    model = _model(section, enc_layers=1, dec_layers=1)
    layers = nn.ModuleList([*model.encoder.layers, *model.decoder.layers])
    assert count_parameters(layers) == _expected_layer_params(k, n, share, **opts)


def test_paper_scale_counts_closed_form():
    """Table II's baseline (MCAN-small) and LW-Transformer1x (dagger), by hand (d=512, d_f=2048, 6+6 layers, 18
    attentions): MHA 4*512^2 + 4*512 = 1,050,624; FFN 2*512*2048 + 2048 + 512 = 2,099,712 -> 44,138,496 (paper
    44.1M). G-MHA+WS 1.75*512^2 + 3*256 + 512 = 460,032; G-FFN+WS 512*2048 + 2048 + 1024*256 + 256 = 1,313,024
    -> 6*(460,032 + 1,313,024 + 2048) + 6*(2*460,032 + 1,313,024 + 3072) = 24,067,584 (paper 24.0M)."""
    params, _, madds = layer_counts("mcan_small")
    assert params == 6 * (1_050_624 + 2_099_712 + 2048) + 6 * (2 * 1_050_624 + 2_099_712 + 3072) == 44_138_496
    # 14 question tokens (encoder), 100 regions (decoder): 6*(4*14*d^2 + 2*14^2*d + 2*14*d*d_f) + 6*(4*100*d^2
    # + 2*100^2*d + 2*100*d^2 + 2*14*d^2 + 2*100*14*d + 2*100*d*d_f) = 2.58G in Table II
    assert madds == 6 * 44_240_896 + 6 * 386_015_232 == 2_581_536_768
    params, _, madds = layer_counts("lw_mcan_1x")
    assert params == 24_067_584
    assert madds == 1_853_300_736  # 1.85G in Table II


@pytest.mark.slow
def test_paper_rows_and_tables():
    """The rows are MCAN presets (interlayer.models.mcan; tests/test_mcan.py checks each count against the
    table); the Transformer registry holds no LW preset any more."""
    from interlayer import list_models

    assert [row[0] for row in lightweight.LW_TABLE_ROWS] == [
        "mcan_small", "lw_mcan_1x_gmha", "lw_mcan_1x_gffn", "lw_mcan_1x_gmha_gffn", "lw_mcan_1x", "lw_mcan_2x",
        "lw_mcan_3x", "lw_mcan_3x_k4", "lw_mcan_3x_k8", "lw_mcan_1x_glml", "lw_mcan_mini", "lw_mcan_1x_glml_gil"]
    assert set(list_models(family="mcan")) >= {row[0] for row in lightweight.LW_TABLE_ROWS}
    assert not hasattr(lightweight, "PRESETS")
    mini = get_config("lw_mcan_mini").lightweight
    assert mini.group_intermediate and not mini.group_merge and mini.share_weights
    tables = lightweight.paper_tables()
    # Tables II, III (MCAN), VIII (captioning), II / VII (REC), IX (Swin-T)
    assert [len(rows) for _, _, rows in tables] == [9, 3, 3, 3, 4]
    for _, headers, rows in tables:
        assert all(len(row) == len(headers) for row in rows)
    assert tables[1][2][1][1] == "14,618,112"  # mini: 24,067,584 - 12 * (512*2048 + 2048 - 256*1024 - 1024)


def test_section_builds_with_overrides():
    model = create_model("transformer_small", **TINY, lightweight=dict(qk_expansion=3, groups=4))  # 1 head/group
    attn = model.encoder.layers[0].self_attn
    assert (attn.groups, attn.qk_dim, tuple(attn.q_proj.weight.shape)) == (4, 3 * D, (3 * D // 4, D // 4))
    src, tgt = _tokens(), _tokens(t=5, pad_last=0)
    assert torch.isfinite(model(src, tgt).logits).all()


# --- protocol: masking, fused/eager, cache, relative positions, logit mixer, MAdds ------------------------------

@pytest.mark.parametrize("section, core", [
    (dict(), dict()),
    (dict(share_weights=False, qk_expansion=2), dict(positions="relative")),
    (dict(groups=4, group_merge=True, group_intermediate=True), dict()),
    (dict(share_weights=False, group_intermediate=True), dict(arch="encoder_classifier", classifier_hidden=8)),
    (dict(attention=False, qk_expansion=2), dict(arch="encoder_classifier", positions="relative")),
])
def test_madds_match_flop_counter(section, core):
    model = _model(section, attn_impl="eager", **core)
    src, tgt = _tokens(b=1, t=9, pad_last=0), _tokens(b=1, t=7, pad_last=0)
    if model.config.arch == "encoder_decoder":
        assert count_flops(lambda: model(src, tgt)) == 2 * count_madds(model, 9, 7)
    else:
        assert count_flops(lambda: model(src)) == 2 * count_madds(model, 9)


def test_fused_and_eager_paths_agree_with_padding():
    model = _model(dict(share_weights=False, qk_expansion=2), arch="encoder_classifier", positions="relative")
    src = _tokens(b=3, t=6)
    src[0] = 0  # an all-padding row: zeros, no NaN, on both paths
    fused = model.encoder(src).hidden
    eager = model.encoder(src, need_intermediates=True)
    torch.testing.assert_close(fused, eager.hidden)
    assert torch.isfinite(fused).all()
    assert eager.attentions[0].logits.shape == (3, H, 6, 6)


def test_incremental_decoding_equals_full_forward():
    model = _model(dict(share_weights=False, qk_expansion=2, group_merge=True, group_intermediate=True),
                   positions="relative")
    src, tgt = _tokens(b=2, t=6), torch.randint(1, V, (2, 5))
    enc = model.encode(src)
    full = model.decode(tgt, enc).logits
    cache = model.decoder.new_cache()
    steps = [model.decode(tgt[:, t:t + 1], enc, cache=cache).logits for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_relative_positions_use_the_expanded_query_width():
    model = _model(dict(qk_expansion=3), positions="relative", rel_max_distance=4)
    layer = model.decoder.layers[0]
    assert tuple(layer.self_attn.relative.embeddings.shape) == (9, 3 * D // H)
    assert layer.cross_attn.relative is None  # as in the core: relative positions within a sequence only


class _AddPrevious(LogitMixer):
    """A minimal logit mixer (the core's protocol): new = logits + alpha * previous logits."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(()))
        self.seen: list[tuple[int, ...]] = []

    def forward(self, logits, prev_logits, key_padding_mask, context=None):
        self.seen.append(tuple(prev_logits.shape))
        return logits + self.alpha * prev_logits, {}

    def madds(self, t_q, t_k):
        return 0


def test_logit_mixer_composes_with_grouped_attention():
    cfg = get_config("transformer_small", **TINY, arch="encoder_classifier", num_classes=3,
                     lightweight={"qk_expansion": 2})
    components = Components(cfg)
    METHOD.customize(cfg.lightweight, cfg, components)
    components.logit_mixer = lambda side, i: _AddPrevious() if side == "encoder" and i > 0 else None  # set later
    model = EncoderClassifier(cfg, components).eval()
    mixer = model.encoder.layers[1].self_attn.logit_mixer
    assert isinstance(model.encoder.layers[1].self_attn, GroupedMultiHeadAttention)
    src = _tokens(b=2, t=6)
    mixed = model(src).logits
    assert mixer.seen == [(2, H, 6, 6)]  # all heads of all groups as one (B, H, Tq, Tk) tensor
    with torch.no_grad():
        mixer.alpha.zero_()
    assert not torch.allclose(model(src).logits, mixed)


def test_checkpoint_round_trip(tmp_path):
    model = _model(dict(groups=2, share_weights=True, group_merge=True))
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    src, tgt = _tokens(), _tokens(t=5, pad_last=0)
    assert torch.equal(loaded(src, tgt).logits, model(src, tgt).logits)


# --- validation ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("section, core, message", [
    (dict(groups=3), dict(), "lightweight.groups=3 does not divide n_heads=4"),
    (dict(groups=0), dict(), "lightweight.groups=0 must be at least 1"),
    (dict(groups=4), dict(d_ffn=66), "does not divide d_ffn=66"),
    (dict(groups=8, ffn=False), dict(), "lightweight.groups=8 does not divide n_heads=4"),
    (dict(qk_expansion=0), dict(), "lightweight.qk_expansion=0"),
    (dict(), dict(qk_dim=64), "set qk_dim=None and lightweight.qk_expansion=2"),
    (dict(attention=False, ffn=False), dict(), "turns nothing on"),
    (dict(grups=2), dict(), "did you mean 'lightweight.groups'"),
])
def test_invalid_settings_name_the_key(section, core, message):
    with pytest.raises(ConfigError, match=message):
        get_config("transformer_small", **dict(TINY, **core), lightweight=section)


def test_conv_branch_excludes_grouped_attention_but_not_grouped_ffn():
    """conv_branch replaces the encoder self-attention itself; G-FFN touches only the FFN, so it composes."""
    cls = dict(TINY, arch="encoder_classifier", num_classes=3)
    with pytest.raises(ConfigError, match="conv_branch"):
        get_config("transformer_small", **cls, lightweight={}, conv_branch={})
    model = create_model("transformer_small", **cls, lightweight=dict(attention=False), conv_branch={})
    assert isinstance(model.encoder.layers[0].ffn, GroupedFeedForward)
    assert not isinstance(model.encoder.layers[0].self_attn, MultiHeadAttention)


def test_groups_need_only_divide_what_is_split():
    """Without G-MHA the heads are not split, so k need not divide n_heads (only d_model and d_ffn)."""
    cfg = get_config("transformer_small", **dict(TINY, n_heads=2), lightweight=dict(groups=4, attention=False))
    assert cfg.lightweight.groups == 4
    cfg = get_config("transformer_small", **dict(TINY, d_ffn=66), lightweight=dict(groups=4, ffn=False))
    assert cfg.lightweight.groups == 4
