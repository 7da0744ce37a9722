"""`interlayer compare`: variant parsing and errors, the seed statistics, a real 2 x 2 comparison in subprocesses
that is interrupted and continued, refusing a changed directory, and every figure rendered as a real PNG."""
import ast
import inspect
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from helpers import set_args
from helpers.compare import compare_sets, faked_comparison
from helpers.processes import cli_process, gone, lock_owner, wait_for
from interlayer import get_config, list_models
from interlayer.cli import main
from interlayer.compare import (
    DEFAULT,
    MAIN_JOB_SEEDS,
    MAIN_JOB_STEPS,
    MAIN_JOB_VALIDATIONS,
    build_plan,
    make_settings,
    plots,
)
from interlayer.compare.environment import comparison_environment
from interlayer.compare.plan import Plan, prepare_directory
from interlayer.compare.records import summarize
from interlayer.compare.report import md_code, still_falling, write_report
from interlayer.compare.runner import Runner, run_state
from interlayer.compare.selection import check_selections, choice_lines, choose, parse_selections
from interlayer.compare.variants import NAMED_VARIANTS, parse_variants, split_entries
from interlayer.core.config import ConfigError
from interlayer.errors import DataError, VariantError
from interlayer.methods.base import VariantContext
from interlayer.models import registry
from interlayer.papers import task_settings
from interlayer.tasks import task_specs
from interlayer.training.concurrency import threads_per_run
from interlayer.training.engine import LAST


def _cli_sets(corpus, extra=()):
    return [arg for key, value in compare_sets(corpus, extra).items() for arg in ("--set", f"{key}={value}")]


# -- variants ------------------------------------------------------------------------------------------------
def test_entries_split_on_top_level_commas_and_adhoc_variants_parse():
    assert split_entries("baseline, pa,x=crossformer_sg+crossformer.soft=[kq,ffn]") == [
        "baseline", "pa", "x=crossformer_sg+crossformer.soft=[kq,ffn]"]
    variants, baseline = parse_variants(["baseline,pa", "sg=crossformer_sg+crossformer.alpha=0.1+train.lr=1e-3",
                                         "big=transformer_small+d_model=64"], "transformer_multi30k", "pa")
    assert baseline == "pa"
    sg, big = variants[2], variants[3]
    assert (sg.named, sg.preset, sg.sets) == ("crossformer_sg", "transformer_multi30k",
                                              {"crossformer.alpha": 0.1, "train.lr": 0.001})
    assert (big.named, big.preset, big.sets) == (None, "transformer_small", {"d_model": 64})
    assert set(NAMED_VARIANTS).isdisjoint(list_models())  # a name means one thing


@pytest.mark.parametrize("entries, baseline, message", [
    (["pa,pa"], None, r"appear more than once"),
    (["pa+predictive.alpha=0.5"], None, r"need a name, as in NAME=pa\+"),
    (["x/y=pa"], None, r"must be letters, digits"),
    (["x=pa+data.vocab_size=10"], None, r"same data"),
    (["x=pa+train.seed=3"], None, r"seeds and the time budget are shared"),
    (["missing.yaml"], None, r"config file not found"),
    (["baseline,pa"], "mpt", r"--baseline 'mpt' is not one of"),
    ([""], None, r"--variants is empty"),
])
def test_bad_variant_entries_are_refused_with_the_reason(entries, baseline, message):
    with pytest.raises(VariantError, match=message):
        parse_variants(entries, "transformer_multi30k", baseline)


def test_global_set_of_a_method_section_is_refused():
    with pytest.raises(VariantError, match=r"--set predictive.alpha=\.\.\. would turn the predictive method on in "
                                           r"every variant.*mine=baseline\+predictive.alpha=0.5"):
        make_settings("translation", ["baseline,pa"], sets={"predictive.alpha": "0.5"})


def test_named_variants_are_computed_against_the_task_model(corpus):
    settings = make_settings("translation", ["baseline,mpt_hard,pa,crossformer_kq,lw_1x"],
                             sets=compare_sets(corpus, ["enc_layers=3"]))
    plan = build_plan(settings)
    models = {v.variant.name: v.model for v in plan.variants}
    assert models["baseline"]["multipass"] is None and models["baseline"]["predictive"] is None
    assert models["mpt_hard"]["multipass"]["permutation"] == [0, 2, 1]
    assert models["pa"]["predictive"]["alpha"] == 0.1 and models["pa"]["predictive"]["conv_layers"] == 1
    assert models["crossformer_kq"]["crossformer"]["hard"] == ["kq"]
    params = {v.variant.name: v.parameters for v in plan.variants}
    assert params["crossformer_kq"] < params["baseline"] < params["pa"] and params["lw_1x"] < params["baseline"]
    assert plan.variant("mpt_hard").madds > plan.variant("baseline").madds  # two encoder passes
    assert plan.variant("baseline").lengths[0] > 2  # mean training lengths, not a constant
    base = get_config("transformer_text_cls").to_dict()
    sick = VariantContext("sick", "transformer_text_cls", base, task_settings=task_settings("sick"))
    assert NAMED_VARIANTS["pa"].overrides(sick)["predictive.alpha"] == 0.5  # the paper's SNLI alpha (papers/)
    assert NAMED_VARIANTS["pa_res"].overrides(sick) == {"predictive.alpha": 0.5, "predictive.conv_layers": 0}
    assert "predictive.alpha" not in NAMED_VARIANTS["pa"].overrides(VariantContext(
        "sst5", "transformer_text_cls", base, task_settings=task_settings("sst5")))
    gat = VariantContext("cora", "gat_cora", {"model_type": "gat", "crossformer": None},
                         registry.family("gat").method_slots)
    assert NAMED_VARIANTS["crossformer_kq"].overrides(gat) == {"crossformer": "kq"}
    with pytest.raises(VariantError, match="the PA variants add a method section to a Transformer, but task 'cora' "
                                           "trains a gat model"):
        NAMED_VARIANTS["pa"].overrides(gat)


