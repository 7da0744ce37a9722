"""GPT-2 in and out (issue 21): ``from_hf``/``to_hf`` on the core's language model, its tokenizer, the methods.

Every GPT-2 is random, built by ``transformers`` from a tiny config (``helpers.hf_gpt2``, no download), in three
shapes: tied output and tanh GELU; an untied head, ``n_inner`` and exact GELU; a bare ``GPT2Model`` with ReLU. The
tokenizer is a byte-level BPE trained there and saved by ``transformers``' own ``GPT2Tokenizer``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
import torch._dynamo
from safetensors.torch import load_file

from interlayer import create_model
from interlayer.build import build_model
from interlayer.cli import main
from interlayer.core.generation import SamplingOptions, position_ids
from interlayer.data.tokenizers.language_model import ByteBPETokenizer
from interlayer.models.registry import load_pretrained
from interlayer.pretrained.hf import from_hf
from interlayer.pretrained.hf_checkpoint import read_checkpoint
from interlayer.training.config import TrainConfig
from interlayer.training.engine import Trainer

transformers = pytest.importorskip("transformers")

from helpers.hf import CASES as ENCODER_CASES  # noqa: E402
from helpers.hf import reference as encoder_reference  # noqa: E402
from helpers.hf_gpt2 import ADDED, CASES, TEXTS, VOCAB, D, hf_gpt2, write_tokenizer  # noqa: E402
from helpers.lm import LM_EXAMPLES  # noqa: E402
from interlayer.errors import ConfigError, PretrainedError  # noqa: E402
from interlayer.pretrained.export import to_hf  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpt2")
    out = {}
    for case in CASES:
        out[case] = root / case
        hf_gpt2(case).save_pretrained(str(out[case]))
    write_tokenizer(out["tied"])
    return out


def ids(batch: int = 3, length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_outputs(hf: Any, tokens: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits, or the last hidden state of a bare GPT2Model; the hidden states after each layer but the last)."""
    with torch.no_grad():
        out = hf(input_ids=tokens, output_hidden_states=True, **kwargs)
    final = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return final, list(out.hidden_states[1:-1])


def our_outputs(model: torch.nn.Module, tokens: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, list]:
    with torch.no_grad():
        out = model(tokens, **kwargs)
    return out.logits, out.encoder.states[:-1]


# ----------------------------------------------------------------------------------------------- import


@pytest.mark.parametrize("source", ["folder", "memory"])
@pytest.mark.parametrize("case", list(CASES))
def test_import_equals_transformers(case: str, source: str, folders: dict[str, Path]) -> None:
    hf = hf_gpt2(case)
    model = from_hf(folders[case] if source == "folder" else hf)
    tokens = ids()
    theirs, their_states = hf_outputs(hf, tokens)
    ours, our_states = our_outputs(model, tokens)
    if case == "bare":  # GPT2Model has no head: compare the stack's output (after ln_f)
        with torch.no_grad():
            ours = model(tokens).encoder.hidden
    assert (ours - theirs).abs().max() < 1e-5
    for state, expected in zip(our_states, their_states, strict=True):
        assert (state - expected).abs().max() < 1e-5
    cfg, report = model.config, model.import_report
    assert cfg.arch == "causal_lm" and cfg.tie_output == (case != "untied") and not model.training
    assert cfg.d_ffn == (24 if case == "untied" else 4 * D)
    assert report.ignored == [] and report.initialised == []  # a bare GPT2Model too: its output is the token table
    assert "h.0.attn.c_attn.weight[k]" in read_checkpoint(folders[case]).state


def test_right_and_left_padded_batches_match_transformers(folders: dict[str, Path]) -> None:
    """Right padding: the same attention mask. Left padding (what generation uses): the padding is a key mask and
    each row's real tokens are numbered 0, 1, ... by ``position_ids`` -- transformers' ``attention_mask.cumsum(-1)
    - 1``, the numbering its ``generate`` uses; compared at the real tokens."""
    hf, model = hf_gpt2("untied"), from_hf(folders["untied"])
    tokens = ids(3, 8)
    real = torch.ones_like(tokens, dtype=torch.bool)
    real[0, 5:] = False  # right-padded
    theirs, _ = hf_outputs(hf, tokens, attention_mask=real.long())
    ours, _ = our_outputs(model, tokens, padding_mask=~real)
    assert (ours - theirs)[real].abs().max() < 1e-5
    left = torch.ones_like(tokens, dtype=torch.bool)
    left[0, :3] = False
    left[1, :1] = False
    positions = position_ids(~left)
    theirs, _ = hf_outputs(hf, tokens, attention_mask=left.long(), position_ids=positions)
    ours, _ = our_outputs(model, tokens, padding_mask=~left, position_ids=positions)
    assert (ours - theirs)[left].abs().max() < 1e-5
    alone, _ = our_outputs(model, tokens[:1, 3:])  # the left-padded row reads as the row alone
    assert (ours[0, 3:] - alone[0]).abs().max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("case", ["tied", "untied"])
