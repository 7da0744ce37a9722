"""The training loop every task shares.

What it guarantees:

* **Resumable to the bit.** ``checkpoint_last.safetensors`` holds the model and training configs, weights,
  optimiser, step, position inside the epoch, every random generator (CPU and CUDA) and the task's assets (e.g. the
  tokenizer); batch order depends only on ``(seed, epoch)``. A run stopped at any saved point and resumed with
  ``resume=True`` on the same device ends with the same weights as an uninterrupted run (tested). Nothing in it is a
  pickle (:mod:`.state_file`), so a checkpoint someone hands you cannot run code; a run saved on a GPU resumes on a
  CPU and the other way round.
* **Any device, any precision.** ``train.device`` (CPU, CUDA, MPS), ``train.precision`` (fp32, bf16 autocast,
  fp16 autocast with a gradient scaler whose state is checkpointed), ``train.compile`` (``torch.compile`` of the
  step's forward: the model and the task's loss as one graph), TF32 on GPUs (:mod:`.device`). The model and every
  batch move to the device here (``Task.prepare`` first, for host-side work; tensors inside tuples, lists, named
  tuples, dicts and dataclasses too), and during validation every call of the model gets its tensor inputs moved
  (:func:`~.device.inputs_to`). So any task trains and validates on any device, whether or not it moves its own
  (moving twice is free).
* **No host synchronisation in a step** (one process): the logged terms stay on the device and are read once per
  ``log_interval`` (:mod:`.step_logs`); a diverged step is still named exactly, and caught before any checkpoint.
* **No silent divergence.** A non-finite loss, or a non-finite gradient norm (fp32/bf16 with ``clip_norm``; with
  fp16's scaler, more than ``MAX_SKIPPED_STEPS`` skipped steps in a row), stops the run with
  :class:`DivergenceError` naming the step, at the latest ``log_interval`` steps later and before any checkpoint or
  validation; the last checkpoint, written before the divergence, is kept.
* **Nothing lost on Ctrl-C / SIGTERM.** The signal only sets a flag; the loop finishes the current step, writes
  ``checkpoint_last.pt`` and returns. A SIGKILL loses at most the steps since the last checkpoint (epoch end, or
  every ``save_interval_steps``).
* **Atomic files.** Checkpoints are written to a temporary name and renamed, so a crash mid-write leaves the
  previous checkpoint intact.
* **Step counters inside the model.** A module that follows the optimiser steps (PA's alpha warm-up) defines
  ``optimizer_step_done()``; it is called after every optimiser step (a step the fp16 scaler skips included, as
  for the learning-rate schedule). Such counters are buffers on the model's device, updated in place (no host
  sync), saved and resumed with the weights.
* **Separate loss terms.** Whatever the task's loss returns by name (task loss, NLL, Crossformer-SG, each
  Multi-Pass exit) is logged separately to ``train.csv`` and TensorBoard; validation metrics go to ``valid.csv``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Protocol

import torch
from torch import nn
from tqdm import tqdm

from ..checkpoint import canonical_state_dict, load_canonical_state_dict, save_pretrained
from ..devices import resolve_device
from ..errors import CheckpointError, DivergenceError
from ..fileio import write_atomic
from . import distributed, state_file
from .config import TrainConfig
from .device import autocast, configure_tf32, inputs_to, make_scaler, move, resolve_precision
from .epoch_checkpoints import average_weights, epoch_checkpoints, write_epoch_checkpoint
from .metric_logs import MetricLogs
from .optimizer import learning_rate, make_optimizer
from .step_logs import StepLogs

LAST = "checkpoint_last.safetensors"
LEGACY_LAST = "checkpoint_last.pt"  # the pickle format of interlayer <= 0.1.0: never read (it could run code)
BEST_DIR = "best"
# fp16: the scaler halves its scale at every overflow; this many overflows in a row (a scale 2^-25 of where it
# was) means the gradients are not finite at any scale: the model itself has diverged.
MAX_SKIPPED_STEPS = 25


class Task(Protocol):
    """What the engine needs from a task (translation, classification, ...)."""

    metric: str  # validation metric that picks the best checkpoint and drives early stopping
    higher_is_better: bool
    device: torch.device  # set by the engine: the training device, where the task scores the saved model

    def train_batches(self, epoch: int, seed: int) -> list[Any]: ...

    def model_fields(self) -> dict[str, Any]:
        """Model config fields the data decides (vocabulary size, classes, ...)."""

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any], int]:
        """(loss to minimise, named terms for the log, number of tokens or examples in the batch)

        The batch arrives on the training device: what ``train_batches`` made, passed through the task's optional
        ``prepare(batch)`` (host-side work: augmenting images, indexing data the task keeps) and moved by the
        engine (every tensor, also inside tuples, lists, dicts and dataclasses). With ``train.compile`` this whole
        method is compiled with the model, so it should be tensor work only: no Python floats of tensors (return
        the logged terms as detached tensors; the engine reads them once per ``log_interval``), no host-side
        data handling (that belongs in ``prepare``)."""

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Validation metrics; every call of ``model`` meanwhile gets its tensor inputs moved to the training
        device (the outputs are there too: the task compares them with targets it moves, or moves them back)."""

    def save_assets(self, directory: Path) -> None:
        """Write what a saved model needs besides its weights (e.g. the tokenizer)."""


