"""Compute budgets (compare/budget.py) and the scaling sweep (compare/scaling.py, scaling_report.py): a FLOP budget
gives variants of different cost the same FLOPs within one step and stops each run there; the size rule; a toy sweep
of the character LM trained end to end (3 sizes, 2 variants, 2 seeds, in this process through submitit's debug
executor) and its report; a sweep of faked runs whose compute multiplier is known."""
import base64
import dataclasses
import json
import math
import re
import struct

import numpy as np
import pytest

from helpers.compare import compare_sets, fake_runs
from interlayer.cli import main
from interlayer.compare import build_plan, make_settings
from interlayer.compare.budget import FLOPS_PER_MADD
from interlayer.compare.scaling import SweepOptions, parse_size, parse_sizes, plan_sweep
from interlayer.compare.scaling_report import write_scaling_report
from interlayer.errors import ConfigError, VariantError

TEXT = "".join(f"Line {i}: to be, or not to be, that is the question {i * 3}.\n" for i in range(80))
TINY = {"d_model": "32", "n_heads": "4", "d_ffn": "64", "enc_layers": "2", "data.block_size": "16",
        "train.max_tokens": "64", "data.eval_interval": "2", "data.eval_blocks": "4", "train.warmup_steps": "2",
        "train.threads": "1"}


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(TEXT)
    return path


def _sets(book, **extra):
    return {**TINY, "data.path": str(book), **extra}


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_flop_budget_gives_variants_of_different_cost_the_same_flops_within_one_step(book):
    """PA costs more per step than the baseline, LW-1x less: each gets the whole steps the budget buys."""
    plan = build_plan(make_settings("lm", ["baseline,pa,lw_1x"], budget_flops=4e8, sets=_sets(book)))
    steps = {}
    for v in plan.variants:
        assert v.step.tokens == 64 and v.step.flops == FLOPS_PER_MADD * v.madds * 4  # 4 blocks of 16 per step
        steps[v.variant.name] = v.sets["train.max_steps"]
        spent = steps[v.variant.name] * v.step.flops
        assert 4e8 - v.step.flops < spent <= 4e8  # within one of its own steps below the budget
    assert steps["pa"] < steps["baseline"] < steps["lw_1x"]
    tokens = build_plan(make_settings("lm", ["baseline,pa"], budget_tokens=6400, sets=_sets(book)))
    assert [v.sets["train.max_steps"] for v in tokens.variants] == [100, 100]
    accumulated = build_plan(make_settings("lm", ["baseline"], budget_tokens=6400,
                                           sets=_sets(book, **{"train.update_freq": "2"})))
    assert accumulated.variants[0].step.tokens == 128 and accumulated.variants[0].sets["train.max_steps"] == 50


def test_compute_budgets_are_refused_where_they_cannot_hold(book, corpus):
    with pytest.raises(ConfigError, match="--budget-steps and --budget-flops are given together"):
        make_settings("lm", ["baseline"], budget_flops=1e9, budget_steps=10)
    with pytest.raises(ConfigError, match="would contradict it"):
        make_settings("lm", ["baseline"], budget_tokens=640, sets={"train.max_steps": "5"})
    with pytest.raises(ConfigError, match="--budget-flops=-1 must be a positive number"):
        make_settings("lm", ["baseline"], budget_flops=-1.0)
    with pytest.raises(VariantError, match="variant 'short' sets train.max_steps, which --budget-flops decides"):
        build_plan(make_settings("lm", ["baseline", "short=baseline+train.max_steps=3"], budget_flops=1e9,
                                 sets=_sets(book)))
    with pytest.raises(ConfigError, match="--budget-flops=1000 buys no optimiser step of variant 'baseline'"):
        build_plan(make_settings("lm", ["baseline"], budget_flops=1e3, sets=_sets(book)))
    with pytest.raises(ConfigError, match="task 'translation' batches vary in length"):
        build_plan(make_settings("translation", ["baseline"], budget_tokens=1000, sets=compare_sets(corpus)))


