"""``interlayer export RUN_DIR OUT_DIR`` (issues 31 and 41): a CLI-trained run comes back in ``transformers`` with
its tokenizer, its labels' names, a model card, and the same logits; a method no ``transformers`` family computes
(PA) is written for interlayer's ``transformers`` classes, which ``AutoModelForSequenceClassification`` loads after
``import interlayer``, and the command says so."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from interlayer import create_model, load_pretrained
from interlayer.cli import main

transformers = pytest.importorskip("transformers")

from helpers.finetune import write_checkpoint, write_data  # noqa: E402
from helpers.folders import read_only_folder, snapshot  # noqa: E402
from interlayer.errors import PretrainedError  # noqa: E402
from interlayer.pretrained.export import to_hf  # noqa: E402
from interlayer.pretrained.hf import from_hf  # noqa: E402
from interlayer.pretrained.hf_checkpoint import load_tokenizer  # noqa: E402

TEXTS = ["the film was good", "it was bad ,"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two sst2 fine-tuning runs of a tiny BERT, trained by the CLI: plain, and with Predictive Attention."""
    root = tmp_path_factory.mktemp("export")
    checkpoint = write_checkpoint(root / "tiny-bert")
    files = write_data(root / "data", "sst2")
    out = {}
    for name, extra in (("plain", []), ("pa", ["--set", "predictive.alpha=0.2"])):
        out[name] = root / name
        assert main(["train", "sst2", "--pretrained", str(checkpoint), "--train", str(files["train"]), "--valid",
                     str(files["valid"]), "--test", str(files["test"]), "--run-dir", str(out[name]),
                     "--no-progress", "--set", "data.max_len=32", "--set", "data.batch_size=4", "--set",
                     "train.max_epochs=1", *extra]) == 0
    return out


def assert_the_runs_tokenizer(tokenizer, run: Path, batch) -> None:
    """Not the stand-in transformers makes up when a folder has no tokenizer files (a 5-word vocabulary)."""
    ours = load_tokenizer(run / "best")
    assert len(tokenizer) == ours.vocab_size and tokenizer.unk_token_id not in batch["input_ids"]
    ids, _ = ours.encode(TEXTS[0])
    assert batch["input_ids"][0, :len(ids)].tolist() == ids


@pytest.mark.slow
def test_cli_export_loads_back_in_transformers_with_tokenizer_labels_and_card(runs, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(runs["plain"]), str(out)]) == 0
    assert "BertForSequenceClassification for transformers" in capsys.readouterr().out
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    ours = load_pretrained(runs["plain"] / "best").eval()
    assert_the_runs_tokenizer(tokenizer, runs["plain"], batch)
    with torch.no_grad():
        expected = ours(**batch).logits  # the same call: HF's keyword arguments
        assert (hf(**batch).logits - expected).abs().max() < 1e-5
    card = (out / "README.md").read_text()
    results = json.loads((runs["plain"] / "results.json").read_text())
    assert "library_name: transformers" in card and "base_model: " in card and "tiny-bert" in card
    assert "- labels: negative, positive" in card and f"- test_accuracy: {results['test_accuracy']}" in card
    assert "- command: `interlayer train sst2 --pretrained" in card


def test_cli_export_of_a_pa_run_loads_with_automodel_after_import_interlayer_and_says_so(runs, tmp_path, capsys):
    out = tmp_path / "own"
    assert main(["export", str(runs["pa"]), str(out)]) == 0
    said = capsys.readouterr().out
    assert "InterlayerForSequenceClassification" in said and "predictive" in said and "import interlayer" in said
    back = load_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))  # the run's tokenizer files, copied
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert_the_runs_tokenizer(tokenizer, runs["pa"], batch)
    trained = load_pretrained(runs["pa"] / "best")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out))
    assert not back.training and not hf.training
    with torch.no_grad():
        expected = trained(**batch).logits
        assert torch.equal(back(**batch).logits, expected) and torch.equal(hf(**batch).logits, expected)
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    assert json.loads((out / "task.json").read_text())["labels"] == ["negative", "positive"]
    card = (out / "README.md").read_text()
    assert "library_name: interlayer" in card and "method predictive" in card and "after `import interlayer`" in card
    assert "- tokenizer: WordPiece" in card


