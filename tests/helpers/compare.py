"""`interlayer compare` without training: tiny translation settings, and finished runs faked on disk."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from interlayer import save_pretrained
from interlayer.compare import build_plan, make_settings
from interlayer.compare.plan import Plan, build_task
from interlayer.config_io import dataclass_from_dict
from interlayer.experiment import split_overrides

TINY = ["d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=2", "dec_layers=2"]
TRAIN = ["train.max_tokens=256", "train.warmup_steps=2", "train.log_interval=1", "train.average_last=0",
         "train.keep_last=1", "train.save_interval_steps=1", "train.patience=0"]


def data_sets(corpus: Path) -> dict[str, str]:
    """The ``data.*`` settings of a translation run on the ``corpus`` fixture."""
    sets = {f"data.{split}_{side}": str(corpus / f"{split}.{lang}") for split in ("train", "valid", "test")
            for side, lang in (("src", "de"), ("tgt", "en"))}
    return {**sets, "data.vocab_size": "60"}


def compare_sets(corpus: Path, extra=()) -> dict[str, str]:
    """A tiny translation model's settings on ``corpus`` (``extra``: more ``KEY=VALUE`` items)."""
    pairs = [*TINY, *TRAIN, *extra]
    return {**data_sets(corpus), **dict(p.split("=", 1) for p in pairs)}


# (run directory, planned variant, seed, the shared generator): writes the logs the report reads
LogWriter = Callable[[Path, Any, int, np.random.Generator], None]


def fake_runs(plan: Plan, out: Path, write_logs: LogWriter) -> None:
    """Finished runs without training: each variant's model (initial weights) as best/, the task's assets and
    run.json for every seed, then ``write_logs``; MPT's soft connection weights are perturbed so its heatmap is
    not the initial pattern."""
    task, train_cfg = build_task(plan.spec, plan.settings.sets)
    data = dataclass_from_dict(plan.spec.data_class, split_overrides(plan.settings.sets)[2], "data.")
    rng = np.random.default_rng(0)
    for planned in plan.variants:
        for seed in plan.settings.seeds:
            run_dir = out / "runs" / f"{planned.variant.name}-s{seed}"
            run_dir.mkdir(parents=True)
            model = plan.spec.model_from_dict(planned.model)
            if getattr(model.encoder, "connection_logits", None) is not None:
                model.encoder.connection_logits.data += 2 * torch.randn_like(model.encoder.connection_logits)
            save_pretrained(model, run_dir / "best")
            task.save_assets(run_dir / "best")
            task.save_assets(run_dir)
            (run_dir / "run.json").write_text(json.dumps({"task": plan.spec.name, "preset": planned.variant.preset,
                                                          "model": planned.model, "train": asdict(train_cfg),
                                                          "data": asdict(data)}))
            write_logs(run_dir, planned, seed, rng)


def translation_logs(run_dir: Path, planned: Any, seed: int, rng: np.random.Generator) -> None:
    """Five validations (BLEU rising), 40 training steps (with the SG loss for Crossformer SG), memory, results."""
    lines = ["step,epoch,bleu,nll,elapsed_min"] + [
        f"{10 * e},{e},{5 * e + rng.normal()},{3 - 0.2 * e},{0.1 * e + 0.01 * seed}" for e in range(1, 6)]
    (run_dir / "valid.csv").write_text("\n".join(lines) + "\n")
    sg = "crossformer_sg" in planned.variant.name
    train = [f"step,loss,units_per_s{',crossformer_sg' if sg else ''}"] + [
        f"{s},{4 - 0.05 * s},{1000 + 50 * seed}" + (f",{3.0 * math.exp(-s / 10)}" if sg else "")
        for s in range(1, 41)]
    (run_dir / "train.csv").write_text("\n".join(train) + "\n")
    (run_dir / "compare_memory.json").write_text(json.dumps([{"peak_rss_mb": 300.0,
                                                              "peak_rss_growth_mb": 50.0 + seed}]))
    (run_dir / "results.json").write_text(json.dumps({
        "status": "finished", "epochs": 5, "steps": 50, "train_minutes": 0.5, "stop_reason": "budget",
        "test_bleu": 20 + seed + rng.normal(), "peak_rss_growth_mb": 50.0 + seed}))


def faked_comparison(corpus: Path, out: Path, variants: str) -> Plan:
    """A 2-seed translation comparison of ``variants`` whose runs are all faked as finished."""
    plan = build_plan(make_settings("translation", [variants], seeds=2, budget_minutes=1.0,
                                    sets=compare_sets(corpus)))
    fake_runs(plan, out, translation_logs)
    return plan