@pytest.mark.slow
def test_a_flop_budget_stops_each_run_at_its_step_and_the_report_states_its_compute(book, tmp_path, capsys):
    out = tmp_path / "cmp"
    sets = [a for k, v in _sets(book).items() for a in ("--set", f"{k}={v}")]
    args = ["compare", "--task", "lm", "--variants", "baseline,pa", "--budget-flops", "2e7", "--output", str(out),
            "--launcher", "submitit", "--slurm-cluster", "debug", *sets]
    assert main(args) == 0
    plan = build_plan(make_settings("lm", ["baseline,pa"], budget_flops=2e7, sets=_sets(book)))
    markdown = (out / "report.md").read_text()
    assert "budget: 2.00e7 training FLOPs per run" in markdown and "| training FLOPs per run " in markdown
    for v in plan.variants:
        results = json.loads((out / "runs" / f"{v.variant.name}-s1" / "results.json").read_text())
        assert results["steps"] == v.sets["train.max_steps"]  # the run stopped at the step the budget bought
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {v.variant.name} ")
                   and "e" in line.split("|")[2])
        assert f"| {results['steps']} " in row and f"| {results['steps'] * 64:,} " in row
    assert "training FLOPs per run" in (out / "report.html").read_text()


def test_the_size_rule(book):
    sizes = parse_sizes(["d_model=16,24,32", "enc_layers=2,2,3"])
    assert [s.label for s in sizes] == ["d_model16_enc_layers2", "d_model24_enc_layers2", "d_model32_enc_layers3"]
    assert sizes[2].sets == {"d_model": 32, "enc_layers": 3}
    for entries, message in ((["d_model=16,24"], "gives 2 size\\(s\\); a scaling fit .* needs at least 3"),
                             (["d_model=16,24,32", "enc_layers=2,3"], "different numbers of values"),
                             (["data.block_size=8,16,32"], "every size reads the same data"),
                             (["predictive.alpha=0.1,0.2,0.3"], "would turn the predictive method on"),
                             (["d_model=16,16,32"], "the same size twice"), (["d_model"], "expects KEY=V1,V2")):
        with pytest.raises(ConfigError, match=message):
            parse_sizes(entries)
    settings = make_settings("lm", ["baseline,lw_1x"], budget_steps=4,
                             sets={k: v for k, v in _sets(book).items() if k not in ("d_model", "d_ffn")})
    sweep = plan_sweep(settings, SweepOptions(parse_sizes(["d_model=16,24,32"]),
                                              extrapolate=parse_size(["d_model=64"])))
    # d_ffn follows d_model at the preset's ratio (gpt_shakespeare_char: 4x), the extrapolated size too
    assert [s.sets["d_ffn"] for s in sweep.sizes] == [64, 96, 128]
    assert sweep.extrapolated.variant("lw_1x@d_model64").model["d_ffn"] == 256
    assert [v.variant.name for v in sweep.plan.variants][:2] == ["baseline@d_model16", "lw_1x@d_model16"]
    assert sweep.cell("lw_1x", "d_model24").model["lightweight"] is not None  # the method adapts to each size
    for options, message in (
            (SweepOptions(parse_sizes(["d_model=16,24,32"]), extrapolate=parse_size(["n_heads=8"])),
             "--extrapolate sets n_heads, which --sizes does not vary"),
            (SweepOptions(parse_sizes(["d_model=16,24,32"]), axis="seconds", extrapolate=parse_size(["d_model=64"])),
             "needs the FLOPs axis"),
            (SweepOptions(parse_sizes(["d_model=16,24,32"]), tokens_per_parameter=20.0),
             "--budget-steps would contradict it")):
        with pytest.raises(ConfigError, match=message):
            plan_sweep(settings, options)
    with pytest.raises(ConfigError, match="--budget-flops with --sizes would give every size the same compute"):
        plan_sweep(make_settings("lm", ["baseline"], budget_flops=1e9, sets=_sets(book)),
                   SweepOptions(parse_sizes(["d_model=16,24,32"])))
    with pytest.raises(ConfigError, match="--sizes and --set both give d_model"):
        plan_sweep(make_settings("lm", ["baseline"], sets=_sets(book)), SweepOptions(parse_sizes(["d_model=8,16,24"])))


