"""The comparison's results table beside ``report.md``: ``report.csv`` (every figure as a number, for re-analysis)
and ``report.tex`` (the table as printed, a booktabs ``tabular`` for a paper).

The CSV has one row per variant with plain numbers at full precision (empty where undefined), so a reader can
recompute or re-plot without parsing ``mean ± std`` strings; the LaTeX table is exactly the report's table, its
text escaped for LaTeX and its symbols (±, Δ, α, the en dash of an empty cell) written as LaTeX math. Both are
written atomically and are a pure function of the runs (no time stamps), so a report rewritten from the same runs
gives the same files.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from ..fileio import write_atomic
from .plan import Plan
from .records import VariantSummary
from .stats import mean_std

CSV_FILE = "report.csv"
LATEX_FILE = "report.tex"

# LaTeX's special characters (backslash first), then the symbols the report's cells use
_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_SYMBOLS = {"±": r"$\pm$", "Δ": r"$\Delta$", "α": r"$\alpha$", "–": "--", "≥": r"$\geq$", "≤": r"$\leq$",
                  "×": r"$\times$"}
_LATEX_PATTERN = re.compile("|".join(re.escape(c) for c in [*_LATEX_SPECIAL, *_LATEX_SYMBOLS]))


def latex_text(text: str) -> str:
    """``text`` as literal LaTeX: its special characters escaped, the report's symbols as math."""
    return _LATEX_PATTERN.sub(lambda m: _LATEX_SPECIAL.get(m.group(), _LATEX_SYMBOLS.get(m.group(), "")), text)


def latex_table(head: Sequence[str], rows: Sequence[Sequence[str]], caption: str) -> str:
    """A ``table`` with a booktabs ``tabular`` (``\\usepackage{booktabs}``): the first column left-aligned, the
    others right-aligned, the last (the verdict, words) left-aligned."""
    columns = "l" + "r" * (len(head) - 2) + "l"
    body = [" & ".join(latex_text(str(cell)) for cell in row) + r" \\" for row in rows]
    return "\n".join([r"\begin{table}", r"\centering", rf"\caption{{{latex_text(caption)}}}",
                      rf"\begin{{tabular}}{{{columns}}}", r"\toprule",
                      " & ".join(latex_text(h) for h in head) + r" \\", r"\midrule", *body, r"\bottomrule",
                      r"\end{tabular}", r"\end{table}"]) + "\n"


def _number(value: Optional[float]) -> Any:
    return "" if value is None else value


def csv_rows(plan: Plan, summaries: Sequence[VariantSummary]) -> list[dict[str, Any]]:
    """One row per variant: sizes, the metric's mean and std over seeds, the comparison's figures, throughput."""
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
        rows.append(row)
    return rows


def write_tables(output: Path, head: Sequence[str], rows: Sequence[Sequence[str]], numbers: list[dict[str, Any]],
                 task: str) -> list[Path]:
    """Write ``report.csv`` (``numbers``) and ``report.tex`` (the table ``head`` + ``rows`` as printed)."""
    handle = io.StringIO()
    fields = list(dict.fromkeys(key for row in numbers for key in row))
    writer = csv.DictWriter(handle, fieldnames=fields, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(numbers)
    paths = [Path(output) / CSV_FILE, Path(output) / LATEX_FILE]
    write_atomic(paths[0], handle.getvalue())
    write_atomic(paths[1], latex_table(head, rows, f"Comparison on {task}: test metric over seeds, difference to "
                                                   "the baseline with its 95% interval, Holm-corrected p-values."))
    return paths
