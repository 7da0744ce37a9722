"""Loss terms: label-smoothed cross-entropy, and the sum over model exits plus auxiliary losses.

They live in the core because the models compute them too: ``model(..., labels=...)`` returns ``.loss`` as the
tasks compute it (:func:`labels_loss`), so Hugging Face habits and the training engine agree.

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
    """Mean label-smoothed loss and mean NLL over non-ignored positions (Szegedy et al. 2016).

    ``(1 - eps) * nll + eps * mean_v(-log p_v)``, PyTorch's ``label_smoothing`` form, computed from one
    log-softmax that also yields the NLL (``F.cross_entropy`` would need a second pass over the vocabulary for it).
    """
    lprobs = F.log_softmax(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    count = keep.sum().clamp_min(1)
    nll = -lprobs.gather(1, target.clamp_min(0)[:, None]).squeeze(1)
    per_token = nll if not smoothing else (1.0 - smoothing) * nll - smoothing * lprobs.mean(-1)
    loss = per_token.masked_fill(~keep, 0.0).sum() / count
    return loss, nll.detach().masked_fill(~keep, 0.0).sum() / count


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


def labels_loss(output, labels: Tensor, *, shift: bool = False) -> Tensor:
    """The loss a model returns for Hugging Face-style ``labels`` (ignore index -100, no label smoothing), summed
    over exits and auxiliary losses exactly as the training engine sums them (:func:`total_loss`).

    ``shift`` is the causal language model's convention: ``labels`` are the input ids, and position ``t``'s logits
    predict label ``t + 1``, so ``model(input_ids=x, labels=x)`` needs no shifting by the caller.
    """
    def exit_loss(logits: Tensor) -> tuple[Tensor, Tensor]:
        if shift:
            return label_smoothed_nll(logits[:, :-1], labels[:, 1:], 0.0)
        return label_smoothed_nll(logits, labels, 0.0)

    return total_loss(output, exit_loss)[0]
