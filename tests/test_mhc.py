"""mHC (Xie et al., arXiv 2512.24880): Eq. 3 and 7-9 against a float64 loop written from the equations (forward and
gradient), H_res doubly stochastic at every layer of a 24-layer random model and the composite gain of Sec. 5.4
bounded where hyper-connections' is not, the plain pre-norm model at initialisation, causal and cache-exact in the
LM, the parameter count, the MAdds, compilation and the refusals."""
import pytest
import torch
import torch._dynamo

from helpers.hyper_connections import randomise_mhc as randomise
from helpers.hyper_connections import stream_dtype_error
from helpers.lm import TINY as LM_FIELDS
from helpers.lm import assert_cache_matches, assert_causal, assert_seq2seq_cache_matches
from helpers.lm import lm as tiny_lm
from interlayer import ConfigError, count_madds, create_model
from interlayer.methods.mhc import ManifoldHyperConnection, composite_gain, sinkhorn_knopp

TINY = {**LM_FIELDS, "enc_layers": 3}
SMALL = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=2, src_vocab_size=50, dropout=0.0,
             attn_dropout=0.0, norm_first=True)


def lm(**overrides):
    return tiny_lm(**{"enc_layers": TINY["enc_layers"], **overrides})


def blocks(stack):
    return [block for layer in stack.layers for block in (layer.attn_block, layer.ffn_block)]


def reference_mhc(block, x, sublayer):
    """One sublayer from Eq. 3, 7, 8 and 9 as written (RMSNorm before the product; plain exp), streams (..., n, C)."""
    n = block.rate
    b = block.static
    pre, post, res = b[:n], b[n:2 * n], b[2 * n:].view(n, n)
    if block.dynamic:
        flat = x.flatten(-2)  # vec(x_l)
        xp = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + block.norm_eps)  # RMSNorm
        phi, alpha = block.phi, block.alpha
        pre = alpha[0] * (xp @ phi[:, :n]) + pre
        post = alpha[1] * (xp @ phi[:, n:2 * n]) + post
        res = alpha[2] * (xp @ phi[:, 2 * n:]).unflatten(-1, (n, n)) + res  # mat(): row-major
    h_pre, h_post = torch.sigmoid(pre), 2 * torch.sigmoid(post)
    m = torch.exp(res)
    for _ in range(block.sinkhorn_iters):
        m = m / m.sum(-2, keepdim=True)  # T_c
        m = m / m.sum(-1, keepdim=True)  # T_r
    h_in = torch.einsum("...j,...jc->...c", h_pre.expand(*x.shape[:-1]), x)
    out = sublayer(block.norm(h_in))
    kept = torch.einsum("...ij,...jc->...ic", m.expand(*x.shape[:-2], n, n), x)
    return kept + h_post.unsqueeze(-1) * out.unsqueeze(-2)


def reference_logits(model, tokens, rate):
    stack = model.encoder
    x = stack.embed(tokens)
    h = x.unsqueeze(-2).expand(*x.shape[:-1], rate, x.shape[-1])
    for layer in stack.layers:
        h = reference_mhc(layer.attn_block, h, lambda a: layer.self_attn(a, causal=True)[0])
        h = reference_mhc(layer.ffn_block, h, layer.ffn)
    return model.lm_head(stack.final_norm(h.sum(-2)))


@pytest.mark.parametrize("rate,dynamic", [(4, True), (3, True), (4, False)])
def test_lm_matches_the_equations_in_float64_forward_and_gradient(rate, dynamic):
    model = lm(mhc={"rate": rate, "dynamic": dynamic}).double()
    randomise(model)
    tokens = torch.randint(0, 40, (2, 9))
    out, ref = model(tokens).logits, reference_logits(model, tokens, rate)
    assert torch.allclose(out, ref, atol=1e-10)
    params = [p for name, p in model.named_parameters() if name.split(".")[-1] in ("static", "phi", "alpha")]
    params.append(model.encoder.layers[0].self_attn.q_proj.weight)
    got = torch.autograd.grad(out.square().sum(), params)
    want = torch.autograd.grad(ref.square().sum(), params)
    assert all(torch.allclose(g, w, atol=1e-9) for g, w in zip(got, want))


