"""The GPU campaign's parts (docs/gpu-campaign.md); run through ``campaign.sh``, which installs the carried wheels
first and points ``PYTHONPATH`` at them and at ``src/``.

Each part is one device command of at most 10 minutes, so each runs its steps as child processes under one
deadline (``--budget``, default 570 s): a step gets what is left of it, at most its own limit, and a step that runs
out is killed with its whole process group and recorded as timed out. ``PART.log`` gets every step's output;
``PART.json`` is rewritten after every step, so a part killed from outside still leaves what it measured.
Intermediate files (run folders, JUnit XML, the benchmarks' own JSON) go to a scratch folder outside the results
folder, which keeps within the device's limit on the files that come back.

``--tiny`` runs every step at toy sizes (the CPU dry run that tests/test_gpu_campaign.py drives); it changes sizes,
never which steps run.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Literal, Optional

ROOT = Path(__file__).resolve().parents[2]
Part = Literal["setup", "suite", "throughput", "paper", "kernels", "peers"]
PARTS: tuple[Part, ...] = ("setup", "suite", "throughput", "paper", "kernels", "peers")

# import name -> what provides it; the campaign's steps need every one (x_transformers: bench_compare's third peer)
NEEDED = {"torch": "torch", "numpy": "numpy", "yaml": "PyYAML", "safetensors": "safetensors",
          "tokenizers": "tokenizers", "sacrebleu": "sacrebleu", "tqdm": "tqdm", "tensorboard": "tensorboard",
          "matplotlib": "matplotlib", "optuna": "optuna (carried wheel)", "transformers": "transformers",
          "pytest": "pytest", "x_transformers": "x-transformers (carried wheel)", "interlayer": "src/ (PYTHONPATH)"}

# The short slot's part (issue 48): the Triton kernels' tests, each kernel alone against its reference, then the
# methods that run on them, compiled, with the kernels forced on. It needs none of the carried wheels.
KERNEL_TESTS = ["tests/test_kernels_logits_attention.py", "tests/test_kernels_predictive_maps.py",
                "tests/test_kernels_causal_logits.py",
                "tests/test_kernels_hyper_connections.py", "tests/test_kernels_cross_entropy.py",
                "tests/test_kernels_dispatch.py"]
TINY_KERNEL_TESTS = ["tests/test_kernels_dispatch.py"]
KERNEL_METHODS = ["causal PA", "Res-Transformer", "hyper-connections dynamic", "hyper-connections static"]
PEER_METHODS = ["mHC", "DenseFormer", "MUDDFormer"]  # the second short slot's methods (``peers``)
CARRIED = {"optuna", "x_transformers"}  # what only the carried wheels provide

# The suite's tests that carry the GPU checks, by a fragment of their JUnit id: on the GPU machine the
# engine's tests default to train.device=auto, i.e. CUDA, so the precision tests train there.
GPU_CHECKS = {
    "bf16 training": "test_precision_runs_the_steps_in_that_dtype_and_keeps_the_weights_in_fp32[bf16",
    "fp16 training": "test_precision_runs_the_steps_in_that_dtype_and_keeps_the_weights_in_fp32[fp16",
    "fp16 scaler resume": "test_fp16_scaler_state_survives_a_resume",
    "bf16 training on CUDA": "test_bf16_training_on_the_gpu_gives_finite_losses",
    "cross-device resume": "test_a_run_saved_on_one_device_resumes_on_the_other",
    "inductor compile on CUDA, zero graph breaks": "test_models_compile_with_inductor_on_cuda_in_one_graph",
    "graph breaks (every model, dynamo)": "test_every_model_compiles_without_graph_breaks",
    "NCCL across 2 GPUs": "test_two_processes_equal_one_process_with_the_same_global_batch[nccl]",
}
# The suite runs in two steps, so that the files carrying the GPU checks report whatever the rest does: these files
# first, then every other file. The tiny dry run keeps both steps at a few tests each: the GPU checks that exist on a
# CPU (the CUDA ones skip with their reason), and one quick test of the rest.
GPU_FILES = ["tests/test_training_state.py", "tests/test_distributed.py", "tests/test_fast_paths.py",
             "tests/test_engine.py", "tests/test_device.py", "tests/test_generation_cache.py"]
TINY_SUITE = ["tests/test_training_state.py", "tests/test_device.py", "-k",
              "precision_runs or bf16_training_on_the_gpu or resumes_on_the_other or inductor_on_cuda "
              "or graph_breaks and transformer_small"]
TINY_REST = ["tests/test_engine.py", "-k", "learning_rate_schedules"]
# pytest-xdist workers and the threads each may use: 16 cores give 8 workers of 2 threads. Without a thread limit
# every worker's torch takes all the cores and the workers fight over them (the first GPU run, 14 workers, had
# done 55% of the suite after 230 s). A test that runs past TEST_TIMEOUT seconds fails with its traceback
# (pytest-timeout, where installed) instead of holding its worker to the step's end.
MAX_WORKERS, TEST_TIMEOUT = 8, 240

# nanoGPT's shakespeare_char recipe is `interlayer train lm`'s default (papers/transformer.py, tasks/
# language_modeling.py); the campaign adds bf16 and compile, as nanoGPT's own run does
PA_SETS = ["--set", "predictive.conv_layers=1"]  # causal Predictive Attention (docs/language-modeling.md)
TINY_LM_SETS = [f"--set={kv}" for kv in ("d_model=32", "n_heads=2", "d_ffn=64", "enc_layers=2", "data.block_size=32",
                                         "train.max_tokens=128", "train.max_steps=4", "data.eval_interval=2",
                                         "data.eval_blocks=2", "train.warmup_steps=1")]
# the targets for the GPU part (one H100, bf16, with compile)
TARGETS = {"mfu_transformer_base": 0.45, "speedup_vs_torch": 1.2, "speedup_vs_x_transformers": 1.1}


class Campaign:
    """One part's steps, its log and its JSON record."""

    def __init__(self, part: Part, device: str, tiny: bool, out: Path, budget: float) -> None:
        self.part, self.device, self.tiny, self.out = part, device, tiny, out
        self.deadline = time.monotonic() + budget
        self.scratch = Path(tempfile.mkdtemp(prefix=f"interlayer-campaign-{part}-"))
        self.log_path, self.json_path = out / f"{part}.log", out / f"{part}.json"
        self.record: dict[str, Any] = {"part": part, "device": device, "tiny": tiny, "budget_s": budget,
                                       "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                                       "host": platform.node(), "python": sys.version.split()[0], "scratch":
                                       str(self.scratch), "steps": [], "ok": True}

    def log(self, text: str) -> None:
        print(text, flush=True)
        with self.log_path.open("a") as log:
            log.write(text + "\n")

    def save(self) -> None:
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record, indent=2, default=str) + "\n")
        tmp.replace(self.json_path)

    def fail(self, reason: str) -> None:
        """Marks the part failed for a reason no step's exit status shows."""
        self.record["ok"] = False
        self.record.setdefault("problems", []).append(reason)
        self.log(f"!! {reason}")
        self.save()

    def step(self, name: str, command: list[str], limit: float, env: Optional[dict[str, str]] = None
             ) -> dict[str, Any]:
        """Runs ``command`` from the repository root, its output appended to the log, for at most ``limit``
        seconds and never past the part's deadline; records and returns its exit status and time."""
        allowed = min(limit, self.deadline - time.monotonic())
        entry: dict[str, Any] = {"name": name, "command": command, "limit_s": round(allowed, 1)}
        self.record["steps"].append(entry)
        if allowed < 5:
            entry.update(status="not run", reason="the part's time budget is spent")
            self.fail(f"{name}: not run, the part's time budget is spent")
            return entry
        self.log(f"\n== {name} (at most {allowed:.0f} s): {' '.join(command)}")
        started = time.monotonic()
        with self.log_path.open("a") as log:
            process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={
                **os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)
            try:
                rc = process.wait(timeout=allowed)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the step's own process group: torchrun's workers too
                rc = process.wait()
                entry["timed_out"] = True
        entry.update(rc=rc, seconds=round(time.monotonic() - started, 2),
                     status="ok" if rc == 0 else "timed out" if entry.get("timed_out") else "failed")
        self.log(f"== {name}: {entry['status']} (exit {rc}) in {entry['seconds']} s")
        if rc != 0:
            self.fail(f"{name}: {entry['status']} (exit {rc}); its output is in {self.log_path.name}")
        self.save()
        return entry

    def python(self, *args: str) -> list[str]:
        return [sys.executable, *args]


