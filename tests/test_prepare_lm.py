"""`interlayer prepare lm`: text -> token files that hold exactly the ids `train lm` makes of the text (characters,
a trained BPE, a GPT-2 tokenizer), byte-identical whatever the workers and chunks, written atomically."""
import json
import re

import pytest
import torch

from helpers import TEXT, set_args
from interlayer.cli import main
from interlayer.data import prepare_lm
from interlayer.data.corpus import load_corpus
from interlayer.data.prepare_lm import PrepareSettings, chunks, prepare
from interlayer.data.token_files import open_token_corpus, read_shard
from interlayer.errors import ConfigError, DataError
from interlayer.tasks.language_modeling import LanguageModelingTask, LMData, tokenizer_of
from interlayer.training.config import TrainConfig

# documents with blank-line runs, trailing spaces before newlines and non-ASCII text: the places chunking could cut
DOCUMENTS = {f"doc{i}.txt": "".join(f"Para {i}.{j}: café — naïve  \n\n  indented {i * j}\nend {j}.\n"
                                    for j in range(12)) for i in range(5)}


def task_of(path, **data) -> LanguageModelingTask:
    return LanguageModelingTask(LMData(path=str(path), block_size=16, eval_interval=3, **data),
                                TrainConfig(max_tokens=64))


@pytest.fixture
def documents(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in DOCUMENTS.items():
        (folder / name).write_text(text)
    return folder


def _files(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.slow
def test_the_same_text_gives_the_same_bytes_whatever_the_workers_and_chunks(documents, tmp_path):
    outputs = []
    for index, (workers, chunk) in enumerate(((2, 300), (1, 700), (1, 1 << 20))):
        out = tmp_path / f"out{index}"
        prepare(PrepareSettings(str(documents), out, tokenizer="bpe", vocab_size=300, workers=workers,
                                chunk_chars=chunk, progress=False))
        outputs.append(_files(out))
    assert outputs[0] == outputs[1] == outputs[2]
    assert set(outputs[0]) == {"meta.json", "train.bin", "val.bin", "test.bin"}
    assert not list(tmp_path.glob(".out*"))  # no temporary folder left


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_prepared_ids_are_the_ids_train_lm_makes_of_the_text(documents, tmp_path, kind):
    out = tmp_path / "out"
    meta = prepare(PrepareSettings(str(documents), out, tokenizer=kind, vocab_size=300, chunk_chars=257,
                                   progress=False))
    text_task, token_task = task_of(documents, tokenizer=kind, vocab_size=300), task_of(out)
    assert token_task.tokenizer.to_json() == text_task.tokenizer.to_json() == meta["tokenizer"]
    for split in ("train", "valid", "test"):
        assert torch.equal(token_task.ids[split][:], text_task.ids[split])
        assert meta["tokens"][split] == len(text_task.ids[split])
    corpus = load_corpus(str(documents))
    assert meta["characters"] == {split: len(corpus.split(split)) for split in ("train", "valid", "test")}
    assert meta["corpus"] == "docs (5 documents) (split by characters: 0.9 / 0.05 / 0.05)"


def test_split_files_and_shards(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.txt").write_text(TEXT)
    (source / "valid.txt").write_text(TEXT[:300])
    out = tmp_path / "shards"
    meta = prepare(PrepareSettings(str(source), out, layout="shards", shard_tokens=1000, chunk_chars=100,
                                   progress=False))
    assert meta["files"] == {"train": [f"tokens_train_00000{i}.bin" for i in range(4)],
                             "valid": ["tokens_val_000000.bin"], "test": []}
    assert [read_shard(out / name).tokens for name in meta["files"]["train"]] == [1000, 1000, 1000, len(TEXT) - 3000]
    corpus = open_token_corpus(out)
    text_task = task_of(source)
    assert torch.equal(corpus.splits["train"][:], text_task.ids["train"]) and len(corpus.splits["test"]) == 0
    assert torch.equal(corpus.splits["valid"][:], text_task.ids["valid"])


def test_chunks_cut_only_where_the_tokenizer_cuts():
    pieces = [("train", "ab \ncd"), ("train", "e\n\nfgh\n"), ("valid", "xy\nz")]
    assert list(chunks(iter(pieces), 3, cut_anywhere=True)) == [
        ("train", "ab "), ("train", "\ncd"), ("train", "e\n\n"), ("train", "fgh"), ("train", "\n"), ("valid", "xy\n"),
        ("valid", "z")]
    # byte-level BPE: only between a non-space and a newline (never after "ab "), and never across splits
    assert list(chunks(iter(pieces), 3, cut_anywhere=False)) == [
        ("train", "ab \ncde"), ("train", "\n\nfgh"), ("train", "\n"), ("valid", "xy"), ("valid", "\nz")]


def test_cli_prepares_shards_that_train_lm_trains_on(documents, tmp_path, capsys):
    out = tmp_path / "tokens"
    assert main(["prepare", "lm", str(documents), "--output", str(out), "--tokenizer", "bpe", "--vocab-size", "300",
                 "--format", "shards", "--workers", "1", "--no-progress"]) == 0
    assert "train with: interlayer train lm --data" in capsys.readouterr().out
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(out), "--run-dir", str(run), "--no-progress",
                 *set_args(["d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=2", "data.block_size=16",
                            "data.eval_interval=3", "train.max_steps=3", "train.max_tokens=64"])]) == 0
    results = json.loads((run / "results.json").read_text())
    assert "test_bits_per_byte" in results and results["steps"] == 3
    assert main(["prepare", "lm", str(documents), "--output", str(out), "--no-progress"]) == 2  # never overwrites
    assert "already exists and is not an empty folder; prepare never overwrites" in capsys.readouterr().err


def test_an_interrupted_prepare_leaves_nothing(documents, tmp_path, monkeypatch):
    writes = []

    def failing(self, ids):
        writes.append(len(ids))
        if len(writes) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(prepare_lm._SplitWriter, "write", failing)
    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareSettings(str(documents), tmp_path / "out", chunk_chars=100, progress=False))
    assert list(tmp_path.iterdir()) == [documents]


