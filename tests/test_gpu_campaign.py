"""The GPU campaign's CPU dry run (benchmarks/gpu/campaign.sh PART --device cpu --tiny; docs/gpu-campaign.md): every
part runs end to end at toy sizes and writes its log and JSON, so a broken campaign shows here before a GPU is
lent. Each part starts several Python processes (pytest, torchrun, training runs, benchmarks): a part runs once for
the session (a fixture) and every test of its record reads that run; the tests of one run share an xdist group, so
``make test``'s workers do not run it twice."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "campaign.sh"
sys.path.insert(0, str(SCRIPT.parent))
import campaign  # noqa: E402  (benchmarks/gpu/campaign.py)


def dry_run(part: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """One part on the CPU at toy sizes with no wheels, this interpreter and an empty site folder."""
    (tmp_path / "wheels").mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "CAMPAIGN_SITE": str(tmp_path / "site"), "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    result = subprocess.run(["bash", str(SCRIPT), part, "--device", "cpu", "--tiny", "--out", str(tmp_path / "out"),
                             "--wheels", str(tmp_path / "wheels")], capture_output=True, text=True, env=env,
                            timeout=300)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"{part}.json", f"{part}.log"]
    return result, json.loads((tmp_path / "out" / f"{part}.json").read_text())


def _needs_peers() -> None:
    if importlib.util.find_spec("x_transformers") is None:
        pytest.skip("x-transformers is not installed (make bench installs it): the peers need it")


@pytest.fixture(scope="session")  # module scope ran it again when xdist interleaved another file's tests
def throughput(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    _needs_peers()
    return dry_run("throughput", tmp_path_factory.mktemp("throughput"))


@pytest.fixture(scope="session")
def peers(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    _needs_peers()
    return dry_run("peers", tmp_path_factory.mktemp("peers"))


@pytest.mark.xdist_group("campaign peers")
def test_a_group_reaches_the_node_id_that_xdist_schedules_by(request):
    """Under ``make test``'s ``--dist loadgroup`` the group must be in the node id, or xdist splits it over the workers
    and each runs the part's dry run (tests/conftest.py's hook; pytest 9 lost xdist 3.8's own suffix)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest -n N --dist loadgroup")
    assert request.node.nodeid.endswith("@campaign peers"), request.node.nodeid


