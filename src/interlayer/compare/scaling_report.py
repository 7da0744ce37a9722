"""The scaling sweep's report: every variant's loss against its training compute, the fits, each method's compute
multiplier at every measured size and at the extrapolated one, verdicts in words, and the figures; written as
``report.md``, ``report.html`` (figures embedded), ``report.csv``, ``report.tex``, ``summary.json`` and
``figures/*.png`` in the sweep's directory. Everything is read back from the runs (:mod:`.scaling_analysis`), so a
report can be written at any time, also for an unfinished sweep (it then says which runs are missing).
"""
from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..fileio import write_atomic
from ..tables import format_table, human
from . import exports, scaling_plots
from .budget import flops_text
from .compute import COMPUTE_HEADERS, compute_rows
from .environment import Environment
from .plots import Picture
from .records import METRIC_UNITS, VariantSummary
from .scaling import Sweep, cell_name
from .scaling_analysis import Curve, analyse, sign_of
from .scaling_fit import LEVEL, MIN_SIZES, Multiplier, PowerLawFit, prediction_band

FIGURES = "figures"


# -- words ----------------------------------------------------------------------------------------------------
def times(value: Optional[float]) -> str:
    """``1.32x``; infinite: ``∞``."""
    if value is None:
        return "–"
    return "∞" if math.isinf(value) else f"{value:.3g}x"


def interval_text(m: Multiplier) -> str:
    """``[1.08x, 1.61x]``, an open end written as a bound (``< 0.001x``, ``∞``)."""
    if m.interval is None:
        return "–"
    low = f"< {times(m.interval.low)}" if m.interval.open_low else times(m.interval.low)
    high = "∞" if m.interval.open_high else times(m.interval.high)
    return f"[{low}, {high}]"


def multiplier_cell(m: Multiplier) -> str:
    """The multiplier in a table or a list: the estimate and interval where the interval excludes 1x, the interval
    alone (it spans 1x), or why there is none."""
    if m.verdict == "unsupported":
        return "not supported"
    if m.verdict == "undecided":
        return f"{interval_text(m)} spans 1x"
    return f"{times(m.value)} {interval_text(m)}"


def multiplier_words(m: Multiplier, bold: bool = True) -> str:
    """The multiplier as a claim, or why none is made: the estimate only where its interval excludes 1x."""
    mark = "**" if bold else ""
    if m.verdict == "unsupported":
        reasons = "; ".join(m.problems) or "the fits leave no degree of freedom for the noise"
        return f"no multiplier ({reasons})"
    if m.verdict == "undecided":
        return f"not distinguishable from the baseline (the 95% interval {interval_text(m)} spans 1x)"
    text = f"worth {mark}{times(m.value)}{mark} the baseline's compute {interval_text(m)}"
    return text + (": the baseline reaches the same loss with less compute" if m.verdict == "worse" else "")


def _compute_text(value: float, axis: str) -> str:
    return flops_text(value) + " FLOPs" if axis == "flops" else f"{value:.0f} s"


def scaling_verdicts(sweep: Sweep, curves: Sequence[Curve]) -> list[str]:
    """One sentence per method: its multiplier at the largest measured size, at every size, and extrapolated."""
    lines, axis = [], sweep.options.axis
    for curve in curves:
        if curve.variant == sweep.settings.baseline:
            continue
        measured = sorted((c for c in curve.cells if c.multiplier is not None), key=lambda c: c.multiplier.compute)
        if not measured:
            base_notes = next(c for c in curves if c.variant == sweep.settings.baseline).notes
            lines.append(f"**{curve.variant}**: no multiplier yet ("
                         + ("; ".join(base_notes) or "no finished run") + ").")
            continue
        last = measured[-1]
        parts = [f"**{curve.variant}** at the largest measured size ({last.size.label}, "
                 f"{_compute_text(last.multiplier.compute, axis)}): {multiplier_words(last.multiplier)}"]
        if len(measured) > 1:
            parts.append("at each size " + ", ".join(f"{c.size.label} {multiplier_cell(c.multiplier)}"
                                                     for c in measured))
        m = curve.extrapolated
        if m is not None:
            largest = max(float(c.x.max()) for c in curve.cells if len(c.x))
            parts.append(f"extrapolated to {sweep.extrapolated_size.label} ({_compute_text(m.compute, axis)}, "
                         f"{m.compute / largest:.3g}x the largest compute measured; both fitted curves carried beyond "
                         f"the data, which these sizes cannot check): {multiplier_words(m, bold=False)}")
        lines.append("; ".join(parts) + ".")
    return lines


