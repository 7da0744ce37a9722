"""VQA data: the Sort-of-CLEVR release (pinned, answers checked against the pixels) and the VQA v2 / CLEVR / GQA
readers on tiny files written in each publisher's format, with their strict errors."""
import base64
import json
import sys
import types

import numpy as np
import pytest

from interlayer.data import sort_of_clevr as soc
from interlayer.data.text import DataError
from interlayer.data.vqa_formats import (
    ArrayFeatures,
    NpzDirectory,
    TsvFeatures,
    answer_vocabulary,
    check_images,
    normalize_answer,
    open_features,
    process_digit_article,
    process_punctuation,
    read_clevr,
    read_gqa,
    read_vqa2,
    tokenize_question,
    word_vocabulary,
)

# -- Sort-of-CLEVR ----------------------------------------------------------------------------------------------


def test_release_is_pinned():
    """The first items of the release: a change of the generator (or of numpy's streams) is a new data set."""
    assert soc.checksum(soc.generate(20, 0, "train"), 20) == "e937ee93a1f54625"
    assert soc.checksum(soc.generate(20, 0, "test"), 20) == soc.checksum(soc.generate(40, 0, "test"), 20)
    assert soc.checksum(soc.generate(20, 0, "test"), 20) != soc.checksum(soc.generate(20, 0, "valid"), 20)
    assert soc.checksum(soc.generate(20, 1, "train"), 20) != "e937ee93a1f54625"


def _objects(image):
    """(centre x, centre y, pixel count) of each colour, read back from the pixels."""
    found = []
    for rgb in soc.RGB:
        ys, xs = np.nonzero((image.transpose(1, 2, 0) == rgb).all(-1))
        found.append((xs.mean(), ys.mean(), len(xs)))
    return found


def test_images_and_answers_follow_the_pixels():
    """Objects drawn at their sizes (square 11 x 11 = 121 pixels, circle radius 5 = 81), and every answer of the
    non-relational questions as the pixels say (for objects no other object overlaps)."""
    data = soc.generate(400, 3, "train")
    assert data.images.shape == (200, 3, 75, 75) and data.images.dtype == np.uint8
    assert data.relational.tolist() == [False, True] * 200
    checked = 0
    for i, (question, answer, kind) in enumerate(zip(data.questions, data.answers, data.kinds)):
        objects = _objects(data.images[data.image_index[i]])
        colour = next(c for c, name in enumerate(soc.COLOURS) if f" {name} " in question)
        x, y, count = objects[colour]
        if count not in (81, 121):  # partly covered by a later colour
            continue
        checked += 1
        shape = "rectangle" if count == 121 else "circle"
        assert soc.SHAPES[data.shapes[data.image_index[i], colour]] == shape
        assert tuple(data.centres[data.image_index[i], colour]) == (x, y)
        expected = {"shape": shape, "left": "yes" if x < 37.5 else "no", "top": "yes" if y < 37.5 else "no"}
        if kind in expected:
            assert soc.ANSWERS[answer] == expected[kind], (i, question)
        assert question == soc.TEMPLATES[kind].format(c=soc.COLOURS[colour])
    assert checked > 300


def test_relational_answers_by_hand():
    centres = np.array([[10, 10], [20, 10], [70, 70], [10, 40], [40, 40], [60, 12]])
    shapes = np.array([0, 1, 1, 0, 1, 1])  # red square, green circle, blue circle, orange square, ...
    name = lambda kind, colour: soc.ANSWERS[soc.answer(kind, colour, centres, shapes)]  # noqa: E731
    assert name("closest", 0) == "circle"  # green, 10 px away
    assert name("furthest", 0) == "circle"  # blue
    assert name("closest", 2) == "circle"  # gray, 42.4 px (yellow 58.9)
    assert name("furthest", 2) == "rectangle"  # red at 84.9
    assert name("count", 0) == "2" and name("count", 1) == "4"
    assert name("left", 4) == "no" and name("top", 5) == "yes" and name("shape", 3) == "rectangle"


