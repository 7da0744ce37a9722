"""config_io: the config plumbing below the methods: the one function that applies dotted overrides (set_dotted),
which every family's overrides and a resumed run's --set go through; the one finite check; config files and --set
values read with their duplicates, syntax and bytes refused, naming the place."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers.tiny_runs import translation_args
from interlayer import get_config
from interlayer.cli import main
from interlayer.config_io import parse_value, read_config_file, set_dotted
from interlayer.errors import ConfigError
from interlayer.training.config import TrainConfig


def test_text_values_are_set_values_and_sections_turn_on() -> None:
    data = {"d_model": 64, "crossformer": None, "predictive": {"alpha": 0.1}}
    out = set_dotted(data, {"d_model": "128", "crossformer.hard": "[kq, ffn]", "predictive.alpha": 0.3},
                     is_section=lambda name: name in ("crossformer", "predictive"))
    assert out is data
    assert data == {"d_model": 128, "crossformer": {"hard": ["kq", "ffn"]}, "predictive": {"alpha": 0.3}}
    assert set_dotted({"predictive": None}, {"predictive": "true"}, is_section=lambda name: True) == {"predictive": {}}
    assert set_dotted({"flag": False}, {"flag": "true"}) == {"flag": True}  # not a section: a plain value


def test_a_key_the_config_lacks_is_looked_up_in_the_nested_configs() -> None:
    data = {"patch_size": 4, "encoder": {"d_model": 64, "predictive": None}}
    set_dotted(data, {"d_model": 32, "predictive.alpha": "0.2", "encoder.n_heads": 2, "patch_size": 7},
               nested=("encoder",))
    assert data == {"patch_size": 7, "encoder": {"d_model": 32, "predictive": {"alpha": 0.2}, "n_heads": 2}}


def test_unknown_keys_and_keys_into_a_plain_field_are_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'dropuot' \(did you mean 'dropout'\?\); valid keys: "
                                          r"d_model, dropout"):
        set_dotted({"dropout": 0.1, "d_model": 8}, {"dropuot": 0.2})
    with pytest.raises(ConfigError, match=r"crossformer.hard: crossformer='kq' is not a section"):
        set_dotted({"crossformer": "kq"}, {"crossformer.hard": "[kq]"})


@pytest.mark.parametrize("name, overrides, expected", [
    ("transformer_small", {"crossformer.hard": "kq", "d_model": "96"}, {"d_model": 96}),
    ("vit_fashion_mnist", {"d_model": "32", "predictive.alpha": "0.2"}, {"patch_size": 4}),
    ("gat_cora", {"crossformer": "ffn", "dropout": "0.5"}, {"crossformer": "ffn", "dropout": 0.5}),
    ("mcan_small", {"predictive.alpha": "0.3", "layers": "2"}, {"layers": 2}),
])
def test_every_family_takes_the_same_overrides(name: str, overrides: dict, expected: dict) -> None:
    """The Transformer, a vision model (its encoder nested), GAT (flat) and MCAN: each through set_dotted."""
    cfg = get_config(name, **overrides).to_dict()
    assert {key: cfg[key] for key in expected} == expected
    with pytest.raises(ConfigError, match="unknown key 'nope'"):
        get_config(name, nope=1)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gat", "cnn_text"])
def test_a_flat_family_loads_no_method(family: str) -> None:
    """The plumbing sits below the methods: the GAT and text-CNN families read and override their configs without
    the composed Transformer config and its twelve methods."""
    code = (f"import sys, interlayer.models.{family} as family\n"
            "print(sorted(m for m in sys.modules if m.startswith('interlayer.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "interlayer.config_io" in loaded
    assert "interlayer.methods" not in loaded and "interlayer.config'" not in loaded


def test_the_gpt_config_takes_the_names_transformers_and_nanogpt_users_know(tmp_path, capsys) -> None:
    """transformers' names (num_hidden_layers, hidden_size, vocab_size, ...) and GPT-2's / nanoGPT's (n_layer,
    n_head, n_embd) as input: keyword overrides, --set, config files; saved under the fields' own names. They are
    the names the config reads back (core/hf_names.py: one table)."""
    from interlayer.cli import main
    from interlayer.core.hf_names import FIELD_NAMES

    cfg = get_config("gpt_shakespeare_char", n_layer=2, n_head=2, n_embd=32, n_inner=64, vocab_size=70)
    assert (cfg.enc_layers, cfg.n_heads, cfg.d_model, cfg.d_ffn, cfg.src_vocab_size) == (2, 2, 32, 64, 70)
    assert all(getattr(cfg, name) == getattr(cfg, field) for name, (field, _) in FIELD_NAMES.items())
    path = tmp_path / "gpt.yaml"
    path.write_text("arch: causal_lm\nnum_hidden_layers: 3\nhidden_size: 48\nnum_attention_heads: 4\n")
    assert get_config(path).enc_layers == 3 and "num_hidden_layers" not in get_config(path).to_dict()
    assert main(["config", "gpt_shakespeare_char", "--set", "n_layer=5"]) == 0
    assert '"enc_layers": 5' in capsys.readouterr().out
    with pytest.raises(ConfigError, match="n_layer and enc_layers both set enc_layers; give one of them"):
        get_config("gpt_shakespeare_char", n_layer=2, enc_layers=3)
    path.write_text("num_hidden_layers: 3\nenc_layers: 2\n")
    with pytest.raises(ConfigError, match="num_hidden_layers and enc_layers both set enc_layers"):
        get_config(path)
    with pytest.raises(ConfigError, match=r"unknown key 'n_layers' \(did you mean 'n_layer'\?\).*other names: "
                                          r"vocab_size \(src_vocab_size\).*n_layer \(enc_layers\)"):
        get_config("gpt_shakespeare_char", n_layers=2)
    assert get_config("vit_fashion_mnist", n_layer=2).encoder.enc_layers == 2  # a nested Transformer config too


# -- values and files refused, naming the key or the place (issue 16) ---------------------------------------
@pytest.mark.parametrize("key, value", [("train.lr", ".nan"), ("train.lr", "inf"), ("train.warmup_init_lr", "inf"),
                                        ("train.min_lr", ".inf"), ("train.clip_norm", ".nan"),
                                        ("train.adam_eps", "-1e-8"), ("layer_norm_eps", "0"),
                                        ("layer_norm_eps", "nan"), ("train.step_gamma", "inf")])
def test_non_finite_or_out_of_range_numbers_are_refused_before_training(corpus, tmp_path, capsys, key, value):
    assert main(translation_args(corpus, tmp_path / "run", f"{key}={value}", "train.max_epochs=1")) == 2
    assert key.removeprefix("train.").split("[")[0] in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_one_finite_check_covers_every_config_and_section():
    with pytest.raises(ConfigError, match=r"train.max_minutes=inf is not a finite number"):
        TrainConfig(max_minutes=float("inf")).validate()
    with pytest.raises(ConfigError, match=r"crossformer.alpha=nan is not a finite number"):
        get_config("transformer_small", crossformer={"soft": ["kq"], "alpha": float("nan")})
    with pytest.raises(ConfigError, match=r"negative_slope=inf"):
        get_config("gat_cora", negative_slope=float("inf"))
    with pytest.raises(ConfigError, match=r"pixel_std\[0\]=nan"):
        get_config("vit_fashion_mnist", pixel_std=[float("nan")])


@pytest.mark.parametrize("name, content, message", [
    ("dup.yaml", b"d_model: 256\nn_heads: 4\nd_model: 128\n",
     r"dup\.yaml:3:1: not valid YAML: found duplicate key 'd_model' \(first at line 1"),
    ("nested.yaml", b"crossformer:\n  soft: [kq]\n  soft: [ffn]\n", r"nested\.yaml:3:3: .*duplicate key 'soft'"),
    ("dup.json", b'{"d_model": 256, "d_model": 128}', r"dup\.json: duplicate key 'd_model'"),
    ("bad.yaml", b"d_model: [1,\n", r"bad\.yaml:2:1: not valid YAML"),
    ("bad.json", b'{"d_model": }', r"bad\.json:1:13: not valid JSON"),
    ("latin1.yaml", b"# caf\xe9\nd_model: 64\n", r"latin1\.yaml:1: not valid UTF-8 \(byte 5"),
])
def test_config_files_with_duplicates_bad_syntax_or_bytes_are_refused(tmp_path, capsys, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        read_config_file(tmp_path / name)
    assert main(["config", str(tmp_path / name)]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("value, message", [("[1,", r"--set d_model='\[1,': not valid YAML"),
                                            ("{a: 1, a: 2}", r"duplicate key 'a'")])
def test_bad_yaml_in_set_is_refused_naming_the_key(capsys, value, message):
    assert main(["config", "transformer_small", "--set", f"d_model={value}"]) == 2
    assert re.search(message, capsys.readouterr().err)
    with pytest.raises(ConfigError, match=message):
        parse_value(value, "--set d_model")

