"""Issue 16, reliability: one writer per run directory, children that die with `compare`, resuming a run killed
before its first checkpoint, settings a resume may or may not change, non-finite or out-of-range config values,
the graph reader's checks, and every bad input of the command line as one clear line with exit code 2.

Real processes only where a process is the point (a lock across processes, SIGKILL of `compare`, SIGTERM of
`train`, a closed pipe); everything else calls ``cli.main`` in-process. docs/reliability.md lists each case."""
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import SRC
from interlayer import get_config
from interlayer.cli import main
from interlayer.compare.runner import Runner
from interlayer.config_io import parse_value, read_config_file
from interlayer.core.config import ConfigError
from interlayer.data.idx import parse_idx
from interlayer.data.planetoid import PlanetoidGraph, load_npz, load_planetoid, save_npz
from interlayer.data.text import DataError
from interlayer.errors import DirectoryBusy, SignalStop
from interlayer.training.concurrency import LOCK_FILE, DirectoryLock, ForwardedInterrupts, StopSignals
from interlayer.training.config import TrainConfig
from interlayer.training.engine import LAST

TINY = ["d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=1", "dec_layers=1", "train.max_tokens=256",
        "train.warmup_steps=2", "train.log_interval=1", "train.average_last=0", "train.keep_last=1",
        "data.vocab_size=60"]


