"""Every option of the core config and of every method section is a size of the saved weights or not (the config
class's ``WEIGHT_SIZES``), and the size check that runs before a saved model is built agrees (issue 49): a model
saved with every other option changed from its default loads again, a size edited in ``config.json`` is refused
before any model is built, and a size as large as a valid model makes it passes the check against its own
tensors. The ResFormer run the issue found stranded (a warm-up length taken for a tensor dimension) trains and its
``best/`` is used by ``generate``, ``export`` and ``evaluate``."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import set_args
from helpers.folders import snapshot
from helpers.tiny_runs import TINY_LM
from interlayer import CheckpointError, ConfigError, create_model, load_pretrained, save_pretrained
from interlayer.checkpoint import canonical_state_dict, check_loadable, weight_sizes
from interlayer.cli import main
from interlayer.config import ModelConfig
from interlayer.core.config import TransformerConfig
from interlayer.methods import METHODS
from interlayer.models.registry import families

# A small model of each architecture; the cases below add the fields their options need
CORE = dict(src_vocab_size=29, d_model=16, n_heads=2, d_ffn=32, enc_layers=2, dec_layers=2, max_positions=16,
            dropout=0.0)
LM = {**CORE, "arch": "causal_lm"}
SEQ2SEQ = {**CORE, "arch": "encoder_decoder"}
CLASSIFIER = {**CORE, "arch": "encoder_classifier", "num_classes": 3}
PRE_LN = {**LM, "norm_first": True}

# Every option that is no size of the weights, changed from its default: (core fields, section) per case; the
# cases of one method change every such option between them (checked below, so a new option needs a value here)
SETTINGS: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {
    "lightweight": [(CLASSIFIER, {"attention": False, "ffn": False, "share_weights": False, "group_merge": True,
                                  "group_intermediate": True}),
                    (CLASSIFIER, {"straddle_heads": True})],
    "conv_branch": [(CLASSIFIER, {"heads": 2, "activation": "gelu", "out_proj": "joint"})],
    "predictive": [({**SEQ2SEQ, "causal_decoder": False},
                    {"alpha": 0.3, "kernel_size": 5, "share_conv": True, "init": "dirac", "beta": 0.5,
                     "alpha_warmup_steps": 100_000, "kernel": "causal", "activation": "leaky_relu",
                     "sides": ["encoder", "decoder"]})],
    "value_residual": [(LM, {"lambda_1": 0.3, "lambda_2": 0.7, "learnable": True, "granularity": "head",
                             "sides": ["encoder"], "lambda_warmup_steps": 100_000}),
                       (LM, {"mode": "svformer"})],
    "denseformer": [({**LM, "enc_layers": 4}, {"dilation": 100, "period": 2})],
    "hyper_connections": [(PRE_LN, {"dynamic": False, "scale_init": 0.5, "input_index": "layer",
                                    "stream_dtype": "bfloat16"})],
    "mhc": [(PRE_LN, {"dynamic": False, "sinkhorn_iters": 100, "scale_init": 0.5, "norm_eps": 1e-6,
                      "init_epsilon": 0.05, "stream_dtype": "float16"})],
    "muddformer": [({**LM, "enc_layers": 4}, {"dynamic": False, "multiway": False, "dilation": 100, "period": 2,
                                              "prepost_norm": True, "ffn_reallocation": True})],
    "cla": [({**PRE_LN, "enc_layers": 5}, {"sharing_factor": 3, "short_group": "last", "separate_kv_norm": True,
                                           "sides": ["encoder"]})],
    "multipass": [(CLASSIFIER, {"passes": 60, "connection": "soft", "routing": "b", "loss": "all", "exit_pass": 59,
                                "soft_init": 0.8, "share_soft_weights": True}),
                  (CLASSIFIER, {"connection": "hard", "permutation": [1, 0]})],
    "crossformer": [({**SEQ2SEQ, "enc_layers": 3, "dec_layers": 3},
                     {"hard": ["kq"], "soft": ["qq", "ffn"], "ffn_order": "w1_w2", "sides": ["encoder", "decoder",
                                                                                             "cross"],
                      "p": 1, "alpha": 0.05, "sg_norm": "root", "reduction": "mean", "soft_target": "states",
                      "include_bias": False})],
    "layer_sharing": [({**LM, "enc_layers": 4}, {"share": "attention", "repeats": 2, "order": "reverse",
                                                 "sides": ["encoder"]})],
}
# Options whose default is their only valid value in every model: conv_branch's and predictive's stacks (a decoder
# is refused, and predictive's own default is the encoder)
ONLY_DEFAULT = {("conv_branch", "sides")}

# The core's options that are no size of the weights, changed from their defaults, over these cases
CORE_SETTINGS: list[dict[str, Any]] = [
    {**SEQ2SEQ, "tgt_vocab_size": 31, "dec_layers": 3, "qk_dim": 32, "activation": "gelu", "norm_first": True,
     "causal_decoder": False, "layer_norm_eps": 1e-6, "bias": False, "positions": "learned", "max_positions": 100,
     "position_start": "after_pad", "embed_scale": False, "embed_layer_norm": True, "tie_output": False, "pad_id": 1,
     "dropout": 0.2, "embed_dropout": 0.3, "attn_dropout": 0.1, "act_dropout": 0.1, "attn_impl": "eager"},
    {**SEQ2SEQ, "share_embeddings": True, "positions": "relative", "rel_max_distance": 100},
    {**CLASSIFIER, "num_classes": 100, "pooling": "mean", "classifier_hidden": 100, "positions": "relative_2d",
     "grid_height": 2, "grid_width": 3},
    {**LM, "positions": "rotary", "max_positions": 65_536},
    {**LM, "positions": "sinusoidal", "max_positions": 65_536, "d_model": 64, "n_heads": 4},
    {**LM, "positions": "none"},
]

# Each size, edited in a saved model's config.json to another valid value: (core fields, section, key, new value)
SIZE_EDITS: dict[str, tuple[dict[str, Any], dict[str, Any], str, Any]] = {
    "lightweight.groups": (CLASSIFIER, {}, "groups", 1),
    "lightweight.qk_expansion": (CLASSIFIER, {}, "qk_expansion", 2),
    "conv_branch.attn_dim": (CLASSIFIER, {"heads": 2}, "attn_dim", 4),
    "conv_branch.kernel_size": (CLASSIFIER, {}, "kernel_size", 5),
    "predictive.conv_layers": (CLASSIFIER, {}, "conv_layers", 2),
    "hyper_connections.rate": (PRE_LN, {}, "rate", 2),
    "mhc.rate": (PRE_LN, {}, "rate", 2),
}
CORE_SIZE_EDITS = {"src_vocab_size": 31, "d_model": 32, "enc_layers": 3, "n_segments": 2}

# Each size at a value above the check's floor of 64, in a valid model (built on the meta device only)
LARGE_SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "src_vocab_size": ({**LM, "src_vocab_size": 100}, {}),
    "d_model": ({**LM, "d_model": 128}, {}),
    "enc_layers": ({**LM, "enc_layers": 70}, {}),
    "n_segments": ({**CLASSIFIER, "n_segments": 100}, {}),
    "lightweight.groups": ({**CLASSIFIER, "d_model": 128, "n_heads": 128, "d_ffn": 128},
                           {"lightweight": {"groups": 128}}),
    "conv_branch.attn_dim": ({**CLASSIFIER, "d_model": 128}, {"conv_branch": {"attn_dim": 100, "heads": 1}}),
    "conv_branch.kernel_size": ({**CLASSIFIER, "max_positions": 64}, {"conv_branch": {"kernel_size": 101}}),
}
# Sizes their configs bound at 64 (test_bounds.py): no valid value exceeds the check's floor of 64.
BOUNDED_SIZES = {"lightweight.qk_expansion", "predictive.conv_layers", "hyper_connections.rate", "mhc.rate"}
# Options that look like sizes but are none, at large values where no tensor is as wide: d_ffn where G-FFN and G-IL
# share one group's weights, the heads that split a projection, qk_dim scaled to conv_branch's attention half
LARGE_SIZE_COMBINATIONS = {
    "d_ffn_lightweight_shared": ({**CLASSIFIER, "d_ffn": 100},
                                 {"lightweight": {"groups": 2, "group_intermediate": True}}),
    "n_heads": ({**LM, "d_model": 128, "n_heads": 128}, {}),
    "conv_branch.heads": ({**CLASSIFIER, "d_model": 200}, {"conv_branch": {"heads": 100}}),
    "qk_dim_conv_branch": ({**CLASSIFIER, "qk_dim": 96, "d_model": 64}, {"conv_branch": {"attn_dim": 32}}),
}


def _section(name: str) -> type:
    return next(method.config_class for method in METHODS if method.name == name)


def _options(cls: type) -> set[str]:
    return {item.name for item in dataclasses.fields(cls)}


def _model(core: dict[str, Any], sections: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model({**core, **sections})


def _saved(directory: Path, core: dict[str, Any], sections: dict[str, Any]) -> Path:
    return save_pretrained(_model(core, sections), directory)


def _edit(folder: Path, section: str, key: str, value: Any) -> None:
    """One value of the interlayer config in ``config.json`` (its ``interlayer`` section: helpers.folders)."""
    data = json.loads((folder / "config.json").read_text())
    config = data["interlayer"]["config"]
    (config[section] if section else config)[key] = value
    (folder / "config.json").write_text(json.dumps(data))


# -- the classification ----------------------------------------------------------------------------------------------
def test_every_config_class_classifies_its_options_itself():
    """Each method's section, the core config and every registered family's config declare their own sizes, and
    name only options they have."""
    classes = [TransformerConfig, *(method.config_class for method in METHODS),
               *(kind.config_class for kind in families())]
    for cls in classes:
        declared = next((klass.__dict__["WEIGHT_SIZES"] for klass in cls.__mro__ if "WEIGHT_SIZES" in klass.__dict__),
                        None)
        assert declared is not None, f"{cls.__name__} does not say which of its options size its weights"
        assert declared <= _options(cls), (cls.__name__, declared - _options(cls))
    assert weight_sizes(ModelConfig) == weight_sizes(TransformerConfig)


def test_the_cases_change_every_option_that_is_no_size():
    """The settings cases below cover every option of every method that is no size (a new option needs a case),
    and the size cases cover every size."""
    for method in METHODS:
        settings = _options(method.config_class) - weight_sizes(method.config_class)
        changed = {key for _, section in SETTINGS[method.name] for key in section}
        assert changed | {key for name, key in ONLY_DEFAULT if name == method.name} == settings, method.name
        sizes = {key.split(".", 1)[1] for key in SIZE_EDITS if key.split(".")[0] == method.name}
        assert sizes == weight_sizes(method.config_class), method.name
        large = {key.split(".", 1)[1] for key in {*LARGE_SIZES, *BOUNDED_SIZES} if key.startswith(f"{method.name}.")}
        assert large == sizes
    core_settings = _options(TransformerConfig) - weight_sizes(TransformerConfig)
    defaults = {item.name: item.default for item in dataclasses.fields(TransformerConfig)}
    changed = {key for case in CORE_SETTINGS for key, value in case.items() if value != defaults[key]}
    assert core_settings <= changed, core_settings - changed
    assert set(CORE_SIZE_EDITS) == weight_sizes(TransformerConfig) == {k for k in LARGE_SIZES if "." not in k}


# -- no false refusal ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, index", [(name, i) for name, cases in SETTINGS.items() for i in range(len(cases))])
def test_a_model_with_every_other_option_changed_loads_again(tmp_path, name, index):
    """Saved -> size-checked -> loaded, with no refusal: a warm-up of 100,000 steps, 100 Sinkhorn iterations, 60
    passes (the bound is 64) or a dilation of 100 on a model whose tensors are 32 wide are settings, not lies about
    the weights."""
    core, section = SETTINGS[name][index]
    model = _model(core, {name: section})
    folder = save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(folder)
    assert loaded.config == model.config
    state, again = canonical_state_dict(model), canonical_state_dict(loaded)
    assert all(torch.equal(state[k], again[k]) for k in state)


@pytest.mark.parametrize("index", range(len(CORE_SETTINGS)))
def test_a_model_with_the_cores_other_options_changed_loads_again(tmp_path, index):
    model = _model(CORE_SETTINGS[index], {})
    assert load_pretrained(save_pretrained(model, tmp_path / "m")).config == model.config


@pytest.mark.parametrize("key", [*LARGE_SIZES, *LARGE_SIZE_COMBINATIONS])
def test_a_size_as_large_as_a_valid_model_makes_it_passes_the_check(key):
    """Above the floor of 64, on the meta device: the model's own tensors justify each of its sizes."""
    core, sections = {**LARGE_SIZES, **LARGE_SIZE_COMBINATIONS}[key]
    with torch.device("meta"):
        model = create_model({**core, **sections})
    check_loadable(model)


