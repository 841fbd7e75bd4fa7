"""COCOeval's per-image matches as flat numpy arrays, and IoUs of detection-ground truth pairs.

pycocotools keeps its matching result in ``COCOeval.evalImgs``: one dict per (category, area range, image)
with the detection and ground-truth ids of that image and category, ``dtMatches`` / ``gtMatches`` (the id
of the partner, 0 when unmatched, per IoU threshold), ``dtIgnore`` (matched to a crowd region) and
``gtIgnore`` (crowd). :func:`match_table` flattens the "all" area range into one row per detection and
one row per ground-truth box, so the error analysis works on whole arrays instead of re-matching.

Boxes are COCO json's pixel ``xywh`` throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np


@dataclass
class MatchTable:
    """Detections and ground truth of one COCO evaluation, matched at ``iou_threshold``.

    Detections (``D`` rows) are those COCOeval scored: at most ``maxDets[-1]`` per image and category, in
    COCOeval's order (category, image, descending score), the order its ``accumulate`` ranks ties in.

    det_image, det_category: int64 [D] image id and category id.
    det_score: float64 [D].
    det_box: float64 [D, 4] pixel xywh.
    det_id: int64 [D] annotation id in the results COCO object.
    det_gt: int64 [D] row of the matched ground truth, -1 when unmatched.
    det_ignore: bool [D] matched to a crowd region (neither a true nor a false positive).
    gt_image, gt_category, gt_box, gt_id: as for detections, [G] rows, crowd regions included.
    gt_crowd: bool [G] crowd region (COCOeval's gtIgnore for the "all" area range).
    gt_matched: bool [G] matched by a detection at ``iou_threshold``.
    category_ids: int64 [K] the evaluated category ids (``params.catIds``).
    image_ids: int64 [I] the evaluated image ids (``params.imgIds``).
    """

    iou_threshold: float
    det_image: np.ndarray
    det_category: np.ndarray
    det_score: np.ndarray
    det_box: np.ndarray
    det_id: np.ndarray
    det_gt: np.ndarray
    det_ignore: np.ndarray
    gt_image: np.ndarray
    gt_category: np.ndarray
    gt_box: np.ndarray
    gt_id: np.ndarray
    gt_crowd: np.ndarray
    gt_matched: np.ndarray
    category_ids: np.ndarray
    image_ids: np.ndarray

    @property
    def det_class(self) -> np.ndarray:
        """int64 [D] index of each detection's category in ``category_ids``."""
        return np.searchsorted(self.category_ids, self.det_category)

    @property
    def gt_class(self) -> np.ndarray:
        """int64 [G] index of each ground truth's category in ``category_ids``."""
        return np.searchsorted(self.category_ids, self.gt_category)


def iou_index(coco_eval: Any, iou_threshold: float) -> int:
    """Index of ``iou_threshold`` in ``coco_eval.params.iouThrs``; ValueError if it is not one of them."""
    thresholds = np.asarray(coco_eval.params.iouThrs, dtype=float)
    index = int(np.argmin(np.abs(thresholds - iou_threshold)))
    if abs(thresholds[index] - iou_threshold) > 1e-6:
        raise ValueError(
            f"IoU threshold {iou_threshold} is not one COCOeval evaluated ({thresholds.round(2).tolist()}); "
            "pick one of those"
        )
    return index


def _boxes(coco: Any, ids: np.ndarray) -> np.ndarray:
    """float [len(ids), 4] xywh of the annotations ``ids`` of ``coco``, read in one pass over its list."""
    annotations = coco.dataset["annotations"]
    if len(ids) == 0 or not annotations:
        return np.zeros((len(ids), 4))
    all_ids = np.fromiter((a["id"] for a in annotations), dtype=np.int64, count=len(annotations))
    all_boxes = np.array([a["bbox"] for a in annotations], dtype=float).reshape(-1, 4)
    order = np.argsort(all_ids)
    return all_boxes[order[np.searchsorted(all_ids[order], ids)]]


def match_table(coco_eval: Any, iou_threshold: float = 0.5) -> MatchTable:
    """Flatten ``coco_eval.evalImgs`` (after ``evaluate()``) at one of its IoU thresholds.

    Needs pycocotools' ``COCOeval`` with ``useCats=1`` and the "all" area range first (its defaults).
    """
    if not getattr(coco_eval, "evalImgs", None) or not isinstance(coco_eval.evalImgs, list):
        raise ValueError("match_table needs a pycocotools COCOeval after evaluate() (its evalImgs list)")
    if not coco_eval.params.useCats:
        raise ValueError("match_table needs COCOeval with params.useCats = 1 (per-category matching)")
    t = iou_index(coco_eval, iou_threshold)
    num_images = len(coco_eval.params.imgIds)
    num_area_ranges = len(coco_eval.params.areaRng)
    # evalImgs is ordered [category][area range][image]; area range 0 is "all"
    entries = [entry for k in range(len(coco_eval.params.catIds))
               for entry in coco_eval.evalImgs[k * num_area_ranges * num_images:(k * num_area_ranges + 1) * num_images]
               if entry is not None]

    def ids(key: str) -> np.ndarray:
        return np.fromiter(chain.from_iterable(e[key] for e in entries), dtype=np.int64)

    def per_entry(key: str, counts: np.ndarray) -> np.ndarray:
        values = np.fromiter((e[key] for e in entries), dtype=np.int64, count=len(entries))
        return np.repeat(values, counts)

    def rows(key: str, index: int | None, dtype: type) -> np.ndarray:
        parts = [np.asarray(e[key])[index] if index is not None else np.asarray(e[key]) for e in entries]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    det_id, gt_id = ids("dtIds"), ids("gtIds")
    det_count = np.fromiter((len(e["dtIds"]) for e in entries), dtype=np.int64, count=len(entries))
    gt_count = np.fromiter((len(e["gtIds"]) for e in entries), dtype=np.int64, count=len(entries))
    det_match_id = rows("dtMatches", t, np.int64)
    det_ignore = rows("dtIgnore", t, bool)
    gt_order = np.argsort(gt_id)
    position = np.searchsorted(gt_id[gt_order], det_match_id)
    det_gt = np.where(det_match_id > 0, gt_order[np.minimum(position, max(len(gt_id) - 1, 0))], -1)
    det_gt[det_ignore] = -1  # matched to a crowd region: not a true positive
    return MatchTable(
        iou_threshold=float(coco_eval.params.iouThrs[t]),
        det_image=per_entry("image_id", det_count),
        det_category=per_entry("category_id", det_count),
        det_score=np.fromiter(chain.from_iterable(e["dtScores"] for e in entries), dtype=float),
        det_box=_boxes(coco_eval.cocoDt, det_id),
        det_id=det_id,
        det_gt=det_gt,
        det_ignore=det_ignore,
        gt_image=per_entry("image_id", gt_count),
        gt_category=per_entry("category_id", gt_count),
        gt_box=_boxes(coco_eval.cocoGt, gt_id),
        gt_id=gt_id,
        gt_crowd=rows("gtIgnore", None, bool),
        gt_matched=rows("gtMatches", t, np.int64) > 0,
        category_ids=np.asarray(coco_eval.params.catIds, dtype=np.int64),
        image_ids=np.asarray(sorted(set(coco_eval.params.imgIds)), dtype=np.int64),
    )


def image_pairs(det_image: np.ndarray, gt_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (detection, ground truth) index pair of the same image.

    Returns ``(pair_det, pair_gt)``, int64 [P]: the pairs of one detection are contiguous and the
    detections come in their input order, so per-detection reductions are ``np.*.reduceat`` over runs.
    """
    gt_order = np.argsort(gt_image, kind="stable")
    sorted_images = gt_image[gt_order]
    start = np.searchsorted(sorted_images, det_image, side="left")
    count = np.searchsorted(sorted_images, det_image, side="right") - start
    pair_det = np.repeat(np.arange(len(det_image)), count)
    run_start = np.cumsum(count) - count
    within = np.arange(int(count.sum())) - np.repeat(run_start, count)
    return pair_det, gt_order[np.repeat(start, count) + within]


def paired_iou(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """IoU of ``boxes_a[i]`` with ``boxes_b[i]`` (both float [P, 4] pixel xywh) → float [P].

    torchvision's box_iou computes the full [N, M] matrix; the pairs here are already chosen.
    """
    ax0, ay0, aw, ah = boxes_a.T
    bx0, by0, bw, bh = boxes_b.T
    inter_w = np.clip(np.minimum(ax0 + aw, bx0 + bw) - np.maximum(ax0, bx0), 0, None)
    inter_h = np.clip(np.minimum(ay0 + ah, by0 + bh) - np.maximum(ay0, by0), 0, None)
    inter = inter_w * inter_h
    union = aw * ah + bw * bh - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def run_max(values: np.ndarray, pair_det: np.ndarray, num_dets: int) -> tuple[np.ndarray, np.ndarray]:
    """Per detection, the maximum of ``values`` over its pairs and the pair index holding it (first one).

    ``pair_det`` as from :func:`image_pairs`. Detections without pairs get 0 and index -1.
    """
    best = np.zeros(num_dets)
    where = np.full(num_dets, -1, dtype=np.int64)
    if len(values) == 0:
        return best, where
    starts = np.flatnonzero(np.r_[True, pair_det[1:] != pair_det[:-1]])
    owners = pair_det[starts]
    best[owners] = np.maximum.reduceat(values, starts)
    hits = np.flatnonzero(values == best[pair_det])
    first_owner, first = np.unique(pair_det[hits], return_index=True)
    where[first_owner] = hits[first]
    return best, where
