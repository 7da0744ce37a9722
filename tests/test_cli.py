"""The command line's promise for bad input (issue 43): one line, exit code 2, nothing written. Oversized model folders
for every command that loads one, bounds on generate's and compare's numbers, parsing depth and integer size,
long values quoted short, and writes the machine refuses."""
import os
import re
from pathlib import Path

import pytest

from helpers import set_args
from helpers.folders import copy_folder, read_only_folder, snapshot, train_tiny_lm
from helpers.tiny_runs import TINY_LM
from interlayer.cli import main
from interlayer.cli.args import one_line
from interlayer.cli.trained import MAX_SAMPLES
from interlayer.compare import MAX_SEEDS


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    return train_tiny_lm(tmp_path_factory.mktemp("lm"))


def _one_line_error(capsys) -> str:
    """The one error line on stderr (``train`` says where it trains first)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("interlayer: training ")]
    assert len(lines) == 1 and lines[0].startswith("interlayer: error: "), lines
    return lines[0]


# -- an oversized model folder, for every command that loads one ----------------------------------------------------
OVERSIZED = {"layers": {"enc_layers": 10_000_000}, "hc_rate": {"hyper_connections": {"rate": 100_000_000}},
             "vocab": {"src_vocab_size": 10 ** 12}, "positions": {"max_positions": 10 ** 12},
             "width": {"d_model": 10 ** 9}}
COMMANDS = {"generate": lambda folder, out: ["generate", "--checkpoint", str(folder), "--max-new-tokens", "4"],
            "evaluate": lambda folder, out: ["evaluate", "--checkpoint", str(folder)],
            "export": lambda folder, out: ["export", str(folder), str(out)]}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(OVERSIZED))
def test_an_oversized_model_folder_is_one_line_and_exit_2_for_every_command(lm_run, tmp_path, capsys, command,
                                                                            case):
    """The issue's five failures (building layers until memory ran out, "can't allocate memory"), per command:
    refused from the weights' header, naming the key, the value and what the file holds; nothing written."""
    folder = copy_folder(lm_run / "best", tmp_path / "model", **OVERSIZED[case])
    key, value = next(iter(OVERSIZED[case].items()))
    if isinstance(value, dict):
        (name, value), = value.items()
        key = f"{key}.{name}"
    before = snapshot(tmp_path)
    assert main(COMMANDS[command](folder, tmp_path / "out")) == 2
    err = _one_line_error(capsys)
    assert f"config.json: {key}={value} is " in err
    # a size of the weights is compared with the file; max_positions (no size of them) with the config's own bound
    assert "model.safetensors" in err or case == "positions"
    assert "refused before any model was built" in err
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


# -- numbers that are no use ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--num-samples", "100000000"], rf"--num-samples=100000000 must be 1\.\.{MAX_SAMPLES:,}: the samples are "
                                     r"generated as one batch"),
    (["--seed", "-1"], r"--seed=-1 is outside 0\.\.4294967295, the seeds every random generator accepts \(as "
                       r"train\.seed\)"),
    (["--seed", "99999999999999999999"], r"--seed=99999999999999999999 is outside 0\.\.4294967295"),
])
def test_generate_refuses_numbers_no_run_could_use(lm_run, capsys, args, message):
    assert main(["generate", "--checkpoint", str(lm_run / "best"), "--max-new-tokens", "2", *args]) == 2
    assert re.search(message, _one_line_error(capsys))


@pytest.mark.parametrize("seeds, message", [
    ("0", r"--seeds=0 must be 1\.\.1,000: seeds count from 1 \(--seeds N trains every variant with the seeds "
          r"1\.\.N\)"),
    ("100000000", r"--seeds=100000000 must be 1\.\.1,000"),
    ("-1", r"--seeds=-1 must be 1\.\.1,000"),
])
def test_compare_refuses_seeds_outside_one_to_a_thousand(tmp_path, capsys, seeds, message):
    """--seeds 0 silently ran seed 1; --seeds 100000000 ended in a MemoryError."""
    assert MAX_SEEDS == 1000
    assert main(["compare", "--task", "lm", "--variants", "baseline", "--seeds", seeds, "--output",
                 str(tmp_path / "cmp")]) == 2
    assert re.search(message, _one_line_error(capsys))
    assert not (tmp_path / "cmp").exists()


