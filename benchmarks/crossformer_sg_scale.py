"""How large Crossformer-SG's term is at initialisation, for each target and reduction, against the task loss.

The paper gives alpha = 0.01 (Crossformer Appendix A.1.2) but neither the target of Eq. 1 beyond "states" nor a
reduction, so this measures what each reading makes of that alpha. For every pair set, ``soft_target`` and
``reduction`` it builds ``transformer_small`` (3+3 post-LN layers, d=256, FFN 1024, 8k shared vocabulary) with
``crossformer.soft`` at alpha = 0.01, L2 (``p=2``, ``sg_norm="power"``), runs one batch of 64 x 24 random tokens
(a quarter of the sources and targets padded by 4, as ``bench_core.py``), in eval mode so dropout does not enter
the figures, and reports:

* ``SG / task``: the term ``alpha * L_reg`` over the label-smoothed (0.1) cross-entropy of the same batch;
* ``grad SG / grad task``: the norm of the term's gradient over all parameters, over the task loss's. This is
  what the optimiser sees; Adam normalises each parameter's summed gradient, so the ratio says which of the two
  steers a guided matrix.

Each figure is the mean over ``--seeds`` initialisations (min-max in brackets).

    python benchmarks/crossformer_sg_scale.py            # the table in docs/methods/crossformer.md
    python benchmarks/crossformer_sg_scale.py --seeds 1
"""
from __future__ import annotations

import argparse
import statistics

import torch

from interlayer import create_model
from interlayer.tables import format_table
from interlayer.training.losses import label_smoothed_nll

BATCH, LENGTH, VOCAB, PAD = 64, 24, 8000, 0
PAIR_SETS = (["kq"], ["vf"], ["ffn"], ["kq", "vf", "ffn"])


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources, shifted targets and targets; a quarter of the rows end in 4 padding tokens."""
    generator = torch.Generator().manual_seed(1000 + seed)
    src = torch.randint(4, VOCAB, (BATCH, LENGTH), generator=generator)
    tgt = torch.randint(4, VOCAB, (BATCH, LENGTH + 1), generator=generator)
    src[: BATCH // 4, -4:] = PAD
    tgt[: BATCH // 4, -4:] = PAD
    return src, tgt[:, :-1], tgt[:, 1:]


def measure(pairs: list[str], target: str, reduction: str, seed: int) -> tuple[float, float]:
    torch.manual_seed(seed)
    model = create_model("transformer_small", crossformer={"soft": pairs, "alpha": 0.01, "p": 2,
                                                          "soft_target": target, "reduction": reduction}).eval()
    src, tgt_in, tgt_out = batch(seed)
    out = model(src, tgt_in)
    task, _ = label_smoothed_nll(out.logits, tgt_out, 0.1, ignore_index=PAD)
    sg = out.aux_losses["crossformer_sg"]
    params = [p for p in model.parameters() if p.requires_grad]
    grad_task = torch.autograd.grad(task, params, retain_graph=True, allow_unused=True)
    grad_sg = torch.autograd.grad(sg, params, allow_unused=True)

    def norm(grads: tuple) -> float:
        return float(torch.sqrt(sum(g.pow(2).sum() for g in grads if g is not None)))

    return float(sg.detach()) / float(task.detach()), norm(grad_sg) / norm(grad_task)


def cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    figure = f"{mean:.3g}" if mean >= 1e-3 else f"{mean:.2e}"
    return figure if len(values) == 1 else f"{figure} [{min(values):.3g}-{max(values):.3g}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for pairs in PAIR_SETS:
        for target in ("weights", "states"):
            for reduction in ("sum", "mean"):
                results = [measure(pairs, target, reduction, seed) for seed in range(args.seeds)]
                rows.append([",".join(pairs), target, reduction, cell([r[0] for r in results]),
                             cell([r[1] for r in results])])
    print(format_table(["soft", "soft_target", "reduction", "SG / task", "grad SG / grad task"], rows))


if __name__ == "__main__":
    main()
