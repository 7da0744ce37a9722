"""The comparison's results table beside ``report.md``: ``report.csv`` (every figure as a number, for re-analysis)
and ``report.tex`` (a compact table for a paper: a booktabs ``tabular`` that fits a page's ``\\textwidth``).

The CSV has one row per variant with plain numbers at full precision (empty where undefined), the test metric of
every seed (``test_seed_S``) and each seed's difference to the baseline (``delta_seed_S``, the paired test's
data), so a reader can recompute the tests or re-plot without parsing ``mean ± std`` strings. The LaTeX table keeps
the columns a paper prints (variant, parameters, MAdds, the test metric as mean ± std, Δ with its 95% interval, the
Holm-corrected p and the verdict's word) and moves every sentence (the tests used, the verdicts' reasons, the seed
counts) into notes under the table, set as text of the page's width; its symbols (±, Δ, the en dash of an empty
cell) are LaTeX math. ``docs/compare.md`` says how to compile it. Both files are written atomically and are a pure
function of the runs (no time stamps), so a report rewritten from the same runs gives the same files.
"""
from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from ..fileio import write_atomic
from .plan import Plan
from .records import VariantSummary
from .stats import TEST_TITLES, mean_std

CSV_FILE = "report.csv"
LATEX_FILE = "report.tex"

# LaTeX's special characters (backslash first), then the symbols the report's cells use
_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_SYMBOLS = {"±": r"$\pm$", "Δ": r"$\Delta$", "α": r"$\alpha$", "–": "--", "≥": r"$\geq$", "≤": r"$\leq$",
                  "×": r"$\times$", "−": "$-$"}
_LATEX_PATTERN = re.compile("|".join(re.escape(c) for c in [*_LATEX_SPECIAL, *_LATEX_SYMBOLS]))


def latex_text(text: str) -> str:
    """``text`` as literal LaTeX: its special characters escaped, the report's symbols as math."""
    return _LATEX_PATTERN.sub(lambda m: _LATEX_SPECIAL.get(m.group(), _LATEX_SYMBOLS.get(m.group(), "")), text)


def latex_table(head: Sequence[str], rows: Sequence[Sequence[str]], caption: str, notes: Sequence[str] = ()) -> str:
    """A ``table`` with a booktabs ``tabular`` (``\\usepackage{booktabs}``) in footnote-size type: the first column
    left-aligned, the others right-aligned, the last (the verdict, a word) left-aligned; ``notes`` follow the tabular
    as footnote-size paragraphs, which LaTeX breaks at the page's width (sentences never widen the table)."""
    columns = "l" + "r" * (len(head) - 2) + "l"
    body = [" & ".join(latex_text(str(cell)) for cell in row) + r" \\" for row in rows]
    text = [r"\par\smallskip", r"{\raggedright", *(latex_text(note) + r"\par" for note in notes), "}"]
    return "\n".join([r"\begin{table}", r"\centering", rf"\caption{{{latex_text(caption)}}}", r"\footnotesize",
                      r"\setlength{\tabcolsep}{4pt}", rf"\begin{{tabular}}{{{columns}}}", r"\toprule",
                      " & ".join(latex_text(h) for h in head) + r" \\", r"\midrule", *body, r"\bottomrule",
                      r"\end{tabular}", *(text if notes else []), r"\end{table}"]) + "\n"


def _short(count: float) -> str:
    """``206,656`` -> ``207k``, ``15,024,128`` -> ``15.0M``: three significant figures (trailing zeros kept), enough
    for a paper's size columns."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(count) >= scale:
            value = count / scale
            return f"{value:.{max(0, 2 - math.floor(math.log10(abs(value))))}f}{unit}"
    return f"{count:.0f}"


def _minus(text: str) -> str:
    """A number's hyphen as the minus sign (typeset as math: a hyphen is shorter than a minus)."""
    return text.replace("-", "−")


def _pm(values: Sequence[float], places: int) -> str:
    mean, std = mean_std(values)
    return "–" if mean is None else _minus(f"{mean:.{places}f}" + ("" if std is None else f" ± {std:.{places}f}"))