@pytest.mark.slow
def test_setup_reports_imports_torch_and_a_measured_matmul(tmp_path):
    result, record = dry_run("setup", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert record["ok"] and record["torch"]["cuda_available"] is False
    assert all(not v.startswith("FAILED") for v in record["imports"].values()) and "optuna" in record["imports"]
    assert record["matmul"]["tflops"] > 0
    assert "no wheels in" in (tmp_path / "out" / "setup.log").read_text()


def test_a_module_that_does_not_import_is_named():
    found = campaign.check_imports({"os": "stdlib", "no_such_module_for_the_campaign": "a carried wheel"})
    assert found["os"] == "imported"
    assert found["no_such_module_for_the_campaign"].startswith("FAILED (a carried wheel): ModuleNotFoundError")


@pytest.mark.slow
def test_suite_lists_outcomes_skip_reasons_and_runs_torchrun(tmp_path):
    result, record = dry_run("suite", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = record["tests"]["counts"]
    assert counts["passed"] >= 4 and counts["failed"] == counts["errors"] == 0
    checks = record["gpu_checks"]
    assert set(checks["bf16 training"].values()) == set(checks["fp16 training"].values()) == {"passed"}
    assert set(checks["cross-device resume"].values()) == {"skipped: needs a CUDA GPU"}
    inductor = checks["inductor compile on CUDA, zero graph breaks"]
    assert len(inductor) == 6 and set(inductor.values()) == {"skipped: needs a CUDA GPU"}
    assert [s["status"] for s in record["steps"]] == ["ok", "ok", "ok"]  # pytest twice, torchrun
    assert any(test.endswith("test_learning_rate_schedules") for test in record["tests"]["outcomes"])  # the rest


def test_the_suite_runs_8_workers_of_2_threads_on_16_cores_with_a_timeout_per_test(monkeypatch):
    """The GPU machine's 16 cores: 8 pytest-xdist workers, each limited to 2 threads (unlimited, every worker's torch
    would take all 16), and pytest-timeout's per-test limit where it is installed; the reports of the two pytest
    steps add up."""
    monkeypatch.setattr(campaign.importlib.util, "find_spec", lambda name: object())
    options, env = campaign.pytest_options(False, 16)
    assert options == ["-n", "8", f"--timeout={campaign.TEST_TIMEOUT}"]
    assert env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert campaign.pytest_options(False, 4)[0][:2] == ["-n", "2"] and campaign.pytest_options(True, 16) == ([], {})
    monkeypatch.setattr(campaign.importlib.util, "find_spec", lambda name: None if name == "pytest_timeout" else 1)
    assert campaign.pytest_options(False, 16)[0] == ["-n", "8"]
    one = {"counts": {"passed": 1, "failed": 1, "errors": 0, "skipped": 0}, "skipped": [],
           "failures": [{"test": "a::t", "traceback": "Traceback"}], "outcomes": {"a::t": "failure", "a::u": "passed"}}
    two = {"counts": {"passed": 2, "failed": 0, "errors": 0, "skipped": 1}, "failures": [],
           "skipped": [{"test": "b::s", "reason": "needs a CUDA GPU"}],
           "outcomes": {"b::s": "skipped", "b::v": "passed"}}
    merged = campaign.merge_reports([one, two])
    assert merged["counts"] == {"passed": 3, "failed": 1, "errors": 0, "skipped": 1}
    assert merged["failures"] == one["failures"] and merged["skipped"] == two["skipped"]
    assert len(merged["outcomes"]) == 4


def test_junit_failures_carry_their_tracebacks(tmp_path):
    (tmp_path / "t.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad"><failure message="assert 1 == 2">Traceback line'
        '</failure></testcase><testcase classname="tests.test_a" name="test_gpu"><skipped message="needs a CUDA GPU"'
        '/></testcase></testsuite></testsuites>')
    tests = campaign.read_junit(tmp_path / "t.xml")
    assert tests["counts"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert tests["failures"] == [{"test": "tests.test_a::test_bad", "kind": "failure", "message": "assert 1 == 2",
                                  "traceback": "Traceback line"}]
    assert tests["skipped"] == [{"test": "tests.test_a::test_gpu", "reason": "needs a CUDA GPU"}]


@pytest.mark.slow
@pytest.mark.xdist_group("campaign throughput")
def test_throughput_measures_the_peers_eager_and_compiled(throughput):
    result, record = throughput
    for label in ("eager", "compiled"):
        peers = record["bench_compare"][label]["peers"]["sizes"]["transformer_small"]
        assert set(peers) == {"interlayer", "torch.nn.Transformer", "x-transformers"}
        assert all(p["target_tokens_per_s"] > 0 and 0 < p["mfu"] for p in peers.values())
    assert record["bench_compare"]["compiled"]["compile_backend"] == "eager"
    assert set(record["targets"]) == set(campaign.TARGETS)
    assert result.returncode == 0, result.stdout + result.stderr
    gpu = record["bench_gpu"]
    assert "peers" not in gpu and gpu["methods"]["causal PA compiled"]  # --tiny: the peers part times the peers
    kernels = record["bench_kernels"]["cases"]
    assert {"cross-entropy", "logits-attention", "pa-maps", "hc-dynamic"} <= set(kernels)
    assert all(row["error"] < 1e-4 for row in kernels.values())


@pytest.mark.slow
@pytest.mark.xdist_group("campaign peers")
def test_the_gpu_peers_step_interlayer_as_its_trainer_does(peers):
    """bench_gpu.py's peers (the peers part's run; on a GPU the throughput part runs them too): interlayer eager,
    compiled, with the task's loss terms and as ``model(input_ids, labels=)``, beside the minimal GPT-2,
    transformers' and x-transformers'."""
    rows = peers[1]["bench_gpu_peers"]["peers"]
    assert {"interlayer eager", "interlayer compiled", "interlayer task loss compiled", "interlayer labels= compiled",
            "minimal-gpt2 compiled", "hf-gpt2 compiled", "x-transformers compiled"} <= set(rows)
    assert all(row["mfu"] > 0 and row["bound_ms"] > 0 for name, row in rows.items() if name.startswith("interlayer"))


@pytest.mark.slow
def test_paper_trains_baseline_and_causal_pa_and_times_generation(tmp_path):
    result, record = dry_run("paper", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("baseline", "causal_pa"):
        assert record["runs"][name]["results"]["steps"] == 4 and record["runs"][name]["results"]["valid_loss"] > 0
    runs = {name: record["runs"][name]["results"] for name in ("baseline", "causal_pa")}
    assert runs["causal_pa"]["parameters"] > runs["baseline"]["parameters"]  # PA's prediction convolutions
    settings = record["generation"]["settings"]
    assert {s["cache"] for s in settings} == {True, False} and all(s["same_tokens"] for s in settings)


@pytest.mark.slow
def test_a_step_past_its_limit_is_killed_with_its_children_and_recorded(tmp_path):
    run = campaign.Campaign("setup", "cpu", True, tmp_path, budget=60)
    pid_file = tmp_path / "child.pid"
    entry = run.step("sleeper", ["bash", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], limit=5.5)
    assert entry["status"] == "timed out" and entry["seconds"] < 10
    child = int(pid_file.read_text())

    def gone() -> bool:
        try:
            return "zombie" in Path(f"/proc/{child}/status").read_text().lower()
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 5  # a killed process dies when next scheduled: on a loaded machine, a moment later
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()
    assert not run.record["ok"] and json.loads((tmp_path / "setup.json").read_text())["steps"][0]["timed_out"]


def test_an_unknown_part_is_refused(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "benchmark"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown part 'benchmark'" in result.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("campaign peers")
def test_peers_times_the_peers_decoding_and_the_shared_kernel_methods(peers):
    """The second short slot: bench_gpu's peers and decode, then mHC, DenseFormer and MUDDFormer against the plain
    model (on a GPU in auto and triton mode)."""
    result, record = peers
    assert result.returncode == 0, result.stdout + result.stderr
    assert record["bench_gpu_peers"]["peers"]
    measured = record["bench_gpu"]["methods"]
    for name in ("mHC", "DenseFormer", "MUDDFormer"):
        assert any(key.startswith(name) for key in measured), sorted(measured)


@pytest.mark.slow
@pytest.mark.xdist_group("campaign peers")
def test_decoding_is_timed_three_ways_with_the_same_tokens(peers):
    """bench_gpu.py's decode (the peers part's run): recomputing the prefix, the KV cache and the compiled cached
    step, at batch 1 and 8, each giving the tokens the recomputation gives."""
    decode = peers[1]["bench_gpu_peers"]["decode"]
    assert {(d["batch"], d["setting"]) for d in decode} == {
        (b, s) for b in (1, 8) for s in ("recompute", "cache", "cache compiled")}
    assert all(d["same_tokens"] for d in decode)