def test_cached_greedy_generation_equals_transformers_generate(case: str, folders: dict[str, Path]) -> None:
    hf, model = hf_gpt2(case), from_hf(folders[case])
    prompts = ids(3, 6, seed=4)
    real = torch.ones_like(prompts, dtype=torch.bool)
    real[1, :2] = False  # left-padded prompts of lengths 6, 4, 3
    real[2, :3] = False
    steps = 10
    with torch.no_grad():
        theirs = hf.generate(input_ids=prompts, attention_mask=real.long(), do_sample=False, max_new_tokens=steps,
                             min_new_tokens=steps, pad_token_id=0)[:, prompts.shape[1]:]
    # the static cache (the default), the growing one, none, and the compiled fixed-shape step (traced only)
    for decoding in ({}, dict(static_cache=False), dict(use_cache=False), dict(compile=True, compile_backend="eager")):
        torch._dynamo.reset()
        ours = model.generate(prompts, SamplingOptions(max_new_tokens=steps, temperature=0.0, **decoding),
                              padding_mask=~real)
        assert ours.tokens.tolist() == theirs.tolist(), decoding


def test_hf_style_generate_returns_prompt_plus_continuation_as_transformers_does(folders: dict[str, Path]) -> None:
    """Same call, same result: greedy and sampled (top-k, top-p, temperature; the same seed), left-padded prompts,
    EOS then padding; and the hidden states and attentions HF returns on request."""
    hf, model = hf_gpt2("tied"), from_hf(folders["tied"])
    prompts = ids(3, 6, seed=4)
    mask = torch.ones_like(prompts)
    mask[1, :2] = 0
    mask[2, :3] = 0
    settings = [dict(do_sample=False), dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9),
                dict(do_sample=True)]  # the last: HF's top_k=50 default
    for kwargs in settings:
        common = dict(attention_mask=mask, max_new_tokens=8, pad_token_id=7, **kwargs)
        torch.manual_seed(5)
        with torch.no_grad():
            theirs = hf.generate(prompts, **common)
        torch.manual_seed(5)
        ours = model.generate(prompts, **common)
        assert ours.tolist() == theirs.tolist(), kwargs
    greedy = model.generate(prompts, attention_mask=mask, max_new_tokens=8)
    eos = int(greedy[0, 7])  # row 0 produces it at its second step
    with torch.no_grad():
        theirs = hf.generate(prompts, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=3)
    ours = model.generate(prompts, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=3)
    assert ours.tolist() == theirs.tolist() and ours[0, 8:].eq(3).all()
    with torch.no_grad():
        hf_out = hf(prompts, output_hidden_states=True, output_attentions=True)
    out = model(input_ids=prompts, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(hf_out.hidden_states)
    for a, b in zip(out.hidden_states + out.attentions, hf_out.hidden_states + hf_out.attentions):
        assert (a - b).abs().max() < 1e-5
    with pytest.raises(TypeError, match="not both"):
        model.generate(prompts, SamplingOptions(), max_new_tokens=3)


# ----------------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("case", list(CASES))
def test_export_round_trip_loads_in_transformers_with_equal_outputs(case: str, folders: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    hf = hf_gpt2(case)
    out = to_hf(from_hf(folders[case]), tmp_path / case)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["n_inner"] == CASES[case][1].get("n_inner",
                                                                                                      4 * D)
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokens = ids()
    theirs, _ = hf_outputs(hf, tokens)
    again, _ = hf_outputs(back, tokens)
    if case == "bare":  # exported with a head (tied to wte): its hidden states are the original's
        with torch.no_grad():
            again = back.transformer(input_ids=tokens).last_hidden_state
    assert (again - theirs).abs().max() < 1e-5
    original, written = hf.state_dict(), back.state_dict()
    prefix = "" if case == "bare" else "transformer."
    for name, tensor in original.items():  # every tensor comes back exactly (c_attn re-fused, Conv1D layout kept)
        assert torch.equal(written[name if name.startswith("lm_head") else "transformer." + name[len(prefix):]],
                           tensor), name


def test_tokenizer_ids_equal_transformers_and_export_with_the_model(folders: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    model = from_hf(folders["tied"])
    tokenizer = model.tokenizer
    assert isinstance(tokenizer, ByteBPETokenizer) and len(tokenizer) == VOCAB
    theirs = transformers.AutoTokenizer.from_pretrained(str(folders["tied"]))
    text = f"To be, or not<|endoftext|> to be:\n\n  that {ADDED} is the question 😀 naïve"
    assert tokenizer.encode(text) == theirs(text)["input_ids"] and VOCAB - 1 in tokenizer.encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.byte_lengths()[[0, VOCAB - 1]].tolist() == [len("<|endoftext|>"), len(ADDED)]  # bits per byte
    out = to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 0  # <|endoftext|>
    again = transformers.AutoTokenizer.from_pretrained(str(out))
    assert again(text)["input_ids"] == theirs(text)["input_ids"] and again.eos_token == "<|endoftext|>"


def test_prefix_space_tokenizers_are_refused(folders: dict[str, Path], tmp_path: Path) -> None:
    directory = tmp_path / "prefixed"
    directory.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(folders["tied"] / name, directory / name)  # a link out of the folder would be refused
    settings = json.loads((folders["tied"] / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(settings, add_prefix_space=True)))
    with pytest.raises(ValueError, match="add_prefix_space=true is not supported for a language model"):
        from_hf(directory)


def scratch_lm(**changes: Any) -> torch.nn.Module:
    fields = dict(src_vocab_size=50, d_model=16, n_heads=2, d_ffn=32, enc_layers=2, max_positions=24)
    return create_model("gpt2_small", **{**fields, **changes}).eval()


@pytest.mark.parametrize("changes", [{}, {"activation": "gelu", "tie_output": False, "dropout": 0.0},
                                     {"enc_layers": 4, "layer_sharing": {"repeats": 2}},
                                     {"enc_layers": 3, "crossformer": {"hard": ["kq", "ffn"]}}],
                         ids=["plain", "gelu-untied", "layer_sharing", "crossformer_hard"])
def test_language_models_trained_from_scratch_export_when_gpt2_computes_them(changes: dict,
                                                                             tmp_path: Path) -> None:
    model = scratch_lm(**changes)
    with torch.no_grad():
        for param in model.parameters():  # LayerNorms and biases away from their 1/0 start
            param.add_(torch.randn_like(param) * 0.1)
    to_hf(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    tokens = torch.randint(0, 50, (2, 11))
    with torch.no_grad():
        assert (back(input_ids=tokens).logits - model(tokens).logits).abs().max() < 1e-5
    assert back.config.activation_function == changes.get("activation", "gelu_new")


@pytest.mark.parametrize("make, match", [
    (lambda: scratch_lm(positions="rotary"), "positions='rotary' \\(GPT-2 has 'learned'\\)"),
    (lambda: scratch_lm(bias=False), "bias=False \\(GPT-2 has True\\)"),
    (lambda: scratch_lm(norm_first=False), "norm_first=False \\(GPT-2 has True\\)"),
    (lambda: create_model("gpt_shakespeare_char"), "bias=False"),
    (lambda: scratch_lm(predictive={"alpha": 0.1}), "the predictive section \\(GPT-2 has no such computation\\)"),
    (lambda: scratch_lm(lightweight={"groups": 2}), "the lightweight section"),
    (lambda: scratch_lm(multipass={}), "the multipass section"),
    (lambda: scratch_lm(value_residual={"mode": "svformer"}), "the value_residual section"),
    (lambda: scratch_lm(cla={"sharing_factor": 2}), "the cla section"),
    (lambda: scratch_lm(denseformer={}), "the denseformer section"),
    (lambda: scratch_lm(hyper_connections={"rate": 2}), "the hyper_connections section"),
])
def test_language_models_gpt2_cannot_express_are_refused(make: Callable, match: str, tmp_path: Path) -> None:
    with pytest.raises(PretrainedError, match=f"{match}.*interlayer.export .*interlayer's transformers classes"):
        to_hf(make(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("changes, match", [
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=true"),
    ({"scale_attn_weights": False}, "scale_attn_weights=false"),
    ({"add_cross_attention": True}, "add_cross_attention=true"),
    ({"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
    ({"n_inner": "wide"}, "n_inner='wide'"),
])
def test_gpt2_configs_the_core_cannot_compute_are_refused_naming_the_field(changes: dict, match: str,
                                                                          folders: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    directory = tmp_path / "changed"
    directory.mkdir()
    (directory / "model.safetensors").symlink_to(folders["tied"] / "model.safetensors")
    config = json.loads((folders["tied"] / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(PretrainedError, match=f"this gpt2 variant cannot be represented: .*{match}"):
        from_hf(directory)


def test_classifier_options_do_not_apply_to_a_language_model(folders: dict[str, Path]) -> None:
    with pytest.raises(PretrainedError, match="num_classes, pooling do not apply to a GPT-2, a language model"):
        from_hf(folders["tied"], num_classes=3, pooling="mean")


# ----------------------------------------------------------------------------------------------- methods


def test_crossformer_soft_guidance_on_an_imported_gpt2(folders: dict[str, Path]) -> None:
    model = from_hf(folders["untied"], extra_sections={"crossformer": {"soft": ["kq", "ffn"]}})
    plain = from_hf(folders["untied"])
    tokens = ids()
    out = model(tokens)
    assert model.import_report.initialised == [] and out.aux_losses["crossformer_sg"] > 0
    assert torch.equal(out.logits, plain(tokens).logits)  # a training loss only: the forward pass is the import's


@pytest.mark.parametrize("sections, match", [
    ({"crossformer": {"hard": ["kq"]}}, "tied to the parameter that received"),
    ({"lightweight": {"groups": 2}}, "lightweight changed the module"),
])
def test_restructuring_methods_on_gpt2_are_refused_unless_reinitialised(sections: dict, match: str,
                                                                        folders: dict[str, Path]) -> None:
    with pytest.raises(PretrainedError, match=f"{match}.*restructure the pretrained weights; pass reinitialise=True"):
        from_hf(folders["untied"], extra_sections=sections)
    torch.manual_seed(5)
    model = from_hf(folders["untied"], extra_sections=sections, reinitialise=True)
    torch.manual_seed(5)
    fresh = build_model(model.config)
    report = model.import_report
    assert report.restructured and report.initialised
    ours, theirs = model.state_dict(), fresh.state_dict()
    assert all(torch.equal(ours[name], theirs[name]) for name in report.initialised)
    assert torch.equal(model.encoder.embed.tokens.weight, read_checkpoint(folders["untied"]).state["wte.weight"])


def warm_pa(alpha: float = 0.5, **fields: Any) -> dict[str, Any]:
    return {"predictive": {"alpha": alpha, "alpha_warmup_steps": 4, **fields}}


def advance(model: torch.nn.Module, steps: int) -> None:
    for module in model.modules():
        if hasattr(module, "optimizer_step_done"):
            for _ in range(steps):
                module.optimizer_step_done()


def imported_pa(folder: Path, predictive: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(7)  # the same CNN for every model built here
    return from_hf(folder, extra_sections={"predictive": predictive})


@pytest.mark.parametrize("init", ["dirac", "random"])
def test_pa_with_warm_up_starts_exactly_at_an_imported_gpt2(init: str, folders: dict[str, Path]) -> None:
    """alpha_t = alpha min(1, t / N): at t = 0 the plain import, bit for bit (PA computes the logits explicitly,
    so the plain model is read with the same eager attention: the fused kernel differs by ~1e-6 in the last bits),
    Eq. 4 with alpha / 2 at t = N / 2, with alpha from t = N on."""
    hf = hf_gpt2("untied")
    model = imported_pa(folders["untied"], {"alpha": 0.5, "alpha_warmup_steps": 4, "init": init})
    tokens = ids()
    theirs, _ = hf_outputs(hf, tokens)
    start = our_outputs(model, tokens)[0]
    assert torch.equal(start, our_outputs(from_hf(folders["untied"], overrides={"attn_impl": "eager"}), tokens)[0])
    assert (start - theirs).abs().max() < 1e-5
    for steps, alpha in ((2, 0.25), (2, 0.5), (3, 0.5)):
        advance(model, steps)
        ours = our_outputs(model, tokens)[0]
        constant = our_outputs(imported_pa(folders["untied"], {"alpha": alpha, "init": init}), tokens)[0]
        assert (ours - constant).abs().max() < 1e-6
        assert (ours - theirs).abs().max() > 1e-2


@pytest.mark.parametrize("case", ["bert", "roberta"])
def test_pa_with_warm_up_starts_exactly_at_an_imported_encoder(case: str) -> None:
    """The same for the encoders, whose padding PA masks: at the real tokens of a padded batch. Weights drawn with
    std 0.3 (not 0.02) so that attention maps, and with them the prediction, are far from uniform."""
    config_class, model_class, fields = ENCODER_CASES[case]
    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**fields, initializer_range=0.3))
    ref, inputs = encoder_reference(hf.eval(), case)
    real = inputs.ne(hf.config.pad_token_id)

    def hidden(predictive: dict[str, Any]) -> tuple[torch.nn.Module, torch.Tensor]:
        torch.manual_seed(7)
        model = from_hf(hf, extra_sections={"predictive": predictive})
        with torch.no_grad():
            return model, model(inputs).encoder.hidden

    model, start = hidden({"alpha": 0.5, "alpha_warmup_steps": 4, "init": "dirac"})
    with torch.no_grad():
        plain = from_hf(hf, overrides={"attn_impl": "eager"})(inputs).encoder.hidden
    assert torch.equal(start[real], plain[real]) and (start - ref.last_hidden_state)[real].abs().max() < 1e-5
    advance(model, 4)
    with torch.no_grad():
        ramped = model(inputs).encoder.hidden
    _, constant = hidden({"alpha": 0.5, "init": "dirac"})  # dirac alone: alpha ReLU(A_prev) + (1 - alpha) A
    assert (ramped - constant)[real].abs().max() < 1e-6
    assert (constant - ref.last_hidden_state)[real].abs().max() > 1e-2


def test_value_residual_warm_up_starts_exactly_at_an_imported_gpt2(folders: dict[str, Path]) -> None:
    """An imported GPT-2 with ResFormer computes exactly what the import computes at step 0 (the mix starts at
    [1, 0]), and ramps to the paper's [0.5, 0.5]."""
    tokens = ids()
    plain = our_outputs(from_hf(folders["untied"]), tokens)[0]
    warm = from_hf(folders["untied"], extra_sections={"value_residual": {"lambda_warmup_steps": 2}})
    assert torch.equal(our_outputs(warm, tokens)[0], plain)
    advance(warm, 2)
    mixed = our_outputs(from_hf(folders["untied"], extra_sections={"value_residual": {}}), tokens)[0]
    assert torch.allclose(our_outputs(warm, tokens)[0], mixed, atol=1e-6) and (mixed - plain).abs().max() > 1e-2


def test_the_import_report_names_each_method_that_changes_the_start(folders: dict[str, Path]) -> None:
    """Measured at import on a probe input: ResFormer and PA without their warm-ups move the logits (by what the
    note says) and dynamic hyper-connections too; with the warm-ups, Crossformer's soft guidance and DenseFormer,
    the function is the import's, and nothing is said."""
    cases = {"value_residual": ({}, "value_residual.lambda_warmup_steps=N starts exactly"),
             "predictive": ({"alpha": 0.2}, "predictive.alpha_warmup_steps=N starts exactly"),
             "hyper_connections": ({"dynamic": True}, "")}
    sections = {name: section for name, (section, _) in cases.items()}
    notes = from_hf(folders["untied"], extra_sections=sections).import_report.notes
    tokens = ids()
    plain = our_outputs(from_hf(folders["untied"]), tokens)[0]
    for name, (section, hint) in cases.items():
        note = next(n for n in notes if n.startswith(f"{name} changes the imported model's function"))
        assert hint in note
        moved = float(note.split("move by up to ")[1].split(" ")[0])
        alone = our_outputs(from_hf(folders["untied"], extra_sections={name: section}), tokens)[0]
        assert moved > 1e-6 and (alone - plain).abs().max() > 1e-6
    exact = {"value_residual": {"lambda_warmup_steps": 3}, "predictive": {"alpha_warmup_steps": 3},
             "crossformer": {"soft": ["kq"]}, "denseformer": {}}
    quiet = from_hf(folders["untied"], extra_sections=exact).import_report.notes
    assert not [n for n in quiet if "changes the imported model's function" in n]


# ----------------------------------------------------------------------------------------------- fine-tuning


def test_cli_fine_tunes_a_gpt2_folder_on_lm_with_pa_warm_up_then_generates(folders: dict[str, Path],
                                                                           tmp_path: Path, capsys: Any) -> None:
    """``train lm --pretrained``: the checkpoint's tokenizer (bits per byte), architecture and weights, PA added
    with a warm-up the engine advances once per optimiser step (saved in the checkpoint and in best/, restored by
    a resume), the fine-tuning recipe; then ``generate`` from the run."""
    text = tmp_path / "book.txt"
    text.write_text("\n".join(TEXTS * 30), encoding="utf-8")
    run = tmp_path / "run"
    args = ["train", "lm", "--pretrained", str(folders["tied"]), "--data", str(text), "--run-dir", str(run),
            "--no-progress", "--set", "data.block_size=32", "--set", "data.eval_interval=2", "--set",
            "train.max_tokens=128", "--set", "train.max_steps=4", "--set", "predictive.alpha=0.5", "--set",
            "predictive.alpha_warmup_steps=3"]
    assert main(args) == 0
    assert "read 64 blocks spread over each split (data.eval_blocks=64" in capsys.readouterr().err
    mixer = "encoder.layers.1.self_attn.logit_mixer"
    assert load_file(str(run / "checkpoint_last.safetensors"))[f"model/{mixer}.steps_done"].item() == 4.0
    stored = json.loads((run / "run.json").read_text())
    fresh = build_model(load_pretrained(run / "best").config)
    assert fresh.get_submodule(mixer).steps_done.item() == 0.0
    Trainer(SimpleNamespace(), fresh, TrainConfig(**stored["train"]), run, resume=True, progress=False)
    assert fresh.get_submodule(mixer).steps_done.item() == 4.0  # a resumed run carries on from step 4
    best_epoch = json.loads((run / "results.json").read_text())["best_epoch"]
    assert load_pretrained(run / "best").get_submodule(mixer).steps_done.item() == 2.0 * best_epoch
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 4 and {"valid_bits_per_byte", "test_bits_per_byte"} <= set(results)
    assert stored["model"]["arch"] == "causal_lm" and stored["model"]["activation"] == "gelu_tanh"
    assert stored["train"]["lr"] == 5e-5 and stored["train"]["schedule"] == "linear"
    imported = json.loads((run / "task.json").read_text())["pretrained"]
    assert imported["initialised"] == [f"{mixer}.convs.0.bias", f"{mixer}.convs.0.weight"]
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(run / "best"), "--prompt", "To be", "--max-new-tokens", "6",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("To be")
    assert main(["export", str(run), str(tmp_path / "out")]) == 0  # PA: interlayer's class for transformers
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"- tokenizer: byte-level BPE, {VOCAB} ids (the base model's" in card and '"tokenizer": "char"' not in card
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    tokens = ids()
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, load_pretrained(run / "best")(tokens).logits)


def test_lm_fine_tuning_refuses_what_does_not_fit(folders: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    text = tmp_path / "book.txt"
    text.write_text("\n".join(TEXTS * 30), encoding="utf-8")
    base = ["train", "lm", "--pretrained", str(folders["tied"]), "--data", str(text), "--no-progress"]
    assert main([*base, "--run-dir", str(tmp_path / "a")]) == 2  # block_size 256 > n_positions 40
    said = capsys.readouterr().err
    assert "data.block_size=256 is longer than the 40 positions" in said and "--set data.block_size=40" in said
    assert main([*base, "--run-dir", str(tmp_path / "b"), "--preset", "gpt2_small"]) == 2
    assert "the checkpoint decides the architecture" in capsys.readouterr().err
    assert main([*base, "--run-dir", str(tmp_path / "c"), "--set", "data.block_size=32", "--set",
                 "lightweight.groups=2"]) == 2
    assert "restructure the pretrained weights" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abc")


def test_save_and_from_pretrained_methods_keep_the_warm_up(folders: dict[str, Path], tmp_path: Path) -> None:
    from interlayer.core.lm import CausalLM

    model = CausalLM.from_pretrained(folders["untied"], extra_sections=warm_pa(init="dirac"))
    assert isinstance(model, CausalLM) and not model.training
    advance(model, 2)
    model.save_pretrained(tmp_path / "saved")
    again = CausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float64)
    mixer = "encoder.layers.1.self_attn.logit_mixer"
    assert again.get_submodule(mixer).steps_done.item() == 2.0 and again.lm_head.weight.dtype == torch.float64
    tokens = ids()
    assert (again(tokens).logits.float() - model(tokens).logits).abs().max() < 1e-5


@pytest.mark.slow
def test_the_warm_up_adds_no_graph_break_and_runs_on_meta() -> None:
    """The ramp reads the step buffer as a tensor: no host sync, so no graph break, and nothing off the device."""
    torch._dynamo.reset()
    with torch.device("meta"):
        model = scratch_lm(predictive={"alpha": 0.2, "alpha_warmup_steps": 10}).train()
    tokens = torch.zeros(2, 12, dtype=torch.long, device="meta")
    model(tokens).logits.sum().backward()
    explanation = torch._dynamo.explain(model)(tokens)
    assert explanation.graph_break_count == 0, [str(r.reason) for r in explanation.break_reasons]


# -- every restructuring section is known as one (issue 43) ----------------------------------------------------------
# every method's language-model examples, and the settings at which a restructuring method restructures nothing
METHOD_SECTIONS = {**{name: next(iter(overrides.items())) for name, overrides in LM_EXAMPLES.items()},
                   "layer_sharing_1": ("layer_sharing", {"repeats": 1}), "cla_1": ("cla", {"sharing_factor": 1})}


@pytest.mark.slow
def test_the_sections_an_import_refuses_are_exactly_the_restructuring_ones(folders: dict[str, Path]) -> None:
    """``restructuring_sections`` (each method's ``restructures``) decides whether a fine-tuning run re-initialises
    (``load_checkpoint``): a section missing from it refused ``train lm --pretrained GPT2 --set cla.sharing_factor=2
    --set reinitialise=true`` with advice to pass the flag just passed. Every method with a causal form (its
    ``lm_examples``) is checked both ways."""
    from interlayer.pretrained.hf_load import restructuring_sections

    answers = {}
    for case, (name, section) in METHOD_SECTIONS.items():
        model = from_hf(folders["tied"], extra_sections={name: section}, reinitialise=True)
        try:
            from_hf(folders["tied"], extra_sections={name: section})
            answers[case] = False
        except PretrainedError as err:
            answers[case] = "restructure the pretrained weights" in str(err)
        assert answers[case] == bool(restructuring_sections(model.config)), case
    assert set(answers.values()) == {True, False}  # both answers are checked


@pytest.mark.parametrize("sets", [["cla.sharing_factor=2"], ["value_residual.mode=svformer"], ["layer_sharing=true"]],
                         ids=["cla", "svformer", "layer_sharing"])
def test_lm_fine_tuning_with_a_restructuring_section_and_reinitialise_trains(sets: list[str],
                                                                             folders: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    text = tmp_path / "book.txt"
    text.write_text("\n".join(TEXTS * 30), encoding="utf-8")
    args = ["train", "lm", "--pretrained", str(folders["tied"]), "--data", str(text), "--run-dir", str(tmp_path / "r"),
            "--no-progress", "--set", "data.block_size=32", "--set", "train.max_tokens=64", "--set",
            "train.max_steps=1", "--set", "reinitialise=true", *[a for s in sets for a in ("--set", s)]]
    assert main(args) == 0
    assert json.loads((tmp_path / "r" / "task.json").read_text())["pretrained"]["restructured"]


def test_a_method_size_the_checkpoint_does_not_justify_is_refused_before_building(folders: dict[str, Path],
                                                                                    tmp_path: Path, capsys: Any
                                                                                    ) -> None:
    """The checks of every model folder apply to a Hugging Face import's method sections too (a rate this large is
    now refused by the config's bound of 64 first: issue 49)."""
    with pytest.raises((PretrainedError, ConfigError), match=r"hyper_connections\.rate=100000000 is (larger than "
                       r"anything .* holds|more than 64)"):
        from_hf(folders["tied"], extra_sections={"hyper_connections": {"rate": 100_000_000}})
    text = tmp_path / "book.txt"
    text.write_text("\n".join(TEXTS * 30), encoding="utf-8")
    assert main(["train", "lm", "--pretrained", str(folders["tied"]), "--data", str(text), "--run-dir",
                 str(tmp_path / "r"), "--no-progress", "--set", "data.block_size=32", "--set",
                 "hyper_connections.rate=100000000"]) == 2
    assert "hyper_connections.rate=100000000 is more than 64" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
