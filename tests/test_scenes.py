"""The generated scenes (interlayer.data.scenes): the release is pinned, a split does not depend on another's size,
the regions are a detector's (one near-exact proposal per object, fragments that overlap none), the captions name
what is there, and every referring expression picks out its target."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from interlayer.data import scenes as sc
from interlayer.tasks.caption_metrics import ptb_tokenize

WORDS = {"colour": {c: i for i, c in enumerate(sc.COLOURS)},
         "shape": {w: sc.SHAPES.index(s) for s, words in sc.SHAPE_WORDS.items() for w in words},
         "size": {w: sc.SIZES.index(s) for s, words in sc.SIZE_WORDS.items() for w in words}}


@pytest.fixture(scope="module")
def train() -> list[sc.Scene]:
    return sc.generate(60, 0, "train")


PINNED = "a1f7ea0c32d4bcbe"  # the first three training scenes of release 0


def test_the_release_is_pinned() -> None:
    assert sc.release_checksum(sc.generate(3, 0, "train"), 3) == PINNED


def test_a_split_does_not_depend_on_the_size_asked_for() -> None:
    small, large = sc.generate(2, 0, "test"), sc.generate(4, 0, "test")
    assert sc.release_checksum(small, 2) == sc.release_checksum(large, 2)
    assert sc.release_checksum(sc.generate(2, 1, "test"), 2) != sc.release_checksum(small, 2)


def test_objects_are_apart_and_regions_are_a_detectors(train: list[sc.Scene]) -> None:
    for scene in train:
        assert 3 <= len(scene.objects) <= 5
        for i, a in enumerate(scene.objects):
            assert all(sc._apart(a, b) for b in scene.objects[i + 1:])
        truth = np.array([o.box for o in scene.objects], dtype=np.float32)
        overlaps = sc.iou(scene.boxes[:, None], truth[None])  # (regions, objects)
        for r, owner in enumerate(scene.region_object):
            if owner >= 0:
                assert overlaps[r, owner] > 0.5 and overlaps[r].argmax() == owner
            else:
                assert overlaps[r].max() < 0.5
        assert sorted(scene.region_object[scene.region_object >= 0].tolist()) == list(range(len(scene.objects)))
        centres = np.stack([scene.boxes[:, 1] + scene.boxes[:, 3], scene.boxes[:, 0] + scene.boxes[:, 2]], 1)
        assert [tuple(c) for c in centres] == sorted(tuple(c) for c in centres)  # raster order
        assert scene.features.shape == (len(scene.boxes), sc.FEATURE_DIM)
        assert 0.0 <= scene.features.min() and scene.features.max() <= 1.0


def test_a_region_feature_is_its_box_resampled() -> None:
    image = np.zeros((3, 80, 80), dtype=np.uint8)
    image[0, 10:18, 20:28] = 255  # an 8 x 8 red patch: its own box resamples to all red
    feature = sc.crop_feature(image, (20, 10, 28, 18)).reshape(3, 8, 8)
    assert (feature[0] == 1.0).all() and (feature[1:] == 0.0).all()


def test_captions_name_the_colours_shapes_and_counts_of_the_scene(train: list[sc.Scene]) -> None:
    for scene in train:
        assert len(scene.captions) == sc.CAPTIONS_PER_SCENE
        colours = {sc.COLOURS[o.colour] for o in scene.objects}
        for caption in scene.captions:
            words = ptb_tokenize(caption).split()
            assert caption[0].isupper() and caption.endswith(".")
            assert {w for w in words if w in WORDS["colour"]} <= colours
            if words[:2] == ["there", "are"]:
                assert words[2] == sc.NUMBERS[len(scene.objects)]


def _consistent(scene: sc.Scene, words: list[str]) -> list[int]:
    """The objects whose attributes agree with a description's words (``the big red one``, ``the leftmost red
    box``): its attribute words up to the noun, a place adjective before them skipped."""
    head: list[str] = []
    for word in words[1:]:
        if any(word in table for table in WORDS.values()):
            head.append(word)
            if word in WORDS["shape"]:
                break
        elif word == "one" or head:
            break
    said = {kind: {table[w] for w in head if w in table} for kind, table in WORDS.items()}
    return [i for i, o in enumerate(scene.objects)
            if all(not said[k] or value in said[k] for k, value in zip(("colour", "shape", "size"), o.attributes))]


def _relation(text: str) -> Optional[tuple[str, list[str]]]:
    """(direction, the words of the object it relates to) of an expression with a relation, else None."""
    for where, phrases in sc.RELATIONS.items():
        for phrase in sorted(phrases, key=len, reverse=True):
            if f" {phrase} the " in text:
                return where, text.split(f" {phrase} ", 1)[1].split()
    return None


def test_every_expression_picks_out_its_target() -> None:
    """Attribute expressions by their words alone; spatial ones leave the target and its twin, and the place or
    the relation holds for the target and not for the twin."""
    for split in ("train", "testA", "testB"):
        for scene in sc.generate(40, 0, split):
            for expression in scene.expressions:
                target = scene.objects[expression.target]
                matching = _consistent(scene, expression.text.split())
                relation = _relation(expression.text)
                others = [i for i in matching if i != expression.target]
                if relation is not None:
                    where, tail = relation
                    other = _consistent(scene, tail)
                    assert len(other) == 1 and sc.direction(target, scene.objects[other[0]]) == where
                    assert all(sc.direction(scene.objects[i], scene.objects[other[0]]) != where for i in others)
                if expression.kind == "attribute":
                    assert matching == [expression.target], expression.text
                    continue
                assert expression.target in matching and len(others) == 1, expression.text
                if relation is None:
                    where = sc.direction(target, scene.objects[others[0]])
                    assert any(p in expression.text for p in sc.PLACES[where]), expression.text


def test_testA_holds_attribute_targets_and_testB_spatial_ones() -> None:
    assert {e.kind for s in sc.generate(30, 0, "testA") for e in s.expressions} == {"attribute"}
    assert {e.kind for s in sc.generate(30, 0, "testB") for e in s.expressions} == {"spatial"}


def test_distractors_of_the_targets_colour_or_shape_are_common() -> None:
    shared = []
    for scene in sc.generate(100, 0, "testA"):
        target = scene.objects[scene.expressions[0].target]
        shared.append(any(o is not target and (o.colour == target.colour or o.shape == target.shape)
                          for o in scene.objects))
    assert np.mean(shared) > 0.7
