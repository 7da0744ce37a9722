"""Hugging Face folders from strangers (pretrained/hf_files.py, pretrained/hf_load.py, checkpoint.size_checked_config):
shard indexes confined to the folder, config sizes the weights do not hold refused before any model is built,
and every bad file named with exit code 2. docs/reliability.md lists each case with its test."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.pretrained import tiny_state, write_bert
from interlayer.cli import main
from interlayer.errors import PretrainedError, TokenizerError
from interlayer.pretrained.hf import from_hf
from interlayer.pretrained.hf_files import read_weights


# -- Hugging Face folders from strangers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny random BERT, GPT-2 and ViT folders as ``transformers`` saves them (no download)."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf")
    models = {
        "bert": transformers.BertModel(transformers.BertConfig(
            vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=40)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=40, bos_token_id=0, eos_token_id=0)),
        "vit": transformers.ViTModel(transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16,
            patch_size=4)),
    }
    for name, model in models.items():
        model.save_pretrained(str(root / name))
    return {name: root / name for name in models}


def _stranger(hf_folders, tmp_path, name="bert") -> Path:
    folder = tmp_path / name
    shutil.copytree(hf_folders[name], folder)
    return folder


def _sharded(folder: Path, shard: str) -> None:
    """Replace model.safetensors by an index naming ``shard`` for every tensor."""
    names = list(load_file(str(folder / "model.safetensors")))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    (folder / "model.safetensors").unlink()


@pytest.mark.parametrize("shard, message", [
    ("/etc/passwd", r"weight_map names the shard '/etc/passwd'; a shard must be a file inside .* \(no absolute path"),
    ("../outside.safetensors", r"weight_map names the shard '\.\./outside\.safetensors'; a shard must be a file "),
    ("link.safetensors", r"link\.safetensors leads outside .* \(to .*outside\.safetensors\); a checkpoint folder may "
                         r"only read its own files: refused"),
    ("fifo.safetensors", r"fifo\.safetensors is not a regular file \(a FIFO, device or folder\); refused"),
])
def test_a_shard_index_pointing_outside_the_folder_is_refused(hf_folders, tmp_path, capsys, shard, message):
    folder = _stranger(hf_folders, tmp_path)
    shutil.copy(folder / "model.safetensors", tmp_path / "outside.safetensors")
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    os.mkfifo(folder / "fifo.safetensors")
    _sharded(folder, shard)
    with pytest.raises(PretrainedError, match=message):
        read_weights(folder)
    assert main(["train", "sst2", "--pretrained", str(folder), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_shard_index_inside_the_folder_still_loads(hf_folders, tmp_path):
    folder = _stranger(hf_folders, tmp_path)
    shutil.copy(folder / "model.safetensors", folder / "part-1.safetensors")
    _sharded(folder, "part-1.safetensors")
    assert set(read_weights(folder)) == set(load_file(str(hf_folders["bert"] / "model.safetensors")))


@pytest.mark.parametrize("name, changes, message", [
    ("bert", {"num_hidden_layers": 1_000}, r"lacks BERT encoder tensors encoder\.layer\.1\..* \(config\.json "
                                           r"declares 1000 layers, the weights hold 1\); refused before any"),
    ("gpt2", {"n_layer": 1_000}, r"lacks .* encoder tensors h\.1\..* \(config\.json declares 1000 layers, "
                                     r"the weights hold 1\)"),
    ("bert", {"vocab_size": 10 ** 12}, r"embeddings\.word_embeddings\.weight has shape \(60, 16\) but "
                                       r"encoder\.embed\.tokens\.weight expects \(1000000000000, 16\)"),
    ("gpt2", {"vocab_size": 10 ** 12}, r"wte\.weight has shape \(60, 16\) but encoder\.embed\.tokens\.weight "
                                       r"expects \(1000000000000, 16\)"),
])
def test_config_sizes_the_weights_do_not_hold_are_refused_before_any_model_is_built(hf_folders, tmp_path,
                                                                                    monkeypatch, name, changes,
                                                                                    message):
    import interlayer.pretrained.hf as hf

    folder = _stranger(hf_folders, tmp_path, name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    real_build, built = hf.build, []  # the device of every model built: only the shapes-only meta one may be
    monkeypatch.setattr(hf, "build", lambda config: built.append(torch.empty(0).device.type) or real_build(config))
    with pytest.raises(PretrainedError, match=message):
        from_hf(folder)
    assert set(built) <= {"meta"}


class _NotATensor:  # a pickled object of a class: what weights_only=True refuses
    pass


def _write(name: str, data):
    def damage(folder: Path) -> None:
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return damage


def _config(**changes):
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return damage


def _truncated(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _index(text: str):
    def damage(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors.index.json").write_text(text)
    return damage


def _pickle_bin(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save({"weight": _NotATensor()}, folder / "pytorch_model.bin")


def _bpe_files(vocab: str, merges: bytes = b"#version: 0.2\n"):
    def damage(folder: Path) -> None:
        (folder / "vocab.json").write_text(vocab)
        (folder / "merges.txt").write_bytes(merges)
    return damage


@pytest.mark.parametrize("name, damage, message", [
    ("bert", _truncated, r"model\.safetensors: not a readable safetensors file \(.*\); it may be truncated"),
    ("bert", _write("model.safetensors", b""), r"model\.safetensors: not a readable safetensors file"),
    ("bert", _write("model.safetensors", (2 ** 62).to_bytes(8, "little") + b"{}"),
     r"model\.safetensors: not a readable safetensors file"),
    ("bert", _write("config.json", "[1, 2]"), r"config\.json: expected a JSON object, got list"),
    ("bert", _write("config.json", b"\xff\xfe{}"), r"config\.json:1: not valid UTF-8"),
    ("bert", _config(model_type=["bert"]), r"config\.json: model_type=\['bert'\] is not supported"),
    ("bert", _index("garbage"), r"model\.safetensors\.index\.json:1:1: not valid JSON"),
    ("bert", _index("{}"), r"model\.safetensors\.index\.json: no weight_map"),
    ("bert", _pickle_bin, r"pytorch_model\.bin holds Python objects besides tensors, which interlayer does not "
                          r"unpickle"),
    ("bert", _write("vocab.txt", b"[PAD]\n\xff\xfe\x00\n"), r"vocab\.txt:2: not valid UTF-8"),
    ("gpt2", _bpe_files('{"a": 0, "b": 1}', b"#version: 0.2\n\xff\xfe\n"), r"merges\.txt:2: not valid UTF-8"),
    ("gpt2", _bpe_files('{"a": 0, "b": "x"}'), r"vocab\.json: token 'b' has the id 'x'; the ids of a vocabulary "
                                               r"of 2 tokens are the integers 0\.\.1"),
    ("gpt2", _bpe_files('{"a": 0, "b": 1000000000}'), r"vocab\.json: token 'b' has the id 1000000000"),
    ("vit", _config(patch_size=0), r"patch_size=0 must be positive"),
])
def test_bad_files_in_a_hugging_face_folder_are_exit_2_naming_the_file(hf_folders, tmp_path, capsys, name,
                                                                       damage, message):
    folder = _stranger(hf_folders, tmp_path, name)
    damage(folder)
    task = {"bert": "sst2", "gpt2": "lm", "vit": "fashion_mnist"}[name]
    assert main(["train", task, "--pretrained", str(folder), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_a_folder_asking_for_its_own_tokenizer_code_is_refused_and_none_of_it_runs(tmp_path, capsys):
    """``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` imports the code a tokenizer_config.json's
    auto_map names (transformers' behaviour, which interlayer does not change); interlayer's own loaders refuse such
    a folder: they never run its code, and its files alone do not say what that code does to a text."""
    folder = write_bert(tmp_path / "bert", tiny_state())
    marker = tmp_path / "ran"
    (folder / "tokenization_custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    refusal = (rf"{re.escape(str(folder / 'tokenizer_config.json'))}: auto_map asks for the folder's own tokenizer "
               r"code \(.*tokenization_custom.CustomTokenizer.*\), which interlayer never runs .*: refused")
    with pytest.raises(TokenizerError, match=refusal):
        from_hf(folder)
    assert main(["train", "sst2", "--pretrained", str(folder), "--run-dir", str(tmp_path / "run")]) == 2
    assert re.search(refusal, capsys.readouterr().err)
    assert not (tmp_path / "run").exists() and not marker.exists()
