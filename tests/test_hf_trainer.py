"""``transformers.Trainer`` trains interlayer models (issue 31): a causal LM with Predictive Attention and a
classifier with Crossformer-SG, a few steps on CPU. The dataset is one batch, so the first logged loss is the
loss of the untrained model on all of it, whatever the order: it must equal ``model(**batch).loss`` with the
auxiliary loss in it, and later losses must be lower."""
from __future__ import annotations

from pathlib import Path

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
