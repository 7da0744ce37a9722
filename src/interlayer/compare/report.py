"""The comparison report: a table as the papers print them, the figures, and what every run did, rendered as
Markdown, HTML (figures embedded), JSON, CSV and LaTeX.

Everything is read back from the run directories (:mod:`.records`; the figures, :mod:`.pictures`, reload the
``best/`` models) and ``compare.json``, so a report can be written at any time, also for an interrupted comparison
(it then says which runs are missing). The environment that produced the numbers is :mod:`.environment`'s.

Columns: parameters (each tensor once) and MAdds of one forward pass at the task's typical length (see
:func:`interlayer.compare.plan.typical_lengths`), training throughput (mean of the logged windows), peak memory
(growth of the run process's maximum RSS from its start), the best validation metric and the test metric of the
run's ``best/`` model as mean ± sample std over seeds, and the difference of the test mean to the baseline with
its 95% interval, Holm-corrected p, detectable difference and verdict (:mod:`interlayer.compare.stats`). Under it,
the per-seed differences the paired test is computed from, and at the end every run's figures
(:mod:`.seed_tables`); beside it, the table as CSV and as a compact LaTeX table (:mod:`.exports`).

Above the table, a paragraph says in words what won (each verdict with the variant's cost beside it), the
environment that produced the numbers (commit, torch, device, threads, wall time, load), and a warning when the
learning curves are still falling steeply at the end of the budget (the verdict is then about early training).
"""
from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..fileio import write_atomic
from ..tables import format_table, human
from . import exports, plots
from .compute import COMPUTE_HEADERS, COMPUTE_NOTE, budget_text, compute_rows
from .environment import Environment
from .pictures import figures
from .plan import Plan
from .records import METRIC_UNITS, VariantSummary, extra_metrics, summarize
from .seed_tables import RUN_HEADERS, difference_headers, difference_rows, run_rows, seed_differences
from .selection import Choice, Selection, choice_lines, choose
from .stats import POWER, SEED_SHARES, TEST_TITLES, Comparison, mean_std, ratio_range, rule, test_lines

FIGURES = "figures"
# A learning curve is "still falling steeply" when its last quarter of the budget brought more than this share of
# its whole improvement since the first validation (a converging curve brings a few percent there).
STEEP_SHARE = 0.10


# -- the table ------------------------------------------------------------------------------------------------
def decimals(value: float) -> int:
    """Digits after the point: 1 from 100 up, 2 from 1 up (BLEU, percentages), 4 below (fractions)."""
    return 1 if abs(value) >= 100 else 2 if abs(value) >= 1 else 4


def fmt(value: Optional[float], places: Optional[int] = None) -> str:
    """``value`` with ``places`` decimals (by its size when None); thousands separated when it has none."""
    if value is None:
        return "–"
    places = decimals(value) if places is None else places
    return f"{value:,.0f}" if places == 0 else f"{value:.{places}f}"


def mean_pm(values: list[float], places: Optional[int] = None) -> str:
    """``mean ± std (n=k)``, the std with the mean's decimals (``places``, or by the mean's size)."""
    mean, std = mean_std(values)
    if mean is None:
        return "–"
    places = decimals(mean) if places is None else places
    return fmt(mean, places) + (f" ± {fmt(std, places)}" if std is not None else "") + f" (n={len(values)})"


def headers(plan: Plan) -> list[str]:
    """The results table: what the runs' settings and seeds decide (measured speed and memory are in
    :func:`cost_rows`), so under a step budget the same command prints the same table on any load of the same
    machine and software."""
    metric = plan.task.metric
    base = plan.variant(plan.settings.baseline)
    return ["variant", "parameters", f"MAdds @ {'/'.join(map(str, base.lengths))}", "runs", f"valid {metric}",
            f"test {metric}", *(f"test {m}" for m in extra_metrics(plan)), "Δ test [95% CI]", "test", "p (Holm)",
            "Welch p (Holm)", f"detectable Δ (power {POWER}, Holm α)", "verdict"]


def cost_headers(plan: Plan) -> list[str]:
    return ["variant", f"training {plan.task.units}/s", "x baseline (per seed)", "peak MiB"]


