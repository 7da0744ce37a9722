"""nanoGPT's habits (issue 50): its ``shakespeare_char`` folder (train.bin, val.bin, a pickled meta.pkl) trains with
no extra setting, the pickle read as plain data by an unpickler that refuses every global; ``prepare lm`` writes
meta.pkl for characters as nanoGPT's ``prepare.py`` does; ``--set n_embd`` scales the FFN as nanoGPT does and
``--set block_size`` is the data's block size, so nanoGPT's settings give nanoGPT's parameter count."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from helpers import TEXT, set_args
from helpers.token_files import nanogpt_folder
from interlayer import create_model
from interlayer.cli import main
from interlayer.data import nanogpt_meta
from interlayer.data.token_files import read_meta
from interlayer.errors import DataError

RUN = set_args(["data.eval_interval=2", "train.max_steps=2", "train.max_tokens=64", "train.warmup_steps=1"])


def shakespeare_char(folder: Path) -> Path:
    """A folder as nanoGPT's data/shakespeare_char/prepare.py writes it: sorted characters, uint16 ids of the
    first 90% and the last 10%, and meta.pkl = {vocab_size, itos, stoi} by pickle.dump."""
    chars = sorted(set(TEXT))
    stoi, itos = {ch: i for i, ch in enumerate(chars)}, dict(enumerate(chars))
    cut = int(len(TEXT) * 0.9)
    nanogpt_folder(folder, {"train": [stoi[c] for c in TEXT[:cut]], "valid": [stoi[c] for c in TEXT[cut:]]})
    with open(folder / "meta.pkl", "wb") as handle:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, handle)
    return folder


def nanogpt_num_params(vocab: int, width: int, layers: int, bias: bool) -> int:
    """nanoGPT's GPT.get_num_params() (non_embedding=True: the position table wpe left out, the token table counted
    once, as the tied lm_head), by model.py's modules: per block ln_1, c_attn (3 x), c_proj, ln_2, c_fc (4 x),
    mlp c_proj (4 x); then ln_f."""
    norm = width * (2 if bias else 1)
    block = 2 * norm + (width * 3 * width + width * width + 2 * width * 4 * width) \
        + (3 * width + width + 4 * width + width if bias else 0)
    return vocab * width + layers * block + norm


def test_nanogpts_shakespeare_char_folder_trains_with_no_extra_setting(tmp_path: Path) -> None:
    """It was refused because of meta.pkl ("never loads"); the characters come from it: text samples and bits per
    character, as with interlayer's own meta.json."""
    folder = shakespeare_char(tmp_path / "shakespeare_char")
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(folder), "--run-dir", str(run), "--no-progress", *RUN,
                 *set_args(["n_embd=32", "n_layer=2", "n_head=2", "block_size=16"])]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["valid_bits_per_char"] > 0  # the characters are known
    saved = json.loads((run / "best" / "config.json").read_text())["interlayer"]["config"]
    assert (saved["d_model"], saved["d_ffn"], saved["max_positions"]) == (32, 128, 16)  # nanoGPT's names, its rules
    assert read_meta(folder) == {"vocab_size": len(set(TEXT)), "chars": "".join(sorted(set(TEXT)))}


class Hostile:
    """What a crafted meta.pkl may hold: unpickling it with pickle.load calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("case", ["os.system", "a class", "too large", "not nanoGPT's", "stoi"])
def test_a_hostile_or_foreign_meta_pkl_is_refused_and_runs_nothing(case: str, tmp_path: Path, monkeypatch) -> None:
    folder = shakespeare_char(tmp_path / "data")
    marker = tmp_path / "ran"
    payload = {
        "os.system": lambda: pickle.dumps({"vocab_size": 3, "itos": Hostile(marker)}),
        "a class": lambda: pickle.dumps({"vocab_size": 3, "itos": {0: "a"}, "stoi": np.int64(1)}),
        "too large": lambda: b"\x80\x04" + b"N" * 200 + b".",
        "not nanoGPT's": lambda: pickle.dumps({"vocab_size": 70_000}),
        "stoi": lambda: pickle.dumps({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 1, "b": 0}}),
    }[case]()
    (folder / "meta.pkl").write_bytes(payload)
    if case == "too large":
        monkeypatch.setattr(nanogpt_meta, "MAX_BYTES", 100)
    message = {"os.system": r"refused \(it names (posix|os)\.system; a meta.pkl holds plain data",
               "a class": r"refused \(it names numpy", "too large": r"203 bytes, more than the 100",
               "not nanoGPT's": r"vocab_size=70000 must be an integer from 1 to 65536",
               "stoi": r"stoi is not the inverse of itos"}[case]
    with pytest.raises(DataError, match=message):
        read_meta(folder)
    assert main(["train", "lm", "--data", str(folder), "--run-dir", str(tmp_path / "run"), "--no-progress",
                 *RUN]) == 2
    assert not marker.exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_prepare_lm_writes_nanogpts_meta_pkl_for_characters(tmp_path: Path) -> None:
    """nanoGPT's sample.py decodes with meta.pkl's stoi/itos; without it, it would decode with GPT-2's BPE."""
    source = tmp_path / "book.txt"
    source.write_text(TEXT)
    assert main(["prepare", "lm", str(source), "--output", str(tmp_path / "chars"), "--no-progress"]) == 0
    meta = json.loads((tmp_path / "chars" / "meta.json").read_text())
    with open(tmp_path / "chars" / "meta.pkl", "rb") as handle:  # our own file: sample.py's pickle.load
        pickled = pickle.load(handle)
    chars = meta["tokenizer"]["chars"]
    assert pickled == {"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                       "stoi": {c: i for i, c in enumerate(chars)}}
    assert main(["prepare", "lm", str(source), "--output", str(tmp_path / "bpe"), "--tokenizer", "bpe",
                 "--vocab-size", "300", "--no-progress"]) == 0
    assert not (tmp_path / "bpe" / "meta.pkl").exists()  # nanoGPT's BPE corpora have none either


@pytest.mark.parametrize("bias", [False, True])
def test_nanogpt_settings_give_nanogpts_parameter_count(bias: bool, tmp_path: Path) -> None:
    """--set n_embd=32 kept the preset's FFN (1,536 wide: 207,040 parameters without positions where nanoGPT has
    26,816), and --set block_size answered "did you mean 'vocab_size'?". nanoGPT's shakespeare_char: 65
    characters, block_size 256."""
    from interlayer.experiment import split_overrides

    model_sets, _, data_sets = split_overrides({"n_embd": "32", "n_layer": "2", "n_head": "2", "block_size": "256",
                                                "bias": str(bias).lower()})
    assert data_sets == {"block_size": 256}
    model = create_model("gpt_shakespeare_char", src_vocab_size=65, max_positions=256, **model_sets)
    assert model.config.d_ffn == 128
    positions = model.encoder.embed.positions.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    assert total - positions == nanogpt_num_params(65, 32, 2, bias)
    narrow = dict(n_head=2, src_vocab_size=65)
    assert create_model("gpt_shakespeare_char", n_embd=32, d_ffn=64, **narrow).config.d_ffn == 64  # given: kept
    assert create_model("gpt_shakespeare_char", n_embd=32, n_inner=48, **narrow).config.d_ffn == 48
    assert create_model("gpt_shakespeare_char", d_model=32, **narrow).config.d_ffn == \
        create_model("gpt_shakespeare_char").config.d_ffn  # interlayer's own name changes the width alone
