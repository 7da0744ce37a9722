"""Pre-tokenized corpora for `train lm`: nanoGPT's train.bin/val.bin and llm.c's shards, written here by the formats'
definitions; read through memory maps (never whole), batched exactly as the text path batches, lazily per rank,
checked (header, magic, version, size, ids) with a one-line error naming the file."""
import json
import os
import re
import socket
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from helpers import TEXT, set_args
from helpers.token_files import nanogpt_folder, write_raw, write_shard
from interlayer.cli import main
from interlayer.data.token_files import TokenSplit, open_token_corpus, read_shard
from interlayer.data.tokenizers.language_model import IdTokenizer
from interlayer.errors import ConfigError, DataError
from interlayer.tasks.language_modeling import Batches, LanguageModelingTask, LMData
from interlayer.training.config import TrainConfig

TINY = set_args(["d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=2", "data.block_size=16", "data.eval_interval=3",
                 "train.max_steps=6", "train.max_tokens=64", "train.warmup_steps=2"])


def task_of(path, **data) -> LanguageModelingTask:
    data = {"block_size": 16, "eval_interval": 3, **data}
    return LanguageModelingTask(LMData(path=str(path), **data), TrainConfig(max_tokens=64))


@pytest.fixture
def text_task(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(TEXT)
    return task_of(path, valid_fraction=0.2, test_fraction=0.1)


@pytest.fixture
def char_folder(tmp_path, text_task):
    """The text task's character ids as nanoGPT files, its characters in meta.json."""
    return nanogpt_folder(tmp_path / "chars", {k: v.numpy() for k, v in text_task.ids.items()},
                          {"vocab_size": len(text_task.tokenizer), "chars": "".join(text_task.tokenizer.chars)})


def test_a_nanogpt_folder_trains_on_exactly_the_text_paths_ids_and_batches(text_task, char_folder):
    task = task_of(char_folder)
    assert task.tokenizer.chars == text_task.tokenizer.chars and len(task.tokenizer) == len(text_task.tokenizer)
    for split in ("train", "valid", "test"):
        assert isinstance(task.ids[split], TokenSplit) and len(task.ids[split]) == len(text_task.ids[split])
        assert torch.equal(task.ids[split][:], text_task.ids[split])
    for epoch, seed in ((1, 1), (2, 7)):
        ours, theirs = task.train_batches(epoch, seed), text_task.train_batches(epoch, seed)
        assert len(ours) == len(theirs) == 3 and all(torch.equal(a, b) for a, b in zip(ours, theirs))
    model = torch.nn.Sequential()  # scores: the same tokens, the same bits per character
    model.forward = lambda tokens: type("Out", (), {"logits": torch.zeros(*tokens.shape, len(task.tokenizer))})()
    model.register_parameter("anchor", torch.nn.Parameter(torch.zeros(())))
    assert task.score(model, "valid") == text_task.score(model, "valid")
    assert "nanoGPT .bin files: train train.bin" in task.corpus_description


def test_cli_trains_on_a_nanogpt_folder_and_an_llmc_shard_pair(char_folder, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(char_folder), "--run-dir", str(run), "--no-progress", *TINY]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 6 and "test_bits_per_char" in results  # meta.json's chars: a character model
    assert (run / "sample.txt").read_text().startswith(TEXT[int(len(TEXT) * 0.7):][:16])
    # llm.c shards, ids only (no meta.json): the vocabulary from data.vocab_size, no bits, a sample of ids
    shards = tmp_path / "shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    write_shard(shards / "corpus_train_000000.bin", rng.integers(0, 50, 300))
    write_shard(shards / "corpus_train_000001.bin", rng.integers(0, 50, 200))
    write_shard(shards / "corpus_val_000000.bin", rng.integers(0, 50, 80))
    run = tmp_path / "run2"
    assert main(["train", "lm", "--data", str(shards), "--run-dir", str(run), "--no-progress", *TINY,
                 "--set", "data.vocab_size=50"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 6 and "valid_loss" in results and "test_loss" not in results  # no test split
    assert not any(key.startswith("valid_bits") for key in results)
    assert (run / "sample.txt").read_text().startswith("<")
    assert json.loads((run / "tokenizer.json").read_text()) == {"kind": "ids", "vocab_size": 50}
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(run / "best"), "--prompt", "hello"]) == 2
    assert "trained on token ids without a tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("damage, message", [
    (lambda d: write_shard(d / "c_val_000000.bin", range(40), count=41), r"c_val_000000.bin: the header announces "
                                                                         r"41 tokens \(1106 bytes"),
    (lambda d: write_shard(d / "c_val_000000.bin", range(40), magic=20240801), r"c_val_000000.bin: magic number "
                                                                               r"20240801, not llm.c's 20240520"),
    (lambda d: write_shard(d / "c_val_000000.bin", range(40), version=2), r"c_val_000000.bin: shard version 2"),
    (lambda d: (d / "c_val_000000.bin").write_bytes(b"\0" * 100), r"c_val_000000.bin: 100 bytes, shorter than "
                                                                  r"the 1024-byte header"),
])
def test_a_wrong_or_truncated_shard_is_exit_2_naming_the_file(tmp_path, capsys, damage, message):
    write_shard(tmp_path / "c_train_000000.bin", range(40))
    damage(tmp_path)
    assert main(["train", "lm", "--data", str(tmp_path), "--run-dir", str(tmp_path / "run"), "--no-progress",
                 *TINY, "--set", "data.vocab_size=64"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]  # after the "training lm in ..." line: one line, the file
    assert error.startswith("interlayer: error: ") and re.search(message, error), error
    assert not (tmp_path / "run").exists()


def test_truncated_raw_files_missing_splits_and_the_vocabulary_are_refused(tmp_path, capsys):
    folder = nanogpt_folder(tmp_path / "n", {"train": range(40), "valid": range(20)})
    with (folder / "val.bin").open("ab") as handle:
        handle.write(b"\x07")  # half a token: cut mid-write
    assert main(["train", "lm", "--data", str(folder), "--no-progress", *TINY, "--set", "data.vocab_size=64"]) == 2
    assert f"{folder / 'val.bin'}: 41 bytes is not a whole number of uint16 token ids" in capsys.readouterr().err
    (folder / "val.bin").unlink()
    with pytest.raises(DataError, match=r"has training tokens but no val.bin"):
        task_of(folder, vocab_size=64)
    write_raw(folder / "val.bin", range(20))
    with pytest.raises(DataError, match=r"vocabulary size of these token ids is unknown; give it with --set "
                                        r"data.vocab_size=N"):
        task_of(folder)
    (folder / "meta.pkl").write_bytes(b"\x80\x04K\x01.")  # a pickle of 1: plain data, not nanoGPT's dict
    with pytest.raises(DataError, match=r"meta.pkl: a pickled int, not nanoGPT's dict of vocab_size, itos and stoi"):
        task_of(folder)
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 64}))  # meta.json wins: the pickle stays unread
    assert len(task_of(folder).tokenizer) == 64
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 40}))
    with pytest.raises(ConfigError, match=r"data.vocab_size=64 disagrees with .*meta.json's vocab_size=40"):
        task_of(folder, vocab_size=64)
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 70000}))
    with pytest.raises(DataError, match=r"vocab_size=70000 must be an integer from 1 to 65536"):
        task_of(folder)
    (folder / "meta.json").write_text(json.dumps({"chars": "ba"}))
    with pytest.raises(DataError, match=r"chars must be distinct characters sorted by code point"):
        task_of(folder)


