"""Model and run folders from strangers (issue 43): a tiny trained language-model run to damage, a copy of a folder
with its config edited, a link out of a folder in place of one of its files, and a folder the machine refuses to
write (a read-only file system)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from interlayer.cli import main

from . import TEXT, set_args

TINY_LM = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.block_size=16", "train.max_tokens=64",
           "train.max_steps=2", "train.threads=1"]


def train_tiny_lm(root: Path, *sets: str) -> Path:
    """A finished ``train lm`` run (two steps of a 1-layer model on a 60-line text) in ``root/run``: its ``best/``
    holds ``config.json``, ``model.safetensors``, ``tokenizer.json``, ``task.json``, ``data.json``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "book.txt").write_text(TEXT)
    run = root / "run"
    assert main(["train", "lm", "--data", str(root / "book.txt"), "--run-dir", str(run), "--no-progress",
                 *set_args([*TINY_LM, *sets])]) == 0
    return run


def saved_config(folder: Path) -> dict[str, Any]:
    """The interlayer config a model folder's ``config.json`` holds (its ``interlayer`` section's, the layout
    ``transformers`` reads)."""
    return json.loads((folder / "config.json").read_text())["interlayer"]["config"]


def copy_folder(folder: Path, destination: Path, **config: Any) -> Path:
    """A copy of model folder ``folder`` at ``destination`` with its interlayer config's keys ``config`` replaced
    (a dict value replaces a method section)."""
    shutil.copytree(folder, destination)
    data = json.loads((destination / "config.json").read_text())
    data["interlayer"]["config"].update(config)
    (destination / "config.json").write_text(json.dumps(data))
    return destination


def link_out(folder: Path, name: str, target: Path) -> Path:
    """Replace ``folder/name`` by a symbolic link to ``target`` (outside the folder); returns the link."""
    path = folder / name
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)
    return path


def fifo(folder: Path, name: str) -> Path:
    """Replace ``folder/name`` by a FIFO (a read of it would wait for a writer forever)."""
    path = folder / name
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` (relative name -> bytes): to show that a refused command changed nothing."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """``path`` as a folder this process cannot write: a read-only tmpfs mounted there when the tests run as root
    with the right to mount (root ignores permission bits), else the folder's write permission removed; skips the
    test where neither is possible."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    mounted = shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True, check=False
    ).returncode == 0
    if not mounted:
        pytest.skip("running as root without the right to mount a read-only file system")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
