"""The training checkpoint (training/state_file.py) and the engine's guards: no code runs from a checkpoint, a
truncated one is a clear error, a diverging run stops, mixed precision and compilation do what they say, and a
run resumes under its one writer with only the settings a resume may change."""
from __future__ import annotations

import csv
import json
import math
import os
import pickle
import random
import shutil
import socket
from pathlib import Path

import pytest
import torch

from helpers import gpu
from helpers.processes import lock_owner
from helpers.tiny_runs import translation_args
from interlayer import create_model
from interlayer.checkpoint import canonical_state_dict
from interlayer.cli import main
from interlayer.errors import DirectoryBusy, DivergenceError
from interlayer.training import state_file
from interlayer.training.concurrency import DirectoryLock
from interlayer.training.config import TrainConfig
from interlayer.training.engine import LAST, LEGACY_LAST, Trainer

WORDS = ["awful", "bad", "plain", "good", "great", "the", "film", "is"]


def _sst(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(f"{rng.randrange(5)} {' '.join(rng.choices(WORDS, k=rng.randint(2, 6)))}\n"
                            for _ in range(n)))
    return path


@pytest.fixture(scope="module")
def sst(tmp_path_factory) -> list[str]:
    """``train sst5`` arguments for a tiny model on tiny files: a run takes a second or two."""
    root = tmp_path_factory.mktemp("sst")
    files = {split: _sst(root / f"{split}.txt", n, seed) for split, n, seed in
             (("train", 40, 1), ("valid", 10, 2), ("test", 10, 3))}
    sets = {"data.train": files["train"], "data.valid": files["valid"], "data.test": files["test"],
            "d_model": 16, "n_heads": 2, "d_ffn": 32, "enc_layers": 1, "data.batch_size": 8,
            "train.max_epochs": 2, "train.warmup_steps": 0}
    return [x for key, value in sets.items() for x in ("--set", f"{key}={value}")]