def test_no_method_module_names_a_task():
    """What a paper sets for one dataset (PA's alpha on SICK) lives with the papers' presets
    (``papers.task_settings``), not in the method's variants: no string in methods/ is a task's name."""
    names = set(task_specs())
    methods = Path(inspect.getfile(VariantContext)).parent  # src/interlayer/methods
    found = {path.name: sorted(strings & names) for path in methods.glob("*.py")
             if (strings := {node.value for node in ast.walk(ast.parse(path.read_text()))
                             if isinstance(node, ast.Constant) and isinstance(node.value, str)}) & names}
    assert found == {}


def test_a_variant_that_cannot_apply_fails_before_training(corpus, tmp_path, capsys):
    code = main(["compare", "--task", "translation", "--variants", "baseline,pa,nonsense_preset", "--output",
                 str(tmp_path / "c"), *_cli_sets(corpus)])
    assert code == 2
    assert "variant 'nonsense_preset' (nonsense_preset) cannot apply to task 'translation': unknown preset" \
           in capsys.readouterr().err
    settings = make_settings("translation", ["baseline,pa"], sets=compare_sets(corpus, ["enc_layers=1"]))
    with pytest.raises(VariantError, match="variant 'pa'.*predictive needs enc_layers >= 2"):
        build_plan(settings)
    settings = make_settings("translation", ["baseline,mpt_hard"], sets=compare_sets(corpus))
    with pytest.raises(VariantError, match="mpt_hard at enc_layers=2 would be the default connection"):
        build_plan(settings)
    assert not (tmp_path / "c").exists()


def test_settings_that_need_the_budget_are_checked_with_it(corpus):
    """``train.anneal_to_budget`` is valid only beside a time budget, which the comparison gives every run: the plan
    checks the settings with ``--budget-minutes`` in place, as the runs will have it."""
    annealed = ["train.schedule=linear", "train.anneal_to_budget=true"]
    plan = build_plan(make_settings("translation", ["baseline,pa"], budget_minutes=1.0,
                                    sets=compare_sets(corpus, annealed)))
    assert "train.max_minutes" not in plan.variant("pa").sets  # the budget reaches the runs as their max_minutes
    variant = "pa=pa+train.schedule=linear+train.anneal_to_budget=true"
    assert build_plan(make_settings("translation", ["baseline", variant], budget_minutes=1.0,
                                    sets=compare_sets(corpus)))
    with pytest.raises(ConfigError, match="train.max_minutes is 0"):
        build_plan(make_settings("translation", ["baseline,pa"], sets=compare_sets(corpus, annealed)))
    with pytest.raises(VariantError, match="variant 'pa'.*train.max_minutes is 0"):
        build_plan(make_settings("translation", ["baseline", variant], sets=compare_sets(corpus)))


def test_preset_flag_is_the_base_of_the_named_variants(corpus):
    plan = build_plan(make_settings("translation", ["baseline,pa"], preset="transformer_small",
                                    sets=compare_sets(corpus)))
    assert [v.variant.preset for v in plan.variants] == ["transformer_small"] * 2
    assert plan.variant("pa").model["dropout"] == 0.1  # transformer_small's; the task default has 0.3
    assert build_plan(make_settings("translation", ["pa"],
                                    sets=compare_sets(corpus))).variants[0].model["dropout"] == 0.3