# -- what is parsed: depth, integer size, length --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("value, message", [
    ("[" * 5000 + "]" * 5000, r"--set d_model=.*: nested more than 100 levels deep"),
    ("1" * 5000, r"--set d_model=.*: an integer of more than 4,300 digits"),
    (str(2 ** 70), r"--set d_model=.*: the integer 1180591620717411303424 is outside the 64-bit range"),
    ("x" * 120_000, r"d_model must be an integer, got 'xxxx"),
], ids=["deep", "digits", "64bit", "120KB"])
def test_set_values_deep_huge_or_long_give_a_short_line(tmp_path, capsys, value, message):
    assert main(["train", "sst2", "--run-dir", str(tmp_path / "run"), "--no-progress", "--set",
                 f"d_model={value}"]) == 2
    err = _one_line_error(capsys)
    assert re.search(message, err) and len(err) < 2500
    assert not (tmp_path / "run").exists()


def test_a_long_malformed_set_and_a_huge_argument_are_quoted_short(tmp_path, capsys):
    assert main(["config", "transformer_small", "--set", "x" * 120_000]) == 2
    err = _one_line_error(capsys)
    assert "--set expects key=value" in err and "characters left out" in err and len(err) < 400
    with pytest.raises(SystemExit) as code:  # argparse's own error: an int of 5,000 digits
        main(["generate", "--checkpoint", str(tmp_path), "--seed", "9" * 5000])
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed: invalid int value" in err and len(err) < 2500


@pytest.mark.slow
@pytest.mark.parametrize("suffix, text", [(".json", "[" * 5000 + "]" * 5000), (".yaml", "a: " + "[" * 5000),
                                          (".json", '{"d_model": ' + "1" * 5000 + "}")],
                         ids=["json_deep", "yaml_deep", "json_digits"])
def test_config_files_nested_deeply_or_with_huge_integers_are_refused(tmp_path, capsys, suffix, text):
    path = tmp_path / f"bad{suffix}"
    path.write_text(text)
    assert main(["config", str(path)]) == 2
    assert re.search(rf"bad{re.escape(suffix)}: (nested more than 100 levels|an integer of more than 4,300 digits)",
                     _one_line_error(capsys))


def test_messages_are_one_line_and_cut_to_two_thousand_characters():
    assert one_line("a\nb") == "a b"
    assert len(one_line("x" * 10_000)) <= 2000


# -- writes the machine refuses --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_read_only_run_directory_output_or_config_file_is_named_and_exit_2(lm_run, tmp_path, capsys):
    """Each was "internal error: OSError: [Errno 30]" (or safetensors' own error); nothing is left half-written."""
    with read_only_folder(tmp_path / "ro") as folder:
        commands = [
            ["train", "lm", "--data", str(lm_run.parent / "book.txt"), "--run-dir", str(folder / "run"),
             "--no-progress", "--set", "train.max_steps=1"],
            ["config", "transformer_small", "--output", str(folder / "cfg.json")],
            ["compare", "--task", "lm", "--variants", "baseline", "--output", str(folder / "cmp"), "--budget-steps",
             "1"],
            ["train", "lm", "--data", str(lm_run.parent / "book.txt"), "--run-dir", str(folder), "--no-progress",
             "--set", "train.max_steps=1"],
        ]
        for argv in commands:
            assert main(argv) == 2, argv
            err = _one_line_error(capsys)
            assert re.search(rf"cannot write {re.escape(str(folder))}.*: (read-only file system|permission denied)",
                             err), err
        assert os.listdir(folder) == []


@pytest.fixture(scope="module")
def language_model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    (root / "book.txt").write_text("to be or not to be, that is the question.\n" * 40)
    run = root / "run"
    assert main(["train", "lm", "--data", str(root / "book.txt"), "--run-dir", str(run), "--no-progress",
                 *set_args([*TINY_LM, "train.max_steps=1"])]) == 0
    return run / "best"


@pytest.mark.parametrize("args", [["--temperature", "nan"], ["--temperature", "inf"], ["--top-p", "nan"]])
def test_generate_refuses_non_finite_sampling_settings(language_model, capsys, args):
    with pytest.raises(SystemExit) as stopped:  # argparse's own exit for a bad argument
        main(["generate", "--checkpoint", str(language_model), *args])
    assert stopped.value.code == 2
    assert f"{args[1]} is not a finite number" in capsys.readouterr().err


