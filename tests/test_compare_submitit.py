"""`compare --launcher submitit` without a cluster: submitit's debug executor (in this process: a job that fails, one
that is cancelled, and the rerun that submits only those two), its local executor (a 2 x 2 comparison whose
`compare` process is killed and restarted: it follows the jobs again and submits no run twice), the options'
mapping onto sbatch, and the job body's time-limit stop."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import SRC
from helpers.compare import compare_sets
from interlayer.cli import main
from interlayer.compare import launcher as compare_launcher
from interlayer.compare.launcher import SubmititRunner
from interlayer.errors import ConfigError
from interlayer.training.cluster import (
    LauncherSettings,
    attach,
    job_body,
    job_identity,
    job_state,
    make_executor,
    parse_slurm_sets,
    parse_time,
    remove_stray_folder,
)

submitit = pytest.importorskip("submitit")


def _args(corpus, out, *extra):
    sets = compare_sets(corpus, ["train.max_steps=3", "train.threads=1"])
    return ["compare", "--task", "translation", "--variants", "baseline,pa", "--seeds", "2", "--output", str(out),
            "--launcher", "submitit", *extra, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]


def _submissions(out):
    runs = json.loads((out / "jobs.json").read_text())["runs"]
    return {name: len(entry["submissions"]) for name, entry in runs.items()}


@pytest.mark.slow
def test_debug_jobs_a_failure_a_cancellation_and_the_rerun_that_submits_only_them(corpus, tmp_path, monkeypatch,
                                                                                  capsys):
    out = tmp_path / "cmp"
    real = compare_launcher.run_job

    def run_job(job):
        if job["run_dir"].endswith("pa-s1"):
            raise RuntimeError("the GPU fell off the bus")
        return real(job)

    submit = SubmititRunner._submit

    def submit_then_cancel(self, items):
        submit(self, items)
        if "baseline-s2" in self.tracked:  # scancel right after submission
            self.tracked["baseline-s2"].job.cancel()

    monkeypatch.setattr(compare_launcher, "run_job", run_job)
    monkeypatch.setattr(SubmititRunner, "_submit", submit_then_cancel)
    assert main(_args(corpus, out, "--slurm-cluster", "debug")) == 1  # a run failed
    printed = capsys.readouterr().out
    assert "compare: submitted 4 run(s) (submitit debug jobs (in this process): 1 GPU(s) per run): jobs DEBUG_" \
           in printed
    assert "[3/4] baseline seed 2: CANCELLED (job DEBUG_" in printed
    assert "[2/4] pa seed 1: FAILED (job DEBUG_" in printed and "RuntimeError: the GPU fell off the bus" in printed
    status = json.loads((out / "status.json").read_text())
    assert {name: s["status"] for name, s in status.items()} == {
        "baseline-s1": "finished", "pa-s1": "failed", "baseline-s2": "cancelled", "pa-s2": "finished"}
    report = (out / "report.md").read_text()
    assert "**Partial report**: 2 run(s) not finished (baseline-s2, pa-s1)" in report
    assert re.search(r"\| baseline-s2 +\| cancelled: job DEBUG_\d+ was cancelled", report)
    assert re.search(r"\| pa-s1 +\| failed: job DEBUG_\d+: RuntimeError: the GPU fell off the bus", report)
    assert "device: auto on submitit debug jobs (in this process): 1 GPU(s) per run" in report

    monkeypatch.undo()
    assert main(_args(corpus, out, "--slurm-cluster", "debug")) == 0
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, skipped") == 2 and "compare: submitted 2 run(s)" in printed
    assert _submissions(out) == {"baseline-s1": 1, "pa-s1": 2, "baseline-s2": 2, "pa-s2": 1}
    assert all((out / "runs" / name / "results.json").is_file() for name in _submissions(out))
    assert "Partial report" not in (out / "report.md").read_text()


def _wait_for(predicate, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_local_jobs_survive_a_killed_compare_and_no_run_is_submitted_twice(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = _args(corpus, out, "--slurm-cluster", "local", "--slurm-gpus-per-run", "0", "--slurm-time", "20")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    first = subprocess.Popen([sys.executable, "-m", "interlayer.cli", *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: (out / "jobs.json").is_file() or first.poll() is not None, 300, "the jobs to be submitted")
        assert first.poll() is None, first.stdout.read()
        first.send_signal(signal.SIGKILL)  # nothing is forwarded: the jobs go on by themselves
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    submitted = json.loads((out / "jobs.json").read_text())["runs"]
    assert len(submitted) == 4 and not (out / "report.md").exists()

    assert main(args) == 0  # the restart follows the jobs already submitted (or finds them finished)
    printed = capsys.readouterr().out
    followed = printed.count("submitted by an earlier invocation), followed again")
    # the kill came right after the submission: the jobs were still starting (a fresh interpreter each), so the
    # restart found some running and followed them; the others had finished and were skipped
    assert followed >= 1 and followed + printed.count("finished earlier, skipped") == 4, printed
    assert "compare: submitted" not in printed
    assert _submissions(out) == {name: 1 for name in submitted}  # never a second submission
    assert all((out / "runs" / name / "results.json").is_file() for name in submitted)
    assert not (out / "slurm" / "%j").exists()  # the local controllers' unformatted folder, removed
    report = (out / "report.md").read_text()
    assert "Primary test: the paired t-test of the per-seed differences for pa (paired over seeds 1, 2" in report
    logs = (out / "logs" / "pa-s2.log").read_text()
    assert logs.count("submitted pa-s2") == 1 and '"status": "finished"' in logs


def test_the_options_become_sbatch_lines(tmp_path, monkeypatch):
    assert parse_time("90") == 90 and parse_time("1:30:00") == 90 and parse_time("2-00:00:00") == 2880
    assert parse_time("1:30") == 2  # sbatch: minutes:seconds, the seconds rounded up
    with pytest.raises(ConfigError, match="give SLURM's time"):
        parse_time("soon")
    assert parse_slurm_sets(["mem_gb=64", "constraint=a100", "exclusive=true"]) == {
        "mem_gb": 64, "constraint": "a100", "exclusive": True}
    with pytest.raises(ConfigError, match="--slurm-set expects KEY=VALUE"):
        parse_slurm_sets(["mem_gb"])
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # a login node, as far as we can tell
    settings = LauncherSettings(partition="gpu", gpus_per_run=2, time_minutes=240, array_parallelism=8,
                                extra={"mem_gb": 64, "constraint": "a100"})
    executor = make_executor(settings, tmp_path / "slurm", "compare-gpt2")
    script = executor._executor._make_submission_file_text("python -m submitit.core._submit", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --nodes=1", "#SBATCH --time=240", "#SBATCH --mem=64GB", "#SBATCH --constraint=a100",
                 "#SBATCH --job-name=compare-gpt2", "#SBATCH --signal=USR2@90"):
        assert line in script, script
    cpu = make_executor(LauncherSettings(gpus_per_run=0, time_minutes=30), tmp_path / "cpu")
    assert "gpus" not in cpu._executor._make_submission_file_text("cmd", "uid")  # no GPU line for a CPU run
    with pytest.raises(ConfigError, match=r"submitit refuses them: .*'warp_drive'"):
        make_executor(LauncherSettings(time_minutes=30, extra={"warp_drive": 9}), tmp_path / "slurm2")
    with pytest.raises(ConfigError, match=r"needs --slurm-time on SLURM .*submitit would give every job 5 minutes"):
        make_executor(LauncherSettings(), tmp_path / "slurm3")
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ConfigError, match="no sbatch or srun on this machine's PATH"):
        make_executor(LauncherSettings(time_minutes=30), tmp_path / "slurm4")


def test_a_refused_launcher_writes_nothing_and_a_refused_submission_leaves_no_staged_file(corpus, tmp_path,
                                                                                         monkeypatch, capsys):
    """No sbatch (or srun), options submitit refuses: refused before the output folder exists (compare.json, a lock
    and slurm/ were written first). An sbatch that refuses the jobs: one line with its message (was an internal
    error), the pickles submitit staged for them removed, no log line of a submission that did not happen."""
    out, tools = tmp_path / "cmp", tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", str(tools))
    sets = [a for k, v in compare_sets(corpus).items() for a in ("--set", f"{k}={v}")]
    args = ["compare", "--task", "translation", "--variants", "baseline", "--output", str(out), "--launcher",
            "submitit", *sets]
    for extra, message in [(["--slurm-time", "10"], "no sbatch or srun on this machine's PATH"),
                           (["--slurm-cluster", "local", "--slurm-set", "warp_drive=9"], "submitit refuses them")]:
        assert main([*args, *extra]) == 2
        assert message in capsys.readouterr().err and not out.exists()
    for tool, body in [("sbatch", 'echo "sbatch: error: Batch job submission failed: Invalid partition" >&2; exit 1'),
                       ("srun", "exit 1")]:
        (tools / tool).write_text(f"#!/bin/sh\n{body}\n")
        (tools / tool).chmod(0o755)
    assert main([*args, "--slurm-time", "10", "--slurm-partition", "nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["interlayer: error: the cluster refused the submission: sbatch: error: Batch job submission "
                   "failed: Invalid partition; check --slurm-partition, --slurm-set and --slurm-time against what "
                   "your account may ask for"]
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "writer.lock"]  # no slurm/, logs/, jobs.json


@pytest.mark.slow
def test_a_local_job_id_now_naming_another_process_is_not_followed(tmp_path):
    """A local job's id is its controller's pid: once the controller has ended, the system may give the pid to any
    process, which was then followed as the job for ever ("running"). The record keeps the controller's start time,
    and a pid that names no submitit controller (a record written before) is not followed either."""
    settings = LauncherSettings(cluster="local", gpus_per_run=0)
    folder = tmp_path / "slurm"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for identity in (None, "another-boot:123"):
            assert job_state(attach(settings, folder, str(stranger.pid), 1, identity)) == "lost"
        executor = make_executor(settings, folder)
        job = executor.submit(time.sleep, 60)
        try:
            identity = job_identity(settings, job)
            assert identity is not None and identity.endswith(":" + Path(f"/proc/{job.job_id}/stat").read_text()
                                                              .rsplit(")", 1)[1].split()[19])
            assert job_state(attach(settings, folder, job.job_id, 1, identity)) == "running"  # the job itself
            assert job_state(attach(settings, folder, job.job_id, 1, "another-boot:123")) == "lost"
            # submitit's local controller makes its unformatted folder, slurm/%j, beside slurm/<job id>/
            _wait_for(lambda: (folder / "%j").is_dir(), 300, "the local controller to start")
        finally:
            job.cancel()
        remove_stray_folder(folder)
        assert not (folder / "%j").exists() and (folder / job.job_id).is_dir()
    finally:
        stranger.kill()
        stranger.wait()


def test_cli_refuses_slurm_options_without_the_launcher_and_jobs_with_it(capsys):
    assert main(["compare", "--task", "sst5", "--variants", "baseline", "--slurm-partition", "gpu"]) == 2
    assert "--slurm-partition apply to --launcher submitit only" in capsys.readouterr().err
    assert main(["compare", "--task", "sst5", "--variants", "baseline", "--launcher", "submitit", "--jobs", "2",
                 "--slurm-cluster", "debug"]) == 2
    assert "--jobs applies to --launcher local" in capsys.readouterr().err


@pytest.mark.slow
def test_the_job_body_turns_the_time_limit_signal_into_a_clean_stop(tmp_path, monkeypatch):
    """submitit's warning before the limit (SIGUSR2) reaches the run as SIGTERM, on which the engine saves; an
    exception becomes a result, its traceback in the run's log."""
    stopped = []

    def run(job):
        previous = signal.signal(signal.SIGTERM, lambda *a: stopped.append("SIGTERM"))
        try:
            os.kill(os.getpid(), signal.SIGUSR2)
        finally:
            signal.signal(signal.SIGTERM, previous)
        return 3

    monkeypatch.setenv("SUBMITIT_DEBUG_JOB_ID", "test")  # what submitit's debug executor sets in its job
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert job_body(run, {}, None)["value"] == 3 and stopped == ["SIGTERM"]

        log, answer = tmp_path / "run.log", tmp_path / "result.json"
        code = ("import json; from pathlib import Path; from interlayer.training.cluster import job_body\n"
                "def fail(job): raise ValueError('no such data')\n"
                f"Path({str(answer)!r}).write_text(json.dumps(job_body(fail, {{}}, {str(log)!r})))")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(SRC)})
        assert result.returncode == 0, result.stderr
        outcome = json.loads(answer.read_text())
        assert outcome["value"] is None and outcome["error"] == "ValueError: no such data"
        assert "Traceback" in log.read_text() and "ValueError: no such data" in log.read_text()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_damaged_job_record_is_refused_before_anything_is_written(tmp_path):
    """jobs.json decides which runs are followed and which submitted: one that is not what the launcher writes
    (a JSONDecodeError or KeyError, exit 1) is refused naming the entry, before search makes its study."""
    from helpers.search import DEFINITION, Scored, search_settings
    from interlayer.errors import DataError
    from interlayer.search.launch import run_search_jobs
    from interlayer.training.cluster import read_job_record

    record = tmp_path / "jobs.json"
    assert read_job_record(record, "runs") == {"runs": {}}  # none yet
    good = {"runs": {"pa-s1": {"job_id": "4242_1", "tasks": 1, "cluster": "slurm", "submissions": []}}}
    record.write_text(json.dumps(good))
    assert read_job_record(record, "runs") == good
    for text, message in [("{", r"jobs.json:1:2: not valid JSON"), ("[]", r"expected a JSON object, got list"),
                          ('{"trials": {}}', r"no mapping 'runs' of each run to its job"),
                          ('{"runs": {"pa-s1": {"job_id": 4242}}}', r"the entry of 'pa-s1' is .*, not a job"),
                          ('{"runs": {"pa-s1": {"job_id": "1", "cluster": "moon"}}}', r"not a job")]:
        record.write_text(text)
        with pytest.raises(DataError, match=message + r".*it was edited or damaged: restore it, or delete it once"):
            read_job_record(record, "runs")
    output = tmp_path / "search"
    output.mkdir()
    (output / "jobs.json").write_text('{"trials": {"0": "4242"}}')
    with pytest.raises(DataError, match=r"the entry of '0' is '4242', not a job"):
        run_search_jobs(search_settings(tmp_path), LauncherSettings(cluster="debug"), Scored(), DEFINITION)
    assert sorted(p.name for p in output.iterdir()) == ["jobs.json"]  # no study made
