"""COCO keypoints in the data path: each category's keypoint names, skeleton and left/right mirror, the annotations'
``keypoints`` as one array, and what a transform does to them.

COCO's format (docs/guides/train-on-your-data.md, "Keypoints"): an annotation's ``keypoints`` is
``[x1, y1, v1, x2, y2, v2, ...]``, pixel x, y in the image and a visibility ``v``: 0 not labelled (x = y = 0), 1
labelled but hidden, 2 labelled and visible; ``num_keypoints`` counts the points with v > 0. Its category names the points (``keypoints``, K names) and
joins them (``skeleton``, 1-based index pairs). A category may also give ``flip_pairs`` (0-based index pairs, as
mmpose's data set metadata; a YOLO-pose ``flip_idx`` becomes these): the points that trade places when the image
is mirrored. Without it, the pairs come from the names: ``left_X`` ↔ ``right_X`` (also ``X_left`` ↔ ``X_right``,
``left X`` ↔ ``right X``; any case).

In a data set's targets every annotation has K_max points (the largest count of any category), a category with
fewer points padded with (0, 0, 0), so that an image's keypoints are one float32 array [N, K_max, 3].
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Visibility values of COCO keypoints: not labelled, labelled but hidden, labelled and visible.
NOT_LABELLED, HIDDEN, VISIBLE = 0, 1, 2


@dataclass(frozen=True)
class CategoryKeypoints:
    """One category's keypoints.

    names: the K point names, in the annotations' order (the category's ``keypoints``).
    edges: the skeleton as 0-based index pairs (COCO's 1-based ``skeleton`` minus 1).
    flip_index: int [K]: after a horizontal flip, point ``k`` is what was point ``flip_index[k]`` (a permutation
        that is its own inverse; the identity where nothing has a mirror twin).
    """

    names: tuple[str, ...]
    edges: tuple[tuple[int, int], ...] = ()
    flip_index: tuple[int, ...] = ()

    @property
    def num_keypoints(self) -> int:
        return len(self.names)


_SIDE = re.compile(r"(?<![a-z])(left|right)(?![a-z])", re.IGNORECASE)


def mirror_name(name: str) -> str:
    """``name`` with "left" and "right" (as whole words: ``left_eye``, ``hand_right``, ``Left Ear``) swapped."""
    def swap(match: re.Match[str]) -> str:
        word = match.group(1)
        other = "right" if word.lower() == "left" else "left"
        return other.upper() if word.isupper() else other.capitalize() if word[0].isupper() else other
    return _SIDE.sub(swap, name)


def flip_index_from_names(names: Sequence[str]) -> tuple[int, ...]:
    """The mirror permutation told by the names (``left_X`` ↔ ``right_X``); a point whose mirrored name is not
    among ``names`` keeps its place."""
    position = {name.lower(): index for index, name in enumerate(names)}
    return tuple(position.get(mirror_name(name).lower(), index) for index, name in enumerate(names))


def flip_index_from_pairs(pairs: Sequence[Sequence[int]], num_keypoints: int) -> tuple[int, ...]:
    """0-based index pairs → the mirror permutation of ``num_keypoints`` points.

    Raises:
        ValueError: a pair that is not two different indices in ``[0, num_keypoints)``, or an index in two pairs.
    """
    index = list(range(num_keypoints))
    seen: set[int] = set()
    for pair in pairs:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_keypoints for i in pair)
                or pair[0] == pair[1]):
            raise ValueError(f"flip pair {pair!r} is not two different 0-based keypoint indices below {num_keypoints}")
        if seen & set(pair):
            raise ValueError(f"flip pair {list(pair)!r} uses a keypoint that another pair already swaps")
        seen |= set(pair)
        index[pair[0]], index[pair[1]] = pair[1], pair[0]
    return tuple(index)


def flip_pairs_from_index(flip_index: Sequence[int]) -> list[list[int]]:
    """The mirror permutation → its 0-based pairs (each swap once, the smaller index first)."""
    return [[i, int(j)] for i, j in enumerate(flip_index) if i < int(j)]


def category_keypoints_problem(category: dict[str, Any]) -> str | None:
    """What is wrong with a category's ``keypoints`` / ``skeleton`` / ``flip_pairs`` (None: usable or absent)."""
    names = category.get("keypoints")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        return f"'keypoints' {names!r} is not a list of names"
    skeleton = category.get("skeleton", [])
    if not isinstance(skeleton, list) or not all(
            isinstance(edge, (list, tuple)) and len(edge) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= len(names) for i in edge)
            for edge in skeleton):
        return f"'skeleton' {skeleton!r} is not a list of 1-based index pairs within its {len(names)} keypoints"
    if "flip_pairs" in category:
        try:
            flip_index_from_pairs(category["flip_pairs"], len(names))
        except (TypeError, ValueError) as error:
            return f"'flip_pairs': {error}"
    return None


