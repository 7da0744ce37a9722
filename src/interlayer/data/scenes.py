"""Generated scenes for image captioning and referring expression comprehension, made here deterministically from a
seed: Sort-of-CLEVR's drawing (:mod:`interlayer.data.sort_of_clevr`: white canvas, its six colours, filled shapes)
extended with a third shape, two sizes, several objects of one colour or shape, detector-like region proposals,
reference captions and referring expressions.

* **A scene** is 80 x 80 RGB with 3-5 objects, each of a colour (Sort-of-CLEVR's six, purple and cyan), a shape
  (square, circle, triangle) and a size (small: 7 x 7 pixels, medium: 11 x 11, large: 17 x 17), whose boxes do not
  touch.
* **Regions**, as a bottom-up-attention detector gives them: one proposal per object, its box each edge moved by
  -1, 0 or +1 pixel (a detector's imprecision; the proposal still overlaps its object by IoU > 0.5), and 0-2
  *fragment* proposals, an object's box moved by half its width or height (IoU < 0.5 with every object: clutter a
  model must learn to ignore). A region's feature is its box cropped from the image and resampled to 8 x 8 RGB by
  the nearest pixel, in [0, 1] (192 values); its box is kept apart (x1, y1, x2, y2 in pixels, the image 80 x 80),
  as detectors export ``x`` and ``bbox``. The regions are listed in raster order of their box centres (top to
  bottom, then left to right), so that the region sequence is ordered in space (the order a 3 x 3 convolution
  over the attention map, Predictive Attention's, needs to mix neighbours).
* **Five reference captions** per scene from a grammar with synonyms (``small``/``little``/``tiny``,
  ``square``/``box``/``block``, ``circle``/``ball``/``disc``, ...), the objects in a fresh random order in each, the
  size said or not, twins grouped ("two red squares"), under six templates: a list, "There are four shapes: ...",
  "... on a white background", "A picture of ...", a relation between two objects ("A big red ball to the left of
  a small blue box, and two other shapes"), and the counts by shape ("Two circles and a triangle."). Written as
  people write (capitals, commas, a full stop), so the PTB tokenization is exercised as on COCO.
* **Referring expressions**: one or two targets per scene, three expressions each. An *attribute* target is told
  apart by its colour, shape or size: the shortest unique description ("the triangle", "the red one", "the big
  red ball"), a longer one, and one relating it to its nearest neighbour ("the red ball left of the green box").
  A *spatial* target has a twin (same colour, shape and size): it is told apart by where it is ("the red ball on
  the left", "the leftmost red ball") or by a relation that holds for it and not for its twin. Scenes are drawn so
  that distractors of the target's colour or shape are common. Splits as RefCOCO's: ``train``, ``valid``, and
  two tests, ``testA`` (attribute targets only) and ``testB`` (spatial targets only), the generated analogue of
  RefCOCO's testA (people) / testB (other objects) split by what tells the target apart.

Each split has its own random stream (``numpy.random.default_rng([seed, split])``), so a test set does not change
when the training size does; ``tests/test_scenes.py`` pins a checksum, so the release cannot drift.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

from . import sort_of_clevr

IMAGE_SIZE = 80
# Sort-of-CLEVR's six colours and two more: each added value of an attribute makes a caption's words rarer
COLOURS = sort_of_clevr.COLOURS + ("purple", "cyan")
RGB = np.concatenate([sort_of_clevr.RGB, np.array([(128, 0, 128), (0, 200, 200)], dtype=np.uint8)])
SHAPES = ("square", "circle", "triangle")
SIZES = ("small", "medium", "large")
HALF = (3, 5, 8)  # half the side of an object's box: 7 x 7, 11 x 11, 17 x 17 pixels
FEATURE_SIDE = 8
FEATURE_DIM = 3 * FEATURE_SIDE * FEATURE_SIDE
Split = Literal["train", "valid", "test", "testA", "testB"]
SPLITS: dict[str, int] = {"train": 0, "valid": 1, "test": 2, "testA": 3, "testB": 4}
CAPTIONS_PER_SCENE = 5
EXPRESSIONS_PER_TARGET = 3
SHAPE_WORDS = {"square": ("square", "box", "block"), "circle": ("circle", "ball", "disc"),
               "triangle": ("triangle",)}
PLURALS = {"box": "boxes"}
SIZE_WORDS = {"small": ("small", "little", "tiny"), "medium": ("medium", "medium-sized"), "large": ("large", "big")}
NUMBERS = ("zero", "one", "two", "three", "four", "five")
RELATIONS = {"left": ("to the left of", "left of"), "right": ("to the right of", "right of"),
             "top": ("above",), "bottom": ("below", "under")}
# "the ... on the left" and "the leftmost ...": how a spatial target is told apart from its twin
PLACES = {"left": ("on the left", "leftmost", "left"), "right": ("on the right", "rightmost", "right"),
          "top": ("at the top", "topmost", "upper"), "bottom": ("at the bottom", "lowest", "lower")}


@dataclass(frozen=True)
class SceneObject:
    colour: int  # index into COLOURS
    shape: int  # index into SHAPES
    size: int  # index into SIZES
    x: int  # centre, pixels
    y: int

    @property
    def box(self) -> tuple[int, int, int, int]:
        """(x1, y1, x2, y2), the pixels x1..x2-1 and y1..y2-1."""
        h = HALF[self.size]
        return self.x - h, self.y - h, self.x + h + 1, self.y + h + 1

    @property
    def attributes(self) -> tuple[int, int, int]:
        return self.colour, self.shape, self.size


@dataclass
class Expression:
    target: int  # index into the scene's objects
    text: str
    kind: Literal["attribute", "spatial"]


@dataclass
class Scene:
    """One image: its objects, its region proposals (features, boxes, the object each proposes or -1) and texts."""

    objects: list[SceneObject]
    features: np.ndarray  # (R, FEATURE_DIM) float32 in [0, 1]
    boxes: np.ndarray  # (R, 4) float32 x1, y1, x2, y2 in pixels
    region_object: np.ndarray  # (R,) int64: the object a proposal was made for, -1 for a fragment
    captions: list[str]
    expressions: list[Expression]


def _masks(half: int) -> dict[int, np.ndarray]:
    offsets = np.arange(-half, half + 1)
    dy, dx = np.meshgrid(offsets, offsets, indexing="ij")
    return {0: np.ones((2 * half + 1,) * 2, dtype=bool), 1: dx ** 2 + dy ** 2 <= half ** 2,
            2: np.abs(dx) * 2 <= dy + half}  # a triangle, apex up, base the bottom row


MASKS = [_masks(h) for h in HALF]


def _apart(a: SceneObject, b: SceneObject) -> bool:
    """Boxes with at least one pixel of white between them."""
    gap = HALF[a.size] + HALF[b.size] + 1
    return abs(a.x - b.x) > gap or abs(a.y - b.y) > gap


def place(rng: np.random.Generator, attributes: list[tuple[int, int, int]]) -> Optional[list[SceneObject]]:
    """Objects of the given (colour, shape, size) at random centres with apart boxes, or None after 200 tries."""
    objects: list[SceneObject] = []
    for colour, shape, size in attributes:
        h = HALF[size]
        for _ in range(200):
            x, y = (int(v) for v in rng.integers(h, IMAGE_SIZE - h, size=2))
            candidate = SceneObject(colour, shape, size, x, y)
            if all(_apart(candidate, other) for other in objects):
                objects.append(candidate)
                break
        else:
            return None
    return objects


def draw_scene(objects: list[SceneObject]) -> np.ndarray:
    """The image, (3, 80, 80) uint8, white with each object filled in its colour."""
    image = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 255, dtype=np.uint8)
    for obj in objects:
        x1, y1, x2, y2 = obj.box
        image[y1:y2, x1:x2][MASKS[obj.size][obj.shape]] = RGB[obj.colour]
    return image.transpose(2, 0, 1)


def crop_feature(image: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """The box's pixels resampled to 8 x 8 by the nearest pixel, channels first, flattened, in [0, 1]."""
    x1, y1, x2, y2 = box
    rows = y1 + ((np.arange(FEATURE_SIDE) + 0.5) * (y2 - y1) / FEATURE_SIDE).astype(int)
    cols = x1 + ((np.arange(FEATURE_SIDE) + 0.5) * (x2 - x1) / FEATURE_SIDE).astype(int)
    return (image[:, rows][:, :, cols].reshape(-1) / 255.0).astype(np.float32)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes ``a`` (..., 4) and ``b`` (..., 4), (x1, y1, x2, y2), broadcast."""
    w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    area = lambda z: (z[..., 2] - z[..., 0]) * (z[..., 3] - z[..., 1])  # noqa: E731
    inter = w * h
    return inter / (area(a) + area(b) - inter)


def proposals(rng: np.random.Generator, objects: list[SceneObject], image: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, boxes, proposed object or -1) in raster order of the box centres (module docstring)."""
    boxes: list[tuple[int, int, int, int]] = []
    owners: list[int] = []
    for i, obj in enumerate(objects):
        jitter = rng.integers(-1, 2, size=4)
        x1, y1, x2, y2 = (int(v) for v in np.array(obj.box) + jitter)
        boxes.append((max(x1, 0), max(y1, 0), min(x2, IMAGE_SIZE), min(y2, IMAGE_SIZE)))
        owners.append(i)
    truth = np.array([obj.box for obj in objects], dtype=np.float32)
    for _ in range(_draw(rng, 3)):
        obj = objects[_draw(rng, len(objects))]
        side = 2 * HALF[obj.size] + 1
        dx, dy = [(side // 2, 0), (-(side // 2), 0), (0, side // 2), (0, -(side // 2))][_draw(rng, 4)]
        x1, y1, x2, y2 = obj.box
        box = (max(x1 + dx, 0), max(y1 + dy, 0), min(x2 + dx, IMAGE_SIZE), min(y2 + dy, IMAGE_SIZE))
        if box[2] - box[0] >= 3 and box[3] - box[1] >= 3 and iou(np.array(box, np.float32), truth).max() < 0.5:
            boxes.append(box)
            owners.append(-1)
    order = sorted(range(len(boxes)), key=lambda r: (boxes[r][1] + boxes[r][3], boxes[r][0] + boxes[r][2]))
    features = np.stack([crop_feature(image, boxes[r]) for r in order])
    return features, np.array([boxes[r] for r in order], dtype=np.float32), np.array([owners[r] for r in order])


# -- words ----------------------------------------------------------------------------------------------------
def _draw(rng: np.random.Generator, n: int) -> int:
    """A uniform integer in 0..n-1 (``rng.random()`` scaled: a tenth of ``rng.integers``' cost per call)."""
    return int(rng.random() * n)


def _choice(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[_draw(rng, len(options))]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def phrase(rng: np.random.Generator, obj: SceneObject, *, size: bool, count: int = 1) -> str:
    """``a small red box``, or with ``count`` > 1 ``two small red boxes``."""
    shape = _choice(rng, SHAPE_WORDS[SHAPES[obj.shape]])
    words = ([_choice(rng, SIZE_WORDS[SIZES[obj.size]])] if size else []) + [COLOURS[obj.colour]]
    if count == 1:
        return f"{_article(words[0])} {' '.join(words)} {shape}"
    return f"{NUMBERS[count]} {' '.join(words)} {PLURALS.get(shape, shape + 's')}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _listing(rng: np.random.Generator, objects: list[SceneObject]) -> str:
    """Every object once (twins grouped), in a random order, the size said or not."""
    size = bool(_draw(rng, 2))
    groups: dict[tuple[int, int, int], list[SceneObject]] = {}
    for obj in objects:
        groups.setdefault(obj.attributes if size else obj.attributes[:2] + (0,), []).append(obj)
    members = list(groups.values())
    return _join([phrase(rng, group[0], size=size, count=len(group)) for group in
                  (members[i] for i in rng.permutation(len(members)))])


def direction(a: SceneObject, b: SceneObject) -> str:
    """Where ``a`` is seen from ``b``: along the axis on which they are further apart."""
    if abs(a.x - b.x) >= abs(a.y - b.y):
        return "left" if a.x < b.x else "right"
    return "top" if a.y < b.y else "bottom"


def caption(rng: np.random.Generator, objects: list[SceneObject], template: int) -> str:
    """One reference caption under ``template`` 0..5 (module docstring), written with capitals and punctuation."""
    n = len(objects)
    noun = _choice(rng, ("objects", "shapes", "things"))
    if template == 0:
        text = _listing(rng, objects)
    elif template == 1:
        text = f"there are {NUMBERS[n]} {noun}: {_listing(rng, objects)}"
    elif template == 2:
        text = f"{_listing(rng, objects)} on a white background"
    elif template == 3:
        text = f"{_choice(rng, ('a picture of', 'an image of', 'a picture with'))} {_listing(rng, objects)}"
    elif template == 4:
        i, j = (int(v) for v in rng.choice(n, size=2, replace=False))
        a, b = objects[i], objects[j]
        relation = _choice(rng, RELATIONS[direction(a, b)])
        rest = (f", and {NUMBERS[n - 2]} other {noun if n > 3 else noun[:-1]}" if n > 2 else "")
        text = f"{phrase(rng, a, size=True)} {relation} {phrase(rng, b, size=True)}{rest}"
    else:
        counts = {shape: sum(o.shape == shape for o in objects) for shape in range(len(SHAPES))}
        parts = [f"{_article(SHAPES[s])} {SHAPES[s]}" if c == 1 else f"{NUMBERS[c]} {SHAPES[s]}s"
                 for s, c in counts.items() if c]
        text = _join([parts[i] for i in rng.permutation(len(parts))])
    return text[0].upper() + text[1:] + "."


def _describe(rng: np.random.Generator, obj: SceneObject, keys: tuple[str, ...]) -> str:
    """``the big red ball``, ``the red one``: the attributes ``keys`` of ``obj`` with the article."""
    words = [_choice(rng, SIZE_WORDS[SIZES[obj.size]])] if "size" in keys else []
    words += [COLOURS[obj.colour]] if "colour" in keys else []
    words.append(_choice(rng, SHAPE_WORDS[SHAPES[obj.shape]]) if "shape" in keys else "one")
    return "the " + " ".join(words)


DESCRIPTIONS = (("shape",), ("colour",), ("colour", "shape"), ("size", "shape"), ("size", "colour"),
                ("size", "colour", "shape"))
_FIELDS = {"colour": 0, "shape": 1, "size": 2}


def _matching(objects: list[SceneObject], target: SceneObject, keys: tuple[str, ...]) -> list[int]:
    return [i for i, o in enumerate(objects) if all(o.attributes[_FIELDS[k]] == target.attributes[_FIELDS[k]]
                                                    for k in keys)]


def _unique_keys(objects: list[SceneObject], index: int) -> Optional[tuple[str, ...]]:
    """The shortest attributes that tell ``objects[index]`` apart, or None (it has a twin)."""
    return next((k for k in DESCRIPTIONS if len(_matching(objects, objects[index], k)) == 1), None)


def _relation(rng: np.random.Generator, objects: list[SceneObject], index: int, twin: Optional[int]
              ) -> Optional[str]:
    """``left of the green box``: where ``objects[index]`` is from its nearest object that has a unique
    description (and, with a ``twin``, where the twin is not), or None when no object serves."""
    target = objects[index]
    others = sorted((i for i in range(len(objects)) if i not in (index, twin)),
                    key=lambda i: (objects[i].x - target.x) ** 2 + (objects[i].y - target.y) ** 2)
    for other in others:
        keys = _unique_keys(objects, other)
        where = direction(target, objects[other])
        if keys is not None and (twin is None or where != direction(objects[twin], objects[other])):
            return f"{_choice(rng, RELATIONS[where])} {_describe(rng, objects[other], keys)}"
    return None


def expressions(rng: np.random.Generator, objects: list[SceneObject], index: int) -> list[Expression]:
    """Three referring expressions for ``objects[index]`` (module docstring)."""
    target = objects[index]
    shortest = _unique_keys(objects, index)
    full = ("size", "colour", "shape")
    if shortest is not None:
        relation = _relation(rng, objects, index, None)
        texts = [_describe(rng, target, shortest), _describe(rng, target, full),
                 f"{_describe(rng, target, shortest)} {relation}" if relation else _describe(rng, target, full)]
        return [Expression(index, text, "attribute") for text in texts]
    twin = next(i for i in _matching(objects, target, full) if i != index)
    near, far, adjective = PLACES[direction(target, objects[twin])]
    texts = [f"{_describe(rng, target, full)} {near}", f"the {far} {_describe(rng, target, full)[4:]}",
             f"the {adjective} {_describe(rng, target, full)[4:]}"]
    relation = _relation(rng, objects, index, twin)
    if relation is not None:
        texts[2] = f"{_describe(rng, target, full)} {relation}"
    return [Expression(index, text, "spatial") for text in texts]


# -- scenes ---------------------------------------------------------------------------------------------------
def _attributes(rng: np.random.Generator, split: str) -> tuple[list[tuple[int, int, int]], int, bool]:
    """(colour, shape, size) per object, the REC target and whether it has a twin: a twin in half the training
    and validation scenes, always in testB, never in testA; another object of the target's colour or shape in most."""
    n = 3 + _draw(rng, 3)
    attrs = [(_draw(rng, len(COLOURS)), _draw(rng, len(SHAPES)), _draw(rng, len(SIZES)))
             for _ in range(n)]
    target = _draw(rng, n)
    twin = split == "testB" or (split in ("train", "valid", "test") and bool(_draw(rng, 2)))
    others = [i for i in range(n) if i != target]
    if twin:
        attrs[others[0]] = attrs[target]
    elif rng.random() < 0.7:  # a distractor of the target's colour or of its shape
        c, s, z = attrs[others[0]]
        attrs[others[0]] = (attrs[target][0], s, z) if _draw(rng, 2) else (c, attrs[target][1], z)
    if not twin:  # no object may share all three attributes with the target
        for i in others:
            while attrs[i] == attrs[target]:
                c, s, z = attrs[i]
                attrs[i] = (c, s, (z + 1) % len(SIZES)) if _draw(rng, 2) else ((c + 1) % len(COLOURS), s, z)
    return attrs, target, twin


def make_scene(rng: np.random.Generator, split: str) -> Scene:
    """One scene of ``split`` (module docstring)."""
    while True:
        attrs, target, twin = _attributes(rng, split)
        objects = place(rng, attrs)
        if objects is not None and not (twin and sum(o.attributes == objects[target].attributes
                                                     for o in objects) != 2):
            break
    image = draw_scene(objects)
    features, boxes, owners = proposals(rng, objects, image)
    templates = rng.permutation(6)[:CAPTIONS_PER_SCENE]
    captions = [caption(rng, objects, int(t)) for t in templates]
    exprs = expressions(rng, objects, target)
    if split in ("train", "valid", "test") and rng.random() < 0.5:  # a second target, any kind
        second = int(rng.choice([i for i in range(len(objects)) if i != target]))
        twins = _matching(objects, objects[second], ("size", "colour", "shape"))
        if len(twins) <= 2:
            exprs += expressions(rng, objects, second)
    return Scene(objects, features, boxes, owners, captions, exprs)


def generate(size: int, seed: int, split: Split) -> list[Scene]:
    """``size`` scenes of ``split`` from release ``seed``."""
    rng = np.random.default_rng([seed, SPLITS[split]])
    return [make_scene(rng, split) for _ in range(size)]


def release_checksum(scenes: list[Scene], count: int) -> str:
    """SHA-256 (first 16 hex digits) of the first ``count`` scenes: regions, captions, expressions."""
    digest = hashlib.sha256()
    for scene in scenes[:count]:
        digest.update(scene.features.tobytes())
        digest.update(scene.boxes.tobytes())
        digest.update("|".join(scene.captions + [f"{e.target}:{e.text}" for e in scene.expressions]).encode())
    return digest.hexdigest()[:16]
