"""One registry for every named model (models/registry.py): every listed name builds and prints its config, in its
family; the composed config has one section per method; saved models load through what the package registers.
The layout it stands on (layers, import direction, file sizes) is tested in tests/test_layout.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Optional

import pytest
import torch

import interlayer
from interlayer import cli, create_model, get_config, list_models
from interlayer.config import ModelConfig
from interlayer.core.config import ConfigError, TransformerConfig
from interlayer.methods import METHODS
from interlayer.models import registry
from interlayer.models.aa_resnet import AAResNetConfig
from interlayer.models.cnn_text import CNNTextConfig
from interlayer.models.gat import GATConfig
from interlayer.models.mcan import MCANConfig
from interlayer.models.regions import RegionConfig
from interlayer.models.swin import SwinConfig
from interlayer.models.vision import VisionConfig

SRC = Path(interlayer.__file__).parent
NAMES = list_models()
CONFIG_CLASS = {"transformer": ModelConfig, "text_cnn": CNNTextConfig, "image": VisionConfig, "gat": GATConfig,
                "mcan": MCANConfig, "region": RegionConfig, "swin": SwinConfig, "aa_resnet": AAResNetConfig}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_listed_name_builds_and_prints_its_config(name: str, capsys: pytest.CaptureFixture) -> None:
    """The README's promise: ``create_model`` and ``interlayer config`` take every name ``interlayer models``
    lists, whatever its family (built on the meta device: nothing is allocated)."""
    family = registry.presets()[name].family
    with torch.device("meta"):
        model = create_model(name)
    assert isinstance(model.config, CONFIG_CLASS[family])
    assert cli.main(["config", name]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == model.config.to_dict()
    assert get_config(printed) == model.config  # the printed config reads back as the same family


def test_every_family_is_listed_and_filtered() -> None:
    assert {registry.presets()[name].family for name in NAMES} == set(CONFIG_CLASS)
    assert {"transformer_small", "cnn_text", "vit_fashion_mnist", "gat_cora"} <= set(NAMES)
    assert list_models(family="gat") == ["gat_citeseer", "gat_citeseer_crossformer_ffn",
                                         "gat_citeseer_crossformer_kq", "gat_cora", "gat_cora_crossformer_ffn",
                                         "gat_cora_crossformer_kq"]
    assert list_models("*_crossformer_kq") == ["gat_citeseer_crossformer_kq", "gat_cora_crossformer_kq"]
    assert list_models("mpt_*", family="transformer") == sorted(n for n in NAMES if n.startswith("mpt_"))
    with pytest.raises(ConfigError, match="unknown model family 'graph'; known: transformer, text_cnn, image, gat"):
        list_models(family="graph")


@pytest.mark.parametrize("name, overrides, check", [
    ("transformer_small", {"d_model": "128", "crossformer.hard": "kq"},
     lambda c: c.d_model == 128 and c.crossformer.hard == ["kq"]),
    ("vit_fashion_mnist", {"patch_size": "7", "predictive.alpha": "0.2"},
     lambda c: c.patch_size == 7 and c.encoder.predictive.alpha == 0.2 and c.encoder.grid_height == 4),
    ("gat_cora", {"dropout": "0.5", "crossformer": "ffn"}, lambda c: c.dropout == 0.5 and c.crossformer == "ffn"),
    ("cnn_text", {"pooling": "max", "enc_layers": "2"}, lambda c: c.pooling == "max" and c.enc_layers == 2),
    ("swin_fashion_mnist", {"lightweight.groups": "2", "window": "8"},
     lambda c: c.lightweight.groups == 2 and c.window == 8),
    ("aa_resnet_fashion_mnist", {"predictive.alpha": "0.5", "heads": "2"},
     lambda c: c.predictive.alpha == 0.5 and c.heads == 2),
])
def test_overrides_reach_each_family_as_set_strings(name: str, overrides: dict, check) -> None:
    """``--set`` values arrive as text; each family parses them and routes dotted keys into its sections."""
    cfg = get_config(name, **overrides)
    assert check(cfg)
    assert cli.main(["config", name, *[f"--set={k}={v}" for k, v in overrides.items()]]) == 0


def test_a_saved_config_file_is_read_as_its_family(tmp_path: Path) -> None:
    for name in ("gat_cora_crossformer_kq", "pa_vit_fashion_mnist", "cnn_text", "mpt_soft_small", "lw_swin_t",
                 "pa_aa_resnet_fashion_mnist"):
        cfg = get_config(name)
        cfg.save(tmp_path / f"{name}.yaml")
        assert get_config(tmp_path / f"{name}.yaml") == cfg


def test_a_family_refuses_another_familys_preset_and_suggests_names() -> None:
    with pytest.raises(ConfigError, match=r"'transformer_small' is a transformer model, not a gat model; gat "
                                          r"presets: gat_citeseer, "):
        get_config("transformer_small", family="gat")
    with pytest.raises(ConfigError, match=r"unknown preset 'gat_cor'; did you mean \['gat_cora'"):
        get_config("gat_cor")
    with pytest.raises(ConfigError, match=r"unknown key 'dropuot' \(did you mean 'dropout'\?\)"):
        get_config("gat_cora", dropuot=0.1)
    with pytest.raises(ConfigError, match=r"pooling='avg' is not valid"):
        get_config("cnn_text", pooling="avg")


def test_the_models_table_has_one_parameter_column() -> None:
    table = registry.model_catalog(64, ["transformer_small", "gat_cora"])
    header = next(line for line in table.splitlines() if line.startswith("| preset"))
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["preset", "parameters", "MAdds @ 64 tokens"]
    rows = {cells[0]: cells[1:] for line in table.splitlines() if line.startswith("| ")
            for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}
    assert rows["transformer_small"][0] == f"{interlayer.count_parameters(create_model('transformer_small')):,}"
    assert rows["gat_cora"] == ["92,373", "250.90M"]  # PyG's GAT on Cora has 92,373 too


def test_a_preset_name_is_one_model() -> None:
    with pytest.raises(RuntimeError, match="preset 'gat_cora' is defined twice"):
        registry.register_presets("transformer", {"gat_cora": ("again", {})})


def test_model_config_has_one_section_per_method() -> None:
    """The sections' typed fields are ModelConfig's schema; they must match METHODS, name and class."""
    hints = typing.get_type_hints(ModelConfig)
    core = {f for f in typing.get_type_hints(TransformerConfig)}
    sections = {name: hint for name, hint in hints.items() if name not in core}
    assert sections == {method.name: Optional[method.config_class] for method in METHODS}


@pytest.mark.slow
def test_load_pretrained_finds_a_family_nothing_has_imported_yet(tmp_path: Path) -> None:
    """``interlayer`` imports its parts lazily, so ``load_pretrained`` asks the registry for the model types."""
    create_model("gat_cora", hidden=2, heads=2).save_pretrained(tmp_path / "gat")
    code = ("import sys, interlayer\n"
            f"model = interlayer.load_pretrained({str(tmp_path / 'gat')!r})\n"
            "print(type(model).__name__, 'interlayer.models.gat' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC.parent)}).stdout.split()
    assert out == ["GAT", "True"]


def test_the_core_saves_and_loads_through_what_the_package_registers(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``core/hub.py`` imports nothing above the core: ``save_pretrained`` / ``from_pretrained`` call the saver and
    loader that ``interlayer/__init__`` registers, and say so when none is."""
    from interlayer.core import hub
    from interlayer.core.models import EncoderClassifier

    model = create_model("gat_cora", hidden=2, heads=2)
    model.save_pretrained(tmp_path / "gat")
    assert type(type(model).from_pretrained(tmp_path / "gat")).__name__ == "GAT"
    with pytest.raises(interlayer.CheckpointError, match="holds a GAT, not a EncoderClassifier"):
        EncoderClassifier.from_pretrained(tmp_path / "gat")
    monkeypatch.setattr(hub, "_STORAGE", {})
    with pytest.raises(RuntimeError, match="no model saver is registered"):
        model.save_pretrained(tmp_path / "again")
    with pytest.raises(RuntimeError, match="no model loader is registered"):
        type(model).from_pretrained(tmp_path / "gat")