def alpha_text(fit: PowerLawFit) -> str:
    interval = fit.alpha_interval
    low = f"< {interval.low:.3g}" if interval.open_low else f"{interval.low:.3g}"
    high = f"> {interval.high:.3g}" if interval.open_high else f"{interval.high:.3g}"
    return f"{fit.alpha:.3g} [{low}, {high}]"


def fit_lines(sweep: Sweep, curves: Sequence[Curve]) -> list[str]:
    """One sentence per variant: its fitted curve, alpha's interval, the residuals against the seeds' spread, or
    why the data do not support a fit."""
    lines, axis = [], sweep.options.axis
    for curve in curves:
        fit = curve.fit
        if fit is None:
            lines.append(f"**{curve.variant}**: no fit ({'; '.join(curve.notes)}).")
            continue
        text = (f"**{curve.variant}**: L(C) = {fit.E:.4g} + {fit.A:.4g} (C / {_compute_text(fit.scale, axis)})^-alpha, "
                f"alpha {alpha_text(fit)}")
        if not fit.alpha_interval.bounded:
            text += " (these sizes do not bound alpha on that side)"
        if fit.residual_sd is not None:
            text += f"; residual sd {fit.residual_sd:.3g}"
        if fit.pure_error_sd is not None:
            text += f" against a seed sd of {fit.pure_error_sd:.3g} within sizes"
        if fit.lack_of_fit_p is not None:
            text += f"; lack-of-fit p {fit.lack_of_fit_p:.3g}"
        elif fit.sizes == MIN_SIZES:
            text += f"; {MIN_SIZES} sizes determine the 3 parameters, so the power law's shape is not tested"
        lines.append(text + (f". **Not supported**: {'; '.join(fit.problems)}." if fit.problems else "."))
    return lines


# -- tables ---------------------------------------------------------------------------------------------------
def table_headers(sweep: Sweep) -> list[str]:
    axis = "training FLOPs" if sweep.options.axis == "flops" else "training s"
    metric = sweep.plan.task.metric
    return ["variant", "size", "parameters", f"{axis} per run", "runs", f"test {metric}", "fitted", "residual",
            f"compute multiplier [{LEVEL:.0%} CI]", "verdict"]


def _mean_sd(values: np.ndarray) -> str:
    if not len(values):
        return "–"
    return f"{values.mean():.4f}" + (f" ± {values.std(ddof=1):.4f}" if len(values) > 1 else "") + f" (n={len(values)})"


def scaling_rows(sweep: Sweep, curves: Sequence[Curve]) -> list[list[str]]:
    """One row per (variant, size), then each method's extrapolated row."""
    sign, rows = sign_of(sweep), []
    for curve in curves:
        for cell in curve.cells:
            m = cell.multiplier
            fitted = float(curve.fit.predict(cell.x.mean())) if curve.fit is not None and len(cell.x) else None
            residual = float(cell.y.mean()) - fitted if fitted is not None else None
            rows.append([curve.variant, cell.size.label, human(cell.planned.parameters),
                         _compute_text(float(cell.x.mean()), sweep.options.axis) if len(cell.x) else "–",
                         f"{len(cell.summary.finished())}/{len(cell.summary.runs)}", _mean_sd(sign * cell.y),
                         "–" if fitted is None else f"{sign * fitted:.4f}",
                         "–" if residual is None else f"{sign * residual:+.4f}",
                         "–" if m is None else multiplier_cell(m),
                         "baseline" if curve.variant == sweep.settings.baseline else "–" if m is None else m.verdict])
    for curve in curves:
        m = curve.extrapolated
        if m is not None:
            planned = sweep.extrapolated.variant(cell_name(curve.variant, sweep.extrapolated_size.label))
            rows.append([curve.variant, f"{sweep.extrapolated_size.label} (extrapolated)", human(planned.parameters),
                         _compute_text(m.compute, sweep.options.axis), "–", "–", f"{sign * m.loss:.4f}", "–",
                         multiplier_cell(m), f"{m.verdict} (extrapolation)"])
    return rows


FIT_HEADERS = ["variant", "sizes", "runs", "E", "A at C0", "alpha [95% CI]", "residual sd", "seed sd",
               "lack-of-fit p", "supported"]


