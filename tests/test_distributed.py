"""Data-parallel training: 2 CPU processes (gloo, as torchrun launches them) give the losses and weights of one
process with the same global batch (update_freq=2), also with Crossformer-tied weights; where 2 GPUs exist, the
same with NCCL, each rank on its own GPU."""
import os
import re
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from helpers import TEXT, set_args
from helpers.translation import write_corpus
from interlayer.experiment import train
from interlayer.tasks import task_specs
from interlayer.training import distributed, state_file
from interlayer.training.engine import LAST


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
    try:
        train(task_specs()["translation"], sets=_sets(corpus, update_freq, extra), seed=3, run_dir=run_dir,
              progress=False, options={"beam": 1, "lenpen": 1.0, "use_cache": True})
    finally:  # as the CLI does: left to the interpreter's exit, gloo's teardown can abort a rank (SIGABRT)
        distributed.leave()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The tiny De-En corpus at 120/8/8 sentences, plain text."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), {"train": (120, 1), "valid": (8, 2), "test": (8, 3)})


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    {}, {"crossformer.hard": "[kq, ffn]"},
    pytest.param({"train.device": "cuda", "train.tf32": "false"}, marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="NCCL across 2 GPUs needs 2 GPUs"))],
    ids=["plain", "crossformer_hg", "nccl"])
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
    w1 = state_file.read(single / LAST)["model"]
    w2 = state_file.read(double / LAST)["model"]
    for key in w1:
        torch.testing.assert_close(w1[key], w2[key], rtol=1e-4, atol=1e-6)


# -- ranks agree before they train (issue 43) ------------------------------------------------------------------------
LAUNCHER = """import json, os, sys
from interlayer.cli import main
extra = json.loads(os.environ.get("RANK%s_ARGS" % os.environ["RANK"], "[]"))
sys.exit(main(sys.argv[1:] + extra))
"""


def _torchrun(tmp_path, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``torchrun --nproc_per_node 2`` (gloo, CPU) of ``interlayer ARGS``; ``RANKn_ARGS`` (JSON) adds arguments on
    rank n only. Returns torchrun's exit code and its output (each rank's exit code is in torchrun's report)."""
    (tmp_path / "launch.py").write_text(LAUNCHER)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(_free_port()), str(tmp_path / "launch.py"), *args],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return result.returncode, result.stdout + result.stderr


def _rank_exit_codes(output: str) -> list[int]:
    return sorted(int(code) for code in re.findall(r"^\s+exitcode\s+: (-?\d+)", output, re.M))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bad_set_on_rank_1", "other_set_on_rank_1", "refused_on_rank_0"])
def test_ranks_that_disagree_or_refuse_all_exit_2_with_one_message(tmp_path, case):
    """A bad --set given to rank 1 only was ignored (the run trained with rank 0's settings); a refusal on rank 0
    left rank 1 with gloo's "connection closed" and torchrun with a traceback."""
    (tmp_path / "book.txt").write_text(TEXT)
    args = ["train", "lm", "--data", "book.txt", "--run-dir", "run", "--no-progress", "--device", "cpu",
            *set_args(["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.block_size=16",
                       "train.max_tokens=64", "train.max_steps=1"])]
    env, message = {
        "bad_set_on_rank_1": ({"RANK1_ARGS": '["--set", "d_model=[1,"]'},
                              r"rank 1 of 2: --set d_model='\[1,': not valid YAML: .* \(every rank stops\)"),
        "other_set_on_rank_1": ({"RANK1_ARGS": '["--set", "d_model=32"]'},
                                r"the 2 ranks were started with different settings: model\.d_model: rank 0 16, rank 1 "
                                r"32; every rank must run the same command"),
        "refused_on_rank_0": ({}, r"rank 0 of 2: run already holds a run; pass --resume .* \(every rank stops\)"),
    }[case]
    if case == "refused_on_rank_0":  # only rank 0 looks for an existing run
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "run.json").write_text("{}")
    code, output = _torchrun(tmp_path, args, env)
    assert code != 0
    errors = [line for line in output.splitlines() if line.startswith("interlayer: error: ")]
    assert len(errors) == 2 and errors[0] == errors[1] and re.search(message, errors[0]), output
    assert _rank_exit_codes(output) == [2, 2], output
    assert not re.search(r'File ".*/interlayer/', output)  # no rank printed a traceback (torchrun prints its own)
    if case == "refused_on_rank_0":
        assert os.listdir(tmp_path / "run") == ["run.json"]  # nothing was written beside it
    else:
        assert not (tmp_path / "run").exists()


def test_a_single_process_keeps_its_own_error():
    """Outside torchrun ``agree`` re-raises the error as it was (its type decides the exit code)."""
    from interlayer.training.distributed import DistEnv, agree

    agree(DistEnv())
    with pytest.raises(FileExistsError, match="already"):
        agree(DistEnv(), FileExistsError("already"))
