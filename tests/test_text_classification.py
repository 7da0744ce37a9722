"""Text classification (SST-5, SST-2, SICK, MRPC): readers and their errors, vocabulary and pair encoding, batches,
metrics, model resolution, the CNN baseline, and tiny end-to-end runs through ``experiment.train`` and the CLI."""
import gzip
import json
import random
import re
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.finetune import MRPC_HEAD, SICK_HEAD
from interlayer import count_madds, count_parameters, get_config, load_pretrained
from interlayer.cli import main
from interlayer.core.config import ConfigError
from interlayer.data.classification import (
    CLS_ID,
    MRPC,
    SEP_ID,
    SICK,
    SST2,
    SST5,
    UNK_ID,
    Example,
    WordVocab,
    encode_example,
    tokenize,
)
from interlayer.data.text import DataError
from interlayer.experiment import train
from interlayer.models.cnn_text import CNNTextClassifier, CNNTextConfig
from interlayer.tasks import task_specs
from interlayer.training.config import TrainConfig

TINY = {"d_model": "32", "n_heads": "4", "d_ffn": "64", "enc_layers": "2"}
WORDS = {0: "awful dreadful", 1: "bad dull", 2: "plain okay", 3: "good nice", 4: "great superb"}


def _sst_lines(n: int, seed: int, classes: int = 5) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        label = rng.randrange(classes)
        words = rng.choices(WORDS[label].split() + ["the", "film", "is", ","], k=rng.randint(2, 7))
        lines.append(f"{label} {' '.join(words)}")
    return lines


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sst_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sst")
    return {"train": _write(root / "train.txt", _sst_lines(48, 1)),
            "valid": _write(root / "dev.txt", _sst_lines(12, 2)),
            "test": _write(root / "test.txt.gz", _sst_lines(12, 3), gz=True)}


@pytest.fixture(scope="module")
def mrpc_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mrpc")
    rng = random.Random(4)
    files = {}
    for split, n in (("train", 40), ("valid", 10), ("test", 10)):
        rows = [MRPC_HEAD]
        for i in range(n):
            a = " ".join(rng.choices(["He", "said", "the", "deal", "was", "done", "\"off\""], k=5)) + "."
            same = rng.random() < 0.5
            b = a if same else " ".join(rng.choices(["Markets", "fell", "on", "Friday"], k=4)) + "."
            rows.append(f"{int(same)}\t{i}\t{i + 1000}\t{a}\t{b}")
        files[split] = root / f"{split}.tsv"
        files[split].write_bytes(("\r\n".join(rows) + "\r\n").encode("utf-8"))
    return files


def _task(name: str, files: dict[str, Path], **data):
    spec = task_specs()[name]
    settings = spec.data_class(**{**{k: str(v) for k, v in files.items()}, **data})
    return spec, spec.make_task(settings, TrainConfig(**spec.train_defaults), None)


# -- readers ---------------------------------------------------------------------------------------------------
def test_sst_reader_plain_and_gzip(tmp_path):
    lines = ["4 a stirring , funny film", "0 one long string of cliches ."]
    for path in (_write(tmp_path / "a.txt", lines), _write(tmp_path / "a.txt.gz", lines, gz=True)):
        assert SST5.read(path) == [Example("a stirring , funny film", 4), Example("one long string of cliches .", 0)]


def test_sick_and_mrpc_readers(tmp_path):
    sick = _write(tmp_path / "sick.txt", [SICK_HEAD, "1\tA man runs\tA person moves\t4.5\tentailment",
                                          "2\tA dog\tNo dog\t1\tCONTRADICTION"])
    assert SICK.read(sick) == [Example("A man runs", 0, "A person moves"), Example("A dog", 2, "No dog")]
    mrpc = tmp_path / "mrpc.tsv"  # byte-order mark, CRLF, quotes inside a cell
    mrpc.write_bytes(f'{MRPC_HEAD}\r\n1\t7\t8\tHe said "yes".\tHe agreed.\r\n'.encode())
    assert MRPC.read(mrpc) == [Example('He said "yes".', 1, "He agreed.")]


