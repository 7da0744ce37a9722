"""The comparison report: a table as the papers print them, the figures, and what every run did.

Everything is read back from the run directories (``results.json``, ``train.csv``, ``valid.csv``,
``compare_memory.json``, the ``best/`` models) and ``compare.json``, so a report can be written at any time,
also for an interrupted comparison (it then says which runs are missing).

Columns: parameters (each tensor once) and MAdds of one forward pass at the task's typical length (see
:func:`interlayer.compare.plan.typical_lengths`), training throughput (mean of the logged windows), peak memory
(growth of the run process's maximum RSS from its start), the best validation metric and the test metric of the
run's ``best/`` model as mean ± sample std over seeds, and the difference of the test mean to the baseline with
the verdict of :data:`interlayer.compare.stats.RULE`.
"""
from __future__ import annotations

import base64
import csv
import dataclasses
import functools
import html
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ..checkpoint import CheckpointError, load_pretrained
from ..config import dataclass_from_dict
from ..fileio import write_atomic
from ..tables import format_table, human
from ..training.config import TrainConfig
from . import plots
from .child import MEMORY_FILE, DamagedResults, read_results
from .plan import Plan, PlannedVariant
from .runner import RUNS, STATUS_FILE, run_name
from .selection import Choice, Selection, choice_lines, choose
from .stats import RULE, Difference, difference, mean_std

FIGURES = "figures"


@dataclass
class RunRecord:
    variant: str
    seed: int
    run_dir: Path
    state: str  # finished | interrupted | failed | not started
    results: dict[str, Any] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (training minutes, validation metric)
    best_valid: Optional[float] = None
    speed: Optional[float] = None
    memory: Optional[float] = None  # MiB, growth of ru_maxrss
    detail: str = ""

    @property
    def name(self) -> str:
        return run_name(self.variant, self.seed)


@dataclass
class VariantSummary:
    planned: PlannedVariant
    runs: list[RunRecord]
    test: list[float]
    valid: list[float]
    speed: Optional[float]
    memory: Optional[float]
    difference: Optional[Difference] = None
    extra: dict[str, list[float]] = field(default_factory=dict)  # secondary test metrics (MRPC's F1, chrF)

    @property
    def name(self) -> str:
        return self.planned.variant.name

    def finished(self) -> list[RunRecord]:
        return [r for r in self.runs if r.state == "finished"]


