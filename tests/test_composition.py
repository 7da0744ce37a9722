"""Every pair of methods either composes (builds, trains one step, counts MAdds exactly) or is rejected with the
reason. The pairs come from :data:`~interlayer.methods.METHODS`: each method registers small examples of its section
(``Method.examples``) and the combinations it refuses with words of the reason (``Method.conflicts``), so a new
method is covered by construction, and a method without an example fails here."""
import itertools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from interlayer import ConfigError, count_madds, create_model
from interlayer.methods import METHODS

# example name -> (method, example)
EXAMPLES = {example.name: (method, example) for method in METHODS for example in method.examples}
# the examples each pair of examples of two methods is rejected for, and the words of the error
REJECTED = {frozenset({example.name, conflict.other}): conflict.reason
            for method in METHODS for conflict in method.conflicts for example in method.examples}
SMALL = dict(d_model=32, n_heads=4, d_ffn=64, enc_layers=3, dec_layers=2, src_vocab_size=50, attn_impl="eager")


def _build(arch: str, names) -> torch.nn.Module:
    sections, extra = {}, {}
    for name in names:
        method, example = EXAMPLES[name]
        sections[method.name] = example.section
        extra.update(example.core)
    if arch == "encoder_classifier":
        extra.update(num_classes=3, positions="relative")
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
    # FLOPs = 2 MAdds per sequence, less what the counter cannot see: mHC's stream mixing, written as scaled streams
    # added (test_mhc.py), (n + 1) n C multiply-adds a position and sublayer
    from interlayer.methods.mhc import ManifoldHyperConnection
    mixing = sum(7 * (m.rate + 1) * m.rate * m.norm.normalized_shape[0] for m in model.modules()
                 if isinstance(m, ManifoldHyperConnection))
    assert counter.get_total_flops() == 2 * len(src) * (count_madds(model, 7, 7) - mixing)
    return out


PAIRS = [pair for pair in itertools.combinations(EXAMPLES, 2) if EXAMPLES[pair[0]][0] is not EXAMPLES[pair[1]][0]]


def test_every_method_has_an_example_and_every_conflict_names_one() -> None:
    """What makes the pairs below cover METHODS: each method has an example, examples are named apart, and a
    conflict names another method's example, once (from one of the two methods)."""
    assert {method.name for method, _ in EXAMPLES.values()} == {method.name for method in METHODS}
    assert len(EXAMPLES) == sum(len(method.examples) for method in METHODS)
    claimed = [frozenset({example.name, conflict.other}) for method in METHODS for conflict in method.conflicts
               for example in method.examples]
    assert sorted(map(sorted, claimed)) == sorted(map(sorted, set(claimed)))
    for method in METHODS:
        for conflict in method.conflicts:
            assert conflict.other in EXAMPLES and EXAMPLES[conflict.other][0] is not method


@pytest.mark.slow
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


@pytest.mark.slow
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
