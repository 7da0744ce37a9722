"""experiment.py: one run from the command line to its folder. A budget that ends before the first epoch still
scores, averages what exists and resumes; a refused run leaves no folder behind; a resumed run's stored settings
and a divergence at the last step or in the test scores are checked before anything is written. Everything calls
``cli.main`` in-process with tiny models; docs/reliability.md lists each case with its test."""
import json
import re

import pytest

from helpers import set_args
from helpers.tiny_runs import TINY_IMAGE, TINY_LM, TINY_TEXT, TINY_VQA, translation_args
from interlayer.cli import main


# -- a budget that ends before the first epoch ------------------------------------------------------------------
@pytest.mark.parametrize("budget", [["train.max_steps=3"], ["train.max_minutes=1e-9"]], ids=["steps", "minutes"])
def test_translation_whose_budget_ends_before_the_first_epoch_scores_and_resumes(corpus, tmp_path, budget):
    """The issue's case: averaging 5 epoch checkpoints when none was written crashed after training."""
    run = tmp_path / "run"
    assert main(translation_args(corpus, run, "train.average_last=5", *budget)) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["model"] == "best" and results["epochs"] == 0
    assert results["averaged"].startswith("none: train.average_last=5, but the run ended in epoch 1")
    assert not (run / "averaged").exists()
    assert main(["train", "translation", "--run-dir", str(run), "--no-progress", "--beam", "1", "--resume"]) == 0


def test_averaging_uses_the_epoch_checkpoints_that_exist_and_says_so(corpus, tmp_path):
    run = tmp_path / "run"
    assert main(translation_args(corpus, run, "train.max_epochs=1", "train.keep_last=5",
                                  "train.average_last=5")) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["averaged"] == ("averaged/ is the mean of checkpoint1.safetensors (fewer than "
                                   "train.average_last=5: the run wrote no more)")
    assert set(results["valid_bleu"]) == {"best", "averaged"}


# Each task's shortest budget: a budget used up before the first optimiser step (nothing trained: the initial model
# is validated, saved as best/ and scored), and one step.
@pytest.mark.slow
@pytest.mark.parametrize("task, extra", [
    ("sst2", TINY_TEXT), ("cora", ["hidden=4", "heads=2"]), ("lm", TINY_LM),
    ("fashion_mnist", TINY_IMAGE), ("vqa", TINY_VQA)])
@pytest.mark.parametrize("budget", ["train.max_minutes=1e-9", "train.max_steps=1"])
def test_every_task_finishes_its_shortest_budget(tmp_path, task, extra, budget):
    run = tmp_path / "run"
    data = []
    if task == "lm":  # the bundled Shakespeare takes 20 s to score
        (tmp_path / "book.txt").write_text("to be or not to be, that is the question.\n" * 40)
        data = ["--data", str(tmp_path / "book.txt")]
    assert main(["train", task, "--run-dir", str(run), "--no-progress", *data, *set_args([*extra, budget])]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished" and results["steps"] == (1 if "steps" in budget else 0)
    assert (run / "best" / "config.json").is_file()


# -- a refused run leaves no directory ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("task, sets, message", [
    ("sst2", ["--seed", "-1"], r"train\.seed=-1 is outside 0\.\.4294967295"),
    ("sst2", ["--set", "train.update_freq=1000000"],
     r"the first epoch has \d+ training batches, fewer than one optimiser step needs \(train\.update_freq=1000000"),
    ("sst2", ["--set", "train.threads=100000"], r"train\.threads=100000 is more than this machine's \d+ CPU cores"),
    ("vqa", ["--set", "image_size=5"], r"image_size=5: Sort-of-CLEVR's pictures are 3 x 75 x 75 pixels"),
    ("vqa", ["--set", "data.release_seed=-1"], r"data\.release_seed=-1 must not be negative"),
    # fewer ids or classes than the data (issue 49: the loss read past its rows, or an embedding past its table)
    ("sst2", ["--set", "src_vocab_size=5"], r"src_vocab_size=5 is smaller than the \d+ the data holds \(the task "
                                            r"sets it from its data\): ids 5\.\.\d+ would index past"),
    ("vqa", ["--set", "num_answers=2"], r"num_answers=2 is smaller than the \d+ the data holds"),
])
def test_a_refused_run_leaves_no_directory_and_the_fixed_command_runs(tmp_path, capsys, task, sets, message):
    run = tmp_path / "run"
    tiny = TINY_VQA if task == "vqa" else TINY_TEXT
    base = ["train", task, "--run-dir", str(run), "--no-progress", *set_args([*tiny, "train.max_steps=1"])]
    assert main(base + sets) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not run.exists()
    assert main(base) == 0  # the corrected command is not refused as "already holds a run"


def test_a_too_long_validation_line_leaves_no_directory(corpus, tmp_path, capsys):
    lines = (corpus / "valid.de").read_text().splitlines()
    lines[2] = " ".join(["hund"] * 700)
    (tmp_path / "valid.de").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    args = translation_args(corpus, run, "max_positions=64", "train.max_steps=1")
    args[args.index(str(corpus / "valid.de"))] = str(tmp_path / "valid.de")
    assert main(args) == 2
    assert re.search(r"valid\.de:3: the valid source sentence has \d+ tokens", capsys.readouterr().err)
    assert not run.exists()