def test_a_gpt2_tokenizer_folder_gives_transformers_ids(tmp_path):
    from helpers.hf_gpt2 import write_tokenizer

    reference = write_tokenizer(tmp_path / "gpt2")
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.txt").write_text(TEXT)
    (source / "valid.txt").write_text("To be, or not to be: that is the question.\n")
    out = tmp_path / "out"
    prepare(PrepareSettings(str(source), out, tokenizer=tokenizer_of(tmp_path / "gpt2"), chunk_chars=200,
                            progress=False))
    corpus = open_token_corpus(out)
    for split, file in (("train", "train.txt"), ("valid", "valid.txt")):
        expected = reference((source / file).read_text())["input_ids"]
        assert corpus.splits[split][:].tolist() == expected
    assert len(task_of(out).tokenizer) == len(reference)


def test_a_tokenizer_with_another_pre_tokenizer_is_refused(tmp_path):
    folder = tmp_path / "llama3"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({
        "normalizer": None, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel",
                                                                                     "use_regex": False}]}}))
    with pytest.raises(DataError, match=r"tokenizer.json: its pre-tokenizer .* is not GPT-2's byte-level one"):
        tokenizer_of(folder)


def test_a_vocabulary_beyond_uint16_is_refused(tmp_path):
    path = tmp_path / "wide.txt"
    path.write_text("".join(chr(0x20000 + i) for i in range(66_000)) + "\n")
    with pytest.raises(ConfigError, match=r"the tokenizer has 66001 tokens; token files hold uint16 ids"):
        prepare(PrepareSettings(str(path), tmp_path / "out", progress=False))
    assert not (tmp_path / "out").exists()