class _Payload:
    """Unpickling this writes ``marker``: what a hostile checkpoint would do with any code it liked."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('the payload ran')",))


def _plant_pickle(run: Path, marker: Path) -> None:
    (run / LAST).unlink(missing_ok=True)
    (run / "results.json").unlink(missing_ok=True)
    with (run / LEGACY_LAST).open("wb") as handle:
        pickle.dump({"model": _Payload(marker)}, handle)


def test_the_payload_is_live(tmp_path):
    """The control for the two tests below: unpickling the planted file does run its code."""
    marker = tmp_path / "ran"
    _plant_pickle(tmp_path, marker)
    with (tmp_path / LEGACY_LAST).open("rb") as handle:
        pickle.load(handle)
    assert marker.read_text() == "the payload ran"


def test_resume_refuses_a_pickle_checkpoint_and_runs_none_of_it(sst, tmp_path, capsys):
    run, marker = tmp_path / "run", tmp_path / "ran"
    assert main(["train", "sst5", "--run-dir", str(run), "--no-progress", *sst]) == 0
    _plant_pickle(run, marker)
    capsys.readouterr()
    assert main(["train", "sst5", "--run-dir", str(run), "--no-progress", "--resume", *sst]) == 2
    err = capsys.readouterr().err
    assert str(run / LEGACY_LAST) in err and "pickle" in err
    assert not marker.exists()
    # a fresh start in that directory is refused too, rather than the file being left for a later resume
    with pytest.raises(FileExistsError, match="already holds a run"):
        Trainer(_Task(), _model(), TrainConfig(), run)


@pytest.mark.slow
def test_compare_rerun_refuses_a_pickle_checkpoint_and_runs_none_of_it(sst, tmp_path, capsys):
    out, marker = tmp_path / "cmp", tmp_path / "ran"
    args = ["compare", "--task", "sst5", "--variants", "transformer_text_cls", "--seeds", "1", "--output", str(out),
            *sst]
    assert main(args) == 0
    run = next((out / "runs").iterdir())
    _plant_pickle(run, marker)
    assert main(args) == 1  # the run failed; the comparison says so
    log = next((out / "logs").iterdir()).read_text()
    assert LEGACY_LAST in log and "pickle" in log
    assert not marker.exists()


def test_a_truncated_checkpoint_is_a_clear_error_naming_the_file(sst, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "sst5", "--run-dir", str(run), "--no-progress", *sst]) == 0
    (run / "results.json").unlink()
    data = (run / LAST).read_bytes()
    (run / LAST).write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert main(["train", "sst5", "--run-dir", str(run), "--no-progress", "--resume", *sst]) == 2
    err = capsys.readouterr().err
    assert str(run / LAST) in err and "truncated" in err


def test_the_checkpoint_holds_only_tensors_and_json(sst, tmp_path):
    """Everything resumable (weights, Adam's moments, every generator, the vocabulary) is in the safetensors file,
    and the file parses without any unpickling."""
    run = tmp_path / "run"
    assert main(["train", "sst5", "--run-dir", str(run), "--no-progress", *sst]) == 0
    ckpt = state_file.read(run / LAST)
    assert ckpt["state"]["finished"] and ckpt["optimizer"]["state"] and ckpt["rng"][0]["torch"].dtype == torch.uint8
    assert "vocab.json" in ckpt["assets"] or any(name.endswith(".json") for name in ckpt["assets"])
    assert json.loads(json.dumps(ckpt["train_config"])) == ckpt["train_config"]
    assert not (run / LEGACY_LAST).exists() and not list(run.glob("*.pt"))


# -- divergence -----------------------------------------------------------------------------------------------
def test_a_learning_rate_of_1e30_stops_the_run_with_an_error_and_a_nonzero_exit(sst, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "sst5", "--run-dir", str(run), "--no-progress", *sst, "--set", "train.lr=1e30"])
    err = capsys.readouterr().err
    assert code == 3 and "training diverged at step" in err and "train.lr" in err
    assert not (run / "results.json").exists()


class _Task:
    """One batch per epoch; ``poison(step)`` says whether that step's loss is NaN or its gradient infinite."""

    metric, higher_is_better = "accuracy", True

    def __init__(self, poison=lambda step: None) -> None:
        self.poison, self.steps = poison, 0

    def train_batches(self, epoch, seed):
        return [torch.tensor([[5, 6, 7]])] * 2

    def loss(self, model, batch):
        self.steps += 1
        loss = model(batch).logits.float().square().mean()
        kind = self.poison(self.steps)
        if kind == "loss":
            loss = loss * float("nan")
        elif kind == "grad":  # finite value, infinite gradient: d sqrt(u)/du at u = 0
            loss = loss + torch.sqrt(loss * 0.0)
        return loss, {"loss": float(loss.detach())}, 1

    def validate(self, model):
        return {"accuracy": 1.0}

    def model_fields(self):
        return {}

    def save_assets(self, directory):
        (directory / "task.json").write_text('{"task": "scripted"}')


def _model():
    return create_model("transformer_text_cls", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, src_vocab_size=20,
                        num_classes=2)


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_a_divergence_noticed_later_is_named_exactly_and_never_saved(tmp_path, kind):
    """With the terms read every 50 steps, the run still stops at the next checkpoint (step 4), names step 3, and
    keeps step 2's checkpoint: no weights of a diverged step reach the disk."""
    cfg = TrainConfig(max_epochs=3, warmup_steps=0, clip_norm=1.0, log_interval=50, save_interval_steps=2)
    trainer = Trainer(_Task(lambda step: kind if step == 3 else None), _model(), cfg, tmp_path, progress=False)
    with pytest.raises(DivergenceError, match="diverged at step 3") as err:
        trainer.fit()
    assert "kept" in str(err.value) and trainer.state.step == 4
    kept = state_file.read(tmp_path / LAST)
    assert kept["state"]["step"] == 2
    assert all(torch.isfinite(t).all() for t in kept["model"].values())


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_divergence_keeps_the_last_finite_checkpoint(tmp_path, kind):
    cfg = TrainConfig(max_epochs=3, warmup_steps=0, log_interval=1, save_interval_steps=1)
    trainer = Trainer(_Task(lambda step: kind if step == 3 else None), _model(), cfg, tmp_path, progress=False)
    with pytest.raises(DivergenceError, match="step 3") as err:
        trainer.fit()
    assert "kept" in str(err.value)
    kept = state_file.read(tmp_path / LAST)
    assert kept["state"]["step"] == 2
    assert all(torch.isfinite(t).all() for t in kept["model"].values())


# -- precision and compile ------------------------------------------------------------------------------------
class _DtypeTask(_Task):
    """Records the dtype of the model's logits in each step."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def loss(self, model, batch):
        logits = model(batch).logits
        self.dtypes.append(logits.dtype)
        loss = logits.float().square().mean()
        return loss, {"loss": float(loss.detach())}, 1


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                             ("fp16", torch.float16)])
def test_precision_runs_the_steps_in_that_dtype_and_keeps_the_weights_in_fp32(tmp_path, precision, dtype):
    task = _DtypeTask()
    trainer = Trainer(task, _model(), TrainConfig(max_epochs=1, warmup_steps=0, precision=precision), tmp_path,
                      progress=False)
    trainer.fit()
    assert task.dtypes and set(task.dtypes) == {dtype}
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    scaler = state_file.read(tmp_path / LAST)["scaler"]
    assert (scaler is not None) == (precision == "fp16")
    if scaler is not None:
        assert scaler["scale"] > 0 and scaler["growth_interval"] == 2000


def test_fp16_scaler_state_survives_a_resume(tmp_path):
    """Interrupted and resumed fp16 training ends with the weights of an uninterrupted run: the scaler's scale
    and growth tracker come back from the checkpoint."""
    cfg = TrainConfig(max_epochs=4, warmup_steps=0, precision="fp16", log_interval=1)
    torch.manual_seed(0)
    whole = Trainer(_Task(), _model(), cfg, tmp_path / "a", progress=False)
    whole.fit()
    torch.manual_seed(0)
    first = Trainer(_Task(), _model(), TrainConfig(**{**cfg.__dict__, "max_epochs": 2}), tmp_path / "b",
                    progress=False)
    first.fit()
    ckpt = state_file.read(tmp_path / "b" / LAST)
    ckpt["state"]["finished"] = False  # continue the same run for two more epochs
    state_file.write(tmp_path / "b" / LAST, model=ckpt["model"], optimizer=ckpt["optimizer"], rng=ckpt["rng"],
                     assets=ckpt["assets"], metadata={k: ckpt[k] for k in ("model_config", "train_config", "state",
                                                                          "world_size", "scaler", "device",
                                                                          "precision")})
    metadata = {k: ckpt[k] for k in ("model_config", "train_config", "state", "world_size", "scaler", "device",
                                     "precision")}
    resumed = Trainer(_Task(), _model(), cfg, tmp_path / "b", resume=True, progress=False)
    resumed.fit()
    a, b = canonical_state_dict(whole.model), canonical_state_dict(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the scaler's own state comes back, not a fresh scaler's (whose scale would be 65536 and tracker 0)
    metadata["scaler"] = {**metadata["scaler"], "scale": 1024.0, "_growth_tracker": 7}
    state_file.write(tmp_path / "b" / LAST, model=ckpt["model"], optimizer=ckpt["optimizer"], rng=ckpt["rng"],
                     assets=ckpt["assets"], metadata=metadata)
    planted = Trainer(_Task(), _model(), cfg, tmp_path / "b", resume=True, progress=False)
    assert planted.scaler.get_scale() == 1024.0 and planted.scaler.state_dict()["_growth_tracker"] == 7


@pytest.mark.slow
def test_compile_compiles_the_model_and_the_loss_as_one_graph(tmp_path, monkeypatch):
    """``train.compile`` hands the task's whole loss (the model's forward *and* the loss on its logits) to
    ``torch.compile`` (here with dynamo's eager backend and ``fullgraph=True``, so a graph break fails the test;
    inductor's code generation takes minutes on 2 cores and is measured by benchmarks/bench_gpu.py instead), and
    the losses equal the eager run's."""
    calls = []
    real = torch.compile

    def compile_fullgraph(fn, **kwargs):
        calls.append(fn)
        return real(fn, backend="eager", fullgraph=True)

    monkeypatch.setattr(torch, "compile", compile_fullgraph)
    losses = {}
    for flag in (False, True):
        torch.manual_seed(0)
        task = _TensorTask()
        trainer = Trainer(task, _model(), TrainConfig(max_epochs=2, warmup_steps=0, compile=flag, log_interval=1),
                          tmp_path / str(flag), progress=False)
        trainer.fit()
        losses[flag] = [float(row["loss"]) for row in csv.DictReader((tmp_path / str(flag) / "train.csv").open())]
        assert (trainer.step_loss is not None) == flag
    assert len(calls) == 1 and calls[0] == task.loss
    assert len(losses[True]) == 4 and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(*losses.values()))