# -- every size edited is refused --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_models(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """One saved model per (core fields, method) of the size cases, shared by the edits."""
    root, out = tmp_path_factory.mktemp("sizes"), {}
    for key, (core, section, _, _) in SIZE_EDITS.items():
        name = key.split(".")[0]
        folder = root / key
        _saved(folder, core, {name: section})
        out[key] = folder
    out["core"] = _saved(root / "core", CLASSIFIER, {})
    return out


@pytest.mark.parametrize("key", [*SIZE_EDITS, *CORE_SIZE_EDITS])
def test_every_size_edited_in_config_json_is_refused_before_any_model_is_built(saved_models, tmp_path, key,
                                                                               real_builds):
    """Another valid value: the shapes-only build disagrees with the weights; an absurd one: the weights' header
    refuses it by name (step 1), before any build."""
    section, option = key.split(".") if "." in key else ("", key)
    value = SIZE_EDITS[key][3] if section else CORE_SIZE_EDITS[key]
    for edit, message in ((value, r"does not fit|has shape|different models|tied|parameter tensors"),
                          (10 ** 9, rf"{key}=1000000000 is larger than anything .*model\.safetensors holds")):
        folder = shutil.copytree(saved_models[key if section else "core"], tmp_path / f"m{edit}")
        _edit(folder, section, option, edit)
        real_builds.clear()
        with pytest.raises(CheckpointError, match=message):
            load_pretrained(folder)
        assert set(real_builds) <= {"meta"}