def speed_ratio_text(s: VariantSummary, base: VariantSummary, words: str = "") -> str:
    """``0.62x (0.55x-0.70x)``: the ratio of the mean throughputs (followed by ``words``), and the lowest and
    highest ratio of one seed's run to the baseline's run of the same seed; "–" when not measured."""
    ratio, spread = _ratio(s.speed, base.speed), ratio_range(s.speeds, base.speeds)
    if ratio is None:
        return "–"
    if spread is None or len(s.speeds) < 2:
        return f"{ratio:.2f}x{words}"
    return f"{ratio:.2f}x{words} ({spread[0]:.2f}x-{spread[1]:.2f}x{' seed by seed' if words else ''})"


def cost_rows(summaries: list[VariantSummary], baseline: str) -> list[list[str]]:
    """Throughput (mean ± std over seeds, and relative to the baseline's seed by seed) and memory as measured
    (they depend on the machine and its load)."""
    base = next(s for s in summaries if s.name == baseline)
    return [[s.name, mean_pm(list(s.speeds.values()), 0), "–" if s is base else speed_ratio_text(s, base),
             "–" if s.memory is None else f"{s.memory:,.0f}"] for s in summaries]


def delta_text(c: Optional[Comparison], places: int) -> str:
    """``+0.012 [-0.004, +0.028]``: the difference and its 95% interval (none with one seed on a side)."""
    if c is None or c.delta is None:
        return "–"
    return f"{c.delta:+.{places}f}" + (f" [{c.interval[0]:+.{places}f}, {c.interval[1]:+.{places}f}]"
                                       if c.interval else "")


def comparison_cells(c: Optional[Comparison], places: int) -> list[str]:
    """Δ [CI], the primary test, its Holm p, the Welch check's Holm p (where the primary test is the paired one),
    the detectable Δ and the verdict."""
    if c is None:
        return ["–"] * 6
    check = c.welch_p_holm if c.test == "paired" else None
    test = {"paired": "paired", "welch": "Welch", None: "–"}[c.test]
    return [delta_text(c, places), test, "–" if c.p_holm is None else f"{c.p_holm:.3g}",
            "–" if check is None else f"{check:.3g}", "–" if c.detectable is None else f"{c.detectable:.{places}f}",
            c.words]


def _places(plan: Plan, summaries: Sequence[VariantSummary]) -> int:
    """The decimals of the differences: the task's, else by the size of the baseline's test mean."""
    base_test = mean_std(next(s.test for s in summaries if s.name == plan.settings.baseline))[0]
    return plan.task.decimals or (decimals(base_test) if base_test is not None else 2)


def table_rows(plan: Plan, summaries: list[VariantSummary], choices: Sequence[Choice] = ()) -> list[list[str]]:
    """The results table's rows, one per variant: size, finished runs, validation and test metric (mean ± std over
    seeds, secondary metrics too), and the comparison with the baseline; the baseline's row and each ``--select``
    group's choice are marked."""
    chosen = {c.chosen: c.selection.group for c in choices if c.chosen}
    base_lengths = plan.variant(plan.settings.baseline).lengths
    places = _places(plan, summaries)
    rows = []
    for s in summaries:
        p = s.planned
        madds = human(p.madds) + ("" if p.lengths == base_lengths else f" @ {'/'.join(map(str, p.lengths))}")
        marked = s.name == plan.settings.baseline and s.name != "baseline"
        label = s.name + (" (baseline)" if marked else "") + (f" (chosen for {chosen[s.name]})"
                                                              if s.name in chosen else "")
        rows.append([label, human(p.parameters), madds, f"{len(s.finished())}/{len(s.runs)}",
                     mean_pm(s.valid, plan.task.decimals), mean_pm(s.test, plan.task.decimals),
                     *(mean_pm(s.extra[m]) for m in extra_metrics(plan)), *comparison_cells(s.comparison, places)])
    return rows


# -- what won, in words -----------------------------------------------------------------------------------------
_PHRASES = {"better": "is **better** than", "worse": "is **worse** than", "equivalent": "is **equivalent** to",
            "undecided": "is **undecided** against", "no verdict": "gets **no verdict** against"}


