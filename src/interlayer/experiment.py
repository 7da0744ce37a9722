"""Whole runs: resolve configs, train a task with the engine, pick the final model on validation, score on test.

A run directory holds everything needed to resume or reproduce it: ``run.json`` (model, training and data
configs as resolved), the vocabulary, ``checkpoint_last.pt``, ``best/`` and ``averaged/`` model folders, CSV and
TensorBoard logs, and ``results.json``.
"""
from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from .accounting import count_madds, count_parameters
from .build import build_model
from .config import config_from_dict, dataclass_from_dict
from .data.bpe import VocabPair
from .decoding import DecodeOptions
from .registry import get_config
from .tasks import translation
from .training import TrainConfig, Trainer

RUN_FILE = "run.json"


def split_overrides(sets: dict[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """``train.lr=...`` and ``data.vocab_size=...`` go to those configs; every other key is a model field."""
    model, train, data = {}, {}, {}
    for key, value in sets.items():
        head, _, rest = key.partition(".")
        if head == "train" and rest:
            train[rest] = value
        elif head == "data" and rest:
            data[rest] = value
        else:
            model[key] = value
    return model, train, data


def _parse(values: dict[str, str]) -> dict[str, Any]:
    return {k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in values.items()}


def train_translation(*, preset: str, sets: Optional[dict[str, str]] = None, seed: int = 1,
                      max_minutes: Optional[float] = None, run_dir: Path, resume: bool = False,
                      progress: bool = True, decode_options: DecodeOptions = DecodeOptions()) -> dict[str, Any]:
    """Train (or resume) a translation run and return its results (also written to ``results.json``)."""
    run_dir = Path(run_dir)
    if resume:
        if not (run_dir / RUN_FILE).is_file():
            raise FileNotFoundError(f"cannot resume: {run_dir / RUN_FILE} is missing (no run was started there)")
        stored = json.loads((run_dir / RUN_FILE).read_text())
        model_cfg = config_from_dict(stored["model"], source=str(run_dir / RUN_FILE))
        train_cfg = dataclass_from_dict(TrainConfig, stored["train"], "train.")
        data_cfg = dataclass_from_dict(translation.TranslationData, stored["data"], "data.")
        if max_minutes is not None:
            train_cfg.max_minutes = max_minutes
        vocab: Optional[VocabPair] = VocabPair.load(run_dir)
    else:
        model_sets, train_sets, data_sets = split_overrides(sets or {})
        train_cfg = dataclass_from_dict(TrainConfig, {**translation.TRAIN_DEFAULTS, "seed": seed,
                                                      **_parse(train_sets)}, "train.")
        if max_minutes is not None:
            train_cfg.max_minutes = max_minutes
        data_cfg = dataclass_from_dict(translation.TranslationData, _parse(data_sets), "data.")
        vocab = None
    train_cfg.validate()
    task = translation.TranslationTask(data_cfg, train_cfg, vocab=vocab)
    if not resume:
        base = get_config(preset)
        model_cfg = get_config(base, **{**task.model_fields(), **model_sets})
        run_dir.mkdir(parents=True, exist_ok=True)
        if (run_dir / RUN_FILE).exists():
            raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another "
                                  "--run-dir")
        task.vocab.save(run_dir)
        (run_dir / RUN_FILE).write_text(json.dumps({"task": "translation", "preset": preset,
                                                    "model": model_cfg.to_dict(), "train": asdict(train_cfg),
                                                    "data": asdict(data_cfg)}, indent=2))
    model = build_model(model_cfg)
    trainer = Trainer(task, model, train_cfg, run_dir, resume=resume, progress=progress)
    started = time.perf_counter()
    state = trainer.fit()
    if not state.finished:
        return {"status": "interrupted", "stop_reason": state.stop_reason, "run_dir": str(run_dir)}
    return finish_translation(task, run_dir, state, decode_options, seconds=time.perf_counter() - started)


def finish_translation(task: translation.TranslationTask, run_dir: Path, state, options: DecodeOptions,
                       seconds: float) -> dict[str, Any]:
    """Choose ``best/`` or ``averaged/`` by validation BLEU (beam search), then score it once on test."""
    candidates = [d for d in (run_dir / "best", run_dir / "averaged") if (d / "config.json").is_file()]
    valid = {}
    for directory in candidates:
        model, vocab = translation.load_translator(directory)
        hyps = translation.translate(model, vocab, task.valid.source, options)
        valid[directory.name] = translation.score(hyps, task.valid.target)["bleu"]
    chosen = max(valid, key=valid.get)
    model, vocab = translation.load_translator(run_dir / chosen)
    data = task.data
    test = translation.read_parallel(data.resolve(data.test_src), data.resolve(data.test_tgt))
    start = time.perf_counter()
    hyps = translation.translate(model, vocab, test.source, options)
    decode_seconds = time.perf_counter() - start
    (run_dir / "test.hyp").write_text("\n".join(hyps) + "\n")
    scores = translation.score(hyps, test.target)
    train_log = _read_csv(run_dir / "train.csv")
    speeds = [float(r["units_per_s"]) for r in train_log]
    results = {
        "status": "finished", "stop_reason": state.stop_reason, "epochs": state.epoch - 1, "steps": state.step,
        "train_minutes": state.elapsed / 60, "model": chosen, "valid_bleu": valid,
        "test_bleu": scores["bleu"], "test_chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf_signature"], "beam": options.beam, "lenpen": options.lenpen,
        "parameters": count_parameters(model), "madds_at_64": count_madds(model, 64),
        "train_tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
        "test_decode_seconds": decode_seconds, "threads": torch.get_num_threads(), "wall_seconds": seconds,
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))
