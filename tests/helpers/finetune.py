"""Tiny BERT fine-tuning inputs: a random BERT checkpoint in the Hugging Face layout, and small SST-2 / MRPC / SICK
files whose labels follow their words; ``fresh`` builds what a new fine-tuning run starts from."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from interlayer.build import build_model
from interlayer.config_io import dataclass_from_dict
from interlayer.experiment import initial_model, split_overrides, with_defaults
from interlayer.pretrained.bert import bert_config, encoder_parameter_map
from interlayer.tasks import task_specs
from interlayer.tasks.text_classification import TextClassificationTask
from interlayer.training.config import TrainConfig

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "is", "good", "bad", "a", "dull", "plot",
         "great", "not", "it", "was", "##s", ",", ".", "he", "said", "man", "runs", "dog"]
D, HEADS, FFN, LAYERS, MAX_POS = 16, 2, 32, 3, 32
GOOD, BAD = ["good", "great", "fine films"], ["bad", "dull", "not good"]
SICK_HEAD = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
MRPC_HEAD = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
SICK_LABELS = ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"]


def write_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A random BERT (``BertModel`` with its pooler, no classifier) in the Hugging Face layout."""
    hf = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": len(VOCAB), "hidden_size": D,
          "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": FFN, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": MAX_POS,
          "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0}
    shapes = dict(build_model(bert_config(hf, 0, num_classes=2, pooling="cls", pooler=True)).named_parameters())
    names = encoder_parameter_map(LAYERS) | {"pooler.dense.weight": "pooler.0.weight",
                                            "pooler.dense.bias": "pooler.0.bias"}
    gen = torch.Generator().manual_seed(seed)
    state = {hf_name: float(hf_name.endswith("LayerNorm.weight")) + 0.3 * torch.randn(shapes[core].shape,
                                                                                       generator=gen)
             for hf_name, core in names.items()}
    directory.mkdir(parents=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf))
    (directory / "vocab.txt").write_text("".join(f"{token}\n" for token in VOCAB))
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    return directory


def _sentence(rng: random.Random, label: int) -> str:
    words = rng.choices(["the film", "it was", "a plot", "he said"], k=1) + rng.choices((BAD, GOOD)[label], k=2)
    return " ".join(words) + rng.choice([" .", " ,", ""])


def _lines(fmt: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    if fmt == "sst2":
        return [f"{label} {_sentence(rng, label)}" for label in (rng.randrange(2) for _ in range(n))]
    rows = []
    for i in range(n):
        label = rng.randrange(3 if fmt == "sick" else 2)
        a, b = _sentence(rng, label % 2), _sentence(rng, rng.randrange(2))
        rows.append(f"{i}\t{a}\t{b}\t{rng.uniform(1, 5):.1f}\t{SICK_LABELS[label]}" if fmt == "sick"
                    else f"{label}\t{i}\t{i + 100}\t{a}\t{b}")
    return [SICK_HEAD if fmt == "sick" else MRPC_HEAD] + rows


def write_data(root: Path, fmt: str) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n, seed in (("train", 12, 1), ("valid", 4, 2), ("test", 4, 3)):
        files[split] = root / f"{fmt}.{split}.txt"
        files[split].write_text("\n".join(_lines(fmt, n, seed)) + "\n", encoding="utf-8")
    return files


def fresh(task_name: str, sets: dict[str, Any], seed: int = 1) -> tuple[Any, TextClassificationTask, Any, Any]:
    """What ``experiment.train`` builds for a fresh run: (spec, task, model, train config)."""
    spec = task_specs()[task_name]
    model_sets, train_sets, data_sets = split_overrides(with_defaults(spec, sets))
    train_cfg = dataclass_from_dict(TrainConfig, {**spec.train_defaults, "seed": seed, **train_sets}, "train.")
    task = spec.make_task(dataclass_from_dict(spec.data_class, data_sets, "data."), train_cfg, None)
    config = spec.resolve_model(spec.default_preset, model_sets, task)
    return spec, task, initial_model(spec, task, config.to_dict(), seed), train_cfg
