"""The files a comparison reads back from its own folder, checked before anything is used or written.

``compare`` continues from what its runs and its earlier invocations wrote: ``compare.json`` (:mod:`.plan`),
``status.json`` (:mod:`.runner`), ``jobs.json`` (:mod:`.launcher`), and in every run directory ``results.json``,
``valid.csv``, ``train.csv`` and ``compare_memory.json`` (:mod:`.records`, :mod:`.child`). Each holds what
interlayer writes and nothing else: JSON of a known shape, numbers that are finite, a metric inside its range (a
loss is never negative; an accuracy, BLEU, chrF or F1 lies in 0..100). A file that holds anything else was edited
or damaged, and ``compare`` refuses it with one line naming the file, the entry and what to do
(:class:`~interlayer.errors.DataError`, exit code 2), before it writes anything (:func:`check_files` runs ahead of
``compare.json``'s update), instead of an internal error or a wrong value averaged into the verdicts silently.

One kind of damage is repaired instead: a ``results.json`` that is not readable JSON at all (cut by a crash of an
older interlayer, which wrote it in place, or by a full disk) counts the run as unfinished
(:class:`~interlayer.errors.DamagedResults`, :func:`interlayer.compare.child.read_results`), and the next
``compare`` scores the run's checkpoint again and writes the file anew.

The CSV logs are appended a row at a time, so a crash can cut their last line: a last line without its line end
is dropped; every complete row must read. An empty cell is a value the row did not log.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Optional

from ..errors import DataError
from ..fileio import read_json, read_text

# Metrics reported in percent or points of 100 (accuracy and its VQA splits, BLEU, chrF, F1, PAvPU, their noisy
# counterparts); every other metric (a loss in nats, a perplexity) is at least 0 with no upper end.
PERCENT_METRICS = ("accuracy", "bleu", "chrf", "f1", "pavpu")
RUN_STATES = ("finished", "interrupted", "failed", "cancelled")  # what status.json records of a run
RESULT_FIELDS: dict[str, tuple[type, ...]] = {"epochs": (int,), "steps": (int,), "train_minutes": (int, float),
                                              "stop_reason": (str,), "peak_rss_mb": (int, float),
                                              "peak_rss_growth_mb": (int, float)}


def damaged(path: Path, problem: str, fix: str) -> DataError:
    """The one-line refusal of a file a comparison wrote: ``PATH: PROBLEM; it was edited or damaged: FIX``."""
    return DataError(f"{path}: {problem}; it was edited or damaged: {fix}")


def _refused(err: DataError, fix: str) -> DataError:
    """``err`` (a file that cannot be read: its path, line and problem) as a :func:`damaged` refusal."""
    return DataError(f"{str(err).removesuffix('; save the file as UTF-8')}; it was edited or damaged: {fix}")


def _read(path: Path, expect: type, fix: str) -> Any:
    """The JSON document in ``path`` (of type ``expect``); one that cannot be read is :func:`_refused`."""
    try:
        return read_json(path, DataError, expect=expect)
    except DataError as err:
        raise _refused(err, fix) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def metric_range(metric: str) -> tuple[float, float]:
    """The values ``metric`` can take: 0..100 for a percentage (:data:`PERCENT_METRICS`), else 0 and up."""
    return (0.0, 100.0) if any(name in metric for name in PERCENT_METRICS) else (0.0, math.inf)


def metric_problem(metric: str, value: Any) -> Optional[str]:
    """Why ``value`` cannot be a score of ``metric`` (not a number, not finite, outside :func:`metric_range`), or
    None."""
    if not _is_number(value):
        return f"{metric}={_shown(value)} is not a number"
    low, high = metric_range(metric)
    if not math.isfinite(value):
        return f"{metric}={value} is not a finite number"
    if not low <= value <= high:
        span = f"{low:g}..{high:g}" if math.isfinite(high) else f"at least {low:g}"
        return f"{metric}={value:g} is outside the values a {metric} can take ({span})"
    return None


# -- results.json ------------------------------------------------------------------------------------------------
RESULTS_FIX = ("restore it, or delete it: the same compare command then scores the run's checkpoint again and "
               "writes it anew")


def check_results(results: dict[str, Any], path: Path) -> dict[str, Any]:
    """``results`` (``path``, a finished run's ``results.json``) if its fields are what a run writes: the status
    ``finished``, whole epochs and steps, minutes, a stop reason as text, every test score a finite number; else a
    :func:`damaged` refusal naming the field."""
    problem = None
    if results.get("status", "finished") != "finished":
        problem = f"status={_shown(results['status'])}, but a results.json is only written for a finished run"
    for key, kinds in RESULT_FIELDS.items():
        value = results.get(key)
        if problem is None and value is not None:
            if not isinstance(value, kinds) or isinstance(value, bool):
                problem = f"{key}={_shown(value)} is not {'text' if kinds == (str,) else 'a number'}"
            elif _is_number(value) and not (math.isfinite(value) and (value >= 0 or key == "peak_rss_growth_mb")):
                problem = f"{key}={value} is not a finite number at least 0"
    for key, value in results.items():
        if problem is None and key.startswith("test_") and isinstance(value, float) and not math.isfinite(value):
            problem = f"{key}={value} is not a finite number (a run whose test scores are not finite writes none)"
    if problem is not None:
        raise damaged(path, problem, RESULTS_FIX)
    return results


def check_score(results: dict[str, Any], metric: str, path: Path, *, required: bool) -> Optional[float]:
    """The test score ``test_METRIC`` of a finished run's ``results`` (``path``), checked against the metric's range
    (:func:`metric_problem`); None when it is absent and not ``required`` (a secondary metric)."""
    key = f"test_{metric}"
    if key not in results:
        if required:
            raise damaged(path, f"it holds no {key}, the score every finished run of this task writes", RESULTS_FIX)
        return None
    problem = metric_problem(key, results[key])
    if problem is not None:
        raise damaged(path, problem, RESULTS_FIX)
    return float(results[key])


# -- status.json, compare_memory.json ---------------------------------------------------------------------------
def read_status(path: Path) -> dict[str, Any]:
    """``status.json``: the last outcome of every run (``{run: {"status", "seconds", "detail", "updated"}}``);
    empty when there is none."""
    if not path.is_file():
        return {}
    fix = ("delete it (it only records how each run's last attempt ended; the runs themselves are read from their "
           "folders) and run the command again")
    status = _read(path, dict, fix)
    for name, entry in status.items():
        if not isinstance(entry, dict) or entry.get("status") not in RUN_STATES:
            raise damaged(path, f"the entry of {name!r} is {_shown(entry)}, not a run's outcome (status one of "
                                f"{', '.join(RUN_STATES)})", fix)
        if not _is_number(entry.get("seconds", 0.0)) or not isinstance(entry.get("detail", ""), str):
            raise damaged(path, f"the entry of {name!r} has seconds={_shown(entry.get('seconds'))} and detail="
                                f"{_shown(entry.get('detail'))}; a number and a text are written there", fix)
    return status


def read_memory(path: Path) -> list[dict[str, Any]]:
    """``compare_memory.json``: one entry per segment of the run (``peak_rss_mb``, ``peak_rss_growth_mb``, ...);
    empty when there is none."""
    if not path.is_file():
        return []
    fix = "restore it, or delete it (the run's peak memory is then not reported)"
    segments = _read(path, list, fix)
    for index, segment in enumerate(segments):
        values = [segment.get(key) for key in ("peak_rss_mb", "peak_rss_growth_mb")] \
            if isinstance(segment, dict) else [segment]
        if not all(_is_number(value) and math.isfinite(value) for value in values):
            raise damaged(path, f"entry {index} is {_shown(segment)}; each entry holds the finite numbers "
                                "peak_rss_mb and peak_rss_growth_mb", fix)
    return segments


# -- the CSV logs --------------------------------------------------------------------------------------------------
def read_columns(path: Path, columns: dict[str, tuple[float, float]]) -> list[dict[str, float]]:
    """The ``columns`` of a run's CSV log (``valid.csv``, ``train.csv``) as numbers, one dict per row holding the
    cells that have a value; each column's numbers must be finite and inside its ``(low, high)``. A missing file or
    column gives nothing (a run that logged nothing yet); a last line cut by a crash is dropped (module docstring)."""
    if not path.is_file():
        return []
    fix = "restore it, or delete it (the report then lacks what it held: a learning curve, a throughput)"
    try:
        text = read_text(path, DataError)
    except DataError as err:
        raise _refused(err, fix) from None
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines = lines[:-1]  # cut by a crash while the row was appended
    rows = []
    for number, row in enumerate(csv.DictReader(io.StringIO("".join(lines))), 2):
        values = {}
        for column, (low, high) in columns.items():
            cell = row.get(column)
            if cell in (None, ""):
                continue
            try:
                value = float(cell)
            except (TypeError, ValueError):
                value = math.nan
            if not (math.isfinite(value) and low <= value <= high):
                span = f"{low:g}..{high:g}" if math.isfinite(high) else f"at least {low:g}"
                raise damaged(path, f"line {number}: {column}={_shown(cell)} is not a finite number {span}", fix)
            values[column] = value
        rows.append(values)
    return rows


# -- compare.json ------------------------------------------------------------------------------------------------
def _kinds(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)


def read_comparison(path: Path) -> dict[str, Any]:
    """``compare.json``: the settings, every variant's resolved model and every invocation, in the shape
    :func:`interlayer.compare.plan.prepare_directory` compares and extends."""
    fix = ("restore it from a copy, or give another --output: compare.json is what lets the same command continue "
           "this folder")
    stored = _read(path, dict, fix)
    settings, models, invocations = stored.get("settings"), stored.get("models"), stored.get("invocations")
    problem = None
    if not (isinstance(settings, dict) and _kinds(settings.get("seeds"), int) and _kinds(settings.get("variants"), str)
            and isinstance(settings.get("sets"), dict)):
        problem = "settings is not a mapping with seeds (integers), variants (texts) and sets (a mapping)"
    elif not (isinstance(models, dict) and all(isinstance(m, dict) and isinstance(m.get("sets"), dict)
                                               for m in models.values())):
        problem = "models is not a mapping of each variant to its model and sets"
    elif not (isinstance(invocations, list) and invocations
              and all(isinstance(i, dict) and _kinds(i.get("command"), str) for i in invocations)):
        problem = "invocations is not a list of the commands that wrote the folder"
    if problem is not None:
        raise damaged(path, problem, fix)
    return stored