def _ratio(value: Optional[float], base: Optional[float]) -> Optional[float]:
    return value / base if value is not None and base else None


def train_seconds(s: VariantSummary) -> Optional[float]:
    """The mean measured training time of the variant's finished runs (``train_minutes`` of results.json)."""
    minutes = [r.results["train_minutes"] for r in s.finished()
               if isinstance(r.results.get("train_minutes"), (int, float))]
    return 60 * sum(minutes) / len(minutes) if minutes else None


def cost_words(s: VariantSummary, base: VariantSummary) -> str:
    """The variant's cost relative to the baseline's: parameters, MAdds, measured training throughput and time."""
    parts = [f"{_ratio(s.planned.parameters, base.planned.parameters):.0%} of the parameters",
             f"{_ratio(s.planned.madds, base.planned.madds):.0%} of the MAdds"]
    speed = speed_ratio_text(s, base, " the measured training throughput")
    parts.append("throughput not measured" if speed == "–" else speed)
    seconds = train_seconds(s)
    if seconds is not None:
        parts.append(f"{seconds:.0f} s of training per run (measured)")
    return ", ".join(parts)


def verdict_lines(plan: Plan, summaries: list[VariantSummary]) -> list[str]:
    """What won, one sentence per variant: the verdict, the difference with its interval, the cost beside it."""
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    places = _places(plan, summaries)
    lines = []
    for s in summaries:
        c = s.comparison
        if c is None:
            continue
        test = f" ({TEST_TITLES[c.test]})" if c.test and c.delta is not None else ""
        lines.append(f"**{s.name}** {_PHRASES[c.verdict]} {base.name}: Δ test {plan.task.metric} "
                     f"{delta_text(c, places)}{test}" + (f"; {c.reason}" if c.reason else "")
                     + f"; {cost_words(s, base)}.")
    return lines


def still_falling(curves: Sequence[Sequence[tuple[float, float]]], higher_is_better: bool) -> Optional[bool]:
    """Whether the mean learning curve's last quarter (of its x range) brought more than :data:`STEEP_SHARE` of its
    improvement since the first validation: training had not levelled off when the budget ended. Any number of
    validations from two on is read (between two validations the curve is taken as straight, so two or three that
    still fall are still learning); None with one (or none): whether the curve had levelled off cannot be told."""
    mean = plots.mean_curve(curves)
    if mean is None or len(mean[0]) < 2:
        return None
    x, y = mean[0], mean[1] if higher_is_better else -mean[1]
    total = y[-1] - y[0]
    last = y[-1] - float(np.interp(x[-1] - 0.25 * (x[-1] - x[0]), x, y))
    return bool(total > 0 and last > STEEP_SHARE * total)


def steep_warning(plan: Plan, summaries: list[VariantSummary]) -> Optional[str]:
    """The still-learning warning: the variants whose curves still fell steeply at the end, and those validated
    only once (which cannot show that they had levelled off)."""
    falling = {s.name: still_falling([r.curve for r in s.runs], plan.task.higher_is_better) for s in summaries
               if any(r.curve for r in s.runs)}
    steep = [name for name, value in falling.items() if value]
    once = [name for name, value in falling.items() if value is None]
    if not steep and not once:
        return None
    parts = ([f"The validation curves of {', '.join(steep)} were still falling steeply when the budget ended (the "
              f"last quarter brought more than {STEEP_SHARE:.0%} of the improvement since the first validation)"]
             if steep else [])
    parts += ([f"{', '.join(once)} validated only once per run, so whether training had levelled off cannot be "
               "told (raise the validations: data.eval_interval for lm)"] if once else [])
    return ("**Warning: still learning.** " + "; ".join(parts) + ": the verdicts may describe early training, not "
            "trained models; a larger budget may change them.")


