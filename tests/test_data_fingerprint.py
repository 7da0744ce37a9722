"""Token folders checked against their ``meta.json`` before anything is written, a fingerprint of the data in every
run, a resume on other data refused naming the file, ``--tokenizer`` beside a token folder refused or honoured, and
a file shrunk during a run named (issue 49)."""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import TEXT, set_args
from helpers.token_files import nanogpt_folder, write_raw, write_shard
from interlayer.cli import main
from interlayer.data.fingerprint import changed_files, fingerprint
from interlayer.data.token_files import TokenSplit, open_token_corpus
from interlayer.errors import DataError
from interlayer.tasks import task_specs

TINY = set_args(["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.block_size=8", "data.eval_interval=2",
                 "train.max_tokens=32", "train.max_steps=2"])
CHARS = "".join(sorted(set(TEXT)))


def _ids(text: str) -> np.ndarray:
    return np.array([CHARS.index(c) for c in text], dtype=np.uint16)


def _char_folder(folder: Path, **meta) -> Path:
    ids = _ids(TEXT)
    return nanogpt_folder(folder, {"train": ids[:2000], "valid": ids[2000:2600], "test": ids[2600:]},
                          {"vocab_size": len(CHARS), "chars": CHARS, **meta})


def _error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines()
             if not line.startswith(("interlayer: training ", "interlayer: resuming lm in "))]
    assert len(lines) == 1 and lines[0].startswith("interlayer: error: "), lines
    return lines[0]


def _train(data: Path, run: Path, *extra: str) -> int:
    return main(["train", "lm", "--data", str(data), "--run-dir", str(run), "--no-progress", *TINY, *extra])


# -- meta.json against the files ----------------------------------------------------------------------------------
def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, **changes}))


BAD_META = {
    "vocab_size": (dict(vocab_size=10), r"meta\.json: vocab_size=10, but its tokenizer has \d+ tokens"),
    "chars_order": (dict(chars=CHARS[::-1]), r"meta\.json: chars must be distinct characters sorted by code point"),
    "tokenizer_chars": (dict(tokenizer={"kind": "char", "chars": CHARS[:-1] + "~"}),
                        r"meta\.json: chars lists \d+ characters that differ from its tokenizer's \d+ \(or their "
                        r"order\)"),
    "tokenizer_order": (dict(tokenizer={"kind": "char", "chars": CHARS[::-1]}),
                        r"meta\.json: chars must be distinct characters sorted by code point"),
    "tokens": (dict(tokens={"train": 1999}), r"meta\.json: tokens\.train=1999, but the folder's train split has 2000"),
    "files": (dict(files={"test": []}), r"meta\.json: files\.test=\[\], but the folder's test split has "
                                        r"\[\"test\.bin\"\]; files were added, removed or replaced"),
    "layout": (dict(layout="shards"), r"meta\.json: layout='shards', but the folder holds nanogpt files"),
    "dtype": (dict(dtype="uint32"), r"meta\.json: dtype='uint32'; interlayer's token files hold uint16 ids"),
}


@pytest.mark.parametrize("case", list(BAD_META))
def test_a_meta_json_that_disagrees_with_its_files_is_refused_before_anything_is_written(tmp_path, capsys, case):
    """Each field was taken as given: a wrong vocab_size stranded the run or reached the allocator, a wrong token count
    or file list said nothing, characters out of order decoded ids as other characters."""
    changes, message = BAD_META[case]
    folder = _char_folder(tmp_path / "data")
    _edit_meta(folder, **changes)
    assert _train(folder, tmp_path / "run") == 2
    assert re.search(message, _error(capsys))
    assert not (tmp_path / "run").exists()


