"""``transformers.Trainer`` trains interlayer models (issue 31): a causal LM with Predictive Attention and a
classifier with Crossformer-SG, a few steps on CPU. The dataset is one batch, so the first logged loss is the
loss of the untrained model on all of it, whatever the order: it must equal ``model(**batch).loss`` with the
auxiliary loss in it, and later losses must be lower."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from interlayer import create_model

transformers = pytest.importorskip("transformers")

CORE = dict(src_vocab_size=24, d_model=16, n_heads=2, d_ffn=32, enc_layers=2, max_positions=16, dropout=0.0,
            attn_dropout=0.0)
ROWS = 8


def losses(model: torch.nn.Module, rows: list[dict[str, list[int]]], tmp_path: Path) -> list[float]:
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=12,
                                          per_device_train_batch_size=ROWS, learning_rate=1e-2, logging_steps=1,
                                          save_strategy="no", disable_tqdm=True, seed=0, warmup_steps=0,
                                          lr_scheduler_type="constant")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    return [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


def first_loss(model: torch.nn.Module, rows: list[dict[str, list[int]]]) -> tuple[float, float]:
    """(the task loss + the aux losses, and the task loss alone), computed here by hand, of the untrained model
    on the whole dataset."""
    batch = {key: torch.tensor([row[key] for row in rows]) for key in rows[0]}
    labels = batch.pop("labels")
    with torch.no_grad():
        out = model.train()(**batch)
    logits = out.logits
    if logits.dim() == 3:  # next-token prediction
        logits, labels = logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
    task = float(F.cross_entropy(logits, labels))
    return task + float(sum(out.aux_losses.values())), task


@pytest.mark.parametrize("kind", ["lm_pa", "classifier_sg"])
def test_transformers_trainer_trains_an_interlayer_model_with_its_aux_loss(kind: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    if kind == "lm_pa":
        model = create_model("gpt_shakespeare_char", **CORE, predictive={})
        starts = torch.randint(0, 24, (ROWS,), generator=generator)
        rows = [{"input_ids": ((s + torch.arange(12)) % 24).tolist()} for s in starts]  # counting: learnable
        for row in rows:
            row["labels"] = row["input_ids"]
    else:
        model = create_model(dict(CORE, arch="encoder_classifier", num_classes=2,
                                  crossformer={"soft": ["kq", "ffn"], "alpha": 0.5}))
        ids = torch.randint(1, 24, (ROWS, 6), generator=generator)
        rows = [{"input_ids": row.tolist(), "attention_mask": [1] * 6, "labels": int(row[0] < 12)} for row in ids]
    with_aux, without_aux = first_loss(model, rows)
    logged = losses(model, rows, tmp_path)
    assert logged[0] == pytest.approx(with_aux, abs=2e-4)
    if kind == "classifier_sg":
        assert abs(with_aux - without_aux) > 1e-2  # the logged loss holds the SG term
    assert logged[-1] < 0.8 * logged[0]


# -- issue 41: Trainer's defaults save and resume tied weights and the step counters -------------------------------
from safetensors.torch import load_file  # noqa: E402

import interlayer  # noqa: E402
from helpers.hf import CASES as ENCODER_CASES  # noqa: E402
from helpers.hf_gpt2 import hf_gpt2  # noqa: E402
from interlayer.pretrained.transformers_classes.auto import to_transformers  # noqa: E402

STEPS = 4
IMPORTS = {  # kind -> (transformers model of helpers.hf/hf_gpt2, from_hf options)
    "gpt2_pa": ("tied", dict(extra_sections={"predictive": {"alpha": 0.3, "alpha_warmup_steps": 3}})),
    "gpt2_resformer": ("tied", dict(extra_sections={"value_residual": {"lambda_warmup_steps": 3}})),
    "bert_crossformer": ("bert_classifier", dict(extra_sections={"crossformer": {"hard": ["kq"]}},
                                                 reinitialise=True, num_classes=2)),
}


def imported(kind: str, folder: Path) -> torch.nn.Module:
    """The interlayer model of a tiny transformers model (written once to ``folder``), seeded."""
    case, options = IMPORTS[kind]
    if not (folder / "config.json").is_file():
        if case in ENCODER_CASES:
            config_class, model_class, fields = ENCODER_CASES[case]
            torch.manual_seed(0)
            getattr(transformers, model_class)(getattr(transformers, config_class)(**fields)).save_pretrained(
                str(folder))
        else:
            hf_gpt2(case).save_pretrained(str(folder))
    torch.manual_seed(1)
    return interlayer.from_hf(folder, **options).train()


def dataset(kind: str) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (16, 10), generator=generator)
    if kind.startswith("gpt2"):
        return [{"input_ids": row.tolist(), "labels": row.tolist()} for row in ids]
    return [{"input_ids": row.tolist(), "attention_mask": [1] * 10, "labels": int(row[0] < 25)} for row in ids]


def default_trainer(model: torch.nn.Module, kind: str, out: Path, **changes) -> "transformers.Trainer":
    """transformers' defaults but for where to write, how long, and how often to save."""
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=STEPS, save_steps=2, **changes)
    return transformers.Trainer(model=model, args=args, train_dataset=dataset(kind))


