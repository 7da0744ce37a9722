"""Folders any Hugging Face tool accepts (issue 50): ``model.save_pretrained(dir)`` loads with the Auto classes,
a character-level export has unknown and pad tokens (pipeline batching works), ``InterlayerConfig`` has the
special ids, ``use_cache`` and GPT-2's size names, ``num_parameters(exclude_embeddings=True)`` leaves the position
table out, and an export that falls back to interlayer's format names the methods no family computes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import interlayer
from interlayer.data.tokenizers.language_model import CharTokenizer, load_lm_tokenizer
from interlayer.pretrained.export import export

transformers = pytest.importorskip("transformers")

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler [PAD] in the mind to suffer\n"
TINY = dict(d_model=16, n_heads=2, d_ffn=32, enc_layers=2, max_positions=32)


@pytest.mark.parametrize("kind", ["lm_sg", "classifier_pa"])
def test_model_save_pretrained_loads_with_the_auto_classes(kind: str, tmp_path: Path) -> None:
    """The most common habit: save_pretrained, then AutoModelFor...from_pretrained ("Unrecognized model ... should
    have a model_type key" before); interlayer.load_pretrained reads the same folder."""
    torch.manual_seed(0)
    if kind == "lm_sg":
        model = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=30, **TINY,
                                        crossformer={"hard": ["kq"], "soft": ["ffn"]}).eval()
        auto = transformers.AutoModelForCausalLM
    else:
        model = interlayer.create_model(dict(src_vocab_size=30, arch="encoder_classifier", num_classes=3,
                                             predictive={}, **TINY)).eval()
        auto = transformers.AutoModelForSequenceClassification
    model.save_pretrained(tmp_path)
    back = auto.from_pretrained(str(tmp_path))
    ids = torch.randint(1, 30, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(input_ids=ids).logits)
        assert torch.equal(interlayer.load_pretrained(tmp_path)(input_ids=ids).logits, model(input_ids=ids).logits)
    assert interlayer.checkpoint.tie_map(back.interlayer) == interlayer.checkpoint.tie_map(model)
    assert transformers.AutoConfig.from_pretrained(str(tmp_path)).n_embd == 16


def test_folders_saved_before_still_load(tmp_path: Path) -> None:
    """config.json held the config alone before (the model type in the weights' metadata)."""
    model = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=30, **TINY).eval()
    model.save_pretrained(tmp_path)
    section = json.loads((tmp_path / "config.json").read_text())["interlayer"]["config"]
    (tmp_path / "config.json").write_text(json.dumps(section))
    ids = torch.randint(0, 30, (1, 7))
    assert torch.equal(interlayer.load_pretrained(tmp_path)(ids).logits, model(ids).logits)


@pytest.fixture(scope="module")
def char_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, CharTokenizer, Path]:
    """A character-level language model (nanoGPT's preset: bias-free, so interlayer's format) exported with its
    tokenizer."""
    tokenizer = CharTokenizer.train([TEXT])
    torch.manual_seed(0)
    model = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=len(tokenizer), dropout=0.0,
                                    **TINY).eval()
    model.tokenizer = tokenizer
    folder = tmp_path_factory.mktemp("char") / "out"
    assert export(model, folder).format == "interlayer"
    return model, tokenizer, folder


def test_a_character_export_has_unknown_and_pad_tokens(char_export) -> None:
    model, tokenizer, folder = char_export
    size = len(tokenizer)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert (hf_tokenizer.unk_token_id, hf_tokenizer.pad_token_id) == (size, size + 1)
    assert hf_tokenizer("To be")["input_ids"] == tokenizer.encode("To be")
    assert hf_tokenizer("be☃")["input_ids"] == tokenizer.encode("be") + [size]  # unseen: [UNK], no tokenizers error
    assert hf_tokenizer("[PAD]")["input_ids"] == tokenizer.encode("[PAD]")  # text stays characters
    assert hf_tokenizer.decode(tokenizer.encode("To be") + [size + 1], skip_special_tokens=True) == "To be"
    assert load_lm_tokenizer(folder).chars == tokenizer.chars  # interlayer reads its folder back
    config = transformers.AutoConfig.from_pretrained(str(folder))
    # no special id of the model's own (transformers checks config.json's against the table); generate's pad is
    # the tokenizer's
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id, config.use_cache) == (None, None, None,
                                                                                                True)
    assert (config.n_embd, config.n_layer, config.n_head, config.n_positions, config.n_inner) == (16, 2, 2, 32, 32)
    assert json.loads((folder / "generation_config.json").read_text()) == {"pad_token_id": size + 1}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    with pytest.raises(ValueError, match=rf"= {size} is not a token of this model .*\[UNK\]"):
        hf.generate(torch.tensor([tokenizer.encode("be") + [size]]), max_new_tokens=2)


def test_pipeline_batches_a_character_export(char_export) -> None:
    """pipeline refused to batch ("tokenizer without pad_token"), and its suggested fix raised AttributeError."""
    model, tokenizer, folder = char_export
    pipe = transformers.pipeline("text-generation", model=str(folder), batch_size=2)
    prompts = ["To be", "or not to be: th"]
    outputs = pipe(prompts, max_new_tokens=6, do_sample=False)
    for prompt, out in zip(prompts, outputs):
        alone = model.generate(torch.tensor([tokenizer.encode(prompt)]), max_new_tokens=6)
        assert out[0]["generated_text"] == prompt + tokenizer.decode(alone[0, len(prompt):].tolist())
    pipe.tokenizer.pad_token_id = pipe.model.config.eos_token_id  # transformers' advice: no AttributeError now


def test_num_parameters_leaves_the_position_table_out(char_export) -> None:
    """transformers' count knows nn.Embedding only: it said 35,264 where GPT-2 and the model itself say 34,240."""
    model, _, folder = char_export
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    tables = model.encoder.embed.tokens.weight.numel() + model.encoder.embed.positions.weight.numel()
    assert hf.num_parameters(exclude_embeddings=True) == model.num_parameters() - tables
    assert hf.num_parameters() == model.num_parameters()


def test_an_interlayer_format_export_names_the_methods_no_family_computes(tmp_path: Path) -> None:
    """The reason was the first core mismatch ("bias=False") when a method was what no family computes."""
    model = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=30, **TINY, predictive={},
                                    value_residual={})
    report = export(model, tmp_path / "out", tokenizer=False)
    assert report.reason.startswith("no Hugging Face family computes the predictive and value_residual sections "
                                    "(nor this core: not GPT-2: bias=False")
    plain = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=30, **TINY, crossformer={"hard": ["kq"]})
    assert export(plain, tmp_path / "plain", tokenizer=False).reason.startswith(
        "no Hugging Face family computes this model (not GPT-2: bias=False")  # ties compute the plain model
