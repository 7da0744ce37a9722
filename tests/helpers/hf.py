"""Tiny random Hugging Face encoders (BERT, ELECTRA, RoBERTa, XLM-R, DistilBERT, ViT): their configs, and the
reference outputs ``transformers`` gives on a padded text batch or random images."""
from __future__ import annotations

from typing import Any

import torch

VOCAB, D, HEADS, FFN, LAYERS, POSITIONS = 60, 16, 2, 32, 2, 40
TEXT = dict(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            intermediate_size=FFN, max_position_embeddings=POSITIONS)
VIT = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN, image_size=16,
           patch_size=4)
# case -> (config class, model class, config fields); every model is random, from transformers' own init.
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertConfig", "BertModel", TEXT),
    "bert_classifier": ("BertConfig", "BertForSequenceClassification", dict(TEXT, num_labels=3)),
    "electra": ("ElectraConfig", "ElectraModel", dict(TEXT, embedding_size=D)),
    "roberta": ("RobertaConfig", "RobertaModel", dict(TEXT, type_vocab_size=1)),
    "roberta_classifier": ("RobertaConfig", "RobertaForSequenceClassification",
                           dict(TEXT, type_vocab_size=1, num_labels=3)),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaModel", dict(TEXT, type_vocab_size=1)),
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(vocab_size=VOCAB, dim=D, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
                        max_position_embeddings=POSITIONS)),
    "vit": ("ViTConfig", "ViTModel", VIT),
    "vit_classifier": ("ViTConfig", "ViTForImageClassification", dict(VIT, num_labels=5)),
}


def text_ids(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids with padding at the end, at the start and in the middle (RoBERTa numbers only real tokens)."""
    ids = torch.randint(5, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    ids[0, 6:] = pad
    ids[1, :2] = pad
    ids[2, 3:5] = pad
    return ids, ids.ne(pad)


def images(n: int = 2) -> torch.Tensor:
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(2))


def reference(hf: Any, case: str) -> tuple[Any, Any]:
    """(transformers' output, our model's inputs) on a padded text batch or random images."""
    with torch.no_grad():
        if case.startswith("vit"):
            x = images()
            return hf(pixel_values=(x - 0.5) / 0.5, output_hidden_states=True), x
        ids, real = text_ids(hf.config.pad_token_id)
        return hf(input_ids=ids, attention_mask=real.long(), output_hidden_states=True), ids