# -- reading the runs -----------------------------------------------------------------------------------------
def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def _number(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def csv_curve(path: Path, x_key: str, y_key: str) -> list[tuple[float, float]]:
    points = []
    for row in _read_csv(path):
        x, y = _number(row.get(x_key)), _number(row.get(y_key))
        if x is not None and y is not None:
            points.append((x, y))
    return points


def curve_axis(plan: Plan) -> tuple[str, str]:
    """The learning curves' x (a ``valid.csv`` column, an axis label): training minutes under a time budget,
    optimiser steps otherwise, which do not depend on the machine's load."""
    if plan.settings.budget_minutes:
        return "elapsed_min", "training minutes (validation excluded)"
    return "step", "optimiser steps"


def read_run(plan: Plan, output: Path, variant: str, seed: int, status: dict[str, Any]) -> RunRecord:
    run_dir = output / RUNS / run_name(variant, seed)
    record = RunRecord(variant, seed, run_dir, "not started")
    metric, higher = plan.task.metric, plan.task.higher_is_better
    record.curve = csv_curve(run_dir / "valid.csv", curve_axis(plan)[0], metric)
    if record.curve:
        values = [y for _, y in record.curve]
        record.best_valid = max(values) if higher else min(values)
    speeds = [s for s in (_number(r.get("units_per_s")) for r in _read_csv(run_dir / "train.csv")) if s is not None]
    record.speed = sum(speeds) / len(speeds) if speeds else None
    if (run_dir / MEMORY_FILE).is_file():
        record.memory = max(s["peak_rss_growth_mb"] for s in json.loads((run_dir / MEMORY_FILE).read_text()))
    try:
        results = read_results(run_dir)
    except DamagedResults as err:
        results, record.detail = None, (f"{err}; counted as unfinished: the same compare command scores it "
                                        "again")
    if results is not None:
        record.state, record.results = "finished", results
    elif status.get(record.name, {}).get("status") == "failed":
        record.state, record.detail = "failed", status[record.name].get("detail", "")
    elif (run_dir / "run.json").is_file():
        record.state = "interrupted"
    return record


def extra_metrics(plan: Plan) -> tuple[str, ...]:
    """The task's secondary test metrics, reported beside its main one (e.g. MRPC's F1, translation's chrF)."""
    return plan.task.extra_metrics


def _test_values(runs: list[RunRecord], metric: str) -> list[float]:
    return [float(r.results[f"test_{metric}"]) for r in runs
            if isinstance(r.results.get(f"test_{metric}"), (int, float))]


def summarize(plan: Plan, output: Path) -> list[VariantSummary]:
    status_path = output / STATUS_FILE
    status = json.loads(status_path.read_text()) if status_path.is_file() else {}
    summaries = []
    for planned in plan.variants:
        runs = [read_run(plan, output, planned.variant.name, seed, status) for seed in plan.settings.seeds]
        done = [r for r in runs if r.state == "finished"]
        test = _test_values(done, plan.task.metric)
        valid = [r.best_valid for r in done if r.best_valid is not None]
        speeds = [r.speed for r in runs if r.speed is not None]
        memories = [r.memory for r in runs if r.memory is not None]
        summaries.append(VariantSummary(planned, runs, test, valid, sum(speeds) / len(speeds) if speeds else None,
                                        max(memories) if memories else None,
                                        extra={m: _test_values(done, m) for m in extra_metrics(plan)}))
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    for summary in summaries:
        if summary is not base:
            summary.difference = difference(summary.test, base.test)
    return summaries


# -- the table ------------------------------------------------------------------------------------------------
def decimals(value: float) -> int:
    """Digits after the point: 1 from 100 up, 2 from 1 up (BLEU, percentages), 4 below (fractions)."""
    return 1 if abs(value) >= 100 else 2 if abs(value) >= 1 else 4


def fmt(value: Optional[float], places: Optional[int] = None) -> str:
    if value is None:
        return "–"
    return f"{value:.{decimals(value) if places is None else places}f}"


def mean_pm(values: list[float], places: Optional[int] = None) -> str:
    """``mean ± std (n=k)``, the std with the mean's decimals (``places``, or by the mean's size)."""
    mean, std = mean_std(values)
    if mean is None:
        return "–"
    places = decimals(mean) if places is None else places
    return fmt(mean, places) + (f" ± {fmt(std, places)}" if std is not None else "") + f" (n={len(values)})"


def headers(plan: Plan) -> list[str]:
    """The results table: what the runs' settings and seeds decide (measured speed and memory are in
    :func:`cost_rows`), so under a step budget the same command prints the same table on any load."""
    metric = plan.task.metric
    base = plan.variant(plan.settings.baseline)
    return ["variant", "parameters", f"MAdds @ {'/'.join(map(str, base.lengths))}", "runs", f"valid {metric}",
            f"test {metric}", *(f"test {m}" for m in extra_metrics(plan)), "Δ test", "beyond seed spread"]


def cost_headers(plan: Plan) -> list[str]:
    return ["variant", f"training {plan.task.units}/s", "peak MiB"]


def cost_rows(summaries: list[VariantSummary]) -> list[list[str]]:
    """Throughput and memory as measured (they depend on the machine and its load)."""
    return [[s.name, "–" if s.speed is None else f"{s.speed:,.0f}", "–" if s.memory is None else f"{s.memory:,.0f}"]
            for s in summaries]


def table_rows(plan: Plan, summaries: list[VariantSummary], choices: Sequence[Choice] = ()) -> list[list[str]]:
    chosen = {c.chosen: c.selection.group for c in choices if c.chosen}
    base_lengths = plan.variant(plan.settings.baseline).lengths
    base_test = mean_std(next(s.test for s in summaries if s.name == plan.settings.baseline))[0]
    places = plan.task.decimals or (decimals(base_test) if base_test is not None else 2)
    rows = []
    for s in summaries:
        p = s.planned
        madds = human(p.madds) + ("" if p.lengths == base_lengths else f" @ {'/'.join(map(str, p.lengths))}")
        delta = s.difference.delta if s.difference else None
        marked = s.name == plan.settings.baseline and s.name != "baseline"
        label = s.name + (" (baseline)" if marked else "") + (f" (chosen for {chosen[s.name]})"
                                                              if s.name in chosen else "")
        rows.append([label, human(p.parameters), madds, f"{len(s.finished())}/{len(s.runs)}",
                     mean_pm(s.valid, plan.task.decimals), mean_pm(s.test, plan.task.decimals),
                     *(mean_pm(s.extra[m]) for m in extra_metrics(plan)),
                     "–" if delta is None else f"{delta:+.{places}f}",
                     s.difference.verdict if s.difference else "–"])
    return rows


def run_rows(summaries: list[VariantSummary], metric: str) -> list[list[str]]:
    rows = []
    for s in summaries:
        for r in s.runs:
            res = r.results
            rows.append([r.name, r.state + (f": {r.detail}" if r.detail else ""), str(res.get("epochs", "–")),
                         str(res.get("steps", "–")), fmt(res.get("train_minutes")), res.get("stop_reason", "–"),
                         fmt(r.best_valid), fmt(res.get(f"test_{metric}"))])
    return rows


RUN_HEADERS = ["run", "status", "epochs", "steps", "train min", "stop reason", "best valid", "test"]


# -- figures --------------------------------------------------------------------------------------------------
def _section(model: dict[str, Any], name: str) -> dict[str, Any]:
    """A method section of a Transformer config (or of a vision model's encoder); {} when off or absent (GAT's
    ``crossformer`` is a plain string, not a section)."""
    encoder = model["encoder"] if isinstance(model.get("encoder"), dict) else model
    section = encoder.get(name)
    return section if isinstance(section, dict) else {}


def load_run_task(plan: Plan, run_dir: Path) -> Any:
    """The task of a finished run, with the run's own assets (its vocabulary), as a resumed run builds it."""
    stored = json.loads((run_dir / "run.json").read_text())
    train_cfg = dataclass_from_dict(TrainConfig, stored["train"], "train.")
    data_cfg = dataclass_from_dict(plan.spec.data_class, stored["data"], "data.")
    return plan.spec.make_task(data_cfg, train_cfg, run_dir)


def _best_model(summary: VariantSummary) -> tuple[Optional[RunRecord], Any]:
    for record in summary.finished():
        try:
            return record, load_pretrained(record.run_dir / "best").eval()
        except (CheckpointError, FileNotFoundError):
            continue
    return None, None


@torch.no_grad()
def encoder_attentions(model: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Optional[torch.Tensor]]:
    """Every encoder layer's attention intermediates for one input (``need_intermediates=True``); nothing for a
    model without them (the CNN baseline, GAT)."""
    if "need_intermediates" not in inspect.signature(model.forward).parameters:
        return [], None
    output = model(*args, **kwargs, need_intermediates=True)
    encoder = getattr(output, "encoder", None)
    return list(getattr(encoder, "attentions", None) or []), getattr(encoder, "padding_mask", None)


def head_mean_probs(logits: torch.Tensor, padding_mask: Optional[torch.Tensor], causal: bool = False) -> np.ndarray:
    """Softmax over keys of (1, H, T, T) logits, padded keys (and with ``causal`` later keys) excluded, averaged
    over heads -> (T, T)."""
    x = logits[0].float()
    if padding_mask is not None:
        x = x.masked_fill(padding_mask[0][None, None, :], float("-inf"))
    if causal:
        t = x.shape[-1]
        x = x.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(x, dim=-1).mean(0).numpy()


def _baseline_attentions(plan: Plan, baseline: VariantSummary, summary: VariantSummary, tokens: list[str]
                         ) -> list[Any]:
    """The baseline's encoder attentions for the same sample (read with the baseline run's own vocabulary, and
    used only if it yields the same tokens); empty when there is no such model or it has no attention maps."""
    record, model = _best_model(baseline) if baseline is not summary else (None, None)
    sample = plan.spec.sample_input(load_run_task(plan, record.run_dir)) if model is not None else None
    if sample is None:
        return []
    args, kwargs, base_tokens = sample
    return encoder_attentions(model, args, kwargs)[0] if list(base_tokens) == list(tokens) else []


def _pa_picture(plan: Plan, summary: VariantSummary, baseline: VariantSummary, path: Path
                ) -> tuple[Optional[plots.Picture], str]:
    name = summary.name
    record, model = _best_model(summary)
    if model is None:
        return None, f"PA attention maps of {name}: skipped, no finished run with a best/ model yet."
    sample = plan.spec.sample_input(load_run_task(plan, record.run_dir))
    if sample is None:
        return None, f"PA attention maps of {name}: skipped, task {plan.spec.name!r} offers no sample input " \
                     "(TaskSpec.sample_input)."
    args, kwargs, tokens = sample
    attentions, mask = encoder_attentions(model, args, kwargs)
    layers = [i for i, a in enumerate(attentions) if a is not None and "predicted" in a.extras]
    if not layers:
        return None, f"PA attention maps of {name}: skipped, the model returned no predicted attention maps."
    base_attentions = _baseline_attentions(plan, baseline, summary, tokens)
    causal = getattr(getattr(model, "encoder", None), "causal", False)  # a language model attends backwards only
    rows = []
    for i in sorted({layers[0], layers[-1]}):
        att = attentions[i]
        maps = []
        base = base_attentions[i] if i < len(base_attentions) else None
        if base is not None and base.logits.shape[-2:] == att.logits.shape[-2:]:  # the same tokens
            maps.append((f"{baseline.name} (baseline)", head_mean_probs(base.logits, mask, causal)))
        maps += [("PA combined (Eq. 4)", head_mean_probs(att.logits, mask, causal)),
                 ("CNN-predicted", head_mean_probs(att.extras["predicted"], mask, causal)),
                 ("self-attention", head_mean_probs(att.extras["self"], mask, causal))]
        rows.append((f"layer {i + 1}", maps))
    caption = (f"{name} ({record.name}): attention maps of the sample input, mean over heads. Columns as PA Fig. 8: "
               "the baseline's map (when it has one), the combined map softmax(alpha CNN(A_prev) + (1-alpha) A), the"
               " CNN prediction and the layer's own self-attention; rows: the first predicting layer and the last.")
    return plots.attention_maps(rows, tokens, f"PA attention maps: {name}", path, caption), ""


def _mpt_picture(summary: VariantSummary, path: Path) -> tuple[Optional[plots.Picture], str]:
    panels = []
    for record in summary.finished():
        try:
            model = load_pretrained(record.run_dir / "best")
        except (CheckpointError, FileNotFoundError):
            continue
        weights = model.encoder.connection_weights().numpy()
        for t, matrix in enumerate(weights):
            label = f"{record.name}" + (f", pass {t + 1} -> {t + 2}" if len(weights) > 1 else "")
            panels.append((label, matrix))
    if not panels:
        return None, f"MPT soft-connection weights of {summary.name}: skipped, no finished run with a best/ model yet."
    return plots.soft_connections(panels[:4], f"MPT soft connections: {summary.name}", path), ""


def figures(plan: Plan, summaries: list[VariantSummary], directory: Path) -> tuple[list[plots.Picture], list[str]]:
    """Every figure that applies, and a one-line note for each that applies but could not be drawn."""
    pictures, notes = [], []
    baseline = next(s for s in summaries if s.name == plan.settings.baseline)
    curves = plots.learning_curves({s.name: [r.curve for r in s.runs] for s in summaries}, plan.task.metric,
                                   baseline.name, directory / "learning_curves.png", curve_axis(plan)[1])
    if curves is None:
        notes.append("Learning curves: skipped, no run has validated yet.")
    else:
        pictures.append(curves)
    names = [s.name for s in summaries]
    units = plan.task.units
    pictures.append(plots.cost_bars(names, [
        ("parameters", [float(s.planned.parameters) for s in summaries]),
        (f"MAdds @ {'/'.join(map(str, baseline.planned.lengths))}", [float(s.planned.madds) for s in summaries]),
        (f"training {units}/s", [s.speed for s in summaries]),
        ("peak memory growth (MiB)", [s.memory for s in summaries])], baseline.name, directory / "cost.png"))
    sg = {s.name: [csv_curve(r.run_dir / "train.csv", "step", "crossformer_sg") for r in s.runs] for s in summaries
          if _section(s.planned.model, "crossformer").get("soft")}
    if sg:
        picture = plots.sg_curves(sg, directory / "crossformer_sg.png")
        if picture is None:
            notes.append("Crossformer-SG regulariser: skipped, no logged training step yet.")
        else:
            pictures.append(picture)
    for s in summaries:
        wanted: list[tuple[str, Callable[[], tuple[Optional[plots.Picture], str]]]] = []
        if _section(s.planned.model, "predictive"):
            wanted.append(("PA attention maps", functools.partial(
                _pa_picture, plan, s, baseline, directory / f"pa_attention_{s.name}.png")))
        if _section(s.planned.model, "multipass").get("connection") == "soft":
            wanted.append(("MPT soft-connection weights", functools.partial(
                _mpt_picture, s, directory / f"mpt_soft_{s.name}.png")))
        for title, draw in wanted:
            try:
                picture, note = draw()
            except Exception as err:  # a picture must not cost the report of finished runs
                picture, note = None, f"{title} of {s.name}: could not be drawn ({type(err).__name__}: {err})."
            if picture is not None:
                pictures.append(picture)
            if note:
                notes.append(note)
    return pictures, notes


# -- writing --------------------------------------------------------------------------------------------------
@dataclass
class Report:
    table: str  # the comparison table (Markdown pipe format, as printed)
    cost: str  # measured throughput and memory per variant (Markdown, printed after the table)
    markdown: Path
    html: Path
    pictures: list[plots.Picture]
    notes: list[str]
    complete: bool
    chosen: list[str] = field(default_factory=list)  # one line per --select group


def _header_lines(plan: Plan, command: list[str], complete: bool, summaries: list[VariantSummary]) -> list[str]:
    s = plan.settings
    missing = [r.name for v in summaries for r in v.runs if r.state != "finished"]
    if s.budget_minutes:
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


def _explanations(plan: Plan) -> list[str]:
    base = plan.variant(plan.settings.baseline)
    return [f"MAdds: multiply-adds of one forward pass at {base.length_label}.",
            f"Throughput: training {plan.task.units} per second, the mean of the logged windows of train.csv "
            "(compare them only between runs on the same machine and load).",
            "Peak memory: growth of the run process's maximum resident set size (ru_maxrss) from the start of the "
            "run, libraries already loaded, to its end (the largest over resumed segments).",
            f"Significance: {RULE}"]


def _variant_lines(plan: Plan) -> list[str]:
    out = []
    for v in plan.variants:
        sets = ", ".join(f"{k}={json.dumps(x)}" for k, x in v.own.items()) or "none"
        out.append(f"**{v.variant.name}**: {v.variant.description} (preset `{v.variant.preset}`; overrides {sets})")
    return out


def _markdown(plan: Plan, table: str, cost: str, runs: str, lines: list[str], pictures: list[plots.Picture],
              notes: list[str], directory: Path, chosen: list[str]) -> str:
    parts = [f"# Comparison on {plan.settings.task}", "\n\n".join(lines), "## Results", table,
             "## Measured cost", cost, "\n".join(f"- {e}" for e in _explanations(plan))]
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
        "figcaption{color:#555;font-size:14px}code{background:#f3f3f3;padding:1px 3px}")


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


