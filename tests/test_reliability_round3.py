"""Issue 29, reliability third round: budgets that end before the first epoch, refused runs that leave nothing
behind, atomic result files and a full disk, Hugging Face folders from strangers, inputs checked before training.

Everything calls ``cli.main`` in-process with tiny models; docs/reliability.md lists each case with its test."""
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import set_args
from helpers.compare import compare_sets, faked_comparison
from interlayer.cli import main
from interlayer.compare.records import summarize
from interlayer.compare.report import md_code, write_report
from interlayer.compare.runner import run_state
from interlayer.errors import PretrainedError
from interlayer.pretrained.hf import from_hf, read_weights
from interlayer.training.engine import LAST

TINY_TRANSLATION = ["d_model=32", "n_heads=2", "d_ffn=64", "enc_layers=1", "dec_layers=1", "train.max_tokens=256",
                    "train.warmup_steps=2", "data.vocab_size=60"]
TINY_TEXT = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1"]
TINY_VQA = ["d_model=16", "n_heads=2", "d_ffn=32", "layers=1", "word_dim=8", "flat_mlp=16", "fused_dim=16",
            "feature_dim=4", "data.train_size=32", "data.valid_size=8", "data.test_size=8", "data.batch_size=16",
            "data.pavpu_samples=3"]
TINY_IMAGE = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.batch_size=8"]
TINY_LM = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.block_size=16", "train.max_tokens=64"]


def _translation_args(corpus: Path, run: Path, *sets: str) -> list[str]:
    files = [arg for split in ("train", "valid", "test") for side, lang in (("src", "de"), ("tgt", "en"))
             for arg in (f"--{split}-{side}", str(corpus / f"{split}.{lang}"))]
    return ["train", "translation", "--run-dir", str(run), "--no-progress", "--beam", "1", *files,
            *set_args([*TINY_TRANSLATION, *sets])]


# -- a budget that ends before the first epoch ------------------------------------------------------------------
@pytest.mark.parametrize("budget", [["train.max_steps=3"], ["train.max_minutes=1e-9"]], ids=["steps", "minutes"])
def test_translation_whose_budget_ends_before_the_first_epoch_scores_and_resumes(corpus, tmp_path, budget):
    """The issue's case: averaging 5 epoch checkpoints when none was written crashed after training."""
    run = tmp_path / "run"
    assert main(_translation_args(corpus, run, "train.average_last=5", *budget)) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["model"] == "best" and results["epochs"] == 0
    assert results["averaged"].startswith("none: train.average_last=5, but the run ended in epoch 1")
    assert not (run / "averaged").exists()
    assert main(["train", "translation", "--run-dir", str(run), "--no-progress", "--beam", "1", "--resume"]) == 0


def test_averaging_uses_the_epoch_checkpoints_that_exist_and_says_so(corpus, tmp_path):
    run = tmp_path / "run"
    assert main(_translation_args(corpus, run, "train.max_epochs=1", "train.keep_last=5",
                                  "train.average_last=5")) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["averaged"] == ("averaged/ is the mean of checkpoint1.safetensors (fewer than "
                                   "train.average_last=5: the run wrote no more)")
    assert set(results["valid_bleu"]) == {"best", "averaged"}


# Each task's shortest budget: a budget used up before the first optimiser step (nothing trained: the initial model
# is validated, saved as best/ and scored), and one step.
@pytest.mark.parametrize("task, extra", [
    ("sst2", TINY_TEXT), ("cora", ["hidden=4", "heads=2"]), ("lm", TINY_LM),
    ("fashion_mnist", TINY_IMAGE), ("vqa", TINY_VQA)])
