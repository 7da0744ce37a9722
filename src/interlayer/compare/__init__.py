"""``interlayer compare``: train variants side by side under one budget and seeds, and report them as the papers do.

``run_compare`` is the whole command: resolve every variant against the task (:mod:`.plan`; errors before any
training), prepare or continue the output directory (``compare.json``), train the missing runs one subprocess
each (:mod:`.runner`, :mod:`.child`), and write the report (:mod:`.report`, :mod:`.plots`). See ``docs/compare.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..core.config import ConfigError
from ..training.concurrency import DirectoryLock
from .plan import Plan, Settings, build_plan, get_spec
from .selection import Selection, check_selections, parse_selections
from .variants import NAMED_VARIANTS, check_global_sets, describe_named, hard_permutation, parse_variants

if TYPE_CHECKING:
    from .report import Report
    from .runner import RunOutcome

# The README's comparison: PA Table 1's SST-5 (bundled), the three methods with a picture of their own, two seeds,
# one training minute per run: 8 runs, about 9 minutes on 2 CPU cores, so set-up and all stay within 15. The PA
# text classifier at half width (d=128, FFN 512) trains about 5 epochs in that budget (test accuracy near 40%); at
# full width it would see less than one epoch and every variant would sit at chance.
DEFAULT = {"task": "sst5", "variants": ["baseline,pa,mpt_soft,crossformer_sg"], "seeds": 2, "budget_minutes": 1.0,
           "sets": ["d_model=128", "d_ffn=512"]}
DEFAULT_OUTPUT = "runs/compare/{task}"


def make_settings(task: str, variants: Sequence[str], *, seeds: int = 1, budget_minutes: Optional[float] = None,
                  preset: Optional[str] = None, baseline: Optional[str] = None,
                  sets: Optional[dict[str, str]] = None) -> Settings:
    """Check the command-line choices (not yet against the task's data) and fix them as :class:`Settings`."""
    spec = get_spec(task)
    if seeds < 1:
        raise ConfigError(f"--seeds={seeds} must be at least 1")
    if budget_minutes is not None and budget_minutes <= 0:
        raise ConfigError(f"--budget-minutes={budget_minutes} must be positive (leave it out for the task's epoch "
                          "limits)")
    sets = dict(sets or {})
    check_global_sets(sets)
    preset = preset or spec.default_preset
    parsed, baseline_name = parse_variants(list(variants), preset, baseline)
    return Settings(task=task, preset=preset, variants=[v.spec for v in parsed], baseline=baseline_name,
                    seeds=list(range(1, seeds + 1)), budget_minutes=budget_minutes, sets=sets)


@dataclass
class CompareResult:
    plan: Plan
    report: "Report"
    outcomes: list["RunOutcome"]
    interrupted: bool

    @property
    def failed(self) -> list[str]:
        return [o.name for o in self.outcomes if o.status == "failed"]


def run_compare(settings: Settings, output: Path, *, command: Sequence[str], jobs: int = 1,
                selections: Sequence[Selection] = (), echo: Callable[[str], None] = print) -> CompareResult:
    """Plan, train what is missing (``jobs`` runs at a time), report; Ctrl-C stops after the current runs save
    and still reports. ``selections`` (``--select``, :mod:`.selection`) are checked against the variants before
    any training and decided in the report.

    The runner and the report (matplotlib) are imported here, not at module level, so that the run processes,
    which import this package on their way to :mod:`.child`, load neither. The output directory is locked for the
    whole command (:class:`~interlayer.training.concurrency.DirectoryLock`): a second ``compare`` on it is refused
    naming this one, instead of training the same runs beside it.
    """
    from .plan import prepare_directory
    from .report import write_report
    from .runner import Runner

    if jobs < 1:
        raise ConfigError(f"--jobs={jobs} must be at least 1 (the number of runs trained at once)")
    output = Path(output)
    echo(f"interlayer compare: checking {len(settings.variants)} variant(s) on task {settings.task!r} ...")
    plan = build_plan(settings)
    check_selections(selections, [v.variant.name for v in plan.variants])
    with DirectoryLock(output, "comparison"):
        continued = prepare_directory(plan, output, list(command))
        echo(f"{'continuing' if continued else 'writing'} {output} ({len(plan.runs())} runs)")
        outcomes, interrupted = Runner(plan, output, jobs=jobs, echo=echo).run_all()
        report = write_report(plan, output, list(command), selections)
    echo("")
    echo(report.table)
    for line in report.chosen:
        echo(f"chosen on validation: {line}")
    for note in report.notes:
        echo(f"note: {note}")
    state = "complete" if report.complete else "PARTIAL (run the same command again to continue)"
    echo(f"\nreport ({state}): {report.markdown} and {report.html}")
    return CompareResult(plan, report, outcomes, interrupted)


__all__ = ["CompareResult", "DEFAULT", "DEFAULT_OUTPUT", "NAMED_VARIANTS", "Settings", "build_plan",
           "describe_named", "hard_permutation", "make_settings", "parse_selections", "run_compare"]
