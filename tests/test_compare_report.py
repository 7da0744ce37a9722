"""The comparison report as a reviewer reads it: per-seed values and the paired test's data (Markdown, HTML, CSV), a
LaTeX table that fits a page, seeds planned only for a stated difference, no test named where none ran, readable
attention-map ticks and throughput bars with their spread. Runs are faked (no training)."""
import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import ErrorbarContainer
from scipy import stats as scipy_stats

from helpers.compare import fake_runs
from interlayer.cli import main
from interlayer.compare import DEFAULT, build_plan, make_settings, plots
from interlayer.compare.report import write_report
from interlayer.compare.stats import compare_to_baseline, mean_std, seeds_needed

TEXT = "".join(f"Line {i}: to be, or not to be, that is the question {i * 3}.\n" for i in range(80))
# per-seed test losses with four decimals, so two decimals (or three) are visibly a rounding
TEST = {"baseline": [1.9213, 1.9234, 1.9581], "pa": [1.7934, 1.8003, 1.8702],
        "crossformer_kq": [1.8801, 1.9502, 1.9003], "crossformer_sg": [1.9604, 1.9593, 1.9755],
        "lw_1x": [1.9306, 1.9157, 1.9417]}


def _logs(run, planned, seed, rng):
    value = TEST[planned.variant.name][seed - 1]
    (run / "valid.csv").write_text("step,epoch,loss,elapsed_min\n100,1,2.9,1\n1000,10,2.3,10\n2000,20,2.2,20\n")
    (run / "train.csv").write_text(f"step,loss,units_per_s\n10,3.0,{1000 * seed}\n20,2.9,{1000 * seed + 100}\n")
    (run / "results.json").write_text(json.dumps({"status": "finished", "steps": 2000, "train_minutes": 1.25,
                                                  "test_loss": value}))


def _main_job(tmp_path, seeds=3):
    path = tmp_path / "book.txt"
    path.write_text(TEXT)
    sets = {**dict(s.split("=", 1) for s in DEFAULT["sets"]), "data.path": str(path), "data.block_size": "16"}
    plan = build_plan(make_settings("lm", DEFAULT["variants"], seeds=seeds, budget_steps=2000, sets=sets))
    out = tmp_path / "cmp"
    fake_runs(plan, out, _logs)
    return plan, out


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The README's main job, faked, and its report without --effect or --margin."""
    tmp_path = tmp_path_factory.mktemp("main")
    plan, out = _main_job(tmp_path)
    return plan, out, write_report(plan, out, ["interlayer", "compare", "--default"])


def _section(markdown, title):
    start = markdown.index(title)
    end = markdown.find("\n#", start + len(title))
    return markdown[start:] if end < 0 else markdown[start:end]