@pytest.mark.parametrize("budget", ["train.max_minutes=1e-9", "train.max_steps=1"])
def test_every_task_finishes_its_shortest_budget(tmp_path, task, extra, budget):
    run = tmp_path / "run"
    data = []
    if task == "lm":  # the bundled Shakespeare takes 20 s to score
        (tmp_path / "book.txt").write_text("to be or not to be, that is the question.\n" * 40)
        data = ["--data", str(tmp_path / "book.txt")]
    assert main(["train", task, "--run-dir", str(run), "--no-progress", *data, *set_args([*extra, budget])]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished" and results["steps"] == (1 if "steps" in budget else 0)
    assert (run / "best" / "config.json").is_file()


# -- a refused run leaves no directory ----------------------------------------------------------------------------
@pytest.mark.parametrize("task, sets, message", [
    ("sst2", ["--seed", "-1"], r"train\.seed=-1 is outside 0\.\.4294967295"),
    ("sst2", ["--set", "train.update_freq=1000000"],
     r"the first epoch has \d+ training batches, fewer than one optimiser step needs \(train\.update_freq=1000000"),
    ("sst2", ["--set", "train.threads=100000"], r"train\.threads=100000 is more than this machine's \d+ CPU cores"),
    ("vqa", ["--set", "image_size=5"], r"image_size=5: Sort-of-CLEVR's pictures are 3 x 75 x 75 pixels"),
    ("vqa", ["--set", "data.release_seed=-1"], r"data\.release_seed=-1 must not be negative"),
])
def test_a_refused_run_leaves_no_directory_and_the_fixed_command_runs(tmp_path, capsys, task, sets, message):
    run = tmp_path / "run"
    tiny = TINY_VQA if task == "vqa" else TINY_TEXT
    base = ["train", task, "--run-dir", str(run), "--no-progress", *set_args([*tiny, "train.max_steps=1"])]
    assert main(base + sets) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not run.exists()
    assert main(base) == 0  # the corrected command is not refused as "already holds a run"


def test_a_too_long_validation_line_leaves_no_directory(corpus, tmp_path, capsys):
    lines = (corpus / "valid.de").read_text().splitlines()
    lines[2] = " ".join(["hund"] * 700)
    (tmp_path / "valid.de").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    args = _translation_args(corpus, run, "max_positions=64", "train.max_steps=1")
    args[args.index(str(corpus / "valid.de"))] = str(tmp_path / "valid.de")
    assert main(args) == 2
    assert re.search(r"valid\.de:3: the valid source sentence has \d+ tokens", capsys.readouterr().err)
    assert not run.exists()


def test_a_run_dir_below_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert main(["train", "sst2", "--run-dir", str(tmp_path / "afile" / "sub"), "--no-progress"]) == 2
    assert f"{tmp_path / 'afile'} is a file, not a folder; choose another --run-dir" in capsys.readouterr().err


# -- atomic files, a damaged results file, a full disk -----------------------------------------------------------
def test_a_damaged_results_file_is_named_and_the_run_counted_unfinished(corpus, tmp_path):
    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    damaged = out / "runs" / "baseline-s1" / "results.json"
    damaged.write_text('{"status": "fini')  # what a crash mid-write of an in-place writer left
    report = write_report(plan, out, ["interlayer", "compare", "..."])
    assert not report.complete
    run = next(r for s in summarize(plan, out) for r in s.runs if r.name == "baseline-s1")
    assert run.state == "interrupted"
    assert run.detail.startswith(f"{damaged}:1:") and "not valid JSON" in run.detail
    assert "counted as unfinished" in report.markdown.read_text()
    (damaged.parent / LAST).write_bytes(b"")
    assert run_state(damaged.parent) == "resumable"  # the next compare resumes it, which scores it again


def test_a_full_disk_names_the_file_and_the_free_space_and_keeps_the_old_file(corpus, tmp_path, capsys,
                                                                              monkeypatch):
    """The training checkpoint's second save meets a full disk (safetensors raises its own error type): exit 2
    naming the file and the free space; the first checkpoint is intact and no temporary file is left."""
    import safetensors.torch

    import interlayer.training.state_file as state_file

    real, saved = state_file.save_file, []

    def save_file(tensors, filename, metadata=None):
        if saved:
            Path(filename).write_bytes(b"partial")  # what a full disk leaves: a part of the file
            raise safetensors.SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                              "message: \"No space left on device\" })")
        real(tensors, filename, metadata=metadata)
        saved.append(Path(filename).read_bytes())

    monkeypatch.setattr(state_file, "save_file", save_file)
    run = tmp_path / "run"
    assert main(_translation_args(corpus, run, "train.max_steps=3", "train.save_interval_steps=1")) == 2
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(str(run / LAST))}: no space left on device while writing it \([\d.]+ MiB free "
                     rf"in {re.escape(str(run))}\); the previous {LAST}, if any, is intact", err)
    assert (run / LAST).read_bytes() == saved[0] and not (run / (LAST + ".tmp")).exists()


