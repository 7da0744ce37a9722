"""benchmarks/bench_kernels.py's dry run (``--tiny``, the kernels under Triton's interpreter): every kernel runs
against its reference path, and the error column catches a kernel that is wrong (the figures themselves come from
a GPU)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.benchmarks import load_benchmark

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]
# where the kernels run: a GPU, else the CPU under the interpreter (tests/conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _bench():
    return load_benchmark("bench_kernels")


def test_every_kernel_is_measured_against_its_reference_with_bytes_and_error(tmp_path: Path) -> None:
    bench = _bench()
    result = bench.main(["--tiny", "--device", DEVICE, "--dtype", "fp32", "--json", str(tmp_path / "kernels.json")])
    assert set(result["cases"]) == set(bench.CASES)
    for name, row in result["cases"].items():
        assert row["error"] < (3e-2 if DEVICE == "cuda" else 1e-5), name  # fp32 (TF32 products on a GPU)
        assert row["forward_bytes"] > 0 and row["backward_bytes"] > 0
        assert row["triton_training_ms"] > 0 and row["reference_training_ms"] > 0 and row["training_gbps"] > 0
    assert (tmp_path / "kernels.json").stat().st_size > 0


def test_a_wrong_kernel_shows_in_the_error_column(monkeypatch) -> None:
    from interlayer.kernels import logits_attention

    bench = _bench()
    real = logits_attention._forward_op
    monkeypatch.setattr(logits_attention, "_forward_op", lambda *a: [real(*a)[0] * 1.01, real(*a)[1]])
    row = bench.main(["--tiny", "--device", DEVICE, "--dtype", "fp32", "--cases", "logits-attention"]
                     )["cases"]["logits-attention"]
    assert row["error"] > 5e-3


@pytest.mark.skipif(DEVICE == "cuda", reason="the kernels were compiled for the GPU, not interpreted")
def test_the_cpu_without_the_interpreter_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit) as exit_info:
        _bench().main(["--tiny", "--device", "cpu"])
    assert exit_info.value.code == 2 and "TRITON_INTERPRET=1" in capsys.readouterr().err


def test_the_kernels_compiled_for_hopper_spill_no_registers(tmp_path: Path) -> None:
    """Compiled offline for sm_90 (the H100/H200) by Triton's own ptxas at GPT-2 small's sizes (in a process
    without the interpreter, which the suite's other kernel tests use): a memory-bound kernel that spills registers
    to local memory, or keeps too few warps in flight, is slow however few bytes it means to move (the PA kernels
    spilled 1.6 KB a thread before their loops were rolled up). Compiling is also what the interpreter never does:
    a kernel Triton refuses on a GPU (the module-level float that failed 34 tests on the H200) fails here."""
    triton_bin = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin"
    if not (triton_bin / "cuobjdump").is_file():
        pytest.skip("this Triton build has no NVIDIA tools (cuobjdump)")
    out = tmp_path / "resources.json"
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--resources", "--cases",
                           "cross-entropy", "logits-attention", "pa-maps", "res-maps", "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    if "launch internals" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    kernels = json.loads(out.read_text())["kernels"]
    assert {k["kernel"] for k in kernels} >= {"_conv_forward", "_conv_backward_z", "_conv_backward_x", "_forward",
                                              "_backward"}
    for k in kernels:
        assert k["spilled_bytes"] == 0, k
        assert k["resident_warps"] >= 8, k
    assert min(k["resident_warps"] for k in kernels if k["kernel"].startswith("_conv")) >= 16


def test_occupancy_follows_the_register_file() -> None:
    occupancy = _bench().occupancy
    assert occupancy(registers=32, shared=0, warps=4) == 16  # 32 resident blocks' limit would allow more: 64 warps
    assert occupancy(registers=255, shared=0, warps=4) == 2  # 255 -> 256 a thread: 2 blocks of 128 threads
    assert occupancy(registers=128, shared=0, warps=8) == 2
    assert occupancy(registers=64, shared=100 * 1024, warps=4) == 2  # shared memory binds
