"""The ``vqa`` task: training and evaluating MCAN from the command line on a tiny Sort-of-CLEVR and on VQA v2 files,
the BCE on soft scores, the fixed noise of the noisy evaluation, PAvPU through ``score``, and the MCAN variants of
``compare``. Models are tiny (d_model 16, one layer) and data sets a few dozen questions."""
import collections
import json
import types

import numpy as np
import pytest
import torch
from torch import nn

from helpers import set_args
from helpers.folders import saved_config
from interlayer.cli import main
from interlayer.compare.plan import Settings, build_plan
from interlayer.data import sort_of_clevr as soc
from interlayer.data.vqa_formats import open_features
from interlayer.errors import VariantError
from interlayer.experiment import train
from interlayer.tasks import task_specs
from interlayer.tasks import vqa as vqa_task
from interlayer.tasks.vqa import VQATask, score
from interlayer.tasks.vqa_data import PAD, RegionImages, VQAData, load_test_split
from interlayer.training.config import TrainConfig

TINY_MODEL = ["d_model=16", "n_heads=2", "d_ffn=32", "layers=1", "word_dim=8", "flat_mlp=16", "fused_dim=16"]
TINY_SOC = ["data.train_size=32", "data.valid_size=8", "data.test_size=8", "data.batch_size=16",
            "data.pavpu_samples=3", "train.max_epochs=1", "train.log_interval=1", "feature_dim=4"]


def test_train_and_evaluate_sort_of_clevr(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", "vqa", "--dataset", "sort_of_clevr", "--run-dir", str(run), "--no-progress",
                 *set_args(TINY_MODEL + TINY_SOC + ["train.seed=7"])]) == 0
    results = json.loads((run / "results.json").read_text())
    for key in ("test_accuracy", "test_accuracy_relational", "test_accuracy_non_relational", "test_pavpu",
                "test_noisy_accuracy", "test_noisy_accuracy_relational", "test_noisy_pavpu"):
        assert 0.0 <= results[key] <= 100.0, key
    counts = results["test_pavpu_counts"]
    assert sum(counts.values()) == 8
    assert results["test_pavpu"] == pytest.approx(
        100 * (counts["accurate_certain"] + counts["inaccurate_uncertain"]) / 8)
    assert set(results["test_per_type"]) <= set(soc.TEMPLATES)
    assert (run / "attention.png").stat().st_size > 1000 and "noise std 1.0" in (run / "test_report.txt").read_text()
    config = saved_config(run / "best")
    assert (config["image_input"], config["num_answers"], config["vocab_size"]) == ("pixels", 10,
                                                                                   2 + len(soc.WORDS))
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--noise-std", "1.0"]) == 0
    report = capsys.readouterr().out
    assert "noise std 1.0" in report and "accuracy_relational" in report and "closest" in report
    row = [cell.strip() for cell in report.split("| accuracy ")[1].split("\n")[0].split("|")]
    # the run's seed: the same noise and attention samples as the run's own scoring
    assert row[1:3] == [f"{results['test_accuracy']:.2f}", f"{results['test_noisy_accuracy']:.2f}"]
    pavpu = [cell.strip() for cell in report.split("| pavpu ")[1].split("\n")[0].split("|")]
    assert pavpu[1:3] == [f"{results['test_pavpu']:.2f}", f"{results['test_noisy_pavpu']:.2f}"]
    seeds = []
    real_score = vqa_task.score
    monkeypatch.setattr(vqa_task, "score", lambda *args, **kwargs: seeds.append(kwargs["seed"]) or real_score(
        *args, **kwargs))
    assert main(["evaluate", "--checkpoint", str(run / "best"), "--noise-std", "0.5"]) == 0
    assert seeds == [7, 7]