def test_every_text_file_write_is_atomic_on_enospc(tmp_path, monkeypatch, capsys):
    """results.json, task.json, the vocabularies ... all go through fileio.write_atomic: an OSError(ENOSPC) in it is
    one line naming the file, exit 2 (the writer is monkeypatched to fail at results.json)."""
    import errno

    import interlayer.fileio as fileio

    real = Path.write_bytes

    def write_bytes(self, data):
        if self.name == "results.json.tmp":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(fileio.Path, "write_bytes", write_bytes)
    run = tmp_path / "run"
    assert main(["train", "sst2", "--run-dir", str(run), "--no-progress",
                 *set_args([*TINY_TEXT, "train.max_steps=1"])]) == 2
    assert f"{run / 'results.json'}: no space left on device while writing it" in capsys.readouterr().err
    assert not (run / "results.json").exists() and not (run / "results.json.tmp").exists()


def test_no_run_file_is_written_in_place():
    """Every write of the package goes through fileio's atomic writers: no write_text, and save_file only inside
    atomic_path (the CSV logs are appended row by row, which a crash cannot leave half-rewritten)."""
    root = Path(__file__).resolve().parents[1] / "src" / "interlayer"
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            if ".write_text(" in line or (re.search(r"\bsave_file\(", line) and "tmp" not in line
                                          and "import" not in line):
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    allowed = {"cli.py", "data/idx.py", "data/corpus.py", "pretrained/export.py", "pretrained/gpt2.py",
               "pretrained/tokenization.py"}
    assert [o for o in offenders if o.split(":")[0] not in allowed] == []


# -- Hugging Face folders from strangers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny random BERT, GPT-2 and ViT folders as ``transformers`` saves them (no download)."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf")
    models = {
        "bert": transformers.BertModel(transformers.BertConfig(
            vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=40)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=40, bos_token_id=0, eos_token_id=0)),
        "vit": transformers.ViTModel(transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16,
            patch_size=4)),
    }
    for name, model in models.items():
        model.save_pretrained(str(root / name))
    return {name: root / name for name in models}


def _stranger(hf_folders, tmp_path, name="bert") -> Path:
    folder = tmp_path / name
    shutil.copytree(hf_folders[name], folder)
    return folder


def _sharded(folder: Path, shard: str) -> None:
    """Replace model.safetensors by an index naming ``shard`` for every tensor."""
    names = list(load_file(str(folder / "model.safetensors")))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    (folder / "model.safetensors").unlink()


