"""Whole runs of any task: resolve configs, train with the engine, score the final model.

A run directory holds everything needed to resume or reproduce it: ``run.json`` (task, preset, and the model,
training and data configs as resolved), the task's assets (e.g. the vocabulary), ``checkpoint_last.safetensors``, the
``best/`` (and ``averaged/``) model folders, CSV and TensorBoard logs, and ``results.json``.

One writer per run directory: :func:`train` holds the directory's lock (``writer.lock``,
:class:`~interlayer.training.concurrency.DirectoryLock`) from before it looks for ``run.json`` until it returns, so
checking for an existing run and creating one cannot race with a second process, and a second writer is refused
naming the first. A task may define ``check_inputs(model)``: called before training, it refuses (naming file and
line) an input of any split the model cannot read, instead of failing an epoch later at validation.
"""
from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import json
import math
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from .checkpoint import check_buildable, check_loadable
from .config_io import dataclass_from_dict, parse_value
from .data.fingerprint import changed_files, fingerprint
from .errors import ConfigError, DivergenceError
from .fileio import read_json, write_atomic, write_json
from .models.registry import get_config
from .tasks import TaskSpec
from .training import distributed, state_file
from .training.concurrency import DirectoryLock
from .training.config import CHANGEABLE_ON_RESUME, TrainConfig
from .training.engine import LAST, LEGACY_LAST, Trainer

RUN_FILE = "run.json"


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# nanoGPT's names of data settings, given as it gives them (``--set block_size=256``): the context length is the
# language-modelling data's ``block_size`` (the model's positions follow it), not a model field
DATA_NAMES = {"block_size": "block_size"}


