"""``compare --sizes``, the command: plan the sweep (:mod:`.scaling`), train its missing runs with compare's own
runners (``--jobs`` processes here, or cluster jobs with ``--launcher submitit``), write its report
(:mod:`.scaling_report`)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..errors import ConfigError
from ..training.cluster import LauncherSettings
from ..training.concurrency import DirectoryLock
from .environment import comparison_environment, load_average
from .launcher import SubmititRunner
from .plan import Settings, prepare_directory
from .runner import Runner, RunOutcome
from .scaling import Sweep, SweepOptions, plan_sweep
from .scaling_report import ScalingReport, write_scaling_report


@dataclass
class SweepResult:
    """What ``run_sweep`` did: the sweep, its report, how every run ended, and whether Ctrl-C stopped it."""

    sweep: Sweep
    report: ScalingReport
    outcomes: list[RunOutcome]
    interrupted: bool

    @property
    def failed(self) -> list[str]:
        return [o.name for o in self.outcomes if o.status == "failed"]


def run_sweep(settings: Settings, options: SweepOptions, output: Path, *, command: Sequence[str], jobs: int = 1,
              margin: Optional[float] = None, launcher: Optional[LauncherSettings] = None,
              echo: Callable[[str], None] = print) -> SweepResult:
    """Plan the sweep, train its missing runs with compare's runners (``jobs`` at a time, or as cluster jobs), write
    the scaling report; Ctrl-C stops after the current runs save and still reports (a partial one)."""
    started, load_at_start = time.perf_counter(), load_average()
    if jobs < 1:
        raise ConfigError(f"--jobs={jobs} must be at least 1 (the number of runs trained at once)")
    output = Path(output)
    echo(f"interlayer compare: checking {len(settings.variants)} variant(s) at {len(options.sizes)} sizes on task "
         f"{settings.task!r} ...")
    sweep = plan_sweep(settings, options, 1 if launcher is None else launcher.tasks)
    with DirectoryLock(output, "scaling sweep"):
        continued = prepare_directory(sweep.plan, output, list(command))
        echo(f"{'continuing' if continued else 'writing'} {output} ({len(sweep.plan.runs())} runs: "
             f"{len(sweep.variants)} variants x {len(sweep.sizes)} sizes x {len(settings.seeds)} seeds)")
        runner = (Runner(sweep.plan, output, jobs=jobs, echo=echo) if launcher is None else
                  SubmititRunner(sweep.plan, output, launcher, echo=echo))
        outcomes, interrupted = runner.run_all()
        env = comparison_environment(sweep.plan, runner.threads, runner.jobs, time.perf_counter() - started,
                                     load_at_start, None if launcher is None else launcher.describe())
        report = write_scaling_report(sweep, output, list(command), env, margin)
    echo("")
    for line in report.verdicts:
        echo(line.replace("**", ""))
    echo("")
    echo(report.table)
    state = "complete" if report.complete else "PARTIAL (run the same command again to continue)"
    echo(f"\nscaling report ({state}): {report.markdown} and {report.html}; tables "
         f"{', '.join(map(str, report.tables))}")
    return SweepResult(sweep, report, outcomes, interrupted)
