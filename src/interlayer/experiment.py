"""Whole runs of any task: resolve configs, train with the engine, score the final model.

A run directory holds everything needed to resume or reproduce it: ``run.json`` (task, preset, and the model,
training and data configs as resolved), the task's assets (e.g. the vocabulary), ``checkpoint_last.safetensors``, the
``best/`` (and ``averaged/``) model folders, CSV and TensorBoard logs, and ``results.json``.
"""
from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from .config import dataclass_from_dict, parse_value
from .core.config import ConfigError
from .tasks import TaskSpec
from .training import TrainConfig, Trainer, distributed

RUN_FILE = "run.json"


def split_overrides(sets: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``train.lr=...`` and ``data.vocab_size=...`` go to those configs; every other key is a model field.

    Values are parsed as YAML scalars/lists (``3``, ``0.1``, ``true``, ``[0,2,1]``), like the CLI's ``--set``.
    """
    model, train, data = {}, {}, {}
    for key, value in sets.items():
        value = parse_value(value) if isinstance(value, str) else value
        head, _, rest = key.partition(".")
        if head == "train" and rest:
            train[rest] = value
        elif head == "data" and rest:
            data[rest] = value
        else:
            model[key] = value
    return model, train, data


def with_defaults(spec: TaskSpec, sets: dict[str, Any]) -> dict[str, Any]:
    """``sets`` over the task's defaults that depend on them (``TaskSpec.defaults_for``, e.g. a fine-tuning
    recipe when ``data.pretrained`` is given): the user's keys win."""
    return {**spec.defaults_for(sets), **sets}


def initial_model(spec: TaskSpec, task: Any, model_cfg: dict[str, Any], seed: int) -> nn.Module:
    """A fresh run's model: built after ``torch.manual_seed(seed)``, so the initial weights depend on the seed
    alone, then the task's ``initialise`` hook (pretrained weights over the seeded ones, when it has one)."""
    torch.manual_seed(seed)
    model = spec.model_from_dict(model_cfg)
    if spec.initialise is not None:
        spec.initialise(model, task)
    return model


def train(spec: TaskSpec, *, preset: Optional[str] = None, sets: Optional[dict[str, Any]] = None, seed: int = 1,
          max_minutes: Optional[float] = None, run_dir: Path, resume: bool = False, progress: bool = True,
          options: Optional[dict[str, Any]] = None, score_test: bool = True) -> dict[str, Any]:
    """Train (or resume) one run of ``spec``'s task and return its results (also in ``results.json``).

    On resume every setting comes from the run's ``run.json`` (only ``max_minutes`` may be raised), so a resumed
    run is the run that was started. Under ``torchrun`` rank 0 prepares the run (vocabulary, ``run.json``) and the
    other ranks load it; rank 0 alone scores the final model. ``score_test=False`` skips the test set (an
    architecture search must select on validation only); ``results["best_valid"]`` always holds the best
    validation metrics.
    """
    run_dir = Path(run_dir)
    options = options or {}
    env = distributed.environment()
    distributed.initialise(env)
    if resume:
        task, model, train_cfg = _load_run(spec, run_dir, max_minutes)
    elif env.is_main:
        if (run_dir / RUN_FILE).exists():
            raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another "
                                  "--run-dir")
        model_sets, train_sets, data_sets = split_overrides(with_defaults(spec, sets or {}))
        train_cfg = dataclass_from_dict(TrainConfig, {**spec.train_defaults, "seed": seed, **train_sets}, "train.")
        if max_minutes is not None:
            train_cfg.max_minutes = max_minutes
        train_cfg.validate()
        data_cfg = dataclass_from_dict(spec.data_class, data_sets, "data.")
        task = spec.make_task(data_cfg, train_cfg, None)
        preset = preset or spec.default_preset
        model_cfg = spec.resolve_model(preset, model_sets, task)
        model = initial_model(spec, task, model_cfg.to_dict(), train_cfg.seed)  # before the assets: it may add some
        run_dir.mkdir(parents=True, exist_ok=True)
        task.save_assets(run_dir)
        (run_dir / RUN_FILE).write_text(json.dumps({"task": spec.name, "preset": preset,
                                                    "model": model_cfg.to_dict(), "train": asdict(train_cfg),
                                                    "data": asdict(data_cfg)}, indent=2))
        distributed.barrier(env)  # the other ranks read what was just written
    else:
        distributed.barrier(env)
        task, model, train_cfg = _load_run(spec, run_dir, max_minutes)
    trainer = Trainer(task, model, train_cfg, run_dir, resume=resume, progress=progress)
    started = time.perf_counter()
    state = trainer.fit()
    if not env.is_main:
        return {"status": "finished" if state.finished else "interrupted", "rank": env.rank}
    if not state.finished:
        return {"status": "interrupted", "stop_reason": state.stop_reason, "run_dir": str(run_dir),
                "resume_with": "the same command plus --resume"}
    results = {"status": "finished", "task": spec.name, "stop_reason": state.stop_reason,
               "epochs": state.epoch - 1, "steps": state.step, "train_minutes": state.elapsed / 60,
               "best_epoch": state.best_epoch, "best_valid": state.saved_metrics,
               "train_wall_seconds": time.perf_counter() - started, "train_units_per_s": _mean_speed(run_dir)}
    if score_test:
        results.update(spec.finish(task, run_dir, state, options))
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _load_run(spec: TaskSpec, run_dir: Path, max_minutes: Optional[float]) -> tuple[Any, nn.Module, TrainConfig]:
    """Task, model and training settings of the run stored in ``run_dir`` (for --resume, and for ranks > 0)."""
    if not (run_dir / RUN_FILE).is_file():
        raise FileNotFoundError(f"cannot resume: {run_dir / RUN_FILE} is missing (no run was started there)")
    stored = json.loads((run_dir / RUN_FILE).read_text())
    if stored["task"] != spec.name:
        raise ConfigError(f"{run_dir} holds a {stored['task']!r} run, not {spec.name!r}")
    train_cfg = dataclass_from_dict(TrainConfig, stored["train"], "train.")
    if max_minutes is not None:
        train_cfg.max_minutes = max_minutes
    data_cfg = dataclass_from_dict(spec.data_class, stored["data"], "data.")
    return spec.make_task(data_cfg, train_cfg, run_dir), spec.model_from_dict(stored["model"]), train_cfg


def _mean_speed(run_dir: Path) -> Optional[float]:
    """Mean training throughput (tokens or examples per second) over the logged windows of ``train.csv``."""
    path = run_dir / "train.csv"
    if not path.is_file():
        return None
    with path.open() as handle:
        speeds = [float(row["units_per_s"]) for row in csv.DictReader(handle)]
    return sum(speeds) / len(speeds) if speeds else None