# -- the environment, in every part ---------------------------------------------------------------------------
def check_imports(modules: dict[str, str]) -> dict[str, str]:
    """``{module: version or 'FAILED: error'}`` for each module, importing each in this process."""
    found = {}
    for module, provider in modules.items():
        try:
            imported = importlib.import_module(module)
            found[module] = str(getattr(imported, "__version__", "imported"))
        except Exception as error:  # any import failure is a finding to report, not a crash
            found[module] = f"FAILED ({provider}): {type(error).__name__}: {error}"
    return found


def environment(campaign: Campaign) -> None:
    """Imports, torch/CUDA versions and the device; a needed module that does not import fails the part."""
    needed = {k: v for k, v in NEEDED.items() if campaign.part != "kernels" or k not in CARRIED}
    imports = check_imports(needed)
    campaign.record["imports"] = imports
    missing = [f"{module}: {result}" for module, result in imports.items() if result.startswith("FAILED")]
    if missing:
        campaign.fail("needed modules do not import: " + "; ".join(missing))
    import torch

    cuda = torch.cuda.is_available()
    campaign.record["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
                                "device_name": torch.cuda.get_device_name(0) if cuda else None,
                                "bf16_supported": cuda and torch.cuda.is_bf16_supported()}
    if campaign.device.startswith("cuda") and not cuda:
        campaign.fail(f"--device {campaign.device} but torch sees no CUDA device")
    campaign.save()