def test_a_run_dir_below_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert main(["train", "sst2", "--run-dir", str(tmp_path / "afile" / "sub"), "--no-progress"]) == 2
    assert f"{tmp_path / 'afile'} is a file, not a folder; choose another --run-dir" in capsys.readouterr().err


def test_a_run_json_edited_to_ten_million_layers_is_refused_on_resume_before_building(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(translation_args(corpus, run, "train.max_steps=1", "train.average_last=0")) == 0
    record = json.loads((run / "run.json").read_text())
    record["model"]["enc_layers"] = 10_000_000
    (run / "run.json").write_text(json.dumps(record))
    assert main(["train", "translation", "--run-dir", str(run), "--no-progress", "--resume"]) == 2
    assert re.search(rf"{re.escape(str(run / 'run.json'))} describes another model than .*checkpoint_last\.safetensors "
                     r"holds: enc_layers 10000000 \(checkpoint: 1\)", capsys.readouterr().err)


# -- inputs and scores checked -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_last_step_that_diverges_stops_the_run_at_the_non_finite_validation(tmp_path, capsys):
    run = tmp_path / "run"
    sets = [*TINY_TEXT, "train.lr=1e30", "train.warmup_steps=0", "train.schedule=constant", "train.max_steps=1"]
    assert main(["train", "sst2", "--run-dir", str(run), "--no-progress", *set_args(sets)]) == 3
    assert re.search(r"training diverged at step 1: the validation scores are not finite \(nll nan",
                     capsys.readouterr().err)
    assert not (run / "results.json").exists()


def test_non_finite_test_scores_stop_the_run_without_results(tmp_path, capsys, monkeypatch):
    from interlayer.tasks.text_classification import TextClassificationSpec

    finish = TextClassificationSpec.finish
    monkeypatch.setattr(TextClassificationSpec, "finish",
                        lambda *args: {**finish(*args), "test_accuracy": float("nan")})
    run = tmp_path / "run"
    assert main(["train", "sst2", "--run-dir", str(run), "--no-progress", *set_args([*TINY_TEXT,
                                                                                   "train.max_steps=1"])]) == 3
    assert "are not finite (test_accuracy nan); no results.json is written" in capsys.readouterr().err
    assert not (run / "results.json").exists()


def test_two_processes_on_a_one_batch_graph_are_refused_before_the_run_is_written(monkeypatch, tmp_path):
    """`torchrun --nproc-per-node 2 ... train cora`: Cora's epoch is one batch, a step of 2 processes needs 2
    (it was "internal error: ValueError" after run.json was written). The check reads the world size."""
    from interlayer import experiment
    from interlayer.core.config import ConfigError
    from interlayer.tasks import task_specs
    from interlayer.training.distributed import DistEnv

    monkeypatch.setattr(experiment.distributed, "environment", lambda: DistEnv(rank=0, world_size=2, local_rank=0))
    with pytest.raises(ConfigError, match=r"the first epoch has 1 training batches, fewer than one optimiser step "
                                          r"needs \(train\.update_freq=1 x 2 process\(es\) = 2\)"):
        experiment._resolve_new(experiment._RunRequest(task_specs()["cora"], tmp_path / "run", experiment._Sets(),
                                                       experiment._Sets()))


# -- one run request ----------------------------------------------------------------------------------------------
def test_no_private_function_of_the_experiment_takes_more_than_six_parameters():
    """The steps of a run read one frozen request (``_RunRequest``) instead of relaying its values: ``_train`` took
    14 parameters, ``_prepare`` 12."""
    import dataclasses
    import inspect

    from interlayer import experiment

    functions = {name: value for name, value in vars(experiment).items()
                 if inspect.isfunction(value) and name.startswith("_") and value.__module__ == experiment.__name__}
    for cls in (value for value in vars(experiment).values()
                if inspect.isclass(value) and value.__module__ == experiment.__name__):
        functions.update({f"{cls.__name__}.{name}": getattr(member, "__func__", member)
                          for name, member in vars(cls).items() if not name.startswith("__")
                          and inspect.isfunction(getattr(member, "__func__", member))})
    counts = {name: len(inspect.signature(function).parameters) for name, function in functions.items()}
    assert {name: n for name, n in counts.items() if n > 6} == {}
    assert {"_train", "_prepare", "_load_run", "_resumed_settings", "_RunRequest.settings"} <= set(functions)
    assert dataclasses.fields(experiment._RunRequest) and experiment._RunRequest.__dataclass_params__.frozen


def test_each_set_value_is_parsed_once_per_run_fresh_or_resumed(tmp_path, monkeypatch):
    """A run splits its ``--set`` values once: they were parsed again only to be compared across the ranks of a
    distributed run, and again on resume."""
    from interlayer import experiment

    parsed: list[str] = []
    parse = experiment.parse_value
    monkeypatch.setattr(experiment, "parse_value", lambda value, what: parsed.append(what) or parse(value, what))
    run = tmp_path / "run"
    args = ["train", "sst2", "--run-dir", str(run), "--no-progress", *set_args([*TINY_TEXT, "train.max_steps=1"])]
    assert main(args) == 0
    given = [f"--set {pair.partition('=')[0]}" for pair in [*TINY_TEXT, "train.max_steps=1"]]
    assert sorted(parsed) == sorted(given)
    parsed.clear()
    assert main([*args, "--resume"]) == 0  # the same values again: no change, the finished run stays as it was
    assert sorted(parsed) == sorted(given)