def test_cli_default_and_list_variants(monkeypatch, capsys):
    import interlayer.compare

    seen = {}

    def fake_run(settings, output, *, command, jobs, selections, margin, launcher, effect):
        seen.update(settings=settings, output=output, command=command, jobs=jobs, selections=selections,
                    margin=margin, launcher=launcher, effect=effect)
        return type("Result", (), {"interrupted": False, "failed": []})()

    monkeypatch.setattr(interlayer.compare, "run_compare", fake_run)
    assert main(["compare", "--default", "--seeds", "2"]) == 0
    settings = seen["settings"]
    assert (settings.task, settings.variants, settings.seeds, settings.budget_minutes) == (
        "lm", ["baseline", "pa", "crossformer_kq", "crossformer_sg", "lw_1x"], [1, 2], None)
    assert settings.sets["train.max_steps"] == str(MAIN_JOB_STEPS)
    assert int(settings.sets["data.eval_interval"]) * MAIN_JOB_VALIDATIONS == MAIN_JOB_STEPS
    assert settings.sets["train.threads"] == "1"  # the same numbers whatever --jobs and the cores
    assert seen["output"] == Path("runs/compare/lm") and seen["command"][:2] == ["interlayer", "compare"]
    assert seen["jobs"] == 2 and seen["selections"] == [] and seen["margin"] is None and seen["launcher"] is None
    assert main(["compare", "--default", "--margin", "0.02"]) == 0 and seen["margin"] == 0.02
    assert seen["effect"] is None
    assert main(["compare", "--default", "--effect", "0.05"]) == 0 and seen["effect"] == 0.05
    capsys.readouterr()
    with pytest.raises(SystemExit):  # the help states the default budget the code uses
        main(["compare", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{DEFAULT['seeds']} seeds, {DEFAULT['budget_steps']} steps each, {DEFAULT['jobs']} jobs" in help_text
    # true to the defaults: the budget is steps, minutes or epochs (not "the same time budget"); local launcher
    assert "time budget" not in help_text and "under the same budget (--budget-steps optimiser steps" in help_text
    assert "local: processes on this machine (default)" in help_text and "GPUs per run (default 1;" in help_text
    assert main(["compare", "--default", "--budget-minutes", "2", "--jobs", "1"]) == 0
    assert seen["settings"].budget_minutes == 2 and "train.max_steps" not in seen["settings"].sets
    assert seen["jobs"] == 1
    assert main(["compare", "--task", "sst5", "--variants", "baseline", "--budget-steps", "7"]) == 0
    assert seen["settings"].sets == {"train.max_steps": "7"}
    assert main(["compare", "--task", "sst5", "--variants", "baseline", "--budget-steps", "7", "--set",
                 "train.max_steps=8"]) == 2
    assert "disagree" in capsys.readouterr().err
    assert main(["compare", "--default", "--select", "pa=pa,mpt_soft"]) == 0
    assert [(s.group, s.candidates) for s in seen["selections"]] == [("pa", ("pa", "mpt_soft"))]
    assert main(["compare", "--task", "sst5"]) == 2
    assert "compare needs --variants" in capsys.readouterr().err
    assert main(["compare", "--list-variants"]) == 0
    listing = capsys.readouterr().out
    assert all(f"| {name} " in listing for name in NAMED_VARIANTS)


def test_run_state_decides_skip_resume_or_restart(tmp_path):
    run = tmp_path / "run"
    assert run_state(run) == "new"
    run.mkdir()
    (run / "run.json").write_text("{}")
    assert run_state(run) == "stale"  # stopped before its first checkpoint: nothing to resume
    (run / LAST).write_bytes(b"")
    assert run_state(run) == "resumable"
    (run / "results.json").write_text("{}")
    assert run_state(run) == "finished"


def test_compare_starts_a_run_killed_before_its_first_checkpoint_over_without_deleting_it(tmp_path):
    run = tmp_path / "runs" / "v-s1"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "train.csv").write_text("step,loss\n1,5.0\n")
    started = []

    class FakeProcess:
        def __init__(self, target, args, name):
            started.append(args[0])
            self.sentinel = 0

        def start(self):
            pass

    runner = Runner.__new__(Runner)  # only what _start reads
    runner.plan = SimpleNamespace(settings=SimpleNamespace(budget_minutes=None), spec=SimpleNamespace(name="t"))
    runner.output, runner.threads, runner.echo = tmp_path, None, lambda line: None
    runner.context = SimpleNamespace(Process=FakeProcess)
    runner._start("[1/1] v seed 1", SimpleNamespace(variant=SimpleNamespace(name="v", preset="p"), sets={}), 1)
    assert started[0]["resume"] is True  # experiment.train starts it over, under the run's lock
    assert (run / "train.csv").is_file()  # compare itself deletes nothing


def test_default_comparison_applies_to_its_bundled_task():
    from interlayer.cli.args import parse_sets

    settings = make_settings(DEFAULT["task"], DEFAULT["variants"], seeds=DEFAULT["seeds"],
                             budget_minutes=DEFAULT["budget_minutes"], budget_steps=DEFAULT["budget_steps"],
                             sets=parse_sets(DEFAULT["sets"]))
    plan = build_plan(settings)
    assert [v.variant.name for v in plan.variants] == ["baseline", "pa", "crossformer_kq", "crossformer_sg", "lw_1x"]
    assert plan.task.metric == "loss" and not plan.task.higher_is_better and len(plan.runs()) == 5 * MAIN_JOB_SEEDS
    assert plan.task.units == "tokens" and plan.variant("baseline").lengths == [64]
    models = {v.variant.name: v.model for v in plan.variants}
    assert all(m["arch"] == "causal_lm" and m["d_model"] == 64 and m["max_positions"] == 64 for m in models.values())
    assert models["pa"]["predictive"]["conv_layers"] == 1
    assert models["crossformer_sg"]["crossformer"]["soft"] == ["kq", "vf", "ffn"]
    sizes = {v.variant.name: v.parameters for v in plan.variants}
    assert sizes["lw_1x"] < sizes["crossformer_kq"] < sizes["baseline"] == sizes["crossformer_sg"]


# -- a real comparison: 2 variants x 2 seeds, interrupted in the last run, then continued --------------------
def _run_processes():
    """This process's grandchildren: the runs, forked by the multiprocessing forkserver (our child)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    return [g for c in children.get(os.getpid(), []) for g in children.get(c, [])]


def _interrupt_when(path, events):
    """Freeze the run process once ``path`` exists (it is then inside the training loop), queue a SIGINT for it
    (as a terminal's Ctrl-C does) and a SIGTERM for this process (as ``kill PID`` does), and let it go on. The run
    must have steps left after its first save for this to land mid-training; the caller gives it enough to outlast
    a slow poll on a loaded machine."""
    deadline = time.time() + 600  # generous: on a loaded machine each tiny run can take a minute
    while not path.exists() and time.time() < deadline:
        time.sleep(0.02)
    runs = _run_processes()
    if len(runs) != 1:
        events.append(f"{len(runs)} run processes")
        return
    child = runs[0]
    os.kill(child, signal.SIGSTOP)
    os.kill(child, signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    os.kill(child, signal.SIGCONT)
    events.append("interrupted")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run process through /proc")
def test_two_by_two_comparison_is_interrupted_and_continued(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    # max_steps ends each run after a few steps; the budget is the comparison's, too large to matter here. pa runs
    # 40 steps, so that on a loaded machine it is still training when the watcher stops it after its first save
    args = ["compare", "--task", "translation", "--variants", "baseline,pa=pa+train.max_steps=40", "--seeds", "2",
            "--budget-minutes", "1", "--output", str(out), *_cli_sets(corpus, ["train.max_steps=6"])]
    events = []
    watcher = threading.Thread(target=_interrupt_when, args=(out / "runs/pa-s2" / LAST, events))
    watcher.start()
    assert main(args) == 143  # interrupted by SIGTERM: 128 + 15 (it was 130, as for Ctrl-C)
    watcher.join()
    assert events == ["interrupted"]
    first = capsys.readouterr().out
    finished = ["baseline-s1", "pa-s1", "baseline-s2"]
    for name in finished:
        assert (out / "runs" / name / "results.json").is_file()
    assert (out / "runs/pa-s2" / LAST).is_file() and not (out / "runs/pa-s2/results.json").exists()
    assert "pa seed 2: interrupted" in first and "PARTIAL" in first
    assert "**Partial report**: 1 run(s) not finished (pa-s2)" in (out / "report.md").read_text()
    stamps = {name: (out / "runs" / name / "results.json").stat().st_mtime_ns for name in finished}

    assert main(args) == 0
    second = capsys.readouterr().out
    assert second.count("finished earlier, skipped") == 3 and "pa seed 2: resuming" in second
    assert {name: (out / "runs" / name / "results.json").stat().st_mtime_ns for name in finished} == stamps
    assert json.loads((out / "runs/pa-s2/run.json").read_text())["train"]["max_minutes"] == 1.0  # the budget
    results = json.loads((out / "runs/pa-s2/results.json").read_text())
    assert results["status"] == "finished" and results["peak_rss_growth_mb"] > 0
    memory = json.loads((out / "runs/pa-s2/compare_memory.json").read_text())
    assert [m["status"] for m in memory] == ["interrupted", "finished"]
    compare = json.loads((out / "compare.json").read_text())
    assert len(compare["invocations"]) == 2 and compare["settings"]["seeds"] == [1, 2]
    table = second[second.index("| variant"):]
    assert re.search(r"\| pa +\| [\d.]+k +\| .* \| 2/2 +\|", table) and "(n=2)" in table
    assert "PARTIAL" not in second and "Partial" not in (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"]["pa"]["finished_runs"] == 2 and len(summary["variants"]["pa"]["test"]) == 2


@pytest.mark.parametrize("stopped, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (None, 130)])
def test_an_interrupted_compare_exits_128_plus_its_signal(monkeypatch, stopped, code):
    """Ctrl-C 130, ``kill PID`` 143, as the docs say (both were 130); the real signal is in the test above."""
    import interlayer.compare as compare

    monkeypatch.setattr(compare, "run_compare", lambda *a, **k: SimpleNamespace(interrupted=True, signal=stopped))
    assert main(["compare", "--task", "lm", "--variants", "baseline", "--output", "unused"]) == code


@pytest.mark.slow
def test_killing_compare_leaves_no_orphan_and_a_second_compare_is_refused(corpus, tmp_path, capsys):
    args = ["compare", "--task", "translation", "--variants", "baseline", "--output", str(tmp_path / "cmp"),
            *_cli_sets(corpus, ["enc_layers=1", "dec_layers=1", "train.max_epochs=1000"])]
    parent = cli_process(args, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmp_path / "cmp" / "runs" / "baseline-s1"
    try:
        wait_for(lambda: (run / "train.csv").is_file() and lock_owner(run), 90, "the run to train")
        child = lock_owner(run)["pid"]
        assert lock_owner(tmp_path / "cmp")["pid"] == parent.pid
        assert main(args) == 2  # a second comparison on the same directory
        assert f"pid {parent.pid} on host" in capsys.readouterr().err
        assert main(["train", "translation", "--run-dir", str(run), "--resume"]) == 2  # a writer beside the run
        assert f"pid {child} on host" in capsys.readouterr().err
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_for(lambda: gone(child), 15, f"run process {child} to end after compare was killed")
    finally:
        parent.kill()
        parent.wait()
    size = (run / "train.csv").stat().st_size
    time.sleep(0.5)
    assert (run / "train.csv").stat().st_size == size  # nobody writes any more
    assert (run / LAST).is_file()  # the run saved on its way out (SIGTERM): resumable
    assert lock_owner(run) == {}  # and released its lock cleanly


@pytest.mark.slow
def test_jobs_train_runs_at_once_each_with_its_share_of_the_cores(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--task", "translation", "--variants", "baseline,pa", "--jobs", "2", "--output", str(out),
            *_cli_sets(corpus, ["train.max_steps=4"])]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("| variant"))
    assert "| test bleu " in header and "| test chrf " in header  # the task's secondary metric beside BLEU
    summary = json.loads((out / "summary.json").read_text())["variants"]["pa"]
    assert len(summary["test_chrf"]) == 1 and 0 <= summary["test_chrf"][0] <= 100
    started = [i for i, line in enumerate(lines) if ": training" in line]
    ended = [i for i, line in enumerate(lines) if ": finished in" in line]
    assert len(started) == len(ended) == 2 and max(started) < min(ended)  # the second began before the first ended
    assert any(line.startswith("compare: 1/2 runs done; about ") for line in lines)  # the time left, overall
    threads = threads_per_run(2)
    assert all(f"{threads} thread(s)" in lines[i] for i in started)
    for name in ("baseline-s1", "pa-s1"):
        assert json.loads((out / "runs" / name / "results.json").read_text())["status"] == "finished"
    assert main([*args[:5], "--jobs", "0", *args[7:]]) == 2
    assert "--jobs=0 must be at least 1" in capsys.readouterr().err


def test_a_directory_made_with_other_settings_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    settings = make_settings("translation", ["baseline,pa"], seeds=2, budget_minutes=0.5, sets=compare_sets(corpus))
    prepare_directory(build_plan(settings), out, ["interlayer", "compare", "original"])
    code = main(["compare", "--task", "translation", "--variants", "baseline,pa=pa+predictive.alpha=0.3,pa_res",
                 "--seeds", "1", "--budget-minutes", "1", "--output", str(out), *_cli_sets(corpus)])
    assert code == 2
    err = capsys.readouterr().err
    assert "holds a comparison with different settings" in err and "interlayer compare original" in err
    assert "settings.budget_minutes: was 0.5, now 1.0" in err
    assert "settings.seeds: was [1, 2], now [1] (seeds [2] would be dropped" in err
    assert "(pa would be dropped; a comparison may gain variants but not lose them)" in err
    assert "models.pa.model.predictive.alpha: was 0.1, now 0.3" in err  # a kept name whose model changed
    assert "models.pa_res" not in err  # a new variant is growth, not a difference
    assert not (out / "runs").exists()


def test_a_comparison_may_grow_by_seeds_and_variants(corpus, tmp_path):
    """More seeds or more variants continue the directory (finished runs stay valid); the growth is recorded."""
    out = tmp_path / "cmp"
    small = make_settings("translation", ["baseline,pa"], seeds=1, budget_minutes=0.5, sets=compare_sets(corpus))
    assert prepare_directory(build_plan(small), out, ["interlayer", "compare", "small"]) is False
    grown = make_settings("translation", ["baseline,pa,pa_res"], seeds=3, budget_minutes=0.5, sets=compare_sets(corpus))
    assert prepare_directory(build_plan(grown), out, ["interlayer", "compare", "grown"]) is True
    stored = json.loads((out / "compare.json").read_text())
    assert stored["settings"]["seeds"] == [1, 2, 3]
    assert stored["settings"]["variants"] == ["baseline", "pa", "pa_res"]
    assert set(stored["models"]) == {"baseline", "pa", "pa_res"}
    assert [v["variant"]["name"] for v in stored["variants"]] == ["baseline", "pa", "pa_res"]
    first, second = stored["invocations"]
    assert "grew" not in first and "settings.seeds: was [1], now [1, 2, 3]" in second["grew"]
    assert any(line.startswith("models.pa_res") for line in second["grew"])
    assert prepare_directory(build_plan(grown), out, ["interlayer", "compare", "again"]) is True
    assert "grew" not in json.loads((out / "compare.json").read_text())["invocations"][-1]


def test_compile_as_a_flag_or_as_text_is_one_setting(corpus, tmp_path):
    """``--compile`` gives ``train.compile=True``; a directory whose compare.json recorded it as text (``--set
    train.compile=true``, or the flag before it was a boolean) continues with the flag, and the other way round."""
    out = tmp_path / "cmp"
    as_text = make_settings("translation", ["baseline"], budget_minutes=0.5,
                            sets={**compare_sets(corpus), "train.compile": "true"})
    as_flag = make_settings("translation", ["baseline"], budget_minutes=0.5,
                            sets={**compare_sets(corpus), "train.compile": True})
    assert prepare_directory(build_plan(as_text), out, ["interlayer", "compare"]) is False
    assert prepare_directory(build_plan(as_flag), out, ["interlayer", "compare", "--compile"]) is True
    other = make_settings("translation", ["baseline"], budget_minutes=0.5,
                          sets={**compare_sets(corpus), "train.compile": "false"})
    with pytest.raises(ConfigError, match="train.compile: was true, now false"):
        prepare_directory(build_plan(other), out, ["interlayer", "compare"])


# -- the figures -------------------------------------------------------------------------------------------------
def _check_png(picture):
    image = Image.open(picture.path)
    image.load()
    assert image.format == "PNG" and image.size == picture.size
    pixels = np.asarray(image.convert("RGB"), dtype=np.int64)
    assert pixels.std() > 10, f"{picture.path.name} looks blank"
    colours = np.unique(pixels[..., 0] << 16 | pixels[..., 1] << 8 | pixels[..., 2])
    assert len(colours) > 50, f"{picture.path.name} has almost no content"


@pytest.mark.slow
def test_every_figure_is_a_real_png_and_the_html_is_self_contained(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa,mpt_soft,crossformer_sg")
    drawn_maps, colour_bars = [], []
    attention_maps, colorbar = plots.attention_maps, Figure.colorbar
    monkeypatch.setattr(plots, "attention_maps", lambda rows, *a, **k: drawn_maps.append(rows) or attention_maps(
        rows, *a, **k))
    monkeypatch.setattr(Figure, "colorbar", lambda self, *a, **k: colour_bars.append(k.get("label")) or colorbar(
        self, *a, **k))
    report = write_report(plan, out, ["interlayer", "compare", "..."])
    # the PA maps: the baseline's column is "baseline", not "baseline (baseline)"; every map has its colour bar
    (row_label, maps), = drawn_maps[0]
    assert [title for title, _ in maps] == ["baseline", "PA combined (Eq. 4)", "CNN-predicted", "self-attention"]
    assert colour_bars.count("attention probability") == len(maps)
    names = sorted(p.path.name for p in report.pictures)
    assert names == ["cost.png", "crossformer_sg.png", "learning_curves.png", "mpt_soft_mpt_soft.png",
                     "pa_attention_pa.png"], report.notes
    assert report.notes == [] and report.complete
    sizes = {p.path.name: p.size for p in report.pictures}
    assert sizes["learning_curves.png"] == (800, 450) and sizes["cost.png"] == (1100, 650)
    # baseline + 3 PA maps of layer 2 (the only PA one), two to a line
    assert sizes["pa_attention_pa.png"] == (2 * 560, 2 * 520 + 40)
    assert sizes["mpt_soft_mpt_soft.png"] == (2 * 380, 340)  # one panel per seed
    for picture in report.pictures:
        _check_png(picture)
    page = report.html.read_text()
    assert page.count("src=\"data:image/png;base64,") == len(report.pictures)
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page), "external resource in the HTML"
    assert "<link" not in page and "<script" not in page
    assert "| baseline " in report.table
    assert "| no verdict (2 seed(s); a verdict needs at least 3 per variant) |" in report.table  # 2 seeds: no "yes"
    markdown = report.markdown.read_text()
    # what won comes first, in words, with the cost beside it; then the environment; the curves still rise
    assert markdown.index("## What won") < markdown.index("## Environment") < markdown.index("## Results")
    assert any(line.startswith("**pa** gets **no verdict** against baseline: Δ test bleu ") and
               "% of the parameters" in line and "x the measured training throughput" in line
               and "(1.00x-1.00x seed by seed)" in line and line.endswith(", 30 s of training per run (measured).")
               for line in report.verdicts), report.verdicts
    assert report.warning and "still falling steeply" in report.warning and "Warning: still learning" in markdown
    assert "not recorded: this report was written outside a compare run" in markdown
    assert all(f"figures/{name}" in markdown for name in names)

    class NoSample(type(plan.spec)):
        def sample_input(self, task):
            return None

    no_sample = Plan(plan.settings, NoSample(), plan.task, plan.variants)
    report = write_report(no_sample, out, ["interlayer", "compare", "..."])
    assert "pa_attention_pa.png" not in [p.path.name for p in report.pictures]
    assert report.notes == ["PA attention maps of pa: skipped, task 'translation' offers no sample input "
                            "(TaskSpec.sample_input)."]


def test_still_falling_curves_are_told_apart_from_levelled_ones():
    steps = [100.0 * i for i in range(1, 21)]
    levelled = [(x, 2.0 + 1.0 * math.exp(-x / 300)) for x in steps]  # the last quarter brings 0.3% of the fall
    straight = [(x, 3.0 - x / 2000) for x in steps]  # a straight line: the last quarter brings a quarter
    slow_end = [(x, 2.0 + 1.0 * math.exp(-x / 1500)) for x in steps]  # about 15%: still learning
    assert not still_falling([levelled, levelled], higher_is_better=False)
    assert still_falling([straight], higher_is_better=False) and still_falling([slow_end], False)
    rising = [(x, 100 - y) for x, y in slow_end]  # accuracy that still rises
    assert still_falling([rising], higher_is_better=True) and not still_falling([rising], higher_is_better=False)
    # whatever the number of validations: three that still fall are still learning, three that levelled are not
    assert still_falling([straight[:3]], False) and still_falling([straight[:2]], False)
    assert still_falling([[(100.0, 3.0), (200.0, 2.5), (300.0, 2.49)]], False) is False
    assert still_falling([straight[:1]], False) is None and still_falling([], False) is None  # one: cannot tell


def test_the_environment_names_commit_torch_device_threads_wall_time_and_load(corpus):
    plan = build_plan(make_settings("translation", ["baseline"], budget_minutes=1.0,
                                    sets={**compare_sets(corpus), "train.threads": "1"}))
    env = comparison_environment(plan, threads=2, jobs=2, wall_seconds=125.0, load_at_start=1.5)
    assert re.fullmatch(r"[0-9a-f]{40}( \+ local changes)?", env.commit)  # this checkout is a git work tree
    lines = env.lines()
    assert f"torch {torch.__version__}" in lines[1] and "CPU" in env.device
    assert "threads: 1 torch thread(s) per run, 2 run(s) at a time" in lines  # train.threads wins over the 2
    assert "wall time of this invocation: 2.1 min (125 s)" in lines
    assert lines[-1].startswith("load average (1 min): 1.50 -> ")


def test_a_margin_that_is_not_positive_is_refused(capsys):
    assert main(["compare", "--task", "sst5", "--variants", "baseline", "--margin", "0"]) == 2
    assert "--margin=0.0 must be positive" in capsys.readouterr().err


# -- choosing on validation (--select) ------------------------------------------------------------------------
def _summary(name, valid, states=("finished", "finished")):
    runs = [SimpleNamespace(name=f"{name}-s{i + 1}", state=state) for i, state in enumerate(states)]
    return SimpleNamespace(name=name, valid=list(valid), runs=runs)


def test_a_group_is_decided_on_the_validation_mean_once_all_its_runs_finished():
    group = parse_selections(["pa=pa,pa_a0.3"])[0]
    summaries = [_summary("pa", [30.0, 32.0]), _summary("pa_a0.3", [31.5, 31.0])]
    assert choose(group, summaries, higher_is_better=True).chosen == "pa_a0.3"  # 31.25 > 31.0
    assert choose(group, summaries, higher_is_better=False).chosen == "pa"  # a loss: lower wins
    tied = [_summary("pa", [31.0]), _summary("pa_a0.3", [31.0])]
    assert choose(group, tied, higher_is_better=True).chosen == "pa"  # ties go to the first listed
    waiting = [_summary("pa", [30.0, 32.0]), _summary("pa_a0.3", [40.0], ("finished", "interrupted"))]
    choice = choose(group, waiting, higher_is_better=True)
    assert choice.chosen is None and choice.missing == ("pa_a0.3-s2",)
    assert "not decided yet" in choice_lines([choice], "bleu")[0]


@pytest.mark.parametrize("entries, message", [
    (["pa"], "expects GROUP=VARIANT"),
    (["pa=pa"], "at least two variants"),
    (["pa=pa,pa"], "lists a variant twice"),
    (["pa=pa,pa_a0.3", "pa=pa,lw_1x"], "more than once"),
])
def test_bad_select_entries_are_refused_with_the_reason(entries, message):
    with pytest.raises(ConfigError, match=message):
        parse_selections(entries)


def test_select_names_are_checked_before_training(corpus, tmp_path, capsys):
    with pytest.raises(ConfigError, match="candidate of both 'a' and 'b'"):
        check_selections(parse_selections(["a=pa,baseline", "b=pa,lw_1x"]), ["baseline", "pa", "lw_1x"])
    code = main(["compare", "--task", "translation", "--variants", "baseline,pa", "--select", "pa=pa,pa_a0.3",
                 "--output", str(tmp_path / "c"), *_cli_sets(corpus)])
    assert code == 2
    assert "--select pa: ['pa_a0.3'] not among the variants of this comparison" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_the_report_marks_the_variant_chosen_on_validation(corpus, tmp_path):
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa,pa_a0.3=pa+predictive.alpha=0.3")
    for seed in (1, 2):  # pa_a0.3 ahead on validation, behind on test: the choice must follow validation
        run = out / "runs" / f"pa_a0.3-s{seed}"
        (run / "valid.csv").write_text("step,epoch,bleu,nll,elapsed_min\n10,1,99.0,1.0,0.1\n")
        results = json.loads((run / "results.json").read_text())
        (run / "results.json").write_text(json.dumps({**results, "test_bleu": 0.5}))
    report = write_report(plan, out, ["interlayer", "compare", "..."], parse_selections(["pa=pa,pa_a0.3"]))
    assert "| pa_a0.3 (chosen for pa) " in report.table and "| pa " in report.table
    assert report.chosen[0].startswith("**pa**: **pa_a0.3**, the best mean validation bleu (pa ")
    assert "## Chosen on validation" in report.markdown.read_text()
    assert "<h2>Chosen on validation</h2>" in report.html.read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["selections"]["pa"]["chosen"] == "pa_a0.3"
    assert summary["selections"]["pa"]["valid_means"]["pa_a0.3"] == pytest.approx(99.0)


# -- atomic files, a damaged results file, a full disk -----------------------------------------------------------
@pytest.mark.slow
def test_a_damaged_results_file_is_named_and_the_run_counted_unfinished(corpus, tmp_path):
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    damaged = out / "runs" / "baseline-s1" / "results.json"
    damaged.write_text('{"status": "fini')  # what a crash mid-write of an in-place writer left
    report = write_report(plan, out, ["interlayer", "compare", "..."])
    assert not report.complete
    run = next(r for s in summarize(plan, out) for r in s.runs if r.name == "baseline-s1")
    assert run.state == "interrupted"
    assert run.detail.startswith(f"{damaged}:1:") and "not valid JSON" in run.detail
    assert "counted as unfinished" in report.markdown.read_text()
    (damaged.parent / LAST).write_bytes(b"")
    assert run_state(damaged.parent) == "resumable"  # the next compare resumes it, which scores it again


# Every file a comparison reads back, edited or damaged: (file under DIR, how it is changed, the one line expected)
RESULTS = "runs/baseline-s1/results.json"
TAMPERED = [
    (RESULTS, lambda t: t.replace('"test_bleu": ', '"test_bleu": -5.0, "x": '),
     r"results.json: test_bleu=-5 is outside the values a test_bleu can take \(0..100\); it was edited or damaged: "
     r"restore it, or delete it: the same compare command then scores the run's checkpoint again"),
    (RESULTS, lambda t: t.replace('"test_bleu": ', '"test_bleu": 250.0, "x": '), r"test_bleu=250 is outside"),
    (RESULTS, lambda t: t.replace('"test_bleu": ', '"test_bleu": NaN, "x": '), r"test_bleu=nan is not a finite"),
    (RESULTS, lambda t: t.replace('"test_bleu": ', '"test_bleu": "high", "x": '), r"test_bleu='high' is not a num"),
    (RESULTS, lambda t: t.replace('"test_bleu": ', '"test_bleu": true, "x": '), r"test_bleu=True is not a number"),
    (RESULTS, lambda t: t.replace('"test_bleu": ', '"x": '), r"it holds no test_bleu, the score every finished run"),
    (RESULTS, lambda t: t.replace('"train_minutes": 0.5', '"train_minutes": "abc"'), r"train_minutes='abc' is not a"),
    (RESULTS, lambda t: t.replace('"stop_reason": "budget"', '"stop_reason": [1]'), r"stop_reason=\[1\] is not text"),
    (RESULTS, lambda t: t.replace('"epochs": 5', '"epochs": -5'), r"epochs=-5 is not a finite number at least 0"),
    (RESULTS, lambda t: t.replace('"status": "finished"', '"status": "interrupted"'), r"status='interrupted', but"),
    ("runs/baseline-s1/valid.csv", lambda t: t + "60,6,nan,1,0.7\n",
     r"valid.csv: line 7: bleu='nan' is not a finite number 0..100; it was edited or damaged: restore it, or delete"),
    ("runs/baseline-s1/valid.csv", lambda t: t + "60,6,-3,1,0.7\n", r"line 7: bleu='-3' is not a finite number"),
    ("runs/baseline-s1/valid.csv", lambda t: t + "60,6,3,1,soon\n", r"line 7: elapsed_min='soon' is not a finite"),
    ("runs/baseline-s1/valid.csv", lambda t: "\udcff" + t, r"valid.csv:1: not valid UTF-8 \(byte 0: .*; it was "
                                                           r"edited or damaged"),
    ("runs/baseline-s1/train.csv", lambda t: t + "41,1.0,fast\n", r"train.csv: line 42: units_per_s='fast' is not a"),
    ("runs/baseline-s1/compare_memory.json", lambda t: "{", r"compare_memory.json:1:2: not valid JSON: .*; it was "
                                                           r"edited or damaged: restore it, or delete it"),
    ("runs/baseline-s1/compare_memory.json", lambda t: '{"a": 1}', r"expected a JSON list, got dict"),
    ("runs/baseline-s1/compare_memory.json", lambda t: '[{"peak_rss_mb": 1, "peak_rss_growth_mb": "x"}]',
     r"entry 0 is .*; each entry holds the finite numbers peak_rss_mb and peak_rss_growth_mb"),
    ("status.json", lambda t: "{", r"status.json:1:2: not valid JSON: .*; it was edited or damaged: delete it"),
    ("status.json", lambda t: "[1]", r"status.json: expected a JSON object, got list"),
    ("status.json", lambda t: '{"baseline-s1": "failed"}', r"the entry of 'baseline-s1' is 'failed', not a run's"),
    ("status.json", lambda t: '{"baseline-s1": {"status": "failed", "seconds": "long"}}', r"seconds='long' and"),
]


def test_every_file_a_comparison_reads_back_is_checked_and_a_damaged_one_named(corpus, tmp_path):
    """A tampered or damaged results.json, curve, memory or status file is one line naming the file, the entry and
    the fix (a DataError: exit 2), where it was an internal error (a TypeError, a JSONDecodeError, a
    UnicodeDecodeError) or, worse, a negative or NaN score averaged into the verdicts; a CSV line cut by a crash
    (no line end) is dropped, not refused."""
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    (out / "status.json").write_text("{}")
    summarize(plan, out)  # the faked runs read
    for name, change, message in TAMPERED:
        path = out / name
        original = path.read_bytes()
        path.write_bytes(change(original.decode()).encode("utf-8", "surrogateescape"))
        with pytest.raises(DataError, match=message) as caught:
            summarize(plan, out)
        assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value), name
        path.write_bytes(original)
    curve = out / "runs/baseline-s1/valid.csv"
    curve.write_text(curve.read_text() + "60,6,2")  # the crash cut the last row: dropped
    assert len(next(r for r in summarize(plan, out)[0].runs if r.seed == 1).curve) == 5


def test_a_loss_below_zero_or_not_finite_is_no_score():
    """The language model's metric, a loss in nats, has no upper end but is never negative (a negative one was
    averaged in silently); percentages stop at 100."""
    from interlayer.compare.readback import metric_problem

    assert metric_problem("test_loss", 1.91) is None and metric_problem("test_loss", 0.0) is None
    assert metric_problem("test_loss", -0.5) == "test_loss=-0.5 is outside the values a test_loss can take (at least 0)"
    assert metric_problem("test_loss", float("inf")) == "test_loss=inf is not a finite number"
    assert metric_problem("test_accuracy_relational", 100.5).endswith("(0..100)")
    assert metric_problem("test_noisy_pavpu", 55.0) is None and metric_problem("test_f1", "1") is not None


def test_a_damaged_compare_json_is_refused_naming_it(corpus, tmp_path):
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    command = ["interlayer", "compare", "..."]
    prepare_directory(plan, out, command)
    stored = json.loads((out / "compare.json").read_text())
    for text, message in [("{", r"compare.json:1:2: not valid JSON"), ("[]", r"expected a JSON object, got list"),
                          (json.dumps({**stored, "settings": None}), r"settings is not a mapping with seeds"),
                          (json.dumps({**stored, "invocations": []}), r"invocations is not a list of the commands")]:
        (out / "compare.json").write_text(text)
        with pytest.raises(DataError, match=message + r".*it was edited or damaged: restore it from a copy, or give "
                                                      r"another --output"):
            prepare_directory(plan, out, command)


def test_a_tampered_run_refuses_the_command_before_anything_is_written(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    args = ["compare", "--task", "translation", "--variants", "baseline,pa", "--seeds", "2", "--budget-minutes", "1",
            "--output", str(out), *_cli_sets(corpus)]
    prepare_directory(plan, out, ["interlayer", *args])
    results = out / RESULTS
    results.write_text(results.read_text().replace('"test_bleu": ', '"test_bleu": -5.0, "x": '))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "writer.lock"}
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interlayer: error: {results}: test_bleu=-5 is outside the values a test_bleu can take (0..100); "
                   "it was edited or damaged: restore it, or delete it: the same compare command then scores the "
                   "run's checkpoint again and writes it anew"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "writer.lock"} == before


@pytest.mark.slow
def test_report_md_escapes_group_names_and_the_command_line(corpus, tmp_path):
    from interlayer.compare.selection import parse_selections

    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    group = "<script>alert(1)</script>`x|y*"
    command = ["interlayer", "compare", "--select", f"{group}=baseline,pa", "--note", "a``b`"]
    report = write_report(plan, out, command, parse_selections([f"{group}=baseline,pa"]))
    text = report.markdown.read_text()
    assert "<script>" not in text.replace(md_code(" ".join(command)), "")  # raw only inside the code span
    assert r"\<script\>alert(1)\</script\>\`x\|y\*" in text  # in the table and the chosen line, escaped
    assert "Command: ``` interlayer compare --select <script>" in text  # a fence longer than any run of backticks
    assert md_code("a``b`") == "``` a``b` ```" and md_code("plain") == "`plain`"
    assert "<script>" not in report.html.read_text().replace("&lt;script&gt;", "")


@pytest.mark.slow
def test_a_translation_comparison_of_three_steps_finishes_every_run(corpus, tmp_path):
    """The issue's `compare --task translation --budget-steps 3`: with the task's average_last=5 every run FAILED."""
    out = tmp_path / "cmp"
    sets = {**compare_sets(corpus), "train.average_last": "5", "train.keep_last": "5"}
    assert main(["compare", "--task", "translation", "--variants", "baseline", "--budget-steps", "3", "--output",
                 str(out), *set_args(f"{k}={v}" for k, v in sets.items())]) == 0
    assert json.loads((out / "runs" / "baseline-s1" / "results.json").read_text())["averaged"].startswith("none:")
