"""``interlayer compare``: train variants side by side under one budget and seeds, and report them as the papers do.

``run_compare`` is the whole command: resolve every variant against the task (:mod:`.plan`; errors before any
training), prepare or continue the output directory (``compare.json``), train the missing runs one subprocess
each (:mod:`.runner`, :mod:`.child`), and write the report (:mod:`.report`, :mod:`.plots`). See ``docs/compare.md``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from ..errors import ConfigError
from ..training.concurrency import DirectoryLock, available_cores
from .budget import check_budgets
from .plan import Plan, Settings, build_plan, get_spec
from .selection import Selection, check_selections, parse_selections
from .variants import NAMED_VARIANTS, check_global_sets, describe_named, parse_variants

if TYPE_CHECKING:
    from ..training.cluster import LauncherSettings
    from .report import Report
    from .runner import RunOutcome

# The main job's budget (`make run` = `interlayer compare --default`), in one place: optimiser steps per run, seeds
# per variant, and validations per learning curve (every steps // validations steps: every 100). Both were decided
# before the runs (issue 50) by the plan in docs/compare.md: pilots on seeds the default never uses, at 2,000 (seeds
# 101-105), 1,000 (106-110) and 1,500 steps (111-115), give the seeds the paired t-test of PA against the baseline
# needs at Holm's first level (0.05 / 4) for power 0.8 at each step count (6, 3 and 5), and the default takes the
# most steps whose seeds fit the main job's 15 minutes with its set-up. 1,500 steps x 5 seeds, the estimate's choice,
# took 20 min 26 s measured whole on a fresh clone (2 quiet cores), so the plan's next step count held: 1,000 steps.
# Its 3 seeds (from 5 pilot pairs) took 9 min 10 s and did not decide PA, their spread three times the pilots', so a
# second plan, written before its runs, pooled 10 more pilot pairs (seeds 116-125) with the first 5: PA's paired
# difference -0.158, sd 0.037 over 15 pairs, which needs 4 seeds (docs/main-job-pilot-1000.json, by
# benchmarks/main_job_pilot.py --pool; a test checks both constants against it). At 1,000 steps the baseline's test
# loss is about 2.15 nats per character (2.154 +- 0.031 over the second pilot's 10 seeds), far below the bigram level
# (2.75) at which issue 30 found every model stopped at 160 steps.
MAIN_JOB_STEPS = 1000
MAIN_JOB_SEEDS = 4
MAIN_JOB_VALIDATIONS = 10

# The README's comparison: a character-level language model on the bundled Shakespeare (validation and test on
# held-out plays), the plain decoder against causal Predictive Attention, Crossformer key-query hard guidance,
# Crossformer soft guidance and LW-1x under a budget of optimiser steps, so the same command gives the same table on
# a loaded or an idle machine (of the same kind and software). The model is a small nanoGPT (d=64, 4 layers,
# 64-character blocks, 16 per step), two runs at a time with one thread each on 2 CPU cores; every run validates on
# 128 blocks spread over the validation plays.
DEFAULT = {"task": "lm", "variants": ["baseline,pa,crossformer_kq,crossformer_sg,lw_1x"], "seeds": MAIN_JOB_SEEDS,
           "budget_minutes": None, "budget_steps": MAIN_JOB_STEPS, "jobs": 2,
           "sets": ["d_model=64", "n_heads=4", "d_ffn=256", "enc_layers=4", "dropout=0.0", "attn_dropout=0.0",
                    "data.block_size=64", f"data.eval_interval={MAIN_JOB_STEPS // MAIN_JOB_VALIDATIONS}",
                    "data.eval_blocks=128", "train.max_tokens=1024", "train.lr=6e-3", "train.min_lr=6e-4",
                    "train.warmup_steps=16", "train.threads=1"]}
DEFAULT_OUTPUT = "runs/compare/{task}"
# Seeds per variant at most: each is a run of every variant, and the plan lists them all before the first starts
# (--seeds 100000000 ended in a MemoryError). 1,000 is beyond any comparison the statistics plan for
# (compare/stats.py gives up there too).
MAX_SEEDS = 1000
# The most runs one compare may plan (variants x seeds): a typo in a loop that builds --variants or --seeds would
# otherwise start days of training
MAX_RUNS = 1000


def make_settings(task: str, variants: Sequence[str], *, seeds: int = 1, budget_minutes: Optional[float] = None,
                  preset: Optional[str] = None, baseline: Optional[str] = None,
                  sets: Optional[dict[str, Any]] = None, budget_steps: Optional[int] = None,
                  budget_flops: Optional[float] = None, budget_tokens: Optional[int] = None) -> Settings:
    """Check the command-line choices (not yet against the task's data) and fix them as :class:`Settings`.

    ``budget_steps`` (``--budget-steps``) is ``train.max_steps`` of every run, i.e. ``--set train.max_steps=N``:
    a budget in optimiser steps, which unlike minutes does not depend on the machine or its load.
    ``budget_flops`` / ``budget_tokens`` (``--budget-flops``, ``--budget-tokens``): training FLOPs or tokens per
    run, each variant's steps computed from its cost per step (:mod:`.budget`)."""
    spec = get_spec(task)
    if not 1 <= seeds <= MAX_SEEDS:
        raise ConfigError(f"--seeds={seeds} must be 1..{MAX_SEEDS:,}: seeds count from 1 (--seeds N trains every "
                          "variant with the seeds 1..N)")
    if budget_minutes is not None and budget_minutes <= 0:
        raise ConfigError(f"--budget-minutes={budget_minutes} must be positive (leave it out for the task's epoch "
                          "limits)")
    sets = dict(sets or {})
    check_budgets(budget_minutes, budget_steps, budget_flops, budget_tokens, sets)
    if budget_steps is not None:
        if budget_steps < 1:
            raise ConfigError(f"--budget-steps={budget_steps} must be a positive number of optimiser steps")
        if sets.get("train.max_steps", str(budget_steps)) != str(budget_steps):
            raise ConfigError(f"--budget-steps={budget_steps} and --set train.max_steps={sets['train.max_steps']} "
                              "disagree; give the step budget once")
        sets["train.max_steps"] = str(budget_steps)
    check_global_sets(sets)
    preset = preset or spec.default_preset
    parsed, baseline_name = parse_variants(list(variants), preset, baseline)
    if len(parsed) * seeds > MAX_RUNS:
        raise ConfigError(f"{len(parsed)} variants x {seeds} seeds are {len(parsed) * seeds:,} runs, more than "
                          f"{MAX_RUNS:,} in one compare; compare fewer variants or seeds at a time (several "
                          "--output folders)")
    return Settings(task=task, preset=preset, variants=[v.spec for v in parsed], baseline=baseline_name,
                    seeds=list(range(1, seeds + 1)), budget_minutes=budget_minutes, sets=sets,
                    budget_flops=budget_flops, budget_tokens=budget_tokens)


@dataclass
class CompareResult:
    """What ``run_compare`` did: the plan, the report, how every run ended, and whether a signal stopped it (Ctrl-C's
    SIGINT or a SIGTERM: ``signal``, for the exit code 128 + it)."""

    plan: Plan
    report: "Report"
    outcomes: list["RunOutcome"]
    interrupted: bool
    signal: Optional[int] = None

    @property
    def failed(self) -> list[str]:
        return [o.name for o in self.outcomes if o.status == "failed"]


def run_compare(settings: Settings, output: Path, *, command: Sequence[str], jobs: int = 1,
                selections: Sequence[Selection] = (), margin: Optional[float] = None,
                launcher: Optional["LauncherSettings"] = None, echo: Callable[[str], None] = print,
                effect: Optional[float] = None) -> CompareResult:
    """Plan, train what is missing (``jobs`` runs at a time), report; Ctrl-C stops after the current runs save
    and still reports. ``selections`` (``--select``, :mod:`.selection`) are checked against the variants before
    any training and decided in the report; ``margin`` (``--margin``) is the equivalence margin of the verdicts,
    absolute, in the metric's units (report only, like the selections); ``effect`` (``--effect``) the smallest
    difference of interest, stated before the runs, that an undecided verdict plans seeds for. ``launcher``
    (``--launcher submitit``): each run is a cluster job instead (:mod:`.launcher`; ``jobs`` does not apply).

    The runner and the report (matplotlib) are imported here, not at module level, so that the run processes,
    which import this package on their way to :mod:`.child`, load neither. The output directory is locked for the
    whole command (:class:`~interlayer.training.concurrency.DirectoryLock`): a second ``compare`` on it is refused
    naming this one, instead of training the same runs beside it. Nothing is written before everything that can
    refuse the command was checked: the launcher (submitit, sbatch, its options) before the folder is made, and
    every file of the folder the comparison reads back (:mod:`.readback`) before ``compare.json`` is updated.
    """
    from ..training.cluster import JOBS_FILE, check_launcher, read_job_record
    from .environment import comparison_environment, load_average
    from .launcher import SubmititRunner
    from .plan import prepare_directory
    from .records import summarize
    from .report import write_report
    from .runner import Runner

    started, load_at_start = time.perf_counter(), load_average()
    if jobs < 1:
        raise ConfigError(f"--jobs={jobs} must be at least 1 (the number of runs trained at once)")
    if jobs > available_cores():
        raise ConfigError(f"--jobs={jobs} is more than the {available_cores()} cores this process may use; give "
                          f"1..{available_cores()} (runs trained at once: more only wait for a core)")
    if margin is not None and not margin > 0:
        raise ConfigError(f"--margin={margin} must be positive: the equivalence margin, absolute, in the units of the "
                          "task's metric (e.g. --margin 0.02 for a loss in nats)")
    if effect is not None and not effect > 0:
        raise ConfigError(f"--effect={effect} must be positive: the smallest difference of interest, absolute, in the "
                          "units of the task's metric (e.g. --effect 0.05 for a loss in nats)")
    output = Path(output)
    if launcher is not None:
        check_launcher(launcher)
    echo(f"interlayer compare: checking {len(settings.variants)} variant(s) on task {settings.task!r} ...")
    plan = build_plan(settings, processes=1 if launcher is None else launcher.tasks)
    check_selections(selections, [v.variant.name for v in plan.variants])

    def check_files() -> None:  # every file the runners and the report read back, refused before anything is written
        summarize(plan, output)
        if launcher is not None:
            read_job_record(output / JOBS_FILE, "runs")

    with DirectoryLock(output, "comparison"):
        continued = prepare_directory(plan, output, list(command), before_writing=check_files)
        echo(f"{'continuing' if continued else 'writing'} {output} ({len(plan.runs())} runs)")
        runner = (Runner(plan, output, jobs=jobs, echo=echo) if launcher is None else
                  SubmititRunner(plan, output, launcher, echo=echo))
        outcomes, interrupted = runner.run_all()
        env = comparison_environment(plan, runner.threads, runner.jobs, time.perf_counter() - started, load_at_start,
                          None if launcher is None else launcher.describe())
        report = write_report(plan, output, list(command), selections, margin, env, effect)
    echo("")
    for line in report.tests + report.verdicts:
        echo(line.replace("**", ""))
    if report.warning:
        echo(report.warning.replace("**", ""))
    echo("")
    echo(report.table)
    echo("")
    echo("measured cost (depends on the machine and its load):")
    echo(report.cost)
    echo(f"the table as CSV and LaTeX: {', '.join(str(path) for path in report.tables)}")
    for line in report.chosen:
        echo(f"chosen on validation: {line}")
    for note in report.notes:
        echo(f"note: {note}")
    state = "complete" if report.complete else "PARTIAL (run the same command again to continue)"
    echo(f"\nreport ({state}): {report.markdown} and {report.html}")
    return CompareResult(plan, report, outcomes, interrupted, runner.stop_signal)


__all__ = ["CompareResult", "DEFAULT", "DEFAULT_OUTPUT", "NAMED_VARIANTS", "Settings", "build_plan",
           "describe_named", "make_settings", "parse_selections", "run_compare"]