# -- writing --------------------------------------------------------------------------------------------------
@dataclass
class Report:
    """What ``write_report`` wrote and what the command prints: the tables, the files, the figures and notes, the
    verdicts and warnings, the ``--select`` choices."""

    table: str  # the comparison table (Markdown pipe format, as printed)
    cost: str  # measured throughput and memory per variant (Markdown, printed after the table)
    markdown: Path
    html: Path
    pictures: list[plots.Picture]
    notes: list[str]
    complete: bool
    chosen: list[str] = field(default_factory=list)  # one line per --select group
    verdicts: list[str] = field(default_factory=list)  # what won, one sentence per variant
    warning: Optional[str] = None  # the curves were still falling steeply
    tests: list[str] = field(default_factory=list)  # which test each comparison used, and why
    tables: list[Path] = field(default_factory=list)  # the results table as CSV and LaTeX


def _header_lines(plan: Plan, command: list[str], complete: bool, summaries: list[VariantSummary]) -> list[str]:
    s = plan.settings
    missing = [r.name for v in summaries for r in v.runs if r.state != "finished"]
    compute = budget_text(s)
    if compute:
        budget = compute
    elif s.budget_minutes:
        budget = f"{s.budget_minutes:g} min of training per run (validation excluded)"
    elif "train.max_steps" in s.sets:
        budget = f"{s.sets['train.max_steps']} optimiser steps per run"
    else:
        budget = "the task's epoch limits (no time budget)"
    lines = [f"Task **{s.task}**, {len(plan.variants)} variants x {len(s.seeds)} seed(s) (seeds "
             f"{', '.join(map(str, s.seeds))}), budget: {budget}. Baseline: **{s.baseline}**.",
             f"Command: {md_code(' '.join(command))}",
             f"Metric: test {plan.task.metric} of each run's `best/` model (chosen on validation "
             f"{plan.task.metric}; {'higher' if plan.task.higher_is_better else 'lower'} is better)."]
    if s.sets:
        lines.append("Settings for every variant: " + ", ".join(md_code(f"{k}={v}") for k, v in s.sets.items()) + ".")
    if not complete:
        lines.insert(0, f"**Partial report**: {len(missing)} run(s) not finished ({', '.join(missing)}); run the "
                        "same command again to continue.")
    return lines


def _explanations(plan: Plan, margin: Optional[float], effect: Optional[float]) -> list[str]:
    base = plan.variant(plan.settings.baseline)
    return [f"MAdds: multiply-adds of one forward pass at {base.length_label}.",
            f"Throughput: training {plan.task.units} per second, each run's mean of the logged windows of train.csv,"
            " mean ± std over the seeds; x baseline: the ratio of the means, and in brackets the lowest and highest "
            "ratio of a run to the baseline's run of the same seed (compare them only between runs on the same "
            "machine and load).",
            "Peak memory: growth of the run process's maximum resident set size (ru_maxrss) from the start of the "
            "run, libraries already loaded, to its end (the largest over resumed segments).",
            f"Verdicts: {rule(margin, effect)} {SEED_SHARES} Both tests assume roughly normal results over seeds "
            "(docs/compare.md). The intervals are per variant: one that just excludes 0 may still be undecided after "
            "Holm's correction.",
            f"Detectable Δ: the smallest difference these seeds would find with power {POWER} at the spread observed "
            "(of the per-seed differences for the paired test, the pooled standard deviation for Welch's) and at "
            "the level of the variant's Holm step (α/m for the smallest p of m, ... α for the largest)."]


def _variant_lines(plan: Plan) -> list[str]:
    out = []
    for v in plan.variants:
        sets = ", ".join(f"{k}={json.dumps(x)}" for k, x in v.own.items()) or "none"
        out.append(f"**{v.variant.name}**: {v.variant.description} (preset `{v.variant.preset}`; overrides {sets})")
    return out


@dataclass(frozen=True)
class Opening:
    """The top of the report: what won (an introduction, which test and why, one sentence per variant, the
    still-learning warning) and the environment."""

    intro: str
    tests: list[str]
    verdicts: list[str]
    warning: Optional[str]
    environment: list[str]


