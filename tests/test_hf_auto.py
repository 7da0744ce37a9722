"""Every interlayer model in plain ``transformers`` (issue 41): ``import interlayer`` registers ``model_type:
"interlayer"`` and its classes with the Auto classes (lazily: nothing of ``transformers`` at import), so an
``interlayer export`` of a ResFormer or PA language model loads with ``AutoModelForCausalLM`` and ``pipeline`` and
generates interlayer's tokens; ``--with-code`` folders load with ``trust_remote_code=True`` where interlayer is
not importable; interlayer never runs a folder's code; the exported tokenizer is a real ``tokenizer.json``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import interlayer
from interlayer.cli import main
from interlayer.data.tokenizers.language_model import ByteBPETokenizer, CharTokenizer, load_lm_tokenizer, save_tokenizer
from interlayer.pretrained.export import export
from interlayer.pretrained.transformers_classes.auto import to_transformers

transformers = pytest.importorskip("transformers")

from helpers.hf_gpt2 import TEXTS, gpt2_folder  # noqa: E402
from helpers.subprocess_python import run_python  # noqa: E402

SECTIONS = {"resformer": {"value_residual": {}}, "pa": {"predictive": {"alpha": 0.3, "init": "dirac"}}}
PROMPT = "To be, or not to be"


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    """A GPT-2 imported with ResFormer, and with PA, each exported by ``interlayer export``'s function (the
    ResFormer one with its code)."""
    root = tmp_path_factory.mktemp("auto")
    source = gpt2_folder(root / "gpt2")
    out = {}
    for name, section in SECTIONS.items():
        model = interlayer.from_hf(source, extra_sections=section)
        report = export(model, root / name, with_code=name == "resformer")
        assert report.format == "interlayer" and report.architecture == "InterlayerForCausalLM"
        out[name] = (model, root / name)
    return out


def prompt_ids(model: torch.nn.Module) -> torch.Tensor:
    return torch.tensor([model.tokenizer.encode(PROMPT)])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SECTIONS))
def test_an_exported_method_lm_loads_with_automodel_and_generates_interlayers_tokens(name: str, exports) -> None:
    model, folder = exports[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    assert type(hf).__name__ == "InterlayerForCausalLM" and not hf.training
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = prompt_ids(model)
    assert tokenizer(PROMPT, return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, model(ids).logits)
    ours = model.generate(ids, max_new_tokens=12)
    assert torch.equal(hf.generate(ids, max_new_tokens=12, do_sample=False), ours)
    assert torch.equal(hf.generate(ids, max_new_tokens=12, num_beams=3), model.generate(ids, max_new_tokens=12,
                                                                                         num_beams=3))
    pipe = transformers.pipeline("text-generation", model=str(folder))
    text = pipe(PROMPT, max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert text == PROMPT + model.tokenizer.decode(ours[0, ids.shape[1]:].tolist())


def test_transformers_loop_takes_the_options_interlayers_does_not(exports) -> None:
    """An option interlayer's decoding does not implement (no_repeat_ngram_size) runs transformers' own loop over
    the model, without a cache: the same tokens as that loop over GPT-2 itself, here on the plain import."""
    model, _ = exports["pa"]
    plain = interlayer.from_hf(Path(model.import_report.source))
    hf = to_transformers(plain)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model.import_report.source)
    ids = prompt_ids(model)
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=10, do_sample=False, no_repeat_ngram_size=2)
    assert torch.equal(hf.generate(ids, max_new_tokens=10, do_sample=False, no_repeat_ngram_size=2), theirs)


@pytest.mark.slow
def test_with_code_loads_where_interlayer_is_not_importable(exports, tmp_path: Path) -> None:
    model, folder = exports["resformer"]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_interlayer.InterlayerForCausalLM"
    assert (folder / "il_methods_value_residual.py").is_file() and not (folder / "il_models_registry.py").exists()
    from transformers.dynamic_module_utils import get_relative_import_files

    reached = {Path(f).name for f in get_relative_import_files(str(folder / "modeling_interlayer.py"))}
    assert reached == {p.name for p in folder.glob("*.py")} - {"modeling_interlayer.py"}  # all that transformers copies
    ids = prompt_ids(model)
    expected = model.generate(ids, max_new_tokens=8).tolist()
    out = run_python(f"""
        import sys, torch, transformers
        folder = {str(folder)!r}
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        ids = tokenizer({PROMPT!r}, return_tensors="pt")["input_ids"]
        print(hf.generate(ids, max_new_tokens=8, do_sample=False).tolist())
        print(type(hf).__module__.startswith("transformers_modules"), "interlayer" in sys.modules)
    """, with_interlayer=False)
    generated, flags = out.strip().splitlines()[-2:]
    assert generated == str(expected) and flags == "True False"


def test_interlayer_never_runs_a_folders_code(exports, tmp_path: Path) -> None:
    """With interlayer imported, its registered classes load a --with-code folder, even with trust_remote_code: a
    folder whose modeling file would write a marker and fail is loaded without running it."""
    _, folder = exports["resformer"]
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for path in folder.iterdir():
        (tampered / path.name).write_bytes(path.read_bytes())
    marker = tmp_path / "ran"
    (tampered / "modeling_interlayer.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('ran')\n")
    for trust in (False, True):
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(tampered), trust_remote_code=trust)
        assert type(hf).__module__ == "interlayer.pretrained.transformers_classes.modeling"
    interlayer.load_pretrained(tampered)
    assert not marker.exists()


@pytest.mark.slow
def test_import_interlayer_registers_only_when_transformers_is_used() -> None:
    out = run_python("""
        import sys, interlayer
        print("transformers" in sys.modules)
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        print("interlayer" in CONFIG_MAPPING)
        config = AutoConfig.for_model("interlayer")
        print(type(config) in AutoModelForCausalLM._model_mapping)
        import transformers.trainer as trainer
        print([c.__name__ for c in trainer.DEFAULT_CALLBACKS if c.__name__ == "OptimizerStepCallback"])
    """)
    assert out.split("\n")[:4] == ["False", "True", "True", "['OptimizerStepCallback']"]


def test_after_import_calls_back_after_the_import_or_at_once(tmp_path: Path, monkeypatch) -> None:
    """The mechanism: a module not imported yet calls back once imported (and is imported as usual); one already
    imported, at once; a failing callback warns and leaves the import done."""
    from interlayer.plugins import after_import

    (tmp_path / "later_module.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import("later_module", lambda module: seen.append(module.VALUE))
    after_import("later_module", lambda module: 1 / 0)
    assert seen == []
    with pytest.warns(UserWarning, match="after importing later_module: ZeroDivisionError"):
        import later_module  # noqa: F401
    assert seen == [3] and later_module.__loader__.__class__.__name__ != "_CallbacksAfterExec"
    after_import("later_module", lambda module: seen.append("again"))
    assert seen == [3, "again"]


@pytest.mark.slow
def test_without_transformers_interlayer_works(tmp_path: Path) -> None:
    out = run_python(f"""
        import sys
        class Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "transformers":
                    raise ImportError("transformers is not installed here")
        sys.meta_path.insert(0, Blocked())
        import torch, interlayer
        model = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=20, d_model=16, n_heads=2, d_ffn=32,
                                        enc_layers=2, max_positions=16, value_residual={{}})
        model.save_pretrained({str(tmp_path / "m")!r})
        back = interlayer.load_pretrained({str(tmp_path / "m")!r})
        print(back.generate(torch.tensor([[1, 2]]), max_new_tokens=3, num_beams=2).shape, back.training)
        try:
            model.generation_config
        except ImportError as err:
            print("no generation_config:", "transformers is not installed" in str(err))
    """)
    assert out.split("\n")[:2] == ["torch.Size([1, 5]) False", "no generation_config: True"]


def test_classifiers_load_with_their_auto_classes(tmp_path: Path) -> None:
    """A text classifier with PA and an image classifier with value residuals: AutoModelFor{Sequence,Image}
    Classification give their logits and labels, AutoModel the last hidden state."""
    torch.manual_seed(0)
    text = interlayer.create_model(dict(src_vocab_size=30, d_model=16, n_heads=2, d_ffn=32, enc_layers=2,
                                        max_positions=16, arch="encoder_classifier", num_classes=3,
                                        predictive={})).eval()
    image = interlayer.create_model("vit_fashion_mnist", d_model=16, n_heads=2, d_ffn=32, enc_layers=2,
                                    value_residual={}).eval()
    ids = torch.randint(1, 30, (2, 7))
    pixels = torch.rand(2, 1, 28, 28)
    for model, auto, inputs, labels in ((text, "AutoModelForSequenceClassification", {"input_ids": ids},
                                         ["neg", "mid", "pos"]),
                                        (image, "AutoModelForImageClassification", {"pixel_values": pixels}, None)):
        report = export(model, tmp_path / auto, labels=labels, tokenizer=False)
        hf = getattr(transformers, auto).from_pretrained(str(tmp_path / auto))
        with torch.no_grad():
            assert torch.equal(hf(**inputs).logits, model(**inputs).logits), report.architecture
            base = transformers.AutoModel.from_pretrained(str(tmp_path / auto))
            assert torch.equal(base(**inputs).last_hidden_state, model(**inputs).last_hidden_state)
    assert hf.config.num_labels == 10
    assert transformers.AutoConfig.from_pretrained(str(tmp_path / "AutoModelForSequenceClassification")).id2label \
        == {0: "neg", 1: "mid", 2: "pos"}
    with pytest.raises(ValueError, match="AutoModelForSequenceClassification"):
        transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "AutoModelForSequenceClassification"))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_lm_tokenizers_are_real_tokenizer_json_and_the_old_wrapper_still_reads(kind: str, tmp_path: Path) -> None:
    text = "".join(TEXTS)
    tokenizer = CharTokenizer.train([text]) if kind == "char" else ByteBPETokenizer.train([text], 300)
    (tmp_path / "new").mkdir()
    save_tokenizer(tokenizer, tmp_path / "new", max_length=64)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "new"))
    ids = tokenizer.encode(text)
    assert hf(text)["input_ids"] == ids and hf.decode(ids) == text and hf.model_max_length == 64
    assert load_lm_tokenizer(tmp_path / "new").encode(text) == ids
    old = tmp_path / "old"  # the format interlayer wrote before: {"kind": ..., ...}
    old.mkdir()
    wrapper = ({"kind": "char", "chars": "".join(tokenizer.chars)} if kind == "char"
               else {"kind": "bpe", "tokenizer": tokenizer.tokenizer.to_str()})
    (old / "tokenizer.json").write_text(json.dumps(wrapper))
    assert load_lm_tokenizer(old).encode(text) == ids
    short, long = tokenizer.encode(text[:5]), tokenizer.encode(text[:9])
    batch = tokenizer([text[:5], text[:9]], return_tensors="pt", padding_side="left")  # HF's keys and padding
    assert batch["attention_mask"][0].tolist() == [0] * (len(long) - len(short)) + [1] * len(short)
    assert batch["input_ids"][0, -len(short):].tolist() == short and batch["input_ids"][1].tolist() == long


def test_an_old_lm_run_exports_a_tokenizer_autotokenizer_loads(tmp_path: Path, capsys) -> None:
    """A run folder written before the real tokenizer.json (the wrapper) exports one AutoTokenizer loads."""
    torch.manual_seed(0)
    tokenizer = CharTokenizer.train(["".join(TEXTS)])
    model = interlayer.create_model("gpt_shakespeare_char", src_vocab_size=len(tokenizer), d_model=16, n_heads=2,
                                    d_ffn=32, enc_layers=2, max_positions=16, value_residual={})
    run = tmp_path / "run" / "best"
    model.save_pretrained(run)
    (run / "tokenizer.json").write_text(json.dumps({"kind": "char", "chars": "".join(tokenizer.chars)}))
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert "InterlayerForCausalLM" in capsys.readouterr().out
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert hf("To be")["input_ids"] == tokenizer.encode("To be")
    assert "- tokenizer: characters, " in (tmp_path / "out" / "README.md").read_text()


def test_a_gpt2_architecture_with_a_character_tokenizer_exports_natively(tmp_path: Path) -> None:
    """Exports GPT-2 computes stay GPT-2's own classes; the character tokenizer goes along as tokenizer.json."""
    tokenizer = CharTokenizer.train(["".join(TEXTS)])
    torch.manual_seed(0)
    model = interlayer.create_model("gpt2_small", src_vocab_size=len(tokenizer), d_model=16, n_heads=2, d_ffn=32,
                                    enc_layers=2, max_positions=32).eval()
    model.tokenizer = tokenizer
    report = export(model, tmp_path / "out")
    assert (report.format, report.architecture) == ("transformers", "GPT2LMHeadModel")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    ids = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))("To be", return_tensors="pt")["input_ids"]
    assert ids.tolist() == [tokenizer.encode("To be")]
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max() < 1e-5
