"""Token folders written by hand, by the formats' own definitions (not by interlayer's writer): nanoGPT's raw
uint16 ``.bin`` files and llm.c's shards (a 256 x int32 header: magic 20240520, version 1, token count)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

LLMC_MAGIC, LLMC_VERSION = 20240520, 1


def write_raw(path: Path, ids) -> Path:
    """nanoGPT's ``np.array(ids, dtype=np.uint16).tofile(path)``."""
    np.asarray(ids, dtype=np.uint16).tofile(path)
    return path


def write_shard(path: Path, ids, *, magic: int = LLMC_MAGIC, version: int = LLMC_VERSION,
                count: Optional[int] = None) -> Path:
    """llm.c's ``write_datafile``: the header (``count`` overrides the true token count), then the uint16 ids."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(ids) if count is None else count
    with open(path, "wb") as handle:
        handle.write(header.tobytes())
        handle.write(np.asarray(ids, dtype=np.uint16).tobytes())
    return path


def nanogpt_folder(folder: Path, splits: dict[str, Any], meta: Optional[dict[str, Any]] = None) -> Path:
    """``train.bin``, ``val.bin`` (and ``test.bin``) from ``splits`` (keys train, valid, test), and ``meta.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, file in (("train", "train.bin"), ("valid", "val.bin"), ("test", "test.bin")):
        if name in splits:
            write_raw(folder / file, splits[name])
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    return folder
