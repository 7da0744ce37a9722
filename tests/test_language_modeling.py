"""The language-modelling task: reading corpora strictly, the tokenizers, batches, honest bits per char/byte, the
bundled Shakespeare split by play, and the command line (train lm, generate, evaluate)."""
import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from interlayer.cli import main
from interlayer.data.corpus import SHAKESPEARE_SPLITS, build_shakespeare, load_corpus, strip_gutenberg
from interlayer.data.text import DataError
from interlayer.data.tokenizers.language_model import ByteBPETokenizer, CharTokenizer, train_tokenizer
from interlayer.errors import ConfigError
from interlayer.tasks.language_modeling import LanguageModelingTask, LMData, blocks
from interlayer.training.config import TrainConfig

TEXT = "".join(f"Line {i}: to be, or not to be; café naïve ünïcödé {i * 7}.\n" for i in range(60))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def make_task(path, **data) -> LanguageModelingTask:
    data = {"block_size": 16, "eval_interval": 3, **data}
    return LanguageModelingTask(LMData(path=str(path), **data), TrainConfig(max_tokens=64))


# -- reading and splitting --------------------------------------------------------------------------------------
def test_a_file_is_split_by_characters_in_order(text_file):
    corpus = load_corpus(str(text_file), valid_fraction=0.1, test_fraction=0.2)
    assert corpus.train + corpus.valid + corpus.test == TEXT
    assert len(corpus.valid) == pytest.approx(0.1 * len(TEXT), abs=1)
    assert len(corpus.test) == pytest.approx(0.2 * len(TEXT), abs=1)


def test_a_folder_of_documents_is_joined_in_path_order(tmp_path):
    (tmp_path / "b.txt").write_text("second\n")
    sub = tmp_path / "a"
    sub.mkdir()
    (sub / "one.txt.gz").write_bytes(gzip.compress("first\n".encode()))
    (tmp_path / "notes.md").write_text("ignored")
    corpus = load_corpus(str(tmp_path), valid_fraction=0.25, test_fraction=0.0)
    assert corpus.train + corpus.valid == "first\n\nsecond\n"


def test_a_folder_with_split_files_uses_them(tmp_path):
    (tmp_path / "train.txt").write_text("abc abc\n")
    (tmp_path / "valid.txt.gz").write_bytes(gzip.compress(b"cab\n"))
    corpus = load_corpus(str(tmp_path))
    assert (corpus.train, corpus.valid, corpus.test) == ("abc abc\n", "cab\n", "")


@pytest.mark.parametrize("setup, message", [
    (lambda d: d / "missing.txt", "no such file or folder"),
    (lambda d: (d / "empty.txt").write_text("\n\n  ") and d / "empty.txt", "no text"),
    (lambda d: (d / "bad.txt").write_bytes("héllo".encode() + b"\xff\xfe rest") and d / "bad.txt",
     r"bad.txt: not valid UTF-8 at byte offset 6"),
    (lambda d: (d / "x").mkdir() or d / "x", "no .txt or .txt.gz files"),
    (lambda d: (d / "train.txt").write_text("abc") and d, "no valid.txt"),
])
def test_bad_corpora_raise_a_specific_data_error(tmp_path, setup, message):
    with pytest.raises(DataError, match=message):
        load_corpus(str(setup(tmp_path)))


