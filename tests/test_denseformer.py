"""DenseFormer (Pagliardini et al., NeurIPS 2024): the identity at initialisation, the DWA of Sec. 3.1-3.2 against a
loop written from the equations, causal and cache-exact in the LM, the parameter count, its refusals, and the
average compiled as one fused accumulation."""
import math
import re

import pytest
import torch
import torch._dynamo

from helpers.lm import TINY as LM_FIELDS
from helpers.lm import assert_cache_matches, assert_causal
from helpers.lm import lm as tiny_lm
from interlayer import ConfigError, create_model
from interlayer.methods.denseformer import DepthWeightedAverage

TINY = {**LM_FIELDS, "enc_layers": 5}
SMALL = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dec_layers=2, src_vocab_size=50, dropout=0.0,
             attn_dropout=0.0)
KXP = [(1, 1), (2, 2), (2, 1), (1, 2), (3, 2), (4, 5)]


def lm(**overrides):
    """The shared tiny LM (helpers.lm) at this file's depth."""
    return tiny_lm(**{"enc_layers": TINY["enc_layers"], **overrides})


def randomise(model):
    """Every DWA weight drawn away from the identity (Sec. 3.1's init would hide a wrong input)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".depth.alphas." in name:
                p.copy_(torch.randn_like(p) * 0.5)


def reference_stack(stack, x, dilation, period, causal):
    """Sec. 3.1-3.2 from scratch: X_0 = x, X_i = B_i(Y_{i-1}); Y_i = sum_{j<=i, j=i mod k} alpha_{i,j} X_j after
    the blocks with p | i, else Y_i = X_i. The m-th DWA's weights are read in order of j."""
    xs, y, m = [x], x, 0
    for index, layer in enumerate(stack.layers):
        i = index + 1
        xs.append(layer(y, causal=causal).hidden)
        if i % period == 0:
            alpha = stack.depth.alphas[m]
            js = [j for j in range(i + 1) if j % dilation == i % dilation]
            assert len(js) == alpha.numel()
            y = sum(alpha[n] * xs[j] for n, j in enumerate(js))
            m += 1
        else:
            y = xs[-1]
    return stack.final_norm(y)


def test_at_initialisation_it_is_the_plain_model_bit_for_bit():
    for k, p in KXP:
        tokens = torch.randint(0, 40, (2, 9))
        assert torch.equal(lm(denseformer={"dilation": k, "period": p})(tokens).logits, lm()(tokens).logits)
    for arch, extra in (("encoder_decoder", {}), ("encoder_classifier", {"num_classes": 3})):
        for norm_first in (True, False):
            models = []
            for section in ({"denseformer": {}}, {}):
                torch.manual_seed(0)
                models.append(create_model("transformer_small", arch=arch, norm_first=norm_first, **SMALL,
                                           **extra, **section).eval())
            src = torch.randint(4, 50, (2, 7))
            outs = [m(src, src) if arch == "encoder_decoder" else m(src) for m in models]
            assert torch.equal(outs[0].logits, outs[1].logits)


@pytest.mark.parametrize("k,p", KXP)
def test_lm_matches_the_equations_with_random_weights(k, p):
    model = lm(denseformer={"dilation": k, "period": p})
    randomise(model)
    tokens = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        expected = model.lm_head(reference_stack(model.encoder, model.encoder.embed(tokens), k, p, causal=True))
        assert torch.allclose(model(tokens).logits, expected, atol=1e-5)


def test_encoder_decoder_matches_the_equations_on_both_stacks():
    torch.manual_seed(0)
    model = create_model("transformer_small", arch="encoder_decoder", norm_first=True, **SMALL,
                         denseformer={"dilation": 1, "period": 1}).eval()
    randomise(model)
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 6))
    with torch.no_grad():
        enc = model.encode(src)
        memory = reference_stack(model.encoder, model.encoder.embed(src), 1, 1, causal=False)
        assert torch.allclose(enc.hidden, memory, atol=1e-5)
        dec = model.decoder
        xs, y = [dec.embed(tgt)], dec.embed(tgt)
        for index, layer in enumerate(dec.layers):
            xs.append(layer(y, memory, memory_padding_mask=enc.padding_mask)[0])
            y = sum(a * x for a, x in zip(dec.depth.alphas[index], xs))
        expected = dec.output_projection(dec.final_norm(y))
        assert torch.allclose(model(src, tgt).logits, expected, atol=1e-5)


@pytest.mark.parametrize("k,p", [(1, 1), (2, 2)])
def test_lm_is_causal_and_the_cache_gives_the_full_forward(k, p):
    model = lm(denseformer={"dilation": k, "period": p})
    randomise(model)
    with torch.no_grad():
        assert_causal(model)
        assert_cache_matches(model)


