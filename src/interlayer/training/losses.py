"""Loss terms: label-smoothed cross-entropy, and the sum over model exits plus auxiliary losses.

Every term is also returned as a float under its own name, so the Crossformer-SG regulariser and each Multi-Pass
exit's loss are logged separately from the task loss they are added to.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, smoothing: float, ignore_index: int = -100
                       ) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed loss and mean NLL over non-ignored positions (Szegedy et al. 2016, fairseq's form)."""
    logits = logits.reshape(-1, logits.shape[-1]).float()
    target = target.reshape(-1)
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=smoothing)
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, ignore_index=ignore_index) if smoothing else loss.detach()
    return loss, nll


def total_loss(output, exit_loss: Callable[[Tensor], tuple[Tensor, Tensor]]) -> tuple[Tensor, dict[str, float]]:
    """Sum of the loss of every exit (one, unless the encoder has several) plus the model's auxiliary losses."""
    exits = output.exit_logits or [output.logits]
    logs: dict[str, float] = {}
    total = torch.zeros((), device=output.logits.device)
    for i, logits in enumerate(exits):
        loss, nll = exit_loss(logits)
        total = total + loss
        if len(exits) > 1:
            logs[f"loss_exit{i + 1}"] = float(loss.detach())
    logs["nll"] = float(nll)  # the main (last) exit's NLL, comparable across variants
    task = float(total.detach())
    for name, value in output.aux_losses.items():
        total = total + value
        logs[name] = float(value.detach())
    logs["task_loss"] = task
    logs["loss"] = float(total.detach())
    return total, logs