# -- the parts ------------------------------------------------------------------------------------------------
def setup(campaign: Campaign) -> None:
    """nvidia-smi and a measured bf16 matrix-product rate (the ceiling METHOD.md asks for beside the datasheet's)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        result = subprocess.run([smi], capture_output=True, text=True, timeout=60)
        campaign.record["nvidia_smi"] = result.stdout + result.stderr
        campaign.log(result.stdout)
    elif campaign.device.startswith("cuda"):
        campaign.fail("nvidia-smi is not on the PATH")
    else:
        campaign.record["nvidia_smi"] = None
    import torch

    device = torch.device(campaign.device)
    n = 512 if campaign.tiny else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for repeat in range(13):  # 3 warm-ups, then the median of 10
        sync()
        started = time.perf_counter()
        a @ b
        sync()
        if repeat >= 3:
            times.append(time.perf_counter() - started)
    times.sort()
    median = (times[4] + times[5]) / 2
    campaign.record["matmul"] = {"n": n, "dtype": str(dtype), "median_s": median, "tflops": 2 * n ** 3 / median / 1e12}
    campaign.save()


def pytest_options(tiny: bool, cores: Optional[int]) -> tuple[list[str], dict[str, str]]:
    """pytest's parallelism and per-test timeout, and the thread limits of its workers' environment."""
    if tiny or importlib.util.find_spec("xdist") is None:
        return [], {}
    workers = max(1, min(MAX_WORKERS, (cores or 2) // 2))
    threads = str(max(1, (cores or 2) // workers))
    timeout = [f"--timeout={TEST_TIMEOUT}"] if importlib.util.find_spec("pytest_timeout") is not None else []
    return ["-n", str(workers), *timeout], {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def suite(campaign: Campaign) -> None:
    """The whole test suite in two steps (the files of the GPU checks, then the rest; their CUDA-only tests run
    where CUDA is), then one process of the torchrun path with NCCL on a GPU (gloo on the CPU)."""
    options, env = pytest_options(campaign.tiny, os.cpu_count())
    rest = [f"--ignore={path}" for path in GPU_FILES] + ["tests"]
    reports = []
    for name, selection, limit in (("pytest GPU files", TINY_SUITE if campaign.tiny else GPU_FILES, 200),
                                   ("pytest the rest", TINY_REST if campaign.tiny else rest, 300)):
        junit = campaign.scratch / f"junit-{len(reports)}.xml"
        campaign.step(name, campaign.python("-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                                            "--durations=15", f"--junitxml={junit}", *options, *selection),
                      limit=limit, env=env)
        if junit.is_file():
            reports.append(read_junit(junit))
        else:
            campaign.fail(f"{name}: pytest wrote no JUnit report")
    if reports:
        campaign.record["tests"] = merge_reports(reports)
        campaign.record["gpu_checks"] = gpu_checks(campaign.record["tests"])
    run_dir = campaign.scratch / "torchrun"
    sets = TINY_LM_SETS if campaign.tiny else TINY_LM_SETS + ["--set=d_model=128", "--set=n_heads=4"]
    campaign.step("torchrun --nproc_per_node 1", campaign.python(
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "interlayer.cli", "train",
        "lm", "--device", campaign.device, "--run-dir", str(run_dir), "--no-progress", *sets), limit=60,
        env={"NCCL_DEBUG": "VERSION"})
    text = campaign.log_path.read_text()
    campaign.record["nccl_version_line"] = next((line for line in text.splitlines() if "NCCL version" in line), None)
    if campaign.device.startswith("cuda") and campaign.record["nccl_version_line"] is None:
        campaign.fail("the torchrun step printed no 'NCCL version' line: NCCL was not initialised")
    campaign.save()


def read_junit(path: Path) -> dict[str, Any]:
    """Counts, failures with their tracebacks, and skips with their reasons, from pytest's JUnit XML."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures, skipped, outcomes = [], [], {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        found = {child.tag: child for child in case if child.tag in ("failure", "error", "skipped")}
        if "failure" in found or "error" in found:
            kind = "failure" if "failure" in found else "error"
            counts["failed" if kind == "failure" else "errors"] += 1
            failures.append({"test": test_id, "kind": kind, "message": found[kind].get("message"),
                             "traceback": found[kind].text})
            outcomes[test_id] = kind
        elif "skipped" in found:
            counts["skipped"] += 1
            skipped.append({"test": test_id, "reason": found["skipped"].get("message")})
            outcomes[test_id] = "skipped: " + str(found["skipped"].get("message"))
        else:
            counts["passed"] += 1
            outcomes[test_id] = "passed"
    return {"counts": counts, "failures": failures, "skipped": skipped, "outcomes": outcomes}


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The JUnit reports of several pytest runs as one (counts added, lists joined)."""
    merged: dict[str, Any] = {"counts": {key: 0 for key in reports[0]["counts"]}, "failures": [], "skipped": [],
                              "outcomes": {}}
    for report in reports:
        for key, value in report["counts"].items():
            merged["counts"][key] += value
        for key in ("failures", "skipped"):
            merged[key] += report[key]
        merged["outcomes"].update(report["outcomes"])
    return merged


def gpu_checks(tests: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The outcome of each test that carries one of the issue's GPU checks (none collected: 'not collected')."""
    return {check: {test: outcome for test, outcome in tests["outcomes"].items() if fragment in test}
            or {fragment: "not collected"} for check, fragment in GPU_CHECKS.items()}


