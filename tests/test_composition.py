"""Every pair of methods either composes (builds, trains one step, counts MAdds exactly) or is rejected with the
reason. The expected verdict of each pair is written down here, so a change in what composes cannot go unnoticed."""
import itertools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from interlayer import ConfigError, count_madds, create_model

SECTIONS = {
    "crossformer": {"hard": ["kq", "vf", "ffn"]},
    "crossformer_soft": {"soft": ["kq", "vf", "ffn"], "alpha": 0.1},
    "multipass": {"connection": "soft", "loss": "all"},
    "predictive": {"alpha": 0.5},
    "conv_branch": {},
    "lightweight": {"groups": 2},
    "layer_sharing": {},  # ALBERT: every layer of each stack runs one block
    "value_residual": {"learnable": True},
    "cla": {"sharing_factor": 2},
    "denseformer": {"dilation": 2, "period": 1},
    "hyper_connections": {"rate": 2},
    "mhc": {"rate": 2},
    "muddformer": {"dilation": 1, "period": 1},
}
# Pairs that cannot work, and the words their error must contain.
REJECTED = {
    frozenset({"crossformer", "lightweight"}): "lightweight",
    frozenset({"crossformer_soft", "lightweight"}): "lightweight",
    frozenset({"crossformer", "conv_branch"}): "conv_branch",
    frozenset({"crossformer_soft", "conv_branch"}): "conv_branch",
    frozenset({"lightweight", "conv_branch"}): "conv_branch",
    frozenset({"crossformer", "layer_sharing"}): "layer_sharing.share='all' and crossformer.hard",
    frozenset({"crossformer_soft", "layer_sharing"}): "layer_sharing.share='all' and crossformer.soft",
    frozenset({"crossformer", "crossformer_soft"}): "",  # one section: not a pair (skipped below)
    **{frozenset({m, o}): w for m in ("value_residual", "cla") for o, w in
       (("lightweight", "lightweight.attention"), ("conv_branch", "conv_branch"))},
    frozenset({"cla", "crossformer"}): "shares the computed keys/values",
    frozenset({"cla", "crossformer_soft"}): "shares the computed keys/values",
    frozenset({"multipass", "hyper_connections"}): "neither paper says which stream",
    frozenset({"denseformer", "hyper_connections"}): "cannot be combined",
    frozenset({"multipass", "mhc"}): "neither paper says which stream",
    **{frozenset({"mhc", o}): f"mhc and {o}" for o in ("hyper_connections", "denseformer", "muddformer")},
    **{frozenset({"muddformer", o}): f"muddformer and {o}" for o in ("hyper_connections", "denseformer")},
    # multiway MUDDFormer hands the self-attention separate query/key/value inputs: the core attention's hook
    **{frozenset({"muddformer", o}): w for o, w in (("lightweight", "lightweight.attention"),
                                                    ("conv_branch", "conv_branch"))},
}
SMALL = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dec_layers=2, src_vocab_size=50, attn_impl="eager")


def _build(arch: str, names) -> torch.nn.Module:
    sections = {n.replace("_soft", ""): SECTIONS[n] for n in names}
    extra = {"num_classes": 3, "positions": "relative"} if arch == "encoder_classifier" else {}
    if "hyper_connections" in names or "mhc" in names:
        extra["norm_first"] = True  # the papers' (m)HC replace the pre-norm residual only
    return create_model("transformer_small", arch=arch, **SMALL, **extra, **sections)


def _exercise(model: torch.nn.Module):
    """One training forward/backward (finite gradients), then eval MAdds against the FLOP counter."""
    src = torch.randint(4, 50, (2, 7))
    src[1, 5:] = 0
    model.train()
    out = model(src, src) if model.config.arch == "encoder_decoder" else model(src)
    loss = sum((logits.float().square().mean() for logits in (out.exit_logits or [out.logits])), torch.zeros(()))
    loss = loss + sum(out.aux_losses.values(), torch.zeros(()))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.eval()
    with FlopCounterMode(display=False) as counter:
        model(src, src) if model.config.arch == "encoder_decoder" else model(src)
    assert counter.get_total_flops() == 2 * len(src) * count_madds(model, 7, 7)  # FLOPs = 2 MAdds per sequence
    return out


PAIRS = [p for p in itertools.combinations(SECTIONS, 2) if set(p) != {"crossformer", "crossformer_soft"}]


@pytest.mark.parametrize("arch", ["encoder_decoder", "encoder_classifier"])
@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_pair_composes_or_is_rejected_with_reason(pair, arch):
    reason = REJECTED.get(frozenset(pair))
    if reason is not None:
        with pytest.raises(ConfigError, match=reason):
            _build(arch, pair)
        return
    out = _exercise(_build(arch, pair))
    assert ("crossformer_sg" in out.aux_losses) == ("crossformer_soft" in pair)
    if "multipass" in pair:
        assert len(out.exit_logits) == 2


@pytest.mark.parametrize("arch", ["encoder_decoder", "encoder_classifier"])
def test_four_methods_at_once(arch):
    """Crossformer HG on attention, LW's group FFN, Multi-Pass and Predictive Attention in one model."""
    model = create_model("transformer_small", arch=arch, **SMALL,
                         **({"num_classes": 3} if arch == "encoder_classifier" else {}),
                         crossformer={"hard": ["kq"], "soft": ["vf"]}, lightweight={"attention": False},
                         multipass={"connection": "hard", "permutation": [0, 2, 1]}, predictive={"alpha": 0.3})
    _exercise(model)
    layers = model.encoder.layers
    assert layers[0].self_attn.k_proj.weight is layers[1].self_attn.q_proj.weight
    assert layers[1].self_attn.logit_mixer is not None


def test_pa_conv_with_crossformer_ffn_and_multipass():
    model = create_model("transformer_small", arch="encoder_classifier", num_classes=3, **SMALL,
                         conv_branch={}, predictive={}, crossformer={"hard": ["ffn"]}, multipass={})
    _exercise(model)