@dataclasses.dataclass
class TrainState:
    """Where a run stands, saved in every checkpoint and restored on resume: the epoch and the batch inside it, the
    optimiser step, the training seconds spent (the time budget), the best validation metric and its epoch (early
    stopping's reference), and why the run stopped."""

    epoch: int = 1
    batch_in_epoch: int = 0
    step: int = 0
    elapsed: float = 0.0
    best: Optional[float] = None
    best_metrics: Optional[dict[str, float]] = None  # the last improving validation (the patience reference)
    saved_metrics: Optional[dict[str, float]] = None  # the validation of the model in best/
    best_epoch: int = 0
    bad_epochs: int = 0
    finished: bool = False
    stop_reason: str = ""
    averaged: str = ""  # what ``averaged/`` holds, or why there is none (a budget that ended in epoch 1)


def budget_steps(steps_timed: int, seconds_timed: float, elapsed: float, max_minutes: float, step: int,
                 step_budget: int) -> int:
    """The optimiser step at which training will stop: the step budget, or sooner when the time budget
    (``max_minutes``, of which ``elapsed`` seconds are used) runs out first at the pace of this session
    (``steps_timed`` steps in ``seconds_timed`` seconds). The progress bar's total, so that its ETA is the true
    time left under ``--max-minutes`` rather than that of steps the budget will never reach."""
    if steps_timed <= 0 or seconds_timed <= 0:
        return step_budget
    left = max(max_minutes * 60 - elapsed, 0.0)
    return min(step_budget, step + math.ceil(left * steps_timed / seconds_timed))