@pytest.mark.parametrize("shard, message", [
    ("/etc/passwd", r"weight_map names the shard '/etc/passwd'; a shard must be a file inside .* \(no absolute path"),
    ("../outside.safetensors", r"weight_map names the shard '\.\./outside\.safetensors'; a shard must be a file "),
    ("link.safetensors", r"link\.safetensors leads outside .* \(to .*outside\.safetensors\); a checkpoint folder may "
                         r"only read its own files: refused"),
    ("fifo.safetensors", r"fifo\.safetensors is not a regular file \(a FIFO, device or folder\); refused"),
])
def test_a_shard_index_pointing_outside_the_folder_is_refused(hf_folders, tmp_path, capsys, shard, message):
    folder = _stranger(hf_folders, tmp_path)
    shutil.copy(folder / "model.safetensors", tmp_path / "outside.safetensors")
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    os.mkfifo(folder / "fifo.safetensors")
    _sharded(folder, shard)
    with pytest.raises(PretrainedError, match=message):
        read_weights(folder)
    assert main(["train", "sst2", "--pretrained", str(folder), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_shard_index_inside_the_folder_still_loads(hf_folders, tmp_path):
    folder = _stranger(hf_folders, tmp_path)
    shutil.copy(folder / "model.safetensors", folder / "part-1.safetensors")
    _sharded(folder, "part-1.safetensors")
    assert set(read_weights(folder)) == set(load_file(str(hf_folders["bert"] / "model.safetensors")))


@pytest.mark.parametrize("name, changes, message", [
    ("bert", {"num_hidden_layers": 1_000_000}, r"lacks BERT encoder tensors encoder\.layer\.1\..* \(config\.json "
                                               r"declares 1000000 layers, the weights hold 1\); refused before any"),
    ("gpt2", {"n_layer": 1_000_000}, r"lacks .* encoder tensors h\.1\..* \(config\.json declares 1000000 layers, "
                                     r"the weights hold 1\)"),
    ("bert", {"vocab_size": 10 ** 12}, r"embeddings\.word_embeddings\.weight has shape \(60, 16\) but "
                                       r"encoder\.embed\.tokens\.weight expects \(1000000000000, 16\)"),
    ("gpt2", {"vocab_size": 10 ** 12}, r"wte\.weight has shape \(60, 16\) but encoder\.embed\.tokens\.weight "
                                       r"expects \(1000000000000, 16\)"),
])
def test_config_sizes_the_weights_do_not_hold_are_refused_before_any_model_is_built(hf_folders, tmp_path,
                                                                                    monkeypatch, name, changes,
                                                                                    message):
    import interlayer.pretrained.hf as hf

    folder = _stranger(hf_folders, tmp_path, name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    real_build, built = hf.build, []  # the device of every model built: only the shapes-only meta one may be
    monkeypatch.setattr(hf, "build", lambda config: built.append(torch.empty(0).device.type) or real_build(config))
    with pytest.raises(PretrainedError, match=message):
        from_hf(folder)
    assert set(built) <= {"meta"}


class _NotATensor:  # a pickled object of a class: what weights_only=True refuses
    pass


def _write(name: str, data):
    def damage(folder: Path) -> None:
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return damage


def _config(**changes):
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return damage


def _truncated(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _index(text: str):
    def damage(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors.index.json").write_text(text)
    return damage


def _pickle_bin(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save({"weight": _NotATensor()}, folder / "pytorch_model.bin")


def _bpe_files(vocab: str, merges: bytes = b"#version: 0.2\n"):
    def damage(folder: Path) -> None:
        (folder / "vocab.json").write_text(vocab)
        (folder / "merges.txt").write_bytes(merges)
    return damage


@pytest.mark.parametrize("name, damage, message", [
    ("bert", _truncated, r"model\.safetensors: not a readable safetensors file \(.*\); it may be truncated"),
    ("bert", _write("model.safetensors", b""), r"model\.safetensors: not a readable safetensors file"),
    ("bert", _write("model.safetensors", (2 ** 62).to_bytes(8, "little") + b"{}"),
     r"model\.safetensors: not a readable safetensors file"),
    ("bert", _write("config.json", "[1, 2]"), r"config\.json: expected a JSON object, got list"),
    ("bert", _write("config.json", b"\xff\xfe{}"), r"config\.json:1: not valid UTF-8"),
    ("bert", _config(model_type=["bert"]), r"config\.json: model_type=\['bert'\] is not supported"),
    ("bert", _index("garbage"), r"model\.safetensors\.index\.json:1:1: not valid JSON"),
    ("bert", _index("{}"), r"model\.safetensors\.index\.json: no weight_map"),
    ("bert", _pickle_bin, r"pytorch_model\.bin holds Python objects besides tensors, which interlayer does not "
                          r"unpickle"),
    ("bert", _write("vocab.txt", b"[PAD]\n\xff\xfe\x00\n"), r"vocab\.txt:2: not valid UTF-8"),
    ("gpt2", _bpe_files('{"a": 0, "b": 1}', b"#version: 0.2\n\xff\xfe\n"), r"merges\.txt:2: not valid UTF-8"),
    ("gpt2", _bpe_files('{"a": 0, "b": "x"}'), r"vocab\.json: token 'b' has the id 'x'; the ids of a vocabulary "
                                               r"of 2 tokens are the integers 0\.\.1"),
    ("gpt2", _bpe_files('{"a": 0, "b": 1000000000}'), r"vocab\.json: token 'b' has the id 1000000000"),
    ("vit", _config(patch_size=0), r"patch_size=0 must be positive"),
])
def test_bad_files_in_a_hugging_face_folder_are_exit_2_naming_the_file(hf_folders, tmp_path, capsys, name,
                                                                       damage, message):
    folder = _stranger(hf_folders, tmp_path, name)
    damage(folder)
    task = {"bert": "sst2", "gpt2": "lm", "vit": "fashion_mnist"}[name]
    assert main(["train", task, "--pretrained", str(folder), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_a_run_json_edited_to_ten_million_layers_is_refused_on_resume_before_building(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_translation_args(corpus, run, "train.max_steps=1", "train.average_last=0")) == 0
    record = json.loads((run / "run.json").read_text())
    record["model"]["enc_layers"] = 10_000_000
    (run / "run.json").write_text(json.dumps(record))
    assert main(["train", "translation", "--run-dir", str(run), "--no-progress", "--resume"]) == 2
    assert re.search(rf"{re.escape(str(run / 'run.json'))} describes another model than .*checkpoint_last\.safetensors "
                     r"holds: enc_layers 10000000 \(checkpoint: 1\)", capsys.readouterr().err)


# -- inputs and scores checked -------------------------------------------------------------------------------------
def test_a_last_step_that_diverges_stops_the_run_at_the_non_finite_validation(tmp_path, capsys):
    run = tmp_path / "run"
    sets = [*TINY_TEXT, "train.lr=1e30", "train.warmup_steps=0", "train.schedule=constant", "train.max_steps=1"]
    assert main(["train", "sst2", "--run-dir", str(run), "--no-progress", *set_args(sets)]) == 3
    assert re.search(r"training diverged at step 1: the validation scores are not finite \(nll nan",
                     capsys.readouterr().err)
    assert not (run / "results.json").exists()


def test_non_finite_test_scores_stop_the_run_without_results(tmp_path, capsys, monkeypatch):
    from interlayer.tasks.text_classification import TextClassificationSpec

    finish = TextClassificationSpec.finish
    monkeypatch.setattr(TextClassificationSpec, "finish",
                        lambda *args: {**finish(*args), "test_accuracy": float("nan")})
    run = tmp_path / "run"
    assert main(["train", "sst2", "--run-dir", str(run), "--no-progress", *set_args([*TINY_TEXT,
                                                                                   "train.max_steps=1"])]) == 3
    assert "are not finite (test_accuracy nan); no results.json is written" in capsys.readouterr().err
    assert not (run / "results.json").exists()


@pytest.fixture(scope="module")
def language_model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    (root / "book.txt").write_text("to be or not to be, that is the question.\n" * 40)
    run = root / "run"
    assert main(["train", "lm", "--data", str(root / "book.txt"), "--run-dir", str(run), "--no-progress",
                 *set_args([*TINY_LM, "train.max_steps=1"])]) == 0
    return run / "best"


@pytest.mark.parametrize("args", [["--temperature", "nan"], ["--temperature", "inf"], ["--top-p", "nan"]])
def test_generate_refuses_non_finite_sampling_settings(language_model, capsys, args):
    with pytest.raises(SystemExit) as stopped:  # argparse's own exit for a bad argument
        main(["generate", "--checkpoint", str(language_model), *args])
    assert stopped.value.code == 2
    assert f"{args[1]} is not a finite number" in capsys.readouterr().err


@pytest.mark.parametrize("std", ["nan", "inf", "-inf"])
def test_evaluate_refuses_a_non_finite_noise_std(language_model, capsys, std):
    with pytest.raises(SystemExit) as stopped:
        main(["evaluate", "--checkpoint", str(language_model), f"--noise-std={std}"])
    assert stopped.value.code == 2 and "is not a finite number" in capsys.readouterr().err


def test_generate_refuses_a_prompt_that_is_not_utf8_and_an_unbounded_length(language_model, capsys):
    # a byte that is not UTF-8 on the command line reaches Python as a lone surrogate (surrogateescape)
    assert main(["generate", "--checkpoint", str(language_model), "--prompt", "to \udcff be"]) == 2
    assert "--prompt is not valid UTF-8 (byte 3: b'\\xff be'); give the prompt as UTF-8" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(language_model), "--max-new-tokens", "100000000"]) == 2
    assert "--max-new-tokens=100000000 is more than 100,000" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(language_model), "--max-new-tokens", "5", "--prompt", "to"]) == 0


def test_report_md_escapes_group_names_and_the_command_line(corpus, tmp_path):
    from interlayer.compare.selection import parse_selections

    out = tmp_path / "cmp"
    plan = faked_comparison(corpus, out, "baseline,pa")
    group = "<script>alert(1)</script>`x|y*"
    command = ["interlayer", "compare", "--select", f"{group}=baseline,pa", "--note", "a``b`"]
    report = write_report(plan, out, command, parse_selections([f"{group}=baseline,pa"]))
    text = report.markdown.read_text()
    assert "<script>" not in text.replace(md_code(" ".join(command)), "")  # raw only inside the code span
    assert r"\<script\>alert(1)\</script\>\`x\|y\*" in text  # in the table and the chosen line, escaped
    assert "Command: ``` interlayer compare --select <script>" in text  # a fence longer than any run of backticks
    assert md_code("a``b`") == "``` a``b` ```" and md_code("plain") == "`plain`"
    assert "<script>" not in report.html.read_text().replace("&lt;script&gt;", "")


def test_the_search_study_is_created_under_a_lock_of_its_output(tmp_path, monkeypatch):
    """Two `search mpt` started together on a new --output raced in Optuna's schema creation: the storage and the
    study are now made while OUTPUT/study.lock is held (another process's flock on it must wait)."""
    import fcntl

    import interlayer.search.mpt as mpt
    from helpers.search import DEFINITION, search_settings

    real, held = mpt.make_storage, []

    def make_storage(settings):
        with open(tmp_path / "search" / mpt.STUDY_LOCK) as other:  # another open file: another lock holder
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return real(settings)

    monkeypatch.setattr(mpt, "make_storage", make_storage)
    study, _ = mpt.open_study(search_settings(tmp_path, trials=2), DEFINITION)
    assert held == [True] and len(study.get_trials()) == 1  # the identity, queued once


# -- VQA region features, checked in full before training -----------------------------------------------------------
def _item(question: str, image: str):
    from interlayer.data.vqa_formats import VQAItem

    return VQAItem(question, image, "q", ["a"], "a")


@pytest.mark.parametrize("array, message", [
    (np.array([[0.0, 1.0, np.nan, 1.0]] * 2, np.float32), r"177\.npz: the features hold non-finite values"),
    (np.zeros((3, 2, 4), np.float32), r"177\.npz: features of shape \(3, 2, 4\); expected \(regions, 4\)"),
    (np.zeros((0, 4), np.float32), r"177\.npz: no regions"),
    (np.array([["a"] * 4], dtype="U1"), r"177\.npz: features of type <U1; expected real numbers"),
])
def test_every_feature_file_is_read_and_checked_before_training(tmp_path, array, message):
    from interlayer.data.text import DataError
    from interlayer.data.vqa_formats import check_images, open_features

    for image in range(1, 200):
        np.savez(tmp_path / f"{image}.npz", x=array if image == 177 else np.zeros((2, 4), np.float32))
    items = [_item(str(i), str(i)) for i in range(1, 200)]
    with pytest.raises(DataError, match=message):
        check_images(items, open_features(tmp_path, 4), "q.json")


def test_an_object_array_of_features_is_refused_unread(tmp_path):
    from interlayer.data.text import DataError
    from interlayer.data.vqa_formats import check_images, open_features

    np.savez(tmp_path / "1.npz", x=np.array([object()] * 4, dtype=object).reshape(1, 4))
    with pytest.raises(DataError, match=r"1\.npz: not a readable \.npz file \(Object arrays cannot be loaded"):
        check_images([_item("9", "1")], open_features(tmp_path, 4), "q.json")


def test_a_duplicate_image_id_in_a_tsv_or_npz_folder_is_refused(tmp_path):
    import base64

    from interlayer.data.text import DataError
    from interlayer.data.vqa_formats import open_features

    features = base64.b64encode(np.zeros(4, np.float32).tobytes()).decode()
    line = "\t".join(["42", "640", "480", "1", "", features])
    (tmp_path / "f.tsv").write_text(f"{line}\n{line.replace('42', '7', 1)}\n{line}\n")
    with pytest.raises(DataError, match=r"f\.tsv:3: image id 42 again \(first at line 1\); every image has one line"):
        open_features(tmp_path / "f.tsv", 4)
    folder = tmp_path / "npz"
    folder.mkdir()
    np.savez(folder / "42.npz", x=np.zeros((1, 4), np.float32))
    np.savez(folder / "42.jpg.npz", x=np.ones((1, 4), np.float32))
    with pytest.raises(DataError, match=r"42\.jpg\.npz and 42\.npz are both the features of image 42|"
                                        r"42\.npz and 42\.jpg\.npz are both the features of image 42"):
        open_features(folder, 4)


def test_a_translation_comparison_of_three_steps_finishes_every_run(corpus, tmp_path):
    """The issue's `compare --task translation --budget-steps 3`: with the task's average_last=5 every run FAILED."""
    out = tmp_path / "cmp"
    sets = {**compare_sets(corpus), "train.average_last": "5", "train.keep_last": "5"}
    assert main(["compare", "--task", "translation", "--variants", "baseline", "--budget-steps", "3", "--output",
                 str(out), *set_args(f"{k}={v}" for k, v in sets.items())]) == 0
    assert json.loads((out / "runs" / "baseline-s1" / "results.json").read_text())["averaged"].startswith("none:")


def test_two_processes_on_a_one_batch_graph_are_refused_before_the_run_is_written(monkeypatch):
    """`torchrun --nproc-per-node 2 ... train cora`: Cora's epoch is one batch, a step of 2 processes needs 2
    (it was "internal error: ValueError" after run.json was written). The check reads the world size."""
    from interlayer import experiment
    from interlayer.core.config import ConfigError
    from interlayer.tasks import task_specs
    from interlayer.training.distributed import DistEnv

    monkeypatch.setattr(experiment.distributed, "environment", lambda: DistEnv(rank=0, world_size=2, local_rank=0))
    with pytest.raises(ConfigError, match=r"the first epoch has 1 training batches, fewer than one optimiser step "
                                          r"needs \(train\.update_freq=1 x 2 process\(es\) = 2\)"):
        experiment._resolve_new(task_specs()["cora"], None, {}, None, None)
