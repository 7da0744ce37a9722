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
