"""benchmarks/bench_kernels.py's dry run (``--tiny``, the kernels under Triton's interpreter): every kernel runs
against its reference path, and the error column catches a kernel that is wrong (the figures themselves come from
a GPU)."""
import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks" / "bench_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_kernel_is_measured_against_its_reference_with_bytes_and_error(tmp_path: Path) -> None:
    bench = _bench()
    result = bench.main(["--tiny", "--device", "cpu", "--json", str(tmp_path / "kernels.json")])
    assert set(result["cases"]) == set(bench.CASES)
    for name, row in result["cases"].items():
        assert row["error"] < 1e-5, name  # fp32 on the interpreter: the two paths agree to rounding
        assert row["forward_bytes"] > 0 and row["backward_bytes"] > 0
        assert row["triton_training_ms"] > 0 and row["reference_training_ms"] > 0 and row["training_gbps"] > 0
    assert (tmp_path / "kernels.json").stat().st_size > 0


def test_a_wrong_kernel_shows_in_the_error_column(monkeypatch) -> None:
    from interlayer.kernels import logits_attention

    bench = _bench()
    real = logits_attention._forward_op
    monkeypatch.setattr(logits_attention, "_forward_op", lambda *a: [real(*a)[0] * 1.01, real(*a)[1]])
    row = bench.main(["--tiny", "--device", "cpu", "--cases", "logits-attention"])["cases"]["logits-attention"]
    assert row["error"] > 5e-3


def test_the_cpu_without_the_interpreter_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit) as exit_info:
        _bench().main(["--tiny", "--device", "cpu"])
    assert exit_info.value.code == 2 and "TRITON_INTERPRET=1" in capsys.readouterr().err