def _html(plan: Plan, summaries: list[VariantSummary], lines: list[str], pictures: list[plots.Picture],
          notes: list[str], choices: Sequence[Choice]) -> str:
    figures_html = []
    for picture in pictures:
        data = base64.b64encode(picture.path.read_bytes()).decode("ascii")
        figures_html.append(f"<figure><h3>{html.escape(picture.title)}</h3><img alt=\"{html.escape(picture.title)}"
                            f"\" width=\"{picture.size[0]}\" height=\"{picture.size[1]}\" "
                            f"src=\"data:image/png;base64,{data}\"><figcaption>{html.escape(picture.caption)}"
                            "</figcaption></figure>")
    body = [f"<h1>Comparison on {html.escape(plan.settings.task)}</h1>",
            *(f"<p>{_inline_markdown(line)}</p>" for line in lines), "<h2>Results</h2>",
            _html_table(headers(plan), table_rows(plan, summaries, choices)), "<h2>Measured cost</h2>",
            _html_table(cost_headers(plan), cost_rows(summaries)),
            "<ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in _explanations(plan)) + "</ul>"]
    if choices:
        body.append("<h2>Chosen on validation</h2><ul>" + "".join(
            f"<li>{_inline_markdown(line)}</li>" for line in choice_lines(choices, plan.task.metric)) + "</ul>")
    body += ["<h2>Variants</h2><ul>" + "".join(f"<li>{_inline_markdown(v)}</li>" for v in _variant_lines(plan))
            + "</ul>", "<h2>Figures</h2>", *figures_html]
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    body += ["<h2>Runs</h2>", _html_table(RUN_HEADERS, run_rows(summaries, plan.task.metric))]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>interlayer compare: "
            f"{html.escape(plan.settings.task)}</title><style>{_CSS}</style></head><body>{''.join(body)}"
            "</body></html>\n")