def throughput(campaign: Campaign) -> None:
    """bench_kernels.py (each Triton kernel against its reference path, alone), bench_gpu.py (GPT-2 small against
    its peers, every method against the plain model, each beside the cost model's bound), then bench_compare.py
    eager and compiled at the encoder-decoder sizes."""
    path = campaign.scratch / "bench_kernels.json"
    on_cpu = not campaign.device.startswith("cuda")  # the kernels then run under Triton's interpreter
    campaign.step("bench_kernels", campaign.python(
        "benchmarks/bench_kernels.py", "--device", campaign.device, *(["--tiny"] if campaign.tiny else []),
        "--json", str(path)), limit=120, env={"TRITON_INTERPRET": "1"} if on_cpu else None)
    if path.is_file():
        campaign.record["bench_kernels"] = json.loads(path.read_text())
    path = campaign.scratch / "bench_gpu.json"
    # the dry run times bench_gpu's peers once, in the peers part (the same code): here they cost the suite 40 s
    parts = "methods" if campaign.tiny else "peers,methods"
    campaign.step("bench_gpu", campaign.python(
        "benchmarks/bench_gpu.py", "--device", campaign.device, "--parts", parts,
        *([] if on_cpu else ["--kernel-modes", "auto,triton"]),  # on a GPU, each kernel beside what users get
        *(["--tiny"] if campaign.tiny else []), "--budget", "330", "--json", str(path)), limit=400)
    if path.is_file():
        campaign.record["bench_gpu"] = json.loads(path.read_text())
    campaign.save()
    precision = "bf16" if campaign.device.startswith("cuda") else "fp32"
    if campaign.tiny:  # a CPU's inductor build takes minutes; the eager backend traces the same graphs
        size, backend = ["--sizes", "transformer_small", "--batch", "2", "--length", "8", "--rounds", "1",
                         "--steps", "1"], ["--compile-backend", "eager"]
    else:
        size, backend = ["--sizes", "transformer_iwslt_de_en", "transformer_base", "--batch", "128", "--length",
                         "128", "--rounds", "5", "--steps", "5"], []
    results: dict[str, Any] = {}
    for label, flags, limit in (("eager", [], 120), ("compiled", ["--compile", *backend], 300)):
        path = campaign.scratch / f"bench_compare_{label}.json"
        campaign.step(f"bench_compare {label}", campaign.python(
            "benchmarks/bench_compare.py", "--device", campaign.device, "--precision", precision, "--part", "1",
            *size, *flags, "--json", str(path)), limit=limit)
        if path.is_file():
            results[label] = json.loads(path.read_text())
    campaign.record["bench_compare"] = results
    if "compiled" in results:
        campaign.record["targets"] = targets(results["compiled"])
    campaign.save()


