"""MPT hard-connection search (MPT Sec. 3.4) on Optuna: the sampler's phases and rules, shared and resumed
studies, worker processes (one of them SIGKILLed), the report, and one real trial through ``experiment.train``.

The mechanics use injected objectives (module-level classes, so spawned worker processes can unpickle them);
the last tests train a tiny translation model on a synthetic corpus.
"""
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from matplotlib.image import imread

from helpers.search import DEFINITION, N, Scored, score, search_settings
from helpers.translation import write_corpus
from interlayer.cli import main
from interlayer.core.config import ConfigError
from interlayer.search.mpt import SearchSettings, TrialResult, _run_trial, open_study, run_search
from interlayer.search.policy import (
    Record,
    Strategy,
    all_patterns,
    decode,
    encode,
    good_and_poor,
    propose,
    rank_completed,
    swap_neighbours,
    within_one_swap,
)
from interlayer.search.report import draw_pattern
from interlayer.search.sampler import PARAM, PHASE_ATTR, MPTSearchSampler

TrialState = optuna.trial.TrialState


def _memory_study(strategy: Strategy, trials: int) -> optuna.Study:
    """The sampler driving an in-memory study, identity enqueued first as the command does."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=MPTSearchSampler(strategy))
    choices = MPTSearchSampler(strategy).choices
    study.enqueue_trial({PARAM: encode(range(strategy.n_layers))}, user_attrs={PHASE_ATTR: "reference"})
    study.optimize(lambda t: score(decode(t.suggest_categorical(PARAM, choices))), n_trials=trials)
    return study


# -- patterns and the policy ---------------------------------------------------------------------------------------
def test_swap_neighbours_are_the_one_swap_patterns():
    pattern = (0, 4, 1, 5, 2, 3)
    neighbours = swap_neighbours(pattern)
    assert len(set(neighbours)) == 15 and pattern not in neighbours  # N(N-1)/2 for N=6
    assert all(within_one_swap(pattern, n) and sorted(n) == list(range(6)) for n in neighbours)
    assert not within_one_swap((0, 1, 2), (1, 2, 0))  # a 3-cycle is two swaps away
    assert encode([0, 4, 1, 5, 2, 3]) == "0,4,1,5,2,3" and decode("0,4,1,5,2,3") == pattern


def test_phases_reference_then_coarse_then_refine_around_the_best_without_repeats():
    strategy = Strategy(N, coarse=5, top_k=2, seed=3)
    trials = _memory_study(strategy, 16).get_trials()
    patterns = [decode(t.params[PARAM]) for t in trials]
    phases = [t.user_attrs[PHASE_ATTR] for t in trials]
    assert patterns[0] == (0, 1, 2, 3) and phases[0] == "reference"
    assert phases[1:6] == ["coarse"] * 5
    assert set(phases[6:]) <= {"refine", "random"} and "refine" in phases[6:]
    assert len(set(patterns)) == 16  # never the same pattern twice
    for i in range(len(trials)):
        if phases[i] != "refine":
            continue
        before = [Record(t.number, patterns[t.number], phases[t.number], TrialState.COMPLETE, t.value)
                  for t in trials[:i]]
        good, poor = good_and_poor(rank_completed(before, True), 2, 0.5)
        assert any(patterns[i] in swap_neighbours(g.pattern) for g in good)
        assert not any(within_one_swap(patterns[i], p.pattern) for p in poor)
    assert max(t.value for t in trials) > trials[0].value  # the refinement climbs above the identity here


def test_neighbours_of_poor_patterns_are_skipped():
    good, poor = (0, 1, 2, 3), (1, 0, 3, 2)  # poor is two swaps from good: two of good's neighbours touch it
    records = [Record(0, good, "reference", TrialState.COMPLETE, 1.0),
               Record(1, poor, "coarse", TrialState.COMPLETE, 0.0)]

    def drawn(fraction):
        strategy = Strategy(N, coarse=1, top_k=1, poor_fraction=fraction)
        proposals = [propose(strategy, records, number=n, higher_is_better=True) for n in range(2, 300)]
        assert {p.phase for p in proposals} == {"refine"}
        return {p.pattern for p in proposals}

    assert drawn(0.0) == set(swap_neighbours(good))
    tied = [records[0], Record(1, poor, "coarse", TrialState.COMPLETE, 1.0)]
    assert good_and_poor(rank_completed(tied, True), 1, 0.5) == ([tied[0]], [])  # a tie is not poor
    assert drawn(0.5) == set(swap_neighbours(good)) - {(1, 0, 2, 3), (0, 1, 3, 2)}
    # when the good neighbourhood is used up: random, still away from the poor pattern's neighbourhood
    used = records + [Record(2 + i, c, "refine", TrialState.COMPLETE, 0.5) for i, c in enumerate(drawn(0.5))]
    fallback = propose(Strategy(N, coarse=1, top_k=1), used, number=50, higher_is_better=True)
    assert fallback.phase in ("refine", "random") and fallback.pattern not in {r.pattern for r in used}


def test_running_and_queued_patterns_are_taken_lost_ones_are_free_and_draws_are_deterministic():
    strategy = Strategy(3, coarse=10, seed=7)
    everything = [decode(p) for p in ("0,1,2", "0,2,1", "1,0,2", "1,2,0", "2,0,1")]
    states = [TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING, TrialState.PRUNED, TrialState.COMPLETE]
    records = [Record(i, p, "coarse", s, 0.0) for i, (p, s) in enumerate(zip(everything, states))]
    assert propose(strategy, records, number=9, higher_is_better=True).pattern == (2, 1, 0)  # the one left
    lost = records[:4] + [Record(4, everything[4], "coarse", TrialState.FAIL)]
    assert {propose(strategy, lost + [Record(5, (2, 1, 0), "coarse", TrialState.RUNNING)], number=n,
                    higher_is_better=True).pattern for n in range(9, 40)} == {(2, 0, 1)}
    every = records + [Record(5, (2, 1, 0), "coarse", TrialState.COMPLETE, 0.0)]
    assert propose(strategy, every, number=9, higher_is_better=True).phase == "exhausted"
    # same history, seed and trial number: same draw; another trial number or seed: (here) another draw
    draws = {n: propose(Strategy(6, coarse=5, seed=1), [], number=n, higher_is_better=True).pattern
             for n in range(1, 6)}
    assert draws == {n: propose(Strategy(6, coarse=5, seed=1), [], number=n, higher_is_better=True).pattern
                     for n in range(1, 6)}
    assert len(set(draws.values())) == 5
    assert draws[1] != propose(Strategy(6, coarse=5, seed=2), [], number=1, higher_is_better=True).pattern
    one = [t.params[PARAM] for t in _memory_study(Strategy(N, coarse=3, seed=5), 9).get_trials()]
    assert one == [t.params[PARAM] for t in _memory_study(Strategy(N, coarse=3, seed=5), 9).get_trials()]


def test_search_refuses_zero_trials(monkeypatch, capsys):
    import interlayer.search.mpt as mpt

    def validating_stub(settings, *args, **kwargs):
        settings.validate()  # what run_search does first
        return mpt.SearchOutcome("done", "stub")

    monkeypatch.setattr(mpt, "run_search", validating_stub)
    assert main(["search", "mpt", "--task", "translation", "--trials", "0"]) == 2
    assert "--trials=0 must be at least 1" in capsys.readouterr().err


def test_strategy_and_settings_are_checked():
    with pytest.raises(ConfigError, match="2..7"):
        Strategy(8, coarse=1).validate()
    with pytest.raises(ConfigError, match="--top-k=0"):
        Strategy(4, coarse=1, top_k=0).validate()


@pytest.mark.parametrize("top_k, shown", [(0, "0"), (25, "25"), (10 ** 30, r"\(a number of 31 digits\)"),
                                          (-10 ** 30, r"-\(a number of 31 digits\)")])
def test_an_out_of_range_top_k_says_the_range_plainly_before_the_study_is_made(tmp_path, top_k, shown):
    """--top-k 10^30 was accepted; out of range, the message printed the number in full. N=4 layers have 24
    patterns: K beyond them refines around all."""
    with pytest.raises(ConfigError, match=rf"^--top-k={shown} must be 1\.\.24: N=4 encoder layers have 24 patterns, "
                                          r"and the refinement works around the K best completed ones \(default 3\)$"):
        run_search(search_settings(tmp_path, top_k=top_k), Scored(), DEFINITION)
    assert not (tmp_path / "search").exists()
    Strategy(4, coarse=1, top_k=24).validate()  # every pattern: accepted
    with pytest.raises(ConfigError, match="multipass.permutation itself"):
        SearchSettings(task="sst5", trials=2, output=Path("x"), sets={"multipass.permutation": "[0,1]"}).validate()


def test_a_diverged_trial_is_complete_with_the_worst_score(tmp_path):
    strategy = Strategy(N, coarse=2)
    study = optuna.create_study(direction="maximize", sampler=MPTSearchSampler(strategy))
    diverged = lambda request: TrialResult(math.nan)  # noqa: E731
    study.optimize(lambda t: _run_trial(t, search_settings(tmp_path), DEFINITION, diverged, all_patterns(N)),
                   n_trials=1)
    study.optimize(lambda t: _run_trial(t, search_settings(tmp_path), DEFINITION, Scored(), all_patterns(N)),
                   n_trials=1)
    first, second = study.trials
    assert first.state == TrialState.COMPLETE and first.value == -math.inf and "NaN" in first.user_attrs["stop_reason"]
    records = [Record(t.number, decode(t.params[PARAM]), "", t.state, t.value) for t in study.trials]
    assert [r.number for r in rank_completed(records, True)] == [1, 0]  # ranked last, so it can be poor


# -- studies in SQLite ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_resume_duplicates_report_and_figure(tmp_path):
    settings = search_settings(tmp_path, trials=4)
    first = run_search(settings, Scored(), DEFINITION)
    study, _ = open_study(settings)
    assert first.status == "done" and len(study.get_trials(states=(TrialState.COMPLETE,))) == 4
    study.enqueue_trial({PARAM: "0,1,2,3"})  # as if a second machine enqueued the identity at the same instant
    second = run_search(search_settings(tmp_path, trials=7), Scored(), DEFINITION)  # same command, more trials
    trials = open_study(settings)[0].get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert second.status == "done" and len(complete) == 7
    assert len({t.params[PARAM] for t in complete}) == 7
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert [t.user_attrs["duplicate_of"] for t in pruned] == [0]
    assert not (tmp_path / "search" / "trials" / str(pruned[0].number)).exists()  # never trained
    assert run_search(search_settings(tmp_path, trials=7), Scored(), DEFINITION).status == "done"
    assert len(open_study(settings)[0].get_trials()) == len(trials)  # nothing more to do
    with pytest.raises(ConfigError, match="seed: study has 1, this command 2"):
        run_search(search_settings(tmp_path, seed=2), Scored(), DEFINITION)

    report = (tmp_path / "search" / "report.md").read_text()
    assert report == second.report
    rows = [line.split("|") for line in report.splitlines() if line.startswith("| ") and "COMPLETE" in line]
    scores = [float(row[5]) for row in rows]
    assert scores == sorted(scores, reverse=True) and len(rows) == 7
    best = max(complete, key=lambda t: (t.value, -t.number))
    assert f"- best: [{best.params[PARAM]}]" in report and "- identity [0,1,2,3] (trial 0): score -4" in report
    assert "1 draws skipped untrained" in report
    image = imread(tmp_path / "search" / "best_pattern.png")
    assert image.shape[0] > 300 and image.shape[1] > 500
    assert (image[..., :3] < 0.5).mean() > 0.01 and image[..., :3].std() > 0.1  # drawn, not blank

    assert main(["search", "mpt", "--report-only", "--output", str(tmp_path / "search")]) == 0


class Interrupted:
    """Objective: Ctrl-C in the middle of training (what ``train_trial`` raises when the trainer was stopped)."""

    def __call__(self, request):
        raise KeyboardInterrupt("stopped by request (signal)")


@pytest.mark.slow
def test_an_interrupted_trial_frees_its_pattern_and_the_identity_is_queued_again(tmp_path):
    assert run_search(search_settings(tmp_path, trials=2), Interrupted(), DEFINITION).status == "interrupted"
    first = open_study(search_settings(tmp_path, trials=2))[0].get_trials()
    assert [(t.params[PARAM], t.state, t.user_attrs.get("interrupted")) for t in first[:1]] == [
        ("0,1,2,3", TrialState.FAIL, True)]
    assert "interrupted (Ctrl-C/SIGTERM)" in (tmp_path / "search" / "report.md").read_text()
    assert run_search(search_settings(tmp_path, trials=2), Scored(), DEFINITION).status == "done"  # the same command
    complete = open_study(search_settings(tmp_path, trials=2))[0].get_trials(states=(TrialState.COMPLETE,))
    assert complete[0].params[PARAM] == "0,1,2,3" and complete[0].user_attrs[PHASE_ATTR] == "reference"


def test_pattern_figure_for_the_papers_best(tmp_path):
    draw_pattern([0, 4, 1, 5, 2, 3], tmp_path / "fig3.png", "MPT Fig. 3")
    image = imread(tmp_path / "fig3.png")
    assert image[..., :3].std() > 0.1
    red = (image[..., 0] > 0.6) & (image[..., 1] < 0.35) & (image[..., 2] < 0.35)  # long-path arrows
    blue = (image[..., 2] > 0.5) & (image[..., 0] < 0.25)  # short-path arrows
    assert red.sum() > 50 and blue.sum() > 50


@pytest.mark.slow
def test_two_worker_processes_share_one_study_and_a_killed_one_loses_only_its_trial(tmp_path):
    """``--workers 2`` on one SQLite study; one worker is SIGKILLed in the middle of its second trial. Trials take
    0.3 s, then 0.8 s after the kill, so that the survivor is still starting trials when the 2 s grace is over."""
    settings = search_settings(tmp_path, trials=8, workers=2, retry_lost=1)
    trials_dir, killed = tmp_path / "search" / "trials", {}

    def kill_a_worker_in_its_second_trial() -> None:
        deadline = time.time() + 600  # generous: spawned workers import torch, slow on a loaded machine
        while time.time() < deadline:
            pids = [(d / "pid").read_text() for d in trials_dir.glob("*") if (d / "pid").is_file()]
            twice = sorted({pid for pid in pids if pids.count(pid) >= 2})
            if twice:
                killed["pid"] = int(twice[0])
                os.kill(killed["pid"], signal.SIGKILL)  # mid-trial: it tells the storage nothing
                (tmp_path / "search" / "killed").touch()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_a_worker_in_its_second_trial)
    watcher.start()
    outcome = run_search(settings, Scored(seconds=0.3, barrier=2, seconds_after_kill=0.8), DEFINITION)
    watcher.join()
    assert (outcome.status, sorted(outcome.worker_exit_codes)) == ("failed", [-signal.SIGKILL, 0]), outcome.report

    trials = open_study(settings)[0].get_trials()
    pid_of = {t.number: int((trials_dir / str(t.number) / "pid").read_text()) for t in trials
              if (trials_dir / str(t.number) / "pid").is_file()}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len({pid_of[t.number] for t in complete}) == 2, outcome.report  # both workers completed trials
    assert 8 <= len(complete) <= 9 and len({t.params[PARAM] for t in complete}) == len(complete), outcome.report
    by_victim = [t for t in trials if pid_of.get(t.number) == killed["pid"]]
    assert [t.state for t in by_victim] == [TrialState.COMPLETE, TrialState.FAIL], outcome.report  # only its trial
    lost = by_victim[1]
    assert "error" not in lost.user_attrs and "interrupted" not in lost.user_attrs  # failed by the heartbeat check
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == lost.number]  # --retry-lost 1
    assert [t.state for t in retry] == [TrialState.COMPLETE] and retry[0].params[PARAM] == lost.params[PARAM]
    assert f"retry of trial {lost.number}" in outcome.report and "lost: no heartbeat" in outcome.report


@pytest.mark.slow
def test_a_signal_to_the_search_process_alone_stops_its_workers(tmp_path):
    """``kill PID`` (SIGTERM to the parent only, not its process group) must not leave the workers training on."""
    settings = search_settings(tmp_path, trials=8, workers=2)
    pids, sent = tmp_path / "search" / "pids", []

    def terminate_when_both_workers_hold_a_trial() -> None:
        deadline = time.time() + 600
        while time.time() < deadline:
            if pids.is_dir() and len(list(pids.iterdir())) >= 2:
                os.kill(os.getpid(), signal.SIGTERM)
                sent.append(time.time())
                return
            time.sleep(0.02)

    guard = signal.signal(signal.SIGTERM, lambda *_: sent.append("reached the test, not the search"))
    try:
        watcher = threading.Thread(target=terminate_when_both_workers_hold_a_trial)
        watcher.start()
        outcome = run_search(settings, Scored(seconds=30, barrier=2), DEFINITION)
        watcher.join()
    finally:
        signal.signal(signal.SIGTERM, guard)
    assert len(sent) == 1 and isinstance(sent[0], float), sent  # delivered once, and handled by the search
    assert (outcome.status, outcome.worker_exit_codes) == ("interrupted", [130, 130]), outcome.report
    assert outcome.signal == signal.SIGTERM  # the command exits 143, not 130 (test below)
    trials = open_study(settings)[0].get_trials()
    assert [t.state for t in trials if t.state != TrialState.WAITING] == [TrialState.FAIL] * 2  # 30 s trials cut
    assert all("interrupted" in t.user_attrs for t in trials if t.state == TrialState.FAIL)


@pytest.mark.slow
def test_sigterm_stops_a_one_worker_search_like_ctrl_c_and_is_remembered(tmp_path):
    """The worker in the search's own process: a SIGTERM while a trial runs (outside any training loop here) ends
    the trial FAIL, its pattern free, as Ctrl-C does, and the search reports SIGTERM (it killed the process, or
    exited 130 when the engine caught it)."""
    settings = search_settings(tmp_path, trials=4, workers=1)
    pids = tmp_path / "search" / "pids"

    def terminate_when_a_trial_runs() -> None:
        deadline = time.time() + 600
        while not (pids.is_dir() and any(pids.iterdir())) and time.time() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    guard = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal reaching the test would leave the trial on
    try:
        watcher = threading.Thread(target=terminate_when_a_trial_runs)
        watcher.start()
        outcome = run_search(settings, Scored(seconds=30), DEFINITION)
        watcher.join()
    finally:
        signal.signal(signal.SIGTERM, guard)
    assert (outcome.status, outcome.signal) == ("interrupted", signal.SIGTERM)
    trials = open_study(settings)[0].get_trials()
    assert [t.state for t in trials if t.state != TrialState.WAITING] == [TrialState.FAIL]
    assert trials[0].user_attrs.get("interrupted") is True


@pytest.mark.parametrize("stopped, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (None, 130)])
def test_an_interrupted_search_exits_128_plus_its_signal(monkeypatch, stopped, code):
    import interlayer.search.mpt as mpt

    monkeypatch.setattr(mpt, "run_search", lambda settings, *a, **k: mpt.SearchOutcome("interrupted", "", [], stopped))
    assert main(["search", "mpt", "--task", "sst5", "--trials", "2", "--output", "unused"]) == code


# -- one real trial ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The tiny De-En corpus at 120/12/12 sentences, targets gzipped."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), {"train": (120, 1), "valid": (12, 2), "test": (12, 3)},
                        gzip_target=True)


@pytest.mark.slow
def test_one_real_trial_through_experiment_train_and_the_cli(corpus, tmp_path, capsys):

    output = tmp_path / "search"
    args = ["search", "mpt", "--task", "translation", "--trials", "1", "--output", str(output), "--seed", "3"]
    for key, value in (("d_model", 32), ("n_heads", 4), ("d_ffn", 64), ("enc_layers", 2), ("dec_layers", 1),
                       ("train.max_epochs", 1), ("train.max_tokens", 400), ("train.average_last", 0),
                       ("train.threads", 1), ("data.vocab_size", 80)):
        args += ["--set", f"{key}={value}"]
    for split in ("train", "valid", "test"):
        args += ["--set", f"data.{split}_src={corpus / f'{split}.de'}",
                 "--set", f"data.{split}_tgt={corpus / f'{split}.en.gz'}"]
    assert main(args) == 0
    assert "identity [0,1] (trial 0): bleu" in capsys.readouterr().out
    run = json.loads((output / "trials" / "0" / "run.json").read_text())
    assert run["model"]["multipass"]["connection"] == "hard" and run["model"]["multipass"]["permutation"] == [0, 1]
    assert run["train"]["seed"] == 3
    results = json.loads((output / "trials" / "0" / "results.json").read_text())
    assert "best_valid" in results and not any(k.startswith("test") or k == "bleu" for k in results)
    study = optuna.load_study(study_name="mpt-search", storage=f"sqlite:///{output / 'study.db'}")
    assert math.isclose(study.trials[0].value, results["best_valid"]["bleu"])
    assert main(args[:5] + ["3"] + args[6:]) == 2  # 2 layers have 2 patterns
    assert "only 2 patterns" in capsys.readouterr().err
    assert main(args + ["--set", "multipass.permutation=[1,0]"]) == 2
    assert "itself" in capsys.readouterr().err


@pytest.mark.slow
def test_killing_the_search_stops_its_workers(tmp_path):
    """A SIGKILLed ``search`` forwards nothing; the kernel sends each worker SIGINT (``die_with_parent``), which
    ends its trial as Ctrl-C does, so no worker trains on as an orphan beside the next search."""
    script = tmp_path / "search.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from helpers.search import DEFINITION, Scored, search_settings\n"
        "from interlayer.search.mpt import run_search\n"
        "if __name__ == '__main__':  # the spawned workers import this file\n"
        f"    run_search(search_settings(Path({str(tmp_path)!r}), trials=20, workers=2), "
        "Scored(seconds=60, barrier=2), DEFINITION)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids_dir = tmp_path / "search" / "pids"
    try:
        deadline = time.time() + 300  # spawned workers import torch: slow on a loaded machine
        while time.time() < deadline and not (pids_dir.is_dir() and len(list(pids_dir.iterdir())) == 2):
            assert parent.poll() is None, "the search ended before its workers started"
            time.sleep(0.1)
        workers = [int(p.name) for p in pids_dir.iterdir()]
        assert len(workers) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), f"workers {workers} outlived the search"
    finally:
        parent.kill()
        parent.wait()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped by its dead parent's heir yet, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


# -- a refused search leaves nothing; a damaged study names its file (issue 43) ------------------------------------
def test_a_refused_search_leaves_no_study_database_or_lock(tmp_path, capsys):
    """A bad --set (or data) was refused after OUTPUT/study.db and study.lock had been made."""

    output = tmp_path / "search"
    assert main(["search", "mpt", "--task", "sst2", "--trials", "2", "--output", str(output), "--set",
                 "d_model=abc"]) == 2
    assert "d_model must be an integer, got 'abc'" in capsys.readouterr().err
    assert not output.exists()
    output.mkdir()  # an --output that exists already: what was there stays, nothing is added
    (output / "notes.txt").write_text("mine")
    assert main(["search", "mpt", "--task", "sst2", "--trials", "2", "--output", str(output), "--set",
                 "d_model=abc"]) == 2
    assert os.listdir(output) == ["notes.txt"]
    assert main(["search", "mpt", "--report-only", "--output", str(output)]) == 2  # made an empty study.db
    assert f"{output / 'study.db'} does not exist: no search was started in {output}" in capsys.readouterr().err
    assert os.listdir(output) == ["notes.txt"]


@pytest.mark.parametrize("content", [os.urandom(3000), b"SQLite format 3\x00" + os.urandom(200)],
                         ids=["random", "sqlite_header"])
def test_a_damaged_study_database_is_one_line_without_sql(tmp_path, capsys, content):

    output = tmp_path / "search"
    output.mkdir()
    (output / "study.db").write_bytes(content)
    assert main(["search", "mpt", "--task", "sst2", "--trials", "2", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"interlayer: error: {output / 'study.db'} is not a readable study database (")
    assert "damaged or another program's: move it away to start the search afresh" in err
    assert err.count("\n") == 1 and "SQL" not in err and "sqlalche.me" not in err


@pytest.mark.slow
def test_a_sqlite_database_of_another_program_is_refused_and_left_as_it_was(tmp_path, capsys):
    """A valid SQLite file of another program became a study (Optuna added its tables beside the program's): the
    docs say it is refused. A study's own file, and an empty one, still open."""
    import sqlite3

    output = tmp_path / "search"
    output.mkdir()
    database = output / "study.db"
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
        db.execute("INSERT INTO invoices (amount) VALUES (12.5)")
        db.commit()
    before = database.read_bytes()
    for command in (["--task", "sst2", "--trials", "2"], ["--report-only"]):
        assert main(["search", "mpt", *command, "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err == (f"interlayer: error: {database} is a SQLite database of another program (its tables: invoices), "
                       "not an Optuna study (tables studies, trials, version_info, ...); it is left as it is: give "
                       "another --output\n")
    assert database.read_bytes() == before and sorted(os.listdir(output)) == ["study.db"]
    other = database.rename(output / "other.db")
    with pytest.raises(ConfigError, match=r"other.db is a SQLite database of another program .* another --storage"):
        run_search(search_settings(tmp_path, storage=f"sqlite:///{other}"), Scored(), DEFINITION)
    (output / "empty.db").touch()  # an empty file (touch) is no other program's: it becomes the study
    assert run_search(search_settings(tmp_path, trials=2, storage=f"sqlite:///{output / 'empty.db'}"), Scored(),
                      DEFINITION).status == "done"


def test_the_search_study_is_created_under_a_lock_of_its_output(tmp_path, monkeypatch):
    """Two `search mpt` started together on a new --output raced in Optuna's schema creation: the storage and the
    study are now made while OUTPUT/study.lock is held (another process's flock on it must wait)."""
    import fcntl

    import interlayer.search.mpt as mpt
    from helpers.search import DEFINITION, search_settings

    real, held = mpt.make_storage, []

    def make_storage(settings):
        with open(tmp_path / "search" / mpt.STUDY_LOCK) as other:  # another open file: another lock holder
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return real(settings)

    monkeypatch.setattr(mpt, "make_storage", make_storage)
    study, _ = mpt.open_study(search_settings(tmp_path, trials=2), DEFINITION)
    assert held == [True] and len(study.get_trials()) == 1  # the identity, queued once
