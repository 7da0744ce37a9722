"""Checkpoints keep the config, keep tied tensors tied, and refuse weights from another model."""
import json

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


# -- sizes checked against the weights' header before any model is built (issue 43) ---------------------------------
def _tiny_lm_folder(directory, **fields):
    model = create_model("gpt_shakespeare_char", **{"src_vocab_size": 29, "d_model": 16, "n_heads": 2, "d_ffn": 32,
                                                    "enc_layers": 1, "max_positions": 16, **fields})
    return save_pretrained(model, directory)


def _edited(folder, **changes):
    """The folder with its config.json's interlayer config changed (what a hostile folder could say)."""
    data = json.loads((folder / "config.json").read_text())
    data["interlayer"]["config"].update(changes)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


FILE_HOLDS = r"holds \(\d+ tensors, none with a dimension above 32\); refused before any model was built"


@pytest.mark.parametrize("changes, message", [
    ({"enc_layers": 10_000_000}, rf"config\.json: enc_layers=10000000 is larger than anything .*model\.safetensors "
                                 rf"{FILE_HOLDS}"),
    ({"hyper_connections": {"rate": 100_000_000}}, rf"hyper_connections\.rate=100000000 is larger than anything "
                                                   rf".*{FILE_HOLDS}"),
    ({"src_vocab_size": 10 ** 12}, rf"src_vocab_size=1000000000000 is larger than anything .*{FILE_HOLDS}"),
    ({"d_model": 10 ** 9}, rf"d_model=1000000000 is larger than anything .*{FILE_HOLDS}"),
    ({"max_positions": 10 ** 12}, r"config\.json: max_positions=1000000000000 is more than 65,536, the longest "
                                  r"sequence interlayer builds position tables for .*; refused before any model was "
                                  r"built"),
    ({"mhc": {"rate": 50}}, r"describes a model of more than \d+ parameter tensors|does not fit this model"),
    ({"enc_layers": 60}, r"config\.json describes a model of more than \d+ parameter tensors, but .*model\.safetensors"
                         r" holds \d+; refused before any model was built"),
    ({"d_model": 64}, r"encoder\.embed\.tokens\.weight has shape \(29, 16\), the model expects \(29, 64\); refused "
                      r"before any model was built"),
    ({"max_positions": 60_000}, r"encoder\.embed\.positions\.weight has shape \(16, 16\), the model expects "
                                r"\(60000, 16\)"),
], ids=["layers", "hc_rate", "vocab", "width", "positions", "mhc_rate", "60_layers", "width_64", "positions_60k"])
def test_config_sizes_the_weights_do_not_hold_are_refused_before_any_model_is_built(tmp_path, real_builds, changes,
                                                                                    message):
    """Each size a folder's config.json may lie about: the weights' header refuses it before a model is built for
    real (enc_layers=10000000 built layers until memory ran out; the others ended in "can't allocate memory")."""
    folder = _edited(_tiny_lm_folder(tmp_path / "m"), **changes)
    real_builds.clear()
    with pytest.raises(CheckpointError, match=message):
        load_pretrained(folder)
    assert set(real_builds) <= {"meta"}


def test_the_size_check_stops_a_shapes_only_build_after_a_few_layers(tmp_path, monkeypatch):
    """enc_layers just under the cap: the meta build is stopped by the tensor budget, not run to the end."""
    from interlayer.core import encoder

    built = []
    layer = encoder.EncoderLayer.__init__
    monkeypatch.setattr(encoder.EncoderLayer, "__init__", lambda self, *a, **k: built.append(1) or layer(self, *a, **k))
    folder = _edited(_tiny_lm_folder(tmp_path / "m"), enc_layers=64)
    with pytest.raises(CheckpointError, match="parameter tensors"):
        load_pretrained(folder)
    assert 0 < len(built) < 64


def test_tables_outside_the_weights_are_bounded():
    """Step 4: buffers the file does not hold (a sinusoidal table of max_positions x d_model, 2-D relative index
    tables) may not exceed what the file holds, or 2^24 numbers."""
    from interlayer.checkpoint import BUFFER_FLOOR, check_buffers

    class Tables(torch.nn.Module):
        def __init__(self, rows):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 4))
            self.register_buffer("table", torch.zeros(rows, 256), persistent=False)

    shapes = {"weight": (4, 4)}
    with torch.device("meta"):
        check_buffers(Tables(BUFFER_FLOOR // 256), shapes, source="config.json", holder="model.safetensors")
        with pytest.raises(CheckpointError, match=r"config\.json describes a model whose tables outside the weights "
                                                  r"hold 16,777,472 numbers \(the largest, table, of shape "
                                                  r"\(65537, 256\)\), more than 16,777,216"):
            check_buffers(Tables(BUFFER_FLOOR // 256 + 1), shapes, source="config.json", holder="model.safetensors")


@pytest.mark.slow
def test_every_preset_passes_the_size_check_of_its_own_weights():
    """No false refusal: each preset's config against the shapes of its own tensors (built on meta), with the
    options that are no size of the weights (sinusoidal positions, warm-up steps) declared as such."""
    from interlayer.checkpoint import buffer_budget, check_config_sizes, tensor_extent
    from interlayer.models.registry import families, list_models

    for name in list_models():
        with torch.device("meta"):
            model = create_model(name)
        kind = next(kind for kind in families() if isinstance(model.config, kind.config_class))
        shapes = {k: tuple(v.shape) for k, v in canonical_state_dict(model).items()}
        aliases = sum(len(group) for group in tie_map(model).values())
        check_config_sizes(model.config.to_dict(), shapes, config_class=kind.config_class, source=name,
                           holder="its weights", aliases=aliases)
        assert tensor_extent(shapes, aliases)[1] > 0 and buffer_budget(shapes) > 0


@pytest.mark.parametrize("fields", [
    {"positions": "sinusoidal", "max_positions": 4096}, {"positions": "rotary", "max_positions": 4096},
    {"enc_layers": 2, "predictive": {"alpha_warmup_steps": 5000}}, {"mhc": {"sinkhorn_iters": 100}},
], ids=["sinusoidal", "rotary", "warmup", "sinkhorn"])
def test_a_tiny_model_with_settings_no_tensor_measures_round_trips(tmp_path, fields):
    """A model whose tensors are at most 32 wide keeps 4,096 sinusoidal or rotary positions and a warm-up of 5,000
    steps: those options are no size of the weights (WEIGHT_SIZES), and are not taken for a lie about them
    (tests/test_weight_sizes.py covers every option)."""
    folder = _tiny_lm_folder(tmp_path / "m", **fields)
    saved = json.loads((folder / "config.json").read_text())["interlayer"]["config"]
    assert load_pretrained(folder).config.to_dict() == saved
