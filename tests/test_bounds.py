"""Options that size a step's memory or time are bounded with a specific message before anything is built, and a
model too large for the machine is refused before it is built for real, naming the tensor (issue 49: a typo
reached the allocator, exit 1, or ran on for hours)."""
import re

import pytest
import torch

from helpers import set_args
from helpers.tiny_runs import TINY_LM
from interlayer.checkpoint import MAX_TENSORS, check_buildable
from interlayer.cli import main
from interlayer.config import config_from_dict
from interlayer.errors import ConfigError
from interlayer.models.registry import create_model

LM = dict(arch="causal_lm", src_vocab_size=29, d_model=16, n_heads=2, d_ffn=32, enc_layers=2, max_positions=16)
PRE_LN = {**LM, "norm_first": True}
CLASSIFIER = {**LM, "arch": "encoder_classifier", "num_classes": 3}

# (config, the key, the largest accepted value, the message for one more)
BOUNDS = {
    "hyper_connections.rate": (PRE_LN, 64, r"hyper_connections\.rate=65 is more than 64, the most interlayer allows: "
                                           r"every layer keeps that many copies of the residual stream"),
    "mhc.rate": (PRE_LN, 64, r"mhc\.rate=65 is more than 64"),
    "mhc.sinkhorn_iters": (PRE_LN, 1000, r"mhc\.sinkhorn_iters=1001 is more than 1,000, the most interlayer allows: "
                                         r"every layer of every forward pass runs that many normalisations"),
    "multipass.passes": (CLASSIFIER, 64, r"multipass\.passes=65 is more than 64.*each pass runs the whole encoder"),
    "lightweight.qk_expansion": (CLASSIFIER, 64, r"lightweight\.qk_expansion=65 is more than 64"),
    "predictive.conv_layers": (CLASSIFIER, 64, r"predictive\.conv_layers=65 is more than 64"),
    "conv_branch.kernel_size": (CLASSIFIER, 31, r"conv_branch\.kernel_size=33 is wider than 2 x max_positions - 1 = "
                                                r"31, which already reaches every position"),
    "predictive.kernel_size": (CLASSIFIER, 31, r"predictive\.kernel_size=33 is wider than 2 x max_positions - 1"),
    "max_positions": (LM, 65536, r"max_positions=65537 is more than 65,536, the longest sequence interlayer builds "
                                 r"position tables for"),
    "enc_layers": (LM, 1024, r"enc_layers=1025 is more than 1,024, the deepest stack interlayer builds"),
    "dec_layers": ({**LM, "arch": "encoder_decoder"}, 1024, r"dec_layers=1025 is more than 1,024"),
}


def _config(base, key, value):
    section, _, option = key.rpartition(".")
    return {**base, section: {option: value}} if section else {**base, key: value}


@pytest.mark.parametrize("key", list(BOUNDS))
def test_a_multiplier_of_memory_or_time_is_bounded_by_name(key):
    base, largest, message = BOUNDS[key]
    config_from_dict(_config(base, key, largest))  # the bound itself is accepted
    over = largest + (2 if key.endswith("kernel_size") else 1)  # kernels are odd
    with pytest.raises(ConfigError, match=message):
        config_from_dict(_config(base, key, over))


@pytest.mark.parametrize("fields, message", [
    ({"d_model": 10 ** 9}, r"the model's parameters and tables need [\d,.]+ GiB \(the largest, .+, of shape "
                           r"\(\d+, 1000000000\)\), more than this machine's [\d,.]+ GiB of memory"),
    ({"enc_layers": 8}, r"the model would hold more than 40 parameter tensors"),
    ({"d_model": 2 ** 40, "n_heads": 1}, r"the model cannot be built: .*overflow"),
])
def test_a_model_too_large_for_the_machine_is_refused_before_it_is_built(fields, message, monkeypatch):
    """Built on the meta device only: no memory, and a build of too many tensors stops at the budget (100,000; 40
    here, where 8 layers hold more)."""
    from interlayer import checkpoint

    assert MAX_TENSORS == 100_000
    monkeypatch.setattr(checkpoint, "MAX_TENSORS", 40)
    config = config_from_dict({**LM, **fields})
    with pytest.raises(ConfigError, match=message):
        check_buildable(lambda: create_model(config.to_dict()))
    with torch.device("meta"):
        check_buildable(lambda: create_model(config_from_dict(LM).to_dict()))


@pytest.mark.parametrize("sets, message", [
    (["hyper_connections.rate=400", "norm_first=true"], r"hyper_connections\.rate=400 is more than 64"),
    (["d_model=1000000000"], r"the model's parameters and tables need"),
])
def test_train_refuses_them_before_anything_is_written(tmp_path, capsys, sets, message):
    (tmp_path / "book.txt").write_text("to be or not to be, that is the question.\n" * 40)
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(tmp_path / "book.txt"), "--run-dir", str(run), "--no-progress",
                 *set_args([*TINY_LM, *sets])]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("interlayer: training")]
    assert len(lines) == 1 and re.search(message, lines[0]), lines
    assert not run.exists()


@pytest.mark.parametrize("argv, message", [
    (["compare", "--task", "lm", "--variants", "baseline,pa", "--seeds", "600"],
     r"2 variants x 600 seeds are 1,200 runs, more than 1,000 in one compare"),
    (["compare", "--task", "lm", "--variants", "baseline", "--jobs", "100000"],
     r"--jobs=100000 is more than the \d+ cores this process may use"),
    (["search", "mpt", "--task", "lm", "--trials", "2", "--workers", "100000"],
     r"--workers=100000 must be 1\.\.\d+ \(processes training at once"),
])
def test_what_one_command_may_start_is_bounded(tmp_path, capsys, argv, message):
    """A mistyped loop that builds --variants or --seeds, or a --jobs / --workers typo, planned thousands of runs or
    started as many processes; refused before the output folder is made."""
    assert main([*argv, "--output", str(tmp_path / "out")]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
