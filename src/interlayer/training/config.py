"""Training hyper-parameters: one dataclass saved beside the model config in every run and checkpoint.

Defaults follow fairseq's IWSLT'14 recipe that the Crossformer and PA papers use: Adam (0.9, 0.98), inverse
square-root schedule with warm-up, label smoothing 0.1.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Literal

from ..config_io import check_choices, check_finite
from ..devices import resolve_device
from ..errors import ConfigError

# "adam" (L2 through weight_decay, as the papers) or "adamw" (decoupled weight decay)
Optimizer = Literal["adam", "adamw"]
# after warm-up: "inverse_sqrt" (Vaswani), "constant" (GAT), "linear" decay to 0 (BERT fine-tuning), "cosine"
# decay to min_lr (PA's SST recipe), "step": times step_gamma every step_epochs epochs (PA's SNLI recipe)
Schedule = Literal["inverse_sqrt", "constant", "linear", "cosine", "step"]
# "auto": bf16 autocast on a GPU that supports it, fp32 elsewhere; "fp16" adds a gradient scaler
PrecisionSetting = Literal["auto", "fp32", "bf16", "fp16"]
# where the scalars go beside the CSV files: TensorBoard (tb/), or Weights & Biases (the optional package wandb;
# WANDB_MODE=offline keeps the run on disk under RUN_DIR/wandb without an account)
Logger = Literal["tensorboard", "wandb"]

# The TrainConfig fields a resumed run may change (``--resume --set train.KEY=VALUE``): when the run stops, how often
# it logs and saves, and how it uses the machine; every other field is part of the run as it was started, and
# ``experiment.train`` refuses a change to it. Adding a field here is the whole change.
CHANGEABLE_ON_RESUME: frozenset[str] = frozenset({
    "max_minutes",
    "max_steps",
    "max_epochs",
    "patience",
    "log_interval",
    "save_interval_steps",
    "threads",
    "logger",
    # where and how the steps run: a run saved on a GPU resumes on a CPU and the other way round
    "device",
    "precision",
    "compile",
    "tf32",
})


@dataclass
class TrainConfig:
    """The ``train.*`` settings of a run: optimiser and learning-rate schedule (fairseq's defaults: Adam, inverse square
    root with warm-up), batches and accumulation, limits (epochs, steps, minutes, patience), checkpoints and averaging,
    logging, and where and how the steps run (device, precision, compile, TF32). A task gives its own defaults
    (``TaskSpec.train_defaults``); each field's comment says what it is, :meth:`validate` what it may be. Fields in
    :data:`CHANGEABLE_ON_RESUME` may change when a run is resumed."""

    optimizer: Optimizer = "adam"
    lr: float = 5e-4
    schedule: Schedule = "inverse_sqrt"
    min_lr: float = 0.0
    step_epochs: int = 10
    step_gamma: float = 0.1
    warmup_steps: int = 4000
    # warm-up as a share of the run's optimiser steps (BERT fine-tuning: 0.1), for recipes that give it so;
    # 0 uses warmup_steps. The two are exclusive: set the other to 0.
    warmup_fraction: float = 0.0
    warmup_init_lr: float = 1e-7
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    # False: biases and normalisation weights are spared weight decay (BERT's AdamW parameter groups, used for
    # fine-tuning); True: every parameter decays alike (the papers' L2 through Adam)
    decay_bias_norm: bool = True
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # 0 disables clipping
    max_tokens: int = 4096  # padded tokens per batch
    update_freq: int = 1  # batches accumulated per rank into one optimiser step (fairseq --update-freq)
    max_epochs: int = 50
    max_steps: int = 0  # 0: no limit
    max_minutes: float = 0.0  # wall-clock training budget, summed over resumed runs; 0: no limit
    # True: the linear and cosine decays run to their end value by the time budget (max_minutes) or the step limit,
    # whichever comes first, instead of by the step limit alone (see optimizer.learning_rate)
    anneal_to_budget: bool = False
    patience: int = 0  # epochs without a better validation metric before stopping; 0: never stop early
    save_interval_steps: int = 0  # extra mid-epoch checkpoints (0: only at the end of each epoch)
    keep_last: int = 5  # epoch checkpoints kept on disk (what averaging can use)
    average_last: int = 0  # >1: average the last N epoch checkpoints into the final model
    log_interval: int = 50
    seed: int = 1
    threads: int = 0  # torch threads; 0 keeps torch's default
    # where and how the steps run (training/device.py): "auto" is CUDA if present (each torchrun rank on the GPU of
    # its LOCAL_RANK), else Apple's MPS, else the CPU; also "cpu", "cuda", "cuda:N", "mps"
    device: str = "auto"
    precision: PrecisionSetting = "auto"
    compile: bool = False  # torch.compile the training model (zero graph breaks in every preset: tested)
    tf32: bool = True  # TensorFloat-32 matrix products on GPUs that have them; false for IEEE fp32 products
    logger: Logger = "tensorboard"  # see Logger

    def validate(self) -> None:
        check_finite(self, "train.")
        check_choices(self, "train.")
        positive = ("lr", "max_tokens", "max_epochs", "log_interval", "update_freq")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key}={getattr(self, key)} must be positive")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train.betas={self.betas} must be two numbers in [0, 1)")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"train.warmup_fraction={self.warmup_fraction} must lie in [0, 1) (a share of the "
                              "run's optimiser steps)")
        if self.warmup_fraction and self.warmup_steps:
            raise ConfigError(f"train.warmup_steps={self.warmup_steps} and train.warmup_fraction="
                              f"{self.warmup_fraction} are both set; warm-up is given one way: set the other to 0")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing} must lie in [0, 1)")
        for key in ("min_lr", "step_gamma", "step_epochs", "warmup_steps", "max_steps", "patience",
                    "save_interval_steps", "keep_last", "average_last", "threads", "clip_norm", "max_minutes",
                    "weight_decay", "warmup_init_lr", "adam_eps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}={getattr(self, key)} must not be negative")
        cores = os.cpu_count() or 1
        if self.threads > cores:  # thousands of threads fail in the thread pool's start, not with a clear message
            raise ConfigError(f"train.threads={self.threads} is more than this machine's {cores} CPU cores; give "
                              f"1..{cores}, or 0 for PyTorch's default")
        if not 0 <= self.seed < 2 ** 32:  # numpy's generators take no other seed; each rank adds its rank to it
            raise ConfigError(f"train.seed={self.seed} is outside 0..{2 ** 32 - 1}, the seeds every random generator "
                              "(Python, numpy, torch) accepts; give --seed in that range")
        if self.anneal_to_budget and not self.max_minutes:
            raise ConfigError("train.anneal_to_budget=true decays the learning rate over the time budget, but "
                              "train.max_minutes is 0 (no budget); set train.max_minutes (compare: --budget-minutes)")
        if self.anneal_to_budget and self.schedule not in ("linear", "cosine"):
            raise ConfigError(f"train.anneal_to_budget=true applies to the decaying schedules 'linear' and 'cosine', "
                              f"not train.schedule={self.schedule!r}")
        if not isinstance(self.device, str) or not self.device.strip():
            raise ConfigError(f"train.device={self.device!r} is not valid; choose auto, cpu, cuda, cuda:N or mps")
        resolve_device(self.device)  # a device this machine lacks is refused before a run directory is written
        if self.logger == "wandb" and importlib.util.find_spec("wandb") is None:
            raise ConfigError("train.logger=wandb needs the optional package wandb: pip install 'interlayer[wandb]' "
                              "(or train.logger=tensorboard)")
        if self.average_last > self.keep_last:
            raise ConfigError(f"train.average_last={self.average_last} needs keep_last >= it "
                              f"(keep_last={self.keep_last}): averaging reads the kept epoch checkpoints")
