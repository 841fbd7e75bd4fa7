"""COCO ``segmentation`` fields → instance masks, through pycocotools' mask utilities (as ``COCO.annToMask``).

A COCO instances json gives each object's mask as polygons, ``[[x0, y0, x1, y1, ...], ...]`` in pixels (one
list per part, at least three points each), or as a run-length encoding ``{"size": [height, width], "counts":
...}``, uncompressed (a list of run lengths, column-major: COCO's crowd regions) or compressed (a string).
:func:`segmentation_problem` says what makes a field unusable (one sentence, for the data set's start-up check
and ``detr-check-data``); :func:`segmentation_to_rle` and :func:`decode_segmentations` rasterise usable ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def segmentation_problem(segmentation: Any, height: int, width: int) -> str | None:
    """What keeps ``segmentation`` from being one object's mask in an image of ``height`` × ``width`` pixels, as
    the end of a sentence ("has ..."), or None when it is usable.

    Polygons: a non-empty list of lists of finite numbers, each of even length with at least 3 points (6
    numbers). RLE: ``size`` equal to [height, width] and ``counts`` a list of non-negative integers summing to
    height × width, or a string (compressed) whose runs are the same (:func:`compressed_rle_runs`). Sizes of -1
    (unknown) are not compared.
    """
    if isinstance(segmentation, list):
        if not segmentation:
            return "an empty 'segmentation' list (give polygons, or an RLE)"
        for position, polygon in enumerate(segmentation):
            if not isinstance(polygon, list) or not all(_is_number(v) for v in polygon):
                return f"polygon {position} that is not a list of finite numbers"
            if len(polygon) % 2:
                return f"polygon {position} of odd length {len(polygon)} (it lists x, y pairs)"
            if len(polygon) < 6:
                return f"polygon {position} with {len(polygon) // 2} point(s); a polygon needs at least 3"
        return None
    if isinstance(segmentation, dict):
        size, counts = segmentation.get("size"), segmentation.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) for v in size)):
            return f"an RLE 'size' {size!r}; it must be [height, width]"
        if height >= 0 and width >= 0 and size != [height, width]:
            return f"an RLE of size {size} (height, width) on an image of {height}x{width}"
        if isinstance(counts, list):
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
                return "RLE counts that are not non-negative integers"
            if sum(counts) != size[0] * size[1]:
                return f"RLE counts summing to {sum(counts)} pixels, not {size[0]} x {size[1]} = {size[0] * size[1]}"
            return None
        if not isinstance(counts, str):
            return f"RLE counts of type {type(counts).__name__}; COCO's are a list of run lengths or a string"
        runs = compressed_rle_runs(counts)
        if runs is None:
            return "a compressed RLE 'counts' string that is corrupt (cut short, or characters outside '0'..'o')"
        if min(runs, default=0) < 0:
            return "a compressed RLE 'counts' string that is corrupt (it decodes to negative run lengths)"
        if sum(runs) != size[0] * size[1]:
            return (f"a compressed RLE 'counts' string that is corrupt: its runs cover {sum(runs)} pixels, not "
                    f"{size[0]} x {size[1]} = {size[0] * size[1]}")
        return None
    if segmentation is None:
        return "no 'segmentation'"
    return f"a 'segmentation' of type {type(segmentation).__name__}; COCO's are polygons (a list) or an RLE (an object)"


def compressed_rle_runs(counts: str) -> list[int] | None:
    """The run lengths of a compressed RLE ``counts`` string (pycocotools' ``rleFrString``: 5 bits a character
    from '0', a continuation bit, runs after the second stored as differences), None when the string is cut
    short or holds a character outside '0'..'o'. pycocotools itself does not check: a corrupt string decodes to
    a mask of whatever memory follows, or fails deep in a training step without naming the annotation."""
    runs: list[int] = []
    position = 0
    while position < len(counts):
        value = shift = 0
        more = True
        while more:
            if position >= len(counts):
                return None
            code = ord(counts[position]) - 48
            if not 0 <= code < 64:
                return None
            value |= (code & 0x1F) << shift
            more = bool(code & 0x20)
            position += 1
            shift += 5
            if not more and code & 0x10:
                value |= -1 << shift
        if len(runs) > 2:
            value += runs[-2]
        runs.append(value)
    return runs


def segmentation_to_rle(segmentation: list[list[float]] | dict[str, Any], height: int, width: int
                        ) -> dict[str, Any]:
    """One usable ``segmentation`` (see :func:`segmentation_problem`) → a compressed RLE of ``height`` × ``width``
    (pycocotools' ``COCO.annToRLE``: polygons rasterised and merged, an uncompressed RLE compressed)."""
    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation["counts"], list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation


def decode_segmentations(segmentations: Sequence[Any], height: int, width: int) -> np.ndarray:
    """Usable ``segmentation`` fields → uint8 [N, height, width] masks (1 inside), one per field."""
    if not segmentations:
        return np.zeros((0, height, width), dtype=np.uint8)
    rles = [segmentation_to_rle(segmentation, height, width) for segmentation in segmentations]
    return np.ascontiguousarray(mask_utils.decode(rles).transpose(2, 0, 1))  # pycocotools: [H, W, N]


def segmentation_area(segmentation: Any, height: int, width: int) -> float:
    """The area in pixels of a usable ``segmentation`` (pycocotools' ``area`` of its RLE)."""
    return float(mask_utils.area(segmentation_to_rle(segmentation, height, width)))