def fit_rows(curves: Sequence[Curve]) -> list[list[str]]:
    rows = []
    for c in curves:
        f = c.fit
        if f is None:
            rows.append([c.variant, str(sum(1 for cell in c.cells if len(cell.y))), "–", "–", "–", "–", "–", "–",
                         "–", "no: " + "; ".join(c.notes)])
            continue
        rows.append([c.variant, str(f.sizes), str(f.n), f"{f.E:.4g}", f"{f.A:.4g}", alpha_text(f),
                     "–" if f.residual_sd is None else f"{f.residual_sd:.3g}",
                     "–" if f.pure_error_sd is None else f"{f.pure_error_sd:.3g}",
                     "–" if f.lack_of_fit_p is None else f"{f.lack_of_fit_p:.3g}",
                     "yes" if f.supported else "no: " + "; ".join(f.problems)])
    return rows


SIZE_HEADERS = ["size", "variant", "Δ test [95% CI] at equal budget", "p (Holm)", "verdict"]


def size_rows(sweep: Sweep, by_size: dict[str, list[VariantSummary]]) -> list[list[str]]:
    """Each method against the baseline at each size, as compare reports a comparison (its paired test)."""
    rows = []
    for label, summaries in by_size.items():
        for s in summaries:
            c = s.comparison
            if c is None:
                continue
            delta = "–" if c.delta is None else f"{c.delta:+.4f}" + (
                f" [{c.interval[0]:+.4f}, {c.interval[1]:+.4f}]" if c.interval else "")
            rows.append([label, s.name.rpartition("@")[0], delta, "–" if c.p_holm is None else f"{c.p_holm:.3g}",
                         c.words])
    return rows


