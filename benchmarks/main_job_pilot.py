"""Pilot runs that size the main job (``make run`` = ``interlayer compare --default``) before it runs: the default's
variants and settings with seeds the default never uses (101, 102, ...), then each variant's per-seed paired
differences to the baseline, their spread, and the power calculation that gives the seeds the default needs
(docs/compare.md, "How the seeds were chosen").

    python benchmarks/main_job_pilot.py --first-seed 101 --seeds 5 --steps 2000 --output runs/pilot/s2000
    python benchmarks/main_job_pilot.py --output runs/pilot/s2000 --analyse-only --effect 0.05
    python benchmarks/main_job_pilot.py --first-seed 116 --seeds 10 --steps 1000 --variants baseline,pa \
        --output runs/pilot/s1000b --pool docs/main-job-pilot-1000-first.json --json docs/main-job-pilot-1000.json

The runs are trained exactly as the default trains them (one torch thread per run, the default's ``--jobs``), so the
per-run cost they print (wall seconds, and the process CPU seconds that do not depend on the machine's load, both
from each run's ``compare_memory.json``) is the default's. The power is that of the paired t-test of ``n`` per-seed
differences at the level Holm's first step uses (``alpha / m`` for the ``m`` variants compared with the baseline: the
variant with the smallest p is tested there; ``m`` is the default's, also when the pilot trains fewer variants), and
also at ``alpha`` (its last step), from SciPy's noncentral t
(:func:`interlayer.compare.stats.power`). ``--pool`` adds the per-seed differences of earlier pilots at the same steps
(their JSON files), so that a second pilot sharpens the first one's estimate of the spread instead of replacing it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Any, Optional

from interlayer.compare import DEFAULT, make_settings, run_compare
from interlayer.compare.stats import ALPHA, POWER, power, seeds_needed
from interlayer.compare.variants import split_entries
from interlayer.tables import format_table

MAX_SEEDS_SHOWN = 12


def _settings(first_seed: int, seeds: int, steps: int, variants: list[str]):
    sets = dict(entry.split("=", 1) for entry in DEFAULT["sets"])
    settings = make_settings(DEFAULT["task"], variants, seeds=seeds, budget_steps=steps, sets=sets)
    return dataclasses.replace(settings, seeds=list(range(first_seed, first_seed + seeds)))


def _run_costs(output: Path) -> dict[str, dict[str, float]]:
    """Each run's wall and CPU seconds (summed over resumed segments) from its ``compare_memory.json``."""
    costs = {}
    for path in sorted((output / "runs").glob("*/compare_memory.json")):
        segments = json.loads(path.read_text())
        costs[path.parent.name] = {key: sum(s.get(key, 0.0) for s in segments) for key in ("wall_seconds",
                                                                                             "cpu_seconds")}
    return costs


def _pooled(pool: list[Path], steps: int) -> dict[str, dict[int, float]]:
    """Each variant's per-seed differences in earlier pilots' JSON files, which must be at ``steps`` steps."""
    pairs: dict[str, dict[int, float]] = {}
    for path in pool:
        earlier = json.loads(path.read_text())
        if earlier["steps"] != steps:
            raise SystemExit(f"--pool {path}: a pilot at {earlier['steps']} steps, not {steps}")
        for name, entry in earlier["variants"].items():
            pairs.setdefault(name, {}).update(zip(entry["seeds"], entry["differences"]))
    return pairs


