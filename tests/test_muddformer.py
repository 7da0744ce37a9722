"""MUDDFormer (Xiao et al., ICML 2025): the plain Transformer exactly at initialisation (Sec. 3), Eq. 3-8 against a
loop written from the equations (forward and gradient), the static single-way form equal to DenseFormer, the kxp
variant, PrePostDANorm (Eq. 10) and FFN re-allocation (Eq. 9), causal and cache-exact in the LM, parameter counts
(App. B shapes), MAdds, Multi-Pass, compilation and the refusals."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from helpers.lm import TINY as LM_FIELDS
from helpers.lm import assert_cache_matches, assert_causal, assert_seq2seq_cache_matches
from helpers.lm import lm as tiny_lm
from interlayer import ConfigError, count_madds, create_model
from interlayer.methods.muddformer import ffn_width

TINY = {**LM_FIELDS, "enc_layers": 4}
SMALL = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dec_layers=2, src_vocab_size=50, dropout=0.0,
             attn_dropout=0.0)


def lm(**overrides):
    return tiny_lm(**{"enc_layers": TINY["enc_layers"], **overrides})


def randomise(model):
    """Every DA weight drawn away from its initialisation (W2 = 0 and one-hot a_i would hide a wrong input)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".depth." in name:
                p.copy_(torch.randn_like(p) * (0.5 if name.endswith(("static", "w2.weight")) else 0.3)
                        + (1.0 if ".pre_norms." in name else 0.0))


def reference_stack(model, x, k=1, p=1, causal=True):
    """Eq. 3-8 from scratch: X_0 = x; block i reads X^Q, X^K, X^V (each through the block's pre-norm) and X^R;
    after blocks with p | i, DA_i^c = sum_j (GELU(RMSNorm(X_i) W1) W2 + a_i)[c, j] X_j over j = i mod k; the last
    DA gives X^R only. With PrePostDANorm the sources are Norm(X_j) and each way is Norm(DA) + X_i (Eq. 10)."""
    stack = model.encoder
    depth = stack.depth
    xs, ways = [x], (x, x, x, x)
    sources = [depth.pre_norms["0"](x) if depth.pre_norms is not None else x]
    for index, layer in enumerate(stack.layers):
        i = index + 1
        q, kk, v, r = ways
        norm = layer.attn_block.norm
        att = layer.self_attn
        h = att.n_heads
        split = lambda t: t.view(*t.shape[:2], h, -1).transpose(1, 2)  # noqa: E731
        qh, kh, vh = split(att.q_proj(norm(q))), split(att.k_proj(norm(kk))), split(att.v_proj(norm(v)))
        logits = qh @ kh.transpose(-1, -2) / qh.shape[-1] ** 0.5
        if causal:
            t = x.shape[1]
            logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        out = (logits.softmax(-1) @ vh).transpose(1, 2).reshape(x.shape)
        mid = r + att.out_proj(out)  # Eq. 7: MHA(LN(X^Q), LN(X^K), LN(X^V)) + X^R
        xi = mid + layer.ffn(layer.ffn_block.norm(mid))
        xs.append(xi)
        sources.append(depth.pre_norms[str(i)](xi) if depth.pre_norms is not None and str(i) in depth.pre_norms
                       else xi)
        if i % p:
            ways = (xi, xi, xi, xi)
            continue
        agg = depth.aggregates[depth.slot[index]]
        js = [j for j in range(i + 1) if j % k == i % k]
        assert js == agg.inputs
        a = agg.static
        if agg.dynamic:
            normed = xi / torch.sqrt(xi.pow(2).mean(-1, keepdim=True) + agg.eps)
            dw = F.gelu(normed @ agg.w1.weight.t()) @ agg.w2.weight.t()
            a = dw.view(*dw.shape[:-1], agg.ways, len(js)) + a
        else:
            a = a.expand(*xi.shape[:-1], agg.ways, len(js))
        mixed = [sum(a[..., c, n:n + 1] * sources[j] for n, j in enumerate(js)) for c in range(agg.ways)]
        if agg.post_scale is not None:
            mixed = [m / torch.sqrt(m.pow(2).mean(-1, keepdim=True) + agg.eps) * agg.post_scale[c] + xi
                     for c, m in enumerate(mixed)]
        ways = tuple(mixed) if agg.ways == 4 else (mixed[0],) * 4
    return stack.final_norm(ways[3])


