"""Multi-Pass Transformer (MPT): every option checked against a plain-encoder reference or the paper's equations.

All models are tiny (d=16, 3 encoder layers, length 7) so the file runs in seconds on two CPU cores.
"""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from interlayer import (
    ConfigError,
    build_model,
    config_from_dict,
    count_madds,
    count_parameters,
    create_model,
    get_config,
    load_pretrained,
    save_pretrained,
)
from interlayer.core.attention import LogitMixer
from interlayer.core.components import Components
from interlayer.core.encoder import Encoder
from interlayer.core.models import EncoderClassifier
from interlayer.methods.multipass import METHOD, MultiPassEncoder, hard_permutation, soft_init_logits
from interlayer.models.registry import presets
from interlayer.papers.multipass import PRESETS, paper_tables

N = 3
TINY: dict[str, Any] = dict(arch="encoder_decoder", src_vocab_size=40, d_model=16, n_heads=2, d_ffn=32,
                            enc_layers=N, dec_layers=1, dropout=0.0, max_positions=32)
CLS: dict[str, Any] = dict(TINY, arch="encoder_classifier", num_classes=3, dec_layers=0)


def tiny(multipass: Optional[dict] = None, base: Optional[dict] = None, **core: Any) -> nn.Module:
    fields = dict(base or TINY, **core)
    if multipass is not None:
        fields["multipass"] = multipass
    return build_model(config_from_dict(fields))


def tokens(batch: int = 2, length: int = 7) -> Tensor:
    src = torch.randint(1, TINY["src_vocab_size"], (batch, length))
    src[1, -2:] = 0  # padding in the second row
    return src


def twin(multipass: dict, base: Optional[dict] = None, **core: Any) -> tuple[nn.Module, nn.Module]:
    """A plain model and an MPT model holding the same shared weights (the MPT's extras keep their init)."""
    plain = tiny(None, base, **core)
    mpt = tiny(multipass, base, **core)
    result = mpt.load_state_dict(plain.state_dict(), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"encoder.connection_logits"}
    return plain.eval(), mpt.eval()


def encode(model: nn.Module, src: Tensor) -> Tensor:
    return model.encoder(src).hidden


