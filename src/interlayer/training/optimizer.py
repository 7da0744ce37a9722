"""What the optimiser is made of: Adam or AdamW (fused on a GPU), its parameter groups (which parameters weight
decay spares) and the learning rate of each step (warm-up, then the schedule, annealed to a time budget when asked):
everything of ``train.*`` the engine's optimiser step reads."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig, total_steps: int, steps_per_epoch: int,
                  budget_used: float = 0.0) -> float:
    """Linear warm-up from ``warmup_init_lr`` to ``lr``, then the schedule (see ``TrainConfig.schedule``).

    The warm-up lasts ``warmup_steps``, or ``ceil(warmup_fraction x total_steps)`` (as ``transformers``' warmup_ratio).
    The linear and cosine decays measure progress in steps; with ``cfg.anneal_to_budget`` the progress is the larger
    of that and ``budget_used``, the share of the time budget spent, so a run stopped by its budget has annealed.
    Without it, a model too slow to reach ``max_epochs`` in a comparison's budget stops at a high learning rate
    while a faster one gets the whole decay, which penalises the slow one twice (budgeted training, Li et al.
    2020, "Budgeted Training: Rethinking Deep Neural Network Training Under Resource Constraints").
    """
    warmup = cfg.warmup_steps or math.ceil(cfg.warmup_fraction * total_steps)
    if warmup and step < warmup:
        return cfg.warmup_init_lr + (cfg.lr - cfg.warmup_init_lr) * step / warmup
    progress = min(1.0, (step - warmup) / max(total_steps - warmup, 1))
    if cfg.anneal_to_budget:
        progress = max(progress, min(1.0, budget_used))
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "linear":
        return cfg.lr * (1.0 - progress)
    if cfg.schedule == "cosine":
        return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))
    if cfg.schedule == "step":
        return cfg.lr * cfg.step_gamma ** ((step - 1) // max(steps_per_epoch * cfg.step_epochs, 1))
    return cfg.lr * math.sqrt(max(warmup, 1) / max(step, 1))


_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)


def parameter_groups(model: nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """The optimiser's parameter groups: one, unless there is weight decay to spare and some parameters are spared,
    then a second group without decay for them: biases and the weights of normalisation layers when
    ``cfg.decay_bias_norm`` is off (BERT's grouping, which fine-tuning recipes expect; a LayerNorm gain decayed
    towards 0 would shrink the pretrained features), and always the parameters a module names in its
    ``no_weight_decay`` attribute (a method whose paper says so: hyper-connections' static matrices)."""
    if not cfg.weight_decay:
        return [{"params": list(model.parameters())}]
    spared: set[int] = set()
    for module in model.modules():
        named = getattr(module, "no_weight_decay", ())
        for name, param in module.named_parameters(recurse=False):
            if name in named or (not cfg.decay_bias_norm and (name == "bias" or isinstance(module, _NORMS))):
                spared.add(id(param))
    if cfg.decay_bias_norm and not spared:
        return [{"params": list(model.parameters())}]
    params = list(model.parameters())
    return [{"params": [p for p in params if id(p) not in spared]},
            {"params": [p for p in params if id(p) in spared], "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """``cfg.optimizer`` over :func:`parameter_groups`, at ``cfg.lr`` (each step sets its own rate:
    :func:`learning_rate`)."""
    optimizer = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    # On a GPU the fused kernel: one launch for every parameter's update instead of a dozen per group
    fused = {"fused": True} if device.type == "cuda" else {}
    return optimizer(parameter_groups(model, cfg), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps,
                     weight_decay=cfg.weight_decay, **fused)
