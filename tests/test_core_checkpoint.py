"""Checkpoints keep the config, keep tied tensors tied, and refuse weights from another model."""
import pytest
import torch

from interlayer import CheckpointError, create_model, load_pretrained, save_pretrained
from interlayer.checkpoint import WEIGHTS_FILE, canonical_state_dict, load_canonical_state_dict, tie_map


def test_round_trip_keeps_outputs_config_and_ties(tmp_path):
    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50).eval()
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    assert loaded.decoder.output_projection.weight is loaded.encoder.embed.tokens.weight
    src = torch.randint(1, 50, (2, 5))
    torch.testing.assert_close(loaded(src, src).logits, model(src, src).logits)


def test_canonical_state_dict_drops_aliases_and_reloads():
    model = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50)
    ties = tie_map(model)
    assert "encoder.embed.tokens.weight" in ties
    state = canonical_state_dict(model)
    assert not any(alias in state for group in ties.values() for alias in group)
    fresh = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50)
    load_canonical_state_dict(fresh, state)
    assert torch.equal(fresh.decoder.output_projection.weight, model.decoder.output_projection.weight)
    assert fresh.decoder.output_projection.weight is fresh.encoder.embed.tokens.weight


def test_weights_from_another_model_are_refused(tmp_path):
    small = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50)
    other = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=128, src_vocab_size=50)
    with pytest.raises(CheckpointError, match="fc1.weight has shape"):
        load_canonical_state_dict(other, canonical_state_dict(small))
    deeper = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50, enc_layers=4)
    with pytest.raises(CheckpointError, match="missing"):
        load_canonical_state_dict(deeper, canonical_state_dict(small))


def test_missing_files_and_mismatched_ties_are_reported(tmp_path):
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_pretrained(tmp_path)
    a = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50)
    b = create_model("transformer_small", d_model=32, n_heads=4, d_ffn=64, src_vocab_size=50, tie_output=False)
    save_pretrained(a, tmp_path / "a")
    save_pretrained(b, tmp_path / "b")
    (tmp_path / "b" / WEIGHTS_FILE).replace(tmp_path / "a" / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match="different models"):
        load_pretrained(tmp_path / "a")