def test_lm_export_writes_generation_config_and_refuses_a_missing_tokenizer(tmp_path):
    from helpers.hf_gpt2 import hf_gpt2, write_tokenizer

    hf_gpt2("tied").save_pretrained(str(tmp_path / "gpt2"))
    write_tokenizer(tmp_path / "gpt2")
    to_hf(from_hf(tmp_path / "gpt2"), tmp_path / "lm")  # the import's tokenizer goes along
    generation = transformers.GenerationConfig.from_pretrained(str(tmp_path / "lm"))
    assert generation.eos_token_id == generation.pad_token_id == 0  # <|endoftext|>
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "lm")).eos_token_id == 0
    assert "AutoModelForCausalLM" in (tmp_path / "lm" / "README.md").read_text()
    bare = create_model("gpt2_small", src_vocab_size=50, d_model=16, n_heads=2, d_ffn=32, enc_layers=2,
                        max_positions=16)
    with pytest.raises(PretrainedError, match="a tokenizer was asked for, but the model has none"):
        to_hf(bare, tmp_path / "x", tokenizer=True)


def test_export_of_a_missing_run_is_a_user_error(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "neither a run directory" in capsys.readouterr().err


# -- where an export may write (issue 43) ----------------------------------------------------------------------------
def _export(*argv: str) -> int:
    return main(["export", *map(str, argv)])


def test_export_never_writes_into_the_run_or_folder_it_reads(runs, tmp_path, capsys):
    """``export RUN RUN/best`` replaced the run's own best model (after which generate and export of the run failed
    with "unknown key 'model_type'"); exporting a folder onto itself replaced its files."""
    run = tmp_path / "run"
    shutil.copytree(runs["plain"], run)
    before = snapshot(run)
    for source, target, relation in [(run, run / "best", "lies inside"), (run / "best", run / "best", "is"),
                                     (run / "best", run / "best" / "sub", "lies inside"), (run / "best", run, "holds")]:
        assert _export(source, target, "--overwrite") == 2
        err = capsys.readouterr().err
        assert f"the export target {target} {relation} {source}, the run or model folder being exported" in err
        assert err.count("\n") == 1
    assert snapshot(run) == before


def test_export_refuses_a_non_empty_target_unless_overwrite_and_then_replaces_it_whole(runs, tmp_path, capsys):
    target = tmp_path / "out"
    target.mkdir()
    (target / "merges.txt").write_text("an earlier export's file")
    assert _export(runs["plain"], target) == 2
    assert (f"the export target {target} is not empty (merges.txt); pass --overwrite to replace its contents, or "
            "choose a new or empty folder") in capsys.readouterr().err
    assert os.listdir(target) == ["merges.txt"]
    assert _export(runs["plain"], target, "--overwrite") == 0
    assert "merges.txt" not in os.listdir(target) and (target / "config.json").is_file()  # no stale file mixed in
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging folder left
    (tmp_path / "empty").mkdir()
    assert _export(runs["plain"], tmp_path / "empty") == 0  # an empty folder needs no --overwrite


def test_export_to_a_file_names_it_in_one_line(runs, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert _export(runs["plain"], tmp_path / "afile") == 2
    assert f"the export target {tmp_path / 'afile'} is a file; give a folder to write" in capsys.readouterr().err
    assert _export(runs["plain"], tmp_path / "afile" / "sub") == 2
    assert (f"the export target {tmp_path / 'afile' / 'sub'} cannot be a folder: {tmp_path / 'afile'} is a file"
            in capsys.readouterr().err)
    assert (tmp_path / "afile").read_text() == "x"


def test_export_into_a_read_only_folder_is_named_and_leaves_nothing(runs, tmp_path, capsys):
    with read_only_folder(tmp_path / "ro") as folder:
        assert _export(runs["plain"], folder / "out") == 2
        err = capsys.readouterr().err
        assert re.search(rf"^interlayer: error: cannot write {re.escape(str(folder))}.*: (read-only file system|"
                         r"permission denied); choose a place you may write to", err), err
        assert err.count("\n") == 1 and os.listdir(folder) == []
