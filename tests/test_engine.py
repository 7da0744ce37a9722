"""The engine's model selection and early stopping, driven by a task whose validation metrics are scripted; the
batches it hands any task, on the model's device; and what keeps a run's directory to one writer and stops it on a
signal (training/concurrency.py)."""
import json
import os
import signal
import socket
import subprocess
import time
from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from helpers.processes import cli_process, dead_pid, lock_owner, wait_for
from helpers.tiny_runs import translation_args
from interlayer import create_model
from interlayer.core.config import ConfigError
from interlayer.errors import DirectoryBusy, SignalStop
from interlayer.training import engine
from interlayer.training.concurrency import LOCK_FILE, DirectoryLock, ForwardedInterrupts, StopSignals
from interlayer.training.config import TrainConfig
from interlayer.training.engine import LAST, Trainer


class ScriptedTask:
    """One tiny batch per epoch; validation returns the next scripted metrics."""

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, script, rules: bool) -> None:
        self.script = list(script)
        if rules:  # GAT's: patience on accuracy OR loss, saving on accuracy AND loss
            self.is_improvement = lambda m, b: m["accuracy"] >= b["accuracy"] or m["nll"] <= b["nll"]
            self.is_best = lambda m, b: m["accuracy"] >= b["accuracy"] and m["nll"] <= b["nll"]

    def train_batches(self, epoch, seed):
        return [torch.tensor([[5, 6, 7]])]

    def loss(self, model, batch):
        out = model(batch)
        return out.logits.square().mean(), {"loss": 0.0}, 1

    def validate(self, model):
        return dict(self.script.pop(0))

    def model_fields(self):
        return {}

    def save_assets(self, directory):
        (directory / "task.json").write_text('{"task": "scripted"}')


def _fit(tmp_path, script, rules, patience):
    model = create_model("transformer_text_cls", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, src_vocab_size=20,
                         num_classes=2)
    cfg = TrainConfig(max_epochs=len(script), patience=patience, warmup_steps=0, log_interval=1, keep_last=1)
    return Trainer(ScriptedTask(script, rules), model, cfg, tmp_path, progress=False).fit()


def test_default_rule_saves_the_best_metric_and_stops_after_patience(tmp_path):
    script = [{"accuracy": 50, "nll": 1.0}, {"accuracy": 60, "nll": 0.9}, {"accuracy": 55, "nll": 0.8},
              {"accuracy": 58, "nll": 0.7}, {"accuracy": 99, "nll": 0.1}]
    state = _fit(tmp_path, script, rules=False, patience=2)
    assert (state.best_epoch, state.best, state.epoch - 1) == (2, 60, 4)  # epoch 5 never ran
    assert "early stopping" in state.stop_reason


def test_task_rules_separate_patience_from_saving(tmp_path):
    script = [{"accuracy": 50, "nll": 1.0}, {"accuracy": 60, "nll": 1.2},  # accuracy only: resets, not saved
              {"accuracy": 55, "nll": 0.8},  # loss only (vs the last improving epoch): resets, not saved
              {"accuracy": 61, "nll": 0.7},  # both: saved
              {"accuracy": 40, "nll": 2.0}, {"accuracy": 41, "nll": 2.0}]
    state = _fit(tmp_path, script, rules=True, patience=2)
    assert state.best_epoch == 4 and state.saved_metrics["accuracy"] == 61
    assert state.bad_epochs == 2 and "early stopping" in state.stop_reason


def test_learning_rate_schedules():
    from interlayer.training.optimizer import learning_rate

    def lr(schedule, step, **kw):
        return learning_rate(step, TrainConfig(lr=1.0, warmup_steps=10, warmup_init_lr=0.0, schedule=schedule, **kw),
                             total_steps=110, steps_per_epoch=5)

    assert lr("constant", 5) == 0.5 and lr("constant", 100) == 1.0  # linear warm-up, then flat
    assert lr("inverse_sqrt", 40) == 0.5
    assert lr("linear", 60) == 0.5 and lr("linear", 110) == 0.0
    assert abs(lr("cosine", 60, min_lr=0.2) - 0.6) < 1e-12 and abs(lr("cosine", 110, min_lr=0.2) - 0.2) < 1e-12
    # step: x0.1 every 2 epochs of 5 steps
    assert lr("step", 10, step_epochs=2) == 1.0 and abs(lr("step", 11, step_epochs=2) - 0.1) < 1e-12