@pytest.mark.slow
def test_the_runs_table_gives_each_runs_test_value_to_three_decimals(main_job):
    plan, out, report = main_job
    runs = _section(report.markdown.read_text(), "## Runs")
    row = next(line for line in runs.splitlines() if line.startswith("| pa-s2 "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[-2:] == ["2.200", "1.800"], row  # the best validation and the test loss (1.8003): not "1.80"


@pytest.mark.slow
def test_the_per_seed_differences_appear_in_markdown_html_and_csv(main_job):
    plan, out, report = main_job
    diffs = {name: [v - b for v, b in zip(values, TEST["baseline"])] for name, values in TEST.items()}
    section = _section(report.markdown.read_text(), "### Per-seed differences")
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0].split("|")[1:4] == [" seed ", " baseline test loss ", " pa - baseline "]
    seed2 = [cell.strip() for cell in lines[2].strip("|").split("|")]  # header, seed 1, seed 2
    assert seed2 == ["2", "1.923", *(f"{diffs[n][1]:+.3f}" for n in DEFAULT["variants"][0].split(",")[1:])]
    mean = [cell.strip() for cell in lines[-2].strip("|").split("|")]
    sd = [cell.strip() for cell in lines[-1].strip("|").split("|")]
    assert mean[:3] == ["mean", f"{np.mean(TEST['baseline']):.3f}", f"{np.mean(diffs['pa']):+.3f}"]
    assert sd[2] == f"{np.std(diffs['pa'], ddof=1):.3f}"
    page = report.html.read_text()
    assert "<h3>Per-seed differences</h3>" in page and f"<td>{diffs['pa'][1]:+.3f}</td>" in page
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"]["pa"]["differences_by_seed"]["2"] == pytest.approx(diffs["pa"][1])
    # the CSV alone reproduces the primary test: SciPy's paired t-test of its per-seed columns
    with (out / "report.csv").open() as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    pa, base = rows["pa"], rows["baseline"]
    values = [float(pa[f"test_seed_{s}"]) for s in (1, 2, 3)]
    baseline = [float(base[f"test_seed_{s}"]) for s in (1, 2, 3)]
    assert values == TEST["pa"] and [float(pa[f"delta_seed_{s}"]) for s in (1, 2, 3)] == pytest.approx(diffs["pa"])
    assert float(pa["p"]) == pytest.approx(scipy_stats.ttest_rel(values, baseline).pvalue, rel=1e-9)
    assert base["delta_seed_1"] == ""


@pytest.mark.slow
def test_seeds_are_planned_for_a_stated_difference_never_the_observed_one(main_job, tmp_path):
    plan, out, report = main_job
    summary = json.loads((out / "summary.json").read_text())
    for name, variant in summary["variants"].items():
        c = variant["comparison"]
        if c is not None and c["verdict"] == "undecided":  # no --effect, no --margin: no post-hoc power
            assert c["seeds_for_target"] is None and c["target_delta"] is None, name
            assert "more seed" not in c["reason"] and c["reason"] == "no difference stated to plan seeds for (--effect)"
    assert "more seed" not in report.markdown.read_text()
    # with --effect 0.05: the seeds that detect 0.05 at the variant's Holm level and paired spread
    fresh = tmp_path / "effect"
    shutil.copytree(out, fresh)
    write_report(plan, fresh, ["interlayer", "compare", "--default", "--effect", "0.05"], effect=0.05)
    kq = json.loads((fresh / "summary.json").read_text())["variants"]["crossformer_kq"]["comparison"]
    sd = mean_std([v - b for v, b in zip(TEST["crossformer_kq"], TEST["baseline"])])[1]
    assert kq["target_delta"] == 0.05
    assert kq["seeds_for_target"] == seeds_needed(0.05, sd, alpha=kq["alpha_holm_step"], is_paired=True)
    assert f"to detect 0.05 with power 0.8 at α = {kq['alpha_holm_step']:.3g}" in kq["reason"]
    # in the stats alone: the same numbers without a stated difference plan nothing; a bad one is refused
    values = {s + 1: v for s, v in enumerate(TEST["crossformer_kq"])}
    base = {s + 1: v for s, v in enumerate(TEST["baseline"])}
    assert compare_to_baseline({"kq": values}, base, False)["kq"].seeds_for_target is None
    with pytest.raises(ValueError, match="effect to plan seeds for must be positive"):
        compare_to_baseline({"kq": values}, base, False, effect=-0.1)


def test_a_bad_effect_is_refused(capsys):
    assert main(["compare", "--task", "sst5", "--variants", "baseline", "--effect", "0"]) == 2
    assert "--effect=0.0 must be positive" in capsys.readouterr().err


@pytest.mark.slow
def test_at_one_seed_no_test_is_named(tmp_path):
    out = compare_to_baseline({"pa": {1: 1.8}}, {1: 1.9}, False)["pa"]
    assert out.test is None and out.interval is None and out.delta == pytest.approx(-0.1)
    plan, cmp = _main_job(tmp_path, seeds=1)
    report = write_report(plan, cmp, ["interlayer", "compare", "--seeds", "1"])
    row = next(line for line in report.table.splitlines() if line.startswith("| pa "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[6:9] == ["-0.128", "–", "–"], cells  # Δ without interval, no test, no p
    assert "Welch" not in report.markdown.read_text().split("## Set-up")[0]
    assert report.tests == [] and not any("t-test" in line for line in report.verdicts)


@pytest.mark.slow
def test_the_latex_table_is_compact_and_its_sentences_are_notes(main_job):
    plan, out, report = main_job
    tex = (out / "report.tex").read_text()
    table = tex[tex.index(r"\begin{tabular}"):tex.index(r"\end{tabular}")]
    rows = [line for line in table.splitlines() if line.endswith(r"\\")]
    assert len(rows) == 6 and all(line.count(" & ") == 6 for line in rows)  # 7 columns: header + 5 variants
    assert rows[0].startswith(r"variant & params & MAdds & test loss & $\Delta$ $\pm$ 95\% CI & p (Holm) & verdict")
    verdicts = {line.split(" & ")[-1].rstrip(" \\") for line in rows[1:]}
    assert verdicts <= {"--", "better", "worse", "equivalent", "undecided", "no verdict"}, verdicts
    pa = next(line for line in rows if line.startswith("pa "))
    assert r"1.821 $\pm$ 0.042" in pa and r"$-$0.113 $\pm$ 0.054" in pa  # Δ ± the interval's half-width
    notes = tex[tex.index(r"\end{tabular}"):]
    assert "paired t-test for pa, crossformer" in notes and "Verdicts: pa: Holm p=" in notes
    assert "(3 seeds per variant)" in notes and "Δ" not in tex and "−" not in tex


LATEX_DOCUMENT = r"""\documentclass{article}
\IfFileExists{booktabs.sty}{\usepackage{booktabs}}{\let\toprule\hline\let\midrule\hline\let\bottomrule\hline}
\hfuzz=0pt
\begin{document}
\input{report.tex}
\end{document}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed (Debian: apt-get install texlive-latex-base)")
def test_report_tex_compiles_within_the_text_width(main_job, tmp_path):
    """``report.tex`` in a plain ``article`` (10 pt, its 345 pt text width): pdflatex compiles it and reports no
    overfull box, i.e. nothing sticks out of the text width (``\\hfuzz=0pt``: not even by a fraction of a point).
    Without booktabs (Debian's texlive-latex-base lacks it) its rules fall back to ``\\hline``."""
    plan, out, report = main_job
    shutil.copy(out / "report.tex", tmp_path / "report.tex")
    (tmp_path / "paper.tex").write_text(LATEX_DOCUMENT)
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert done.returncode == 0, log[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 0
    assert not re.findall(r"Overfull \\hbox.*", log), re.findall(r"Overfull \\hbox.*", log)


def _drawn(monkeypatch):
    figures = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, *a: figures.append(fig) or save(fig, *a))
    return figures


@pytest.mark.slow
def test_attention_map_tick_labels_are_readable(monkeypatch, tmp_path):
    """32 characters (the language model's sample) with spaces and a line break: every tick label is at least 8
    points, visible (whitespace as a sign) and clear of its neighbours once drawn."""
    figures = _drawn(monkeypatch)
    tokens = list("To be, or not\nto be: that is the")
    assert len(tokens) == 32
    rng = np.random.default_rng(0)
    maps = [(title, rng.random((32, 32))) for title in ("baseline", "PA combined", "CNN-predicted", "self")]
    plots.attention_maps([("layer 2", maps), ("layer 4", maps)], tokens, "PA", tmp_path / "pa.png", "caption")
    fig, = figures
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_images()]
    assert len(axes) == 8
    for ax in axes:
        for labels, horizontal in ((ax.get_xticklabels(), True), (ax.get_yticklabels(), False)):
            shown = [label for label in labels if label.get_visible() and label.get_text()]
            assert len(shown) >= 16, len(shown)
            assert all(label.get_fontsize() >= 8 for label in shown)
            assert all(label.get_text().strip() and label.get_text().isprintable() for label in shown)
            boxes = sorted((label.get_window_extent(renderer) for label in shown),
                           key=lambda box: box.x0 if horizontal else box.y0)
            for a, b in zip(boxes, boxes[1:]):
                assert (b.x0 >= a.x1) if horizontal else (b.y0 >= a.y1), "tick labels overlap"
    assert {label.get_text() for label in axes[0].get_xticklabels()} >= {"␣", "↵", "T"}
    assert plots.token_label("") == "∅" and plots.token_label("a\tb") == "a⇥b"


@pytest.mark.slow
def test_throughput_bars_show_their_spread_over_seeds(monkeypatch, main_job, tmp_path):
    figures = _drawn(monkeypatch)
    plots.cost_bars(["baseline", "pa"], [("params", "count", [1.0, 2.0]),
                                         ("throughput", "tokens/s", [2000.0, 1000.0], [100.0, None])],
                    "baseline", tmp_path / "cost.png")
    fig, = figures
    params, speed = fig.axes[:2]
    bars = [c for c in speed.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1 and not [c for c in params.containers if isinstance(c, ErrorbarContainer)]
    segment = bars[0].lines[2][0].get_segments()[0]  # the baseline's bar: 2000 ± 100
    assert segment[:, 1].tolist() == [1900.0, 2100.0]
    # in the report: the throughput panel gets each variant's std over seeds (1000 per seed apart: 1,000)
    plan, out, report = main_job
    cost = next(p for p in report.pictures if p.path.name == "cost.png")
    assert "error bars of ± one sample standard deviation over the seeds" in cost.caption


def test_the_main_jobs_seeds_are_the_pilots_power_calculation():
    """``MAIN_JOB_SEEDS`` is the N of docs/compare.md's prospective calculation: the smallest number of seeds at which
    the paired t-test of PA against the baseline, at Holm's first level over the default's four variants, has power
    0.8 at the pilots' mean difference and standard deviation; the pilots' seeds are none of the default's."""
    from interlayer.compare import MAIN_JOB_SEEDS, MAIN_JOB_STEPS
    from interlayer.compare.stats import power
    from interlayer.compare.variants import split_entries

    pilot = json.loads((Path(__file__).parents[1] / "docs" / f"main-job-pilot-{MAIN_JOB_STEPS}.json").read_text())
    assert pilot["steps"] == MAIN_JOB_STEPS == DEFAULT["budget_steps"]
    pa = pilot["variants"]["pa"]
    assert len(pa["differences"]) == len(pa["seeds"]) >= 5 and min(pa["seeds"]) > MAIN_JOB_SEEDS
    mean, sd = mean_std(pa["differences"])
    m = len(split_entries(DEFAULT["variants"][0])) - 1
    assert m == pilot["m"] == 4 and DEFAULT["seeds"] == MAIN_JOB_SEEDS
    assert seeds_needed(abs(mean), sd, alpha=0.05 / m, is_paired=True) == MAIN_JOB_SEEDS
    assert power(abs(mean), sd, MAIN_JOB_SEEDS, 0.05 / m, is_paired=True) >= 0.8 > power(
        abs(mean), sd, MAIN_JOB_SEEDS - 1, 0.05 / m, is_paired=True)