def _summary_json(plan: Plan, summaries: list[VariantSummary], choices: Sequence[Choice]) -> dict[str, Any]:
    out = {"task": plan.settings.task, "metric": plan.task.metric, "baseline": plan.settings.baseline,
           "rule": RULE, "variants": {},
           "selections": {c.selection.group: {"candidates": list(c.selection.candidates), "valid_means": c.valid,
                                              "chosen": c.chosen, "missing_runs": list(c.missing)}
                          for c in choices}}
    for s in summaries:
        test_mean, test_std = mean_std(s.test)
        valid_mean, valid_std = mean_std(s.valid)
        out["variants"][s.name] = {
            "parameters": s.planned.parameters, "madds": s.planned.madds, "madds_lengths": s.planned.lengths,
            "units_per_s": s.speed, "peak_rss_growth_mb": s.memory, "finished_runs": len(s.finished()),
            "runs": len(s.runs), "test": s.test, "test_mean": test_mean, "test_std": test_std, "valid": s.valid,
            "valid_mean": valid_mean, "valid_std": valid_std, **{f"test_{m}": v for m, v in s.extra.items()},
            "delta": s.difference.delta if s.difference else None,
            "beyond_spread": s.difference.exceeds if s.difference else None,
            "verdict": s.difference.verdict if s.difference else None}
    return out