def category_keypoints(category: dict[str, Any]) -> CategoryKeypoints | None:
    """A json category → its :class:`CategoryKeypoints` (None: the category has no ``keypoints``).

    Raises:
        ValueError: the category's keypoint fields are unusable (:func:`category_keypoints_problem`).
    """
    problem = category_keypoints_problem(category)
    if problem is not None:
        raise ValueError(f"category {category.get('id')} ('{category.get('name')}'): {problem}")
    names = category.get("keypoints")
    if names is None:
        return None
    edges = tuple((int(a) - 1, int(b) - 1) for a, b in category.get("skeleton", []))
    flip_index = (flip_index_from_pairs(category["flip_pairs"], len(names)) if "flip_pairs" in category
                  else flip_index_from_names(names))
    return CategoryKeypoints(names=tuple(names), edges=edges, flip_index=flip_index)


def keypoint_categories(categories: Sequence[dict[str, Any]]) -> dict[int, CategoryKeypoints]:
    """``{category id: CategoryKeypoints}`` of the categories that name keypoints."""
    found = {}
    for category in categories:
        keypoints = category_keypoints(category)
        if keypoints is not None:
            found[int(category["id"])] = keypoints
    return found


def annotation_keypoints_problem(annotation: dict[str, Any], num_keypoints: int | None) -> str | None:
    """What is wrong with an annotation's ``keypoints`` for a category of ``num_keypoints`` points (None: usable).

    Checked: a list of 3K finite numbers (K = ``num_keypoints``, or any K when None), each v in {0, 1, 2}, and
    ``num_keypoints`` (if given) equal to the count of v > 0. Points outside the image are the checker's warning,
    not a problem here (:func:`points_outside`)."""
    values = annotation.get("keypoints")
    if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return f"'keypoints' is not a list of numbers [x1, y1, v1, ...] ({str(values)[:60]})"
    if len(values) % 3 or (num_keypoints is not None and len(values) != 3 * num_keypoints):
        expected = f"3 x {num_keypoints} = {3 * num_keypoints}" if num_keypoints is not None else "a multiple of 3"
        return f"'keypoints' has {len(values)} numbers; its category needs {expected} (x, y, v per keypoint)"
    visibility = values[2::3]
    if any(v not in (0, 1, 2) for v in visibility):
        bad = sorted({v for v in visibility if v not in (0, 1, 2)})
        return f"'keypoints' has visibility {bad}; v must be 0 (not labelled), 1 (hidden) or 2 (visible)"
    labelled = sum(1 for v in visibility if v > 0)
    count = annotation.get("num_keypoints")
    if count is not None and count != labelled:
        return f"'num_keypoints' is {count!r} but {labelled} keypoint(s) have v > 0; set num_keypoints to {labelled}"
    return None