def compact_table(plan: Plan, summaries: Sequence[VariantSummary], places: int, extra: Sequence[str] = ()
                  ) -> tuple[list[str], list[list[str]], list[str]]:
    """The LaTeX table's header, rows and notes: one row per variant (sizes, the test metric and ``extra`` metrics
    as mean ± std with ``places`` decimals, Δ ± the half-width of its 95% interval, Holm p, the verdict's word); the
    seed counts, the tests and the verdicts' reasons as notes. Both tests' intervals are symmetric about Δ (t
    intervals), so ``Δ ± h`` is the report's ``Δ [Δ - h, Δ + h]`` in half the width."""
    base = plan.variant(plan.settings.baseline)
    metric = plan.task.metric
    head = ["variant", "params", "MAdds", f"test {metric}", *(f"test {m}" for m in extra), "Δ ± 95% CI",
            "p (Holm)", "verdict"]
    rows = []
    for s in summaries:
        c = s.comparison
        delta = "–" if c is None or c.delta is None else _minus(f"{c.delta:+.{places}f}" + (
            f" ± {(c.interval[1] - c.interval[0]) / 2:.{places}f}" if c.interval else ""))
        rows.append([s.name, _short(s.planned.parameters), _short(s.planned.madds), _pm(s.test, places),
                     *(_pm(s.extra[m], places) for m in extra), delta,
                     "–" if c is None or c.p_holm is None else f"{c.p_holm:.3g}", "–" if c is None else c.verdict])
    counts = {len(s.test) for s in summaries}
    seeds = (f"{counts.pop()} seeds per variant" if len(counts) == 1 else
             "seeds per variant: " + ", ".join(f"{s.name} {len(s.test)}" for s in summaries))
    notes = [f"Test {metric} of each run's best model (chosen on validation {metric}; "
             f"{'higher' if plan.task.higher_is_better else 'lower'} is better), mean ± sample std over the seeds "
             f"({seeds}). MAdds of one forward pass at {base.length_label}" + "".join(
                 f"; {s.name} at {'/'.join(map(str, s.planned.lengths))}" for s in summaries
                 if s.planned.lengths != base.lengths) + "."]
    tested = [(s.name, s.comparison) for s in summaries if s.comparison is not None and s.comparison.test]
    by_test = {test: [name for name, c in tested if c.test == test] for test in TEST_TITLES}
    notes.append(f"Δ: variant − {plan.settings.baseline} ± the half-width of its 95% interval, from "
                 + "; ".join(f"{'the ' if test == 'paired' else ''}{TEST_TITLES[test]} for {', '.join(names)}"
                             for test, names in by_test.items() if names)
                 + "; p: two-sided, Holm-corrected across the variants." if tested else
                 f"Δ: variant − {plan.settings.baseline}; no test ran (fewer than two seeds per side).")
    reasons = [f"{s.name}: {s.comparison.reason}" for s in summaries if s.comparison and s.comparison.reason]
    if reasons:
        notes.append("Verdicts: " + "; ".join(reasons) + ".")
    return head, rows, notes


def _number(value: Optional[float]) -> Any:
    return "" if value is None else value


def csv_rows(plan: Plan, summaries: Sequence[VariantSummary]) -> list[dict[str, Any]]:
    """One row per variant: sizes, the metric's mean and std over seeds, the comparison's figures, throughput, then
    the test metric of every seed and its difference to the baseline's run of the same seed (empty where a run has
    not finished, and for the baseline itself)."""
    base = next(s for s in summaries if s.name == plan.settings.baseline)
    rows = []
    for s in summaries:
        c = s.comparison
        test_mean, test_std = mean_std(s.test)
        valid_mean, valid_std = mean_std(s.valid)
        speed_mean, speed_std = mean_std(list(s.speeds.values()))
        row: dict[str, Any] = {
            "variant": s.name, "baseline": s.name == plan.settings.baseline, "parameters": s.planned.parameters,
            "madds": s.planned.madds, "finished_runs": len(s.finished()), "runs": len(s.runs),
            "valid_mean": _number(valid_mean), "valid_std": _number(valid_std),
            "test_mean": _number(test_mean), "test_std": _number(test_std)}
        for metric, values in s.extra.items():
            mean, std = mean_std(values)
            row.update({f"test_{metric}_mean": _number(mean), f"test_{metric}_std": _number(std)})
        interval = c.interval if c is not None and c.interval else (None, None)
        figures = {"delta": "delta", "p": "p", "p_holm": "p_holm", "welch_p": "welch_p",
                   "welch_p_holm": "welch_p_holm", "p_equivalence_holm": "p_equivalence_holm",
                   "alpha_holm_step": "alpha", "detectable_delta": "detectable", "target_delta": "target",
                   "seeds_for_target": "seeds_for_target"}
        row.update({"delta_ci95_low": _number(interval[0]), "delta_ci95_high": _number(interval[1]),
                    "test": "" if c is None or c.test is None else c.test})
        row.update({key: _number(None if c is None else getattr(c, name)) for key, name in figures.items()})
        row.update({"verdict": "" if c is None else c.verdict, "reason": "" if c is None else c.reason,
                    "units_per_s_mean": _number(speed_mean), "units_per_s_std": _number(speed_std),
                    "peak_rss_growth_mb": _number(s.memory)})
        differences = {} if s is base else {seed: value - base.test_by_seed[seed]
                                            for seed, value in s.test_by_seed.items() if seed in base.test_by_seed}
        row.update({f"test_seed_{seed}": _number(s.test_by_seed.get(seed)) for seed in plan.settings.seeds})
        row.update({f"delta_seed_{seed}": _number(differences.get(seed)) for seed in plan.settings.seeds})
        rows.append(row)
    return rows


def write_tables(output: Path, table: tuple[Sequence[str], Sequence[Sequence[str]], Sequence[str]],
                 numbers: list[dict[str, Any]], task: str) -> list[Path]:
    """Write ``report.csv`` (``numbers``) and ``report.tex`` (``table``: the header, rows and notes of
    :func:`compact_table`)."""
    handle = io.StringIO()
    fields = list(dict.fromkeys(key for row in numbers for key in row))
    writer = csv.DictWriter(handle, fieldnames=fields, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(numbers)
    paths = [Path(output) / CSV_FILE, Path(output) / LATEX_FILE]
    write_atomic(paths[0], handle.getvalue())
    head, rows, notes = table
    write_atomic(paths[1], latex_table(head, rows, f"Comparison on {task}: test metric over seeds, difference to "
                                                   "the baseline with its 95% interval, Holm-corrected p-values.",
                                       notes))
    return paths