def write_report(plan: Plan, output: Path, command: list[str], selections: Sequence[Selection] = ()) -> Report:
    """Write ``report.md``, ``report.html`` (figures embedded), ``summary.json`` and ``figures/`` into ``output``;
    ``selections`` are the ``--select`` groups, decided on validation (:mod:`.selection`)."""
    output = Path(output)
    summaries = summarize(plan, output)
    complete = all(r.state == "finished" for s in summaries for r in s.runs)
    choices = [choose(selection, summaries, plan.task.higher_is_better) for selection in selections]
    pictures, notes = figures(plan, summaries, output / FIGURES)
    table = format_table(headers(plan), table_rows(plan, summaries, choices))
    cost = format_table(cost_headers(plan), cost_rows(summaries))
    runs = format_table(RUN_HEADERS, run_rows(summaries, plan.task.metric))
    lines = _header_lines(plan, command, complete, summaries)
    markdown = output / "report.md"
    # report.md gets the group names escaped, as report.html gets them through html.escape
    md_choices = [dataclasses.replace(c, selection=dataclasses.replace(c.selection, group=md_text(c.selection.group)))
                  for c in choices]
    md_table = format_table(headers(plan), [[md_text(str(cell)) for cell in row]
                                            for row in table_rows(plan, summaries, choices)])
    write_atomic(markdown, _markdown(plan, md_table, cost, runs, lines, pictures, notes, output,
                                     choice_lines(md_choices, plan.task.metric)))
    page = output / "report.html"
    write_atomic(page, _html(plan, summaries, lines, pictures, notes, choices))
    write_atomic(output / "summary.json", json.dumps(_summary_json(plan, summaries, choices), indent=2) + "\n")
    return Report(table, cost, markdown, page, pictures, notes, complete, choice_lines(choices, plan.task.metric))
