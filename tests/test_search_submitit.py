"""`search mpt --launcher submitit`: every trial a job, the study driven by ask and tell from the driver (the jobs
never open the database); through submitit's debug executor (a failing trial fails alone) and its local executor
(a driver killed mid-search is started again: it follows the running trials' jobs and draws nothing twice)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from helpers import SRC
from helpers.search import DEFINITION, Scored, search_settings
from interlayer.search.launch import run_search_jobs
from interlayer.search.mpt import open_study
from interlayer.search.sampler import PARAM
from interlayer.training.cluster import LauncherSettings

submitit = pytest.importorskip("submitit")
TrialState = optuna.trial.TrialState
DEBUG = LauncherSettings(cluster="debug", gpus_per_run=0)


class FailsOnce:
    """Objective: the landscape's score, except that the first trial's job fails."""

    def __call__(self, request):
        if request.number == 1:
            raise RuntimeError("out of memory")
        return Scored()(request)


@pytest.mark.slow
def test_debug_jobs_complete_the_study_and_a_failing_trial_fails_alone(tmp_path, capsys):
    settings = search_settings(tmp_path, trials=5, workers=2)
    outcome = run_search_jobs(settings, DEBUG, FailsOnce(), DEFINITION)
    assert outcome.status == "done"
    study = open_study(settings)[0]
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(complete) == 5 and len({t.params[PARAM] for t in complete}) == 5
    assert [t.number for t in failed] == [1] and failed[0].user_attrs["error"] == "RuntimeError: out of memory"
    record = json.loads((tmp_path / "search" / "jobs.json").read_text())["trials"]
    assert sorted(map(int, record)) == [t.number for t in study.trials]  # one job per trial
    assert all(t.user_attrs["job_id"] == record[str(t.number)]["job_id"] for t in study.trials)
    printed = capsys.readouterr().out
    assert "[search] submitted trial(s) 0, 1 (submitit debug jobs (in this process): 0 GPU(s) per run)" in printed
    assert "[search] trial 1 failed: RuntimeError: out of memory" in printed
    assert "- best:" in outcome.report


@pytest.mark.slow
def test_a_killed_driver_is_started_again_and_follows_its_trials_jobs(tmp_path):
    settings = search_settings(tmp_path, trials=3, workers=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(SRC)])}
    code = ("from interlayer.search.launch import run_search_jobs\n"
            "from interlayer.training.cluster import LauncherSettings\n"
            "from helpers.search import DEFINITION, Scored, search_settings\nfrom pathlib import Path\n"
            f"run_search_jobs(search_settings(Path({str(tmp_path)!r}), trials=3, workers=2), "
            "LauncherSettings(cluster='local', gpus_per_run=0, time_minutes=10), Scored(seconds=4), DEFINITION)")
    driver = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    record = tmp_path / "search" / "jobs.json"
    deadline = time.time() + 300
    while not record.is_file() and driver.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert driver.poll() is None, driver.stdout.read()
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    running = open_study(settings)[0].get_trials(states=(TrialState.RUNNING,))
    assert [t.number for t in running] == [0, 1]  # left RUNNING by the dead driver; their jobs go on

    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the new driver's local jobs import helpers.search too
    try:
        outcome = run_search_jobs(settings, LauncherSettings(cluster="local", gpus_per_run=0, time_minutes=10),
                                  Scored(), DEFINITION)
    finally:
        os.environ.pop("PYTHONPATH")
    assert outcome.status == "done"
    study = open_study(settings)[0]
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3  # none lost, none drawn twice
    jobs = json.loads(record.read_text())["trials"]
    assert sorted(jobs) == ["0", "1", "2"]