def test_a_deleted_shard_and_an_id_beyond_the_vocabulary_are_refused_before_the_run_starts(tmp_path, capsys):
    """A shard gone from a prepared folder (meta.json lists it), and an id beyond the vocabulary deep in the
    training split, where the first batches would not read it (it was found mid-run, after run.json)."""
    ids = _ids(TEXT)
    folder = tmp_path / "shards"
    folder.mkdir()
    names = []
    for i, part in enumerate((ids[:1000], ids[1000:2000])):
        names.append(f"tokens_train_{i:06d}.bin")
        write_shard(folder / names[-1], part)
    write_shard(folder / "tokens_val_000000.bin", ids[2000:2600])
    (folder / "meta.json").write_text(json.dumps({"vocab_size": len(CHARS), "chars": CHARS,
                                                  "files": {"train": names, "valid": ["tokens_val_000000.bin"]}}))
    (folder / names[1]).unlink()
    assert _train(folder, tmp_path / "run") == 2
    assert re.search(r"meta\.json: files\.train=\[.*tokens_train_000001\.bin.*\], but the folder's train split has "
                     r"\[\"tokens_train_000000\.bin\"\]", _error(capsys))
    bad = ids[:2000].copy()
    bad[1777] = len(CHARS) + 3
    flat = nanogpt_folder(tmp_path / "flat", {"train": bad, "valid": ids[2000:2600]},
                          {"vocab_size": len(CHARS), "chars": CHARS})
    assert _train(flat, tmp_path / "run") == 2
    assert re.search(rf"train\.bin: token 1777 has id {len(CHARS) + 3}, outside the vocabulary", _error(capsys))
    assert not (tmp_path / "run").exists()


def test_a_token_file_shrunk_during_a_run_is_named(tmp_path):
    """numpy said "mmap length is greater than file size", naming no file."""
    folder = _char_folder(tmp_path / "data")
    split = open_token_corpus(folder).splits["train"]
    assert isinstance(split, TokenSplit) and split.windows([0], 8).shape == (1, 8)
    write_raw(folder / "train.bin", _ids(TEXT)[:1500])
    with pytest.raises(DataError, match=r"train\.bin: 3,000 bytes now, 4,000 when the run opened it \(2,000 tokens\); "
                                        r"the file changed during the run"):
        split.windows([0], 8)


# -- --tokenizer beside a token folder ------------------------------------------------------------------------------
def test_a_tokenizer_beside_a_token_folder_is_refused_or_honoured(tmp_path, capsys):
    """--tokenizer bpe beside character ids was ignored, and recorded in run.json; a folder of bare ids has no
    tokenizer to choose. The folder's own kind is accepted and recorded."""
    folder = _char_folder(tmp_path / "data")
    assert _train(folder, tmp_path / "run", "--tokenizer", "bpe") == 2
    assert re.search(r"--tokenizer / data\.tokenizer=bpe does not apply to the token folder .*: its ids come from "
                     r"meta\.json's char tokenizer", _error(capsys))
    ids = nanogpt_folder(tmp_path / "ids", {"train": _ids(TEXT)[:2000], "valid": _ids(TEXT)[2000:]},
                         {"vocab_size": len(CHARS)})
    assert _train(ids, tmp_path / "run", "--tokenizer", "char") == 2
    assert "its meta.json names no tokenizer" in _error(capsys)
    assert not (tmp_path / "run").exists()
    spec = task_specs()["lm"]  # the folder's own kind: honoured, and the default a run records (below)
    assert spec.defaults_for({"data.path": str(folder), "data.tokenizer": "char"}) == {"data.tokenizer": "char"}


# -- the data's fingerprint -----------------------------------------------------------------------------------------
def test_the_fingerprint_is_the_contents_not_the_place(tmp_path):
    """Sizes and SHA-256 by role: a copy elsewhere is the same data; one byte changed is named."""
    a = _char_folder(tmp_path / "a")
    b = Path(shutil.copytree(a, tmp_path / "b"))
    roles = lambda folder: open_token_corpus(folder).files()  # noqa: E731
    first = fingerprint(roles(a))
    assert first["sha256"] == fingerprint(roles(b))["sha256"] and set(first["files"]) == {
        "train.bin", "val.bin", "test.bin", "meta.json"}
    ids = _ids(TEXT)
    ids[5] = (ids[5] + 1) % len(CHARS)
    write_raw(b / "train.bin", ids[:2000])
    changed = changed_files(first, fingerprint(roles(b), known=first))
    assert len(changed) == 1 and re.match(r"train\.bin: 4,000 bytes \(sha256 [0-9a-f]{12}\) when the run started, "
                                          r"4,000 bytes \(sha256 [0-9a-f]{12}\) now", changed[0])