def test_object_regions_are_the_objects_windows_and_centres():
    """Each image's six regions: exactly its objects' 11 x 11 windows (read back from the pixels: the window's
    centre pixel has the object's colour) and box centres, in an order of their own that is the same on every call
    and differs between images; no region sits at its colour's index in every image."""
    data = soc.generate(200, 0, "valid")
    features = soc.object_features(data)
    assert features.shape == (100, 6, soc.OBJECT_FEATURE_DIM) == (100, 6, 365) and features.dtype == np.float32
    assert np.array_equal(features, soc.object_features(data))
    side = 2 * soc.OBJECT_SIZE + 1
    orders = []
    for i in range(len(data.images)):
        order = []
        for row in features[i]:
            x, y = np.rint((row[-2:] + 1.0) / 2.0 * (soc.IMAGE_SIZE - 1)).astype(int)
            window = data.images[i, :, y - 5:y + 6, x - 5:x + 6].reshape(-1) / 255.0
            assert np.allclose(row[:-2], window)
            colour = next(c for c in range(6) if (data.centres[i, c] == (x, y)).all())
            centre_pixel = row[:-2].reshape(3, side, side)[:, 5, 5] * 255
            assert any(np.allclose(centre_pixel, soc.RGB[c]) for c in range(colour, 6))  # or a later colour on top
            order.append(colour)
        assert sorted(order) == list(range(6))
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 50
    assert not any(all(o[c] == c for o in orders) for c in range(6))


def test_vocabulary_covers_the_questions():
    data = soc.generate(60, 0, "valid")
    assert all(word in soc.WORDS for q in data.questions for word in tokenize_question(q))
    assert max(len(tokenize_question(q)) for q in data.questions) <= 14


# -- answers ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("yes.", "yes"), ("3.5", "3.5"), ("1,000", "1000"), ("black/white", "black white"), ("hot dog!", "hot dog "),
    ("t-shirt", "t shirt"), ("left , right", "left  right")])
def test_process_punctuation(text, expected):
    assert process_punctuation(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("The two dogs", "2 dogs"), ("none", "0"), ("a dont", "don't"), ("an Apple", "apple"), ("ten", "10")])
def test_process_digit_article(text, expected):
    assert process_digit_article(text) == expected


def test_normalize_answer_and_questions():
    assert normalize_answer("  Two\tDogs. ") == "2 dogs"
    assert tokenize_question("What's the man's T-shirt/hat colour?") == ["whats", "the", "mans", "t", "shirt", "hat",
                                                                         "colour"]


# -- VQA v2 -----------------------------------------------------------------------------------------------------
def _vqa_files(tmp_path, answers=None):
    questions = {"questions": [{"image_id": 42, "question": "What color is it?", "question_id": 420},
                               {"image_id": 7, "question": "How many dogs?", "question_id": 70}]}
    ten = answers or ["Two"] * 6 + ["2"] * 4
    annotations = {"annotations": [
        {"question_id": 420, "image_id": 42, "question_type": "what color is", "answer_type": "other",
         "multiple_choice_answer": "red", "answers": [{"answer": "red", "answer_id": i} for i in range(10)]},
        {"question_id": 70, "image_id": 7, "question_type": "how many", "answer_type": "number",
         "multiple_choice_answer": "Two", "answers": [{"answer": a, "answer_id": i} for i, a in enumerate(ten)]}]}
    (tmp_path / "q.json").write_text(json.dumps(questions))
    (tmp_path / "a.json").write_text(json.dumps(annotations))
    return tmp_path / "q.json", tmp_path / "a.json"


def test_read_vqa2(tmp_path):
    items = read_vqa2(*_vqa_files(tmp_path))
    assert [(i.question_id, i.image, i.label, i.question_type) for i in items] == [
        ("420", "42", "red", "what color is"), ("70", "7", "2", "how many")]
    assert items[1].answers == ["Two"] * 6 + ["2"] * 4  # as written: the metric normalises


def test_read_vqa2_errors_name_file_and_record(tmp_path):
    q, a = _vqa_files(tmp_path, answers=["2"] * 9)
    with pytest.raises(DataError, match=r"a\.json: annotation 1 \(question_id 70\): 9 answers"):
        read_vqa2(q, a)
    q, a = _vqa_files(tmp_path)
    data = json.loads(q.read_text())
    data["questions"].append({"image_id": 1, "question": "x?", "question_id": 999})
    q.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"q\.json: question 2 \(question_id 999\) has no annotation"):
        read_vqa2(q, a)
    data["questions"][2] = {"image_id": "1", "question": "x?", "question_id": 420}
    q.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"q\.json: question 2: field 'image_id' must be a int"):
        read_vqa2(q, a)
    q.write_text(json.dumps({"items": []}))
    with pytest.raises(DataError, match="list 'questions'"):
        read_vqa2(q, a)