def opening(plan: Plan, summaries: list[VariantSummary], margin: Optional[float],
            env: Optional[Environment]) -> Opening:
    """The top of the report: what the verdicts are about (metric, direction, baseline, seeds, margin), which test each
    comparison used, one sentence per variant, the still-learning warning, and the environment (``env``; none when the
    report is written outside a compare run)."""
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    seeds = ", ".join(f"{s.name} {len(s.test)}" for s in summaries)
    unit = METRIC_UNITS.get(plan.task.metric)
    better = "higher" if plan.task.higher_is_better else "lower"
    intro = (f"Verdicts on the test {plan.task.metric}" + (f", in {unit}" if unit else "")
             + f" ({better} is better), against **{base.name}**; Δ = variant - {base.name} with its 95% interval; "
             f"finished seeds: {seeds}"
             + (f"; equivalence margin ±{margin:g}" if margin is not None else "; no equivalence margin (--margin)")
             + ".")
    environment_lines = env.lines() if env is not None else [
        "not recorded: this report was written outside a compare run"]
    return Opening(intro, test_lines({s.name: s.comparison for s in summaries if s.comparison is not None}),
                   verdict_lines(plan, summaries), steep_warning(plan, summaries), environment_lines)


def _differences_caption(plan: Plan) -> str:
    return (f"Each seed's test {plan.task.metric} of the baseline and each variant's difference to it (variant - "
            f"{plan.settings.baseline}, the same seed): the paired t-test's data. Its mean is the table's Δ, and its "
            "standard deviation the spread behind the interval, the p-value and the detectable Δ (for a variant that "
            "missed a seed, over the seeds both finished; its test is then Welch's, on all its seeds).")


def _markdown(plan: Plan, top: Opening, table: str, differences: str, cost: str, runs: str, lines: list[str],
              pictures: list[plots.Picture], notes: list[str], directory: Path, chosen: list[str],
              margin: Optional[float], effect: Optional[float]) -> str:
    tests = [" ".join(top.tests)] if top.tests else []
    parts = [f"# Comparison on {plan.settings.task}", "## What won", top.intro, *tests,
             "\n".join(f"- {line}" for line in top.verdicts)]
    if top.warning:
        parts.append(top.warning)
    parts += ["## Set-up", "\n\n".join(lines), "## Environment", "\n".join(f"- {e}" for e in top.environment),
              "## Results", table, "### Per-seed differences", _differences_caption(plan), differences,
              f"The tables as CSV (per-seed values included) and LaTeX: {exports.CSV_FILE}, {exports.LATEX_FILE}.",
              "## Measured cost", cost,
              "\n".join(f"- {e}" for e in _explanations(plan, margin, effect))]
    if chosen:
        parts += ["## Chosen on validation", "\n".join(f"- {line}" for line in chosen)]
    parts += ["## Variants", "\n".join(f"- {line}" for line in _variant_lines(plan)), "## Figures"]
    for picture in pictures:
        parts.append(f"### {picture.title}\n\n![{picture.title}]({picture.path.relative_to(directory).as_posix()})"
                     f"\n\n{picture.caption}")
    if notes:
        parts.append("## Notes\n\n" + "\n".join(f"- {note}" for note in notes))
    parts.append("## Runs\n\n" + runs)
    return "\n\n".join(parts) + "\n"


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left}th{background:#f3f3f3}figure{margin:2em 0}img{max-width:100%}"
        "figcaption{color:#555;font-size:14px}code{background:#f3f3f3;padding:1px 3px}"
        ".warning{background:#fff4e5;border-left:4px solid #e69500;padding:6px 10px}")


# Markdown's special characters, and HTML's: a backslash makes each literal (CommonMark escapes any ASCII punctuation)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>|#~&!])")


def md_text(text: str) -> str:
    """``text`` (a --select group, a variant or run name) as literal Markdown: ``<script>`` stays text, a backtick
    opens no code span, a ``|`` splits no table cell (the Markdown counterpart of ``html.escape``)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def md_code(text: str) -> str:
    """``text`` as one Markdown code span whatever backticks it holds: the fence is one backtick longer than its
    longest run of them (CommonMark), padded with spaces when the text starts or ends with one."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _inline_markdown(text: str) -> str:
    """The header lines' ``**bold**`` and code spans (:func:`md_code`) as HTML, everything else escaped."""
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"(`+) ?(.+?) ?\1(?!`)", r"<code>\2</code>", escaped)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)