def test_tokens_per_parameter_gives_each_size_equal_flops_growing_with_it(book):
    settings = make_settings("lm", ["baseline,pa"], sets={k: v for k, v in _sets(book).items() if k != "d_model"})
    sweep = plan_sweep(settings, SweepOptions(parse_sizes(["d_model=16,24,32"]), tokens_per_parameter=2.0))
    budgets = []
    for size in sweep.sizes:
        base, pa = sweep.cell("baseline", size.label), sweep.cell("pa", size.label)
        budget = 2.0 * base.parameters * base.step.flops / base.step.tokens
        for v in (base, pa):
            assert budget - v.step.flops < v.sets["train.max_steps"] * v.step.flops <= budget
        budgets.append(budget)
    assert budgets == sorted(budgets) and budgets[-1] > 2 * budgets[0]


def _sweep_args(book, out, *extra):
    sets = {k: v for k, v in _sets(book).items() if k not in ("d_model", "d_ffn")}
    return ["compare", "--task", "lm", "--variants", "baseline,muddformer", "--seeds", "2", "--sizes",
            "d_model=8,16,24", "--budget-steps", "4", "--extrapolate", "d_model=32", "--output", str(out),
            "--launcher", "submitit", "--slurm-cluster", "debug",
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], *extra]


@pytest.mark.slow
def test_a_toy_sweep_trains_every_size_fits_and_reports(book, tmp_path, capsys):
    """The character LM at 3 sizes x 2 variants x 2 seeds, 4 steps each: every run trains once, the report holds the
    table, the fits, the multipliers (measured and extrapolated), the figures (PNG files, embedded in the HTML), the
    CSV and LaTeX tables; the same command again trains nothing."""
    out = tmp_path / "sweep"
    assert main(_sweep_args(book, out)) == 0
    printed = capsys.readouterr().out
    assert "12 runs: 2 variants x 3 sizes x 2 seeds" in printed
    assert "muddformer at the largest measured size (d_model24, " in printed
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert len(runs) == 12 and "muddformer@d_model24-s2" in runs
    markdown = (out / "report.md").read_text()
    for part in ("## What the sweep shows", "## Loss, fits and compute multipliers", "## Fits", "**baseline**: L(C) = ",
                 "## At equal budget, size by size", "## Compute per run", "d_model32 (extrapolated)",
                 "figures/scaling_curves.png", "figures/multipliers.png", "3 sizes determine the 3 parameters"):
        assert part in markdown, part
    summary = json.loads((out / "summary.json").read_text())
    for name in ("baseline", "muddformer"):
        fit = summary["variants"][name]["fit"]
        assert fit["alpha"] > 0 and len(summary["variants"][name]["sizes"]) == 3
        for size in summary["variants"][name]["sizes"].values():
            assert len(size["compute"]) == 2 and len(size["metric"]) == 2
    assert summary["variants"]["muddformer"]["extrapolated"]["extrapolated"] is True
    rows = (out / "report.csv").read_text().splitlines()
    assert rows[0].startswith("variant,size,extrapolated,parameters,flops_per_step,axis,compute") and len(rows) == 8
    tex = (out / "report.tex").read_text()
    assert tex.count(r"\begin{tabular}") == 2 and "d\\_model32 (extrapolated)" in tex
    page = (out / "report.html").read_text()
    for name in ("scaling_curves.png", "multipliers.png"):
        path = out / "figures" / name
        assert _png_size(path) in ((900, 750), (800, 480))
        assert base64.b64encode(path.read_bytes()).decode("ascii") in page
    # the compute of every run: its steps times the FLOPs of its variant's step
    record = json.loads((out / "runs" / "baseline@d_model16-s1" / "results.json").read_text())
    flops = summary["variants"]["baseline"]["sizes"]["d_model16"]["compute"][0]
    assert record["steps"] == 4 and flops == pytest.approx(4 * 6 * 64 / 16 * record["madds_per_block"])
    assert main(_sweep_args(book, out)) == 0
    again = capsys.readouterr().out
    assert again.count("finished earlier, skipped") == 12 and "training" not in again.replace("training FLOPs", "")


