"""A COCO instances json as a few flat numpy arrays: what a data set's loader workers read, shared, not copied.

A DataLoader forks its workers from the main process. Pages of plain numpy buffers stay shared for as long
as nobody writes to them; pages of Python objects (pycocotools' dicts of dicts, lists of floats) do not,
since reading an object writes its reference count and the garbage collector writes into every container
it visits: over an epoch each worker ends up with a private copy of every annotation it touched (PyTorch's
"copy-on-read"; detectron2 and mmdetection serialise their lists into one buffer for the same reason). Here
the annotations of image ``i`` are the rows ``box_offsets[i]:box_offsets[i + 1]`` of the flat arrays, and
file names are one bytes buffer cut by offsets, so a worker reads a sample with a few array slices and no
Python object of the data set changes. Instance masks (asked for with ``segmentations=True``) are kept the same
way: each annotation's ``segmentation`` (polygons or RLE) as JSON text in one buffer, parsed per sample.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from detr.data.keypoints import keypoints_array


@dataclass(frozen=True)
class CocoIndex:
    """The images and annotations of a COCO instances json, images sorted by id.

    image_ids: int64 [N] the json's image ids, increasing.
    heights, widths: int64 [N] the json's ``height`` / ``width`` (-1 where the entry has none).
    name_bytes: uint8 [total] every ``file_name`` in UTF-8, one after another.
    name_offsets: int64 [N + 1] image ``i``'s name is ``name_bytes[name_offsets[i]:name_offsets[i + 1]]``.
    box_offsets: int64 [N + 1] image ``i``'s annotations are rows ``box_offsets[i]:box_offsets[i + 1]`` of:
    boxes_xywh: float64 [A, 4] COCO ``bbox`` (pixels, [x, y, width, height]), in json order per image.
    category_ids: int64 [A] the json's ``category_id``.
    areas: float64 [A] ``area`` (bbox width * height where the json has none).
    iscrowd: bool [A] ``iscrowd``.
    segmentation_bytes: uint8 [total] every annotation's ``segmentation`` as JSON text, in the rows' order (an
        annotation without one: ``null``); None unless indexed with ``segmentations=True``.
    segmentation_offsets: int64 [A + 1] row ``a``'s text is ``segmentation_bytes[offsets[a]:offsets[a + 1]]``.
    annotation_ids: int64 [A] the json's annotation ``id`` (-1 where it is not an integer), for messages.
    keypoints: float32 [A, K, 3] each annotation's ``keypoints`` (pixel x, y, visibility v; K the most any category
        has, fewer padded with zeros: :func:`detr.data.keypoints.keypoints_array`); None unless indexed with
        ``num_keypoints``.
    """

    image_ids: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    name_bytes: np.ndarray
    name_offsets: np.ndarray
    box_offsets: np.ndarray
    boxes_xywh: np.ndarray
    category_ids: np.ndarray
    areas: np.ndarray
    iscrowd: np.ndarray
    segmentation_bytes: np.ndarray | None = None
    segmentation_offsets: np.ndarray | None = None
    annotation_ids: np.ndarray | None = None
    keypoints: np.ndarray | None = None

    @classmethod
    def from_coco_dict(cls, data: dict[str, Any], *, segmentations: bool = False,
                       num_keypoints: int | None = None) -> CocoIndex:
        """Index a json dict that passed :func:`detr.data.coco.validate_coco_dict` (integer image ids, every
        annotation on a listed image with a 4-number bbox); with ``segmentations``, their ``segmentation`` too;
        with ``num_keypoints`` (K), their ``keypoints`` as [A, K, 3]."""
        images = sorted(data["images"], key=lambda image: image["id"])
        image_ids = np.array([image["id"] for image in images], dtype=np.int64)
        heights = np.array([image.get("height", -1) for image in images], dtype=np.int64)
        widths = np.array([image.get("width", -1) for image in images], dtype=np.int64)
        names = [image["file_name"].encode() for image in images]
        name_offsets = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum([len(name) for name in names], out=name_offsets[1:])
        name_bytes = np.frombuffer(b"".join(names), dtype=np.uint8).copy()

        annotations = data.get("annotations", [])
        count = len(annotations)
        boxes = np.array([a["bbox"] for a in annotations], dtype=np.float64).reshape(count, 4)
        owners = np.searchsorted(image_ids, np.array([a["image_id"] for a in annotations], dtype=np.int64))
        category_ids = np.array([a["category_id"] for a in annotations], dtype=np.int64)
        annotation_ids = np.array([a["id"] if isinstance(a.get("id"), int) else -1 for a in annotations],
                                  dtype=np.int64)
        areas = np.array([a.get("area", np.nan) for a in annotations], dtype=np.float64)
        missing_area = np.isnan(areas)
        areas[missing_area] = boxes[missing_area, 2] * boxes[missing_area, 3]
        iscrowd = np.array([bool(a.get("iscrowd", 0)) for a in annotations], dtype=bool)
        order = np.argsort(owners, kind="stable")  # by image, json order within an image
        box_offsets = np.zeros(len(images) + 1, dtype=np.int64)
        np.cumsum(np.bincount(owners, minlength=len(images)), out=box_offsets[1:])
        segmentation_bytes = segmentation_offsets = None
        if segmentations:
            texts = [json.dumps(annotations[i].get("segmentation"), separators=(",", ":")).encode() for i in order]
            segmentation_offsets = np.zeros(count + 1, dtype=np.int64)
            np.cumsum([len(text) for text in texts], out=segmentation_offsets[1:])
            segmentation_bytes = np.frombuffer(b"".join(texts), dtype=np.uint8).copy()
        keypoints = None
        if num_keypoints is not None:
            keypoints = keypoints_array([annotations[i] for i in order], num_keypoints)
        return cls(image_ids=image_ids, heights=heights, widths=widths, name_bytes=name_bytes,
                   name_offsets=name_offsets, box_offsets=box_offsets, boxes_xywh=boxes[order],
                   category_ids=category_ids[order], areas=areas[order], iscrowd=iscrowd[order],
                   segmentation_bytes=segmentation_bytes, segmentation_offsets=segmentation_offsets,
                   annotation_ids=annotation_ids[order], keypoints=keypoints)

    def __len__(self) -> int:
        return len(self.image_ids)

    def file_name(self, position: int) -> str:
        """The ``file_name`` of the image at ``position`` (0..N-1, in id order)."""
        return self.name_bytes[self.name_offsets[position]:self.name_offsets[position + 1]].tobytes().decode()

    def annotation_rows(self, position: int) -> slice:
        """The rows of the flat annotation arrays that belong to the image at ``position``."""
        return slice(int(self.box_offsets[position]), int(self.box_offsets[position + 1]))

    def segmentation(self, row: int) -> Any:
        """The ``segmentation`` of annotation row ``row`` as the json holds it (polygons: a list of [x0, y0, x1, y1,
        ...] lists; RLE: ``{"size": [h, w], "counts": ...}``; None where it has none)."""
        if self.segmentation_bytes is None or self.segmentation_offsets is None:
            raise ValueError("this CocoIndex holds no segmentations: build it with segmentations=True")
        start, end = int(self.segmentation_offsets[row]), int(self.segmentation_offsets[row + 1])
        return json.loads(self.segmentation_bytes[start:end].tobytes())

    def positions_of(self, image_ids: Any) -> np.ndarray:
        """Positions (int64) of ``image_ids``, which must all be indexed."""
        ids = np.asarray(image_ids, dtype=np.int64).reshape(-1)
        positions = np.searchsorted(self.image_ids, ids)
        if len(ids) and (positions.max() >= len(self.image_ids) or (self.image_ids[positions] != ids).any()):
            unknown = sorted(set(ids.tolist()) - set(self.image_ids.tolist()))
            raise KeyError(f"image ids not in the annotation file: {unknown[:5]}")
        return positions