class _TensorTask(_Task):
    """The scripted task as the built-in tasks write it: its logged terms are tensors, read by the engine later."""

    def loss(self, model, batch):
        loss = model(batch).logits.float().square().mean()
        return loss, {"loss": loss.detach()}, 1


def test_a_step_never_waits_for_the_device(tmp_path, monkeypatch):
    """No ``float()``, ``.item()``, ``.tolist()`` or truth value of a tensor is taken by interlayer's code during a
    training step (one process, fp32/bf16): each would wait for the GPU. The logged terms are read once per
    ``log_interval`` (here at step 4), all together."""
    waits: list[str] = []

    def spy(name):
        real = getattr(torch.Tensor, name)

        def call(self, *args, **kwargs):
            caller = __import__("sys")._getframe(1).f_code.co_filename
            if "/interlayer/" in caller.replace("\\", "/") and "/tests/" not in caller:
                waits.append(f"{name} in {caller}")
            return real(self, *args, **kwargs)
        return call

    for name in ("__float__", "item", "tolist", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, spy(name))
    trainer = Trainer(_TensorTask(), _model(), TrainConfig(max_epochs=1, warmup_steps=0, clip_norm=1.0,
                                                          log_interval=4), tmp_path, progress=False)
    batches = trainer._step_batches(trainer.task.train_batches(1, 0))
    for _ in range(3):
        trainer._step(batches[0])
    assert waits == []
    trainer.step_logs.read(trainer._diverged_at)
    assert waits and all("step_logs.py" in w for w in waits)