# -- fixtures and helpers --------------------------------------------------------------------------------------
def _train_args(corpus: Path, run: Path, *extra: str, sets=(), files=None) -> list[str]:
    files = {**{f"{s}-{side}": corpus / f"{s}.{lang}" for s in ("train", "valid", "test")
                for side, lang in (("src", "de"), ("tgt", "en"))}, **(files or {})}
    args = ["train", "translation", "--run-dir", str(run), "--no-progress", "--beam", "1"]
    for pair in [*TINY, *sets]:
        args += ["--set", pair]
    for flag, path in files.items():
        args += [f"--{flag}", str(path)]
    return args + list(extra)


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory) -> Path:
    """A finished one-epoch translation run (module-scoped: tests copy it before changing anything)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(_train_args(corpus, run, sets=["train.max_epochs=1"])) == 0
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


def _cli_process(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", "import sys; from interlayer.cli import main; sys.exit(main())",
                             *args], cwd=cwd, env=env, **kwargs)


def _wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    """The process no longer runs (never existed, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _owner(directory: Path) -> dict:
    text = (directory / LOCK_FILE).read_text() if (directory / LOCK_FILE).is_file() else ""
    return json.loads(text) if text.strip() else {}


# -- one writer per run directory ------------------------------------------------------------------------------
def test_a_second_writer_is_refused_naming_the_owner(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    with DirectoryLock(run, "test writer"):
        assert _owner(run)["pid"] == os.getpid()
        assert main(["train", "translation", "--run-dir", str(run), "--resume", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"is being written by another process: pid {os.getpid()} on host {socket.gethostname()}" in err
        with pytest.raises(DirectoryBusy, match="test writer"):
            DirectoryLock(run, "another").acquire()
    assert _owner(run) == {}  # released cleanly: nothing for the next writer to take over


def test_a_dead_owners_lock_is_taken_over_and_the_takeover_logged(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "what": "run",
                                                  "started": "yesterday"}))
    lines = []
    with DirectoryLock(tmp_path, "successor", warn=lines.append):
        assert _owner(tmp_path)["pid"] == os.getpid()
    assert len(lines) == 1 and f"taking over {tmp_path / LOCK_FILE}" in lines[0] and f"pid {pid} " in lines[0]


def test_a_lock_kept_by_a_child_of_a_dead_owner_names_both(tmp_path):
    holder = DirectoryLock(tmp_path, "orphan's parent").acquire()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    try:
        with pytest.raises(DirectoryBusy, match=r"has exited, but a process it started still holds .*fuser"):
            DirectoryLock(tmp_path, "next").acquire()
    finally:
        holder.release()


def test_compare_starts_a_run_killed_before_its_first_checkpoint_over_without_deleting_it(tmp_path):
    run = tmp_path / "runs" / "v-s1"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "train.csv").write_text("step,loss\n1,5.0\n")
    started = []

    class FakeProcess:
        def __init__(self, target, args, name):
            started.append(args[0])
            self.sentinel = 0

        def start(self):
            pass

    runner = Runner.__new__(Runner)  # only what _start reads
    runner.plan = SimpleNamespace(settings=SimpleNamespace(budget_minutes=None), spec=SimpleNamespace(name="t"))
    runner.output, runner.threads, runner.echo = tmp_path, None, lambda line: None
    runner.context = SimpleNamespace(Process=FakeProcess)
    runner._start("[1/1] v seed 1", SimpleNamespace(variant=SimpleNamespace(name="v", preset="p"), sets={}), 1)
    assert started[0]["resume"] is True  # experiment.train starts it over, under the run's lock
    assert (run / "train.csv").is_file()  # compare itself deletes nothing


def test_killing_compare_leaves_no_orphan_and_a_second_compare_is_refused(corpus, tmp_path, capsys):
    sets = [*TINY, "train.max_epochs=1000", "train.patience=0",
            *(f"data.{s}_{side}={corpus / f'{s}.{lang}'}" for s in ("train", "valid", "test")
              for side, lang in (("src", "de"), ("tgt", "en")))]
    args = ["compare", "--task", "translation", "--variants", "baseline", "--output", str(tmp_path / "cmp")]
    args += [arg for pair in sets for arg in ("--set", pair)]
    parent = _cli_process(args, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmp_path / "cmp" / "runs" / "baseline-s1"
    try:
        _wait_for(lambda: (run / "train.csv").is_file() and _owner(run), 90, "the run to train")
        child = _owner(run)["pid"]
        assert _owner(tmp_path / "cmp")["pid"] == parent.pid
        assert main(args) == 2  # a second comparison on the same directory
        assert f"pid {parent.pid} on host" in capsys.readouterr().err
        assert main(["train", "translation", "--run-dir", str(run), "--resume"]) == 2  # a writer beside the run
        assert f"pid {child} on host" in capsys.readouterr().err
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _wait_for(lambda: _gone(child), 15, f"run process {child} to end after compare was killed")
    finally:
        parent.kill()
        parent.wait()
    size = (run / "train.csv").stat().st_size
    time.sleep(0.5)
    assert (run / "train.csv").stat().st_size == size  # nobody writes any more
    assert (run / LAST).is_file()  # the run saved on its way out (SIGTERM): resumable
    assert _owner(run) == {}  # and released its lock cleanly


def test_sigterm_stops_train_with_exit_143_and_a_checkpoint(corpus, tmp_path):
    run = tmp_path / "run"
    process = _cli_process(_train_args(corpus, run, sets=["train.max_epochs=1000", "train.patience=0"]), tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        _wait_for(lambda: (run / "train.csv").is_file(), 60, "training to start")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert json.loads(out)["signal"] == "SIGTERM" and (run / LAST).is_file()


# -- resuming -------------------------------------------------------------------------------------------------
def test_resume_before_the_first_checkpoint_starts_over_and_says_so(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    rows = len((run / "train.csv").read_text().splitlines())
    for name in (LAST, "results.json"):  # as if killed before the first checkpoint
        (run / name).unlink()
    assert main(["train", "translation", "--run-dir", str(run), "--resume", "--no-progress", "--beam", "1"]) == 0
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    assert len((run / "train.csv").read_text().splitlines()) == rows  # the partial log was cleared, not extended
    assert json.loads((run / "results.json").read_text())["status"] == "finished"


def test_resume_refuses_set_values_that_change_the_run(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    (run / "results.json").unlink()
    base = ["train", "translation", "--run-dir", str(run), "--resume", "--no-progress", "--beam", "1"]
    assert main([*base, "--set", "d_model=64", "--set", "train.lr=0.01"]) == 2
    err = capsys.readouterr().err
    assert "d_model 32 -> 64" in err and "train.lr 0.001 -> 0.01" in err and "train.max_minutes" in err
    assert main([*base, "--seed", "2"]) == 2
    assert "train.seed 1 -> 2" in capsys.readouterr().err
    assert main([*base, "--set", "d_model=32", "--set", "train.max_epochs=3", "--set", "train.log_interval=7"]) == 0
    assert "changed settings: train.log_interval 1 -> 7, train.max_epochs 1 -> 3" in capsys.readouterr().err
    assert json.loads((run / "run.json").read_text())["train"]["max_epochs"] == 3  # recorded with the run
    assert main([*base, "--set", "train.max_epochs=4"]) == 2  # finished now: the change would do nothing
    assert "has finished" in capsys.readouterr().err


# -- config values ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("train.lr", ".nan"), ("train.lr", "inf"), ("train.warmup_init_lr", "inf"),
                                        ("train.min_lr", ".inf"), ("train.clip_norm", ".nan"),
                                        ("train.adam_eps", "-1e-8"), ("layer_norm_eps", "0"),
                                        ("layer_norm_eps", "nan"), ("train.step_gamma", "inf")])
def test_non_finite_or_out_of_range_numbers_are_refused_before_training(corpus, tmp_path, capsys, key, value):
    assert main(_train_args(corpus, tmp_path / "run", sets=[f"{key}={value}", "train.max_epochs=1"])) == 2
    assert key.removeprefix("train.").split("[")[0] in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_one_finite_check_covers_every_config_and_section():
    with pytest.raises(ConfigError, match=r"train.max_minutes=inf is not a finite number"):
        TrainConfig(max_minutes=float("inf")).validate()
    with pytest.raises(ConfigError, match=r"crossformer.alpha=nan is not a finite number"):
        get_config("transformer_small", crossformer={"soft": ["kq"], "alpha": float("nan")})
    with pytest.raises(ConfigError, match=r"negative_slope=inf"):
        get_config("gat_cora", negative_slope=float("inf"))
    with pytest.raises(ConfigError, match=r"pixel_std\[0\]=nan"):
        get_config("vit_fashion_mnist", pixel_std=[float("nan")])


def test_the_signal_handlers_remember_which_signal_stopped_a_command():
    """compare and search exit 128 + the signal that stopped them (130, 143): the handlers keep it (the first one,
    for a SIGTERM followed by an impatient Ctrl-C); StopSignals makes a SIGTERM stop as Ctrl-C does."""
    with ForwardedInterrupts() as interrupts:
        assert (interrupts.requested, interrupts.signal) == (False, None)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert (interrupts.requested, interrupts.signal) == (True, signal.SIGTERM)
    for sent in (signal.SIGTERM, signal.SIGINT):
        with pytest.raises(KeyboardInterrupt) as caught, StopSignals():
            os.kill(os.getpid(), sent)
            time.sleep(5)  # the handler raises at once
        assert isinstance(caught.value, SignalStop) and caught.value.signal == sent
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_search_refuses_zero_trials(monkeypatch, capsys):
    import interlayer.search.mpt as mpt

    def validating_stub(settings, *args, **kwargs):
        settings.validate()  # what run_search does first
        return mpt.SearchOutcome("done", "stub")

    monkeypatch.setattr(mpt, "run_search", validating_stub)
    assert main(["search", "mpt", "--task", "translation", "--trials", "0"]) == 2
    assert "--trials=0 must be at least 1" in capsys.readouterr().err


# -- YAML and JSON files -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content, message", [
    ("dup.yaml", b"d_model: 256\nn_heads: 4\nd_model: 128\n",
     r"dup\.yaml:3:1: not valid YAML: found duplicate key 'd_model' \(first at line 1"),
    ("nested.yaml", b"crossformer:\n  soft: [kq]\n  soft: [ffn]\n", r"nested\.yaml:3:3: .*duplicate key 'soft'"),
    ("dup.json", b'{"d_model": 256, "d_model": 128}', r"dup\.json: duplicate key 'd_model'"),
    ("bad.yaml", b"d_model: [1,\n", r"bad\.yaml:2:1: not valid YAML"),
    ("bad.json", b'{"d_model": }', r"bad\.json:1:13: not valid JSON"),
    ("latin1.yaml", b"# caf\xe9\nd_model: 64\n", r"latin1\.yaml:1: not valid UTF-8 \(byte 5"),
])
def test_config_files_with_duplicates_bad_syntax_or_bytes_are_refused(tmp_path, capsys, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        read_config_file(tmp_path / name)
    assert main(["config", str(tmp_path / name)]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("value, message", [("[1,", r"--set d_model='\[1,': not valid YAML"),
                                            ("{a: 1, a: 2}", r"duplicate key 'a'")])
def test_bad_yaml_in_set_is_refused_naming_the_key(capsys, value, message):
    assert main(["config", "transformer_small", "--set", f"d_model={value}"]) == 2
    assert re.search(message, capsys.readouterr().err)
    with pytest.raises(ConfigError, match=message):
        parse_value(value, "--set d_model")


def test_every_yaml_read_goes_through_the_duplicate_refusing_loader():
    """No module reads YAML, JSON-as-YAML or pickles past the checked readers (issue 16: nothing from a file may
    run code, and a duplicate key may not pass silently)."""
    patterns = {r"yaml\.(safe_)?load\(": "fileio.py", r"yaml\.(unsafe_|full_)?load\(": "fileio.py",
                r"allow_pickle\s*=\s*True": None, r"pickle\.loads?\(": None, r"\.Unpickler\(": None}
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for pattern, allowed in patterns.items():
            if re.search(pattern, text) and path.name != allowed:
                raise AssertionError(f"{path}: {pattern} outside the checked readers")


# -- model folders and translate --------------------------------------------------------------------------------
def _broken_model(finished_run: Path, tmp_path: Path, damage: str) -> Path:
    model = tmp_path / "model"
    shutil.copytree(finished_run / "best", model)
    if damage == "truncated":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[:-100])
    elif damage == "config":
        (model / "config.json").write_text('{"d_model": 32,\n "n_heads": }')
    elif damage == "vocab":
        (model / "vocab.json").write_text('{"joint": true, "source": 7}')
    elif damage == "task":
        (model / "task.json").write_text('{"task": "sst2"}')
    return model


@pytest.mark.parametrize("damage, message", [
    ("truncated", r"model\.safetensors: not a readable safetensors file .*truncated"),
    ("config", r"config\.json:2:13: not valid JSON"),
    ("vocab", r"vocab\.json is not a translation vocabulary"),
    ("task", r"holds a 'sst2' model .*not a translation model"),
])
def test_translate_refuses_a_damaged_or_foreign_model_folder(finished_run, tmp_path, capsys, monkeypatch, damage,
                                                             message):
    model = _broken_model(finished_run, tmp_path, damage)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ein hund\n")))
    assert main(["translate", "--checkpoint", str(model)]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_evaluate_refuses_a_task_json_naming_an_unknown_task(finished_run, tmp_path, capsys):
    model = _broken_model(finished_run, tmp_path, "none")
    (model / "task.json").write_text('{"task": "summarisation"}')
    assert main(["evaluate", "--checkpoint", str(model)]) == 2
    assert re.search(r"task\.json names the task 'summarisation'; known tasks: .*translation",
                     capsys.readouterr().err)


@pytest.mark.parametrize("stdin, message", [(b"", r"<stdin>: no input \(empty\)"),
                                            (b"ein hund\n\xff\xfe\n", r"<stdin>:2: not valid UTF-8"),
                                            (b"ein\n" + b"hund " * 300 + b"\n",
                                             r"<stdin>:2: the sentence has \d+ subword tokens .*max_positions=256")])
def test_translate_refuses_empty_undecodable_or_too_long_input(finished_run, capsys, monkeypatch, stdin, message):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert main(["translate", "--checkpoint", str(finished_run / "best")]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("split, message", [
    ("valid", r"valid\.de:3: the valid source sentence has \d+ tokens, more than the model's max_positions=24; "
              r"evaluation data is never cut"),
    ("train", r"train\.de:5: the train source sentence .*data\.max_tokens_per_sentence=24 drops such"),
])
def test_a_sentence_longer_than_max_positions_is_refused_before_training(corpus, tmp_path, capsys, split, message):
    lines = (corpus / f"{split}.de").read_text().splitlines()
    lines[2 if split == "valid" else 4] = " ".join(["hund"] * 40)
    if split == "train":
        lines[1] = ""  # a blank pair, dropped from training: the message must still name the file's line
    (tmp_path / f"{split}.de").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    assert main(_train_args(corpus, run, sets=["max_positions=24", "train.max_epochs=1"],
                            files={f"{split}-src": tmp_path / f"{split}.de"})) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (run / "train.csv").exists()  # nothing trained


def test_a_text_input_longer_than_a_position_table_is_refused_with_file_and_line(tmp_path, capsys):
    for split, n in (("train", 40), ("valid", 8), ("test", 8)):
        lines = [f"{i % 2} the film is {'good' if i % 2 else 'bad'}" for i in range(n)]
        if split == "test":
            lines[5] = "1 " + " ".join(["great"] * 30)
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    sets = ["d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=1", "positions=learned", "max_positions=16",
            "train.max_epochs=1", *(f"data.{s}={tmp_path / f'{s}.txt'}" for s in ("train", "valid", "test"))]
    args = ["train", "sst2", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert main(args + [a for pair in sets for a in ("--set", pair)]) == 2
    assert re.search(r"test\.txt:6: the test example has \d+ tokens, more than the model's max_positions=16 "
                     r"\(positions='learned'\); set data\.max_len=16", capsys.readouterr().err)


# -- command line behaviour --------------------------------------------------------------------------------------
class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("args", [["tables"], ["compare", "--list-variants"], ["models", "transformer_small"]])
def test_a_closed_stdout_ends_quietly(monkeypatch, capsys, args):
    import interlayer.papers as papers  # the tables command imports paper_tables when it runs

    monkeypatch.setattr(papers, "paper_tables", lambda: "| table |\n" * 100)  # what is printed does not matter
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(args) == 141
    assert capsys.readouterr().err == ""


def test_a_listing_into_a_pipe_closed_early_ends_quietly(tmp_path):
    process = _cli_process(["compare", "--list-variants"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The reader goes away before the listing is written (the interpreter takes a second to start): reading part of
    # it first would race with a listing that fits in the pipe's buffer, written whole before the reader closes.
    process.stdout.close()
    process.wait(timeout=60)
    assert process.stderr.read() == b"" and process.returncode == 141


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    import interlayer.papers as papers  # the tables command imports paper_tables when it runs

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(papers, "paper_tables", broken)
    assert main(["tables"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and "--debug" in err and "Traceback" not in err
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "tables"])

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(papers, "paper_tables", interrupted)  # Ctrl-C outside a training loop (reading data, ...)
    assert main(["tables"]) == 130 and capsys.readouterr().err == "interlayer: interrupted\n"


def test_an_idx_header_with_huge_dimensions_is_reported_without_overflow():
    data = bytes([0, 0, 0x08, 3]) + (2 ** 21).to_bytes(4, "big") * 3 + b"x" * 10
    with pytest.raises(DataError, match=r"offset 26: data truncated; shape \(2097152, 2097152, 2097152\) of uint8 "
                                        r"needs 9223372036854775808 bytes .*corrupt header"):
        parse_idx(data, "huge.idx")


# -- the graph reader ------------------------------------------------------------------------------------------
def _toy_graph(**changes) -> PlanetoidGraph:
    """Six nodes, two classes, features 0..3."""
    base = dict(name="toy", feat_data=np.ones(6, dtype=np.float32), feat_indices=np.array([0, 1, 2, 3, 0, 1]),
                feat_indptr=np.arange(7), feat_shape=(6, 4), labels=np.array([0, 1, 0, 1, 0, 1]),
                edges=np.array([[0, 1], [1, 0]]), train=np.array([0, 1]), valid=np.array([2, 3]),
                test=np.array([4, 5]))
    return PlanetoidGraph(**{**base, **changes})


@pytest.mark.parametrize("changes, message", [
    ({"feat_data": np.array([1, 1, np.nan, 1, 1, 1], dtype=np.float32)},
     r"feature 2 of node 2 is nan; features must be finite"),
    ({"feat_indices": np.array([0, 1, 2, 7, 0, 1])},
     r"node 3 has feature index 7, outside the declared width of 4 features \(valid indices 0\.\.3"),
    ({"labels": np.array([0, 1, 0, 1, 0, 50])}, r"the labels run to 50 \(node 5\) but no node has class 2, 3, .*"),
    ({"labels": np.array([0, 1, 0, 1, 0, 50]), "declared_classes": 7},
     r"node 5 has label 50, outside the declared num_classes=7"),
    ({"feat_indptr": np.array([0, 1, 3, 2, 4, 5, 6])},  # issue 29: an IndexError before
     r"feat_indptr falls at node 2 \(3 -> 2\); the offsets must never decrease \(1 such nodes in all\)"),
])
def test_the_graph_reader_refuses_bad_features_and_labels(tmp_path, changes, message):
    path = save_npz(_toy_graph(**changes), tmp_path / "toy.npz")
    if "declared_classes" not in changes:  # a file as written before num_classes existed
        with np.load(path) as archive:
            arrays = {k: archive[k] for k in archive.files if k != "num_classes"}
        np.savez_compressed(path, **arrays)
    with pytest.raises(DataError, match=rf"toy\.npz: {message}"):
        load_npz(path)


def test_declared_classes_survive_the_npz_round_trip(tmp_path):
    graph = load_planetoid("bundled:planetoid/cora.npz")
    assert graph.declared_classes is None and graph.num_classes == 7  # inferred, every class present
    again = load_npz(save_npz(graph, tmp_path / "cora.npz"))
    assert again.declared_classes == 7


def test_train_on_a_graph_with_a_nan_feature_exits_2(tmp_path, capsys):
    path = save_npz(_toy_graph(feat_data=np.array([1, 1, 1, np.inf, 1, 1], dtype=np.float32)), tmp_path / "g.npz")
    assert main(["train", "cora", "--graph", str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "feature 3 of node 3 is inf" in capsys.readouterr().err