@pytest.mark.slow
def test_sort_of_clevr_as_object_regions(tmp_path, capsys):
    """``data.image_features=objects``: MCAN reads six 365-d regions (no stem), noise goes onto those features,
    the checkpoint's evaluation rebuilds the same regions, and the option is refused for the path data sets."""
    run = tmp_path / "run"
    assert main(["train", "vqa", "--run-dir", str(run), "--no-progress",
                 *set_args(TINY_MODEL + TINY_SOC[:-1] + ["data.image_features=objects"])]) == 0
    config = saved_config(run / "best")
    assert (config["image_input"], config["feature_dim"], config["max_regions"]) == ("features", 365, 6)
    results = json.loads((run / "results.json").read_text())
    assert (run / "attention.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run / "best")]) == 0
    assert f"{results['test_accuracy']:.2f}" in capsys.readouterr().out.split("accuracy ")[1].split("\n")[0]
    assert main(["train", "vqa", "--dataset", "vqa2", "--data-dir", str(tmp_path), "--run-dir", str(tmp_path / "r"),
                 "--set", "data.image_features=objects"]) == 2
    assert "data.image_features=objects" in capsys.readouterr().err
    assert main(["train", "vqa", "--run-dir", str(tmp_path / "r2"), "--set", "data.image_features=objects",
                 "--set", "feature_dim=24"]) == 2
    assert "feature_dim=24" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["train", "vqa", "--dataset", "vqa2", "--run-dir", str(tmp_path / "r")]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert main(["train", "vqa", "--dataset", "clevr", "--data-dir", str(tmp_path), "--run-dir",
                 str(tmp_path / "r")]) == 2
    assert "CLEVR_train_questions.json: no such file" in capsys.readouterr().err


def _vqa_folder(root):
    """VQA v2 in its publisher's layout: 8 training images with 2 questions each, 2 validation images, and MCAN's
    per-image .npz features (4-d, 3 or 5 regions, transposed as MCAN stores them)."""
    rng = np.random.RandomState(0)
    for part, images in (("train2014", range(8)), ("val2014", range(100, 102))):
        (root / part).mkdir(parents=True)
        questions, annotations = [], []
        for image in images:
            np.savez(root / part / f"COCO_{part}_{image:012d}.jpg.npz",
                     x=rng.rand(4, 3 + image % 3).astype(np.float32))
            for k, (text, answer) in enumerate((("Is it red?", "yes" if image % 2 else "no"),
                                                ("How many cats?", "two"))):
                qid = image * 10 + k
                questions.append({"image_id": image, "question": text, "question_id": qid})
                humans = [answer] * 7 + ["no"] * 3
                annotations.append({"question_id": qid, "image_id": image, "question_type": text.split()[0].lower(),
                                    "answer_type": "other", "multiple_choice_answer": answer,
                                    "answers": [{"answer": a, "answer_id": j} for j, a in enumerate(humans)]})
        split = part
        (root / f"v2_OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps({"questions": questions}))
        (root / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps({"annotations": annotations}))


def test_train_on_vqa2_files(tmp_path):
    _vqa_folder(tmp_path / "vqa")
    spec = task_specs()["vqa"]
    sets = {"data.dataset": "vqa2", "data.dir": str(tmp_path / "vqa"), "data.feature_dim": 4,
            "data.min_answer_count": 1, "data.valid_fraction": 0.25, "data.batch_size": 4, "data.pavpu_samples": 2,
            "train.max_epochs": 1,
            "train.log_interval": 1, **dict(item.split("=") for item in TINY_MODEL)}
    results = train(spec, sets=sets, run_dir=tmp_path / "run", progress=False)
    task_info = json.loads((tmp_path / "run" / "task.json").read_text())
    assert task_info["answers"][0] == "2" and sorted(task_info["answers"]) == ["2", "no", "yes"]  # "two"
    # normalised, min count 1, most frequent first: "2" is the label of 12 training questions, yes / no of 6
    assert (task_info["train_size"], task_info["valid_size"]) == (12, 4)  # 2 of 8 images held out
    assert set(results["test_per_type"]) == {"is", "how"}
    # each test question scores 1.0 (its label, 7 of 10 humans), 0.9 ("no", 3 humans) or 0
    possible = {round(25 * (right + 0.9 * partly), 6) for right in range(5) for partly in range(5 - right)}
    assert round(results["test_accuracy"], 6) in possible


def test_validation_holds_out_whole_images(tmp_path):
    _vqa_folder(tmp_path)
    task = VQATask(VQAData(dataset="vqa2", dir=str(tmp_path), feature_dim=4, min_answer_count=1,
                           valid_fraction=0.25), TrainConfig())
    train_images = {item.image for item in task.train_set.items}
    valid_images = {item.image for item in task.valid_set.items}
    assert len(valid_images) == 2 and len(train_images) == 6 and not train_images & valid_images


def test_region_batches_are_padded(tmp_path):
    _vqa_folder(tmp_path)
    images = RegionImages(open_features(tmp_path / "train2014", 4), max_regions=4)
    features, padding = images.batch(["0", "2", "1"])  # 3, 5 (cut to 4) and 4 regions
    assert features.shape == (3, 4, 4)
    assert padding.tolist() == [[False] * 3 + [True], [False] * 4, [False] * 4]
    assert features[0, 3].abs().sum() == 0


class Stub(nn.Module):
    """A stand-in with MCAN's interface: the right answer for relational questions (settled), a wrong one for the
    others ("6"; with attention dropout on, "5" and "6" tied at a random logit), looked up by (question, image)."""

    def __init__(self, answers):
        super().__init__()
        self.answers = answers
        self.config = types.SimpleNamespace(image_input="pixels", attn_dropout=0.1)
        self.sampling = False
        self.noise_seen = []

    def mc_attention(self, enabled=True):
        self.sampling = enabled

    def region_feature_shape(self, image):
        return tuple(image.shape)

    def forward(self, question, question_padding, image, image_padding=None, feature_noise=0.0):
        self.noise_seen.append(feature_noise)
        image = image + feature_noise
        logits = torch.full((len(question), len(soc.ANSWERS)), -5.0)
        for i, (q, picture) in enumerate(zip(question, image)):
            answer, relational = self.answers[(tuple(q.tolist()), round(float(picture.sum()), 1))]
            logits[i, answer if relational else soc.ANSWERS.index("6")] = 5.0
            if self.sampling and not relational:  # two answers tied in every sample: no difference to find
                logits[i, -2:] = 5.0 + torch.randn(())
        return types.SimpleNamespace(logits=logits, region_attention=torch.ones(len(question), 25) / 25,
                                     aux_losses={})


def test_score_accuracy_and_pavpu_by_hand():
    data = VQAData(train_size=16, valid_size=4, test_size=40, batch_size=8)
    task = VQATask(data, TrainConfig())
    split = load_test_split(data, task.vocab)
    answers = {}
    for row, item in enumerate(split.items):
        question, _, image, _ = split.inputs([row])
        answers[(tuple(question[0].tolist()), round(float(image.sum()), 1))] = (
            soc.ANSWERS.index(item.label), item.question_type in soc.RELATIONAL)
    metrics = score(Stub(answers), split, task.vocab, "sort_of_clevr", batch_size=8)
    assert (metrics["accuracy_relational"], metrics["accuracy_non_relational"], metrics["accuracy"]) == (
        100.0, 0.0, 50.0)
    # relational: accurate and certain (20 equal samples, top-2 far below); non-relational: wrong, and the top two
    # answers tied in every sample (t = 0, p = 1): inaccurate and uncertain
    assert metrics["pavpu_counts"] == {"accurate_certain": 20, "accurate_uncertain": 0, "inaccurate_certain": 0,
                                       "inaccurate_uncertain": 20}
    assert metrics["pavpu"] == 100.0
    assert metrics["predicted"][0] == split.items[0].label or split.items[0].question_type not in soc.RELATIONAL


def test_noise_is_drawn_once_per_batch():
    """``score`` hands MCAN one noise tensor per batch, read by the deterministic pass and all 20 samples; the next
    batch gets fresh noise; the same seed gives the same noise. Noise of std 1 has variance 1 (Crossformer Sec. 3.2);
    without noise none is passed."""
    data = VQAData(train_size=16, valid_size=4, test_size=40, batch_size=8)
    split = load_test_split(data, VQATask(data, TrainConfig()).vocab)
    model = Stub(collections.defaultdict(lambda: (0, True)))
    score(model, split, VQATask(data, TrainConfig()).vocab, "sort_of_clevr", noise_std=1.0, samples=20,
          batch_size=20)
    seen = model.noise_seen
    assert len(seen) == 2 * 21 and all(seen[i] is seen[0] for i in range(21)) and seen[21] is seen[41]
    assert seen[0].shape == (20, 3, 75, 75) and not torch.allclose(seen[0], seen[21])
    noise = torch.cat([seen[0].flatten(), seen[21].flatten()])
    assert noise.var().item() == pytest.approx(1.0, abs=0.01) and noise.mean().abs() < 0.01
    again = Stub(collections.defaultdict(lambda: (0, True)))
    score(again, split, VQATask(data, TrainConfig()).vocab, "sort_of_clevr", noise_std=1.0, samples=0, batch_size=20)
    assert torch.equal(again.noise_seen[0], seen[0]) and torch.equal(again.noise_seen[1], seen[21])
    clean = Stub(collections.defaultdict(lambda: (0, True)))
    score(clean, split, VQATask(data, TrainConfig()).vocab, "sort_of_clevr", samples=0, batch_size=20)
    assert clean.noise_seen == [0.0, 0.0]


def test_bce_on_soft_scores(tmp_path):
    """The loss is the BCE summed over the answers, averaged over the questions, against 0.3 per agreeing human."""
    _vqa_folder(tmp_path)
    data = VQAData(dataset="vqa2", dir=str(tmp_path), feature_dim=4, min_answer_count=1, valid_fraction=0.25)
    task = VQATask(data, TrainConfig())
    logits = torch.randn(len(task.train_set), 3)
    stub = types.SimpleNamespace(logits=None, aux_losses={"sg": torch.tensor(0.5)})

    def model(question, question_padding, image, image_padding):
        stub.logits = logits[: len(question)]
        return stub

    model_module = nn.Module()
    model_module.forward = model
    rows = torch.arange(4)
    loss, logs, n = task.loss(model_module, task.prepare(rows))
    logs = {name: float(value) for name, value in logs.items()}  # tensors, read by the engine once per interval
    target = torch.zeros(4, 3)
    for i, item in enumerate(task.train_set.items[:4]):
        target[i, task.vocab.answer_index["no"]] = 0.9  # 3 of 10 humans: 0.3 each
        target[i, task.vocab.answer_index[item.label]] = 1.0  # 7 of 10 humans (10 for "no"): min(0.3 * 7, 1)
    manual = -(target * torch.log(torch.sigmoid(logits[:4])) + (1 - target) * torch.log(1 - torch.sigmoid(logits[:4])))
    assert logs["bce"] == pytest.approx(float(manual.sum(1).mean()), rel=1e-5)
    assert float(loss) == pytest.approx(logs["bce"] + 0.5, rel=1e-5) and logs["sg"] == 0.5 and n == 4
    assert task.train_set.questions[0].eq(PAD).sum() > 0


def test_compare_variants_on_mcan(tmp_path):
    sets = {f"data.{k}": v for k, v in (("train_size", "16"), ("valid_size", "4"), ("test_size", "4"))}
    sets.update(dict(item.split("=") for item in TINY_MODEL), d_model="16", layers="2", feature_dim="4")
    plan = build_plan(Settings("vqa", "mcan_4layer", ["baseline", "lw_1x", "crossformer_kq"], "baseline", [1],
                               None, sets))
    models = {v.variant.name: v for v in plan.variants}
    assert models["lw_1x"].model["lightweight"]["groups"] == 2 and models["baseline"].model["lightweight"] is None
    assert models["crossformer_kq"].model["crossformer"]["hard"] == ["kq"]
    assert models["lw_1x"].parameters < models["baseline"].parameters
    assert models["crossformer_kq"].parameters < models["baseline"].parameters  # tied across the 2 layers
    assert models["baseline"].lengths[0] <= 14 and plan.task.extra_metrics[:2] == ("accuracy_relational",
                                                                                   "accuracy_non_relational")
    with pytest.raises(VariantError, match="MPT has no MCAN form"):
        build_plan(Settings("vqa", "mcan_4layer", ["baseline", "mpt"], "baseline", [1], None, sets))
