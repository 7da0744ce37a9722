"""Data-parallel training: 2 CPU processes (gloo, as torchrun launches them) give the losses and weights of one
process with the same global batch (update_freq=2), also with Crossformer-tied weights; where 2 GPUs exist, the
same with NCCL, each rank on its own GPU."""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from interlayer.experiment import train
from interlayer.tasks import task_specs
from interlayer.training.engine import LAST, read_checkpoint

from helpers.translation import write_corpus


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sets(corpus, update_freq: int, extra: dict) -> dict:
    sets = {"d_model": "32", "n_heads": "4", "d_ffn": "64", "enc_layers": "2", "dec_layers": "2", "dropout": "0.0",
            "train.max_steps": "4", "train.update_freq": str(update_freq), "train.log_interval": "1",
            "train.max_tokens": "200", "train.warmup_steps": "2", "train.average_last": "0",
            "data.vocab_size": "80", "train.device": "cpu", "train.precision": "fp32", **extra}
    for split in ("train", "valid", "test"):
        sets[f"data.{split}_src"] = str(corpus / f"{split}.de")
        sets[f"data.{split}_tgt"] = str(corpus / f"{split}.en")
    return sets


def _run(rank: int, world: int, port: int, corpus, run_dir, update_freq: int, extra: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    train(task_specs()["translation"], sets=_sets(corpus, update_freq, extra), seed=3, run_dir=run_dir,
          progress=False, options={"beam": 1, "lenpen": 1.0, "use_cache": True})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The tiny De-En corpus at 120/8/8 sentences, plain text."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), {"train": (120, 1), "valid": (8, 2), "test": (8, 3)})


@pytest.mark.parametrize("extra", [
    {}, {"crossformer.hard": "[kq, ffn]"},
    pytest.param({"train.device": "cuda", "train.tf32": "false"}, marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="NCCL across 2 GPUs needs 2 GPUs"))], ids=["plain", "crossformer_hg", "nccl"])
def test_two_processes_equal_one_process_with_the_same_global_batch(corpus, tmp_path, extra):
    single, double = tmp_path / "single", tmp_path / "ddp"
    _run(0, 1, 0, corpus, single, 2, extra)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)
    mp.spawn(_run, args=(2, _free_port(), corpus, double, 1, extra), nprocs=2, join=True)
    one = [line.split(",") for line in (single / "train.csv").read_text().splitlines()]
    two = [line.split(",") for line in (double / "train.csv").read_text().splitlines()]
    col = one[0].index("loss")
    assert len(one) == len(two) == 5
    for a, b in zip(one[1:], two[1:]):
        assert float(a[col]) == pytest.approx(float(b[col]), rel=1e-5)
    w1 = read_checkpoint(single / LAST)["model"]
    w2 = read_checkpoint(double / LAST)["model"]
    for key in w1:
        torch.testing.assert_close(w1[key], w2[key], rtol=1e-4, atol=1e-6)