def test_an_id_outside_the_vocabulary_is_named_with_its_file_and_position(tmp_path):
    folder = nanogpt_folder(tmp_path / "n", {"train": [1, 2, 3] * 20 + [9] + [1] * 30, "valid": range(5)})
    task = task_of(folder, vocab_size=9, block_size=8)
    with pytest.raises(DataError, match=r"train.bin: token 60 has id 9, outside the vocabulary of 9"):
        task.ids["train"].windows([55], 8)
    assert task.ids["train"].windows([0], 8).tolist() == [[1, 2, 3, 1, 2, 3, 1, 2]]


def test_rows_across_shards_read_as_one_sequence(tmp_path):
    parts = [np.arange(0, 7), np.arange(7, 10), np.arange(10, 25)]
    for i, part in enumerate(parts):
        write_shard(tmp_path / f"x_train_{i:06d}.bin", part)
    write_shard(tmp_path / "x_val_000000.bin", range(4))
    split = open_token_corpus(tmp_path).splits["train"]
    assert len(split) == 25 and [f.tokens for f in split.files] == [7, 3, 15]
    rows = split.windows([0, 5, 6, 9, 17], 8)  # inside, across one boundary, across two, inside the last
    assert rows.tolist() == [list(range(s, s + 8)) for s in (0, 5, 6, 9, 17)] and rows.dtype == torch.long
    assert split[3:12].tolist() == list(range(3, 12))
    with pytest.raises(IndexError, match="leave the split's 25 tokens"):
        split.windows([18], 8)


