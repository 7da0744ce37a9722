"""The region models (interlayer.models.regions): the captioner's cached decoding equals its full pass and it reads
its regions as a set; the grounder ignores padded regions; the methods reach both through the nested Transformer
config; the paper's preset has LW Table II's 44.1M in its blocks; configs round-trip through save and load."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from interlayer.accounting import count_parameters
from interlayer.checkpoint import save_pretrained
from interlayer.errors import ConfigError
from interlayer.methods.base import VariantContext
from interlayer.models import registry
from interlayer.models.regions import Captioner, Grounder, RegionConfig
from interlayer.models.registry import create_model, get_config, load_pretrained

TINY = dict(src_vocab_size=30, d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=2, dropout=0.0)


def _captioner(**overrides) -> Captioner:
    return create_model("caption_transformer_small", feature_dim=12, **{**TINY, **overrides})


def _grounder(**overrides) -> Grounder:
    return create_model("rec_transformer_small", feature_dim=12, **{**TINY, **overrides})


def _regions(batch: int = 2, regions: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, regions, 12), torch.rand(batch, regions, 5)


def test_the_paper_preset_has_table_iis_parameters_in_its_blocks() -> None:
    """LW Table II: the baseline Transformer of VQA, captioning and REC has 44.1M parameters in its 6 + 6 blocks."""
    for name in ("caption_transformer", "rec_transformer"):
        with torch.device("meta"):
            model = create_model(name)
        blocks = count_parameters(nn.ModuleList([*model.encoder.layers, *model.decoder.layers]))
        assert abs(blocks - 44.1e6) < 0.1e6, (name, blocks)


def test_cached_decoding_equals_the_full_pass() -> None:
    model = _captioner().eval()
    features, boxes = _regions()
    tokens = torch.randint(4, 30, (2, 6))
    full = model(features, boxes, None, tokens).logits
    enc = model.encode(features, boxes)
    cache = model.decoder.new_cache()
    steps = [model.decoder(tokens[:, t:t + 1], enc.hidden, None, cache=cache).logits for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-5)


def test_the_captioner_reads_its_regions_as_a_set() -> None:
    model = _captioner().eval()
    features, boxes = _regions()
    tokens = torch.randint(4, 30, (2, 6))
    order = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(model(features[:, order], boxes[:, order], None, tokens).logits,
                               model(features, boxes, None, tokens).logits, rtol=1e-4, atol=1e-5)


def test_the_grounder_ignores_padded_regions() -> None:
    model = _grounder().eval()
    features, boxes = _regions(regions=4)
    tokens = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    alone = model(tokens, features, boxes).scores
    padded = model(tokens, torch.cat([features, torch.randn(2, 2, 12)], 1), torch.cat([boxes, torch.rand(2, 2, 5)], 1),
                   torch.tensor([[False] * 4 + [True] * 2] * 2))
    torch.testing.assert_close(padded.scores[:, :4], alone, rtol=1e-4, atol=1e-5)
    assert (padded.scores[:, 4:] == torch.finfo(torch.float32).min).all()
    assert padded.offsets.shape == (2, 6, 4)


@pytest.mark.parametrize("section", [dict(lightweight={"groups": 2}), {"crossformer.hard": ["kq", "ffn"]},
                                     {"crossformer.soft": ["kq", "vf", "ffn"]},
                                     {"predictive.alpha": 0.5, "predictive.conv_layers": 1}])
def test_method_sections_reach_both_heads_and_train(section: dict) -> None:
    for model in (_captioner(**section), _grounder(**section)):
        assert getattr(model.config.transformer, next(iter(section)).split(".")[0]) is not None
        features, boxes = _regions()
        if isinstance(model, Captioner):
            out = model(features, boxes, None, torch.randint(4, 30, (2, 5)))
            loss = out.logits.square().mean()
        else:
            out = model(torch.randint(4, 30, (2, 5)), features, boxes)
            loss = out.scores.square().mean() + out.offsets.square().mean()
        loss = loss + sum(out.aux_losses.values(), torch.tensor(0.0))
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_lw_changes_the_attention_modules_and_crossformer_ties_weights() -> None:
    lw = _captioner(lightweight={"groups": 2})
    assert type(lw.encoder.layers[0].self_attn).__name__ == "GroupedMultiHeadAttention"
    tied = _grounder(**{"crossformer.hard": ["kq"]})
    assert tied.encoder.layers[0].self_attn.k_proj.weight is tied.encoder.layers[1].self_attn.q_proj.weight


def test_overrides_reach_the_nested_transformer_and_derived_fields_are_refused() -> None:
    cfg = get_config("caption_transformer_small", d_model=64, max_words=10)
    assert cfg.transformer.d_model == 64 and cfg.max_words == 10
    assert cfg.transformer.causal_decoder and not get_config("rec_transformer_small").transformer.causal_decoder
    with pytest.raises(ConfigError, match="decided by head"):
        get_config("caption_transformer_small", causal_decoder=False)
    with pytest.raises(ConfigError, match="max_words"):
        get_config("caption_transformer_small", max_words=100)
    with pytest.raises(ConfigError, match="soft_target='states'"):
        get_config("rec_transformer_small", **{"crossformer.soft": ["kq"], "crossformer.soft_target": "states"})


def test_named_compare_variants_find_the_nested_transformer() -> None:
    base = get_config("caption_transformer_small").to_dict()
    ctx = VariantContext("caption", "caption_transformer_small", base, registry.family("region").method_slots)
    assert ctx.transformer_fields("LW") is base["transformer"]


def test_save_and_load_round_trip(tmp_path) -> None:
    for model in (_captioner(lightweight={"groups": 2}), _grounder()):
        save_pretrained(model, tmp_path / type(model).__name__)
        again = load_pretrained(tmp_path / type(model).__name__)
        assert type(again) is type(model) and isinstance(again.config, RegionConfig)
        for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
            assert torch.equal(a, b), name


@pytest.mark.slow
def test_the_papers_captioning_and_rec_rows_are_within_one_percent_of_our_builds() -> None:
    """LW Table VIII (44M, 24M, 29M) and Table II's RefCOCO column (44.1M, 24.0M, 28.7M) beside our presets."""
    from interlayer.papers.lightweight import region_tables

    tables = region_tables()
    assert [title.split(" (")[0] for title, _, _ in tables] == ["LW-Transformer Table VIII",
                                                                "LW-Transformer Tables II / VII"]
    for _, _, rows in tables:
        assert len(rows) == 3
        for row in rows:
            ours, paper = int(row[1].replace(",", "")), float(row[3].rstrip("M")) * 1e6
            assert abs(ours - paper) / paper < 0.01, row