def test_bundled_splits_have_the_published_sizes():
    sizes = {"sst5": (8544, 1101, 2210), "sst2": (6920, 872, 1821), "sick": (4500, 500, 4927),
             "mrpc": (3576, 500, 1725)}
    for name, expected in sizes.items():
        spec = task_specs()[name]
        data = spec.data_class()
        fmt = {"sst5": SST5, "sst2": SST2, "sick": SICK, "mrpc": MRPC}[name]
        assert tuple(len(fmt.read(data.resolve(getattr(data, s)))) for s in ("train", "valid", "test")) == expected


@pytest.mark.parametrize("fmt,lines,pattern", [
    (SST5, ["2 fine", "5 out of range"], r"bad\.txt:2: label '5' is not one of 0, 1, 2, 3, 4"),
    (SST2, ["1 fine", "2 neutral is not binary"], r"bad\.txt:2: label '2' is not one of 0, 1"),
    (SST5, ["x words"], r"bad\.txt:1: label 'x'"),
    (SST5, ["1 fine", "3"], r"bad\.txt:2: the sentence after the label is empty"),
    (SST5, ["1 fine", "", "2 ok"], r"bad\.txt:2: label ''"),
    (SICK, [SICK_HEAD, "1\ta\tb\t3.0"], r"bad\.txt:2: 4 tab-separated columns, expected 5"),
    (SICK, [SICK_HEAD, "1\ta\tb\t3.0\tMAYBE"], r"bad\.txt:2: entailment_judgment 'MAYBE' is not one of"),
    (SICK, [SICK_HEAD, "1\ta\t \t3.0\tNEUTRAL"], r"bad\.txt:2: sentence_B is empty"),
    (SICK, [SICK_HEAD, "1\ta\tb\thigh\tNEUTRAL"], r"bad\.txt:2: relatedness_score 'high' is not a number"),
    (SICK, ["id\ta\tb\tscore\tlabel"], r"bad\.txt:1: header .* does not match"),
    (SICK, [SICK_HEAD], r"bad\.txt: no examples"),
    (MRPC, [MRPC_HEAD, "2\t1\t2\ta\tb"], r"bad\.txt:2: Quality '2' is not 0 or 1"),
    (MRPC, [MRPC_HEAD, "1\t1\t2\ta\tb", "1\t1\t2\ta"], r"bad\.txt:3: 4 tab-separated columns"),
    (MRPC, [MRPC_HEAD, "1\t1\t2\t\tb"], r"bad\.txt:2: #1 String is empty"),
])
def test_malformed_rows_name_file_and_line(tmp_path, fmt, lines, pattern):
    with pytest.raises(DataError, match=pattern):
        fmt.read(_write(tmp_path / "bad.txt", lines))


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        SST5.read(tmp_path / "absent.txt")


# -- vocabulary and encoding -----------------------------------------------------------------------------------
def test_tokenize_keeps_words_splits_punctuation():
    assert tokenize('It wo n\'t re-imagine "Beauty", $2.5!') == [
        "it", "wo", "n't", "re-imagine", '"', "beauty", '"', ",", "$", "2", ".", "5", "!"]
    assert tokenize("Good", lowercase=False) == ["Good"]


def test_vocab_min_freq_lowercase_and_round_trip(tmp_path):
    texts = ["Good film", "good plot", "rare film"]
    vocab = WordVocab.build(texts, min_freq=2, lowercase=True)
    assert vocab.words[:4] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    assert vocab.encode("GOOD film rare") == [vocab.index["good"], vocab.index["film"], UNK_ID]
    cased = WordVocab.build(texts, min_freq=1, lowercase=False)
    assert cased.encode("Good")[0] != cased.encode("good")[0]
    vocab.save(tmp_path)
    again = WordVocab.load(tmp_path)
    assert again.words == vocab.words and again.encode("Good rare") == vocab.encode("Good rare")


def test_pair_encoding_segments_and_longest_first_truncation():
    vocab = WordVocab.build(["a b c d e f g h"], min_freq=1, lowercase=True)
    ids = {w: vocab.index[w] for w in "abcdefgh"}
    single = encode_example(vocab, Example("a b c", 0), max_len=4)
    assert single.ids == [CLS_ID, ids["a"], ids["b"], SEP_ID] and single.truncated
    pair = encode_example(vocab, Example("a b", 1, "c d e"), max_len=16)
    assert pair.ids == [CLS_ID, ids["a"], ids["b"], SEP_ID, ids["c"], ids["d"], ids["e"], SEP_ID]
    assert pair.segments == [0, 0, 0, 0, 1, 1, 1, 1] and not pair.truncated
    cut = encode_example(vocab, Example("a b c d e f", 1, "g h"), max_len=8)  # 5 words fit: the longer side gives
    assert cut.ids == [CLS_ID, ids["a"], ids["b"], ids["c"], SEP_ID, ids["g"], ids["h"], SEP_ID] and cut.truncated