def test_sinkhorn_overflow_guard_is_eq_9_exactly():
    """Subtracting the largest logit is cancelled by the first column normalisation; large logits stay finite, and
    logits so far apart that a column underflows give no NaN."""
    logits = torch.randn(5, 4, 4, dtype=torch.float64)
    m = torch.exp(logits)
    for _ in range(20):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    assert torch.allclose(sinkhorn_knopp(logits, 20), m, atol=1e-14)
    shifted = sinkhorn_knopp(logits.float() + 100, 20)  # exp(100) overflows float32 without the guard
    assert torch.allclose(shifted, m.float(), atol=1e-4)
    assert torch.isfinite(sinkhorn_knopp(logits.float() * 100, 20)).all()


def record(blocks_, method):
    """Wrap each block's ``method`` so its results are kept, in call order."""
    kept = []
    for block in blocks_:
        inner = getattr(block, method)

        def wrapped(*args, inner=inner):
            result = inner(*args)
            kept.append(result)
            return result

        setattr(block, method, wrapped)
    return kept


def mhc_res(model):
    kept = record(blocks(model.encoder), "mappings")
    with torch.no_grad():
        model(torch.randint(0, 40, (2, 8)))
    return [res for _, _, res in kept]


def test_h_res_is_doubly_stochastic_at_every_layer_of_a_deep_random_model_and_the_composite_gain_stays_bounded():
    """24 layers (48 sublayers), random weights (logits of H_res about +-2): every H_res has rows and columns summing
    to 1 within 1e-3 and no negative entry. The composite's Amax gain (Sec. 3.1, 5.4) stays near 1 there, and below
    the paper's 1.6 with twice the spread (where 20 Sinkhorn-Knopp iterations leave column sums up to ~1e-2 off, as
    Sec. 5.4 describes), while HC's with random weights explodes."""
    model = lm(enc_layers=24, mhc={})
    randomise(model, scale=0.5)
    h_res = mhc_res(model)
    assert len(h_res) == 48
    for res in h_res:
        assert res.shape[-2:] == (4, 4) and (res >= 0).all()
        assert (res.sum(-1) - 1).abs().max() < 1e-3 and (res.sum(-2) - 1).abs().max() < 1e-3
    forward, backward = composite_gain(h_res)
    assert forward < 1.001 and backward < 1.001
    randomise(model, scale=1.0)
    forward, backward = composite_gain(mhc_res(model))
    assert forward < 1.01 and backward < 1.6  # the paper's 27B model: at most about 1.6

    torch.manual_seed(1)
    hc = lm(enc_layers=24, hyper_connections={"dynamic": False})
    with torch.no_grad():
        for block in blocks(hc.encoder):
            block.static_alpha.normal_()
    # HC's H' = A_r^T H (Eq. 4): in mHC's convention H_res = A_r^T.
    hc_res = [block.static_alpha[:, 1:].t().double() for block in blocks(hc.encoder)]
    assert composite_gain(hc_res)[1] > 1e3


@pytest.mark.parametrize("dynamic", [False, True])
def test_at_initialisation_it_is_the_plain_pre_norm_model(dynamic):
    """phi = 0, H_post = 1, H_res row-stochastic, H_pre summing to 1: every stream is the plain model's state."""
    tokens = torch.randint(0, 40, (2, 9))
    model, plain = lm(mhc={"dynamic": dynamic}), lm()
    for block in blocks(model.encoder):
        pre, post, res = block.mappings(torch.randn(4, 2, 9, 32))
        assert torch.allclose(pre.sum(-1), torch.ones(())) and torch.equal(post, torch.ones_like(post))
        assert torch.allclose(res.diagonal(dim1=-2, dim2=-1), torch.full((4,), 0.97))
    states, plain_states = model(tokens).encoder.states, plain(tokens).encoder.states
    assert all(torch.allclose(s, 4 * p, atol=1e-5) for s, p in zip(states, plain_states))  # the sum of 4 copies
    assert torch.allclose(model(tokens).logits, plain(tokens).logits, atol=1e-4)


def test_the_input_prefers_the_sublayers_stream():
    """H_pre starts near HC's e_{k mod n}, k counting the sublayers: what makes the streams differ in training."""
    picks = [int(block.mappings(torch.zeros(4, 1, 32))[0].argmax()) for block in blocks(lm(mhc={}).encoder)]
    assert picks == [0, 1, 2, 3, 0, 1]


