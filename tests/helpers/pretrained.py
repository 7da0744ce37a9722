"""Tiny random BERT folders in the Hugging Face layout (config.json, weights, vocab.txt, tokenizer_config.json)
in every weight layout: safetensors, a ``.bin`` pickle, two safetensors shards with their index."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from interlayer.pretrained.bert import encoder_parameter_map

TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "a", "dog",
              ",", ".", "!", "runs", "big", "Cat", "caf", "##e", "naive"]
D, HEADS, FFN, LAYERS, MAX_POS = 32, 4, 64, 3, 16


def tiny_state(layers: int = LAYERS, *, pooler: bool = True, classes: int = 0, seed: int = 0
               ) -> dict[str, torch.Tensor]:
    """Random tensors under BERT's Hugging Face names (no prefix)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"embeddings.word_embeddings.weight": (len(TINY_VOCAB), D),
              "embeddings.position_embeddings.weight": (MAX_POS, D),
              "embeddings.token_type_embeddings.weight": (2, D)}
    for name in encoder_parameter_map(layers):
        if name in shapes:
            continue
        if "LayerNorm" in name or name.endswith("bias"):
            width = FFN if "intermediate" in name else D
            shapes[name] = (width,)
        elif "intermediate" in name:
            shapes[name] = (FFN, D)
        elif ".output.dense" in name and "attention" not in name:
            shapes[name] = (D, FFN)
        else:
            shapes[name] = (D, D)
    if pooler:
        shapes.update({"pooler.dense.weight": (D, D), "pooler.dense.bias": (D,)})
    if classes:
        shapes.update({"classifier.weight": (classes, D), "classifier.bias": (classes,)})
    return {name: float("LayerNorm.weight" in name) + 0.3 * torch.randn(shape, generator=gen)
            for name, shape in shapes.items()}


def hf_config(**changes: Any) -> dict[str, Any]:
    return dict({"architectures": ["BertModel"], "model_type": "bert", "vocab_size": len(TINY_VOCAB),
                 "hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                 "intermediate_size": FFN, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                 "attention_probs_dropout_prob": 0.1, "max_position_embeddings": MAX_POS, "type_vocab_size": 2,
                 "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
                 "position_embedding_type": "absolute"}, **changes)


def write_bert(directory: Path, state: dict[str, torch.Tensor], *, fmt: str = "safetensors",
               lower_case: bool = True, **config: Any) -> Path:
    """A Hugging Face BERT directory: config.json, weights, vocab.txt and tokenizer_config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config(**config)))
    if fmt == "safetensors":
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    elif fmt == "bin":
        torch.save(state, directory / "pytorch_model.bin")
    else:  # two safetensors shards and their index
        names = sorted(state)
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for shard, keys in shards.items():
            save_file({k: state[k] for k in keys}, str(directory / shard), metadata={"format": "pt"})
        index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "vocab.txt").write_text("".join(f"{t}\n" for t in TINY_VOCAB))
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower_case,
                                                                 "model_max_length": 512}))
    return directory