# -- task: settings, batches, segments, metrics ---------------------------------------------------------------
@pytest.mark.parametrize("name,setting,pattern", [
    ("sst5", {"max_len": 2}, r"data\.max_len=2 must be at least 3"), ("mrpc", {"max_len": 4}, r"data\.max_len=4"),
    ("sst5", {"min_freq": 0}, r"data\.min_freq"), ("sst5", {"batch_size": 0}, r"data\.batch_size"),
    ("sst5", {"sort_pool": 0}, r"data\.sort_pool"), ("sst5", {"test": ""}, r"data\.test is empty")])
def test_invalid_data_settings_name_the_key(sst_files, mrpc_files, name, setting, pattern):
    files = sst_files if name == "sst5" else mrpc_files
    with pytest.raises(ConfigError, match=pattern):
        _task(name, files, **setting)


def test_data_settings_reach_the_vocabulary(sst_files):
    assert _task("sst5", sst_files, lowercase=False)[1].vocab.lowercase is False
    assert len(_task("sst5", sst_files, min_freq=1)[1].vocab) > len(_task("sst5", sst_files, min_freq=3)[1].vocab)


def test_batches_depend_on_seed_and_epoch_only_and_cover_every_example(sst_files):
    _, task = _task("sst5", sst_files, batch_size=8, sort_pool=3)
    first, again, other = task.train_batches(1, 7), task.train_batches(1, 7), task.train_batches(2, 7)
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(first, again))
    assert any(not torch.equal(a.tokens, b.tokens) for a, b in zip(first, other))
    assert sorted(sum((b.labels.tolist() for b in first), [])) == sorted(task.train_set.labels)
    assert all(b.segments is None for b in first) and max(len(b.labels) for b in first) == 8


def test_sort_pool_reduces_padding(sst_files):
    def padding(pool: int) -> int:
        _, task = _task("sst5", sst_files, batch_size=4, sort_pool=pool)
        return sum(int((b.tokens == 0).sum()) for b in task.train_batches(1, 1))

    assert padding(12) < padding(1)


def test_pair_task_feeds_segments_to_the_model(mrpc_files):
    spec, task = _task("mrpc", mrpc_files)
    assert task.model_fields()["n_segments"] == 2
    batch = task.train_batches(1, 1)[0]
    assert batch.segments is not None and batch.segments.max() == 1
    model = spec.model_from_dict(spec.resolve_model("transformer_text_cls", TINY, task).to_dict()).eval()
    logits = model(batch.tokens, segments=batch.segments).logits
    assert not torch.allclose(logits, model(batch.tokens, segments=torch.zeros_like(batch.segments)).logits)
    scores = task.validate(model)
    assert set(scores) == {"accuracy", "f1", "nll"}


def test_sample_input_feeds_attention_pictures(mrpc_files):
    spec, task = _task("mrpc", mrpc_files)
    args, kwargs, labels = spec.sample_input(task)
    assert labels[0] == "[CLS]" and labels.count("[SEP]") == 2 and len(labels) == args[0].shape[1]
    model = spec.model_from_dict(spec.resolve_model("pa_transformer_text", TINY, task).to_dict()).eval()
    attentions = model(*args, **kwargs, need_intermediates=True).encoder.attentions
    assert "predicted" in attentions[1].extras
    first_sep = labels.index("[SEP]")
    assert kwargs["segments"][0].tolist() == [0] * (first_sep + 1) + [1] * (len(labels) - first_sep - 1)