def kernels(campaign: Campaign) -> None:
    """The short slot (at most 7 minutes of one GPU): the kernels' tests compiled on the device, each kernel alone
    against its reference (bench_kernels.py), then causal PA, Res and both hyper-connections compiled at GPT-2 small
    with their kernels forced on (``triton``), profiled, against the plain model in the same rounds."""
    options, env = pytest_options(campaign.tiny, os.cpu_count())
    junit = campaign.scratch / "junit-kernels.xml"
    campaign.step("pytest kernels", campaign.python(
        "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--maxfail=10", "--durations=10",
        f"--junitxml={junit}", *options, *(TINY_KERNEL_TESTS if campaign.tiny else KERNEL_TESTS)),
        limit=120, env=env)
    if junit.is_file():
        campaign.record["tests"] = read_junit(junit)
    else:
        campaign.fail("pytest kernels: pytest wrote no JUnit report")
    on_cpu = not campaign.device.startswith("cuda")
    path = campaign.scratch / "bench_kernels.json"
    campaign.step("bench_kernels", campaign.python(
        "benchmarks/bench_kernels.py", "--device", campaign.device, *(["--tiny"] if campaign.tiny else []),
        "--json", str(path)), limit=60, env={"TRITON_INTERPRET": "1"} if on_cpu else None)
    if path.is_file():
        campaign.record["bench_kernels"] = json.loads(path.read_text())
    campaign.save()
    path = campaign.scratch / "bench_gpu.json"
    left = campaign.deadline - time.monotonic()
    campaign.step("bench_gpu methods", campaign.python(
        "benchmarks/bench_gpu.py", "--device", campaign.device, "--parts", "methods", "--methods", *KERNEL_METHODS,
        *([] if on_cpu else ["--kernel-modes", "triton", "--profile"]), *(["--tiny"] if campaign.tiny else []),
        "--budget", str(max(10, round(left - 60))), "--json", str(path)), limit=left)
    if path.is_file():
        campaign.record["bench_gpu"] = json.loads(path.read_text())
    campaign.save()


def peers(campaign: Campaign) -> None:
    """The second short slot (at most 7 minutes of one GPU, after ``kernels``): GPT-2 small against its compiled
    peers and the decoding speed with the KV cache (bench_gpu.py's peers and decode), then the cross-layer methods
    whose kernels are shared or that have none (mHC on the hyper-connection kernels, DenseFormer, MUDDFormer),
    compiled against the plain model in the same rounds, in ``auto`` and ``triton`` mode."""
    on_cpu = not campaign.device.startswith("cuda")
    path = campaign.scratch / "bench_gpu_peers.json"
    campaign.step("bench_gpu peers and decode", campaign.python(
        "benchmarks/bench_gpu.py", "--device", campaign.device, "--parts", "peers,decode",
        *(["--tiny"] if campaign.tiny else []), "--budget", "170", "--json", str(path)), limit=200)
    if path.is_file():
        campaign.record["bench_gpu_peers"] = json.loads(path.read_text())
    campaign.save()
    path = campaign.scratch / "bench_gpu_methods.json"
    left = campaign.deadline - time.monotonic()
    campaign.step("bench_gpu methods", campaign.python(
        "benchmarks/bench_gpu.py", "--device", campaign.device, "--parts", "methods", "--methods", *PEER_METHODS,
        *([] if on_cpu else ["--kernel-modes", "auto,triton"]), *(["--tiny"] if campaign.tiny else []),
        "--budget", str(max(10, round(left - 60))), "--json", str(path)), limit=left)
    if path.is_file():
        campaign.record["bench_gpu"] = json.loads(path.read_text())
    campaign.save()


