"""Choice fields: a ``Literal`` annotation is the one list of valid values, and one coercer checks it everywhere.

A loader (:func:`config_from_dict`, ``dataclass_from_dict``) and a ``validate`` of a config built in Python must
refuse the same values with the same message; no module keeps its own copy of a choice list.
"""
import re
import typing
from pathlib import Path

import pytest
import torch

from interlayer import ConfigError, ModelConfig, config_from_dict
from interlayer.config_io import dataclass_from_dict
from interlayer.core.config import TransformerConfig
from interlayer.methods.conv_branch import ConvBranchConfig
from interlayer.methods.crossformer import CrossformerConfig
from interlayer.methods.multipass import MultiPassConfig
from interlayer.methods.predictive import PredictiveConfig
from interlayer.tasks.image import ImageData
from interlayer.tasks.language_modeling import LMData
from interlayer.training.config import TrainConfig
from interlayer.training.device import resolve_precision

SRC = Path(__file__).resolve().parents[1] / "src" / "interlayer"


def _literal(cls: type, name: str) -> tuple:
    hint = typing.get_type_hints(cls)[name]
    while typing.get_origin(hint) is not typing.Literal:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_args(hint)


@pytest.mark.parametrize("cls, name", [
    (TransformerConfig, "arch"), (TransformerConfig, "positions"), (TransformerConfig, "activation"),
    (TransformerConfig, "pooling"), (TransformerConfig, "attn_impl"), (TransformerConfig, "position_start"),
    (TrainConfig, "optimizer"), (TrainConfig, "schedule"), (TrainConfig, "precision"),
    (MultiPassConfig, "connection"), (MultiPassConfig, "routing"), (MultiPassConfig, "loss"),
    (CrossformerConfig, "ffn_order"), (CrossformerConfig, "sg_norm"), (CrossformerConfig, "reduction"),
    (CrossformerConfig, "soft_target"), (CrossformerConfig, "hard"), (CrossformerConfig, "sides"),
    (PredictiveConfig, "kernel"), (PredictiveConfig, "init"), (ConvBranchConfig, "activation"),
    (ConvBranchConfig, "out_proj"), (ImageData, "augment"), (LMData, "tokenizer"),
])
def test_choice_fields_are_literals_whose_default_is_a_choice(cls, name):
    default = getattr(cls(), name)
    assert all(value in _literal(cls, name) for value in (default if isinstance(default, list) else [default])
               if value is not None)


def test_a_loader_names_the_key_the_choices_and_the_closest_one():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"activation": "gelu_tan"})
    assert str(err.value) == ("config: activation='gelu_tan' is not valid; choose one of 'relu', 'gelu', "
                              "'gelu_tanh' (did you mean 'gelu_tanh'?)")
    with pytest.raises(ConfigError, match=r"multipass.routing='e' is not valid; choose one of 'a', 'b', 'c', 'd'$"):
        config_from_dict({"multipass": {"routing": "e"}})  # nothing close enough to suggest


def test_an_optional_choice_admits_null_and_says_so():
    assert config_from_dict({"predictive": {"kernel": None}}).predictive.kernel is None
    with pytest.raises(ConfigError, match=r"predictive.kernel='causall' is not valid; choose one of 'symmetric', "
                                          r"'causal', or null \(did you mean 'causal'\?\)"):
        config_from_dict({"predictive": {"kernel": "causall"}})


def test_list_items_are_checked_one_by_one():
    with pytest.raises(ConfigError, match=r"crossformer.hard\[1\]='kv' is not valid; choose one of 'kq', 'qk'"):
        config_from_dict({"crossformer": {"hard": ["kq", "kv"]}})
    assert dataclass_from_dict(CrossformerConfig, {"hard": "kq, vf"}).hard == ["kq", "vf"]


@pytest.mark.parametrize("build, message", [
    (lambda: TransformerConfig(pooling="max"), r"^pooling='max' is not valid; choose one of 'cls', 'mean'$"),
    (lambda: ModelConfig(multipass=MultiPassConfig(loss="sum")), r"^multipass.loss='sum' is not valid"),
    (lambda: ModelConfig(crossformer=CrossformerConfig(soft=["kq"], sides=["encoder", "middle"])),
     r"^crossformer.sides\[1\]='middle' is not valid"),
    (lambda: ModelConfig(conv_branch=ConvBranchConfig(out_proj="both")), r"^conv_branch.out_proj='both' is not"),
    (lambda: TrainConfig(optimizer="sgd"), r"^train.optimizer='sgd' is not valid; choose one of 'adam', 'adamw'$"),
    (lambda: TrainConfig(schedule="cosin"), r"train.schedule='cosin' .* \(did you mean 'cosine'\?\)$"),
    (lambda: ImageData(augment="rotate"), r"^data.augment='rotate' is not valid; choose one of 'none', 'flip'"),
    (lambda: LMData(tokenizer="word"), r"^data.tokenizer='word' is not valid; choose one of 'char', 'bpe'$"),
])
def test_validate_refuses_a_config_built_in_python_like_a_loader(build, message):
    """Python skips the loaders; ``validate`` runs the same check, nested method sections included."""
    with pytest.raises(ConfigError, match=message):
        build().validate()


def test_the_device_code_checks_precision_with_the_same_coercer():
    with pytest.raises(ConfigError, match=r"train.precision='fp8' is not valid; choose one of 'auto', 'fp32'"):
        resolve_precision("fp8", torch.device("cpu"))


def test_no_module_keeps_its_own_choice_check():
    """The message "is not valid; choose one of" is written once, in the coercer; a second copy is a choice list
    kept beside its annotation."""
    sites = [path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
             if re.search(r"is not valid; choose one of", path.read_text())]
    assert sites == ["config_io.py"]
