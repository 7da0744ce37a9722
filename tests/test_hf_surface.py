"""The calls Hugging Face users make on a model (issue 41), on interlayer's own classes: ``transformers``' config
names, ``dtype``/``device``, activation checkpointing (recomputed layers, the same gradients), the embeddings and
``resize_token_embeddings`` (ties kept), state dicts with each tied tensor once (what ``safetensors`` and
``Trainer`` need) that still load into tied and untied models, ``return_dict``/``use_cache``, loading in eval
mode, ``from_hf(dtype=...)``, and the tokenizers' ``transformers`` call."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.lm import LM_EXAMPLES, lm
from interlayer import create_model, load_pretrained
from interlayer.checkpoint import tie_map
from interlayer.data.tokenizers.wordpiece import WordPieceTokenizer

CORE = dict(src_vocab_size=40, d_model=16, n_heads=2, d_ffn=32, enc_layers=3, max_positions=32, dropout=0.0,
            attn_dropout=0.0)
CASES = {"plain": {}, **LM_EXAMPLES}  # every method's language-model examples (Method.lm_examples)


def test_config_has_transformers_names_read_through_and_writable() -> None:
    model = lm()
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.max_position_embeddings, cfg.n_positions) == (40, 32, 4, 4, 64, 32, 32)
    assert cfg.model_type == "interlayer" and cfg.hidden_act == cfg.activation and not cfg.is_encoder_decoder
    assert cfg.eos_token_id is None and cfg.pad_token_id is None and cfg.use_cache and cfg.get_text_config() is cfg
    cfg.use_cache, cfg.eos_token_id = False, 3  # what Trainer and align_special_tokens write
    assert not cfg.use_cache and cfg.eos_token_id == 3 and "eos_token_id" not in cfg.to_dict()
    classifier = create_model(dict(CORE, arch="encoder_classifier", num_classes=3))
    assert classifier.config.num_labels == 3 and classifier.config.pad_token_id == 0
    assert classifier.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    classifier.config.vocab_size = 50
    assert classifier.config.src_vocab_size == 50


def test_dtype_and_device() -> None:
    model = lm()
    assert model.dtype == torch.float32 and model.device == torch.device("cpu")
    assert model.to(torch.float64).dtype == torch.float64


def grads(model: torch.nn.Module, tokens: torch.Tensor, **call) -> dict[str, torch.Tensor]:
    model.zero_grad()
    out = model(tokens, **call)
    (out.logits.float().square().mean() + sum(out.aux_losses.values(), torch.zeros(()))).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", list(CASES))
def test_activation_checkpointing_recomputes_layers_with_the_same_gradients(case: str) -> None:
    torch.manual_seed(0)
    model = create_model("gpt_shakespeare_char", **copy.deepcopy({**CORE, **CASES[case]})).train()
    tokens = torch.randint(0, 40, (2, 9))
    calls = []
    # a pre-hook: the recomputation stops once it has what the backward pass needs, before the forward hooks
    model.encoder.layers[1].register_forward_pre_hook(lambda *args: calls.append(1))
    reference = grads(model, tokens)
    passes = len(calls)  # how often a forward pass runs the layer (Multi-Pass: once per pass)
    calls.clear()
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    checkpointed = grads(model, tokens)
    assert passes >= 1 and len(calls) == 2 * passes  # the forward pass, and again in the backward pass
    assert reference.keys() == checkpointed.keys()
    for name, grad in reference.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name
    model.gradient_checkpointing_disable()
    calls.clear()
    grads(model, tokens)
    assert len(calls) == passes and not model.is_gradient_checkpointing


def test_activation_checkpointing_of_every_nth_layer_and_of_the_decoder() -> None:
    torch.manual_seed(0)
    model = create_model(dict(CORE, arch="encoder_decoder", dec_layers=2, dropout=0.1)).train()
    src, tgt = torch.randint(1, 40, (2, 6)), torch.randint(1, 40, (2, 5))
    calls = {"encoder": [], "decoder": []}
    for side in calls:
        for layer in getattr(model, side).layers:
            layer.register_forward_pre_hook(lambda *args, side=side: calls[side].append(1))
    torch.manual_seed(3)  # dropout on: the recomputation must draw the same masks
    reference = grads(model, src, tgt_tokens=tgt)
    model.gradient_checkpointing_enable(every_n_layers=2)
    for side in calls:
        calls[side].clear()
    torch.manual_seed(3)
    checkpointed = grads(model, src, tgt_tokens=tgt)
    assert len(calls["encoder"]) == 3 + 2 and len(calls["decoder"]) == 2 + 1  # layers 0 (and 2) run twice
    for name, grad in reference.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name
    with pytest.raises(ValueError, match="every_n_layers=0"):
        model.gradient_checkpointing_enable(every_n_layers=0)


@pytest.mark.parametrize("tied", [True, False])
def test_resize_token_embeddings_keeps_rows_and_ties(tied: bool) -> None:
    model = lm(tie_output=tied)
    table = model.get_input_embeddings()
    old = table.weight.detach().clone()
    head = model.get_output_embeddings().weight.detach().clone()
    new = model.resize_token_embeddings(45, pad_to_multiple_of=8)
    assert new.num_embeddings == 48 and model.config.vocab_size == 48 and model.lm_head.out_features == 48
    assert torch.equal(new.weight[:40], old) and torch.allclose(new.weight[40:], old.mean(0).expand(8, -1))
    assert torch.equal(model.lm_head.weight[:40], head)
    assert (model.lm_head.weight is new.weight) == tied and bool(tie_map(model)) == tied
    assert model(torch.tensor([[47, 1]])).logits.shape == (1, 2, 48)
    model.resize_token_embeddings(30)
    assert model.config.src_vocab_size == 30 and torch.equal(model.get_input_embeddings().weight, old[:30])


def test_state_dicts_hold_each_tied_tensor_once_and_load_tied_or_untied(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tied = create_model("gpt_shakespeare_char", **CORE, crossformer={"hard": ["kq"]})
    state = tied.state_dict()
    aliases = [alias for group in tie_map(tied).values() for alias in group]
    assert aliases and not set(aliases) & state.keys() and "lm_head.weight" not in state
    save_file(state, str(tmp_path / "w.safetensors"))  # safetensors refuses tensors that share memory
    fresh = create_model("gpt_shakespeare_char", **CORE, crossformer={"hard": ["kq"]})
    fresh.load_state_dict(load_file(str(tmp_path / "w.safetensors")))  # strict: the other names restored
    assert tie_map(fresh) == tie_map(tied) and fresh.lm_head.weight is fresh.encoder.embed.tokens.weight
    untied = create_model("gpt_shakespeare_char", **dict(CORE, tie_output=False))
    untied.load_state_dict(tied.state_dict())  # the state dict says what it left out
    assert torch.equal(untied.lm_head.weight, tied.lm_head.weight)
    tokens = torch.randint(0, 40, (1, 5))
    assert torch.equal(fresh(tokens).logits, tied(tokens).logits)


def test_forward_takes_return_dict_and_use_cache() -> None:
    model = lm()
    tokens = torch.randint(0, 40, (2, 6))
    out = model(input_ids=tokens, labels=tokens, use_cache=False)
    loss, logits = model(input_ids=tokens, labels=tokens, return_dict=False, use_cache=True)
    assert torch.equal(loss, out.loss) and torch.equal(logits, out.logits)
    classifier = create_model(dict(CORE, arch="encoder_classifier", num_classes=3, classifier_hidden=16)).eval()
    out = classifier(input_ids=tokens + 1)
    assert torch.equal(out.pooler_output, out.pooled) and classifier(tokens + 1, return_dict=False)[0].shape == (2, 3)


def test_loading_returns_eval_mode(tmp_path: Path) -> None:
    model = lm(dropout=0.5).train()
    model.save_pretrained(tmp_path / "m")
    back = load_pretrained(tmp_path / "m")
    assert not back.training
    tokens = torch.randint(0, 40, (2, 6))
    assert torch.equal(back(tokens).logits, back(tokens).logits)  # dropout off


def test_tokenizers_take_transformers_call() -> None:
    pytest.importorskip("transformers")
    from helpers.pretrained import TINY_VOCAB

    tokenizer = WordPieceTokenizer(TINY_VOCAB, do_lower_case=True)
    batch = tokenizer(["the cat sat", "a dog"], text_pair=["on the mat", "runs"], return_tensors="pt")
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    assert torch.equal(batch["attention_mask"], (~batch.padding_mask).long()) and batch["token_type_ids"].any()
    single = tokenizer("the cat", return_tensors="pt")
    assert single["input_ids"].shape[0] == 1 and single["input_ids"][0, 0] == tokenizer.token_id("cls_token")
    with pytest.raises(ValueError, match="return_tensors='np'"):
        tokenizer(["the cat"], return_tensors="np")