def test_at_initialisation_it_is_the_plain_transformer_bit_for_bit():
    """Sec. 3: W2 = 0 and a_ii = 1 make every way X_i; with PrePostDANorm, a_i = 0 makes every DA 0."""
    tokens = torch.randint(0, 40, (2, 9))
    plain = lm()(tokens).logits
    for section in ({}, {"dynamic": False}, {"multiway": False}, {"dilation": 2, "period": 2}, {"prepost_norm": True}):
        assert torch.equal(lm(muddformer=section)(tokens).logits, plain), section
    for arch, extra in (("encoder_decoder", {}), ("encoder_classifier", {"num_classes": 3})):
        for norm_first in (True, False):
            models = []
            for section in ({"muddformer": {}}, {}):
                torch.manual_seed(0)
                models.append(create_model("transformer_small", arch=arch, norm_first=norm_first, **SMALL, **extra,
                                           **section).eval())
            models[0].load_state_dict(models[1].state_dict(), strict=False)  # W1's draw moved the later ones
            src = torch.randint(4, 50, (2, 7))
            outs = [m(src, src) if arch == "encoder_decoder" else m(src) for m in models]
            assert torch.equal(outs[0].logits, outs[1].logits)


@pytest.mark.parametrize("section", [{}, {"dynamic": False}, {"multiway": False}, {"dilation": 2, "period": 2},
                                     {"dilation": 3, "period": 1}, {"prepost_norm": True}],
                         ids=["muddformer", "static", "single_way", "2x2", "3x1", "prepost_norm"])
def test_lm_matches_the_equations_forward_and_gradient(section):
    model = lm(muddformer=section, attn_impl="eager")
    randomise(model)
    tokens = torch.randint(0, 40, (2, 9))
    k, p = section.get("dilation", 1), section.get("period", 1)
    out = model(tokens).logits
    ref = model.lm_head(reference_stack(model, model.encoder.embed(tokens), k, p))
    assert torch.allclose(out, ref, atol=1e-5)
    params = [q for name, q in model.named_parameters() if ".depth." in name][:6]
    params.append(model.encoder.layers[1].self_attn.k_proj.weight)
    got = torch.autograd.grad(out.square().sum(), params)
    want = torch.autograd.grad(ref.square().sum(), params)
    assert all(torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want))


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("k,p", [(1, 1), (2, 2)])
def test_the_static_single_way_form_is_denseformer(k, p, norm_first):
    """Sec. 2.1, Eq. 4: the static dense connections are DenseFormer's DWA: with DenseFormer's weights copied in,
    the two models give the same logits and gradients."""
    dense = lm(denseformer={"dilation": k, "period": p}, norm_first=norm_first)
    with torch.no_grad():
        for alpha in dense.encoder.depth.alphas:
            alpha.copy_(torch.randn_like(alpha))
    mudd = lm(muddformer={"dynamic": False, "multiway": False, "dilation": k, "period": p}, norm_first=norm_first)
    state = {name: value for name, value in dense.state_dict().items() if ".depth." not in name}
    mudd.load_state_dict(state, strict=False)
    with torch.no_grad():
        for alpha, aggregate in zip(dense.encoder.depth.alphas, mudd.encoder.depth.aggregates):
            aggregate.static.copy_(alpha.view(1, -1))
    tokens = torch.randint(0, 40, (2, 9))
    a, b = dense(tokens).logits, mudd(tokens).logits
    assert torch.allclose(a, b, atol=1e-6)
    weight = dense.encoder.layers[0].ffn.fc1.weight, mudd.encoder.layers[0].ffn.fc1.weight
    assert torch.allclose(torch.autograd.grad(a.square().sum(), weight[0])[0],
                          torch.autograd.grad(b.square().sum(), weight[1])[0], atol=1e-5)


@pytest.mark.parametrize("section", [{}, {"prepost_norm": True}, {"dilation": 2, "period": 2}])
def test_lm_is_causal_and_the_cache_gives_the_full_forward(section):
    model = lm(muddformer=section)
    randomise(model)
    with torch.no_grad():
        assert_causal(model)
        assert_cache_matches(model)


def test_encoder_decoder_matches_with_the_cache():
    torch.manual_seed(0)
    model = create_model("transformer_small", arch="encoder_decoder", norm_first=True, **SMALL,
                         muddformer={}).eval()
    randomise(model)
    assert_seq2seq_cache_matches(model)


@pytest.mark.parametrize("section", [{}, {"dynamic": False}, {"multiway": False}, {"dilation": 2, "period": 2},
                                     {"prepost_norm": True}])
def test_parameter_count_is_the_papers(section):
    """App. B: a dynamic DA after block i has W1 (D x K), W2 (K x C J) and a_i (C x J), K = C J, J its inputs, C = 4
    ways (1 for the last DA and single-way); PrePostDANorm adds D per normalised source and C D per DA."""
    d, n = TINY["d_model"], TINY["enc_layers"]
    k, p = section.get("dilation", 1), section.get("period", 1)
    multiway, dynamic = section.get("multiway", True), section.get("dynamic", True)
    added = 0
    used = set()
    for i in range(p, n + 1, p):
        js = [j for j in range(i + 1) if j % k == i % k]
        used |= set(js)
        c = 4 if multiway and i < n else 1
        width = c * len(js)
        added += width + ((d * width + width * width) if dynamic else 0)
        added += c * d if section.get("prepost_norm") else 0
    added += len(used) * d if section.get("prepost_norm") else 0
    total = lambda m: sum(q.numel() for q in m.parameters())  # noqa: E731
    assert total(lm(muddformer=section)) - total(lm()) == added


