"""Parameter counts count tied tensors once; analytic MAdds equal torch's FLOP counter (FLOPs = 2 MAdds)."""
import pytest
import torch

from helpers import count_flops
from interlayer import ConfigError, count_madds, count_parameters, create_model


def test_tied_parameters_counted_once():
    tied = create_model("transformer_small", share_embeddings=True, tie_output=True)
    untied = create_model("transformer_small", share_embeddings=False, tie_output=False)
    table = 8000 * 256
    assert count_parameters(untied) - count_parameters(tied) == 2 * table


def test_transformer_block_has_12_d_squared_weights():
    """A block holds 4 d^2 of attention and 8 d^2 of FFN weights (Crossformer Sec. 2, Vaswani et al. base)."""
    model = create_model("transformer_base", enc_layers=1, bias=False)
    layer = model.encoder.layers[0]
    weights = sum(p.numel() for n, p in layer.named_parameters() if "norm" not in n)
    assert weights == 12 * 512**2


@pytest.mark.parametrize("overrides", [
    {},
    {"positions": "relative"},
    {"qk_dim": 64, "norm_first": True},
    {"arch": "encoder_classifier", "num_classes": 3, "classifier_hidden": 16},
])
def test_madds_match_flop_counter(overrides):
    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50,
                         attn_impl="eager", **overrides).eval()
    src, tgt = torch.randint(1, 50, (1, 9)), torch.randint(1, 50, (1, 7))
    if model.config.arch == "encoder_decoder":
        flops = count_flops(lambda: model(src, tgt))
        assert flops == 2 * count_madds(model, 9, 7)
    else:
        flops = count_flops(lambda: model(src))
        assert flops == 2 * count_madds(model, 9)


def test_the_model_listing_covers_every_family_and_counts_what_it_builds():
    """``interlayer models`` lists the Transformer, text CNN, image, GAT and MCAN presets, each with the parameter count
    of the model the task would build from that name, and rejects an unknown name by listing the known ones."""
    from interlayer import list_models
    from interlayer.core.config import ConfigError
    from interlayer.models.registry import model_catalog

    names = list_models()
    for name in ("transformer_text_cls", "cnn_text", "vit_fashion_mnist", "gat_cora", "lw_mcan_1x"):
        assert name in names
    table = model_catalog(64, ["transformer_small", "vit_fashion_mnist", "gat_cora", "mcan_4layer"])
    assert "Text CNN" not in table  # a family with no requested preset is left out
    assert f"{count_parameters(create_model('transformer_small')):,}" in table
    assert f"{count_parameters(create_model('vit_fashion_mnist')):,}" in table
    assert f"{count_parameters(create_model('gat_cora')):,}" in table
    assert f"{count_parameters(create_model('mcan_4layer')):,}" in table and "MCAN (VQA)" in table
    with pytest.raises(ConfigError, match="unknown model preset.*vit_fashion_mnist"):
        model_catalog(64, ["vit_fashon_mnist"])


def test_count_madds_takes_no_length_from_a_model_that_fixes_its_own() -> None:
    """README: ``count_madds(image_model)``; a sequence model without a length is told what to pass."""
    vit = create_model("vit_fashion_mnist")
    assert count_madds(vit) == count_madds(vit, vit.config.tokens) > 0
    with pytest.raises(ConfigError, match=r"count_madds\(EncoderDecoderModel\) needs src_len"):
        count_madds(create_model("transformer_small"))


# -- the cost model of a training step (accounting.step_cost) ----------------------------------------------------
TINY_GPT = dict(d_model=32, n_heads=4, d_ffn=128, enc_layers=2, src_vocab_size=40, max_positions=16, dropout=0.0)


def test_step_cost_of_the_plain_model_against_a_hand_count() -> None:
    """2 sequences x 16 tokens of a 2-layer GPT (d=32, FFN 128, 40 tokens), bf16 (2-byte activations):
    weights 12 and AdamW 28 bytes a parameter; per layer q, k, v and the heads' output (4 x 32 channels), the FFN's
    two 128-wide activations, each written and read back (x 2 x 2 bytes); two residual connections a layer, each
    its fp32 stream read and written forward and backward (16 bytes a channel) and its norm (2 x 2 + 4 bytes a
    channel); the logits written, read, their gradient written and read (4 x 2 bytes x 40); the embedding (8 bytes
    a channel)."""
    from interlayer.accounting import PEAKS, step_cost

    model = create_model("gpt_shakespeare_char", **TINY_GPT)
    cost = step_cost(model, 2, 16)
    tokens, params = 32, count_parameters(model)
    attention = 2 * 2 * tokens * (4 * 32)
    ffn = 2 * 2 * tokens * (2 * 128)
    norms = 4 * (2 * 2 + 4) * tokens * 32
    assert cost.bytes == {"weights": 12 * params, "optimizer": 28 * params,
                          "activations": 2 * (attention + ffn) + norms,
                          "residual stream": 4 * 16 * tokens * 32, "logits": 4 * 2 * tokens * 40,
                          "embedding": 8 * tokens * 32}
    assert cost.madds == 2 * count_madds(model, 16) and cost.flops == 6 * cost.madds
    h100 = PEAKS["H100"]
    assert cost.bound(h100) == max(cost.flops / 989.4e12, cost.total_bytes / 3.35e12)
    assert cost.bound_by(h100) == "memory"  # a toy model moves more bytes than it computes
    assert step_cost(model, 2, 16, precision="fp32").bytes["logits"] == 2 * cost.bytes["logits"]


def test_step_cost_counts_the_maps_predictive_attention_materialises() -> None:
    """Causal PA on the same model: layer 1 mixes in layer 0's logits, so both layers keep a 4-head map of the 136
    cells of a 16-token causal triangle, written and read forward, its gradient written and read backward."""
    from interlayer.accounting import step_cost

    plain = step_cost(create_model("gpt_shakespeare_char", **TINY_GPT), 2, 16)
    pa = step_cost(create_model("gpt_shakespeare_char", **TINY_GPT, predictive={}), 2, 16)
    assert pa.bytes["attention maps"] == 4 * 2 * 2 * 4 * 136 * 2
    assert "attention maps" not in plain.bytes
    assert pa.madds - plain.madds == 2 * 16 * 16 * 4 * 4 * 9  # the one 3x3 convolution over 4 heads, full maps


def test_step_cost_rejects_an_unknown_precision_and_the_cpu_peak_is_measured() -> None:
    from interlayer.accounting import measure_cpu_peak, step_cost

    with pytest.raises(ConfigError, match="precision='int8'"):
        step_cost(create_model("gpt_shakespeare_char", **TINY_GPT), 1, 4, precision="int8")
    peak = measure_cpu_peak(size=128, repeats=2)
    assert peak.flops["fp32"] > 0 and peak.bandwidth > 0  # measured on a shared machine: only its sign is sure
    with pytest.raises(ConfigError, match="no peak for precision 'fp8'"):
        peak.flops_for("fp8")
