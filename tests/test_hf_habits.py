"""Hugging Face habits (issue 31): every model class takes HF's keyword arguments and ``labels``, and returns
``.loss`` as the task computes it (shifted for the language model, -100 ignored, Multi-Pass exits and the
Crossformer-SG regulariser included the way the training engine includes them), ``last_hidden_state``,
``hidden_states``/``attentions`` on request, ``out["loss"]``/``out[0]`` and ``num_parameters()``."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from interlayer import create_model
from interlayer.tasks.language_modeling import LanguageModelingTask, LMData
from interlayer.training.config import TrainConfig

CORE = dict(src_vocab_size=40, d_model=16, n_heads=2, d_ffn=32, enc_layers=2, max_positions=32, dropout=0.0,
            attn_dropout=0.0)
SG = {"soft": ["kq", "ffn"], "alpha": 0.5}  # a visible regulariser
MPT_ALL = {"passes": 2, "loss": "all"}  # one loss per pass, in training mode


def by_hand(output, labels: torch.Tensor, shift: bool = False) -> torch.Tensor:
    """The engine's sum, written out: cross-entropy of every exit, plus every auxiliary loss."""
    total = torch.zeros(())
    for logits in output.exit_logits or [output.logits]:
        if shift:
            logits, target = logits[:, :-1], labels[:, 1:]
        else:
            target = labels
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
    return total + sum(output.aux_losses.values(), torch.zeros(()))


def lm(**method):
    torch.manual_seed(0)
    return create_model("gpt_shakespeare_char", **CORE, **method)


@pytest.mark.parametrize("method", [{}, {"predictive": {}}, {"crossformer": SG}, {"multipass": MPT_ALL}],
                         ids=["plain", "pa", "sg", "mpt_all"])
def test_causal_lm_takes_hf_arguments_and_returns_the_shifted_loss(method):
    model = lm(**method).train()
    ids = torch.randint(0, 40, (3, 10))
    mask = torch.ones_like(ids)
    labels = ids.clone()
    labels[0, :4] = -100  # no loss wanted there
    torch.manual_seed(1)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.allclose(out.loss, by_hand(out, labels, shift=True), atol=1e-6)
    if "crossformer" in method:  # the method's extra terms are really in the loss
        assert out.aux_losses["crossformer_sg"] > 0
    if "multipass" in method:
        assert len(out.exit_logits) == 2
    assert out["loss"] is out.loss and out[0] is out.loss and torch.equal(out[1], out.logits)
    positional = model(ids)  # today's call still works
    assert positional.loss is None and positional[0] is positional.logits
    assert out.last_hidden_state is out.encoder.hidden


def test_causal_lm_loss_equals_the_lm_tasks_loss(tmp_path: Path):
    text = tmp_path / "book.txt"
    text.write_text("".join(f"Line {i}: to be, or not to be.\n" for i in range(40)), encoding="utf-8")
    task = LanguageModelingTask(LMData(path=str(text), block_size=16, eval_interval=2), TrainConfig(max_tokens=64))
    model = create_model("gpt_shakespeare_char", **dict(CORE, src_vocab_size=len(task.tokenizer)),
                         crossformer=SG).train()  # the task's loss is the training loss (no dropout here)
    batch = task.train_batches(0, 0)[0]
    task_loss, logs, _ = task.loss(model, batch)
    ours = model(input_ids=batch, labels=batch).loss
    assert torch.allclose(ours, task_loss, atol=1e-5) and logs["crossformer_sg"] > 0


@pytest.mark.parametrize("method", [{"crossformer": SG}, {"multipass": MPT_ALL}], ids=["sg", "mpt_all"])
def test_eval_mode_loss_is_the_cross_entropy(method):
    """Issue 50: in eval mode ``.loss`` was cross-entropy + the SG term (3.730 = 3.110 + 0.619), so an evaluation
    loss or perplexity was wrong; the regulariser and the other exits belong to training only. ``lm_loss`` is the
    cross-entropy in both modes, for training code to log beside the loss."""
    model = lm(**method)
    ids = torch.randint(0, 40, (3, 10))
    for mode in (False, True):
        torch.manual_seed(1)
        out = model.train(mode)(input_ids=ids, labels=ids)
        cross_entropy = F.cross_entropy(out.logits[:, :-1].reshape(-1, 40), ids[:, 1:].reshape(-1))
        assert torch.allclose(out.lm_loss, cross_entropy, atol=1e-6)
        expected = by_hand(out, ids, shift=True) if mode else cross_entropy
        assert torch.allclose(out.loss, expected, atol=1e-6)
        assert mode == (not torch.allclose(out.loss, out.lm_loss))  # training adds something here
    if "crossformer" in method:
        assert out.aux_losses["crossformer_sg"] > 0  # still reported in eval mode, not added


