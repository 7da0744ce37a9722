"""benchmarks/sass_audit.py, the offline machine-code audit, on kernels small enough to reason about
(tests/helpers/audit_kernels.py): executed counts follow the launch (a loop's trip count is the launch's, not a
number typed in), replicated MMA work and 16-bit scalar loads are found where they are and not where they are not,
and a line the audit could not attribute is refused."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
BIN = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin"
TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.xdist_group("sass audit")  # the module's one compile (audits), on one worker of make test


@pytest.fixture(scope="session")  # once per worker, whatever xdist interleaves
def audits() -> dict:
    if not (BIN / "nvdisasm").is_file():
        pytest.skip("this Triton build has no NVIDIA tools (nvdisasm)")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "helpers.audit_kernels"], cwd=TESTS, env=env, capture_output=True,
                          text=True, timeout=600)
    if "launch internals" in done.stderr or "create_function_from_signature" in done.stderr:
        pytest.skip("this Triton lacks the launch internals the audit reads (3.9's)")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_loop_runs_as_often_as_the_launch_says(audits):
    short, long, longer = (audits[f"rows {n}"] for n in (8, 16, 32))
    assert long["instructions"] > short["instructions"]
    # the loop's share doubles with its trip count: equal steps from 8 to 16 and from 16 to 32 rows
    assert longer["instructions"] - long["instructions"] == pytest.approx(
        2 * (long["instructions"] - short["instructions"]))
    assert long["bytes_loaded"] == 16 * 1024 * 2 and long["bytes_stored"] == 1024 * 4


@pytest.mark.slow
def test_vector_loads_pass_and_one_element_off_is_counted_as_scalar_16_bit_loads(audits):
    assert audits["rows 8"]["scalar_16bit_loads_in_loops"] == 0
    assert audits["shifted"]["scalar_16bit_loads_in_loops"] > 0


@pytest.mark.slow
def test_warps_that_repeat_each_others_products_are_replication(audits):
    one, four = audits["product 1 warp"], audits["product 4 warps"]
    assert one["mma_work"] == one["mma_work_needed"] == 16 * 16 * 16
    assert four["mma_work"] > four["mma_work_needed"]  # a 16 x 16 tile has no work for four warps to share


@pytest.mark.slow
def test_two_calls_on_one_line_are_refused(audits):
    assert "one call a line" in audits["twice"]["refused"]


def test_a_kernel_compiled_in_another_checkout_names_the_shadowed_file(tmp_path):
    """Triton's cache keys a kernel by its source and lines, not its folder: a cubin cached by another checkout names
    that checkout's path, and its lines must still meet the shadow's (CI once counted no loop at all)."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    try:
        import sass_audit

        from interlayer.kernels import cross_entropy_triton as module
    finally:
        sys.path.pop(0)
    sass_audit.Shadower(module._forward)
    elsewhere = str(tmp_path / "old-checkout" / "kernels" / Path(module.__file__).name)
    assert sass_audit.normalise(((elsewhere, 1),))[0][0] == module.__file__
    assert sass_audit.normalise(((str(tmp_path / "other.py"), 1),))[0][0] == str(tmp_path / "other.py")