@pytest.mark.parametrize("k,p", KXP)
def test_parameter_count_is_the_papers(k, p):
    """Sec. 3.1-3.2: one weight per (DWA, input); DWA_i exists for p | i and sees floor(i/k) + 1 inputs."""
    layers = TINY["enc_layers"]
    added = sum(p_.numel() for p_ in lm(denseformer={"dilation": k, "period": p}).parameters()) - sum(
        p_.numel() for p_ in lm().parameters())
    assert added == sum(i // k + 1 for i in range(1, layers + 1) if i % p == 0)
    if (k, p) == (1, 1):
        assert added == layers * (layers + 3) // 2


def test_the_dwa_reads_raw_block_outputs_not_earlier_averages():
    """Sec. 3.1 (and the official code): DWA_2 averages X_0, X_1, X_2, never Y_1, so changing DWA_1's weight on
    X_0 changes DWA_2's output only through block 2's input."""
    dwa = DepthWeightedAverage(2, 1, 1)
    with torch.no_grad():
        dwa.alphas[0].copy_(torch.tensor([3.0, 0.0]))
        dwa.alphas[1].copy_(torch.tensor([0.0, 1.0, 0.0]))
    x0, x1, x2 = torch.ones(1, 1, 2), torch.full((1, 1, 2), 5.0), torch.zeros(1, 1, 2)
    h, state = dwa.start(x0)
    assert torch.equal(dwa.after_layer(0, x1, state), 3 * x0)
    assert torch.equal(dwa.after_layer(1, x2, state), x1)


def test_composes_with_multipass_per_pass():
    """Each pass runs the stack, with its DWA, from its own X_0; at initialisation that is Multi-Pass exactly."""
    tokens = torch.randint(0, 40, (2, 9))
    both = lm(denseformer={}, multipass={"passes": 2})
    assert torch.equal(both(tokens).logits, lm(multipass={"passes": 2})(tokens).logits)
    one_pass = lm(denseformer={}, multipass={"passes": 1})
    randomise(one_pass)
    alone = lm(denseformer={})
    alone.load_state_dict(one_pass.state_dict())
    assert torch.equal(one_pass(tokens).logits, alone(tokens).logits)
    both.train()
    both(tokens).logits.square().mean().backward()
    assert all(p.grad is not None for n, p in both.named_parameters() if ".depth.alphas." in n)


def test_invalid_settings_name_the_key():
    with pytest.raises(ConfigError, match=r"denseformer\.period=6 is larger than enc_layers=5"):
        lm(denseformer={"period": 6})
    with pytest.raises(ConfigError, match=r"denseformer\.dilation=0"):
        lm(denseformer={"dilation": 0})
    with pytest.raises(ConfigError, match="cannot be combined"):
        lm(denseformer={}, hyper_connections={})


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    model = lm(denseformer={"dilation": 2, "period": 2}, enc_layers=4).train()
    explanation = torch._dynamo.explain(model)(torch.randint(0, 40, (2, 9)))
    assert explanation.graph_break_count == 0, [str(r.reason) for r in explanation.break_reasons]


@pytest.mark.slow
def test_the_average_is_an_accumulation_the_old_formula_s_numbers_and_no_stacked_buffer():
    """DWA over 10 inputs (more than inductor's 8 for a fused concatenation): the same numbers as the stacked
    formula ``(alpha * stack(X)).sum(0)`` it replaced, and inductor's CPU code allocates no buffer of the 10 inputs
    (the stack made it copy every input into one, +1.4 GB peak at GPT-2 small): one fused kernel reads the inputs
    where they are."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    dwa = DepthWeightedAverage(9, 1, 1)
    with torch.no_grad():
        dwa.alphas[-1].normal_()
    inputs = [torch.randn(2, 3, 16) for _ in range(10)]
    stacked = (dwa.alphas[-1].view(-1, 1, 1, 1) * torch.stack(inputs)).sum(0)
    with torch.no_grad():
        torch.testing.assert_close(dwa.after_layer(8, inputs[-1], inputs[:-1]), stacked)
        out, code = run_and_get_code(torch.compile(lambda xs: dwa.after_layer(8, xs[-1], xs[:-1])), inputs)
    torch.testing.assert_close(out, stacked)
    buffers = [math.prod(int(size) for size in shape.split(",") if size.strip())
               for shape in re.findall(r"empty_strided_cpu\(\(([\d, ]+)\)", "\n".join(code))]
    assert buffers and max(buffers) == 2 * 3 * 16, buffers  # the output alone, no (10 x 2, 3, 16) copy