def test_sweep_flags_belong_together(book, tmp_path, capsys):
    assert main(["compare", "--task", "lm", "--variants", "baseline", "--tokens-per-parameter", "20"]) == 2
    assert "--tokens-per-parameter belong to a scaling sweep; give --sizes" in capsys.readouterr().err
    assert main([*_sweep_args(book, tmp_path / "s"), "--select", "g=baseline,muddformer"]) == 2
    assert "a scaling sweep reports every variant" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--task", "lm", "--variants", "baseline", "--budget-flops", "-5"])
    assert "-5 must be a positive finite number" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_sweep_of_faked_runs_recovers_the_multiplier_they_were_made_with(book, tmp_path):
    """Runs faked on disk with losses on a known curve: the method reaches the baseline's loss at half the compute
    (worth 2x), so the report must say it is worth about 2x at the largest size, with an interval holding 2."""
    settings = make_settings("lm", ["baseline,lw_1x"], seeds=3, budget_steps=100,
                             sets={k: v for k, v in _sets(book).items() if k not in ("d_model", "d_ffn")})
    sweep = plan_sweep(settings, SweepOptions(parse_sizes(["d_model=16,24,32,48"])))
    scale = min(v.step.flops for v in sweep.plan.variants) * 100

    def logs(run_dir, planned, seed, rng):
        compute = 100 * planned.step.flops
        worth = 2.0 if planned.variant.name.startswith("lw_1x") else 1.0
        loss = 1.2 + 1.5 * (worth * compute / scale) ** -0.3 + 0.01 * rng.standard_normal()
        (run_dir / "results.json").write_text(json.dumps({"status": "finished", "steps": 100, "test_loss": loss,
                                                          "train_minutes": compute / scale}))  # a minute per C0

    out = tmp_path / "fake"
    fake_runs(sweep.plan, out, logs)
    report = write_scaling_report(sweep, out, ["interlayer", "compare", "..."])
    line = next(v for v in report.verdicts if v.startswith("**lw_1x**"))
    value = float(re.search(r"worth \*\*([0-9.]+)x\*\*", line).group(1))
    low, high = (float(v) for v in re.search(r"\[([0-9.]+)x, ([0-9.]+)x\]", line).groups())
    assert 1.5 < value < 2.7 and low <= 2.0 <= high and low > 1.0
    assert report.complete and not math.isnan(value)
    fits = json.loads((out / "summary.json").read_text())["variants"]
    assert fits["baseline"]["fit"]["alpha"] == pytest.approx(0.3, abs=0.15)
    assert np.isclose(fits["lw_1x"]["sizes"]["d_model48"]["compute"], 100 * sweep.cell("lw_1x", "d_model48").step.flops
                      ).all()
    sweep.options = dataclasses.replace(sweep.options, axis="seconds")  # the same runs against their measured time
    seconds = write_scaling_report(sweep, out, ["interlayer", "compare", "..."])
    assert "| training s per run " in seconds.table and "60 s)" in seconds.fits[0]  # C0: the first minute
    assert json.loads((out / "summary.json").read_text())["variants"]["lw_1x"]["sizes"]["d_model16"]["compute"][0] \
        == pytest.approx(60 * 100 * sweep.cell("lw_1x", "d_model16").step.flops / scale)


def test_a_sweep_may_grow_by_a_size_but_not_lose_one(book, tmp_path):
    """A sweep's directory is a comparison's: the same command continues it, a larger sweep (another size) grows it,
    and one that drops a size is refused with the sizes' runs named."""
    from interlayer.compare.plan import prepare_directory

    settings = make_settings("lm", ["baseline,pa"], budget_steps=4,
                             sets={k: v for k, v in _sets(book).items() if k not in ("d_model", "d_ffn")})
    out = tmp_path / "sweep"

    def prepare(sizes):
        return prepare_directory(plan_sweep(settings, SweepOptions(parse_sizes([sizes]))).plan, out, ["x"])

    assert prepare("d_model=16,24,32") is False and prepare("d_model=16,24,32") is True
    assert prepare("d_model=16,24,32,48") is True
    stored = json.loads((out / "compare.json").read_text())
    assert "pa@d_model48" in stored["models"] and any("pa@d_model48" in g for g in stored["invocations"][-1]["grew"])
    with pytest.raises(ConfigError, match="baseline@d_model16, pa@d_model16 would be dropped"):
        prepare("d_model=24,32,48")