def analyse(output: Path, effect: Optional[float], pooled: Optional[dict[str, dict[int, float]]] = None
            ) -> dict[str, Any]:
    summary = json.loads((output / "summary.json").read_text())
    base = summary["variants"][summary["baseline"]]["test_by_seed"]
    others = {name: v["test_by_seed"] for name, v in summary["variants"].items() if name != summary["baseline"]}
    m = len(split_entries(DEFAULT["variants"][0])) - 1  # the default's family, whatever variants the pilot trained
    rows, out = [], {"baseline": summary["baseline"], "m": m, "alpha_first_step": ALPHA / m, "variants": {}}
    for name, values in others.items():
        pairs = {int(s): values[s] - base[s] for s in set(values) & set(base)}
        earlier = (pooled or {}).get(name, {})
        if set(earlier) & set(pairs):
            raise SystemExit(f"{name}: seeds {sorted(set(earlier) & set(pairs))} are in --pool and in this pilot")
        pairs.update(earlier)
        seeds = sorted(pairs)
        diffs = [pairs[s] for s in seeds]
        mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
        targets = {"pilot Δ": abs(mean), **({f"effect {effect:g}": effect} if effect else {})}
        entry = {"seeds": seeds, "differences": diffs, "mean": mean, "sd": sd,
                 "dz": abs(mean) / sd if sd else None, "needed": {}, "power": {}}
        for label, target in targets.items():
            for level, alpha in (("alpha/m", ALPHA / m), ("alpha", ALPHA)):
                entry["needed"][f"{label} @ {level}"] = seeds_needed(target, sd, POWER, alpha, is_paired=True)
                entry["power"][f"{label} @ {level}"] = {n: power(target, sd, n, alpha, is_paired=True)
                                                        for n in range(3, MAX_SEEDS_SHOWN + 1)}
        out["variants"][name] = entry
        rows.append([name, " ".join(f"{d:+.3f}" for d in diffs), f"{mean:+.4f}", f"{sd:.4f}",
                     "–" if entry["dz"] is None else f"{entry['dz']:.2f}",
                     *(str(v) for v in entry["needed"].values())])
    head = ["variant", "differences (variant - baseline)", "mean", "sd", "d_z",
            *next(iter(out["variants"].values()))["needed"]]
    print(format_table(head, rows))
    costs = _run_costs(output)
    out["runs"] = costs
    by_variant: dict[str, list[dict[str, float]]] = {}
    for run, cost in costs.items():
        by_variant.setdefault(run.rsplit("-s", 1)[0], []).append(cost)
    print(format_table(["variant", "runs", "wall s (mean)", "CPU s (mean)"],
                       [[name, str(len(c)), f"{statistics.mean(x['wall_seconds'] for x in c):.1f}",
                         f"{statistics.mean(x['cpu_seconds'] for x in c):.1f}"] for name, c in by_variant.items()]))
    per_seed = sum(statistics.mean(x["cpu_seconds"] for x in c) for c in by_variant.values())
    out["cpu_seconds_per_seed"] = per_seed
    print(f"CPU seconds per seed (all variants): {per_seed:.0f}; on 2 cores at most {per_seed / 2:.0f} s of wall "
          "time per seed if both cores train all the time")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-seed", type=int, default=101)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=DEFAULT["budget_steps"])
    parser.add_argument("--jobs", type=int, default=DEFAULT["jobs"])
    parser.add_argument("--variants", default=",".join(DEFAULT["variants"]),
                        help="the default's variants, or some of them (the baseline first)")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--effect", type=float, help="a stated smallest effect of interest (metric units) to plan for")
    parser.add_argument("--analyse-only", action="store_true", help="only the calculation, on finished pilot runs")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--pool", type=Path, nargs="*", default=[],
                        help="earlier pilots' JSON files at the same steps: their per-seed differences join these")
    args = parser.parse_args()
    if not args.analyse_only:
        load = os.getloadavg()[0]
        result = run_compare(_settings(args.first_seed, args.seeds, args.steps, [args.variants]), args.output,
                             jobs=args.jobs, command=["benchmarks/main_job_pilot.py", f"--first-seed={args.first_seed}",
                                                      f"--seeds={args.seeds}", f"--steps={args.steps}",
                                                      f"--variants={args.variants}"])
        print(f"load average (1 min) at the start {load:.2f}, at the end {os.getloadavg()[0]:.2f}")
        if result.interrupted:
            raise SystemExit("interrupted: run the same command again to continue")
        if result.failed:
            raise SystemExit(f"failed runs: {', '.join(result.failed)}")
    pooled = _pooled(args.pool, args.steps)
    out = {"steps": args.steps, **analyse(args.output, args.effect, pooled),
           **({"pooled": [str(p) for p in args.pool]} if args.pool else {})}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
