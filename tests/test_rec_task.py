"""The ``rec`` task: a tiny run from the command line on the generated scenes and on RefCOCO-layout files, the box
offsets and their inverse, the two baselines computed exactly, the RefCOCO reader and the conversion of the
official files (a pickle that names any global refused before anything runs), errors in one line."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from helpers import set_args
from helpers.regions import refer_records, write_region_folder
from interlayer.cli import main
from interlayer.data import scenes as sc
from interlayer.data.caption_formats import read_refer, read_refs_pickle
from interlayer.data.region_features import MemoryRegions, Regions
from interlayer.errors import DataError
from interlayer.tasks import rec, task_commands

TINY = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "dec_layers=1", "data.train_size=20",
        "data.valid_size=4", "data.test_size=4", "data.batch_size=16", "train.max_steps=3", "train.log_interval=1"]


def test_train_and_evaluate_on_the_generated_scenes(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", "rec", "--run-dir", str(run), "--no-progress", *set_args(TINY)]) == 0
    results = json.loads((run / "results.json").read_text())
    for key in ("test_accuracy", "test_accuracy_testA", "test_accuracy_testB", "baseline_random",
                "baseline_largest", "test_baseline_random_testA"):
        assert 0.0 <= results[key] <= 100.0, key
    assert results["baseline_random"] < 50.0  # 3-7 proposals, one of them right
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run / "best")]) == 0
    assert f"| all   | {results['test_accuracy']:.2f}" in capsys.readouterr().out


def test_offsets_invert_and_move_a_box_onto_its_target() -> None:
    boxes = np.array([[10, 10, 20, 30], [0, 0, 5, 5]], dtype=np.float32)
    target = np.array([[12, 8, 25, 31], [1, 1, 4, 6]], dtype=np.float32)
    deltas = rec.to_deltas(boxes, target)
    np.testing.assert_allclose(deltas[0], [(18.5 - 15) / 10, (19.5 - 20) / 20, np.log(13 / 10), np.log(23 / 20)],
                               rtol=1e-6)
    np.testing.assert_allclose(rec.from_deltas(boxes, deltas), target, rtol=1e-5, atol=1e-4)


def test_baselines_are_the_expected_accuracy_of_a_random_and_of_the_largest_proposal() -> None:
    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 40], [0, 1, 10, 10]], dtype=np.float32)
    store = MemoryRegions({"a": Regions(np.zeros((3, 4), np.float32), boxes, 50.0, 50.0)})
    split = rec.RECSplit([rec.RECExample("a", "x", np.array([0, 0, 10, 10], np.float32)),
                          rec.RECExample("a", "y", np.array([20, 20, 40, 40], np.float32))], store, 100)
    # the first referral is hit by 2 of 3 proposals, the second by 1; the largest proposal is the second box
    assert rec.baselines(split) == {"baseline_random": pytest.approx(100 * (2 / 3 + 1 / 3) / 2),
                                    "baseline_largest": pytest.approx(50.0)}


def _plain_refs(made: list[sc.Scene]) -> tuple[list[dict], dict]:
    refs, annotations = [], []
    for i, scene in enumerate(made):
        for target in sorted({e.target for e in scene.expressions}):
            x1, y1, x2, y2 = scene.objects[target].box
            ann_id = 1000 * (i + 1) + target
            annotations.append({"id": ann_id, "bbox": [x1, y1, x2 - x1, y2 - y1], "image_id": i + 1})
            refs.append({"ref_id": len(refs), "ann_id": ann_id, "image_id": i + 1,
                         "split": ["train", "val", "testA", "testB"][i % 4],
                         "sentences": [{"sent": e.text, "raw": e.text, "tokens": e.text.split()}
                                       for e in scene.expressions if e.target == target]})
    return refs, {"images": [], "annotations": annotations, "categories": []}


def test_convert_refer_writes_the_layout_the_reader_reads(tmp_path, capsys) -> None:
    made = sc.generate(8, 0, "train")
    refs, instances = _plain_refs(made)
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    out = tmp_path / "refcoco.json"
    assert "convert-refer" in task_commands()
    assert main(["convert-refer", "--refs", str(tmp_path / "refs(unc).p"), "--instances",
                 str(tmp_path / "instances.json"), "--output", str(out)]) == 0
    assert "referred objects" in capsys.readouterr().out
    splits = read_refer(out)
    assert set(splits) == {"train", "val", "testA", "testB"}
    first = splits["train"][0]
    assert first.image == "1" and first.box == tuple(float(v) for v in made[0].objects[refs[0]["ann_id"] % 1000].box)


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_refs_pickle_that_names_a_global_is_refused_and_nothing_is_written(tmp_path, capsys) -> None:
    made = sc.generate(2, 0, "train")
    refs, instances = _plain_refs(made)
    refs[0]["sentences"][0]["sent"] = _Evil()
    (tmp_path / "refs.p").write_bytes(pickle.dumps(refs, protocol=2))
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    with pytest.raises(DataError, match=r"names (__builtin__|builtins)\.print"):
        read_refs_pickle(tmp_path / "refs.p")
    assert main(["convert-refer", "--refs", str(tmp_path / "refs.p"), "--instances", str(tmp_path / "instances.json"),
                 "--output", str(tmp_path / "out.json")]) == 2
    captured = capsys.readouterr()
    assert "this must never run" not in captured.out and "refused" in captured.err
    assert not (tmp_path / "out.json").exists()


def test_the_refcoco_reader_refuses_malformed_records(tmp_path) -> None:
    path = tmp_path / "refcoco.json"
    good = {"train": [{"iid": 1, "bbox": [1, 2, 3, 4], "refs": ["the dog"]}], "val": [], "testA": []}
    for change, message in [(lambda d: d["train"][0].update(bbox=[1, 2, 0, 4]), "positive width"),
                            (lambda d: d["train"][0].update(refs=[]), "non-empty list of non-empty"),
                            (lambda d: d["train"][0].pop("iid"), r"train\[0\]: missing field 'iid'"),
                            (lambda d: d.update(dev=[]), "expected a JSON object of splits"),
                            (lambda d: None, "split 'val' must be a non-empty list")]:
        broken = json.loads(json.dumps(good))
        change(broken)
        path.write_text(json.dumps(broken))
        with pytest.raises(DataError, match=message):
            read_refer(path)


def test_train_on_refcoco_files_from_a_folder(tmp_path) -> None:
    made = sc.generate(12, 0, "train")
    ids = write_region_folder(tmp_path / "features", made)
    layout = {"train": refer_records(ids[:6], made[:6]), "val": refer_records(ids[6:8], made[6:8]),
              "testA": refer_records(ids[8:10], made[8:10]), "testB": refer_records(ids[10:], made[10:])}
    (tmp_path / "refcoco.json").write_text(json.dumps(layout))
    run = tmp_path / "run"
    assert main(["train", "rec", "--dataset", "refcoco", "--data-dir", str(tmp_path), "--run-dir", str(run),
                 "--no-progress", *set_args(TINY + [f"data.feature_dim={sc.FEATURE_DIM}"])]) == 0
    results = json.loads((run / "results.json").read_text())
    assert 0.0 <= results["test_accuracy_testA"] <= 100.0 and "test_accuracy_testB" in results
