"""benchmarks/bench_gpu.py's dry run (``--tiny``): every part runs at toy sizes on the CPU and records what the GPU
run reports (a dry run, not a measurement: the figures themselves come from a GPU)."""
from pathlib import Path

import pytest

from helpers.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load_benchmark("bench_gpu")


def test_the_dry_run_records_methods_with_their_bars_bounds_and_kernel_modes(tmp_path: Path) -> None:
    result = _bench().main(["--tiny", "--device", "cpu", "--parts", "methods,decode", "--methods", "causal PA",
                            "DenseFormer", "--modes", "compiled,eager", "--kernel-modes", "auto,reference", "--json",
                            str(tmp_path / "gpu.json")])
    assert result["problems"] == []
    methods = result["methods"]
    assert set(methods) == {"causal PA compiled", "causal PA compiled (reference)", "causal PA eager",
                            "causal PA eager (reference)",  # no kernel serves DenseFormer: one mode
                            "DenseFormer 1x1 compiled", "DenseFormer 1x1 eager"}
    row = methods["causal PA compiled"]
    assert row["bar"] == 1.6 and row["madds_ratio"] > 1 and row["bound_ratio"] > 1
    assert row["bytes"]["attention maps"] > 0 and row["kernels"] == "auto"
    assert {(d["batch"], d["setting"]) for d in result["decode"]} == {
        (b, s) for b in (1, 8) for s in ("recompute", "cache", "cache compiled")}
    assert all(d["same_tokens"] for d in result["decode"])
    assert (tmp_path / "gpu.json").stat().st_size > 0


def test_the_peers_part_steps_interlayer_as_its_trainer_does() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("x_transformers")
    result = _bench().main(["--tiny", "--device", "cpu", "--parts", "peers"])
    names = set(result["peers"])
    assert {"interlayer eager", "interlayer compiled", "interlayer task loss compiled", "interlayer labels= compiled",
            "minimal-gpt2 compiled", "hf-gpt2 compiled", "x-transformers compiled"} <= names
    assert all(row["mfu"] > 0 and row["bound_ms"] > 0 for name, row in result["peers"].items()
               if name.startswith("interlayer"))
