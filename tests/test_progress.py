"""The CLI says where things went and how long (issue 31): ``train`` names its run directory and best checkpoint,
its bar counts optimiser steps against the step or time budget, test scoring shows a bar, and ``compare``
estimates the time left."""
from __future__ import annotations

import json
import re

import pytest

from helpers import TEXT
from interlayer.cli import main
from interlayer.compare.runner import overall_eta
from interlayer.training.engine import budget_steps

TINY = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ffn=32", "--set", "enc_layers=1",
        "--set", "data.block_size=16", "--set", "data.eval_interval=3", "--set", "train.max_tokens=64",
        "--set", "train.warmup_steps=1"]


def test_budget_steps_is_the_step_budget_or_where_the_time_runs_out():
    # 10 steps in 5 s, 5 s of a 12 s (0.2 min) budget used: 7 s left at 2 steps/s ends at step 10 + 14
    assert budget_steps(10, 5.0, 5.0, 0.2, 10, 250) == 24
    assert budget_steps(10, 5.0, 5.0, 0.2, 10, 20) == 20  # the step budget comes first
    assert budget_steps(0, 0.0, 0.0, 0.2, 0, 250) == 250  # nothing timed yet
    assert budget_steps(10, 5.0, 13.0, 0.2, 10, 250) == 10  # the time is up


def test_overall_eta_counts_waves_of_parallel_runs():
    assert overall_eta(5, 2, 60.0) == 180.0 and overall_eta(1, 4, 30.0) == 30.0


def test_train_names_its_directories_and_counts_steps_against_the_budget(tmp_path, capsys):
    text = tmp_path / "book.txt"
    text.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text), "--run-dir", str(run), *TINY,
                 "--set", "train.max_steps=6"]) == 0
    err = capsys.readouterr().err
    assert f"interlayer: training lm in {run}\n" in err
    assert f"interlayer: best checkpoint: {run / 'best'}; results: {run / 'results.json'}" in err
    totals = {int(total) for total in re.findall(r"\| *\d+/(\d+) \[[^]]*(?:step/s|s/step)", err)}
    assert totals == {6}  # two epochs of 3 steps: one bar of the run's 6 steps, not one per epoch
    assert "scoring test" in err


@pytest.mark.slow
def test_the_bar_under_a_time_budget_ends_where_the_time_does(tmp_path, capsys):
    text = tmp_path / "book.txt"
    text.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text), "--run-dir", str(run), *TINY, "--max-minutes", "0.02",
                 "--set", "train.max_epochs=100000"]) == 0
    err = capsys.readouterr().err
    totals = [int(total) for total in re.findall(r"\| *\d+/(\d+) \[[^]]*(?:step/s|s/step)", err)]
    steps = json.loads((run / "results.json").read_text())["steps"]
    assert steps > 6  # several epochs: a bar per epoch (3 steps) cannot pass what follows
    # the last total is where the time ran out (the pace varies a little), not max_epochs x 3 steps
    assert steps / 2 <= totals[-1] <= 2 * steps