def split_overrides(sets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``train.lr=...`` and ``data.vocab_size=...`` go to those configs, and nanoGPT's ``block_size`` to
    ``data.block_size`` (:data:`DATA_NAMES`); every other key is a model field.

    Text values are parsed as YAML scalars/lists (``3``, ``0.1``, ``true``, ``[0,2,1]``), like the CLI's ``--set``;
    other values (the CLI's ``--compile``: ``True``) are taken as they are.
    """
    model, train, data = {}, {}, {}
    for key, value in sets.items():
        value = parse_value(value, f"--set {key}") if isinstance(value, str) else value
        head, _, rest = key.partition(".")
        if key in DATA_NAMES:
            if DATA_NAMES[key] in data or f"data.{DATA_NAMES[key]}" in sets:
                raise ConfigError(f"{key} and data.{DATA_NAMES[key]} name the same setting; give one of them")
            data[DATA_NAMES[key]] = value
        elif head == "train" and rest:
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
    alone, then the task's ``initialise`` hook (pretrained weights over the seeded ones, when it has one). A model
    this machine cannot hold is refused first (:func:`~interlayer.checkpoint.check_buildable`)."""
    check_buildable(lambda: spec.model_from_dict(model_cfg))
    torch.manual_seed(seed)
    model = spec.model_from_dict(model_cfg)
    spec.initialise(model, task)
    return model


def train(spec: TaskSpec, *, preset: Optional[str] = None, sets: Optional[dict[str, Any]] = None,
          seed: Optional[int] = None, max_minutes: Optional[float] = None, run_dir: Path, resume: bool = False,
          progress: bool = True, options: Optional[dict[str, Any]] = None, score_test: bool = True,
          warn: Callable[[str], None] = _warn, command: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Train (or resume) one run of ``spec``'s task and return its results (also in ``results.json``).

    ``command`` (the command line that started it) is kept in a fresh run's ``run.json`` for its model card.

    A fresh run uses ``seed`` (default 1). On resume every setting comes from the run's ``run.json``, so a resumed
    run is the run that was started: ``sets``, ``seed``, ``preset`` and ``max_minutes`` may only repeat the stored
    values, except the training keys of :data:`~interlayer.training.config.CHANGEABLE_ON_RESUME` (when to stop, how
    often to log and save, threads), whose changes are applied, announced through ``warn`` and recorded in
    ``run.json``; any other change raises :class:`ConfigError` listing it. A run stopped before its first
    checkpoint has nothing to resume: ``resume=True`` starts it again from the beginning, with its stored settings,
    and says so. Under ``torchrun`` every rank first resolves its own settings and the ranks compare them
    (:func:`~interlayer.training.distributed.agree`: different settings, or a refusal on any rank, stop every rank
    with one message); then rank 0 prepares the run (vocabulary, ``run.json``) and the other ranks load it; rank 0
    alone holds the lock and scores the final model. ``score_test=False`` skips the test set (an
    architecture search must select on validation only); ``results["best_valid"]`` always holds the best
    validation metrics. An interrupted run's results name the signal that stopped it (``"signal"``).
    """
    run_dir, options = Path(run_dir), options or {}
    env = distributed.environment()
    distributed.initialise(env)
    error: Optional[BaseException] = None
    request: Optional[_RunRequest] = None
    try:
        _check_run_dir(run_dir)
        if resume and not (run_dir / RUN_FILE).is_file():  # said before the lock would create the directory
            raise FileNotFoundError(f"cannot resume: {run_dir / RUN_FILE} is missing (no run was started there)")
        sets = sets or {}
        defaults = spec.defaults_for(sets)  # as with_defaults: the task's defaults that the user's keys decide
        given = _Sets.split(sets)
        request = _RunRequest(spec=spec, run_dir=run_dir, preset=preset, given=given,
                              fresh=given.over(_Sets.split(defaults)), seed=seed, max_minutes=max_minutes,
                              resume=resume, progress=progress, options=options, score_test=score_test, warn=warn,
                              command=None if command is None else tuple(command))
    except Exception as err:  # noqa: BLE001 (every rank learns of it: distributed.agree)
        error = err
    # the same settings on every rank, or every rank stops (a request is made whenever no error was met)
    distributed.agree(env, error, None if request is None else request.settings())
    assert request is not None
    with contextlib.ExitStack() as lock:
        return _train(request, env, lock)


@dataclasses.dataclass(frozen=True)
class _Sets:
    """``--set`` values split by :func:`split_overrides` (each value parsed) into the model's, the training's and
    the data's keys."""

    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    train: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def split(cls, sets: dict[str, Any]) -> _Sets:
        return cls(*split_overrides(sets))

    def over(self, defaults: _Sets) -> _Sets:
        """These keys over ``defaults``' (what :func:`with_defaults` then :func:`split_overrides` give)."""
        return _Sets({**defaults.model, **self.model}, {**defaults.train, **self.train}, {**defaults.data, **self.data})


@dataclasses.dataclass(frozen=True)
class _RunRequest:
    """One call of :func:`train`, what every step of the run reads: its choices, and its ``--set`` values split
    once (:class:`_Sets`), as given (``given``: what a resume may change) and over the task's defaults for them
    (``fresh``: what a fresh run resolves, and what the ranks of a distributed run compare)."""

    spec: TaskSpec
    run_dir: Path
    given: _Sets
    fresh: _Sets
    # the choices, with train()'s defaults
    preset: Optional[str] = None
    seed: Optional[int] = None
    max_minutes: Optional[float] = None
    resume: bool = False
    progress: bool = True
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    score_test: bool = True
    warn: Callable[[str], None] = _warn
    command: Optional[tuple[str, ...]] = None  # the command line that started it: kept in a fresh run's run.json

    def settings(self) -> dict[str, Any]:
        """What a rank was asked to run, resolved as far as it goes without data (``--set`` values parsed, the
        task's defaults applied): the settings the ranks of a distributed run compare before anything is written."""
        return {"task": self.spec.name, "preset": self.preset, "model": self.fresh.model, "train": self.fresh.train,
                "data": self.fresh.data, "seed": self.seed, "max_minutes": self.max_minutes,
                "run_dir": str(self.run_dir), "resume": self.resume, "options": self.options}

    def unchanged(self) -> _RunRequest:
        """The request of a rank > 0: the run as rank 0 wrote it to ``run.json`` (with the changes it applied), so
        nothing of its own to change or to announce."""
        return dataclasses.replace(self, preset=None, given=_Sets(), seed=None, max_minutes=None)

    @property
    def allow_data_change(self) -> bool:
        return bool(self.options.get("allow_data_change"))


def _train(request: _RunRequest, env: distributed.DistEnv, lock: contextlib.ExitStack) -> dict[str, Any]:
    """The run once every rank holds the same request: rank 0 prepares it (the others then load what it wrote),
    every rank trains, rank 0 scores the final model and writes ``results.json``."""
    spec, run_dir = request.spec, request.run_dir
    # a legacy pickle checkpoint is no "missing checkpoint": the engine refuses it with the reason
    start_over = request.resume and (run_dir / RUN_FILE).is_file() and not any(
        (run_dir / name).is_file() for name in (LAST, LEGACY_LAST))
    prepared: Optional[tuple[Any, nn.Module, TrainConfig]] = None
    error: Optional[BaseException] = None
    if env.is_main:  # rank 0 prepares the run; a refusal here stops every rank (distributed.agree)
        try:
            prepared = _prepare(request, start_over, lock)
        except Exception as err:  # noqa: BLE001
            error = err
    distributed.agree(env, error)  # the other ranks read what rank 0 wrote
    if not env.is_main:
        try:
            prepared = _load_run(request.unchanged(), record=False)
            check_before_training(*prepared)
        except Exception as err:  # noqa: BLE001
            error = err
    distributed.agree(env, error)
    assert prepared is not None
    task, model, train_cfg = prepared
    trainer = Trainer(task, model, train_cfg, run_dir, resume=request.resume and not start_over,
                      progress=request.progress)
    started = time.perf_counter()
    state = trainer.fit()
    if not env.is_main:
        return {"status": "finished" if state.finished else "interrupted", "rank": env.rank}
    if not state.finished:
        stopped = {"signal": signal.Signals(trainer.stop_signal).name} if trainer.stop_signal else {}
        return {"status": "interrupted", "stop_reason": state.stop_reason, **stopped, "run_dir": str(run_dir),
                "resume_with": "the same command plus --resume"}
    results = {"status": "finished", "task": spec.name, "stop_reason": state.stop_reason,
               "epochs": state.epoch - 1, "steps": state.step, "train_minutes": state.elapsed / 60,
               "best_epoch": state.best_epoch, "best_valid": state.saved_metrics,
               "train_wall_seconds": time.perf_counter() - started, "train_units_per_s": _mean_speed(run_dir)}
    if state.averaged:
        results["averaged"] = state.averaged
    if request.score_test:
        results.update(spec.finish(task, run_dir, state, {**request.options, "progress": request.progress}))
        bad = {k: v for k, v in results.items() if k.startswith("test_") and isinstance(v, float)
               and not math.isfinite(v)}
        if bad:  # validated finite, yet the test scores are not: say so instead of writing them as results
            shown = ", ".join(f"{k} {v}" for k, v in bad.items())
            raise DivergenceError(f"the test scores of {run_dir} are not finite ({shown}); no results.json is "
                                  "written. Lower train.lr, or check the test data for non-finite values")
    write_atomic(run_dir / "results.json", json.dumps(results, indent=2))
    return results


def _prepare(request: _RunRequest, start_over: bool, lock: contextlib.ExitStack
             ) -> tuple[Any, nn.Module, TrainConfig]:
    """Rank 0's part before training: a fresh run resolved, built and checked before its directory is locked and
    written (a refused run leaves no directory behind); a resumed one loaded (or started over) under the lock, its
    data compared with the run's (:func:`_check_data`; ``--allow-data-change`` lets a difference through)."""
    run_dir = request.run_dir
    fresh = None
    if not request.resume:
        _refuse_existing(run_dir)
        fresh = _resolve_new(request)
        if request.command is not None:
            fresh.record["command"] = list(request.command)
    lock.enter_context(DirectoryLock(run_dir, f"{request.spec.name} training run"))
    if fresh is not None:
        _refuse_existing(run_dir)  # again, under the lock: another process may have started it meanwhile
        fresh.task.save_assets(run_dir)
        write_json(run_dir / RUN_FILE, fresh.record)
        return fresh.task, fresh.model, fresh.train_cfg
    if start_over:
        request.warn(f"interlayer: {run_dir} stopped before its first checkpoint ({LAST} is missing), so there is "
                     "nothing to resume: starting it from the beginning with its stored settings")
        prepared = _restart_run(request)
    else:
        prepared = _load_run(request, record=True)
    check_before_training(*prepared)
    return prepared


def check_before_training(task: Any, model: nn.Module, train_cfg: TrainConfig) -> None:
    """What would stop the run after it started, refused before: the task's ``check_inputs(model)`` (inputs of
    any split the model cannot read, naming file and line), a model its own saved folder could not give back
    (:func:`~interlayer.checkpoint.check_loadable`), and a first epoch too short for one optimiser step
    (``update_freq`` x processes batches). A fresh run calls this before ``run.json`` is written, so a refused run
    leaves no directory that would block its corrected re-run."""
    check = getattr(task, "check_inputs", None)
    if check is not None:
        check(model)
    _check_id_ranges(task, model)
    check_loadable(model)
    needed = train_cfg.update_freq * distributed.environment().world_size
    batches = len(task.train_batches(1, train_cfg.seed))
    if batches < needed:
        raise ConfigError(f"the first epoch has {batches} training batches, fewer than one optimiser step needs "
                          f"(train.update_freq={train_cfg.update_freq} x {needed // train_cfg.update_freq} "
                          f"process(es) = {needed}); lower train.update_freq or train.max_tokens / data.batch_size, "
                          "or run fewer processes")


# The sizes a task's data decides that bound ids or classes (input tokens, targets, labels, answers): a model with
# fewer (a --set below the data's) would index past a table, and the cross-entropy would read another row
ID_RANGES = ("src_vocab_size", "tgt_vocab_size", "num_classes", "vocab_size", "num_answers")


def _check_id_ranges(task: Any, model: nn.Module) -> None:
    """Refuse a model with fewer tokens, classes or answers than the task's data holds, naming the key: the ids the
    data loaders build on the host are checked against the data's own vocabularies and label sets, so this one
    comparison keeps every id of every batch inside the model (no kernel reads out of bounds)."""
    config = model.config
    holders = [config, getattr(config, "encoder", None)]
    for key, needed in task.model_fields().items():
        holder = next((h for h in holders if h is not None and hasattr(h, key)), None)
        if key not in ID_RANGES or not isinstance(needed, int) or holder is None:
            continue
        have = getattr(holder, key)
        if key == "tgt_vocab_size" and have is None:  # one vocabulary for both sides
            have, key = holder.src_vocab_size, "src_vocab_size"
        if have < needed:
            raise ConfigError(f"{key}={have} is smaller than the {needed} the data holds (the task sets it from its "
                              f"data): ids {have}..{needed - 1} would index past the model's tables and its loss; "
                              f"drop --set {key}, or give at least {needed}")


@dataclasses.dataclass
class _NewRun:
    """A fresh run resolved and built, not yet written: its task, seeded model, training config and run.json."""

    task: Any
    model: nn.Module
    train_cfg: TrainConfig
    record: dict[str, Any]


def _check_run_dir(run_dir: Path) -> None:
    """Refuse a ``--run-dir`` that cannot become a folder (it, or a folder above it, is a file) before anything."""
    for path in (run_dir, *run_dir.parents):
        if path.exists() and not path.is_dir():
            where = "" if path == run_dir else f": {path} is a file, not a folder"
            raise ConfigError(f"--run-dir {run_dir} cannot be a run folder{where or ': it is a file'}; choose "
                              "another --run-dir")


def _refuse_existing(run_dir: Path) -> None:
    if (run_dir / RUN_FILE).exists():
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another "
                              "--run-dir")


def _resolve_new(request: _RunRequest) -> _NewRun:
    """Resolve a fresh run from the preset and its ``--set`` values over the task's defaults, and build it (writing
    nothing)."""
    spec, sets, seed = request.spec, request.fresh, request.seed
    train_cfg = dataclass_from_dict(TrainConfig, {**spec.train_defaults, "seed": 1 if seed is None else seed,
                                                  **sets.train}, "train.")
    if request.max_minutes is not None:
        train_cfg.max_minutes = request.max_minutes
    train_cfg.validate()
    data_cfg = dataclass_from_dict(spec.data_class, sets.data, "data.")
    task = spec.make_task(data_cfg, train_cfg, None)
    preset = request.preset or spec.default_preset
    model_cfg = spec.resolve_model(preset, sets.model, task)
    model = initial_model(spec, task, model_cfg.to_dict(), train_cfg.seed)  # before the assets: it may add some
    check_before_training(task, model, train_cfg)
    record = {"task": spec.name, "preset": preset, "model": model_cfg.to_dict(), "train": asdict(train_cfg),
              "data": asdict(data_cfg)}
    if hasattr(task, "data_files"):
        record["data_fingerprint"] = fingerprint(task.data_files())
    return _NewRun(task, model, train_cfg, record)


# What a run writes while it trains (engine, tasks, compare): cleared when a run that never reached its first
# checkpoint starts again. Only these names: a --run-dir may hold other files of the user's.
_PARTIAL_FILES = ("train.csv", "valid.csv", "test.hyp", "results.json", "compare_memory.json", LAST + ".tmp")
_PARTIAL_DIRS = ("tb", "best", "averaged")


def _restart_run(request: _RunRequest) -> tuple[Any, nn.Module, TrainConfig]:
    """A run with ``run.json`` but no checkpoint, started again from its stored settings (plus the changes a
    resume allows): the partial logs go, the model is rebuilt from the seed as a fresh run builds it."""
    spec, run_dir = request.spec, request.run_dir
    stored = _read_run(spec, run_dir)
    notes: list[str] = []  # said once the data is known to be the run's: a refused resume prints one line
    train_cfg, data_cfg, model_dict, _ = _resumed_settings(request, stored, notes.append)
    task = spec.make_task(data_cfg, train_cfg, None)
    stored = _check_data(run_dir, stored, task, request.allow_data_change, notes.append)
    for note in notes:
        request.warn(note)
    for name in _PARTIAL_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in _PARTIAL_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for path in run_dir.glob("checkpoint[0-9]*.pt"):
        path.unlink()
    model = initial_model(spec, task, model_dict, train_cfg.seed)
    task.save_assets(run_dir)
    write_json(run_dir / RUN_FILE, {**stored, "train": asdict(train_cfg), "data": asdict(data_cfg)})
    return task, model, train_cfg


def _read_run(spec: TaskSpec, run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume: {path} is missing (no run was started there)")
    stored = read_json(path, within=run_dir)
    missing = [key for key in ("task", "model", "train", "data") if key not in stored]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: it was not written by `interlayer train`")
    if stored["task"] != spec.name:
        raise ConfigError(f"{run_dir} holds a {stored['task']!r} run, not {spec.name!r}")
    return stored


def _load_run(request: _RunRequest, record: bool) -> tuple[Any, nn.Module, TrainConfig]:
    """Task, model and training settings of the run stored in the request's ``run_dir`` (for --resume, and for
    ranks > 0), with the changes a resume allows; ``record`` (rank 0) compares the data with the run's
    (:func:`_check_data`) and writes the changes to ``run.json``."""
    spec, run_dir = request.spec, request.run_dir
    stored = _read_run(spec, run_dir)
    notes: list[str] = []  # said once the data is known to be the run's: a refused resume prints one line
    train_cfg, data_cfg, _, model = _resumed_settings(request, stored, notes.append)
    task = spec.make_task(data_cfg, train_cfg, run_dir)
    if record:
        checked = {**_check_data(run_dir, stored, task, request.allow_data_change, notes.append),
                   "train": asdict(train_cfg), "data": asdict(data_cfg)}
        if checked != stored:
            write_json(run_dir / RUN_FILE, checked)
    for note in notes:
        request.warn(note)
    return task, model, train_cfg


def _check_data(run_dir: Path, stored: dict[str, Any], task: Any, allow: bool, warn: Callable[[str], None]
                ) -> dict[str, Any]:
    """``run.json``'s contents with the fingerprint of the data ``task`` reads now
    (:mod:`interlayer.data.fingerprint`), after refusing data that differs from the run's (a folder replaced by
    another corpus continued silently), naming each file, unless ``allow`` (``--allow-data-change``: then said
    through ``warn`` and recorded). A run written before fingerprints gets its first."""
    if not hasattr(task, "data_files"):
        return stored
    old = stored.get("data_fingerprint")
    now = fingerprint(task.data_files(), known=old)
    changed = changed_files(old, now) if isinstance(old, dict) else []
    if changed and not allow:
        raise ConfigError(f"--resume continues {run_dir} on the data it started with ({run_dir / RUN_FILE}'s "
                          f"data_fingerprint), but the data differs: {'; '.join(changed)}. Restore the data, start "
                          "a new run, or pass --allow-data-change to continue on these files")
    if changed:
        warn(f"interlayer: resuming {run_dir} on other data (--allow-data-change): {'; '.join(changed)}")
    return {**stored, "data_fingerprint": now}


def _resumed_settings(request: _RunRequest, stored: dict[str, Any], warn: Callable[[str], None]
                      ) -> tuple[TrainConfig, Any, dict[str, Any], nn.Module]:
    """The stored settings with the request's ``--set`` values (as given: no task defaults) applied, checked:
    changes to keys outside ``CHANGEABLE_ON_RESUME`` raise :class:`ConfigError` naming each (stored -> requested);
    allowed ones are announced through ``warn``.

    Values are compared after the same parsing and coercion as a fresh run's (``--set d_model=32`` equals a stored
    32), the model's by building it from the stored config with the keys applied.
    """
    spec, run_dir, preset = request.spec, request.run_dir, request.preset
    model_sets, train_sets, data_sets = request.given.model, dict(request.given.train), request.given.data
    if request.seed is not None:
        train_sets = {"seed": request.seed, **train_sets}
    if request.max_minutes is not None:
        train_sets["max_minutes"] = request.max_minutes
    before = asdict(dataclass_from_dict(TrainConfig, stored["train"], "train."))
    train_cfg = dataclass_from_dict(TrainConfig, {**before, **train_sets}, "train.")
    train_cfg.validate()
    data_before = asdict(dataclass_from_dict(spec.data_class, stored["data"], "data."))
    data_cfg = dataclass_from_dict(spec.data_class, {**data_before, **data_sets}, "data.")
    _check_stored_model(run_dir, stored["model"])
    # the sets applied as a fresh run applies them (the family's overrides: interlayer.config_io.set_dotted)
    model_dict = get_config(stored["model"], **model_sets).to_dict() if model_sets else copy.deepcopy(stored["model"])
    model = spec.model_from_dict(model_dict)
    changes = {f"train.{k}": (v, getattr(train_cfg, k)) for k, v in before.items() if getattr(train_cfg, k) != v}
    changes.update({f"data.{k}": (v, getattr(data_cfg, k)) for k, v in data_before.items()
                    if getattr(data_cfg, k) != v})
    if model_sets:  # compared with the stored config as built today (fields added since then take their defaults)
        old = _flatten(spec.model_from_dict(stored["model"]).config.to_dict())
        new = _flatten(model.config.to_dict())
        changes.update({k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
                        if old.get(k) != new.get(k)})
    if preset is not None and preset != stored.get("preset"):
        changes["--preset"] = (stored.get("preset"), preset)
    allowed = {f"train.{k}" for k in CHANGEABLE_ON_RESUME}
    if "data_fingerprint" in stored:  # the folder moved: its files are compared by content (_check_data)
        allowed.add("data.path")
    refused = {k: v for k, v in changes.items() if k not in allowed}
    shown = lambda items: ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(items.items()))  # noqa: E731
    if refused:
        raise ConfigError(f"--resume continues {run_dir} as it was started ({run_dir / RUN_FILE}), but these "
                          f"settings would change it: {shown(refused)}. On resume only "
                          f"{', '.join(sorted(allowed))} may change; start a new run (another --run-dir) to change "
                          "the others")
    if changes and (run_dir / "results.json").is_file():
        raise ConfigError(f"{run_dir} has finished (results.json), so it trains no further and {shown(changes)} "
                          "would change nothing; start a new run (another --run-dir) instead")
    if changes:
        warn(f"interlayer: resuming {run_dir} with changed settings: {shown(changes)}")
    return train_cfg, data_cfg, model_dict, model


def _check_stored_model(run_dir: Path, model: dict[str, Any]) -> None:
    """Refuse a ``run.json`` whose model differs from the one its checkpoint holds, before building it: an edited
    ``enc_layers=10000000`` would otherwise be built until memory runs out, only to be refused by the load."""
    path = run_dir / LAST
    if not path.is_file():
        return
    stored, trained = _flatten(model), _flatten(state_file.read_model_config(path))
    differing = {k: (v, trained[k]) for k, v in stored.items() if k in trained and trained[k] != v}
    if differing:
        shown = ", ".join(f"{k} {a!r} (checkpoint: {b!r})" for k, (a, b) in sorted(differing.items())[:5])
        raise ConfigError(f"{run_dir / RUN_FILE} describes another model than {path} holds: {shown}; run.json was "
                          "edited or comes from another run: restore it (the checkpoint's settings are the run's)")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _mean_speed(run_dir: Path) -> Optional[float]:
    """Mean training throughput (tokens or examples per second) over the logged windows of ``train.csv``."""
    path = run_dir / "train.csv"
    if not path.is_file():
        return None
    with path.open() as handle:
        speeds = [float(row["units_per_s"]) for row in csv.DictReader(handle)]
    return sum(speeds) / len(speeds) if speeds else None
