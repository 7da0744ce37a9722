"""Parameter counts count tied tensors once; analytic MAdds equal torch's FLOP counter (FLOPs = 2 MAdds)."""
import pytest
import torch

from interlayer import ConfigError, count_madds, count_parameters, create_model

from helpers import count_flops


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