def test_answer_vocabulary_min_count():
    from interlayer.data.vqa_formats import VQAItem
    labels = ["yes"] * 9 + ["no"] * 9 + ["2"] * 8 + ["red"] * 10
    items = [VQAItem(str(i), "1", "q", [x], x) for i, x in enumerate(labels)]
    assert answer_vocabulary(items, 9) == ["red", "no", "yes"]
    assert answer_vocabulary(items, 8) == ["red", "no", "yes", "2"]
    with pytest.raises(DataError, match="min_answer_count"):
        answer_vocabulary(items, 11)
    assert word_vocabulary([VQAItem("1", "1", "Is it? it is", [], "")], ("<pad>", "<unk>")) == [
        "<pad>", "<unk>", "is", "it"]


def test_npz_directory_finds_coco_names_and_transposes(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)  # MCAN's layout: (feature_dim, regions)
    np.savez(tmp_path / "COCO_val2014_000000000042.jpg.npz", x=x)
    np.savez(tmp_path / "n77.npz", features=x.T)
    store = open_features(tmp_path, feature_dim=4)
    assert isinstance(store, NpzDirectory) and "42" in store and "n77" in store and "77" in store
    np.testing.assert_array_equal(store["42"], x.T)
    np.testing.assert_array_equal(store["n77"], x.T)
    with pytest.raises(DataError, match="data.feature_dim=5"):
        NpzDirectory(tmp_path, feature_dim=5)["42"]


def test_tsv_features(tmp_path):
    feats = np.random.RandomState(0).rand(3, 4).astype(np.float32)
    line = ["42", "640", "480", "3", base64.b64encode(np.zeros(12, np.float32).tobytes()).decode(),
            base64.b64encode(feats.tobytes()).decode()]
    bad = ["7", "640", "480", "2", "", base64.b64encode(feats.tobytes()).decode()]
    path = tmp_path / "feats.tsv"
    path.write_text("\t".join(line) + "\n" + "\t".join(bad) + "\n")
    store = open_features(path, feature_dim=4)
    assert isinstance(store, TsvFeatures)
    np.testing.assert_array_equal(store["42"], feats)
    with pytest.raises(DataError, match=r"feats\.tsv:2: 12 feature values for num_boxes=2"):
        store["7"]


def test_check_images(tmp_path):
    np.savez(tmp_path / "1.npz", x=np.zeros((2, 4), np.float32))
    from interlayer.data.vqa_formats import VQAItem
    with pytest.raises(DataError, match="question 9 asks about image 2"):
        check_images([VQAItem("9", "2", "q", ["a"], "a")], open_features(tmp_path, 4), "q.json")


# -- CLEVR and GQA ----------------------------------------------------------------------------------------------
def test_read_clevr_with_grid_features(tmp_path):
    questions = {"questions": [
        {"image_index": 1, "question": "How many cubes?", "answer": "3", "question_index": 0,
         "program": [{"function": "scene"}, {"function": "count"}]},
        {"image_index": 0, "question": "Is it red?", "answer": "yes", "question_index": 1}]}
    (tmp_path / "q.json").write_text(json.dumps(questions))
    items = read_clevr(tmp_path / "q.json")
    assert [(i.image, i.label, i.question_type) for i in items] == [("1", "3", "count"), ("0", "yes", "")]
    grid = np.random.RandomState(0).rand(2, 4, 2, 3).astype(np.float32)  # (images, C, H, W)
    np.savez(tmp_path / "feats.npz", features=grid)
    store = open_features(tmp_path / "feats.npz", feature_dim=4)
    assert isinstance(store, ArrayFeatures) and "1" in store and "2" not in store
    np.testing.assert_array_equal(store["1"][4], grid[1, :, 1, 1])  # cell (row 1, column 1) = region 4
    del questions["questions"][1]["answer"]
    (tmp_path / "q.json").write_text(json.dumps(questions))
    with pytest.raises(DataError, match=r"q\.json: question 1: missing field 'answer'"):
        read_clevr(tmp_path / "q.json")
    questions["questions"][1] = "Is it red?"  # a record that is not a JSON object
    (tmp_path / "q.json").write_text(json.dumps(questions))
    with pytest.raises(DataError, match=r"q\.json: question 1: expected a JSON object, got str"):
        read_clevr(tmp_path / "q.json")