# -- resuming a run: its one writer, a start before the first checkpoint, the settings it may change (issue 16) ------
@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory) -> Path:
    """A finished one-epoch translation run (module-scoped: tests copy it before changing anything)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(translation_args(corpus, run, "train.max_epochs=1", "train.log_interval=1", "train.average_last=0",
                                 "train.keep_last=1")) == 0
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


def test_a_second_writer_is_refused_naming_the_owner(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    with DirectoryLock(run, "test writer"):
        assert lock_owner(run)["pid"] == os.getpid()
        assert main(["train", "translation", "--run-dir", str(run), "--resume", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"is being written by another process: pid {os.getpid()} on host {socket.gethostname()}" in err
        with pytest.raises(DirectoryBusy, match="test writer"):
            DirectoryLock(run, "another").acquire()
    assert lock_owner(run) == {}  # released cleanly: nothing for the next writer to take over


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



# -- GPU (skipped without CUDA) ---------------------------------------------------------------------------------
def _interrupted(tmp_path: Path, device: str, steps: int) -> Path:
    """A run on ``device`` stopped (as by SIGTERM) after ``steps`` steps; returns its directory."""
    task = _Task()
    trainer = Trainer(task, _model(), TrainConfig(max_epochs=3, warmup_steps=0, device=device), tmp_path,
                      progress=False)
    inner = task.loss

    def loss(model, batch):
        if task.steps + 1 == steps:
            trainer.request_stop()
        return inner(model, batch)

    task.loss = loss
    assert not trainer.fit().finished
    return tmp_path


@gpu
@pytest.mark.parametrize("first,second", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_run_saved_on_one_device_resumes_on_the_other(tmp_path, first, second):
    run = _interrupted(tmp_path, first, steps=3)
    ckpt = state_file.read(run / LAST)
    assert ckpt["device"].startswith(first) and all(t.device.type == "cpu" for t in ckpt["model"].values())
    resumed = Trainer(_Task(), _model(), TrainConfig(max_epochs=3, warmup_steps=0, device=second), run,
                      resume=True, progress=False)
    assert next(resumed.model.parameters()).device.type == second
    state = resumed.fit()
    assert state.finished and state.step == 6
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


@gpu
def test_bf16_training_on_the_gpu_gives_finite_losses(tmp_path):
    task = _DtypeTask()
    trainer = Trainer(task, _model(), TrainConfig(max_epochs=2, warmup_steps=0, device="cuda", precision="bf16"),
                      tmp_path, progress=False)
    trainer.fit()
    assert set(task.dtypes) == {torch.bfloat16} and next(trainer.model.parameters()).is_cuda
    assert state_file.read(tmp_path / LAST)["rng"][0]["cuda"]


def test_cli_device_flags_reach_the_run(sst, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "sst5", "--run-dir", str(run), "--no-progress", "--device", "cpu", "--precision", "bf16",
                 *sst, "--set", "train.max_epochs=1"]) == 0
    train_cfg = json.loads((run / "run.json").read_text())["train"]
    assert (train_cfg["device"], train_cfg["precision"], train_cfg["compile"]) == ("cpu", "bf16", False)
    ckpt = state_file.read(run / LAST)
    assert (ckpt["device"], ckpt["precision"]) == ("cpu", "bf16")
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--device", "cpu"]) == 0
    assert main(["train", "sst5", "--run-dir", str(tmp_path / "x"), "--device", "tpu", *sst]) == 2
    assert "train.device='tpu'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before anything was written


@pytest.mark.parametrize("command", [["train", "sst5"], ["compare", "--task", "sst5", "--variants", "baseline"],
                                     ["search", "mpt", "--task", "sst5", "--trials", "2"]])
def test_the_compile_flag_reaches_the_run_as_a_boolean(command, monkeypatch):
    """``--compile`` is ``train.compile=True`` from the command line to the run: no text to parse on the way."""
    import interlayer.compare
    import interlayer.experiment
    import interlayer.search.mpt

    seen = []

    class Stop(Exception):
        pass

    def capture(*args, **kwargs):
        sets = kwargs.get("sets") if "sets" in kwargs else args[0].sets
        seen.append(sets)
        raise Stop

    monkeypatch.setattr(interlayer.experiment, "train", capture)
    monkeypatch.setattr(interlayer.compare, "run_compare", capture)
    monkeypatch.setattr(interlayer.search.mpt, "run_search", capture)
    with pytest.raises(Stop):
        main(["--debug", *command, "--compile"])
    assert seen[0]["train.compile"] is True
