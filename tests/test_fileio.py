"""fileio: every file of a folder from elsewhere read through one confinement (no link out of the folder, no FIFO or
device), parsing bounded in depth and integer size, values quoted short, writes that fail named (issue 43)."""
import errno
import json
import os
import re
import shutil
import stat
import threading
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from helpers import set_args
from helpers.folders import fifo, link_out, train_tiny_lm
from helpers.pretrained import tiny_state, write_bert
from helpers.tiny_runs import TINY_TEXT, translation_args
from interlayer import CheckpointError, load_pretrained
from interlayer.cli import main
from interlayer.data.bpe import VocabPair
from interlayer.data.classification import WordVocab
from interlayer.data.tokenizers.byte_level_bpe import BPETokenizer
from interlayer.data.tokenizers.language_model import load_lm_tokenizer
from interlayer.data.tokenizers.pretrained import tokenizer_kind
from interlayer.data.tokenizers.wordpiece import WordPieceTokenizer
from interlayer.errors import ConfigError, DataError, PretrainedError, TokenizerError, WriteError
from interlayer.fileio import (
    MAX_DEPTH,
    atomic_directory,
    atomic_path,
    confined,
    json_field,
    load_yaml,
    parse_json,
    read_json,
    read_text,
    read_yaml_or_json,
    shorten,
    umask,
)
from interlayer.pretrained.hf_checkpoint import _pixel_normalisation, read_hf_config
from interlayer.pretrained.hf_files import read_weights
from interlayer.pretrained.run_assets import read_run_assets
from interlayer.tasks import task_specs
from interlayer.training.engine import LAST

LEADS_OUT = r"leads outside .* \(to .*\); a checkpoint folder may only read its own files: refused"


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    return train_tiny_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture()
def best(lm_run, tmp_path) -> Path:
    """A copy of the run (its best/ model and the run's files), to damage."""
    shutil.copytree(lm_run, tmp_path / "run")
    return tmp_path / "run" / "best"


# -- the helper ----------------------------------------------------------------------------------------------------
def test_confined_follows_links_inside_and_refuses_links_out_and_special_files(tmp_path):
    folder, outside = tmp_path / "folder", tmp_path / "outside.txt"
    folder.mkdir()
    outside.write_text("secret")
    (folder / "real.txt").write_text("mine")
    (folder / "alias.txt").symlink_to("real.txt")
    assert confined(folder / "alias.txt", folder) == (folder / "real.txt").resolve()
    with pytest.raises(ConfigError, match=LEADS_OUT):
        confined(link_out(folder, "out.txt", outside), folder)
    with pytest.raises(ConfigError, match=r"out2\.txt leads outside"):  # a link to a link out
        confined(link_out(folder, "out2.txt", folder / "out.txt"), folder)
    with pytest.raises(ConfigError, match=r"is not a regular file \(a FIFO, device or folder\); refused"):
        confined(fifo(folder, "pipe.txt"), folder)
    with pytest.raises(ConfigError, match=r"is not a regular file"):
        confined(Path(shutil.copytree(folder, folder / "sub", ignore=lambda *a: ["pipe.txt"])), folder)
    with pytest.raises(ConfigError, match=r"dangling\.txt cannot be read"):
        confined(link_out(folder, "dangling.txt", tmp_path / "gone"), folder)
    with pytest.raises(DataError):  # the caller's error class
        confined(folder / "out.txt", folder, DataError)