class Trainer:
    """The training loop every task shares (the module docstring lists what it guarantees): ``fit`` trains ``model`` on
    ``task`` with the settings ``cfg`` until a limit (epochs, steps, minutes, patience) or a signal, writing the run
    directory ``run_dir`` (checkpoints, ``best/``, ``averaged/``, the logs).

    A task needs only the :class:`Task` protocol (batches, a loss, a validation); the model is any ``nn.Module``.
    ``resume=True`` continues from ``checkpoint_last.safetensors`` to the bit. Under ``torchrun`` every rank runs one,
    and only the main rank writes."""

    stop_signal: Optional[int] = None  # the signal (SIGINT, SIGTERM) that stopped fit(): the CLI's exit code

    def __init__(self, task: Task, model: nn.Module, cfg: TrainConfig, run_dir: Path, *, resume: bool = False,
                 progress: bool = True) -> None:
        cfg.validate()
        self.task, self.cfg = task, cfg
        self.dist = distributed.environment()
        self.device = resolve_device(cfg.device, self.dist.local_rank, self.dist.world_size)
        self.precision = resolve_precision(cfg.precision, self.device)
        distributed.initialise(self.dist, self.device.type)
        configure_tf32(self.device, cfg.tf32)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress and self.dist.is_main
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.model = model.to(self.device)
        task.device = self.device  # where the task's finish hook scores the saved model after training
        # DDP averages gradients over ranks and broadcasts rank 0's initial weights; tied parameters (Crossformer
        # HG, LW sharing, MPT's reused layers) are single Parameters, which DDP handles like any other. Unused
        # parameters are possible (an MPT random pass that stops early), hence find_unused_parameters.
        train_model: nn.Module = model
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            train_model = nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)
        self.train_model = train_model
        # The whole training step's forward is compiled as one graph: the model *and* the task's loss (its label
        # smoothing, exits and auxiliary terms), so the loss fuses with the logits instead of running eager on an
        # fp32 copy of them (12 of 49 ms of a GPT-2-small step on an H100, docs/benchmarks.md). Validation and
        # decoding run the eager model (their shapes change every call, and a graph per shape costs more than it
        # saves).
        self.step_loss = torch.compile(task.loss) if cfg.compile else None
        self.step_logs = StepLogs(self.dist)
        self._step_listeners = [m for m in model.modules() if callable(getattr(m, "optimizer_step_done", None))]
        self.scaler = make_scaler(self.device, self.precision)
        self._skipped_steps = 0
        self.optimizer = make_optimizer(model, cfg, self.device)
        self.state = TrainState()
        model_config = getattr(model, "config", None)
        self.logs = MetricLogs(self.run_dir, self.dist.is_main, cfg.logger,
                          {"train": dataclasses.asdict(cfg),
                           "model": model_config.to_dict() if hasattr(model_config, "to_dict") else None})
        self._stop_requested = False
        self._asset_cache: Optional[dict[str, bytes]] = None
        self._total_steps = cfg.max_steps
        self._steps_per_epoch = 1
        if resume:
            self._resume()
        else:
            if (self.run_dir / LAST).exists() or (self.run_dir / LEGACY_LAST).exists():
                raise FileExistsError(f"{self.run_dir} already holds a run ({LAST}); pass resume=True (--resume) to "
                                      "continue it, or choose another run directory")
            state_file.seed_all(cfg.seed + self.dist.rank)  # ranks draw different dropout masks

    # -- checkpoints -------------------------------------------------------------------------------------
    def _write_checkpoint(self, rng: list[dict[str, Any]]) -> None:
        state_file.write(self.run_dir / LAST, model=canonical_state_dict(self.model),
                         optimizer=self.optimizer.state_dict(), rng=rng, assets=self._assets(),
                         metadata={"model_config": self.model.config.to_dict(),
                                   "train_config": dataclasses.asdict(self.cfg),
                                   "state": dataclasses.asdict(self.state), "world_size": self.dist.world_size,
                                   "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                                   "device": str(self.device), "precision": self.precision})

    def _assets(self) -> dict[str, bytes]:
        """The task's files (vocabulary, data settings) by name, so the checkpoint alone can rebuild the run."""
        if self._asset_cache is None:
            with tempfile.TemporaryDirectory() as tmp:
                self.task.save_assets(Path(tmp))
                self._asset_cache = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
        return self._asset_cache

    def save_last(self) -> None:
        """Rank 0 writes the checkpoint, holding every rank's random generators (a collective call), after the
        pending step terms are read: a diverged step stops the run before its weights reach the disk."""
        self._read_logs()
        rng = distributed.gather(state_file.rng_state(), self.dist)
        if self.dist.is_main:
            self._write_checkpoint(rng)
        distributed.barrier(self.dist)

    def _resume(self) -> None:
        path = self.run_dir / LAST
        if not path.exists():
            legacy = self.run_dir / LEGACY_LAST
            if legacy.exists():
                raise CheckpointError(f"{legacy} is a pickle checkpoint (interlayer 0.1.0's format); it is not read, "
                                      "because unpickling a file can run any code it names. Delete it to start "
                                      "the run again, or re-create it with the interlayer that wrote it")
            raise FileNotFoundError(f"cannot resume: {path} does not exist (start without --resume)")
        ckpt = state_file.read(path)
        current = self.model.config.to_dict()
        if ckpt["model_config"] != current:
            diff = {k: (v, current.get(k)) for k, v in ckpt["model_config"].items() if current.get(k) != v}
            raise CheckpointError(f"{path} was written by a different model; differing fields (checkpoint, now): "
                                  f"{diff}")
        load_canonical_state_dict(self.model, ckpt["model"], source=str(path))
        if ckpt.get("world_size", 1) != self.dist.world_size:
            raise CheckpointError(f"{path} was written by a run of {ckpt.get('world_size', 1)} processes; resume it "
                                  f"with the same number (now {self.dist.world_size}), or batches would change")
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.state = TrainState(**ckpt["state"])
        state_file.set_rng_state(ckpt["rng"][self.dist.rank])

    def _save_epoch(self, epoch: int) -> None:
        if self.dist.is_main:
            write_epoch_checkpoint(self.model, self.run_dir, epoch, self.cfg.keep_last)

    def save_model(self, directory: Path) -> None:
        if not self.dist.is_main:
            return
        save_pretrained(self.model, directory)
        self.task.save_assets(directory)
        write_atomic(directory / "train_config.json", json.dumps(dataclasses.asdict(self.cfg), indent=2))

    # -- the loop ---------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Finish the current step, save, and return from :meth:`fit` (what SIGINT/SIGTERM do)."""
        self._stop_requested = True

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_signal = signum
        self.request_stop()

    def _out_of_budget(self, elapsed: float) -> Optional[str]:
        """Why training must stop after ``elapsed`` seconds of training (all segments), or None."""
        if self.cfg.max_steps and self.state.step >= self.cfg.max_steps:
            return f"max_steps={self.cfg.max_steps} reached"
        if self.cfg.max_minutes and elapsed >= self.cfg.max_minutes * 60:
            return f"time budget of {self.cfg.max_minutes} minutes used"
        return None

    def fit(self) -> TrainState:
        """Train until a limit or a signal (SIGINT and SIGTERM only set a flag: the current step ends and a checkpoint
        is written), then finish (validate a partial epoch so that ``best/`` holds the best model so far, average the
        last checkpoints with ``average_last``); returns the final :class:`TrainState`. A finished run returns at
        once."""
        if self.state.finished:
            return self.state
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for sig in previous:
                signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: signals stay as they are
            previous = {}
        try:
            self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.logs.close()
        return self.state

    def _step_batches(self, batches: list[Any]) -> list[list[Any]]:
        """This rank's batches for each optimiser step of the epoch.

        A step consumes ``world_size x update_freq`` consecutive batches; rank r takes ``update_freq`` of them. So
        N processes with ``update_freq=1`` see exactly the batches of one process with ``update_freq=N``. The few
        batches at the end of an epoch that cannot fill a whole step are skipped.
        """
        per_rank, ranks = self.cfg.update_freq, self.dist.world_size
        per_step = per_rank * ranks
        start = self.dist.rank * per_rank
        return [batches[i + start : i + start + per_rank] for i in range(0, len(batches) - per_step + 1, per_step)]

    def _loop(self) -> None:
        state = self.state
        started = time.perf_counter()
        # one bar for the run, counting optimiser steps against the budget (see budget_steps)
        bar = tqdm(initial=state.step, unit="step", disable=not self.progress, dynamic_ncols=True, leave=False)
        try:
            self._epochs(started, bar)
        finally:
            bar.close()

    def _epochs(self, started: float, bar: tqdm) -> None:
        cfg, state = self.cfg, self.state
        first_step, first_elapsed = state.step, state.elapsed
        while state.epoch <= cfg.max_epochs:
            steps = self._step_batches(self.task.train_batches(state.epoch, cfg.seed))
            if not steps:
                raise ValueError(f"epoch {state.epoch} has fewer batches than one optimiser step needs "
                                 f"(world_size x update_freq = {self.dist.world_size * cfg.update_freq}); lower "
                                 "train.max_tokens or train.update_freq")
            self._steps_per_epoch = len(steps)
            self._total_steps = cfg.max_steps or cfg.max_epochs * len(steps)
            bar.total = self._bar_total(first_step, first_elapsed, state.elapsed)
            bar.set_description(f"epoch {state.epoch}")
            window_start = time.perf_counter()
            self.step_logs.take_units()  # the throughput of a window counts the steps of this epoch only
            for micro_batches in steps[state.batch_in_epoch:]:
                elapsed = state.elapsed + time.perf_counter() - started
                reason = self._out_of_budget(elapsed)
                # the ranks' mean elapsed time: one budget share, hence one learning rate, on every rank
                budget, stop, elapsed = distributed.sum_all(
                    [float(reason is not None), float(self._stop_requested), elapsed], self.dist)
                if budget:
                    return self._stop(started, reason or "budget used up on another rank", bar, resumable=False)
                if stop:
                    return self._stop(started, "stopped by request (signal)", bar, resumable=True)
                used = elapsed / self.dist.world_size / (cfg.max_minutes * 60) if cfg.max_minutes else 0.0
                self._step(micro_batches, used)
                state.batch_in_epoch += 1
                bar.update(1)
                if cfg.max_minutes:
                    bar.total = self._bar_total(first_step, first_elapsed,
                                                state.elapsed + time.perf_counter() - started)
                if state.step % cfg.log_interval == 0:
                    row = self.step_logs.row(self._diverged_at)  # a window may start mid-interval
                    seconds = time.perf_counter() - window_start
                    row.update(epoch=state.epoch, lr=self.optimizer.param_groups[0]["lr"],
                               units_per_s=self.step_logs.take_units() / max(seconds, 1e-9))
                    self.logs.write("train", state.step, row)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.2e}",
                                    tok_s=f"{row['units_per_s']:.0f}")
                    window_start = time.perf_counter()
                if cfg.save_interval_steps and state.step % cfg.save_interval_steps == 0:
                    self._bank_time(started)
                    started = time.perf_counter()
                    self.save_last()
            if self._end_epoch(started):
                return
            started = time.perf_counter()
        state.stop_reason = state.stop_reason or f"max_epochs={cfg.max_epochs} reached"
        self._finish()

    def _bar_total(self, first_step: int, first_elapsed: float, elapsed: float) -> int:
        """The progress bar's total: the step budget, or under ``max_minutes`` the step the time budget will end
        at (:func:`budget_steps`, timed since this session's ``first_step``), so tqdm's ETA is the time left."""
        if not self.cfg.max_minutes:
            return self._total_steps
        return budget_steps(self.state.step - first_step, elapsed - first_elapsed, elapsed, self.cfg.max_minutes,
                            self.state.step, self._total_steps)

    def _step(self, micro_batches: list[Any], budget_used: float = 0.0) -> None:
        """One optimiser step over this rank's micro-batches (``budget_used``: the share of the time budget spent,
        for ``anneal_to_budget``); its logged terms go to :attr:`step_logs`, still on the device.

        Each micro-batch's mean loss is weighted by its units (tokens or examples) and the summed gradient is
        divided by the units of the whole step over all ranks, so the update is the gradient of the mean loss over
        the global batch whatever the split into processes and micro-batches (tested: 2 processes = 1 process with
        ``update_freq=2``). In one process nothing here waits for the device (no ``float(tensor)``, no
        ``.item()``): the loss terms and the gradient norm are read once per ``log_interval`` by
        :class:`~interlayer.training.step_logs.StepLogs`. Several processes agree on the step's units with one
        small all-reduce; fp16's gradient scaler reads its overflow flag every step (PyTorch's ``GradScaler``).
        """
        self.train_model.train()
        self.state.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.state.step, self.cfg, self._total_steps, self._steps_per_epoch,
                                        budget_used)
        self.optimizer.zero_grad(set_to_none=True)
        step_loss = self.step_loss or self.task.loss  # eager: the task's loss as it is now
        local_units, sums = 0.0, {}
        for i, batch in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last or not self.dist.enabled else self.train_model.no_sync()
            with sync:
                inputs = move(self._prepare(batch), self.device)
                with autocast(self.device, self.precision):
                    loss, logs, units = step_loss(self.train_model, inputs)
                scaled = loss * units
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            local_units += units
            for key, value in logs.items():
                sums[key] = sums.get(key, 0.0) + value * units
        units = distributed.sum_all([local_units], self.dist)[0]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # true gradients, for the division below and for clipping
        # DDP averaged over ranks: undo, then divide by all units
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, self.dist.world_size / max(units, 1.0))
        per_step: dict[str, Any] = {}
        if self.cfg.clip_norm:
            per_step["grad_norm"] = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        if self.scaler is None:
            self.optimizer.step()
            self._optimizer_step_done()
            self.step_logs.add(self.state.step, sums, units, per_step)
            return
        per_step.pop("grad_norm", None)  # an overflowing fp16 step has an infinite norm: the scaler skips it
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # skipped when the unscaled gradients hold inf/NaN
        self.scaler.update()
        self._optimizer_step_done()
        self._skipped_steps = self._skipped_steps + 1 if self.scaler.get_scale() < before else 0
        per_step["loss_scale"] = self.scaler.get_scale()
        self.step_logs.add(self.state.step, sums, units, per_step)
        if self._skipped_steps > MAX_SKIPPED_STEPS:
            raise DivergenceError(self._diverged(f"the fp16 gradients overflowed {self._skipped_steps} steps in a "
                                                 f"row (loss scale now {self.scaler.get_scale():.3g})"))

    def _prepare(self, batch: Any) -> Any:
        """The task's host-side preparation of a batch (``Task.prepare``: augmentation, indexing), if it has one."""
        prepare = getattr(self.task, "prepare", None)
        return prepare(batch) if prepare is not None else batch

    def _read_logs(self) -> None:
        """Bring the pending step terms to the host, stopping the run if a step diverged (before any checkpoint)."""
        self.step_logs.read(self._diverged_at)

    def _diverged_at(self, what: str, step: int) -> DivergenceError:
        return DivergenceError(self._diverged(what, step))

    def _optimizer_step_done(self) -> None:
        for module in self._step_listeners:
            module.optimizer_step_done()

    def _diverged(self, what: str, step: Optional[int] = None) -> str:
        kept = (f"{self.run_dir / LAST} (written before the divergence) is kept"
                if (self.run_dir / LAST).exists() else "no checkpoint had been written yet")
        step = self.state.step if step is None else step
        return (f"training diverged at step {step}: {what}; {kept}. Lower train.lr (now {self.cfg.lr}) "
                "or raise the warm-up, check the data for non-finite values, or use train.precision=fp32")

    def _judge(self, metrics: dict[str, float]) -> tuple[bool, bool]:
        """``(improved, best)``: whether the epoch resets the patience, and whether it becomes ``best/``.

        By default both mean "the task's metric got better". A task may define ``is_improvement`` and ``is_best``
        (each ``(metrics, best_metrics) -> bool``, ``best_metrics`` being the last improving epoch's): GAT's
        official rule resets the patience when the loss *or* the accuracy improves but saves only when both do.
        """
        best = self.state.best_metrics
        if best is None:
            return True, True
        saving_rule = getattr(self.task, "is_best", None)
        saves = bool(saving_rule(metrics, best)) if saving_rule is not None else None
        rule = getattr(self.task, "is_improvement", None)
        if rule is not None:
            improved = bool(rule(metrics, best))
        else:
            value, previous = metrics[self.task.metric], best[self.task.metric]
            improved = value > previous if self.task.higher_is_better else value < previous
        return improved, improved if saves is None else saves

    def _record(self, metrics: dict[str, float]) -> bool:
        """Judge a validation, keep ``best/`` and the patience count; True when it was an improvement."""
        state = self.state
        improved, best = self._judge(metrics)
        if improved:
            state.best_metrics, state.bad_epochs = metrics, 0
        else:
            state.bad_epochs += 1
        if best:
            state.best, state.saved_metrics, state.best_epoch = metrics[self.task.metric], metrics, state.epoch
            self.save_model(self.run_dir / BEST_DIR)
        return improved

    def _validate(self) -> dict[str, float]:
        """The task's validation of the eager model, in the training precision, after the pending step terms are
        read (a diverged step is named as such, before anything is saved); a score that is not a finite number
        stops the run as a diverged loss does (the last optimiser step is checked by nothing else: a one-step run
        at ``lr=1e30`` would "finish" with NaN scores). The model's inputs are moved to the device on every call
        meanwhile, as training batches are."""
        self._read_logs()
        with autocast(self.device, self.precision), inputs_to(self.model, self.device):
            metrics = self.task.validate(self.model)
        bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            shown = ", ".join(f"{k} {v}" for k, v in bad.items())
            raise DivergenceError(self._diverged(f"the validation scores are not finite ({shown})"))
        return metrics

    def _bank_time(self, started: float) -> None:
        self.state.elapsed += time.perf_counter() - started

    def _end_epoch(self, started: float) -> bool:
        """Validate, keep the best model, write checkpoints; True when training should stop."""
        state, cfg = self.state, self.cfg
        self._bank_time(started)
        metrics = self._validate()
        improved = self._record(metrics)
        self.logs.write("valid", state.step, {"epoch": state.epoch, **metrics, "elapsed_min": state.elapsed / 60})
        if self.progress:
            shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            tqdm.write(f"epoch {state.epoch}: {shown}{' (best)' if improved else ''}")
        self._save_epoch(state.epoch)
        state.epoch += 1
        state.batch_in_epoch = 0
        stop = self._out_of_budget(self.state.elapsed)
        if distributed.any_rank(bool(stop), self.dist) and not stop:
            stop = "another rank ran out of budget"
        if cfg.patience and state.bad_epochs >= cfg.patience:
            stop = f"early stopping: no better {self.task.metric} for {cfg.patience} epochs"
        if stop:
            state.stop_reason = stop
            self._finish()
            return True
        self.save_last()
        return False

    def _stop(self, started: float, reason: str, bar: tqdm, resumable: bool) -> None:
        bar.close()
        self._bank_time(started)
        self.state.stop_reason = reason
        if resumable:
            self.save_last()  # the run is not finished: --resume continues it
        else:
            self._finish()

    def _finish(self) -> None:
        """Budget reached or training converged: optionally average, mark finished, save."""
        # The budget ran out mid-epoch (or before the first step): validate here, so that best/ exists and holds
        # the best model so far, as every task's finish hook expects.
        if self.state.batch_in_epoch or self.state.saved_metrics is None:
            metrics = self._validate()
            self._record(metrics)
            self.logs.write("valid", self.state.step, {"epoch": self.state.epoch, **metrics,
                                                       "elapsed_min": self.state.elapsed / 60})
        if self.cfg.average_last > 1 and self.dist.is_main:
            self.state.averaged = self._average_what_exists(self.cfg.average_last)
        self.state.finished = True
        self.save_last()

    def _average_what_exists(self, n: int) -> str:
        """Average the last ``n`` epoch checkpoints, or as many as the run wrote; the sentence that says which.

        A budget that ends before the first epoch does leaves no epoch checkpoint: there is then nothing to average,
        the run keeps ``best/`` (validated where the budget ended) and says so instead of failing after training.
        """
        paths = epoch_checkpoints(self.run_dir)[-n:]
        if not paths:
            return (f"none: train.average_last={n}, but the run ended in epoch {self.state.epoch} before any epoch "
                    "checkpoint was written; best/ is the final model")
        self.average_checkpoints(len(paths))
        names = ", ".join(p.name for p in paths)
        short = f" (fewer than train.average_last={n}: the run wrote no more)" if len(paths) < n else ""
        return f"averaged/ is the mean of {names}{short}"

    def average_checkpoints(self, n: int) -> Path:
        """Average the last ``n`` epoch checkpoints into ``averaged/`` (Vaswani et al. 2017, Sec. 6.1)."""
        paths = epoch_checkpoints(self.run_dir)[-n:]
        if not paths:
            raise FileNotFoundError(f"{self.run_dir} holds no epoch checkpoint (checkpoint<N>.safetensors) to "
                                    "average")
        averaged = average_weights(paths)
        current = {k: v.detach().clone() for k, v in canonical_state_dict(self.model).items()}
        load_canonical_state_dict(self.model, averaged, source=f"average of {[p.name for p in paths]}")
        self.save_model(self.run_dir / "averaged")
        load_canonical_state_dict(self.model, current)
        return self.run_dir / "averaged"
