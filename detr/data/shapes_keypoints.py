"""Keypoints of the synthetic shapes (``detr-make-shapes --keypoints``): each shape's corners or vertices, so that a
keypoint model can be seen learning on a CPU (:mod:`detr.data.shapes`).

Which points a shape has (classes with their own counts, as RF-DETR's ``num_keypoints_per_class``):

- circle: its centre (1); ellipse: the two ends of its long axis, ``left_end`` and ``right_end`` (2);
- square, triangle, pentagon, hexagon: the corners (4, 3, 5, 6); star: the five tips; semicircle: the two ends of
  its straight edge and the middle of its arc (3); cross: the ends of its four arms (4); arrow: the tip, the two
  barbs and the two tail corners (5).

A shape is drawn at a random rotation, so "corner 0" must be told from the image: the points are numbered from the
one nearest to twelve o'clock (seen from the shape's centre), then clockwise. A mirror image keeps that first point
and numbers the others the other way round, so point k's mirror twin is point n − k: the category's
``flip_pairs``. The skeleton joins neighbouring points (the outline). Coordinates are continuous pixels (COCO's:
a vertex drawn on pixel column x lies at x + 0.5).

Visibility: every point is labelled; with :data:`OCCLUDED_SHARE` a shape gets one point covered by a small patch
(clipped to the shape's box), and that point is 1 ("labelled, hidden"); the others are 2. Boxes and masks stay the
whole shape's (amodal).

OKS sigmas: the points are exact, but the objects are small (a few pixels between a corner and its neighbours),
so every point gets :data:`SHAPES_SIGMA`, written into the category (``sigmas``, which
:func:`detr.evaluation.keypoints.evaluate_keypoints` reads).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: The share of shapes with one point covered (its v = 1).
OCCLUDED_SHARE = 0.25
#: Every shape point's OKS sigma.
SHAPES_SIGMA = 0.1

_ORDERED = {"square": 4, "triangle": 3, "pentagon": 5, "hexagon": 6, "star": 5, "semicircle": 3, "cross": 4,
            "arrow": 5}


def keypoint_names(shape: str) -> list[str]:
    """The names of ``shape``'s points, in order (module docstring)."""
    if shape == "circle":
        return ["centre"]
    if shape == "ellipse":
        return ["left_end", "right_end"]
    return ["first"] + [f"clockwise_{k}" for k in range(1, _ORDERED[shape])]


def keypoint_category_fields(shape: str) -> dict[str, Any]:
    """A shape category's keypoint fields: ``keypoints`` (names), ``skeleton`` (1-based outline edges),
    ``flip_pairs`` (0-based) and ``sigmas``."""
    names = keypoint_names(shape)
    count = len(names)
    if count == 1:
        skeleton: list[list[int]] = []
        flip_pairs: list[list[int]] = []
    elif count == 2:
        skeleton, flip_pairs = [[1, 2]], [[0, 1]]
    else:
        skeleton = [[k + 1, (k + 1) % count + 1] for k in range(count)]
        flip_pairs = [[k, count - k] for k in range(1, count) if k < count - k]
    return {"keypoints": names, "skeleton": skeleton, "flip_pairs": flip_pairs, "sigmas": [SHAPES_SIGMA] * count}


def shape_keypoints(shape: str, polygon: np.ndarray, center: tuple[float, float]) -> np.ndarray:
    """float [n, 2] pixel (x, y) of ``shape``'s points, in order, from its drawn ``polygon`` (:func:`detr.data.shapes.
    shape_polygon`'s vertices, in PIL's pixel coordinates) and its centre."""
    centre = np.asarray(center, dtype=np.float64)
    if shape == "circle":
        return centre[None] + 0.5
    if shape == "ellipse":  # 48 points from angle 0: the long axis ends at 0 and 24
        ends = polygon[[0, 24]]
        return ends[np.argsort(ends[:, 0], kind="stable")] + 0.5
    if shape == "star":
        points = polygon[0::2]
    elif shape == "semicircle":
        points = polygon[[0, 12, 24]]
    elif shape == "cross":  # the middles of the arms' ends
        points = (polygon[[0, 3, 6, 9]] + polygon[[1, 4, 7, 10]]) / 2
    elif shape == "arrow":
        points = polygon[[0, 2, 3, 4, 6]]
    else:
        points = polygon
    return clockwise_from_top(points, centre) + 0.5


def clockwise_from_top(points: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``points`` [n, 2] numbered from the one nearest to twelve o'clock seen from ``centre``, then clockwise
    (image coordinates: y down)."""
    offset = points - centre
    angle = np.arctan2(offset[:, 0], -offset[:, 1]) % (2 * math.pi)  # 0 at twelve o'clock, clockwise
    first = int(np.argmin(np.minimum(angle, 2 * math.pi - angle)))
    order = np.argsort((angle - angle[first]) % (2 * math.pi), kind="stable")
    return points[order]
