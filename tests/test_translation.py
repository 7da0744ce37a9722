"""Translation end to end on a tiny synthetic corpus: data checks, BPE, batching, decoding, training, CLI."""
import io
import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from helpers import set_args
from helpers.translation import sentence_pairs, write_corpus
from interlayer import create_model
from interlayer.checkpoint import canonical_state_dict
from interlayer.cli import main
from interlayer.data.batching import epoch_order, length_buckets
from interlayer.data.bpe import VocabPair
from interlayer.data.parallel import read_parallel
from interlayer.data.text import DataError
from interlayer.tasks.translation import TranslationData, TranslationTask, pad_batch, score
from interlayer.tasks.translation_decoding import DecodeOptions, beam_search, greedy_decode
from interlayer.training import state_file
from interlayer.training.config import TrainConfig
from interlayer.training.engine import LAST, Trainer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The tiny De-En corpus at 300/20/20 sentences, targets gzipped."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), {"train": (300, 1), "valid": (20, 2), "test": (20, 3)},
                        gzip_target=True)


def _data(corpus):
    return TranslationData(train_src=str(corpus / "train.de"), train_tgt=str(corpus / "train.en.gz"),
                           valid_src=str(corpus / "valid.de"), valid_tgt=str(corpus / "valid.en.gz"),
                           test_src=str(corpus / "test.de"), test_tgt=str(corpus / "test.en.gz"), vocab_size=80)


def _tiny_model(task):
    return create_model("transformer_multi30k", d_model=32, n_heads=4, d_ffn=64, enc_layers=2, dec_layers=2,
                        dropout=0.1, **task.model_fields())


# -- data ------------------------------------------------------------------------------------------------------
def test_unequal_line_counts_name_both_files(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    with pytest.raises(DataError, match=r"a\.de has 3 lines but .*a\.en has 2.*ends at line 2"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")


def test_bad_encoding_empty_file_and_long_line_name_file_and_line(tmp_path):
    (tmp_path / "bad.de").write_bytes("gut\n".encode() + b"schlecht \xff\n")
    with pytest.raises(DataError, match=r"bad\.de:2: not valid UTF-8"):
        read_parallel(tmp_path / "bad.de", tmp_path / "bad.de")
    (tmp_path / "empty.en").write_text("")
    with pytest.raises(DataError, match=r"empty\.en: the file is empty"):
        read_parallel(tmp_path / "empty.en", tmp_path / "empty.en")
    (tmp_path / "long.de").write_text("kurz\n" + "x" * 50 + "\n")
    with pytest.raises(DataError, match=r"long\.de:2: line has 50 characters"):
        read_parallel(tmp_path / "long.de", tmp_path / "long.de", max_chars=20)
    with pytest.raises(DataError, match="no such file"):
        read_parallel(tmp_path / "missing.de", tmp_path / "long.de")


def test_blank_pairs_are_dropped_from_training_and_counted_but_refused_in_evaluation(tmp_path):
    (tmp_path / "x.de").write_text("eins\n\ndrei\n")
    (tmp_path / "x.en").write_text("one\ntwo\nthree\n")
    corpus = read_parallel(tmp_path / "x.de", tmp_path / "x.en", drop_blank=True)
    assert (corpus.source, corpus.target, corpus.dropped_blank) == (["eins", "drei"], ["one", "three"], 1)
    with pytest.raises(DataError, match=r"x\.de:2: blank line"):
        read_parallel(tmp_path / "x.de", tmp_path / "x.en")


def test_bpe_decodes_to_the_original_text_and_saves(tmp_path, corpus):
    pairs = sentence_pairs(50, 9)
    for joint in (True, False):
        vocab = VocabPair.train([p[0] for p in pairs], [p[1] for p in pairs], 60, joint=joint)
        assert vocab.joint is joint
        text = "Ein große hund läuft schnell."  # characters seen in training (others become <unk>)
        assert vocab.source.decode(vocab.source.encode(text)) == text
        vocab.save(tmp_path)
        again = VocabPair.load(tmp_path)
        assert again.target.encode("A dog runs.") == vocab.target.encode("A dog runs.")


def test_token_batches_respect_the_budget_and_shuffle_by_epoch():
    lengths = [random.Random(i).randint(1, 30) for i in range(200)]
    batches = length_buckets(lengths, 64)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(lengths[i] for i in b) <= 64 for b in batches)
    assert epoch_order(batches, 1, 1) == epoch_order(batches, 1, 1)
    assert epoch_order(batches, 1, 1) != epoch_order(batches, 1, 2)
    with pytest.raises(ValueError, match="more than max_tokens"):
        length_buckets([100], 64)


# -- decoding --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    cfg = TrainConfig(max_epochs=3, max_tokens=400, warmup_steps=10, lr=3e-3, log_interval=5, keep_last=2,
                      average_last=2)
    task = TranslationTask(_data(corpus), cfg)
    model = _tiny_model(task)
    run = tmp_path_factory.mktemp("run")
    state = Trainer(task, model, cfg, run, progress=False).fit()
    return task, model, run, state


