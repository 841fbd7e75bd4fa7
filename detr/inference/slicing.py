"""Sliced inference: small objects on images much larger than the model's input.

A DETR returns at most its number of queries and sees an image resized to its input size, so on a large image
the small objects shrink below what the model can see, and a crowded one holds more objects than it has
queries. Slicing (as sahi and supervision's ``InferenceSlicer`` do) predicts overlapping tiles of the image,
each resized by the model's own input contract, plus the whole image at the model's size (for the objects
larger than a tile), maps every box (and its mask and keypoints) back to the image's pixels and merges the
duplicates that the overlaps make.

:func:`tile_windows` lays the tiles; :func:`predict_sliced` runs them through a batch-prediction function (the
:class:`~detr.inference.predictor.Predictor`'s :meth:`~detr.inference.predictor.Predictor.predict_arrays`, so every
family and backend slices alike) and merges with :func:`merge_detections`. The defaults of
:class:`SliceSettings` (NMS, the whole-image pass, no ``drop_cut``) were chosen by docs/measurements/slicing.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import batched_nms, box_area

from detr.inference.prediction import Prediction

#: A tile's place in the image: pixel ``(x0, y0, x1, y1)``, the end exclusive.
Window = tuple[int, int, int, int]

#: How detections seen by several tiles become one: "nms" keeps the best-scoring box of each group of
#: same-class boxes whose IoU is above the threshold (``torchvision.ops.batched_nms``); "nmm" (greedy
#: non-maximum merging, sahi's default) replaces each such group, matched by intersection over the smaller box,
#: by the box that encloses them all, its best score and the union of its masks; its keypoints are those of its
#: best-scoring box (points of one object seen by several tiles are not averaged: a cut part's are guesses).
Merge = Literal["nms", "nmm"]


@dataclass(frozen=True)
class SliceSettings:
    """How an image is sliced and its tiles' detections merged.

    size: the tiles' side in pixels of the original image (a tile is ``size`` × ``size``, or the image's side
        where it is smaller); each tile is then resized by the model's input contract, so a ``size`` near the
        model's input size shows the objects at their own scale.
    overlap: the fraction of a tile that its neighbour overlaps, in [0, 1): at least ``overlap`` × ``size``
        pixels (the last tile of a row or column is moved back to end at the border, so it overlaps more).
        An object smaller than the overlap is seen whole by some tile.
    whole_image: also predict the whole image at the model's size, which finds the objects too large for a
        tile (skipped when one tile covers the image).
    merge: "nms" (default) or "nmm", see :data:`Merge`. NMS is the default because it keeps boxes the model
        predicted, with their own scores: with an overlap larger than the objects every object is seen whole
        by a tile, and that box wins over the cut parts of the neighbours; NMM's enclosing boxes join
        neighbouring objects of one class that touch (a dense scene's small objects, which slicing is for)
        into one, but it repairs objects cut by every tile (larger than the overlap, smaller than what the
        whole-image pass finds).
    iou_threshold: the overlap above which two same-class boxes are one object: IoU for "nms", intersection
        over the smaller box for "nmm".
    drop_cut: drop a tile's detection that touches an inner edge of its tile (an edge that is not the image's
        border) and is narrower than the overlap across that edge: an object cut there, which the neighbour tile
        sees whole (its cut part's IoU with the whole box can be below ``iou_threshold``, so NMS would keep both).
    """

    size: int
    overlap: float = 0.2
    whole_image: bool = True
    merge: Merge = "nms"
    iou_threshold: float = 0.5
    drop_cut: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, (int, np.integer)) or self.size < 1:
            raise ValueError(f"slice size is a tile side in pixels, an integer >= 1; got {self.size!r}")
        if not 0.0 <= self.overlap < 1.0:  # NaN fails this too
            raise ValueError(f"slice overlap is the fraction of a tile its neighbour overlaps, in [0, 1); got "
                             f"{self.overlap!r}")
        if self.merge not in ("nms", "nmm"):
            raise ValueError(f"slice merge must be 'nms' or 'nmm', got {self.merge!r}")
        if not 0.0 <= self.iou_threshold <= 1.0:
            raise ValueError(f"slice iou_threshold is in [0, 1], got {self.iou_threshold!r}")

    @classmethod
    def of(cls, value: SliceSettings | int) -> SliceSettings:
        """``value`` as settings: an ``int`` is the tile size with the other settings' defaults."""
        return value if isinstance(value, SliceSettings) else cls(size=value)

    def windows(self, height: int, width: int) -> list[Window]:
        """The tiles of a ``height`` × ``width`` image: see :func:`tile_windows`."""
        return tile_windows(height, width, self.size, self.overlap)

    def count(self, height: int, width: int) -> int:
        """How many model inputs a ``height`` × ``width`` image takes: its tiles, plus the whole image."""
        tiles = len(self.windows(height, width))
        return tiles + (1 if self.whole_image and tiles > 1 else 0)


def tile_starts(length: int, tile: int, overlap: float) -> list[int]:
    """Where the tiles of one axis start: 0, then every ``floor(tile × (1 - overlap))`` pixels (at least 1), the
    last one moved back so that it ends at ``length``. ``tile`` is at most ``length``."""
    if tile >= length:
        return [0]
    stride = max(1, int(tile * (1.0 - overlap)))
    starts = list(range(0, length - tile, stride))
    return [*starts, length - tile]


def tile_windows(height: int, width: int, size: int, overlap: float) -> list[Window]:
    """The tiles that cover a ``height`` × ``width`` image, row by row: pixel ``(x0, y0, x1, y1)``, the end
    exclusive; ``size`` × ``size`` each (the image's side where it is smaller: an image smaller than a tile is
    one tile, itself), neighbours overlapping by at least ``overlap`` × ``size`` pixels, the last of each row and
    column ending at the border."""
    tile_h, tile_w = min(size, height), min(size, width)
    return [(x0, y0, x0 + tile_w, y0 + tile_h)
            for y0 in tile_starts(height, tile_h, overlap) for x0 in tile_starts(width, tile_w, overlap)]


def predict_sliced(
    arrays: Sequence[np.ndarray],
    settings: SliceSettings,
    predict_batch: Callable[[list[np.ndarray]], list[Prediction]],
    *,
    batch_size: int,
    file_names: Sequence[str | None] | None = None,
    threshold: float | None = None,
) -> list[Prediction]:
    """One merged :class:`Prediction` per image, from its tiles (and the whole image).

    Args:
        arrays: the images, uint8 RGB ``[H, W, 3]``.
        settings: the tiles and the merge.
        predict_batch: predicts a batch of uint8 RGB arrays, boxes (masks, keypoints) at each array's own size (the
            Predictor's ``predict_arrays``, its threshold and options bound).
        batch_size: the most model inputs per call of ``predict_batch``; the tiles of all ``arrays`` are
            batched together, same-size inputs with each other (no padding between them).
        file_names: recorded in each prediction.
        threshold: recorded as each prediction's ``cut_at`` (the threshold ``predict_batch`` applies).

    Returns one prediction per image, its detections in decreasing score order, boxes pixel ``xyxy``, masks
    ``[N, H, W]`` and keypoints ``[N, K, 3]`` (pixel x, y, score) in the original image; ``query_indices`` are queries of the input that found each detection
    (a tile or the whole image). An image a tile of which has outputs that are not finite gets no detections
    and that tile's :attr:`Prediction.error`.
    """
    inputs: list[tuple[int, Window]] = []  # (image index, window) per model input
    for index, array in enumerate(arrays):
        height, width = int(array.shape[0]), int(array.shape[1])
        windows = settings.windows(height, width)
        inputs.extend((index, window) for window in windows)
        if settings.whole_image and len(windows) > 1:
            inputs.append((index, (0, 0, width, height)))
    by_shape: dict[tuple[int, int], list[int]] = {}
    for position, (_, (x0, y0, x1, y1)) in enumerate(inputs):
        by_shape.setdefault((y1 - y0, x1 - x0), []).append(position)
    results: list[Prediction | None] = [None] * len(inputs)
    for positions in by_shape.values():
        for start in range(0, len(positions), batch_size):
            chunk = positions[start : start + batch_size]
            crops = [_crop(arrays[inputs[p][0]], inputs[p][1]) for p in chunk]
            for position, prediction in zip(chunk, predict_batch(crops)):
                results[position] = prediction
    names = list(file_names) if file_names is not None else [None] * len(arrays)
    merged = []
    for index, array in enumerate(arrays):
        parts = [(window, results[p]) for p, (owner, window) in enumerate(inputs) if owner == index]
        image_size = (int(array.shape[0]), int(array.shape[1]))
        merged.append(merge_detections(parts, image_size=image_size, settings=settings, file_name=names[index],
                                       threshold=threshold))
    return merged


def merge_detections(
    parts: Sequence[tuple[Window, Prediction | None]],
    *,
    image_size: tuple[int, int],
    settings: SliceSettings,
    file_name: str | None = None,
    threshold: float | None = None,
) -> Prediction:
    """The tiles' predictions of one image as one :class:`Prediction` of the ``image_size`` ``(height, width)``
    image: boxes and keypoints shifted by their tile's origin, duplicates merged (``settings.merge``: each kept
    detection keeps the keypoints of its group's best-scoring box), masks pasted into the image (only the kept
    ones: a full-size mask per detection of every tile would not fit in memory). Keypoints are kept when every
    part has them (a keypoint model's tiles and whole image)."""
    failed = next((prediction for _, prediction in parts if prediction is not None and prediction.error), None)
    kept_parts = [(window, prediction) for window, prediction in parts if prediction is not None]
    if settings.drop_cut and failed is None:
        kept_parts = [(window, _drop_cut(prediction, window, image_size, settings)) for window, prediction in kept_parts]
    if failed is not None or not kept_parts:
        return replace(_empty(image_size, kept_parts), file_name=file_name,
                       error=failed.error if failed is not None else None, cut_at=threshold)
    boxes = torch.cat([prediction.boxes + torch.tensor([x0, y0, x0, y0], dtype=prediction.boxes.dtype)
                       for (x0, y0, _, _), prediction in kept_parts])
    scores = torch.cat([prediction.scores for _, prediction in kept_parts])
    labels = torch.cat([prediction.labels for _, prediction in kept_parts])
    queries = torch.cat([prediction.query_indices for _, prediction in kept_parts])
    names = [name for _, prediction in kept_parts for name in prediction.label_names]
    keypoints = None
    if all(prediction.keypoints is not None for _, prediction in kept_parts):
        keypoints = torch.cat([_shift_keypoints(prediction.keypoints, x0, y0)  # type: ignore[arg-type]
                               for (x0, y0, _, _), prediction in kept_parts])
    # (part, detection) of every row, to find its mask
    sources = [(part, row) for part, (_, prediction) in enumerate(kept_parts) for row in range(len(prediction))]
    if settings.merge == "nms":
        keep = batched_nms(boxes, scores, labels, settings.iou_threshold)
        groups = [[int(k)] for k in keep]
    else:
        groups = greedy_merge_groups(boxes, scores, labels, settings.iou_threshold)
    heads = torch.tensor([group[0] for group in groups], dtype=torch.int64)
    merged_boxes = torch.stack([torch.cat([boxes[group, :2].min(0).values, boxes[group, 2:].max(0).values])
                                for group in groups]) if groups else boxes[:0]
    with_masks = all(prediction.masks is not None for _, prediction in kept_parts)
    masks = None
    if with_masks:
        height, width = image_size
        masks = torch.zeros(len(groups), height, width, dtype=torch.bool)
        for out, group in enumerate(groups):
            for row in group:
                part, detection = sources[row]
                (x0, y0, x1, y1), prediction = kept_parts[part]
                masks[out, y0:y1, x0:x1] |= prediction.masks[detection]  # type: ignore[index]
    return Prediction(boxes=merged_boxes, scores=scores[heads], labels=labels[heads],
                      label_names=[names[int(h)] for h in heads], query_indices=queries[heads],
                      image_size=image_size, file_name=file_name, masks=masks,
                      keypoints=None if keypoints is None else keypoints[heads], cut_at=threshold,
                      keypoint_counts=None if keypoints is None else kept_parts[0][1].keypoint_counts,
                      keypoint_skeletons=None if keypoints is None else kept_parts[0][1].keypoint_skeletons)


def _shift_keypoints(keypoints: Tensor, x0: int, y0: int) -> Tensor:
    """A tile's keypoints ``[N, K, 3]`` in the image's pixels: x, y moved by the tile's origin, scores unchanged."""
    return keypoints + torch.tensor([x0, y0, 0], dtype=keypoints.dtype)


def greedy_merge_groups(boxes: Tensor, scores: Tensor, labels: Tensor, threshold: float) -> list[list[int]]:
    """Greedy non-maximum merging (sahi's GREEDYNMM): in decreasing score order, each box not yet taken starts a
    group and takes every untaken box of its class whose intersection over the smaller box is above
    ``threshold``. Returns the groups as row indices, the best-scoring first in each; boxes pixel ``xyxy``."""
    order = torch.argsort(scores, descending=True, stable=True)
    top_left = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    bottom_right = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    intersection = (bottom_right - top_left).clamp(min=0).prod(-1)
    area = box_area(boxes)
    smaller = torch.minimum(area[:, None], area[None, :]).clamp(min=1e-6)
    matches = (intersection / smaller > threshold) & (labels[:, None] == labels[None, :])
    taken = torch.zeros(len(boxes), dtype=torch.bool)
    groups = []
    for row in order.tolist():
        if taken[row]:
            continue
        members = torch.nonzero(matches[row] & ~taken).flatten()
        members = members[torch.argsort(scores[members], descending=True, stable=True)].tolist()
        members = [row, *[m for m in members if m != row]]
        taken[members] = True
        groups.append(members)
    return groups


def _crop(array: np.ndarray, window: Window) -> np.ndarray:
    x0, y0, x1, y1 = window
    return np.ascontiguousarray(array[y0:y1, x0:x1])


#: Pixels from a tile's edge within which a box counts as touching it (boxes are clipped to the tile).
EDGE_MARGIN = 2.0


def _drop_cut(prediction: Prediction, window: Window, image_size: tuple[int, int],
              settings: SliceSettings) -> Prediction:
    """``prediction`` (in its tile's pixels) without the detections cut by an inner edge of the tile
    (:attr:`SliceSettings.drop_cut`); the whole image's prediction is kept as it is."""
    x0, y0, x1, y1 = window
    height, width = image_size
    if (x0, y0, x1, y1) == (0, 0, width, height) or len(prediction) == 0:
        return prediction
    boxes = prediction.boxes
    overlap_x, overlap_y = settings.overlap * (x1 - x0), settings.overlap * (y1 - y0)
    box_w, box_h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    cut = torch.zeros(len(boxes), dtype=torch.bool)
    if x0 > 0:
        cut |= (boxes[:, 0] <= EDGE_MARGIN) & (box_w < overlap_x)
    if x1 < width:
        cut |= (boxes[:, 2] >= x1 - x0 - EDGE_MARGIN) & (box_w < overlap_x)
    if y0 > 0:
        cut |= (boxes[:, 1] <= EDGE_MARGIN) & (box_h < overlap_y)
    if y1 < height:
        cut |= (boxes[:, 3] >= y1 - y0 - EDGE_MARGIN) & (box_h < overlap_y)
    keep = ~cut
    return replace(prediction, boxes=boxes[keep], scores=prediction.scores[keep], labels=prediction.labels[keep],
                   label_names=[name for name, k in zip(prediction.label_names, keep.tolist()) if k],
                   query_indices=prediction.query_indices[keep],
                   masks=None if prediction.masks is None else prediction.masks[keep],
                   keypoints=None if prediction.keypoints is None else prediction.keypoints[keep])


def _empty(image_size: tuple[int, int], parts: Sequence[tuple[Window, Prediction]]) -> Prediction:
    with_masks = bool(parts) and all(prediction.masks is not None for _, prediction in parts)
    with_keypoints = bool(parts) and all(prediction.keypoints is not None for _, prediction in parts)
    return Prediction(boxes=torch.zeros(0, 4), scores=torch.zeros(0), labels=torch.zeros(0, dtype=torch.int64),
                      label_names=[], query_indices=torch.zeros(0, dtype=torch.int64), image_size=image_size,
                      masks=torch.zeros(0, *image_size, dtype=torch.bool) if with_masks else None,
                      keypoints=parts[0][1].keypoints[:0] if with_keypoints else None,  # type: ignore[index]
                      keypoint_counts=parts[0][1].keypoint_counts if with_keypoints else None,
                      keypoint_skeletons=parts[0][1].keypoint_skeletons if with_keypoints else None)
