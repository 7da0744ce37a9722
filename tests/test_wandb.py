"""``train.logger=wandb`` (issue 31): the scalars TensorBoard gets (loss, each aux loss, lr, units/s; validation
metrics) and the run's configuration reach Weights & Biases, here in its offline mode (no account, no network)."""
from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from helpers import TEXT
from interlayer import ConfigError
from interlayer.cli import main
from interlayer.training.config import TrainConfig

TINY = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ffn=32", "--set", "enc_layers=2",
        "--set", "data.block_size=16", "--set", "data.eval_interval=3", "--set", "train.max_tokens=64",
        "--set", "train.warmup_steps=1", "--set", "train.max_steps=6", "--set", "train.log_interval=1",
        "--set", "crossformer.soft=[kq]"]


def read_offline_run(path: Path) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """(history by step, config) of an offline ``.wandb`` file: W&B's LevelDB-style log (a 7-byte header, 32 KiB
    blocks of records with a 7-byte header: CRC, length, type 1 full / 2 first / 3 middle / 4 last) of protobuf
    ``Record`` messages (wandb 0.31 no longer ships a Python reader for it)."""
    from wandb.proto import wandb_internal_pb2 as pb  # the test that calls this has skipped without wandb

    raw, block = path.read_bytes(), 32768
    assert raw[:4] == b":W&B"
    pos, chunk, records = 7, b"", []
    while pos + 7 <= len(raw):
        left = block - pos % block
        length, kind = struct.unpack("<HB", raw[pos + 4:pos + 7]) if left >= 7 else (0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        chunk += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(chunk)
            chunk = b""
    history: dict[int, dict[str, float]] = {}
    config: dict[str, Any] = {}
    for data in records:
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(int(items["_step"]), {}).update(items)
        elif record.WhichOneof("record_type") == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    return history, config


def test_wandb_offline_run_holds_the_scalars_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    text = tmp_path / "book.txt"
    text.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "lm", "--data", str(text), "--run-dir", str(run), "--no-progress", *TINY,
                 "--set", "train.logger=wandb"]) == 0
    (log,) = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    history, config = read_offline_run(log)
    assert sorted(history) == [1, 2, 3, 4, 5, 6]
    csv_rows = (run / "train.csv").read_text().splitlines()
    header, last = csv_rows[0].split(","), dict(zip(csv_rows[0].split(","), csv_rows[-1].split(",")))
    for key in ("loss", "crossformer_sg", "lr", "units_per_s"):  # what TensorBoard and the CSV get
        assert key in header and history[6][f"train/{key}"] == pytest.approx(float(last[key]), rel=1e-6)
    assert "valid/loss" in history[3] and "valid/loss" in history[6]
    assert config["train"]["logger"] == "wandb" and config["model"]["crossformer"]["soft"] == ["kq"]
    assert not (run / "tb").exists()  # W&B instead of TensorBoard; the CSV files as always


def test_logger_wandb_without_the_package_is_refused_before_the_run(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"train.logger=wandb needs the optional package wandb: pip install "
                                          r"'interlayer\[wandb\]'"):
        TrainConfig(logger="wandb").validate()
    with pytest.raises(ConfigError, match="train.logger='mlflow'"):
        TrainConfig(logger="mlflow").validate()