def _bullets(items: Sequence[str]) -> str:
    return "<ul>" + "".join(f"<li>{_inline_markdown(item)}</li>" for item in items) + "</ul>"


def _html(plan: Plan, top: Opening, summaries: list[VariantSummary], lines: list[str], pictures: list[plots.Picture],
          notes: list[str], choices: Sequence[Choice], margin: Optional[float], effect: Optional[float]) -> str:
    figures_html = []
    for picture in pictures:
        data = base64.b64encode(picture.path.read_bytes()).decode("ascii")
        figures_html.append(f"<figure><h3>{html.escape(picture.title)}</h3><img alt=\"{html.escape(picture.title)}"
                            f"\" width=\"{picture.size[0]}\" height=\"{picture.size[1]}\" "
                            f"src=\"data:image/png;base64,{data}\"><figcaption>{html.escape(picture.caption)}"
                            "</figcaption></figure>")
    body = [f"<h1>Comparison on {html.escape(plan.settings.task)}</h1>", "<h2>What won</h2>",
            f"<p>{_inline_markdown(top.intro)}</p>",
            *([f"<p>{_inline_markdown(' '.join(top.tests))}</p>"] if top.tests else []), _bullets(top.verdicts),
            *([f"<p class=\"warning\">{_inline_markdown(top.warning)}</p>"] if top.warning else []),
            "<h2>Set-up</h2>", *(f"<p>{_inline_markdown(line)}</p>" for line in lines),
            "<h2>Environment</h2>", _bullets(top.environment), "<h2>Results</h2>",
            _html_table(headers(plan), table_rows(plan, summaries, choices)), "<h3>Per-seed differences</h3>",
            f"<p>{html.escape(_differences_caption(plan))}</p>",
            _html_table(difference_headers(plan, summaries), difference_rows(plan, summaries)),
            "<h2>Measured cost</h2>", _html_table(cost_headers(plan), cost_rows(summaries, plan.settings.baseline)),
            *([_html_table(COMPUTE_HEADERS, rows), f"<p>{_inline_markdown(COMPUTE_NOTE)}</p>"]
              if (rows := compute_rows(plan, summaries)) else []),
            _bullets(_explanations(plan, margin, effect))]
    if choices:
        body.append("<h2>Chosen on validation</h2><ul>" + "".join(
            f"<li>{_inline_markdown(line)}</li>" for line in choice_lines(choices, plan.task.metric)) + "</ul>")
    body += ["<h2>Variants</h2><ul>" + "".join(f"<li>{_inline_markdown(v)}</li>" for v in _variant_lines(plan))
            + "</ul>", "<h2>Figures</h2>", *figures_html]
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    body += ["<h2>Runs</h2>", _html_table(RUN_HEADERS, run_rows(plan, summaries))]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>interlayer compare: "
            f"{html.escape(plan.settings.task)}</title><style>{_CSS}</style></head><body>{''.join(body)}"
            "</body></html>\n")


def _comparison_json(c: Optional[Comparison]) -> dict[str, Any]:
    if c is None:
        return {"comparison": None}
    return {"comparison": {"delta": c.delta, "ci95": list(c.interval) if c.interval else None, "p": c.p,
                           "p_holm": c.p_holm, "p_equivalence_holm": c.p_equivalence_holm,
                           "detectable_delta": c.detectable, "target_delta": c.target,
                           "seeds_for_target": c.seeds_for_target, "verdict": c.verdict, "reason": c.reason,
                           "test": c.test, "test_note": c.test_note, "welch_p": c.welch_p,
                           "welch_p_holm": c.welch_p_holm, "alpha_holm_step": c.alpha}}


