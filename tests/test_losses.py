"""core.losses.total_loss: every term it sums must reach the parameters' gradients, not only its logs.

The Crossformer-SG term (Eq. 2: ``L = L_nll + alpha L_reg``) and the loss of every Multi-Pass exit (MPT Sec. 3.2:
"the sum of L(S_{N-1}, T) and L(S~_{N-1}, T)") are added by ``total_loss``; its gradient must be the sum of the
terms' gradients, each computed here on its own.
"""
from __future__ import annotations

import pytest
import torch

from interlayer import create_model
from interlayer.core.losses import label_smoothed_nll, total_loss

TINY = dict(arch="encoder_decoder", src_vocab_size=40, d_model=16, n_heads=2, d_ffn=32, enc_layers=3, dec_layers=2,
            dropout=0.0)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    src, tgt = torch.randint(1, 40, (2, 6)), torch.randint(1, 40, (2, 5))
    src[1, -2:] = 0
    tgt[1, -1] = 0
    return src, tgt, torch.roll(tgt, -1, dims=1)


@pytest.mark.parametrize("soft_target", ["weights", "states"])
def test_total_loss_gradient_is_the_sum_of_every_exit_and_the_sg_term(soft_target: str) -> None:
    model = create_model(dict(TINY, multipass={"passes": 2, "loss": "all"},
                              crossformer={"soft": ["kq"], "soft_target": soft_target, "alpha": 0.5})).train()
    params = [p for p in model.parameters() if p.requires_grad]
    src, tgt_in, tgt_out = _batch()

    def exit_loss(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return label_smoothed_nll(logits, tgt_out, 0.1, ignore_index=0)

    out = model(src, tgt_in)
    terms = [exit_loss(logits)[0] for logits in out.exit_logits] + [out.aux_losses["crossformer_sg"]]
    assert len(terms) == 3  # pass 1, pass 2, SG
    separate = [torch.autograd.grad(term, params, retain_graph=True, allow_unused=True) for term in terms]

    total, logs = total_loss(model(src, tgt_in), exit_loss)
    total.backward()
    for i, param in enumerate(params):
        expected = sum(grads[i] for grads in separate if grads[i] is not None)
        assert param.grad is not None and isinstance(expected, torch.Tensor), i
        torch.testing.assert_close(param.grad, expected)
    # each term moves some parameter the others leave alone or move differently, so dropping one shows
    for k, grads in enumerate(separate):
        assert any(g is not None and g.abs().sum() > 0 for g in grads), k
    values = [float(term.detach()) for term in terms]
    assert logs["loss"] == pytest.approx(sum(values), rel=1e-5)
    assert (logs["loss_exit1"], logs["loss_exit2"], logs["crossformer_sg"]) == pytest.approx(values, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reference", "triton"])
def test_labels_and_the_lm_tasks_loss_trace_without_graph_breaks(tmp_path, mode) -> None:
    """``model(input_ids, labels=)`` and the language-modelling task's loss (what ``train.compile`` compiles, the
    model with its loss) are single graphs: no ``float()`` of a loss term, no host synchronisation, and no check of
    the labels' range there (issue 49: it runs outside compiled code only), whatever the kernel mode."""
    from interlayer.kernels.dispatch import kernel_mode
    from interlayer.tasks.language_modeling import LanguageModelingTask, LMData
    from interlayer.training.config import TrainConfig

    text = tmp_path / "book.txt"
    text.write_text("to be, or not to be: that is the question.\n" * 20, encoding="utf-8")
    task = LanguageModelingTask(LMData(path=str(text), block_size=16, eval_interval=2),
                                TrainConfig(max_tokens=32, label_smoothing=0.1))
    model = create_model("gpt_shakespeare_char", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, max_positions=16,
                         src_vocab_size=len(task.tokenizer), crossformer={"soft": ["kq"]})
    batch = task.train_batches(1, 0)[0]
    torch._dynamo.reset()
    with kernel_mode(mode):
        for fn, args in ((lambda ids: model(input_ids=ids, labels=ids).loss, (batch[:, :-1],)),
                         (lambda b: task.loss(model, b)[0], (batch,))):
            explained = torch._dynamo.explain(fn)(*args)
            assert explained.graph_break_count == 0, explained.break_reasons


def test_labels_of_the_wrong_shape_are_refused_and_all_ignored_gives_zero() -> None:
    """Hugging Face raises for labels that do not match the input; interlayer too, naming both shapes. A batch
    whose every label is ignored has a loss of 0 with zero gradient (a documented choice: Hugging Face gives NaN)."""
    model = create_model("gpt_shakespeare_char", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, max_positions=8,
                         src_vocab_size=20)
    ids = torch.randint(0, 20, (2, 6))
    for bad in (ids[:1], ids[:, :3]):
        with pytest.raises(ValueError, match=rf"labels have shape \({bad.shape[0]}, {bad.shape[1]}\).*\(2, 6\)"):
            model(input_ids=ids, labels=bad)
    loss = model(input_ids=ids, labels=torch.full_like(ids, -100)).loss
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is None or not p.grad.any() for p in model.parameters())


@pytest.mark.parametrize("mode", ["reference", "triton"])
@pytest.mark.parametrize("arch", ["causal_lm", "encoder_classifier"])
def test_labels_outside_the_classes_are_refused_in_a_direct_call(mode, arch) -> None:
    """``model(labels=)`` outside compiled code: a label equal to the vocabulary (the Triton kernel read past its
    row), above it or negative other than -100 (the reference scored -5 as class 0) is refused with one line naming
    it and its position, on the reference path and under ``TRITON_INTERPRET=1 INTERLAYER_KERNELS=triton``."""
    from interlayer.kernels.dispatch import kernel_mode

    fields = dict(num_classes=3) if arch == "encoder_classifier" else {}
    model = create_model(dict(arch=arch, src_vocab_size=20, d_model=16, n_heads=2, d_ffn=32, enc_layers=1,
                              max_positions=8, **fields))
    classes = 3 if fields else 20
    ids = torch.randint(1, 20, (2, 6))
    labels = ids.clone() if not fields else torch.tensor([0, 2])
    with kernel_mode(mode):
        model(input_ids=ids, labels=labels).loss.backward()
        for bad in (classes, classes + 7, -5):
            wrong = labels.clone()
            wrong.view(-1)[-1] = bad
            with pytest.raises(ValueError, match=rf"^labels hold {bad} at position (\d+|\(\d+, \d+\)), outside the "
                                                 rf"model's {classes} classes \(1 such label\(s\)\); valid labels "
                                                 rf"are 0\.\.{classes - 1}, or -100 where no loss is wanted$"):
                model(input_ids=ids, labels=wrong)
        ignored = labels.clone()
        ignored.view(-1)[-1] = -100
        assert torch.isfinite(model(input_ids=ids, labels=ignored).loss)