def targets(compiled: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets beside what the compiled bench_compare run measured (targets at transformer_base)."""
    sizes = compiled["peers"]["sizes"]
    size = "transformer_base" if "transformer_base" in sizes else next(iter(sizes))  # the dry run's toy size
    ours = sizes[size]["interlayer"]
    measured = {"mfu_transformer_base": ours["mfu"], "speedup_vs_torch": ours["speedup_vs_torch"],
                "speedup_vs_x_transformers": ours["speedup_vs_x_transformers"]}
    return {key: {"size": size, "target": TARGETS[key], "measured": value, "met": value >= TARGETS[key]}
            for key, value in measured.items()}


def paper(campaign: Campaign) -> None:
    """nanoGPT's shakespeare_char recipe for the baseline and causal PA, then generation speed with the cache."""
    if campaign.tiny:
        common = ["--device", campaign.device, "--precision", "fp32", *TINY_LM_SETS]
        budgets = {"baseline": None, "causal_pa": None}
    else:  # train.max_minutes stops training (validation excluded) in time to score and sample within the part
        common = ["--device", campaign.device, "--precision", "bf16", "--compile"]
        budgets = {"baseline": 4.0, "causal_pa": 2.5}
    runs: dict[str, Any] = {}
    for name, extra, limit in (("baseline", [], 330), ("causal_pa", PA_SETS, 230)):
        run_dir = campaign.scratch / name
        budget = [] if budgets[name] is None else ["--max-minutes", str(budgets[name])]
        entry = campaign.step(f"train lm {name}", campaign.python(
            "-m", "interlayer.cli", "train", "lm", "--run-dir", str(run_dir), "--no-progress", *common, *budget,
            *extra), limit=limit)
        results = run_dir / "results.json"
        runs[name] = {"wall_s": entry.get("seconds"), "run_dir": str(run_dir),
                      "results": json.loads(results.read_text()) if results.is_file() else None,
                      "train_csv_tail": tail(run_dir / "train.csv", 3), "valid_csv": tail(run_dir / "valid.csv", 25)}
        campaign.record["runs"] = runs
        campaign.save()
    path = campaign.scratch / "generate.json"
    size = ["--prompt-tokens", "4", "--new-tokens", "8", "--batches", "1", "--rounds", "1"] if campaign.tiny else [
        "--new-tokens", "200", "--batches", "1,8,64", "--rounds", "3"]
    campaign.step("bench_generate", campaign.python(
        "benchmarks/bench_generate.py", "--checkpoint", str(campaign.scratch / "baseline" / "best"), "--device",
        campaign.device, *size, "--json", str(path)), limit=90)
    if path.is_file():
        campaign.record["generation"] = json.loads(path.read_text())
    campaign.save()


def tail(path: Path, lines: int) -> Optional[list[str]]:
    """The header and last ``lines`` lines of a CSV log, or None when the run wrote none."""
    if not path.is_file():
        return None
    text = path.read_text().splitlines()
    return text[:1] + text[1:][-lines:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for the dry run")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: the CPU dry run")
    parser.add_argument("--out", type=Path, required=True, help="results folder: PART.log and PART.json")
    parser.add_argument("--budget", type=float, default=570.0,
                        help="seconds for the whole part (default 570: inside a device command's 600)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    campaign = Campaign(args.part, args.device, args.tiny, args.out, args.budget)
    started = time.monotonic()
    environment(campaign)
    {"setup": setup, "suite": suite, "throughput": throughput, "paper": paper, "kernels": kernels,
     "peers": peers}[args.part](campaign)
    campaign.record["seconds"] = round(time.monotonic() - started, 1)
    campaign.save()
    summary = {key: campaign.record.get(key) for key in ("part", "ok", "seconds", "problems", "targets")}
    if "tests" in campaign.record:
        summary["tests"] = campaign.record["tests"]["counts"]
        summary["failed_tests"] = [f["test"] for f in campaign.record["tests"]["failures"]]
    campaign.log("\n" + json.dumps(summary, indent=2, default=str))
    sys.exit(0 if campaign.record["ok"] else 1)


if __name__ == "__main__":
    main()
