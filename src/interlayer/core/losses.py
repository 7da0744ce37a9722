"""Loss terms: label-smoothed cross-entropy, and the sum over model exits plus auxiliary losses.

They live in the core because the models compute them too: ``model(..., labels=...)`` returns ``.loss`` as the
tasks compute it (:func:`labels_loss`), so Hugging Face habits and the training engine agree.

Every term is also returned under its own name, so the Crossformer-SG regulariser and each Multi-Pass exit's loss
are logged separately from the task loss they are added to. The logged terms are detached 0-dim tensors, never
Python floats: reading a float would wait for the device (a host synchronisation) and break a compiled graph, so the
training engine reads them once per logging interval instead (``train.log_interval``).

Two decisions a caller may meet:

* **Shapes are checked**: ``target`` must have the logits' shape without the class axis (with ``labels=`` on a
  causal LM: the input ids' shape). A smaller target would otherwise index a part of the logits and give a number.
* **Labels outside the classes are refused** where a host sees them: ``model(labels=)`` outside compiled code
  (:func:`check_labels`), and each task's data before any step (``experiment.check_before_training``). Inside a
  compiled step no check runs (it would wait for the device and break the graph): there such a label reads no class
  and gives a NaN loss (:mod:`interlayer.kernels.cross_entropy`), which stops the run at its next log.
* **Nothing to predict gives 0, not NaN**: when every target is ``ignore_index`` the mean over no tokens is
  defined as 0 with zero gradient (Hugging Face returns NaN), so a batch that happens to hold only padding or
  prompt tokens neither stops a run as diverged nor poisons an accumulated loss.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..kernels.cross_entropy import smoothed_cross_entropy


def label_smoothed_nll(logits: Tensor, target: Tensor, smoothing: float, ignore_index: int = -100
                       ) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed loss and mean NLL (detached) over non-ignored positions (Szegedy et al. 2016).

    ``(1 - eps) * nll + eps * mean_v(-log p_v)``, PyTorch's ``label_smoothing`` form, accumulated in fp32 from
    logits of any dtype without an fp32 copy of them where the cross-entropy kernel runs
    (:mod:`interlayer.kernels.cross_entropy`), and fused by ``torch.compile`` elsewhere.
    """
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"the targets (labels) have shape {tuple(target.shape)}, but the logits "
                         f"{tuple(logits.shape)} need {tuple(logits.shape[:-1])}: one target per position (use "
                         f"{ignore_index} where no loss is wanted)")
    loss, nll = smoothed_cross_entropy(logits, target, smoothing, ignore_index)
    count = target.ne(ignore_index).sum().clamp_min(1)
    return loss.sum() / count, nll.sum() / count


def check_labels(labels: Tensor, classes: int, ignore_index: int = -100) -> None:
    """Raise ``ValueError`` naming the first label outside ``[0, classes)`` other than ``ignore_index`` (with how
    many there are): such a label would score another class, or read past the logits. Reads the labels on the host,
    so it is for code outside a compiled graph."""
    bad = labels.ne(ignore_index) & (labels.lt(0) | labels.ge(classes))
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        shown = where[0] if len(where) == 1 else where
        raise ValueError(f"labels hold {int(labels[where])} at position {shown}, outside the model's {classes} "
                         f"classes ({int(bad.sum())} such label(s)); valid labels are 0..{classes - 1}, or "
                         f"{ignore_index} where no loss is wanted")


def total_loss(output, exit_loss: Callable[[Tensor], tuple[Tensor, Tensor]], *, with_aux: bool = True
               ) -> tuple[Tensor, dict[str, Tensor]]:
    """Sum of the loss of every exit (one, unless the encoder has several) plus, ``with_aux``, the model's auxiliary
    losses, and every term by name as a detached 0-dim tensor (``loss``, ``task_loss``, ``nll``, ``loss_exitN``,
    each aux: logged even when not added)."""
    exits = output.exit_logits or [output.logits]
    logs: dict[str, Tensor] = {}
    total = torch.zeros((), device=output.logits.device)
    for i, logits in enumerate(exits):
        loss, nll = exit_loss(logits)
        total = total + loss
        if len(exits) > 1:
            logs[f"loss_exit{i + 1}"] = loss.detach()
    logs["nll"] = nll  # the main (last) exit's NLL, comparable across variants
    logs["task_loss"] = total.detach()
    for name, value in output.aux_losses.items():
        if with_aux:
            total = total + value
        logs[name] = value.detach()
    logs["loss"] = total.detach()
    return total, logs


def labels_loss(output, labels: Tensor, *, shift: bool = False, training: bool = True) -> tuple[Tensor, Tensor]:
    """The loss a model returns for Hugging Face-style ``labels`` (ignore index -100, no label smoothing), and the
    plain cross-entropy of its main output.

    In training mode the first is summed over exits and auxiliary losses exactly as the training engine sums them
    (:func:`total_loss`); in eval mode the auxiliary losses (regularisers such as Crossformer-SG) are left out, as
    ``transformers``' models leave out what only shapes training: an evaluation loss (``Trainer.evaluate``'s
    ``eval_loss``, a perplexity) is then the cross-entropy (a Multi-Pass model has one exit in eval mode). The
    second, the main (last) exit's cross-entropy whatever the mode, is what a caller logs beside a training loss.

    ``shift`` is the causal language model's convention: ``labels`` are the input ids, and position ``t``'s logits
    predict label ``t + 1``, so ``model(input_ids=x, labels=x)`` needs no shifting by the caller. The shifted views
    are read in place (no copy of the logits).
    """
    if shift and tuple(labels.shape) != tuple(output.logits.shape[:-1]):
        raise ValueError(f"labels have shape {tuple(labels.shape)}, but the input ids have "
                         f"{tuple(output.logits.shape[:-1])}: a causal LM's labels are the input ids themselves "
                         "(shifted inside), with -100 where no loss is wanted")
    if not torch.compiler.is_compiling():
        check_labels(labels[:, 1:] if shift else labels, output.logits.shape[-1])

    main: list[Tensor] = []

    def exit_loss(logits: Tensor) -> tuple[Tensor, Tensor]:
        loss, nll = label_smoothed_nll(logits[:, :-1], labels[:, 1:], 0.0) if shift else \
            label_smoothed_nll(logits, labels, 0.0)
        main[:] = [loss]  # the exits come in order, the main one last
        return loss, nll

    total = total_loss(output, exit_loss, with_aux=training)[0]
    return total, main[0]