# -- model resolution ------------------------------------------------------------------------------------------
def test_text_presets_carry_the_paper_dropouts_and_user_sets_win(sst_files, tmp_path):
    spec, task = _task("sst5", sst_files)
    cfg = spec.resolve_model("pa_transformer_text", {}, task)
    assert (cfg.dropout, cfg.embed_dropout) == (0.2, 0.4)  # App. B.2.1
    assert cfg.src_vocab_size == len(task.vocab) and cfg.num_classes == 5 and cfg.n_segments == 0
    assert spec.resolve_model("transformer_text_cls", {"dropout": 0.3}, task).dropout == 0.3
    file = tmp_path / "model.json"
    get_config("transformer_text_cls", dropout=0.15).save(file)
    assert spec.resolve_model(str(file), {}, task).dropout == 0.15
    crossformer = spec.resolve_model("transformer_text_cls", {"crossformer.hard": ["kq"]}, task)
    assert crossformer.crossformer.hard == ["kq"]


def test_cnn_preset_and_cnn_config_file(sst_files, tmp_path):
    spec, task = _task("sst5", sst_files)
    cfg = spec.resolve_model("cnn_text", {"d_model": 32}, task)
    assert isinstance(cfg, CNNTextConfig) and cfg.d_model == 32 and cfg.src_vocab_size == len(task.vocab)
    assert isinstance(spec.model_from_dict(cfg.to_dict()), CNNTextClassifier)
    file = tmp_path / "cnn.json"
    CNNTextConfig(d_ffn=0).save(file)
    assert spec.resolve_model(str(file), {}, task).d_ffn == 0
    with pytest.raises(ConfigError, match="unknown key 'crossformer.hard'"):
        spec.resolve_model("cnn_text", {"crossformer.hard": ["kq"]}, task)


# -- the CNN baseline ------------------------------------------------------------------------------------------
def _cnn(**fields) -> CNNTextClassifier:
    return CNNTextClassifier(CNNTextConfig(**{"src_vocab_size": 30, "num_classes": 3, "d_model": 16, "d_ffn": 32,
                                              "enc_layers": 2, **fields}))


@pytest.mark.parametrize("fields", [{}, {"d_ffn": 0}, {"kernel_size": 5, "n_segments": 2}])
def test_cnn_madds_match_the_flop_counter(fields):
    model = _cnn(**fields).eval()
    tokens = torch.randint(1, 30, (1, 9))
    with FlopCounterMode(display=False) as counter:
        model(tokens, segments=torch.zeros_like(tokens))
    assert counter.get_total_flops() == 2 * count_madds(model, 9)


def test_cnn_without_ffn_is_the_literal_conv_stack():
    full, bare = _cnn(), _cnn(d_ffn=0)
    assert bare.layers[0].ffn is None and full.layers[0].ffn is not None
    assert count_parameters(full) - count_parameters(bare) == 2 * (2 * 16 * 32 + 32 + 16 + 2 * 16)


def test_cnn_padding_never_reaches_real_tokens_and_pooling_options_differ():
    torch.manual_seed(0)
    for pooling in ("mean", "max"):
        model = _cnn(pooling=pooling).eval()
        tokens = torch.tensor([[5, 6, 7]])
        padded = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]])
        assert torch.allclose(model(tokens).logits[0], model(padded).logits[0], atol=1e-6)
    mean, maximum = _cnn(pooling="mean"), _cnn(pooling="max")
    maximum.load_state_dict(mean.state_dict())
    tokens = torch.tensor([[5, 6, 7, 8]])
    assert not torch.allclose(mean.eval()(tokens).pooled, maximum.eval()(tokens).pooled)


def test_cnn_embedding_dropout_is_separate_and_all_parameters_learn():
    tokens = torch.tensor([[5, 6, 7, 8]])
    quiet = _cnn(dropout=0.0, embed_dropout=0.0).train()
    assert torch.equal(quiet(tokens).logits, quiet(tokens).logits)
    noisy = _cnn(dropout=0.0, embed_dropout=0.5).train()
    assert not torch.equal(noisy(tokens).logits, noisy(tokens).logits)
    model = _cnn(n_segments=2)
    model(tokens, segments=torch.tensor([[0, 0, 1, 1]])).logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if n != "tokens.weight") and model.tokens.weight.grad[5:9].abs().sum() > 0
    zeros = torch.zeros_like(tokens)
    assert torch.equal(model.eval()(tokens).logits, model(tokens, segments=zeros).logits)  # default: segment 0


def test_cnn_save_and_load_pretrained(tmp_path):
    from interlayer import save_pretrained

    model = _cnn(n_segments=2, pooling="max").eval()
    save_pretrained(model, tmp_path / "cnn")
    loaded = load_pretrained(tmp_path / "cnn").eval()
    assert isinstance(loaded, CNNTextClassifier) and loaded.config == model.config
    tokens, segments = torch.tensor([[3, 4, 5, 0]]), torch.tensor([[0, 0, 1, 0]])
    assert torch.equal(loaded(tokens, segments=segments).logits, model(tokens, segments=segments).logits)