def test_rate_one_is_the_plain_pre_norm_model():
    """Sec. 4.1: at n = 1 the doubly stochastic condition is the scalar 1, whatever H~_res (random here, dynamic part
    included): the identity residual. H_post = 1 (b_post = 0) and H_pre ~ 1 (b_pre = 10; a smaller read scale would
    differ only through the pre-norm's epsilon)."""
    tokens = torch.randint(0, 40, (2, 9))
    model = lm(mhc={"rate": 1})
    randomise(model)
    with torch.no_grad():
        for block in blocks(model.encoder):
            block.static[:2] = torch.tensor([10.0, 0.0])
            block.alpha[:2] = 0.0
    assert all(float(block.alpha[2].detach()) != 0 for block in blocks(model.encoder))
    assert torch.allclose(model(tokens).logits, lm()(tokens).logits, atol=1e-5)


@pytest.mark.parametrize("dynamic", [False, True])
def test_lm_is_causal_and_the_cache_gives_the_full_forward(dynamic):
    model = lm(mhc={"dynamic": dynamic})
    randomise(model, scale=0.5)
    with torch.no_grad():
        assert_causal(model)
        assert_cache_matches(model)


def test_encoder_decoder_incremental_decoding_gives_the_full_forward():
    torch.manual_seed(0)
    model = create_model("transformer_small", arch="encoder_decoder", **SMALL, mhc={}).eval()
    randomise(model, scale=0.5)
    assert_seq2seq_cache_matches(model)
    assert model.decoder.layers[0].cross_block.dynamic


@pytest.mark.parametrize("rate,dynamic", [(4, True), (2, True), (4, False)])
def test_parameter_count_is_eq_7s(rate, dynamic):
    """Per sublayer: phi (nC x (n^2 + 2n)), three alphas and b (n^2 + 2n); static: b only."""
    d, sublayers = TINY["d_model"], 2 * TINY["enc_layers"]
    added = sum(p.numel() for p in lm(mhc={"rate": rate, "dynamic": dynamic}).parameters()) - sum(
        p.numel() for p in lm().parameters())
    width = rate * rate + 2 * rate
    assert added == sublayers * (width + ((rate * d * width + 3) if dynamic else 0))


@pytest.mark.parametrize("dynamic", [False, True])
def test_madds_count_the_products_as_the_flop_counter_does(dynamic):
    """Per position and sublayer: the mixing [H_pre; H_res] x, (n+1) n C, and vec(x) phi, nC (n^2 + 2n). The
    mixing is written as scaled streams added (what inductor fuses; HC's interface), which the flop counter, counting
    products only, does not see: it sees the rest."""
    from torch.utils.flop_counter import FlopCounterMode
    model = lm(mhc={"dynamic": dynamic}, attn_impl="eager")
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 40, (1, 9)))
    mixing = 2 * TINY["enc_layers"] * 9 * 5 * 4 * 32
    assert counter.get_total_flops() == 2 * (count_madds(model, 9) - mixing)
    per_position = 5 * 4 * 32 + (4 * 32 * 24 if dynamic else 0)
    assert count_madds(model, 9) - count_madds(lm(attn_impl="eager"), 9) == 2 * TINY["enc_layers"] * 9 * per_position


def test_the_static_biases_get_no_weight_decay():
    from interlayer.training.config import TrainConfig
    from interlayer.training.optimizer import parameter_groups
    model = lm(mhc={})
    names = {id(p): n for n, p in model.named_parameters()}
    groups = parameter_groups(model, TrainConfig(optimizer="adamw", weight_decay=0.1))
    spared = {names[id(p)].rsplit(".", 1)[-1] for g in groups if g.get("weight_decay") == 0.0 for p in g["params"]}
    assert spared == {"static"}