def reference_layer(layer: nn.Module, x: Tensor, mask: Tensor, norm_first: bool,
                    into_branch: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """One encoder layer from its parts, not its forward: ``S_mid`` (Eq. 2, self-attention with its residual) and
    ``S_out`` (Eq. 3, FFN with its residual), post-LN (Vaswani et al.) or pre-LN. ``into_branch`` is added to the
    self-attention's input only, not to the residual around it: Fig. 4 (b)/(d), infused "after the residual
    connection", so the information "cannot propagate as directly to the following layers" (Sec. 3.3)."""
    branch = x if into_branch is None else x + into_branch
    attend = layer.self_attn
    if norm_first:
        mid = x + attend(layer.attn_block.norm(branch), key_padding_mask=mask)[0]
        return mid, mid + layer.ffn(layer.ffn_block.norm(mid))
    mid = layer.attn_block.norm(x + attend(branch, key_padding_mask=mask)[0])
    return mid, layer.ffn_block.norm(mid + layer.ffn(mid))


def reference_passes(encoder: Encoder, src: Tensor, passes: int, routing: str, mixing: list[Tensor],
                     norm_first: bool = False) -> list[Tensor]:
    """MPT written out from the paper without the library's injector or ``branch_add``: Eq. 2-3 per layer
    (:func:`reference_layer`), Eq. 6 across passes, Fig. 4 / Sec. 3.3 for the routing: (a) inner S_out added to the
    outer layer's input before the residual, (b) after it (to the attention branch only), (c)/(d) the same with
    the inner S_mid.

    ``mixing[t]`` is the (N, N) weight matrix of transition t (one-hot rows for default/hard connections).
    Returns each pass's output, through the final LayerNorm in pre-LN.
    """
    mask = src.eq(0)
    x0 = encoder.embed(src)
    outs: list[Tensor] = []
    inner_out: list[Tensor] = []
    inner_mid: list[Tensor] = []
    for p in range(passes):
        x, cur_out, cur_mid = x0, [], []
        for k, layer in enumerate(encoder.layers):
            add = None
            if p > 0:
                feats = inner_out if routing in "ab" else inner_mid
                add = sum(mixing[p - 1][k, j] * feats[j] for j in range(len(feats)))
            if add is not None and routing in "ac":
                mid, x = reference_layer(layer, x + add, mask, norm_first)
            else:
                mid, x = reference_layer(layer, x, mask, norm_first, into_branch=add)
            cur_out.append(x)
            cur_mid.append(mid)
        inner_out, inner_mid = cur_out, cur_mid
        outs.append(encoder.final_norm(x) if norm_first else x)
    return outs


def one_hot(perm: list[int]) -> Tensor:
    return torch.eye(N)[perm]


# ---------------------------------------------------------------- passes, P=1, exit pass 1 == plain encoder


@pytest.mark.parametrize("norm_first", [False, True])
def test_one_pass_is_exactly_the_plain_encoder(norm_first: bool) -> None:
    plain, mpt = twin(dict(passes=1), norm_first=norm_first)
    assert set(plain.state_dict()) == set(mpt.state_dict())
    src = tokens()
    assert torch.equal(encode(plain, src), encode(mpt, src))
    mpt.train(), plain.train()
    assert torch.equal(encode(plain, src), encode(mpt, src))


@pytest.mark.parametrize("connection", ["default", "soft", "hard"])
def test_exit_pass_one_of_two_pass_model_is_the_plain_encoder(connection: str) -> None:
    section = dict(passes=2, connection=connection, exit_pass=1)
    if connection == "hard":
        section["permutation"] = [2, 0, 1]
    plain, mpt = twin(section, norm_first=True)
    src = tokens()
    assert torch.equal(encode(plain, src), encode(mpt, src))
    assert len(mpt.encoder(src).states) == N  # only pass 1 was computed
    mpt.encoder.exit_pass = 2
    assert not torch.allclose(encode(plain, src), encode(mpt, src))


def test_shared_layers_keep_plain_state_dict_keys_and_parameter_count() -> None:
    plain = tiny()
    for section, extra in [(dict(connection="default"), 0), (dict(connection="hard", permutation=[0, 2, 1]), 0),
                           (dict(connection="tied_stack"), 0), (dict(connection="soft"), N * N),
                           (dict(passes=3, connection="soft"), 2 * N * N),
                           (dict(passes=3, connection="soft", share_soft_weights=True), N * N)]:
        mpt = tiny(section)
        new_keys = set(mpt.state_dict()) - set(plain.state_dict())
        assert new_keys == ({"encoder.connection_logits"} if extra else set()), section
        assert count_parameters(mpt) == count_parameters(plain) + extra, section


def test_embedding_is_computed_once_per_forward() -> None:
    mpt = tiny(dict(passes=3, loss="all"), dropout=0.3).train()
    calls = []
    mpt.encoder.embed.register_forward_hook(lambda *args: calls.append(1))
    mpt.encoder(tokens())
    assert len(calls) == 1


# ---------------------------------------------------------------- connections and routing vs the paper's equations


@pytest.mark.parametrize("routing", ["a", "b", "c", "d"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_default_connection_matches_reference(routing: str, norm_first: bool) -> None:
    mpt = tiny(dict(passes=3, routing=routing), norm_first=norm_first).eval()
    src = tokens()
    expected = reference_passes(mpt.encoder, src, 3, routing, [torch.eye(N)] * 2, norm_first)
    for p in (1, 2, 3):
        mpt.encoder.exit_pass = p
        torch.testing.assert_close(encode(mpt, src), expected[p - 1])


def test_hard_permutation_rule_reproduces_the_paper_and_generalises():
    assert hard_permutation(6) == [0, 4, 1, 5, 2, 3]  # MPT Fig. 3
    assert hard_permutation(3) == [0, 2, 1]
    for n in range(3, 13):
        perm = hard_permutation(n)
        assert sorted(perm) == list(range(n)) and perm[0] == 0 and perm != list(range(n))
    assert hard_permutation(2) == [0, 1]


@pytest.mark.parametrize("routing", ["a", "b", "c", "d"])
def test_hard_permutation_matches_reference_and_changes_output(routing: str) -> None:
    perm = [0, 2, 1]
    mpt = tiny(dict(connection="hard", permutation=perm, routing=routing)).eval()
    default = tiny(dict(connection="default", routing=routing))
    default.load_state_dict(mpt.state_dict())
    src = tokens()
    expected = reference_passes(mpt.encoder, src, 2, routing, [one_hot(perm)])[-1]
    torch.testing.assert_close(encode(mpt, src), expected)
    assert not torch.allclose(encode(mpt, src), encode(default.eval(), src))
    assert torch.equal(mpt.encoder.connection_weights()[0], one_hot(perm))


@pytest.mark.parametrize("norm_first", [False, True])
def test_best_hard_pattern_041523_is_fig3_and_not_its_inverse(norm_first: bool) -> None:
    """[0,4,1,5,2,3] is not its own inverse ([0,2,4,5,1,3]), so reading tau the wrong way round shows. Sec. 3.2:
    "the output of layer tau_k in the first-pass encoder is added to the input of layer k in the second-pass
    encoder ... Input to outer layer 0 comes from inner layer 0, that of outer layer 1 comes from inner layer 4,
    that of outer layer 2 comes from inner layer 1, and so on." Written with the core layers' forward only."""
    perm, inverse = [0, 4, 1, 5, 2, 3], [0, 2, 4, 5, 1, 3]
    fed_by = {0: 0, 1: 4, 2: 1, 3: 5, 4: 2, 5: 3}  # outer layer: the inner layer feeding it (Fig. 3)
    mpt = tiny(dict(connection="hard", permutation=perm), enc_layers=6, norm_first=norm_first).eval()
    flipped = tiny(dict(connection="hard", permutation=inverse), enc_layers=6, norm_first=norm_first).eval()
    flipped.load_state_dict(mpt.state_dict())
    src = tokens()
    mask, layers = src.eq(0), mpt.encoder.layers
    embedded = mpt.encoder.embed(src)
    inner, h = [], embedded
    for layer in layers:
        h = layer(h, key_padding_mask=mask).hidden
        inner.append(h)
    outer = embedded
    for k, layer in enumerate(layers):
        outer = layer(outer + inner[fed_by[k]], key_padding_mask=mask).hidden
    expected = mpt.encoder.final_norm(outer) if norm_first else outer
    torch.testing.assert_close(encode(mpt, src), expected)
    assert not torch.allclose(encode(flipped, src), expected, atol=1e-4)


def test_hard_identity_permutation_equals_default() -> None:
    hard = tiny(dict(connection="hard", permutation=[0, 1, 2])).eval()
    default = tiny(dict(connection="default")).eval()
    default.load_state_dict(hard.state_dict())
    src = tokens()
    assert torch.equal(encode(hard, src), encode(default, src))


def test_routing_patterns_all_differ() -> None:
    src = tokens()
    outs = {}
    base = tiny(dict(routing="a"))
    for routing in "abcd":
        model = tiny(dict(routing=routing))
        model.load_state_dict(base.state_dict())
        outs[routing] = encode(model.eval(), src)
    for r1 in "abcd":
        for r2 in "abcd":
            if r1 < r2:
                assert not torch.allclose(outs[r1], outs[r2], atol=1e-4), (r1, r2)


def test_soft_init_is_near_delta_and_rows_are_softmax() -> None:
    mpt = tiny(dict(connection="soft", soft_init=0.8))
    alpha = mpt.encoder.connection_weights()
    assert alpha.shape == (1, N, N)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, N))
    torch.testing.assert_close(torch.diagonal(alpha[0]), torch.full((N,), 0.8))
    torch.testing.assert_close(alpha[0][~torch.eye(N, dtype=torch.bool)], torch.full((N * N - N,), 0.1))
    assert torch.equal(soft_init_logits(1, 0.9), torch.zeros(1, 1))


def test_soft_connection_matches_eq6_and_learns() -> None:
    mpt = tiny(dict(connection="soft"))
    with torch.no_grad():
        mpt.encoder.connection_logits.normal_()
    src = tokens()
    alpha = torch.softmax(mpt.encoder.connection_logits.detach(), -1)
    expected = reference_passes(mpt.encoder.eval(), src, 2, "a", [alpha[0]])[-1]
    torch.testing.assert_close(encode(mpt, src), expected)
    mpt.train()
    encode(mpt, src).pow(2).sum().backward()
    grad = mpt.encoder.connection_logits.grad
    assert grad is not None and grad.abs().sum() > 0


def test_soft_with_saturated_delta_weights_is_the_default_mpt() -> None:
    """Eq. 6 with alpha = delta is the default [0, 1, ..., N-1] architecture (Sec. 3.2)."""
    soft = tiny(dict(connection="soft"))
    default = tiny(dict(connection="default"))
    default.load_state_dict(soft.state_dict(), strict=False)
    src = tokens()
    assert not torch.allclose(encode(soft.eval(), src), encode(default.eval(), src), atol=1e-4)
    with torch.no_grad():
        soft.encoder.connection_logits.copy_(torch.eye(N)[None] * 100.0)
    torch.testing.assert_close(encode(soft, src), encode(default, src))


@pytest.mark.parametrize("shared", [False, True])
def test_three_pass_soft_weights_per_transition_or_shared(shared: bool) -> None:
    mpt = tiny(dict(passes=3, connection="soft", share_soft_weights=shared)).eval()
    logits = mpt.encoder.connection_logits
    assert logits.shape == ((1 if shared else 2), N, N)
    with torch.no_grad():
        logits.normal_()
    alpha = mpt.encoder.connection_weights()
    assert alpha.shape == (2, N, N)
    assert torch.equal(alpha[0], alpha[1]) == shared
    src = tokens()
    expected = reference_passes(mpt.encoder, src, 3, "a", list(alpha))[-1]
    torch.testing.assert_close(encode(mpt, src), expected)


def test_three_pass_exit_two_equals_two_pass_model() -> None:
    three = tiny(dict(passes=3, connection="hard", permutation=[1, 2, 0], exit_pass=2)).eval()
    two = tiny(dict(passes=2, connection="hard", permutation=[1, 2, 0])).eval()
    two.load_state_dict(three.state_dict())
    src = tokens()
    assert torch.equal(encode(three, src), encode(two, src))


def test_tied_stack_is_the_stack_run_twice_without_input_refeed() -> None:
    mpt = tiny(dict(connection="tied_stack"), norm_first=True).eval()
    default = tiny(dict(connection="default"), norm_first=True).eval()
    default.load_state_dict(mpt.state_dict())
    src = tokens()
    enc = mpt.encoder
    first = enc.run_layers(enc.embed(src), src.eq(0))
    expected = enc.run_layers(first.states[-1], src.eq(0)).hidden
    torch.testing.assert_close(encode(mpt, src), expected)
    assert not torch.allclose(encode(mpt, src), encode(default, src), atol=1e-4)
    assert torch.equal(enc.connection_weights(), torch.zeros(1, N, N))


# ---------------------------------------------------------------- losses, exits, early exit


@pytest.mark.parametrize("norm_first", [False, True])
def test_loss_all_returns_every_pass_through_the_final_norm(norm_first: bool) -> None:
    plain, mpt = twin(dict(passes=3, loss="all"), norm_first=norm_first)
    src, tgt = tokens(), tokens()
    mpt.train()
    out = mpt(src, tgt)
    assert len(out.encoder.exits) == 3 and out.encoder.exits[-1] is out.encoder.hidden
    assert torch.equal(out.encoder.exits[0], encode(plain, src))  # pass 1, final LayerNorm included
    mpt.eval()
    for p in (2, 3):
        mpt.encoder.exit_pass = p
        torch.testing.assert_close(out.encoder.exits[p - 1], encode(mpt, src))
    assert len(out.exit_logits) == 3 and out.exit_logits[-1] is out.logits
    torch.testing.assert_close(out.exit_logits[0], plain(src, tgt).logits)
    assert mpt(src, tgt).exit_logits is None  # eval: one output, the exit pass


def test_loss_last_trains_on_the_last_pass_only() -> None:
    mpt = tiny(dict(passes=3, loss="last", exit_pass=1)).train()
    out = mpt.encoder(tokens())
    assert out.exits is None and len(out.states) == 3 * N  # exit_pass is an inference setting


def test_loss_random_runs_one_sampled_pass() -> None:
    mpt = tiny(dict(passes=3, loss="random"))
    src = tokens()
    mpt.eval()
    per_pass = []
    for p in (1, 2, 3):
        mpt.encoder.exit_pass = p
        per_pass.append(encode(mpt, src))
    mpt.train()
    seen = set()
    for _ in range(12):
        out = mpt.encoder(src)
        ran = len(out.states) // N
        assert out.exits is None
        torch.testing.assert_close(out.hidden, per_pass[ran - 1])
        seen.add(ran)
    assert seen == {1, 2, 3}


def test_exit_pass_setter_validates() -> None:
    mpt = tiny(dict(passes=2))
    for bad in (0, 3, 1.0, True):
        with pytest.raises(ConfigError, match="exit_pass"):
            mpt.encoder.exit_pass = bad


def test_classifier_arch_with_all_exits() -> None:
    plain, mpt = twin(dict(passes=2, loss="all", connection="soft"), base=CLS)
    src = tokens()
    mpt.train()
    out = mpt(src)
    assert len(out.exit_logits) == 2 and out.exit_logits[-1] is out.logits
    torch.testing.assert_close(out.exit_logits[0], plain(src).logits)
    sum(nn.functional.cross_entropy(logits, torch.tensor([0, 2])) for logits in out.exit_logits).backward()
    assert mpt.encoder.connection_logits.grad is not None
    mpt.eval()
    emb = torch.randn(2, 5, TINY["d_model"])
    assert mpt(inputs_embeds=emb).logits.shape == (2, 3)


# ---------------------------------------------------------------- compute accounting


@pytest.mark.parametrize("connection", ["default", "soft"])
def test_madds_are_passes_times_stack_and_match_flop_counter(connection: str) -> None:
    plain, mpt = twin(dict(passes=3, connection=connection), attn_impl="eager")
    length = 6
    stack = plain.encoder.madds(length)
    src = torch.randint(1, 40, (1, length))
    for p in (1, 2, 3):
        mpt.encoder.exit_pass = p
        assert mpt.encoder.madds(length) == p * stack
        assert count_madds(mpt, length, 4) == count_madds(plain, length, 4) + (p - 1) * stack
        with FlopCounterMode(display=False) as counter:
            mpt.encoder(src)
        assert counter.get_total_flops() == 2 * mpt.encoder.madds(length)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("section, match", [
    (dict(passes=0), r"multipass.passes=0"),
    (dict(passes=2, exit_pass=3), r"multipass.exit_pass=3 must lie in 1..2"),
    (dict(exit_pass=0), r"multipass.exit_pass=0"),
    (dict(routing="e"), r"multipass.routing='e' is not valid; choose one of 'a', 'b', 'c', 'd'"),
    (dict(loss="sum"), r"multipass.loss='sum' is not valid"),
    (dict(connection="dense"), r"multipass.connection='dense' is not valid"),
    (dict(connection="hard"), r"needs multipass.permutation, a permutation of 0..2"),
    (dict(connection="hard", permutation=[0, 0, 2]), r"\[0\] repeated.*\[1\] missing"),
    (dict(connection="hard", permutation=[0, 1, 3]), r"\[3\] outside 0..2.*\[2\] missing"),
    (dict(connection="hard", permutation=[0, 1]), r"it has 2 entries, enc_layers=3 needs 3"),
    (dict(connection="soft", permutation=[0, 1, 2]), r"only used with multipass.connection='hard'"),
    (dict(connection="hard", permutation=[0, 1, 2], soft_init=0.5), r"soft_init=0.5 only applies"),
    (dict(connection="soft", soft_init=1.0), r"soft_init=1.0 must lie in \(0, 1\)"),
    (dict(share_soft_weights=True), r"share_soft_weights=True only applies"),
    (dict(connection="tied_stack", routing="b"), r"routing='b' has no effect"),
    (dict(passes="two"), r"multipass.passes must be an integer"),
    (dict(pases=2), r"unknown key .*pases.*did you mean .*passes"),
])
def test_invalid_configs_are_rejected_naming_the_key(section: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict(dict(TINY, multipass=section))


def test_permutation_overrides_and_yaml_string_round_trip() -> None:
    cfg = get_config(dict(TINY), multipass={"connection": "hard", "permutation": "[2, 0, 1]"})
    assert cfg.multipass.permutation == [2, 0, 1]


def test_another_encoder_class_is_refused() -> None:
    components = Components(config_from_dict(dict(TINY, multipass={})))
    components.encoder_class = Encoder
    with pytest.raises(ConfigError, match="replaces the encoder class"):
        METHOD.customize(components.cfg.multipass, components.cfg, components)


# ---------------------------------------------------------------- composition


class RecordingMixer(LogitMixer):
    """A stand-in logit mixer (the core's protocol) that records whether it saw previous logits."""

    def __init__(self, log: list[bool]) -> None:
        super().__init__()
        self.log = log
        self.gain = nn.Parameter(torch.tensor(0.5))

    def forward(self, logits: Tensor, prev_logits: Tensor, key_padding_mask: Optional[Tensor], context=None
                ) -> tuple[Tensor, dict[str, Tensor]]:
        self.log.append(True)
        return logits + self.gain * prev_logits, {}

    def madds(self, t_q: int, t_k: int) -> int:
        return 0


def test_predictive_logits_restart_at_each_pass() -> None:
    cfg = config_from_dict(dict(CLS, multipass=dict(passes=2)))
    log: list[bool] = []
    components = Components(cfg)
    components.logit_mixer = lambda side, i: RecordingMixer(log)
    components.encoder_class = MultiPassEncoder
    model = EncoderClassifier(cfg, components).eval()
    out = model.encoder(tokens(), need_intermediates=True)
    # Layer 0 of each pass gets no previous logits; layers 1..N-1 mix: (N-1) calls per pass.
    assert len(log) == 2 * (N - 1)
    assert len(out.attentions) == 2 * N and all(a is not None for a in out.attentions)


def test_checkpoint_round_trip_keeps_soft_weights(tmp_path) -> None:
    mpt = tiny(dict(passes=3, connection="soft", loss="all", exit_pass=2))
    with torch.no_grad():
        mpt.encoder.connection_logits.normal_()
    save_pretrained(mpt, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert loaded.encoder.exit_pass == 2
    src = tokens()
    assert torch.equal(encode(mpt.eval(), src), encode(loaded, src))


@pytest.mark.parametrize("other, section", [
    ("predictive", {}),
    ("crossformer", {"hard": ["kq", "vf", "ffn"], "sides": ["encoder"]}),
    ("lightweight", {}),
    ("conv_branch", {}),
])
def test_composes_with_other_methods(other: str, section: dict) -> None:
    """The other method's modules and ties are kept in every pass; MPT adds only its N^2 soft weights."""
    model = tiny(dict(passes=2, connection="soft", loss="all"), **{other: section}).train()
    assert isinstance(model.encoder, MultiPassEncoder)
    assert count_parameters(model) == count_parameters(tiny(None, **{other: section})) + N * N
    out = model(tokens(), tokens())
    assert len(out.exit_logits) == 2
    sum(logits.sum() for logits in out.exit_logits).backward()
    assert model.encoder.connection_logits.grad is not None


# ---------------------------------------------------------------- presets


def test_presets_are_registered_and_cite_the_paper() -> None:
    for name, (description, fields) in PRESETS.items():
        assert presets("transformer")[name].fields == fields
        assert "MPT" in description
        get_config(name)
    assert PRESETS["mpt_hard_base_041523"][1]["multipass"]["permutation"] == [0, 4, 1, 5, 2, 3]


@pytest.mark.parametrize("name, core", [("mpt_soft_base", "transformer_base"),
                                        ("mpt_hard_small_021", "transformer_small")])
def test_preset_core_fields_match_core_presets(name: str, core: str) -> None:
    mpt_cfg, core_cfg = get_config(name).to_dict(), get_config(core).to_dict()
    mpt_cfg.pop("multipass")
    core_cfg.pop("multipass")
    assert mpt_cfg == core_cfg


def test_small_hard_preset_builds_and_runs() -> None:
    model = create_model("mpt_hard_small_021", d_model=16, n_heads=2, d_ffn=32, src_vocab_size=40).eval()
    assert model.encoder.permutation == [0, 2, 1]
    assert model(tokens(), tokens()).logits.shape == (2, 7, 40)


def test_paper_table2_parameter_counts() -> None:
    (title, headers, rows), = paper_tables()
    counts = {row[0]: int(row[2].replace(",", "")) for row in rows}
    base = counts["6-layer Base Transformer (BT)"]
    assert abs(base / 1e6 - 61.2) < 1.0  # Table 2: 61.2M (our vocabulary is exactly 32k)
    assert counts["MP Transformer [0,4,1,5,2,3]"] == counts["6+6-layer (tied weights) BT"] == base
    assert counts["MP Transformer [Soft Connections]"] == base + 36  # N^2 with N = 6 (Sec. 3.2)