def test_anneal_to_budget_decays_by_whichever_limit_comes_first():
    from interlayer.training.optimizer import learning_rate

    def lr(step, used, anneal=True, schedule="linear"):
        cfg = TrainConfig(lr=1.0, warmup_steps=10, warmup_init_lr=0.0, schedule=schedule, max_minutes=1.0,
                          anneal_to_budget=anneal)
        return learning_rate(step, cfg, total_steps=110, steps_per_epoch=5, budget_used=used)

    assert lr(60, 0.75) == 0.25 and lr(60, 0.75, anneal=False) == 0.5  # the budget is ahead of the steps
    assert lr(60, 0.1) == 0.5  # the steps are ahead of the budget
    assert lr(30, 1.5) == 0.0 and abs(lr(30, 0.5, schedule="cosine") - 0.5) < 1e-12
    assert lr(5, 0.9) == 0.5  # warm-up is counted in steps either way


@pytest.mark.parametrize("fields, message", [
    (dict(anneal_to_budget=True, schedule="linear"), "train.max_minutes is 0"),
    (dict(anneal_to_budget=True, schedule="inverse_sqrt", max_minutes=5.0), "not train.schedule='inverse_sqrt'"),
])
def test_anneal_to_budget_refuses_a_config_it_cannot_apply_to(fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**fields).validate()


def test_a_run_stopped_by_its_budget_has_annealed(tmp_path, monkeypatch):
    """Each training step takes 10 s of a fake clock and the budget is 1 minute: six steps, whose learning rates
    follow the share of the budget used, not the 300 steps of max_epochs."""
    clock = [0.0]
    monkeypatch.setattr(engine, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class TenSecondSteps(ScriptedTask):
        def train_batches(self, epoch, seed):
            return [torch.tensor([[5, 6, 7]])] * 3

        def loss(self, model, batch):
            clock[0] += 10.0
            return super().loss(model, batch)

    model = create_model("transformer_text_cls", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, src_vocab_size=20,
                         num_classes=2)
    cfg = TrainConfig(lr=1.0, schedule="linear", warmup_steps=0, max_epochs=100, max_minutes=1.0,
                      anneal_to_budget=True, log_interval=1, keep_last=1)
    state = Trainer(TenSecondSteps([{"accuracy": 1, "nll": 1.0}] * 2, False), model, cfg, tmp_path,
                    progress=False).fit()
    assert state.step == 6 and "time budget" in state.stop_reason
    rows = (tmp_path / "train.csv").read_text().splitlines()
    col = rows[0].split(",").index("lr")
    expected = [1 - max(k / 6, (k + 1) / 300) for k in range(6)]  # step k+1 starts after 10k of the 60 seconds
    assert [round(float(r.split(",")[col]), 6) for r in rows[1:]] == [round(x, 6) for x in expected]


def test_logged_loss_is_the_mean_of_the_steps_in_its_window(tmp_path):
    """A log window that starts at an epoch boundary holds fewer steps than log_interval: the mean must use them."""

    class ConstantLoss(ScriptedTask):
        def train_batches(self, epoch, seed):
            return [torch.tensor([[5, 6, 7]])] * 3

        def loss(self, model, batch):
            out = model(batch)
            return out.logits.square().mean(), {"loss": 2.0}, 1

    model = create_model("transformer_text_cls", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, src_vocab_size=20,
                         num_classes=2)
    cfg = TrainConfig(max_epochs=2, warmup_steps=0, log_interval=2, keep_last=1)
    script = [{"accuracy": 1, "nll": 1.0}, {"accuracy": 2, "nll": 1.0}]
    Trainer(ConstantLoss(script, False), model, cfg, tmp_path, progress=False).fit()
    rows = (tmp_path / "train.csv").read_text().splitlines()
    col = rows[0].split(",").index("loss")
    assert [float(r.split(",")[col]) for r in rows[1:]] == [2.0, 2.0, 2.0]  # steps 2, 4 (window of 1), 6


def test_decay_bias_norm_off_spares_biases_and_norm_weights_only():
    """With zero gradients AdamW only decays: the spared group (biases, LayerNorm gains) must not move."""
    from interlayer.training.optimizer import parameter_groups

    model = create_model("transformer_text_cls", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, src_vocab_size=20,
                         num_classes=2)
    names = {id(p): n for n, p in model.named_parameters()}
    for spare in (True, False):
        cfg = TrainConfig(optimizer="adamw", weight_decay=0.1, decay_bias_norm=not spare)
        groups = parameter_groups(model, cfg)
        assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
        if not spare:
            assert len(groups) == 1
            continue
        spared = {names[id(p)] for p in groups[1]["params"]}
        assert spared and all(n.endswith(".bias") or "norm" in n for n in spared)
        assert {n for n in names.values() if n.endswith(".bias")} <= spared
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer = torch.optim.AdamW(groups, lr=0.5, weight_decay=cfg.weight_decay)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        for n, p in model.named_parameters():
            moved = not torch.equal(p.detach(), before[n])
            assert moved == (n not in spared and bool(before[n].abs().sum())), n
    assert len(parameter_groups(model, TrainConfig(weight_decay=0.0, decay_bias_norm=False))) == 1


def test_concurrent_runs_share_the_cores_of_the_affinity_mask(monkeypatch):
    """compare --jobs and search --workers divide the cores this process may use, not the machine's count."""
    from interlayer.training import concurrency as cores

    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 64)
    assert cores.available_cores() == 6
    assert [cores.threads_per_run(n) for n in (1, 2, 4, 12)] == [None, 3, 1, 1]