def test_h5_needs_h5py_or_reads_through_it(tmp_path, monkeypatch):
    (tmp_path / "f.h5").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(DataError, match="needs the h5py package"):
        open_features(tmp_path / "f.h5", 4)
    grid = np.ones((1, 4, 2, 2), np.float32)
    monkeypatch.setitem(sys.modules, "h5py", types.SimpleNamespace(File=lambda path, mode: {"features": grid}))
    assert open_features(tmp_path / "f.h5", 4)["0"].shape == (4, 4)


def test_read_gqa(tmp_path):
    questions = {"201": {"imageId": "n161313", "question": "Is the cup on the left?", "answer": "yes",
                         "types": {"structural": "verify"}},
                 "202": {"imageId": "2354786", "question": "What is it?", "answer": "A Cup"}}
    (tmp_path / "q.json").write_text(json.dumps(questions))
    items = read_gqa(tmp_path / "q.json")
    assert [(i.question_id, i.image, i.label, i.question_type) for i in items] == [
        ("201", "n161313", "yes", "verify"), ("202", "2354786", "cup", "")]
    questions["203"] = {"imageId": 5, "question": "q", "answer": "a"}
    (tmp_path / "q.json").write_text(json.dumps(questions))
    with pytest.raises(DataError, match="question 203: field 'imageId' must be a str"):
        read_gqa(tmp_path / "q.json")
    questions["203"] = ["n1", "q", "a"]
    (tmp_path / "q.json").write_text(json.dumps(questions))
    with pytest.raises(DataError, match="question 203: expected a JSON object, got list"):
        read_gqa(tmp_path / "q.json")


# -- VQA region features, checked in full before training -----------------------------------------------------------
def _item(question: str, image: str):
    from interlayer.data.vqa_formats import VQAItem

    return VQAItem(question, image, "q", ["a"], "a")


@pytest.mark.parametrize("array, message", [
    (np.array([[0.0, 1.0, np.nan, 1.0]] * 2, np.float32), r"177\.npz: the features hold non-finite values"),
    (np.zeros((3, 2, 4), np.float32), r"177\.npz: features of shape \(3, 2, 4\); expected \(regions, 4\)"),
    (np.zeros((0, 4), np.float32), r"177\.npz: no regions"),
    (np.array([["a"] * 4], dtype="U1"), r"177\.npz: features of type <U1; expected real numbers"),
])
def test_every_feature_file_is_read_and_checked_before_training(tmp_path, array, message):
    from interlayer.data.text import DataError
    from interlayer.data.vqa_formats import check_images, open_features

    for image in range(1, 200):
        np.savez(tmp_path / f"{image}.npz", x=array if image == 177 else np.zeros((2, 4), np.float32))
    items = [_item(str(i), str(i)) for i in range(1, 200)]
    with pytest.raises(DataError, match=message):
        check_images(items, open_features(tmp_path, 4), "q.json")


def test_an_object_array_of_features_is_refused_unread(tmp_path):
    from interlayer.data.text import DataError
    from interlayer.data.vqa_formats import check_images, open_features

    np.savez(tmp_path / "1.npz", x=np.array([object()] * 4, dtype=object).reshape(1, 4))
    with pytest.raises(DataError, match=r"1\.npz: not a readable \.npz file \(Object arrays cannot be loaded"):
        check_images([_item("9", "1")], open_features(tmp_path, 4), "q.json")


def test_a_duplicate_image_id_in_a_tsv_or_npz_folder_is_refused(tmp_path):
    import base64

    from interlayer.data.text import DataError
    from interlayer.data.vqa_formats import open_features

    features = base64.b64encode(np.zeros(4, np.float32).tobytes()).decode()
    line = "\t".join(["42", "640", "480", "1", "", features])
    (tmp_path / "f.tsv").write_text(f"{line}\n{line.replace('42', '7', 1)}\n{line}\n")
    with pytest.raises(DataError, match=r"f\.tsv:3: image id 42 again \(first at line 1\); every image has one line"):
        open_features(tmp_path / "f.tsv", 4)
    folder = tmp_path / "npz"
    folder.mkdir()
    np.savez(folder / "42.npz", x=np.zeros((1, 4), np.float32))
    np.savez(folder / "42.jpg.npz", x=np.ones((1, 4), np.float32))
    with pytest.raises(DataError, match=r"42\.jpg\.npz and 42\.npz are both the features of image 42|"
                                        r"42\.npz and 42\.jpg\.npz are both the features of image 42"):
        open_features(folder, 4)