@pytest.mark.parametrize("std", ["nan", "inf", "-inf"])
def test_evaluate_refuses_a_non_finite_noise_std(language_model, capsys, std):
    with pytest.raises(SystemExit) as stopped:
        main(["evaluate", "--checkpoint", str(language_model), f"--noise-std={std}"])
    assert stopped.value.code == 2 and "is not a finite number" in capsys.readouterr().err


def test_generate_refuses_a_prompt_that_is_not_utf8_and_an_unbounded_length(language_model, capsys):
    # a byte that is not UTF-8 on the command line reaches Python as a lone surrogate (surrogateescape)
    assert main(["generate", "--checkpoint", str(language_model), "--prompt", "to \udcff be"]) == 2
    assert "--prompt is not valid UTF-8 (byte 3: b'\\xff be'); give the prompt as UTF-8" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(language_model), "--max-new-tokens", "100000000"]) == 2
    assert "--max-new-tokens=100000000 is more than 100,000" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(language_model), "--max-new-tokens", "5", "--prompt", "to"]) == 0


# -- the environment, read before any command writes (issue 49) ------------------------------------------------------
@pytest.mark.parametrize("env, message", [
    ({"INTERLAYER_KERNELS": "fast"}, r"INTERLAYER_KERNELS='fast' is not a kernel mode; use one of auto, triton, "
                                     r"reference"),
    ({"RANK": "x"}, r"RANK='x' in the environment is not an integer; torchrun sets RANK, WORLD_SIZE and LOCAL_RANK"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, r"RANK=3, WORLD_SIZE=2 and LOCAL_RANK=0 in the environment are no process of "
                                       r"a group"),
    ({"INTERLAYER_KERNELS": "triton", "no triton": ""}, r"INTERLAYER_KERNELS=triton asks for the Triton kernels, but "
                                                        r"Triton is not installed"),
], ids=["kernels", "rank", "rank_outside", "triton_missing"])
@pytest.mark.parametrize("command", ["train", "generate"])
def test_environment_variables_are_checked_before_any_command_writes(lm_run, tmp_path, capsys, monkeypatch, env,
                                                                     message, command):
    """A bad INTERLAYER_KERNELS was read when the first kernel ran, after the run folder was written (and not at all
    by a command that runs none); RANK='x' was int()'s ValueError (exit 1)."""
    from interlayer.kernels import dispatch

    for key, value in env.items():
        if key == "no triton":
            monkeypatch.setattr(dispatch, "_TRITON_FOUND", False)
        else:
            monkeypatch.setenv(key, value)
    run = tmp_path / "run"
    argv = {"train": ["train", "lm", "--data", str(lm_run.parent / "book.txt"), "--run-dir", str(run),
                      "--no-progress", *set_args([*TINY_LM, "train.max_steps=1"])],
            "generate": ["generate", "--checkpoint", str(lm_run / "best"), "--max-new-tokens", "2"]}[command]
    assert main(argv) == 2
    assert re.search(message, _one_line_error(capsys))
    assert not run.exists()


# -- SIGTERM is met as Ctrl-C is, by every command (issue 49) ------------------------------------------------------
@pytest.mark.slow
def test_sigterm_during_an_export_leaves_no_staging_folder(lm_run, tmp_path):
    """The default action killed the process where it stood, leaving ``.OUT.tmp-PID`` half written beside the
    target; now the command's cleanup runs, it says so in one line and exits with 143."""
    import subprocess
    import sys

    from helpers import SRC

    code = f"""
import os, signal, sys
from interlayer.pretrained import export as module
original = module.export
def export(model, staging, **kwargs):
    report = original(model, staging, **kwargs)
    assert any(staging.iterdir())  # half a folder is there
    os.kill(os.getpid(), signal.SIGTERM)
    return report
module.export = export
from interlayer.cli import main
sys.exit(main(["export", {str(lm_run)!r}, {str(tmp_path / "out")!r}]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 143, done.stderr
    assert done.stderr == "interlayer: stopped by SIGTERM\n"
    assert list(tmp_path.iterdir()) == []