def test_a_resume_on_other_data_is_refused_naming_the_file_unless_allowed(tmp_path, capsys):
    """The folder replaced by another corpus continued silently. Moved (same bytes): the resume goes on; replaced:
    refused naming the file, nothing written; --allow-data-change: goes on, says so and records the new data."""
    folder, run = _char_folder(tmp_path / "data"), tmp_path / "run"
    assert _train(folder, run) == 0
    assert json.loads((run / "run.json").read_text())["data"]["tokenizer"] == "char"  # what the folder holds
    record = json.loads((run / "run.json").read_text())["data_fingerprint"]
    assert set(record["files"]) == {"train.bin", "val.bin", "test.bin", "meta.json"}
    (run / "results.json").unlink()  # as if stopped: resumable for more steps
    moved = Path(shutil.copytree(folder, tmp_path / "moved"))
    shutil.rmtree(folder)
    more = ["--resume", "--set", "train.max_steps=3"]
    assert _train(moved, run, *more) == 0  # the same bytes elsewhere: the same data
    assert json.loads((run / "run.json").read_text())["data"]["path"] == str(moved)
    (run / "results.json").unlink()
    text = TEXT.replace("e", "a")
    write_raw(moved / "train.bin", np.array([CHARS.index(c) for c in text[:2000]], dtype=np.uint16))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert _train(moved, run, "--resume", "--set", "train.max_steps=4") == 2
    message = _error(capsys)
    assert re.search(r"--resume continues .*run on the data it started with .*but the data differs: train\.bin: 4,000 "
                     r"bytes \(sha256 [0-9a-f]{12}\) when the run started, 4,000 bytes \(sha256 [0-9a-f]{12}\) now\. "
                     r".*--allow-data-change", message)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert _train(moved, run, "--resume", "--set", "train.max_steps=4", "--allow-data-change") == 0
    assert "resuming" in capsys.readouterr().err
    assert json.loads((run / "run.json").read_text())["data_fingerprint"]["files"]["train.bin"]["sha256"] != \
        record["files"]["train.bin"]["sha256"]


def test_a_text_corpus_is_fingerprinted_by_its_contents_too(tmp_path):
    """One file: its role is the text, whatever its name; a folder's documents: their names inside it."""
    from interlayer.tasks.language_modeling import LanguageModelingTask, LMData
    from interlayer.training.config import TrainConfig

    (tmp_path / "book.txt").write_text(TEXT)
    (tmp_path / "docs").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "docs" / name).write_text(TEXT)
    files = lambda path: LanguageModelingTask(LMData(path=str(path), block_size=8),  # noqa: E731
                                              TrainConfig(max_tokens=32)).data_files()
    record = fingerprint(files(tmp_path / "book.txt"))
    assert list(record["files"]) == ["text"] and record["files"]["text"]["bytes"] == len(TEXT.encode())
    assert sorted(fingerprint(files(tmp_path / "docs"))["files"]) == ["a.txt", "b.txt"]


@pytest.mark.parametrize("task", ["cora", "sst2", "fashion_mnist", "mrpc"])
def test_every_task_reading_files_names_them_for_the_fingerprint(task):
    """Each task's files by role, all of them existing files (translation's six are named the same way; VQA's
    Sort-of-CLEVR is generated from the seeds run.json holds)."""
    from interlayer.training.config import TrainConfig

    spec = task_specs()[task]
    files = spec.make_task(spec.data_class(), TrainConfig(), None).data_files()
    assert files and all(Path(path).is_file() for _, path in files)
    assert len({role for role, _ in files}) == len(files)
