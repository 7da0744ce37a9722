"""Region-feature folders and caption / referring-expression files as their publishers lay them out, made from the
generated scenes: what the captioning and REC reader tests read."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from interlayer.data import scenes as sc


def write_region_folder(folder: Path, made: list[sc.Scene], first_id: int = 1) -> list[int]:
    """One bottom-up-attention ``.npz`` per scene (``x``, ``bbox``, ``image_w``, ``image_h``), named as COCO's
    (``COCO_val2014_000000000001.jpg.npz``); returns the image ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = list(range(first_id, first_id + len(made)))
    for image_id, scene in zip(ids, made):
        np.savez(folder / f"COCO_val2014_{image_id:012d}.jpg.npz", x=scene.features, bbox=scene.boxes,
                 image_w=np.array(sc.IMAGE_SIZE), image_h=np.array(sc.IMAGE_SIZE), num_bbox=len(scene.boxes))
    return ids


def write_karpathy(path: Path, splits: dict[str, tuple[list[int], list[sc.Scene]]]) -> None:
    """Karpathy's ``dataset_coco.json`` for scenes by split (``train``, ``restval``, ``val``, ``test``)."""
    images = [{"split": split, "cocoid": image_id, "filepath": "val2014", "imgid": image_id,
               "sentences": [{"raw": c, "tokens": c.lower().split()} for c in scene.captions]}
              for split, (ids, made) in splits.items() for image_id, scene in zip(ids, made)]
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))


def refer_records(ids: list[int], made: list[sc.Scene]) -> list[dict]:
    """The converted RefCOCO layout's records ({iid, bbox as [x, y, w, h], refs}) of the scenes' expressions."""
    records = []
    for image_id, scene in zip(ids, made):
        for target in sorted({e.target for e in scene.expressions}):
            x1, y1, x2, y2 = scene.objects[target].box
            records.append({"iid": image_id, "bbox": [x1, y1, x2 - x1, y2 - y1],
                            "refs": [e.text for e in scene.expressions if e.target == target]})
    return records