@pytest.mark.slow
def test_training_writes_logs_checkpoints_and_averages(trained):
    task, model, run, state = trained
    assert state.finished and state.epoch == 4
    assert (run / "best" / "vocab.json").is_file() and (run / "averaged" / "model.safetensors").is_file()
    assert sorted(p.name for p in run.glob("checkpoint[0-9]*.safetensors")) == ["checkpoint2.safetensors",
                                                                                 "checkpoint3.safetensors"]
    header = (run / "train.csv").read_text().splitlines()[0].split(",")
    assert {"loss", "nll", "lr", "units_per_s", "grad_norm"} <= set(header)
    valid = (run / "valid.csv").read_text().splitlines()
    assert len(valid) == 4 and "bleu" in valid[0]
    assert any(p.name.startswith("events") for p in (run / "tb").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_with_and_without_cache_agree(trained, beam):
    task, model, _, _ = trained
    model.eval()
    src = pad_batch(task.encode_sources(task.valid.source[:6]))
    decode = greedy_decode if beam == 1 else beam_search
    with_cache = decode(model, src, DecodeOptions(beam=beam, use_cache=True))
    without = decode(model, src, DecodeOptions(beam=beam, use_cache=False))
    assert with_cache == without and any(with_cache)


@pytest.mark.slow
def test_beam_of_one_is_greedy_and_batched_equals_single(trained):
    task, model, _, _ = trained
    model.eval()
    src = pad_batch(task.encode_sources(task.valid.source[:5]))
    greedy = greedy_decode(model, src)
    assert beam_search(model, src, DecodeOptions(beam=1)) == greedy
    singles = [beam_search(model, src[i : i + 1, : int(src[i].ne(0).sum())], DecodeOptions(beam=4))[0]
               for i in range(5)]
    assert beam_search(model, src, DecodeOptions(beam=4)) == singles


def test_sacrebleu_scores_detokenized_text_with_signature():
    result = score(["A dog runs fast."], ["A dog runs fast."])
    assert result["bleu"] == pytest.approx(100.0) and "tok:13a" in result["bleu_signature"]


# -- resume ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_interrupted_and_resumed_run_reaches_the_same_weights(corpus, tmp_path):
    cfg = TrainConfig(max_epochs=2, max_tokens=400, warmup_steps=10, lr=3e-3, log_interval=5, seed=3)
    task = TranslationTask(_data(corpus), cfg)
    torch.manual_seed(0)
    uninterrupted = _tiny_model(task)
    Trainer(task, uninterrupted, cfg, tmp_path / "a", progress=False).fit()

    torch.manual_seed(0)
    model = _tiny_model(task)
    trainer = Trainer(task, model, cfg, tmp_path / "b", progress=False)
    inner = task.loss
    steps_per_epoch = len(task.buckets)

    def stopping_loss(m, batch):
        if trainer.state.step == steps_per_epoch + 3:  # mid-way through the second epoch
            trainer.request_stop()
        return inner(m, batch)

    task.loss = stopping_loss
    state = trainer.fit()
    task.loss = inner
    assert not state.finished and "stopped by request" in state.stop_reason
    torch.manual_seed(123)  # the resumed run must not depend on the process's RNG
    resumed = _tiny_model(task)
    final = Trainer(task, resumed, cfg, tmp_path / "b", resume=True, progress=False).fit()
    assert final.finished and final.step == 2 * steps_per_epoch
    last = state_file.read(tmp_path / "b" / LAST)
    assert {"model", "model_config", "train_config", "optimizer", "rng", "state"} <= set(last)
    assert "vocab.json" in last["assets"] and last["optimizer"]["state"]
    a, b = canonical_state_dict(uninterrupted), canonical_state_dict(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_starting_over_an_existing_run_is_refused(trained):
    task, model, run, _ = trained
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(task, model, TrainConfig(), run)


# -- command line ----------------------------------------------------------------------------------------------
def _cli_args(corpus, run, *sets, **files):
    """``interlayer train translation`` of a tiny model for one epoch on the corpus (``files``: a split's file in
    place of the corpus's, ``train_src=path``)."""
    args = ["train", "translation", "--run-dir", str(run), "--no-progress", "--beam", "2", *set_args([
        "d_model=32", "n_heads=4", "d_ffn=64", "enc_layers=1", "dec_layers=1", "train.max_epochs=1",
        "train.max_tokens=400", "train.average_last=0", "data.vocab_size=80", *sets])]
    for split in ("train", "valid", "test"):
        args += [f"--{split}-src", str(files.get(f"{split}_src", corpus / f"{split}.de")),
                 f"--{split}-tgt", str(corpus / f"{split}.en.gz")]
    return args


@pytest.fixture(scope="module")
def cli_run(corpus, tmp_path_factory):
    """A run trained by ``interlayer train translation`` (module-scoped: a test that changes its files copies them)."""
    run = tmp_path_factory.mktemp("cli") / "run"
    assert main(_cli_args(corpus, run)) == 0
    return run


def test_cli_train_translate_evaluate(cli_run, tmp_path, capsys):
    run = cli_run
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished" and "nrefs:1" in results["bleu_signature"]
    capsys.readouterr()
    inp = tmp_path / "in.txt"
    inp.write_text("Ein hund läuft.\nEine katze.\n")
    assert main(["translate", "--checkpoint", str(run / "best"), "--input", str(inp), "--beam", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--beam", "1"]) == 0
    assert "BLEU" in capsys.readouterr().out
    assert main(["train", "translation", "--run-dir", str(run), "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err


# -- a damaged model folder, bad input, a sentence too long: refused in one line (issue 16) ---------------------
def _broken_model(run: Path, tmp_path: Path, damage: str) -> Path:
    model = tmp_path / "model"
    shutil.copytree(run / "best", model)
    if damage == "truncated":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[:-100])
    elif damage == "config":
        (model / "config.json").write_text('{"d_model": 32,\n "n_heads": }')
    elif damage == "vocab":
        (model / "vocab.json").write_text('{"joint": true, "source": 7}')
    elif damage == "task":
        (model / "task.json").write_text('{"task": "sst2"}')
    return model


@pytest.mark.parametrize("damage, message", [
    ("truncated", r"model\.safetensors: not a readable safetensors file .*truncated"),
    ("config", r"config\.json:2:13: not valid JSON"),
    ("vocab", r"vocab\.json is not a translation vocabulary"),
    ("task", r"holds a 'sst2' model .*not a translation model"),
])
def test_translate_refuses_a_damaged_or_foreign_model_folder(cli_run, tmp_path, capsys, monkeypatch, damage,
                                                             message):
    model = _broken_model(cli_run, tmp_path, damage)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ein hund\n")))
    assert main(["translate", "--checkpoint", str(model)]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_evaluate_refuses_a_task_json_naming_an_unknown_task(cli_run, tmp_path, capsys):
    model = _broken_model(cli_run, tmp_path, "none")
    (model / "task.json").write_text('{"task": "summarisation"}')
    assert main(["evaluate", "--checkpoint", str(model)]) == 2
    assert re.search(r"task\.json names the task 'summarisation'; known tasks: .*translation",
                     capsys.readouterr().err)


@pytest.mark.parametrize("stdin, message", [(b"", r"<stdin>: no input \(empty\)"),
                                            (b"ein hund\n\xff\xfe\n", r"<stdin>:2: not valid UTF-8"),
                                            (b"ein\n" + b"hund " * 300 + b"\n",
                                             r"<stdin>:2: the sentence has \d+ subword tokens .*max_positions=256")])
def test_translate_refuses_empty_undecodable_or_too_long_input(cli_run, capsys, monkeypatch, stdin, message):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert main(["translate", "--checkpoint", str(cli_run / "best")]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("split, message", [
    ("valid", r"valid\.de:3: the valid source sentence has \d+ tokens, more than the model's max_positions=48; "
              r"evaluation data is never cut"),
    ("train", r"train\.de:5: the train source sentence .*data\.max_tokens_per_sentence=48 drops such"),
])
def test_a_sentence_longer_than_max_positions_is_refused_before_training(corpus, tmp_path, capsys, split, message):
    lines = (corpus / f"{split}.de").read_text().splitlines()
    lines[2 if split == "valid" else 4] = " ".join(["hund"] * 80)
    if split == "train":
        lines[1] = ""  # a blank pair, dropped from training: the message must still name the file's line
    (tmp_path / f"{split}.de").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    assert main(_cli_args(corpus, run, "max_positions=48", **{f"{split}_src": tmp_path / f"{split}.de"})) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (run / "train.csv").exists()  # nothing trained


def test_label_smoothed_loss_matches_pytorch():
    from interlayer.core.losses import label_smoothed_nll

    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    loss, nll = label_smoothed_nll(logits, target, 0.1, ignore_index=0)
    flat, tgt = logits.reshape(-1, 11), target.reshape(-1)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(flat, tgt, ignore_index=0, label_smoothing=0.1))
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(flat, tgt, ignore_index=0))