def counters(model: torch.nn.Module) -> list[float]:
    return [float(b) for name, b in model.named_buffers() if name.endswith("steps_done")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(IMPORTS))
def test_trainer_with_default_arguments_trains_saves_and_resumes_tied_weights(kind: str, tmp_path: Path) -> None:
    """The whole run, saved every 2 steps and at the end; then a run resumed from its step-2 checkpoint ends
    with the same weights and counters; every file loads back into the model, ties kept."""
    source = tmp_path / "source"
    source.mkdir()
    model = imported(kind, source)
    tied = interlayer.checkpoint.tie_map(model)
    assert tied  # the token table and the head, or Crossformer's kq pairs
    trainer = default_trainer(model, kind, tmp_path / "run")
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    if kind != "bert_crossformer":  # the warm-up counter followed the optimiser steps (OptimizerStepCallback)
        assert counters(model) and set(counters(model)) == {float(STEPS)}
    resumed = imported(kind, source)
    default_trainer(resumed, kind, tmp_path / "run").train(resume_from_checkpoint=str(tmp_path / "run" /
                                                                                     "checkpoint-2"))
    assert counters(resumed) == counters(model)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    for folder in (tmp_path / "final", tmp_path / "run" / "checkpoint-2"):
        saved = load_file(str(folder / "model.safetensors"))
        fresh = imported(kind, source)
        fresh.load_state_dict(saved)  # strict: the tied names left out of the file are restored
        assert interlayer.checkpoint.tie_map(fresh) == tied
        own = fresh.state_dict()
        assert own.keys() == saved.keys() and all(torch.equal(own[k], v) for k, v in saved.items())


@pytest.mark.slow
def test_gradient_checkpointing_argument_trains_the_same(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    logged = []
    for checkpointing in (False, True):
        model = imported("gpt2_pa", source)
        trainer = default_trainer(model, "gpt2_pa", tmp_path / str(checkpointing), logging_steps=1,
                                  gradient_checkpointing=checkpointing, save_strategy="no")
        trainer.train()
        assert model.is_gradient_checkpointing == checkpointing  # Trainer switched it on
        logged.append([entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
    assert logged[0] == pytest.approx(logged[1], abs=1e-5)


@pytest.mark.slow
def test_trainer_saves_the_transformers_class_as_a_folder_automodel_loads(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    hf = to_transformers(imported("gpt2_resformer", source))
    trainer = default_trainer(hf, "gpt2_resformer", tmp_path / "run")
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    ids = torch.tensor([dataset("gpt2_resformer")[0]["input_ids"]])
    with torch.no_grad():
        assert torch.equal(back(ids).logits, hf.eval()(ids).logits)
    resumed = to_transformers(imported("gpt2_resformer", source))
    default_trainer(resumed, "gpt2_resformer", tmp_path / "run").train(
        resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert counters(resumed) == counters(hf) == [float(STEPS)]  # one value source: layer 2 of 2


# -- issue 50: evaluation losses are the cross-entropy; predict's structure is the same for every method -----------
@pytest.mark.parametrize("method", [{}, {"crossformer": {"soft": ["kq", "ffn"], "alpha": 0.5}}], ids=["plain", "sg"])
def test_evaluate_gives_the_cross_entropy_and_predict_the_logits(method: dict, tmp_path: Path) -> None:
    """eval_loss of a Crossformer-SG model was the cross-entropy plus the soft-guidance term; predict gave a
    tuple (logits, aux_losses) for it and the logits for the others."""
    torch.manual_seed(0)
    hf = to_transformers(create_model("gpt_shakespeare_char", **CORE, **method))
    rows = [{"input_ids": row, "labels": row} for row in
            torch.randint(0, 24, (ROWS, 12), generator=torch.Generator().manual_seed(0)).tolist()]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          per_device_eval_batch_size=ROWS, disable_tqdm=True)
    trainer = transformers.Trainer(model=hf, args=args)
    ids = torch.tensor([row["input_ids"] for row in rows])
    with torch.no_grad():
        logits = hf.eval()(input_ids=ids).logits
        out = hf.train()(input_ids=ids, labels=ids)
    cross_entropy = float(F.cross_entropy(logits[:, :-1].reshape(-1, 24), ids[:, 1:].reshape(-1)))
    assert trainer.evaluate(rows)["eval_loss"] == pytest.approx(cross_entropy, abs=1e-5)
    assert float(out.lm_loss) == pytest.approx(cross_entropy, abs=1e-5)  # no dropout: the same in training mode
    if method:  # where the regulariser is in the loss, beside lm_loss
        assert float(out.loss) == pytest.approx(cross_entropy + float(out.aux_losses["crossformer_sg"]), abs=1e-5)
    predicted = trainer.predict(rows)
    assert isinstance(predicted.predictions, np.ndarray) and predicted.predictions.shape == (ROWS, 12, 24)
    assert np.allclose(predicted.predictions, logits.numpy(), atol=1e-5)