def test_a_large_file_is_memory_mapped_not_loaded(tmp_path):
    """A 400 MB shard (sparse on disk): building the task and drawing a batch allocates a few MB at most."""
    tokens = 200_000_000
    path = tmp_path / "big_train_000000.bin"
    write_shard(path, [], count=tokens)
    with path.open("r+b") as handle:
        handle.truncate(1024 + 2 * tokens)
    write_shard(tmp_path / "big_val_000000.bin", range(64))
    assert read_shard(path).tokens == tokens
    tracemalloc.start()
    try:
        task = task_of(tmp_path, vocab_size=8, block_size=64)
        batch = task.train_batches(1, 1)[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert batch.shape == (1, 65) and int(batch.max()) == 0
    assert peak < 20 * 2 ** 20, f"{peak / 2 ** 20:.0f} MiB allocated for a {tokens:,}-token file"


def test_batches_are_read_lazily_so_each_rank_reads_its_own(char_folder, monkeypatch):
    task = task_of(char_folder)
    reads = []
    original = TokenSplit.windows
    monkeypatch.setattr(TokenSplit, "windows", lambda self, starts, length: reads.append(len(starts)) or
                        original(self, starts, length))
    monkeypatch.setenv("WORLD_SIZE", "2")
    epoch = task.train_batches(1, 1)
    assert isinstance(epoch, Batches) and len(epoch) == 2 * 3 and reads == []  # offsets only
    rank1 = [epoch[i + 1:i + 2] for i in range(0, len(epoch), 2)]  # the engine's split for rank 1 of 2
    assert reads == [] and all(isinstance(step, Batches) for step in rank1)
    assert [batch.shape for step in rank1 for batch in step] == [(4, 17)] * 3 and reads == [4, 4, 4]
    monkeypatch.delenv("WORLD_SIZE")
    single = task_of(char_folder, eval_interval=6).train_batches(1, 1)  # one process, the same offsets
    assert all(torch.equal(a, b) for a, b in zip(single, epoch))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, world: int, port: int, folder: str, run_dir: str, update_freq: int) -> None:
    from interlayer.experiment import train
    from interlayer.tasks import task_specs
    from interlayer.training import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    sets = {"d_model": "32", "n_heads": "4", "d_ffn": "64", "enc_layers": "2", "dropout": "0.0", "data.path": folder,
            "data.block_size": "16", "data.eval_interval": "2", "train.max_steps": "2", "train.max_tokens": "64",
            "train.update_freq": str(update_freq), "train.device": "cpu", "train.precision": "fp32",
            "data.vocab_size": "50"}
    try:
        train(task_specs()["lm"], sets=sets, seed=2, run_dir=Path(run_dir), progress=False)
    finally:  # as the CLI does: left to the interpreter's exit, gloo's teardown can abort a rank (SIGABRT)
        distributed.leave()


@pytest.mark.slow
def test_two_ranks_on_token_shards_equal_one_process_with_the_same_global_batch(tmp_path):
    rng = np.random.default_rng(1)
    write_shard(tmp_path / "d_train_000000.bin", rng.integers(0, 50, 400))
    write_shard(tmp_path / "d_val_000000.bin", rng.integers(0, 50, 60))
    mp.spawn(_rank, args=(2, _free_port(), str(tmp_path), str(tmp_path / "ddp"), 1), nprocs=2, join=True)
    _rank(0, 1, _free_port(), str(tmp_path), str(tmp_path / "one"), 2)
    ddp, one = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("ddp", "one"))
    assert ddp["valid_loss"] == pytest.approx(one["valid_loss"], rel=1e-5)
    assert IdTokenizer(50).decode([3, 4]) == "<3><4>"