def csv_text(sweep: Sweep, curves: Sequence[Curve]) -> str:
    """Every figure of the main table and the fits as plain numbers, one row per (variant, size)."""
    sign, rows = sign_of(sweep), []
    for curve in curves:
        f = curve.fit
        fit_cols = {"E": f.E, "A": f.A, "C0": f.scale, "alpha": f.alpha, "alpha_ci_low": f.alpha_interval.low,
                    "alpha_ci_high": f.alpha_interval.high, "fit_supported": f.supported,
                    "fit_problems": "; ".join(f.problems)} if f is not None else {}
        cells = [(c.size.label, False, c.planned, c.x, c.y, c.multiplier) for c in curve.cells]
        if curve.extrapolated is not None:
            planned = sweep.extrapolated.variant(cell_name(curve.variant, sweep.extrapolated_size.label))
            cells.append((sweep.extrapolated_size.label, True, planned, np.array([curve.extrapolated.compute]),
                          np.array([]), curve.extrapolated))
        for label, extrapolated, planned, x, y, m in cells:
            row: dict[str, Any] = {"variant": curve.variant, "size": label, "extrapolated": extrapolated,
                                   "parameters": planned.parameters,
                                   "flops_per_step": planned.step.flops if planned.step else "",
                                   "axis": sweep.options.axis, "compute": float(x.mean()) if len(x) else "",
                                   "runs": len(y), "metric_mean": sign * float(y.mean()) if len(y) else "",
                                   "metric_sd": float(y.std(ddof=1)) if len(y) > 1 else "",
                                   "fitted": sign * float(f.predict(x.mean())) if f is not None and len(x) else ""}
            row.update({"multiplier": "" if m is None else m.value,
                        "multiplier_ci_low": "" if m is None or m.interval is None else m.interval.low,
                        "multiplier_ci_high": "" if m is None or m.interval is None else m.interval.high,
                        "verdict": "" if m is None else m.verdict, **fit_cols})
            rows.append(row)
    handle = io.StringIO()
    writer = csv.DictWriter(handle, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return handle.getvalue()


# -- figures --------------------------------------------------------------------------------------------------
def scaling_figures(sweep: Sweep, curves: Sequence[Curve], directory: Path) -> list[Picture]:
    """The loss-against-compute curves (with fits, bands, residuals) and the multipliers against size."""
    sign, axis = sign_of(sweep), "FLOPs" if sweep.options.axis == "flops" else "seconds"
    xs = [float(v) for c in curves for cell in c.cells for v in cell.x]
    reach = [c.extrapolated_compute for c in curves if c.extrapolated_compute]
    series = []
    if xs:
        grid = np.geomspace(min(xs) / 1.1, max(xs + reach) * 1.1, 40)
        for curve in curves:
            cells = [c for c in curve.cells if len(c.y)]
            item = scaling_plots.CurveSeries(
                curve.variant, [v for c in cells for v in c.x], [sign * v for c in cells for v in c.y],
                [float(c.x.mean()) for c in cells], [sign * float(c.y.mean()) for c in cells])
            if curve.fit is not None:
                low, high = prediction_band(curve.fit, grid)
                item.grid, item.line, item.band = grid, sign * curve.fit.predict(grid), (sign * low, sign * high)
                if sign < 0:
                    item.band = (item.band[1], item.band[0])
                item.residuals = list(sign * curve.fit.residuals())
                item.measured_until, item.supported = float(curve.fit.x.max()), curve.fit.supported
            series.append(item)
    pictures = []
    picture = scaling_plots.loss_vs_compute(
        series, sweep.plan.task.metric, axis, sweep.settings.baseline, directory / "scaling_curves.png",
        f"Each run's test {sweep.plan.task.metric} against its training {axis} (small dots), each size's mean "
        f"(large markers), each variant's fit L(C) = E + A (C / C0)^-alpha (solid; dotted where the data do not "
        f"support it; dashed beyond the largest measured compute) with its pointwise {LEVEL:.0%} profile band; "
        "beneath, each run's residual from its variant's fit.")
    if picture is not None:
        pictures.append(picture)
    points = []
    for curve in curves:
        for m, label in [(c.multiplier, c.size.label) for c in curve.cells] + [
                (curve.extrapolated, sweep.extrapolated_size.label if sweep.extrapolated_size else "")]:
            if m is not None and m.verdict != "unsupported":
                points.append(scaling_plots.MultiplierPoint(
                    curve.variant, label, m.compute, m.value, None if m.interval is None else m.interval.low,
                    None if m.interval is None or m.interval.open_high else m.interval.high, m.extrapolated))
    picture = scaling_plots.multipliers(
        points, axis, directory / "multipliers.png",
        f"Each method's compute multiplier against the baseline (the baseline's {axis} for the method's loss, over "
        f"the method's) at each measured size and, hollow, at the extrapolated size, with {LEVEL:.0%} profile "
        "intervals; an arrow marks an interval open upwards. Multipliers whose fits the data do not support are "
        "left out.")
    if picture is not None:
        pictures.append(picture)
    return pictures


# -- writing --------------------------------------------------------------------------------------------------
@dataclass
class ScalingReport:
    """What ``write_scaling_report`` wrote and what the command prints."""

    table: str
    markdown: Path
    html: Path
    tables: list[Path]
    pictures: list[Picture]
    verdicts: list[str]
    fits: list[str]
    complete: bool


def _setup_lines(sweep: Sweep, command: list[str], by_size: dict[str, list[VariantSummary]]) -> list[str]:
    s, o = sweep.settings, sweep.options
    missing = [r.name for ss in by_size.values() for v in ss for r in v.runs if r.state != "finished"]
    if o.tokens_per_parameter is not None:
        budget = (f"{o.tokens_per_parameter:g} tokens per parameter of the baseline at each size, as FLOPs that every "
                  "variant of the size gets (each its own whole steps)")
    elif s.budget_tokens is not None:
        budget = f"{s.budget_tokens:,} training tokens per run at every size"
    elif s.budget_minutes:
        budget = f"{s.budget_minutes:g} min of training per run"
    elif "train.max_steps" in s.sets:
        budget = f"{s.sets['train.max_steps']} optimiser steps per run at every size"
    else:
        budget = "the task's own step and epoch limits"
    sizes = "; ".join(f"{size.label}: " + ", ".join(f"{k}={v}" for k, v in size.sets.items()) for size in sweep.sizes)
    unit = METRIC_UNITS.get(sweep.plan.task.metric)
    lines = [f"Task **{s.task}**, {len(sweep.variants)} variants x {len(sweep.sizes)} sizes x {len(s.seeds)} seed(s); "
             f"baseline **{s.baseline}**; budget: {budget}.",
             f"Sizes: {sizes}.",
             f"Command: `{' '.join(command)}`",
             f"Fitted: each finished run's test {sweep.plan.task.metric}" + (f" ({unit})" if unit else "")
             + " against its training " + ("FLOPs (steps x 6 x multiply-adds per step, attention included)"
                                           if o.axis == "flops" else "seconds as measured (they depend on the load)")
             + "; every seed is a point."]
    if s.sets:
        lines.append("Settings for every run: " + ", ".join(f"`{k}={v}`" for k, v in s.sets.items()) + ".")
    if sweep.extrapolated_size is not None:
        lines.append(f"Extrapolated size: {sweep.extrapolated_size.label} ("
                     + ", ".join(f"{k}={v}" for k, v in sweep.extrapolated_size.sets.items())
                     + "), counted and never trained.")
    if missing:
        lines.insert(0, f"**Partial report**: {len(missing)} run(s) not finished ({', '.join(missing)}); run the "
                        "same command again to continue.")
    return lines


METHOD = (f"Fits: L(C) = E + A (C / C0)^-alpha by least squares over every run (E >= 0 for a loss), alpha's "
          f"{LEVEL:.0%} interval from the profile likelihood (F(1, n - 3) calibration). Compute multiplier: the "
          "compute the baseline's fitted curve needs to reach the method's loss, over the method's compute; at a "
          "measured size the method's loss is its seeds' mean there, at the extrapolated size its own fitted curve's; "
          "the interval profiles the joint likelihood of the baseline's runs and the method's. A multiplier is "
          "claimed only where its interval excludes 1x and both fits are supported (at least 3 sizes, a monotone "
          "curve, no lack of fit against the seeds' spread at the 1% level). Coverage of these intervals on "
          "synthetic curves, and why not a bootstrap over seeds: docs/compare.md.")


def _inline(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left}th{background:#f3f3f3}img{max-width:100%}figcaption{color:#555;font-size:14px}"
        "code{background:#f3f3f3;padding:1px 3px}")


def _sections(sweep: Sweep, curves: Sequence[Curve], by_size: dict[str, list[VariantSummary]],
              env: Optional[Environment], command: list[str]) -> list[tuple[str, list[str], list[tuple]]]:
    """The report as (title, paragraphs, tables (head, rows)) sections, rendered as Markdown and HTML alike."""
    compute = [(COMPUTE_HEADERS[:1] + ["size"] + COMPUTE_HEADERS[1:],
                [[row[0].rpartition("@")[0], label, *row[1:]] for label, summaries in by_size.items()
                 for row in compute_rows(sweep.size_plans[label], summaries)])]
    runs = [["run", "status", "steps", "train min", f"test {sweep.plan.task.metric}"]]
    run_rows = [[r.name, r.state + (f": {r.detail}" if r.detail else ""), str(r.results.get("steps", "–")),
                 f"{r.results['train_minutes']:.2f}" if isinstance(r.results.get("train_minutes"), float) else "–",
                 str(r.results.get(f"test_{sweep.plan.task.metric}", "–"))]
                for summaries in by_size.values() for s in summaries for r in s.runs]
    environment = env.lines() if env is not None else ["not recorded: written outside a compare run"]
    return [("What the sweep shows", scaling_verdicts(sweep, curves) or ["(no method against the baseline)"], []),
            ("Set-up", _setup_lines(sweep, command, by_size), []),
            ("Environment", environment, []),
            ("Loss, fits and compute multipliers", [], [(table_headers(sweep), scaling_rows(sweep, curves))]),
            ("Fits", fit_lines(sweep, curves) + [METHOD], [(FIT_HEADERS, fit_rows(curves))]),
            ("At equal budget, size by size", ["Each method against the baseline at each size, as `compare` "
                                               "reports a comparison (the paired test over the shared seeds, "
                                               "Holm-corrected within a size)."],
             [(SIZE_HEADERS, size_rows(sweep, by_size))]),
            ("Compute per run", ["FLOPs and tokens per run as the budget gave them; the measured seconds depend on "
                                 "the machine and its load."], compute if compute[0][1] else []),
            ("Runs", [], [(runs[0], run_rows)])]


def write_scaling_report(sweep: Sweep, output: Path, command: list[str], env: Optional[Environment] = None,
                         margin: Optional[float] = None) -> "ScalingReport":
    """Write the sweep's report files into ``output`` (module docstring) and return what the command prints."""
    output = Path(output)
    curves, by_size = analyse(sweep, output, margin)
    pictures = scaling_figures(sweep, curves, output / FIGURES)
    sections = _sections(sweep, curves, by_size, env, command)
    title = f"Scaling sweep on {sweep.settings.task}"
    md = [f"# {title}"]
    page = [f"<h1>{html.escape(title)}</h1>"]
    for name, paragraphs, tables in sections:
        md += [f"## {name}", *[("- " if name == "What the sweep shows" else "") + p for p in paragraphs],
               *[format_table(head, rows) for head, rows in tables if rows]]
        page += [f"<h2>{html.escape(name)}</h2>", *[f"<p>{_inline(p)}</p>" for p in paragraphs],
                 *[_html_table(head, rows) for head, rows in tables if rows]]
        if name == "Fits":
            md.append("## Figures")
            page.append("<h2>Figures</h2>")
            for picture in pictures:
                md.append(f"### {picture.title}\n\n![{picture.title}]({picture.path.relative_to(output).as_posix()})"
                          f"\n\n{picture.caption}")
                data = base64.b64encode(picture.path.read_bytes()).decode("ascii")
                page.append(f"<figure><h3>{html.escape(picture.title)}</h3><img alt=\"{html.escape(picture.title)}\" "
                            f"width=\"{picture.size[0]}\" height=\"{picture.size[1]}\" src=\"data:image/png;base64,"
                            f"{data}\"><figcaption>{html.escape(picture.caption)}</figcaption></figure>")
    markdown, page_path = output / "report.md", output / "report.html"
    write_atomic(markdown, "\n\n".join(md) + "\n")
    write_atomic(page_path, f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
                            f"{html.escape(title)}</title><style>{_CSS}</style></head><body>{''.join(page)}"
                            "</body></html>\n")
    head, rows = table_headers(sweep), scaling_rows(sweep, curves)
    tables = [output / "report.csv", output / "report.tex"]
    write_atomic(tables[0], csv_text(sweep, curves))
    write_atomic(tables[1], exports.latex_table(head, rows, f"Scaling sweep on {sweep.settings.task}: test metric, fit "
                                                            "and compute multiplier per variant and size")
                 + exports.latex_table(FIT_HEADERS, fit_rows(curves), "The fits L(C) = E + A (C/C0)^-alpha"))
    write_atomic(output / "summary.json", json.dumps(summary_json(sweep, curves), indent=2, default=_json_number)
                 + "\n")
    complete = all(r.state == "finished" for ss in by_size.values() for v in ss for r in v.runs)
    verdicts = scaling_verdicts(sweep, curves)
    return ScalingReport(format_table(head, rows), markdown, page_path, tables, pictures, verdicts,
                         fit_lines(sweep, curves), complete)


def _json_number(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _multiplier_json(m: Optional[Multiplier]) -> Optional[dict[str, Any]]:
    if m is None:
        return None
    interval = None if m.interval is None else {"low": m.interval.low, "high": m.interval.high,
                                                 "open_low": m.interval.open_low, "open_high": m.interval.open_high}
    return {"compute": m.compute, "loss": m.loss, "value": None if math.isinf(m.value) else m.value,
            "infinite": math.isinf(m.value), "ci95": interval, "verdict": m.verdict, "extrapolated": m.extrapolated,
            "problems": list(m.problems)}


def summary_json(sweep: Sweep, curves: Sequence[Curve]) -> dict[str, Any]:
    """The report's numbers, machine-readable (fitted orientation: lower is better)."""
    out: dict[str, Any] = {"task": sweep.settings.task, "metric": sweep.plan.task.metric, "axis": sweep.options.axis,
                           "baseline": sweep.settings.baseline, "sign": sign_of(sweep), "level": LEVEL,
                           "sizes": {s.label: s.sets for s in sweep.sizes}, "variants": {}}
    for c in curves:
        f = c.fit
        out["variants"][c.variant] = {
            "fit": None if f is None else {"E": f.E, "A": f.A, "C0": f.scale, "alpha": f.alpha,
                                           "alpha_ci95": [f.alpha_interval.low, f.alpha_interval.high],
                                           "alpha_ci_open": [f.alpha_interval.open_low, f.alpha_interval.open_high],
                                           "residual_sd": f.residual_sd, "pure_error_sd": f.pure_error_sd,
                                           "lack_of_fit_p": f.lack_of_fit_p, "problems": list(f.problems)},
            "notes": c.notes,
            "sizes": {cell.size.label: {"compute": cell.x.tolist(), "metric": (sign_of(sweep) * cell.y).tolist(),
                                        "multiplier": _multiplier_json(cell.multiplier)} for cell in c.cells},
            "extrapolated": _multiplier_json(c.extrapolated)}
    return out
