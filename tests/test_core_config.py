"""Configs: typed, validated with messages naming the key, round-tripped through JSON/YAML, overridable."""
import pytest

from interlayer import (
    ConfigError,
    ModelConfig,
    apply_overrides,
    config_from_dict,
    create_model,
    get_config,
    list_models,
)


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown key 'd_modle' \(did you mean 'd_model'\?\)"):
        config_from_dict({"d_modle": 256})


def test_unknown_key_inside_a_section_is_named_with_its_section():
    with pytest.raises(ConfigError, match=r"multipass\.'?no_such_option"):
        get_config("transformer_small", multipass={"no_such_option": 1})


@pytest.mark.parametrize("fields, message", [
    ({"d_model": "big"}, "d_model must be an integer"),
    ({"norm_first": "yes"}, "norm_first must be true or false"),
    ({"positions": "alibi"}, "positions='alibi' is not valid"),
    ({"positions": "rotary", "d_model": 36, "n_heads": 4}, "per-head query width must be even"),
    ({"positions": "relative_2d", "arch": "causal_lm", "grid_height": 2, "grid_width": 2}, "image grids"),
    ({"d_model": 100, "n_heads": 8}, "not divisible by n_heads"),
    ({"share_embeddings": True, "tgt_vocab_size": 7}, "share_embeddings=True needs one vocabulary"),
    ({"positions": "relative_2d", "arch": "encoder_classifier", "num_classes": 3}, "grid_height"),
    ({"arch": "encoder_classifier"}, "num_classes >= 2"),
    ({"dropout": 1.5}, r"dropout=1.5 must lie in \[0, 1\)"),
    ({"arch": "encoder_decoder", "dec_layers": 0}, "dec_layers=0"),
])
def test_impossible_configs_are_rejected_with_the_key(fields, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(fields)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_save_and_load_round_trip(tmp_path, suffix):
    cfg = get_config("transformer_text_cls", d_model=64, n_heads=4)
    cfg.save(tmp_path / f"model{suffix}")
    assert ModelConfig.load(tmp_path / f"model{suffix}") == cfg


def test_unreadable_config_file_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json"):
        ModelConfig.load(path)


def test_overrides_parse_strings_like_the_cli():
    cfg = apply_overrides(get_config("transformer_small"), {"d_model": "128", "norm_first": "true",
                                                            "dropout": "0.2"})
    assert (cfg.d_model, cfg.norm_first, cfg.dropout) == (128, True, 0.2)
    assert apply_overrides(cfg, {"dropout": "1e-1"}).dropout == 0.1  # YAML 1.1 reads 1e-1 as a string


def test_unknown_preset_suggests_close_names():
    with pytest.raises(ConfigError, match="did you mean"):
        get_config("transformer_smal")


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models(family="transformer"))
def test_every_preset_builds_and_runs(name):
    import torch

    model = create_model(name, src_vocab_size=64, max_positions=64).eval()
    cfg = model.config
    tokens = torch.randint(4, 64, (2, 6))
    if cfg.arch == "encoder_decoder":
        assert model(tokens, tokens).logits.shape == (2, 6, cfg.target_vocab)
    elif cfg.arch == "causal_lm":
        assert model(tokens).logits.shape == (2, 6, 64)
    elif cfg.positions == "relative_2d":
        cells = cfg.grid_height * cfg.grid_width
        assert model(inputs_embeds=torch.randn(2, cells, cfg.d_model)).logits.shape == (2, cfg.num_classes)
    else:
        segments = torch.zeros_like(tokens) if cfg.n_segments else None
        assert model(tokens, segments=segments).logits.shape == (2, cfg.num_classes)