def test_ffn_reallocation_grows_the_width_linearly_and_keeps_the_total():
    """Eq. 9: 0.5 D_f at the first layer to 1.5 D_f at the last; the sum stays L D_f."""
    assert [ffn_width(64, i, 4) for i in range(4)] == [32, 53, 75, 96]
    for n, d_ffn in ((4, 64), (5, 64), (7, 100), (24, 3072)):
        assert sum(ffn_width(d_ffn, i, n) for i in range(n)) == n * d_ffn
    model = lm(muddformer={"ffn_reallocation": True})
    assert [layer.ffn.fc1.out_features for layer in model.encoder.layers] == [32, 53, 75, 96]


@pytest.mark.parametrize("section", [{}, {"dynamic": False}])
def test_madds_count_the_weight_generators_as_the_flop_counter_does(section):
    from torch.utils.flop_counter import FlopCounterMode
    model = lm(muddformer=section, attn_impl="eager")
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 40, (1, 9)))
    assert counter.get_total_flops() == 2 * count_madds(model, 9)
    d = TINY["d_model"]
    widths = [4 * 2, 4 * 3, 4 * 4, 1 * 5]
    expected = sum(d * w + w * w for w in widths) if not section else 0
    assert count_madds(model, 9) - count_madds(lm(attn_impl="eager"), 9) == 9 * expected


def test_composes_with_multipass_and_the_kv_methods():
    """Multi-Pass: each pass from its own X_0, the injected tensor in every role (at initialisation: Multi-Pass);
    CLA and value residuals project the key/value ways (at initialisation: the pair without MUDDFormer)."""
    tokens = torch.randint(0, 40, (2, 9))
    assert torch.equal(lm(muddformer={}, multipass={"passes": 2})(tokens).logits,
                       lm(multipass={"passes": 2})(tokens).logits)
    both = lm(muddformer={}, cla={"sharing_factor": 2}, value_residual={})
    assert torch.equal(both(tokens).logits, lm(cla={"sharing_factor": 2}, value_residual={})(tokens).logits)
    randomise(both)
    assert_causal(both)
    assert_cache_matches(both)


def test_refusals_name_the_reason():
    with pytest.raises(ConfigError, match=r"muddformer\.period=5 is larger than enc_layers=4"):
        lm(muddformer={"period": 5})
    with pytest.raises(ConfigError, match=r"muddformer\.dilation=0"):
        lm(muddformer={"dilation": 0})
    for other in ("denseformer", "hyper_connections"):
        with pytest.raises(ConfigError, match=f"muddformer and {other}"):
            lm(muddformer={}, **{other: {}})
    with pytest.raises(ConfigError, match="mhc and muddformer"):
        lm(muddformer={}, mhc={})
    with pytest.raises(ConfigError, match="lightweight"):
        lm(muddformer={}, lightweight={"groups": 2})
    lm(muddformer={"multiway": False}, lightweight={"groups": 2})  # one input per block: any attention module
    with pytest.raises(ConfigError, match="ffn_reallocation"):
        lm(muddformer={"ffn_reallocation": True}, layer_sharing={})
    with pytest.raises(ConfigError, match="ffn_reallocation"):
        lm(muddformer={"ffn_reallocation": True}, enc_layers=1)


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    model = lm(muddformer={"prepost_norm": True}).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, 40, (2, 9)))
    assert explanation.graph_break_count == 0, [str(r.reason) for r in explanation.break_reasons]


def test_w1_starts_as_sec_3s_normal_of_variance_one_over_d_and_w2_at_zero():
    """Sec. 3 (and the released JAX code's ``nd_dense_init(1.0, "fan_in", "normal")``): W1 ~ N(0, 1/D), i.e. standard
    deviation D^-1/2, W2 = 0. Pooled over every DA of a 512-wide model (about 20,000 weights): 2% from D^-1/2 at
    most, where PyTorch's default (Kaiming uniform, (3 D)^-1/2) or a fixed 0.02 are 40% and 70% off."""
    d = 512
    model = lm(d_model=d, n_heads=8, muddformer={})
    aggregates = list(model.encoder.depth.aggregates)
    w1 = torch.cat([a.w1.weight.detach().flatten() for a in aggregates])
    assert w1.numel() > 15_000 and all(a.w1.weight.shape[1] == d for a in aggregates)
    assert abs(float(w1.std()) * d ** 0.5 - 1) < 0.02 and abs(float(w1.mean())) < 3 * d ** -0.5 / w1.numel() ** 0.5
    kurtosis = float(((w1 - w1.mean()) ** 4).mean() / w1.var() ** 2)
    assert abs(kurtosis - 3) < 0.25  # a normal draw (a uniform one has 1.8)
    assert all(torch.count_nonzero(a.w2.weight) == 0 for a in aggregates)
