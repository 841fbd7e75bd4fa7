"""A COCO-sized synthetic detection set, written in seconds: to measure the pipeline at scale, not to train.

The images are a handful of tiny solid-colour JPEGs, each encoded once and hard-linked (or, where the file
system refuses links, copied as bytes) under every file name that has its size, so 118,287 files cost a few
inodes and well under a minute. The annotations are random boxes inside each image's json size, with
COCO's 80 category ids by default, ``area`` and ``iscrowd`` filled in and, optionally, one rectangular
polygon per box (COCO's json is mostly polygons: 448 MB for train2017 against ~265 MB without them).

Layout (as COCO's, so ``--data.root`` reads it)::

    OUT/train2017/000000000001.jpg ...   OUT/annotations/instances_train2017.json

(the encoded originals sit in ``OUT/.synthetic_sources/``, out of the image folders).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from detr.atomic_files import write_atomically
from detr.categories import UNUSED_NAME, CategoryMap

#: COCO train2017: 118,287 images, 860,001 boxes.
COCO_TRAIN_IMAGES = 118_287
COCO_BOXES_PER_IMAGE = 860_001 / COCO_TRAIN_IMAGES


@dataclass(frozen=True)
class SyntheticCocoConfig:
    """What :func:`write_synthetic_coco` writes.

    num_images: image entries (and files) of the split.
    boxes_per_image: the mean box count; each image gets a Poisson-distributed count with this mean.
    category_ids: the category ids annotations draw from (None: COCO's 80 ids 1..90, with its names).
    polygons: give every box a ``segmentation`` (its rectangle as a polygon), as COCO's json has.
    image_sizes: the (height, width) of the distinct JPEGs; images take them in turn.
    crowd_fraction: the share of boxes marked ``iscrowd = 1``.
    seed: for the boxes, labels and counts.
    """

    num_images: int = COCO_TRAIN_IMAGES
    boxes_per_image: float = COCO_BOXES_PER_IMAGE
    category_ids: tuple[int, ...] | None = None
    polygons: bool = False
    image_sizes: tuple[tuple[int, int], ...] = ((48, 64), (64, 48), (56, 56), (40, 72))
    crowd_fraction: float = 0.01
    seed: int = 0


def _categories(category_ids: tuple[int, ...] | None) -> list[dict[str, object]]:
    if category_ids is None:
        coco = CategoryMap.coco()
        return [{"id": int(i), "name": name, "supercategory": "object"}
                for i, name in zip(coco.category_ids, coco.names) if name != UNUSED_NAME]
    if not category_ids or len(set(category_ids)) != len(category_ids):
        raise ValueError(f"category_ids must be distinct and not empty, got {category_ids!r}")
    return [{"id": int(i), "name": f"class_{i}", "supercategory": "object"} for i in category_ids]


def _jpeg_bytes(height: int, width: int, shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 255 - shade, 128)).save(buffer, format="JPEG", quality=75)
    return buffer.getvalue()


def synthetic_coco_dict(config: SyntheticCocoConfig, file_names: list[str]) -> dict[str, object]:
    """The instances json of ``config`` for images named ``file_names`` (ids 1..N, sizes in turn)."""
    rng = np.random.default_rng(config.seed)
    categories = _categories(config.category_ids)
    ids = np.array([c["id"] for c in categories], dtype=np.int64)
    sizes = np.array(config.image_sizes, dtype=np.int64)  # [S, 2] (h, w)
    n = len(file_names)
    counts = rng.poisson(config.boxes_per_image, size=n)
    total = int(counts.sum())
    image_index = np.repeat(np.arange(n), counts)  # [B] the image of each box
    hw = sizes[image_index % len(sizes)].astype(np.float64)  # [B, 2]
    # Corners uniform in the image, at least 2 px apart: boxes every pipeline keeps.
    corners = rng.uniform(0.0, 1.0, size=(total, 4))
    x0 = np.minimum(corners[:, 0], corners[:, 1]) * (hw[:, 1] - 2)
    x1 = np.maximum(corners[:, 0], corners[:, 1]) * (hw[:, 1] - 2) + 2
    y0 = np.minimum(corners[:, 2], corners[:, 3]) * (hw[:, 0] - 2)
    y1 = np.maximum(corners[:, 2], corners[:, 3]) * (hw[:, 0] - 2) + 2
    boxes = np.round(np.stack([x0, y0, x1 - x0, y1 - y0], axis=1), 2)  # [B, 4] xywh
    labels = ids[rng.integers(0, len(ids), size=total)]
    crowd = rng.uniform(size=total) < config.crowd_fraction
    images = [{"id": i + 1, "file_name": name, "height": int(sizes[i % len(sizes), 0]),
               "width": int(sizes[i % len(sizes), 1])} for i, name in enumerate(file_names)]
    annotations = []
    for k, (box, label, image, is_crowd) in enumerate(zip(boxes.tolist(), labels.tolist(), image_index.tolist(),
                                                          crowd.tolist())):
        x, y, w, h = box
        annotation = {"id": k + 1, "image_id": image + 1, "category_id": label, "bbox": box,
                      "area": round(w * h, 2), "iscrowd": int(is_crowd)}
        if config.polygons:
            annotation["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
        annotations.append(annotation)
    return {"info": {"description": "synthetic COCO-sized set (detr-make-synthetic-coco)"}, "licenses": [],
            "images": images, "annotations": annotations, "categories": categories}


def write_synthetic_coco(out: str | Path, config: SyntheticCocoConfig, *, split: str = "train2017") -> Path:
    """Write ``OUT/{split}/*.jpg`` and ``OUT/annotations/instances_{split}.json``; return the json's path.

    Image files that exist already are kept (a rerun with more images adds the missing ones).
    """
    if config.num_images < 1:
        raise ValueError(f"num_images must be at least 1, got {config.num_images}")
    if config.boxes_per_image < 0:
        raise ValueError(f"boxes_per_image must be >= 0, got {config.boxes_per_image}")
    out = Path(out)
    images_dir, annotations_dir = out / split, out / "annotations"
    images_dir.mkdir(parents=True, exist_ok=True)
    annotations_dir.mkdir(parents=True, exist_ok=True)
    # One encoded file per distinct size; every image file is a hard link to one of them.
    sources_dir = out / ".synthetic_sources"
    sources_dir.mkdir(exist_ok=True)
    sources = []
    for k, (height, width) in enumerate(config.image_sizes):
        source = sources_dir / f"{height}x{width}.jpg"
        if not source.is_file():
            source.write_bytes(_jpeg_bytes(height, width, shade=(40 * k) % 256))
        sources.append(source)
    file_names = [f"{i + 1:012d}.jpg" for i in range(config.num_images)]
    existing = set(os.listdir(images_dir))
    for i, name in enumerate(file_names):
        if name in existing:
            continue
        source, target = sources[i % len(sources)], images_dir / name
        try:
            os.link(source, target)
        except OSError:  # a file system without hard links: copy the few hundred bytes
            target.write_bytes(source.read_bytes())
    json_file = annotations_dir / f"instances_{split}.json"
    data = json.dumps(synthetic_coco_dict(config, file_names), separators=(",", ":")).encode()
    write_atomically(json_file, lambda file: file.write(data))
    return json_file