def points_outside(values: Sequence[float], height: float, width: float, *, tolerance: float = 0.0) -> list[int]:
    """0-based indices of the labelled points (v > 0) of a flat ``[x1, y1, v1, ...]`` outside [0, width] x
    [0, height] by more than ``tolerance`` pixels."""
    array = np.asarray(values, dtype=np.float64).reshape(-1, 3)
    x, y = array[:, 0], array[:, 1]
    outside = (array[:, 2] > 0) & ((x < -tolerance) | (x > width + tolerance) | (y < -tolerance)
                                    | (y > height + tolerance))
    return np.flatnonzero(outside).tolist()


def keypoints_array(annotations: Sequence[dict[str, Any]], num_keypoints: int) -> np.ndarray:
    """The annotations' ``keypoints`` as float32 [A, num_keypoints, 3] (x, y pixels, v); an annotation without
    keypoints, or with fewer (a category of fewer points), padded with (0, 0, 0)."""
    array = np.zeros((len(annotations), num_keypoints, 3), dtype=np.float32)
    for row, annotation in enumerate(annotations):
        values = annotation.get("keypoints") or []
        points = np.asarray(values, dtype=np.float32).reshape(-1, 3)[:num_keypoints]
        array[row, :len(points)] = points
    return array


def hide_outside(keypoints: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 [N, K, 3] with every point outside [0, width] x [0, height], or not labelled, set to (0, 0, 0):
    what a crop does to the points it cuts off (COCO's "not labelled")."""
    keypoints = np.array(keypoints, dtype=np.float32, copy=True).reshape(-1, keypoints.shape[-2], 3)
    x, y = keypoints[..., 0], keypoints[..., 1]
    gone = (keypoints[..., 2] <= 0) | (x < 0) | (x > width) | (y < 0) | (y > height)
    keypoints[gone] = 0.0
    return keypoints


def to_transform_points(keypoints: np.ndarray) -> np.ndarray:
    """float32 [N, K, 3] (x, y, v) → the [N * K, 3] albumentations "xya" points a transform moves: x, y and an
    angle of 0°, which each horizontal flip turns by 180° (so the angle out tells whether a point was mirrored)."""
    points = np.zeros((keypoints.shape[0] * keypoints.shape[1], 3), dtype=np.float32)
    points[:, :2] = keypoints[..., :2].reshape(-1, 2)
    return points


def from_transform_points(points: Any, visibility: np.ndarray, keep: np.ndarray, flip_indices: np.ndarray,
                          height: int, width: int) -> np.ndarray:
    """A transform's moved points back to float32 [M, K, 3] (pixel x, y in the output image, v).

    Args:
        points: [N * K, 3+] the transform's ``keypoints`` (x, y, angle in degrees), in the input's order.
        visibility: float32 [N, K] the input's v.
        keep: int [M] the input instances the transform kept (the boxes it did not drop), in output order.
        flip_indices: int [N, K] each input instance's mirror permutation (its category's ``flip_index``).
        height, width: the output image's size (pixels); points outside it become (0, 0, 0).

    A point mirrored an odd number of times (angle 180°) trades places with its mirror twin, as a left wrist
    seen in a mirror is a right wrist.
    """
    count, num_keypoints = visibility.shape
    if count == 0 or len(keep) == 0:
        return np.zeros((0, num_keypoints, 3), dtype=np.float32)
    moved = np.asarray(points, dtype=np.float32).reshape(count, num_keypoints, -1)
    keypoints = np.concatenate([moved[..., :2], visibility[..., None]], axis=-1)[keep]
    mirrored = np.cos(np.deg2rad(moved[keep, :, 2])) < 0  # angle 180°: flipped an odd number of times
    rows = np.flatnonzero(mirrored.any(axis=1))
    for row in rows:  # a permutation per instance: its category's
        keypoints[row] = keypoints[row, flip_indices[keep[row]]]
    return hide_outside(keypoints.reshape(len(keep), num_keypoints, 3), height, width)