def test_refusals_name_the_reason():
    with pytest.raises(ConfigError, match="norm_first=True"):
        lm(mhc={}, norm_first=False)
    for section, words in (({"rate": 0}, r"mhc\.rate=0"), ({"sinkhorn_iters": 0}, r"mhc\.sinkhorn_iters=0"),
                           ({"init_epsilon": 0.25}, r"mhc\.init_epsilon=0\.25"), ({"norm_eps": 0.0}, "norm_eps")):
        with pytest.raises(ConfigError, match=words):
            lm(mhc=section)
    with pytest.raises(ConfigError, match="multipass"):
        lm(mhc={}, multipass={})
    for other in ("hyper_connections", "denseformer", "muddformer"):
        with pytest.raises(ConfigError, match=f"mhc and {other}"):
            lm(mhc={}, **{other: {}})


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    model = lm(mhc={}).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, 40, (2, 9)))
    assert explanation.graph_break_count == 0, [str(r.reason) for r in explanation.break_reasons]


def test_the_defaults_table_5_fixes_reach_every_block():
    """Table 5 of the paper: n = 4 streams, t_max = 20 Sinkhorn-Knopp iterations, the gating factors alpha
    initialised to 0.01, RMSNorm epsilon 1e-20. Each must be the default and what the built blocks use: changing
    one of them fails here."""
    from interlayer.methods.mhc import MHCConfig

    assert (MHCConfig.rate, MHCConfig.sinkhorn_iters, MHCConfig.scale_init, MHCConfig.norm_eps) == (4, 20, 0.01, 1e-20)
    model = lm(mhc={})
    for block in blocks(model.encoder):
        assert (block.rate, block.sinkhorn_iters, block.norm_eps) == (4, 20, 1e-20)
        assert torch.equal(block.alpha.detach(), torch.full((3,), 0.01))


def test_at_initialisation_only_the_final_norms_epsilon_tells_it_from_the_plain_model():
    """The final LayerNorm reads the sum of the n stream copies, n h, and LN(n h) is LN(h) with epsilon / n^2: the
    one difference from the plain pre-norm model at initialisation (about 1e-6 in the logits, not rounding). In
    float64 the plain model with its final epsilon divided by 16 agrees to 1e-9 (what is left: the float32 rounding
    of the initial biases, made before .double())."""
    tokens = torch.randint(0, 40, (2, 9))
    for dynamic in (True, False):
        model, plain = lm(mhc={"dynamic": dynamic}).double(), lm().double()
        logits = model(tokens).logits
        assert (logits - plain(tokens).logits).abs().max() > 1e-7
        plain.encoder.final_norm.eps /= model.encoder.layers[0].attn_block.rate ** 2
        assert (logits - plain(tokens).logits).abs().max() < 1e-9
@pytest.mark.slow
def test_inductor_fuses_the_mixes_no_batched_product_of_inner_size_n():
    """mHC's mixes go through the hyper-connection interface (kernels.hyper_connections.width_mix): on the reference
    path, what inductor compiles, each mix is n scaled streams added, fused into inductor's own kernels, and no
    batched product of inner size n = 4 (an extern library call of its own, its output written and read back). The
    dynamic coefficients' product vec(x) phi stays a product (inner size C), as n of them. Inductor's CPU code, one
    sublayer, inference (a few seconds of C++ compilation on a quiet machine)."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    block = ManifoldHyperConnection(16, 4, 0, dynamic=True, sinkhorn_iters=2, scale_init=0.01, norm_eps=1e-20,
                                    init_epsilon=0.01, dropout=0.0, eps=1e-5, bias=True)
    randomise(block)

    def sublayer(streams):
        h, carry = block.split(streams)
        return block.combine(carry, torch.tanh(h))

    x = torch.randn(4, 3, 16)
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(sublayer), x)
        assert torch.allclose(out, sublayer(x), atol=1e-5)
    calls = [line for line in "\n".join(code).splitlines() if "extern_kernels." in line and "import" not in line]
    assert len(calls) == 4 and all(".mm(" in call or ".addmm(" in call for call in calls), calls  # vec(x) phi
    assert not any("bmm(" in call for call in calls), calls


@pytest.mark.parametrize("stream_dtype,low,high", [("bfloat16", 1e-4, 3e-2), ("float16", 1e-5, 5e-3)])
def test_16_bit_streams_are_stored_so_and_stay_close_to_float32(stream_dtype, low, high):
    """As hyper-connections' option (its test says why these bounds): about 0.4% bfloat16, 0.06% float16 here."""
    error, states_dtype, finite = stream_dtype_error("mhc", {}, stream_dtype)
    assert states_dtype == getattr(torch, stream_dtype) and finite
    assert low < error < high, error