def _summary_json(plan: Plan, summaries: list[VariantSummary], choices: Sequence[Choice], margin: Optional[float],
                  effect: Optional[float], top: Opening) -> dict[str, Any]:
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    out = {"task": plan.settings.task, "metric": plan.task.metric, "baseline": plan.settings.baseline,
           "rule": rule(margin, effect), "margin": margin, "effect": effect, "environment": top.environment,
           "still_learning_warning": top.warning, "tests": top.tests, "variants": {},
           "selections": {c.selection.group: {"candidates": list(c.selection.candidates), "valid_means": c.valid,
                                              "chosen": c.chosen, "missing_runs": list(c.missing)}
                          for c in choices}}
    for s in summaries:
        test_mean, test_std = mean_std(s.test)
        valid_mean, valid_std = mean_std(s.valid)
        out["variants"][s.name] = {
            "parameters": s.planned.parameters, "madds": s.planned.madds, "madds_lengths": s.planned.lengths,
            "units_per_s": s.speed, "units_per_s_by_seed": {str(k): v for k, v in s.speeds.items()},
            "peak_rss_growth_mb": s.memory, "finished_runs": len(s.finished()), "runs": len(s.runs), "test": s.test,
            "test_by_seed": {str(k): v for k, v in s.test_by_seed.items()},
            "differences_by_seed": {} if s is base else {str(k): v for k, v in seed_differences(s, base).items()},
            "test_mean": test_mean,
            "test_std": test_std, "valid": s.valid, "valid_mean": valid_mean, "valid_std": valid_std,
            **{f"test_{m}": v for m, v in s.extra.items()},
            **_comparison_json(s.comparison)}
    return out


def write_report(plan: Plan, output: Path, command: list[str], selections: Sequence[Selection] = (),
                 margin: Optional[float] = None, env: Optional[Environment] = None,
                 effect: Optional[float] = None) -> Report:
    """Write ``report.md``, ``report.html`` (figures embedded), ``summary.json``, ``report.csv``, ``report.tex`` and
    ``figures/`` into ``output``; ``selections`` are the ``--select`` groups, decided on validation
    (:mod:`.selection`); ``margin`` the equivalence margin (``--margin``, in the metric's units); ``env`` what
    produced the runs (:func:`~interlayer.compare.environment.comparison_environment`); ``effect`` the smallest
    difference of interest (``--effect``) that an undecided verdict plans seeds for."""
    output = Path(output)
    summaries = summarize(plan, output, margin, effect)
    top = opening(plan, summaries, margin, env)
    complete = all(r.state == "finished" for s in summaries for r in s.runs)
    choices = [choose(selection, summaries, plan.task.higher_is_better) for selection in selections]
    pictures, notes = figures(plan, summaries, output / FIGURES)
    table = format_table(headers(plan), table_rows(plan, summaries, choices))
    cost = format_table(cost_headers(plan), cost_rows(summaries, plan.settings.baseline))
    compute = compute_rows(plan, summaries)  # the FLOPs and tokens each run trained, where the task's steps fix them
    if compute:
        cost += f"\n\n{format_table(COMPUTE_HEADERS, compute)}\n\n{COMPUTE_NOTE}"
    runs = format_table(RUN_HEADERS, run_rows(plan, summaries))
    md_differences = format_table([md_text(h) for h in difference_headers(plan, summaries)],
                                  difference_rows(plan, summaries))
    lines = _header_lines(plan, command, complete, summaries)
    markdown = output / "report.md"
    # report.md gets the group names escaped, as report.html gets them through html.escape
    md_choices = [dataclasses.replace(c, selection=dataclasses.replace(c.selection, group=md_text(c.selection.group)))
                  for c in choices]
    md_table = format_table(headers(plan), [[md_text(str(cell)) for cell in row]
                                            for row in table_rows(plan, summaries, choices)])
    write_atomic(markdown, _markdown(plan, top, md_table, md_differences, cost, runs, lines, pictures, notes, output,
                                     choice_lines(md_choices, plan.task.metric), margin, effect))
    page = output / "report.html"
    write_atomic(page, _html(plan, top, summaries, lines, pictures, notes, choices, margin, effect))
    write_atomic(output / "summary.json", json.dumps(_summary_json(plan, summaries, choices, margin, effect, top),
                                                     indent=2) + "\n")
    compact = exports.compact_table(plan, summaries, _places(plan, summaries), extra_metrics(plan))
    tables = exports.write_tables(output, compact, exports.csv_rows(plan, summaries), plan.settings.task)
    return Report(table, cost, markdown, page, pictures, notes, complete, choice_lines(choices, plan.task.metric),
                  top.verdicts, top.warning, top.tests, tables)