@pytest.mark.parametrize("fields,key", [({"kernel_size": 2}, "kernel_size"), ({"num_classes": 1}, "num_classes"),
                                        ({"embed_dropout": 1.0}, "embed_dropout"), ({"d_ffn": -1}, "d_ffn")])
def test_cnn_invalid_settings_name_the_key(fields, key):
    with pytest.raises(ConfigError, match=key):
        _cnn(**fields)
    with pytest.raises(ConfigError, match="unknown key 'layers'"):
        CNNTextConfig.from_dict({"layers": 3})


# -- end to end ------------------------------------------------------------------------------------------------
def test_one_epoch_through_experiment_train(mrpc_files, tmp_path):
    sets = {**{f"data.{k}": str(v) for k, v in mrpc_files.items()}, "d_model": "16", "d_ffn": "32",
            "enc_layers": "2", "train.max_epochs": "1", "data.batch_size": "8"}
    results = train(task_specs()["mrpc"], preset="cnn_text", sets=sets, run_dir=tmp_path / "run", progress=False)
    assert results["status"] == "finished" and results["epochs"] == 1 and results["test_examples"] == 10
    assert {"test_accuracy", "test_f1", "best_valid", "non_embedding_parameters", "madds_at_128"} <= set(results)
    assert json.loads((tmp_path / "run" / "best" / "task.json").read_text())["task"] == "mrpc"
    assert isinstance(load_pretrained(tmp_path / "run" / "best"), CNNTextClassifier)


def test_cli_train_then_evaluate(sst_files, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "sst5", "--run-dir", str(run), "--no-progress", "--train", str(sst_files["train"]),
            "--set", f"data.valid={sst_files['valid']}", "--set", f"data.test={sst_files['test']}",
            "--set", "train.max_epochs=1", "--set", "data.batch_size=16",
            *(x for k, v in TINY.items() for x in ("--set", f"{k}={v}"))]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["task"] == "sst5" and 0 <= results["test_accuracy"] <= 100
    assert json.loads((run / "run.json").read_text())["model"]["dropout"] == 0.2
    assert main(["evaluate", "--checkpoint", str(run / "best")]) == 0
    out = capsys.readouterr().out
    assert "sst5 on" in out and "(12 examples): accuracy" in out and "| gold very positive" in out
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--data", str(sst_files["valid"])]) == 0
    assert str(sst_files["valid"]) in capsys.readouterr().out
    bad = _write(tmp_path / "bad.txt", ["7 nope"])
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--data", str(bad)]) == 2
    assert "bad.txt:1: label '7'" in capsys.readouterr().err


def test_a_text_input_longer_than_a_position_table_is_refused_with_file_and_line(tmp_path, capsys):
    for split, n in (("train", 40), ("valid", 8), ("test", 8)):
        lines = [f"{i % 2} the film is {'good' if i % 2 else 'bad'}" for i in range(n)]
        if split == "test":
            lines[5] = "1 " + " ".join(["great"] * 30)
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    sets = ["d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=1", "positions=learned", "max_positions=16",
            "train.max_epochs=1", *(f"data.{s}={tmp_path / f'{s}.txt'}" for s in ("train", "valid", "test"))]
    args = ["train", "sst2", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert main(args + [a for pair in sets for a in ("--set", pair)]) == 2
    assert re.search(r"test\.txt:6: the test example has \d+ tokens, more than the model's max_positions=16 "
                     r"\(positions='learned'\); set data\.max_len=16", capsys.readouterr().err)


def test_a_line_with_a_nul_byte_is_refused_naming_file_and_line(tmp_path):
    """NUL is valid UTF-8 but no text holds it: a binary file that happens to decode is refused as one (issue 43)."""
    from interlayer.data.text import read_lines

    path = tmp_path / "train.txt"
    path.write_bytes(b"1 a good film\n0 a b\x00d one\n")
    with pytest.raises(DataError, match=r"train\.txt:2: holds a NUL byte \(character 5 of the line\); no text file "
                                        r"holds one"):
        read_lines(path)