# -- one writer per run directory; signals (training/concurrency.py, issue 16) --------------------------------------
def test_a_dead_owners_lock_is_taken_over_and_the_takeover_logged(tmp_path):
    pid = dead_pid()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "what": "run",
                                                  "started": "yesterday"}))
    lines = []
    with DirectoryLock(tmp_path, "successor", warn=lines.append):
        assert lock_owner(tmp_path)["pid"] == os.getpid()
    assert len(lines) == 1 and f"taking over {tmp_path / LOCK_FILE}" in lines[0] and f"pid {pid} " in lines[0]


def test_a_lock_kept_by_a_child_of_a_dead_owner_names_both(tmp_path):
    holder = DirectoryLock(tmp_path, "orphan's parent").acquire()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    try:
        with pytest.raises(DirectoryBusy, match=r"has exited, but a process it started still holds .*fuser"):
            DirectoryLock(tmp_path, "next").acquire()
    finally:
        holder.release()


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


@pytest.mark.slow
def test_sigterm_stops_train_with_exit_143_and_a_checkpoint(corpus, tmp_path):
    run = tmp_path / "run"
    args = translation_args(corpus, run, "train.max_epochs=1000", "train.patience=0", "train.log_interval=1")
    process = cli_process(args, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for(lambda: (run / "train.csv").is_file(), 60, "training to start")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert json.loads(out)["signal"] == "SIGTERM" and (run / LAST).is_file()


# -- batches reach the model's device ---------------------------------------------------------------------------
Pair = namedtuple("Pair", "tokens extra")


@dataclass
class UserBatch:
    pair: Pair  # a named tuple inside a dataclass
    parts: list  # a list holding a tuple and a dict of tensors
    label: str = "user"


class CPUBatchTask(ScriptedTask):
    """A user's task that moves nothing: its batches are on the CPU, tensors nested in every kind of container,
    and its validation calls the model with a CPU tensor. It records the device of everything it is handed."""

    def __init__(self) -> None:
        super().__init__([{"accuracy": 1, "nll": 1.0}] * 2, False)
        self.seen: list[dict[str, torch.device]] = []

    def train_batches(self, epoch, seed):
        tokens = torch.tensor([[5, 6, 7]])
        return [UserBatch(Pair(tokens, torch.ones(1)), [(torch.zeros(2),), {"mask": torch.zeros(1, 3).bool()}])]

    def loss(self, model, batch):
        self.seen.append({"tokens": batch.pair.tokens.device, "extra": batch.pair.extra.device,
                          "tuple": batch.parts[0][0].device, "dict": batch.parts[1]["mask"].device})
        assert type(batch.pair) is Pair and batch.label == "user"
        out = model(batch.pair.tokens, key_padding_mask=batch.parts[1]["mask"])
        return out.logits.float().square().mean(), {"loss": 0.0}, 1

    def validate(self, model):
        self.seen.append({"validation output": model(torch.tensor([[5, 6, 7]])).logits.device})
        return super().validate(model)


def test_the_engine_moves_cpu_batches_to_the_models_device_for_loss_and_validation(tmp_path):
    """The model on another device than the task's batches (here ``meta``: a CPU tensor meeting it fails): every
    tensor of the batch reaches the model's device before the loss, and so do the model's inputs during
    validation; a step and a validation run."""
    model = create_model("transformer_text_cls", d_model=16, n_heads=2, d_ffn=32, enc_layers=1, src_vocab_size=20,
                         num_classes=2)
    task = CPUBatchTask()
    trainer = Trainer(task, model, TrainConfig(device="meta", clip_norm=0.0, warmup_steps=0), tmp_path,
                      progress=False)
    trainer._step(task.train_batches(1, 0))
    trainer._validate()
    meta = torch.device("meta")
    assert task.seen == [{"tokens": meta, "extra": meta, "tuple": meta, "dict": meta}, {"validation output": meta}]
    assert all(p.grad is not None and p.grad.is_meta for p in model.parameters())
    # validation's hook is gone afterwards: the model is the user's again
    with pytest.raises(RuntimeError):
        model(torch.tensor([[5, 6, 7]]))
