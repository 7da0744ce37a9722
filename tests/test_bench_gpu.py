"""benchmarks/bench_gpu.py's dry run (``--tiny``): a part runs at toy sizes on the CPU and records what the GPU run
reports (a dry run, not a measurement: the figures themselves come from a GPU). The methods part runs here, in
eager and reference modes besides the campaign's; the peers and decode parts are checked on the GPU campaign's dry
run, which runs them (tests/test_gpu_campaign.py)."""
from pathlib import Path

import pytest

from helpers.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load_benchmark("bench_gpu")


@pytest.mark.slow
def test_the_dry_run_records_methods_with_their_bars_bounds_and_kernel_modes(tmp_path: Path) -> None:
    result = _bench().main(["--tiny", "--device", "cpu", "--parts", "methods", "--methods", "causal PA",
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
    assert (tmp_path / "gpu.json").stat().st_size > 0