def test_the_hugging_face_cache_layout_may_link_into_its_blobs(tmp_path):
    """snapshot_download's folder is REPO/snapshots/REV/, whose files link into REPO/blobs/."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc123").write_text("{}")
    snapshot = repo / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(repo / "blobs" / "abc123")
    assert read_json(snapshot / "config.json", within=snapshot) == {}
    link_out(snapshot, "vocab.txt", tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("x")
    with pytest.raises(ConfigError, match=LEADS_OUT):
        read_text(snapshot / "vocab.txt", within=snapshot)


def test_an_optional_file_that_is_a_link_out_is_refused_not_taken_for_missing(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "outside.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "f" / "absent.json", optional=True, within=tmp_path / "f") == {}
    link_out(tmp_path / "f", "there.json", tmp_path / "outside.json")
    with pytest.raises(ConfigError, match=LEADS_OUT):
        read_json(tmp_path / "f" / "there.json", optional=True, within=tmp_path / "f")


# -- every kind of file a folder from elsewhere holds --------------------------------------------------------------
def _bert(tmp_path: Path) -> Path:
    return write_bert(tmp_path / "bert", tiny_state(layers=1), num_hidden_layers=1)


def _bpe(tmp_path: Path) -> Path:
    folder = tmp_path / "bpe"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (folder / "merges.txt").write_text("#version: 0.2\na b\n")
    return folder


def _translation_vocab(tmp_path: Path) -> Path:
    (tmp_path / "mt").mkdir()
    (tmp_path / "mt" / "vocab.json").write_text("{}")
    return tmp_path / "mt"


# (what holds the file, its name, the reader that must refuse a link out in its place)
KINDS = {
    "own config.json": ("best", "config.json", lambda folder: load_pretrained(folder)),
    "own model.safetensors": ("best", "model.safetensors", lambda folder: load_pretrained(folder)),
    "own tokenizer.json": ("best", "tokenizer.json", lambda folder: load_lm_tokenizer(folder)),
    "own data.json": ("best", "data.json", lambda folder: task_specs()["lm"].saved_data(folder)),
    "own task.json (evaluate)": ("best", "task.json", lambda folder: _cli(["evaluate", "--checkpoint", str(folder)])),
    "run.json (export)": ("run", "run.json", lambda folder: read_run_assets(load_pretrained(folder / "best"))),
    "run.json (resume)": ("run", "run.json", lambda folder: _cli(["train", "lm", "--run-dir", str(folder),
                                                                   "--resume", "--no-progress"])),
    "checkpoint_last.safetensors (resume)": ("run", "checkpoint_last.safetensors", lambda folder: _cli(
        ["train", "lm", "--run-dir", str(folder), "--resume", "--no-progress"])),
    "translation vocab.json": ("mt", "vocab.json", lambda folder: VocabPair.load(folder)),
    "word vocabulary": ("mt", "vocab.json", lambda folder: WordVocab.load(folder)),
    "hf config.json": ("bert", "config.json", lambda folder: read_hf_config(folder)),
    "hf model.safetensors": ("bert", "model.safetensors", lambda folder: read_weights(folder)),
    "hf vocab.txt": ("bert", "vocab.txt", lambda folder: WordPieceTokenizer.from_pretrained(folder)),
    "hf tokenizer_config.json": ("bert", "tokenizer_config.json", lambda folder: tokenizer_kind(folder)),
    "hf special_tokens_map.json": ("bert", "special_tokens_map.json",
                                   lambda folder: WordPieceTokenizer.from_pretrained(folder)),
    "hf preprocessor_config.json": ("bert", "preprocessor_config.json",
                                    lambda folder: _pixel_normalisation(folder, {}, [])),
    "hf bpe vocab.json": ("bpe", "vocab.json", lambda folder: BPETokenizer.from_pretrained(folder)),
    "hf bpe merges.txt": ("bpe", "merges.txt", lambda folder: BPETokenizer.from_pretrained(folder)),
}


def _cli(argv: list[str]) -> None:
    """``main`` turned back into an exception, so that every kind is checked alike."""
    if main(argv) != 0:
        raise CheckpointError("the command refused it")


def _folder(kind: str, tmp_path: Path, best: Path) -> Path:
    return {"best": lambda: best, "run": lambda: best.parent, "mt": lambda: _translation_vocab(tmp_path),
            "bert": lambda: _bert(tmp_path), "bpe": lambda: _bpe(tmp_path)}[kind]()


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_file_of_every_kind_linking_out_of_its_folder_is_refused(kind, best, tmp_path, capsys):
    """The same file, valid, outside the folder: read it would be (it was, for all but weight shards)."""
    holder, name, read = KINDS[kind]
    folder = _folder(holder, tmp_path, best)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    if (folder / name).exists():
        shutil.copy(folder / name, outside)
    else:
        outside.write_text("{}")
    link_out(folder, name, outside)
    with pytest.raises((CheckpointError, DataError, ConfigError)) as caught:
        read(folder)
    message = str(caught.value) + capsys.readouterr().err
    assert re.search(rf"{re.escape(name)} leads outside .*{re.escape(name)}\); a checkpoint folder may only read "
                     "its own files: refused", message), message


@pytest.mark.parametrize("kind", ["own config.json", "own tokenizer.json", "hf vocab.txt", "hf bpe merges.txt"])
def test_a_fifo_in_place_of_a_file_is_refused_without_waiting_for_it(kind, best, tmp_path, capsys):
    holder, name, read = KINDS[kind]
    folder = _folder(holder, tmp_path, best)
    path = fifo(folder, name)
    # a reader that opened the FIFO would wait for a writer forever: this one lets such a read end (with bytes that
    # are no valid file), so that a regression fails the test instead of hanging it
    threading.Thread(target=lambda: path.open("wb").write(b"\x00"), daemon=True).start()
    with pytest.raises((CheckpointError, DataError, ConfigError), match=r"is not a regular file \(a FIFO, device "
                                                                        r"or folder\); refused"):
        read(folder)


def test_an_hf_vocabulary_linking_to_etc_passwd_is_refused_and_fine_tuning_writes_nothing(tmp_path, capsys):
    """The issue's cases: vocab.txt -> /etc/passwd was read; a link to a valid vocabulary elsewhere trained, and the
    outside file was copied into RUN/best/."""
    folder = _bert(tmp_path)
    shutil.copy(folder / "vocab.txt", tmp_path / "vocab.txt")
    link_out(folder, "vocab.txt", Path("/etc/passwd"))
    with pytest.raises(TokenizerError, match=r"vocab\.txt leads outside .* \(to /etc/passwd\)"):
        WordPieceTokenizer.from_pretrained(folder)
    link_out(folder, "vocab.txt", tmp_path / "vocab.txt")  # a valid vocabulary, elsewhere
    assert main(["train", "sst2", "--pretrained", str(folder), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    assert re.search(r"vocab\.txt leads outside", capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_export_refuses_a_run_file_linking_out_and_writes_nothing(best, tmp_path, capsys):
    outside = tmp_path / "data.json"
    shutil.copy(best / "data.json", outside)
    link_out(best, "data.json", outside)
    assert main(["export", str(best.parent), str(tmp_path / "out")]) == 2
    assert re.search(r"data\.json leads outside", capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


# -- parsing bounded -----------------------------------------------------------------------------------------------
DEEP = "[" * 5000 + "]" * 5000
DEEPISH = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)  # parses within Python's limit, deeper than any config
HUGE = "1" * 5000


@pytest.mark.slow
@pytest.mark.parametrize("text", [DEEP, DEEPISH], ids=["5000", "max+1"])
def test_documents_nested_too_deeply_are_refused_naming_the_source(text):
    with pytest.raises(ConfigError, match=rf"^x\.json: nested more than {MAX_DEPTH} levels deep"):
        parse_json(text, "x.json")
    with pytest.raises(ConfigError, match=rf"^y\.yaml: nested more than {MAX_DEPTH} levels deep"):
        load_yaml(text, "y.yaml")
    nested = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert parse_json(nested, "ok.json") is not None and load_yaml(nested, "ok.yaml") is not None


def test_integers_of_thousands_of_digits_or_beyond_64_bits_are_refused():
    for parse in (lambda t: parse_json(t, "x.json"), lambda t: load_yaml(t, "x.json")):
        with pytest.raises(ConfigError, match=r"^x\.json: an integer of more than 4,300 digits"):
            parse(f'{{"d_model": {HUGE}}}')
    with pytest.raises(ConfigError, match=r"^x\.yaml: the integer 1180591620717411303424 is outside the 64-bit "
                                          r"range every setting uses"):
        load_yaml(f"d_model: {2 ** 70}", "x.yaml")
    with pytest.raises(ConfigError, match=r"the integer of about 1,000 digits is outside the 64-bit range"):
        load_yaml(f"d_model: {'9' * 1000}", "x.yaml")
    # a tokenizer's model_max_length is int(1e30) in transformers' files: JSON beside a model may hold it
    assert parse_json(f'{{"model_max_length": {int(1e30)}}}', "tokenizer_config.json")["model_max_length"] > 2 ** 63


def test_config_files_are_bounded_like_set_values(tmp_path):
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "big.json").write_text(f'{{"d_model": {2 ** 70}}}')
    with pytest.raises(ConfigError, match=r"deep\.json: nested more than"):
        read_yaml_or_json(tmp_path / "deep.json")
    with pytest.raises(ConfigError, match=r"big\.json: the integer 1180591620717411303424 is outside"):
        read_yaml_or_json(tmp_path / "big.json")


def test_a_value_a_message_quotes_is_cut_short():
    long = "x" * 120_000
    assert shorten("short") == "short"
    cut = shorten(long)
    assert len(cut) <= 220 and "(119,840 characters left out)" in cut
    with pytest.raises(ConfigError) as caught:
        load_yaml("[" + long, "--set d_model", inline=True)
    assert len(str(caught.value)) < 500


def test_a_field_of_a_publishers_record_is_checked_and_its_value_quoted_short():
    """One reader of typed fields for the caption and VQA formats: a missing key, a record that is no object, a
    boolean taken for a number and a value of the wrong type are refused naming the record and key."""
    assert json_field({"id": 3}, "id", int, "q.json: question 1", DataError) == 3
    assert json_field({"id": "a"}, "id", (int, str), "q.json: question 1", DataError) == "a"
    for record, message in [({}, "missing field 'id'"), ("a string with id", "missing field 'id'"),
                            ({"id": True}, "field 'id' must be a int, got True"),
                            ({"id": "x" * 5000}, r"field 'id' must be a int or float, got 'xxx.*characters left out")]:
        with pytest.raises(DataError, match=r"q\.json: question 1: " + message) as caught:
            json_field(record, "id", (int, float) if "float" in message else int, "q.json: question 1", DataError)
        assert len(str(caught.value)) < 300


# -- writes that fail ------------------------------------------------------------------------------------------------
def test_a_failed_write_names_the_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    for raised in (OSError(errno.EROFS, "Read-only file system", str(target) + ".tmp"),
                   SafetensorError('Error while serializing: IoError(Os { code: 13, kind: PermissionDenied, '
                                   'message: "Permission denied" })')):
        with pytest.raises(WriteError, match=rf"^cannot write {re.escape(str(target))}: (read-only file system|"
                                             r"permission denied); choose a place you may write to") as caught:
            with atomic_path(target) as tmp:
                tmp.write_text("new")
                raise raised
        assert str(caught.value).count("\n") == 0 and caught.value.errno in (errno.EROFS, errno.EACCES)
        assert target.read_text() == "old" and not (tmp_path / "results.json.tmp").exists()
    with pytest.raises(RuntimeError, match="a bug"):  # anything else is no failure of the machine: as it was
        with atomic_path(target):
            raise RuntimeError("a bug")


def test_a_folder_is_written_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as staging:
            (staging / "config.json").write_text("{}")
            raise RuntimeError("the export failed half-way")
    assert not target.exists() and os.listdir(tmp_path) == []
    with atomic_directory(target) as staging:
        (staging / "a").write_text("1")
    assert os.listdir(target) == ["a"]
    with pytest.raises(RuntimeError):  # a failed replacement keeps the old folder as it was
        with atomic_directory(target, replace=True) as staging:
            (staging / "b").write_text("2")
            raise RuntimeError("failed")
    assert os.listdir(target) == ["a"] and sorted(os.listdir(tmp_path)) == ["out"]
    with atomic_directory(target, replace=True) as staging:
        (staging / "b").write_text("2")
    assert os.listdir(target) == ["b"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_read_text_and_read_json_name_a_file_they_cannot_read(tmp_path):
    with pytest.raises(DataError, match=r"cannot read .*absent\.json"):
        read_json(tmp_path / "absent.json", DataError)
    with pytest.raises(PretrainedError, match=r"absent\.json cannot be read"):
        read_json(tmp_path / "absent.json", PretrainedError, within=tmp_path)


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
    assert main(translation_args(corpus, run, "train.max_steps=3", "train.save_interval_steps=1")) == 2
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(str(run / LAST))}: no space left on device while writing it \([\d.]+ MiB free "
                     rf"in {re.escape(str(run))}\); the previous {LAST}, if any, is intact", err)
    assert (run / LAST).read_bytes() == saved[0] and not (run / (LAST + ".tmp")).exists()


@pytest.mark.slow
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


def test_every_yaml_read_goes_through_the_duplicate_refusing_loader():
    """No module reads YAML, JSON-as-YAML or pickles past the checked readers (issue 16: nothing from a file may
    run code, and a duplicate key may not pass silently)."""
    patterns = {r"yaml\.(safe_)?load\(": "fileio.py", r"yaml\.(unsafe_|full_)?load\(": "fileio.py",
                r"allow_pickle\s*=\s*True": None, r"pickle\.loads?\(": None, r"\.Unpickler\(": None}
    for path in (Path(__file__).resolve().parents[1] / "src").rglob("*.py"):
        text = path.read_text()
        for pattern, allowed in patterns.items():
            if re.search(pattern, text) and path.name != allowed:
                raise AssertionError(f"{path}: {pattern} outside the checked readers")


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
    allowed = {"data/idx.py", "data/corpus.py", "pretrained/export.py", "data/tokenizers/gpt2.py",
               "data/tokenizers/pretrained.py"}
    assert [o for o in offenders if o.split(":")[0] not in allowed] == []


# -- the mode of what is written -----------------------------------------------------------------------------------
def _modes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*")
            if p.is_file()}


def test_every_file_a_run_saves_or_exports_gets_the_mode_of_a_new_file(lm_run, tmp_path, capsys):
    """safetensors' writer makes its files 0600: the checkpoints and model.safetensors (of best/ and of an export)
    were 0600 where every other file was 0644."""
    usual = 0o666 & ~umask()
    saved = _modes(lm_run)
    assert {"best/model.safetensors", LAST} <= set(saved)
    assert {name: oct(mode) for name, mode in saved.items() if mode != usual} == {}
    assert main(["export", str(lm_run), str(tmp_path / "hf")]) == 0
    exported = _modes(tmp_path / "hf")
    assert "model.safetensors" in exported
    assert {name: oct(mode) for name, mode in exported.items() if mode != usual} == {}


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_the_atomic_writers_respect_the_umask_as_open_does(tmp_path, mask):
    previous = os.umask(mask)
    try:
        assert umask() == mask
        with atomic_path(tmp_path / "w.safetensors") as tmp:
            save_file({"a": torch.zeros(2)}, str(tmp))
        with atomic_directory(tmp_path / "folder") as staging:
            save_file({"a": torch.zeros(2)}, str(staging / "model.safetensors"))
            (staging / "config.json").write_text("{}")
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o666 & ~mask
    assert set(_modes(tmp_path).values()) == {0o666 & ~mask}