def test_eval_mode_classifier_loss_is_the_cross_entropy():
    torch.manual_seed(0)
    model = create_model(dict(CORE, arch="encoder_classifier", num_classes=3, crossformer=SG)).eval()
    ids, labels = torch.randint(1, 40, (4, 6)), torch.tensor([0, 2, 1, 1])
    out = model(input_ids=ids, labels=labels)
    assert out.aux_losses["crossformer_sg"] > 0
    assert torch.allclose(out.loss, F.cross_entropy(out.logits, labels), atol=1e-6)


def test_hidden_states_and_attentions_on_request():
    model = lm().eval()
    ids = torch.randint(0, 40, (2, 7))
    out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 and torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert torch.equal(out.hidden_states[0], model.encoder.embed(ids))
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 7, 7)
    assert model(ids).hidden_states is None


@pytest.mark.parametrize("method", [{"crossformer": SG}, {"multipass": MPT_ALL}], ids=["sg", "mpt_all"])
def test_encoder_classifier_takes_hf_arguments(method):
    torch.manual_seed(0)
    model = create_model(dict(CORE, arch="encoder_classifier", num_classes=3, **method)).train()
    ids = torch.randint(1, 40, (4, 6))
    ids[1, -2:] = 0
    mask = (ids != 0).long()
    labels = torch.tensor([0, 2, 1, -100])
    torch.manual_seed(1)
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids), labels=labels)
    assert torch.allclose(out.loss, by_hand(out, labels), atol=1e-6)
    assert out.aux_losses or len(out.exit_logits) == 2
    model.eval()  # the mask means what the pad id means
    assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, model(ids).logits, atol=1e-6)


def test_image_classifier_takes_pixel_values_and_labels():
    torch.manual_seed(0)
    model = create_model("vit_fashion_mnist", d_model=16, n_heads=2, d_ffn=32, enc_layers=2,
                                crossformer=SG).train()
    pixels = torch.rand(3, 1, 28, 28)
    labels = torch.tensor([1, 5, 9])
    torch.manual_seed(1)
    out = model(pixel_values=pixels, labels=labels, output_hidden_states=True)
    assert torch.allclose(out.loss, by_hand(out, labels), atol=1e-6) and out.aux_losses
    assert out.hidden_states[-1] is out.last_hidden_state
    model.eval()
    assert torch.equal(model(pixel_values=pixels).logits, model(pixels).logits)


def test_encoder_decoder_takes_hf_arguments_and_labels():
    torch.manual_seed(0)
    model = create_model(dict(CORE, arch="encoder_decoder", dec_layers=2, crossformer=SG)).train()
    src = torch.randint(1, 40, (2, 6))
    src[1, -2:] = 0
    tgt_in = torch.randint(1, 40, (2, 5))
    labels = torch.randint(1, 40, (2, 5))
    labels[1, -1] = -100
    torch.manual_seed(1)
    out = model(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt_in, labels=labels)
    assert torch.allclose(out.loss, by_hand(out, labels), atol=1e-6) and out.aux_losses
    model.eval()
    assert torch.allclose(model(src, tgt_in).logits, model(input_ids=src, decoder_input_ids=tgt_in).logits)
    with pytest.raises(TypeError, match="decoder_input_ids"):
        model(input_ids=src, labels=labels)


def test_conflicting_inputs_are_refused():
    model = lm()
    ids = torch.randint(0, 40, (1, 4))
    with pytest.raises(TypeError, match="both tokens and input_ids"):
        model(ids, input_ids=ids)
    with pytest.raises(TypeError, match="both attention_mask and padding_mask"):
        model(ids, attention_mask=torch.ones_like(ids), padding_mask=ids == 0)


def test_num_parameters_counts_tied_weights_once():
    model = lm(crossformer={"hard": ["ffn"]})
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_parameters() == sum(unique.values())
    table = model.encoder.embed.tokens.weight.numel() + model.encoder.embed.positions.weight.numel()
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - table
    model.lm_head.requires_grad_(False)
    assert model.num_parameters(only_trainable=True) == model.num_parameters() - model.lm_head.weight.numel()


def test_dir_of_the_package_shows_the_public_api_only():
    import interlayer

    interlayer.create_model  # noqa: B018 (a lazy name once loaded, and the subpackages it imports, stay hidden)
    shown = dir(interlayer)
    assert shown == sorted([*interlayer.__all__, "__version__"])
    assert not {"Any", "importlib", "annotations", "core", "models"} & set(shown)