def test_block_size_longer_than_the_training_text_is_refused(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("a tiny text, far too short\n")
    with pytest.raises(DataError, match=r"fewer than data.block_size \+ 1 = 65"):
        make_task(path, block_size=64, valid_fraction=0.2, test_fraction=0.0)


def test_gutenberg_wrappers_are_cut_off_unless_switched_off(tmp_path):
    body = "THE TRAGEDY\n\nACT I.\nWho's there?\n"
    wrapped = ("The Project Gutenberg eBook of X\nlicence text\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n"
               + body + "\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nmore licence\n")
    assert strip_gutenberg(wrapped) == body
    old = "header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n" + body + \
          "End of Project Gutenberg Etext of X\n"
    assert strip_gutenberg(old) == body
    assert strip_gutenberg(body) == body
    path = tmp_path / "book.txt"
    path.write_text(wrapped)
    assert load_corpus(str(path), valid_fraction=0.5, test_fraction=0.0).train.startswith("THE TRAGEDY")
    assert load_corpus(str(path), valid_fraction=0.5, test_fraction=0.0,
                       gutenberg=False).train.startswith("The Project Gutenberg")


# -- the bundled corpus -----------------------------------------------------------------------------------------
def test_bundled_shakespeare_is_split_by_play():
    corpus = load_corpus("bundled:shakespeare")
    assert corpus.valid.startswith("JULIUS CAESAR") and "TWELFTH NIGHT" in corpus.valid
    assert "MACBETH" in corpus.test and "MACBETH" not in corpus.train and "TWELFTH NIGHT" not in corpus.train
    assert "HAMLET, PRINCE OF DENMARK" in corpus.train and "THE SONNETS" in corpus.train
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (4_349_015, 361_390, 346_873)
    assert "gutenberg" not in (corpus.train + corpus.valid + corpus.test).lower()


SHARED = Path("/work/shared/data/shakespeare")


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared data folder is not on this machine")
def test_bundled_shakespeare_rebuilds_from_the_shared_folder(tmp_path):
    titles = build_shakespeare(SHARED, tmp_path)
    assert len(titles["train"]) == 36 and len(titles["valid"]) == len(titles["test"]) == 3
    bundled = Path(__file__).parents[1] / "src/interlayer/data/bundled/shakespeare"
    for split in ("train", "valid", "test"):
        assert gzip.decompress((tmp_path / f"{split}.txt.gz").read_bytes()) == \
            gzip.decompress((bundled / f"{split}.txt.gz").read_bytes())
    assert set(SHAKESPEARE_SPLITS) == {"valid", "test"}


# -- tokenizers ---------------------------------------------------------------------------------------------------
def test_char_tokenizer_round_trips_and_names_unknown_characters():
    tok = CharTokenizer.train([TEXT])
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.encode_tensor(TEXT).tolist() == [tok.chars.index(c) for c in TEXT]
    with pytest.raises(DataError, match=r"character 'Z' \(at position 2\)"):
        tok.encode("ooZ")


def test_byte_bpe_is_lossless_and_spells_the_bytes():
    tok = ByteBPETokenizer.train(TEXT.splitlines(keepends=True), 300)
    text = TEXT + "Ωmega — 漢字 unseen\n\n  spaces\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids == tok.tokenizer.encode(text).ids  # the parallel chunks tokenize as the whole text
    assert int(tok.byte_lengths()[ids].sum()) == len(text.encode("utf-8"))
    assert len(ids) < len(text.encode("utf-8"))  # merges were learnt


def test_bpe_is_trained_on_the_training_split_only(text_file):
    tok = train_tokenizer("bpe", "aaaa bbbb aaaa bbbb\n" * 20, ["zzzz\n" * 50], 260)
    assert tok.tokenizer.token_to_id("zz") is None and tok.tokenizer.token_to_id("aa") is not None


# -- batches and scores -------------------------------------------------------------------------------------------
def test_batches_depend_on_seed_and_epoch_only(text_file):
    task = make_task(text_file)
    a, b = task.train_batches(2, 7), task.train_batches(2, 7)
    assert len(a) == 3 and a[0].shape == (64 // 16, 17)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], task.train_batches(3, 7)[0])
    assert not torch.equal(a[0], task.train_batches(2, 8)[0])
    train = task.ids["train"]
    row = a[1][2]
    start = next(s for s in range(len(train) - 16) if torch.equal(train[s:s + 17], row))
    assert start >= 0  # every row is a contiguous span of the training text


def test_update_freq_gives_each_step_its_micro_batches(text_file):
    task = LanguageModelingTask(LMData(path=str(text_file), block_size=16, eval_interval=3),
                                TrainConfig(max_tokens=64, update_freq=2))
    assert len(task.train_batches(1, 1)) == 6


def test_an_epoch_too_large_to_draw_is_refused_before_any_allocation(text_file, tmp_path, capsys):
    task = LanguageModelingTask(LMData(path=str(text_file), block_size=16, eval_interval=250),
                                TrainConfig(max_tokens=64, update_freq=1_000_000))
    with pytest.raises(ConfigError, match=r"train.update_freq=1000000 .* lower train.update_freq or "
                                          r"data.eval_interval"):
        task.train_batches(1, 1)
    run_dir = tmp_path / "run"
    code = main(["train", "lm", "--data", str(text_file), "--set", "train.update_freq=1000000", "--set",
                 "data.block_size=16", "--run-dir", str(run_dir), "--no-progress"])
    assert code == 2 and not run_dir.exists()
    assert "draws" in capsys.readouterr().err


def test_blocks_predict_every_token_but_the_first_once():
    ids = torch.arange(23)
    predicted = [t for start, length in blocks(ids, 5) for t in range(start + 1, start + length + 1)]
    assert predicted == list(range(1, 23))


@dataclass
class _Out:
    logits: torch.Tensor


class Uniform(nn.Module):
    """Equal logits for every token: the NLL of each token is exactly ln(V)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        return _Out(torch.zeros(*tokens.shape, self.vocab))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_bits_are_total_nll_over_the_characters_or_bytes_predicted(text_file, kind):
    task = make_task(text_file, tokenizer=kind, vocab_size=300, valid_fraction=0.3, test_fraction=0.0)
    vocab = len(task.tokenizer)
    scores = task.score(Uniform(vocab), "valid")
    ids = task.ids["valid"]
    assert scores["tokens"] == len(ids) - 1
    assert scores["loss"] == pytest.approx(math.log(vocab))
    assert scores["ppl"] == pytest.approx(vocab)
    if kind == "char":
        assert scores["bits_per_char"] == pytest.approx(math.log2(vocab))
    else:
        predicted_bytes = len(task.tokenizer.decode(ids[1:].tolist()).encode("utf-8"))
        assert scores["bits_per_byte"] == pytest.approx((len(ids) - 1) * math.log2(vocab) / predicted_bytes)
        assert scores["bits_per_byte"] < math.log2(vocab)  # a BPE token spells more than one byte


def test_eval_blocks_reads_an_even_subset(text_file):
    task = make_task(text_file, eval_blocks=2, valid_fraction=0.3, test_fraction=0.0)
    model = Uniform(len(task.tokenizer))
    every = blocks(task.ids["valid"], 16)
    assert len(every) > 2
    assert task.score(model, "valid")["tokens"] == every[0][1] + every[-1][1]  # the first and the last
    assert task.score_tokens(model, task.ids["valid"])["tokens"] == len(task.ids["valid"]) - 1
    assert set(task.validate(model)) == {"loss", "ppl", "bits_per_char"}


# -- end to end ---------------------------------------------------------------------------------------------------
TINY = ["--set", "d_model=32", "--set", "n_heads=4", "--set", "d_ffn=64", "--set", "enc_layers=2",
        "--set", "data.block_size=16", "--set", "data.eval_interval=3", "--set", "train.max_steps=6",
        "--set", "train.max_tokens=64", "--set", "train.warmup_steps=2"]


def test_cli_train_generate_evaluate(text_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text_file), "--run-dir", str(run), "--no-progress", *TINY]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 6 and results["epochs"] == 2
    assert {"valid_loss", "test_loss", "test_bits_per_char", "parameters"} <= set(results)
    assert len(json.loads((run / "run.json").read_text())["train"]) and (run / "sample.txt").is_file()
    valid_rows = (run / "valid.csv").read_text().splitlines()
    assert len(valid_rows) == 1 + 2  # a header and one validation per 3 steps
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(run / "best"), "--prompt", "Line", "--max-new-tokens", "12",
                 "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("Line") and len(first.rstrip("\n")) == 4 + 12
    assert main(["generate", "--checkpoint", str(run / "best"), "--prompt", "Line", "--max-new-tokens", "12",
                 "--seed", "3", "--no-cache"]) == 0
    assert capsys.readouterr().out == first  # seeded, and the cache changes nothing
    assert main(["generate", "--checkpoint", str(run / "best"), "--prompt", "Line\x00"]) == 2
    assert "not in the model's vocabulary" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--data", str(text_file)]) == 0
    assert "bits_per_char" in capsys.readouterr().out


@pytest.mark.parametrize("data, where", [(b"\x00" * 5000, ":1: holds a NUL byte (character 0 of the file)"),
                                         (b"to be or not\nto \x00be\n" * 20, ":2: holds a NUL byte (character 16 of "
                                                                            "the file)")], ids=["zeros", "one_nul"])
def test_text_with_nul_bytes_is_refused_like_a_binary_file(tmp_path, capsys, data, where):
    """A file of 5,000 NULs trained with exit 0 (NUL is valid UTF-8), while binary files were refused (issue 43)."""
    path = tmp_path / "book.txt"
    path.write_bytes(data)
    with pytest.raises(DataError, match=rf"book\.txt{re.escape(where)}; no text file holds one, so it is binary or "
                                        r"damaged"):
        load_corpus(str(path))
    assert main(["train", "lm", "--data", str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "holds a NUL byte" in capsys.readouterr().err and not (tmp_path / "run").exists()
