"""The language-model comparison (the README's main job): its report under a step budget, faked runs only."""
import json

import pytest

from interlayer.compare import build_plan, make_settings
from interlayer.compare.report import read_run, write_report

from helpers.compare import fake_runs

TEXT = "".join(f"Line {i}: to be, or not to be, that is the question {i * 3}.\n" for i in range(80))


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(TEXT)
    sets = {"data.path": str(path), "d_model": "32", "n_heads": "4", "d_ffn": "64", "enc_layers": "2",
            "data.block_size": "16", "train.max_tokens": "64"}
    return build_plan(make_settings("lm", ["baseline,pa"], seeds=2, budget_steps=40, sets=sets))


def lm_logs(run, planned, seed, rng):
    """Validations every 4 steps (loss falling), measured speeds, a finished result."""
    rows = [f"{4 * e},{e},{3 - 0.1 * e + 0.01 * seed},{e / 60 + rng.random()}" for e in range(1, 11)]
    (run / "valid.csv").write_text("step,epoch,loss,elapsed_min\n" + "\n".join(rows) + "\n")
    (run / "train.csv").write_text("step,loss,units_per_s\n4,3.0,1000\n")
    (run / "results.json").write_text(json.dumps({"status": "finished", "steps": 40,
                                                  "test_loss": 2.1234 + 0.001 * seed}))


def test_lm_report_under_a_step_budget(plan, tmp_path):
    assert plan.settings.sets["train.max_steps"] == "40" and plan.settings.budget_minutes is None
    out = tmp_path / "cmp"
    fake_runs(plan, out, lm_logs)
    report = write_report(plan, out, ["interlayer", "compare", "..."])
    # three decimals for the loss (the task's metric_decimals), not the two a value above 1 gets by default
    assert "| 2.125 ± 0.001 (n=2) " in report.table and "tokens/s" not in report.table
    assert "| training tokens/s " in report.cost
    markdown = report.markdown.read_text()
    assert "40 optimiser steps per run" in markdown and "## Measured cost" in markdown
    # the learning curve's x is the step (which does not depend on the load), not the random elapsed minutes
    record = read_run(plan, out, "baseline", 1, {})
    assert [x for x, _ in record.curve] == [4.0 * e for e in range(1, 11)]
    assert {p.path.name for p in report.pictures} >= {"learning_curves.png", "pa_attention_pa.png"}
    curves = next(p for p in report.pictures if p.path.name == "learning_curves.png")
    assert curves.caption.startswith("Validation loss (nats per token) against optimiser steps")  # axis with unit


def test_denseformer_and_hyper_connections_variants_resolve_on_the_main_jobs_model(tmp_path):
    """The four named variants build on the lm task with DEFAULT's model (4 layers, d=64), each with its section."""
    from interlayer.compare import DEFAULT
    path = tmp_path / "book.txt"
    path.write_text(TEXT)
    sets = dict(s.split("=", 1) for s in DEFAULT["sets"])
    sets.update({"data.path": str(path), "data.block_size": "16"})
    names = ["denseformer", "denseformer_2x2", "hyper_connections", "hyper_connections_static"]
    plan = build_plan(make_settings("lm", [",".join(["baseline", *names])], budget_steps=4, sets=sets))
    base = plan.variant("baseline")
    for name in names:
        planned = plan.variant(name)
        section = "denseformer" if name.startswith("denseformer") else "hyper_connections"
        assert planned.model[section] is not None and planned.parameters > base.parameters
    assert plan.variant("hyper_connections").madds > base.madds == plan.variant("denseformer").madds


def test_mhc_and_muddformer_variants_resolve_on_the_main_jobs_model(tmp_path):
    """mhc, muddformer, muddformer_static and muddformer_2x2 build on the lm task with DEFAULT's model, each with its
    section and the options its description names."""
    from interlayer.compare import DEFAULT
    path = tmp_path / "book.txt"
    path.write_text(TEXT)
    sets = dict(s.split("=", 1) for s in DEFAULT["sets"])
    sets.update({"data.path": str(path), "data.block_size": "16"})
    names = ["mhc", "muddformer", "muddformer_static", "muddformer_2x2"]
    plan = build_plan(make_settings("lm", [",".join(["baseline", *names])], budget_steps=4, sets=sets))
    base = plan.variant("baseline")
    for name in names:
        assert plan.variant(name).parameters > base.parameters
    assert plan.variant("mhc").model["mhc"]["rate"] == 4
    assert plan.variant("muddformer_static").model["muddformer"]["dynamic"] is False
    assert plan.variant("muddformer_2x2").model["muddformer"]["period"] == 2
    assert plan.variant("muddformer").madds > plan.variant("muddformer_static").madds == base.madds