# -- signals, a full disk, and what one command may start (issue 49) ----------------------------------------------
@pytest.mark.slow
def test_sigterm_stops_prepare_with_one_line_and_leaves_nothing(documents, tmp_path):
    """SIGTERM killed the process where it stood: its temporary folder and a partial train.bin stayed, its workers ran
    on as orphans, and with them the shell's Ctrl-C printed a traceback per worker. Now: one line, exit code 143, no
    folder, no worker left."""
    import os
    import subprocess
    import sys
    import time

    from helpers import SRC

    pids = tmp_path / "workers.txt"
    code = f"""
import os, signal, sys
from interlayer.data import prepare_lm
original = prepare_lm._Encoder.encode
def encode(self, texts):
    for index, item in enumerate(original(self, texts)):
        if index == 1:  # the pool is working: record its workers, then stop as a scheduler would
            open({str(pids)!r}, "w").write(" ".join(str(p.pid) for p in self.pool._pool))
            os.kill(os.getpid(), signal.SIGTERM)
        yield item
prepare_lm._Encoder.encode = encode
from interlayer.cli import main
sys.exit(main(["prepare", "lm", {str(documents)!r}, "--output", {str(tmp_path / "out")!r}, "--workers", "2",
               "--no-progress"]))
"""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 143, done.stderr
    assert done.stderr == "interlayer: stopped by SIGTERM\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "workers.txt"]
    workers = [int(pid) for pid in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its parent has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("file", ["train.bin", "tokens_val_000000.bin", "meta.json"])
def test_a_full_disk_names_the_file_of_the_output_and_leaves_nothing(documents, tmp_path, monkeypatch, capsys, file):
    """A fake ENOSPC: the message named the temporary folder (or no file at all: 'cannot write a file'); it names
    the output's file, and the free space, and nothing is left."""
    import errno

    from interlayer.data import token_files

    def full(name):
        def write(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write

    if file == "meta.json":  # written atomically (test_fileio.py: no run file is written in place)
        original = prepare_lm.write_atomic
        monkeypatch.setattr(prepare_lm, "write_atomic", lambda path, *a, **k: full(path.name)() if
                            path.name == "meta.json" else original(path, *a, **k))
    else:
        opened = token_files.TokenWriter.__init__

        def init(self, path, layout):
            opened(self, path, layout)
            if path.name == file:
                self.handle = type("Full", (), {"write": full(path.name), "close": self.handle.close,
                                                "flush": self.handle.flush, "fileno": self.handle.fileno,
                                                "seek": self.handle.seek})()
        monkeypatch.setattr(token_files.TokenWriter, "__init__", init)
    out = tmp_path / "out"
    layout = ["--format", "shards"] if file.startswith("tokens_") else []
    assert main(["prepare", "lm", str(documents), "--output", str(out), "--workers", "1", "--no-progress",
                 *layout]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"interlayer: error: {re.escape(str(out / file))}: no space left on device while writing "
                        rf"it \([\d.]+ MiB free in {re.escape(str(tmp_path))}\); nothing was written \(the partial "
                        r"folder is removed\): free some space and run prepare again\n", err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]


@pytest.mark.parametrize("args, message", [
    (["--workers", "100000"], r"--workers=100000 must be 1\.\.\d+, this machine's CPU cores"),
    (["--workers", "0"], r"--workers=0 must be 1\.\.\d+"),
    (["--format", "shards", "--shard-tokens", "1"], r"--shard-tokens=1 would write up to [\d,]+ shard files for "
                                                    r"[\d,]+ characters, more than 10,000; give --shard-tokens \d+ "
                                                    r"or more"),
])
def test_what_one_prepare_may_start_is_bounded(documents, tmp_path, capsys, args, message):
    """--workers had no upper bound (a typo started 100,000 processes); --shard-tokens 1 asked for a file per token."""
    (documents / "more.txt").write_text(TEXT * 4)  # 14,000 characters: as many one-token shards
    assert main(["prepare", "lm", str(documents), "--output", str(tmp_path / "out"), "--no-progress", *args]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]