# -- training refuses what its own folder could not give back -------------------------------------------------------
def test_training_refuses_a_model_its_saved_folder_could_not_give_back(monkeypatch):
    """The backstop: were an option misclassified again (here the warm-up, as the issue found it), the run is
    refused before it starts, not after it trained."""
    from interlayer.methods.value_residual import ValueResidualConfig

    model = _model(LM, {"value_residual": {"lambda_warmup_steps": 100}})
    check_loadable(model)
    monkeypatch.setattr(ValueResidualConfig, "WEIGHT_SIZES", frozenset({"lambda_warmup_steps"}))
    with pytest.raises(ConfigError, match=r"value_residual\.lambda_warmup_steps=100 is larger than anything its saved "
                                          r"weights file holds .*; refused before training: a saved copy"):
        check_loadable(model)


# -- the run -------------------------------------------------------------------------------------------------
def test_the_resformer_run_trains_and_every_command_uses_its_best_model(tmp_path, capsys):
    """``train lm --set enc_layers=2 --set value_residual.mode=resformer --set
    value_residual.lambda_warmup_steps=100``, at toy size: trained, then its own final scoring, ``generate``,
    ``export`` and ``evaluate`` refused RUN/best. Each now reads it."""
    (tmp_path / "book.txt").write_text("to be or not to be, that is the question.\n" * 40)
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(tmp_path / "book.txt"), "--run-dir", str(run), "--no-progress",
                 *set_args([*TINY_LM, "enc_layers=2", "value_residual.mode=resformer",
                            "value_residual.lambda_warmup_steps=100", "train.max_steps=2"])]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished" and "test_loss" in results
    assert main(["generate", "--checkpoint", str(run / "best"), "--max-new-tokens", "4", "--prompt", "to"]) == 0
    assert main(["evaluate", "--checkpoint", str(run / "best")]) == 0
    before = snapshot(run)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert snapshot(run) == before
    assert load_pretrained(tmp_path / "out").config.value_residual.lambda_warmup_steps == 100
    capsys.readouterr()
