"""OKS AP of keypoint predictions: pycocotools' ``COCOeval(iouType="keypoints")``, with each category's own sigmas.

Object keypoint similarity (COCO's keypoint evaluation, cocodataset.org/#keypoints-eval) scores a detection
against a ground-truth object as the mean over its labelled points of ``exp(-d² / (2 s² (2σ)²))``: ``d`` the
pixel distance, ``s²`` the object's ``area``, ``σ`` the point's sigma. AP is then COCO's (IoU thresholds
0.50:0.95 read as OKS), with at most 20 detections per image and category, areas "all", "medium", "large";
objects with ``num_keypoints == 0`` are ignored. pycocotools computes it with one sigma array for every
category; :class:`KeypointCOCOeval` gives each category its own (classes with their own keypoint counts) and
leaves everything else to pycocotools, so that for one category it is pycocotools' number exactly
(tests/evaluation/test_keypoints.py compares every statistic on random predictions).

Sigmas: given per category id; else the category's own ``sigmas`` field (this project's addition to COCO's
categories: the synthetic shapes write it); else, for a category of 17 points, COCO's person sigmas
(:data:`COCO_PERSON_SIGMAS`). Any other count needs them given (:class:`MissingSigmasError` says how).
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detr.categories import CategoryMap

#: COCO's per-keypoint sigmas for its 17 person points (pycocotools' ``Params.kpt_oks_sigmas``): nose, eyes,
#: ears, shoulders, elbows, wrists, hips, knees, ankles (left before right).
COCO_PERSON_SIGMAS: tuple[float, ...] = tuple(
    v / 10.0 for v in (.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87, .87, .89, .89))

#: The statistics of :func:`evaluate_keypoints`, in pycocotools' keypoint summary order (``COCOeval.stats``).
KEYPOINT_STAT_NAMES: tuple[str, ...] = ("AP", "AP50", "AP75", "APm", "APl", "AR", "AR50", "AR75", "ARm", "ARl")


class MissingSigmasError(ValueError):
    """A keypoint category has no sigmas: neither given nor COCO's (which fit 17 person points only)."""


def category_keypoint_counts(coco_gt: COCO) -> dict[int, int]:
    """``{category id: K}`` of the ground truth's keypoint categories: the length of a category's ``keypoints``
    names, else a third of the length of its annotations' ``keypoints``."""
    counts = {int(c["id"]): len(c["keypoints"]) for c in coco_gt.dataset.get("categories", [])
              if isinstance(c.get("keypoints"), list)}
    for annotation in coco_gt.dataset.get("annotations", []):
        if "keypoints" in annotation and annotation["category_id"] not in counts:
            counts[int(annotation["category_id"])] = len(annotation["keypoints"]) // 3
    return counts


def resolve_sigmas(counts: Mapping[int, int], sigmas: Mapping[int, Sequence[float]] | Sequence[float] | None = None
                   ) -> dict[int, np.ndarray]:
    """Each keypoint category's sigmas (float64 [K]).

    Args:
        counts: ``{category id: K}`` (:func:`category_keypoint_counts`).
        sigmas: ``{category id: [K sigmas]}``; or one list for every category; None: COCO's person sigmas for
            categories of 17 points.

    Raises:
        MissingSigmasError: a category of another count without sigmas, or sigmas of the wrong length; the
            message names the category, its count and the option to give.
    """
    resolved = {}
    for category_id, count in counts.items():
        given = sigmas.get(category_id) if isinstance(sigmas, Mapping) else sigmas
        if given is None:
            if count != len(COCO_PERSON_SIGMAS):
                raise MissingSigmasError(
                    f"category {category_id} has {count} keypoints, so COCO's 17 person sigmas do not apply: give "
                    f"its OKS sigmas (sigmas={{{category_id}: [{count} numbers]}}; a point's sigma is its "
                    "annotators' spread relative to the object's size: COCO's range from 0.025 (eyes) to 0.107 "
                    "(hips); one value for all, e.g. 0.05, is a fair start)")
            given = COCO_PERSON_SIGMAS
        array = np.asarray(given, dtype=np.float64).reshape(-1)
        if len(array) != count or not (array > 0).all():
            raise MissingSigmasError(
                f"category {category_id} has {count} keypoints but {len(array)} sigmas were given "
                f"({array.tolist()[:5]}...): give {count} positive numbers, one per keypoint in the category's order")
        resolved[category_id] = array
    return resolved


def ground_truth_sigmas(coco_gt: COCO, sigmas: Mapping[int, Sequence[float]] | Sequence[float] | None = None
                        ) -> dict[int, np.ndarray]:
    """Each keypoint category of ``coco_gt`` with its sigmas: those given (see :func:`resolve_sigmas`), else the
    category's own ``sigmas`` field, else COCO's person sigmas for 17 points.

    Raises:
        MissingSigmasError: see :func:`resolve_sigmas`.
    """
    if sigmas is None or isinstance(sigmas, Mapping):  # the categories' own where none is given for them
        own = {int(c["id"]): c["sigmas"] for c in coco_gt.dataset.get("categories", []) if "sigmas" in c}
        sigmas = {**own, **(sigmas or {})}
    return resolve_sigmas(category_keypoint_counts(coco_gt), sigmas)


class KeypointCOCOeval(COCOeval):
    """pycocotools' keypoint COCOeval with each category's own sigmas (``{category id: float [K]}``).

    Only :meth:`computeOks` changes: it sets pycocotools' ``params.kpt_oks_sigmas`` to the category's before
    pycocotools' own computation, so each (image, category) pair is scored by pycocotools' code."""

    def __init__(self, coco_gt: COCO, coco_dt: COCO, sigmas: Mapping[int, np.ndarray]) -> None:
        super().__init__(coco_gt, coco_dt, iouType="keypoints")
        self.category_sigmas = dict(sigmas)

    def computeOks(self, imgId: int, catId: int) -> Any:  # noqa: N802, N803 (pycocotools' names)
        self.params.kpt_oks_sigmas = self.category_sigmas[catId]
        return super().computeOks(imgId, catId)


@dataclass
class KeypointEvaluation:
    """What one keypoint evaluation produced.

    stats: :data:`KEYPOINT_STAT_NAMES` → floats in [0, 1] (-1 where there is no ground truth, as pycocotools).
    per_class: one dict per keypoint category: ``category_id``, ``name``, ``num_instances`` (ground-truth objects
        with labelled points), ``AP``, ``AP50``, ``AP75``.
    summary: pycocotools' 10-line summary text.
    coco_eval: the :class:`KeypointCOCOeval` after ``accumulate`` (None without results).
    """

    stats: dict[str, float]
    per_class: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""
    coco_eval: Any = field(default=None, repr=False, compare=False)


def evaluate_keypoints(coco_gt: COCO, results: Sequence[dict[str, Any]], *,
                       sigmas: Mapping[int, Sequence[float]] | Sequence[float] | None = None,
                       image_ids: Sequence[int] | None = None) -> KeypointEvaluation:
    """OKS AP of ``results`` on ``coco_gt``.

    Args:
        coco_gt: the ground truth (annotations with ``keypoints``, ``num_keypoints``, ``area``, ``bbox``).
        results: COCO keypoint results ``{"image_id", "category_id", "keypoints": [x1, y1, s1, ...] pixels,
            "score"}``, 3K numbers for a category of K points (the third of each triple is not scored). An entry
            with a ``bbox`` takes its area from it (pycocotools' ``loadRes``), others from the points' extent.
        sigmas: see :func:`resolve_sigmas`; a category without any takes its own ``sigmas`` field, if it has one.
        image_ids: the images to evaluate (None: every ground-truth image).

    Raises:
        MissingSigmasError: see :func:`resolve_sigmas`.
        ValueError: a result whose keypoints do not fit its category's count.
    """
    counts = category_keypoint_counts(coco_gt)
    resolved = ground_truth_sigmas(coco_gt, sigmas)
    for entry in results:
        expected = counts.get(entry["category_id"])
        if expected is None or len(entry["keypoints"]) != 3 * expected:
            raise ValueError(
                f"a keypoint result for image {entry['image_id']} has category {entry['category_id']} and "
                f"{len(entry['keypoints'])} numbers, but that category has "
                f"{'no keypoints' if expected is None else f'{expected} keypoints (3 x {expected} numbers)'}")
    if not results:
        return KeypointEvaluation(stats={name: -1.0 for name in KEYPOINT_STAT_NAMES})
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):  # pycocotools prints
        coco_dt = coco_gt.loadRes([dict(entry) for entry in results])  # fresh dicts: loadRes adds keys
        coco_eval = KeypointCOCOeval(coco_gt, coco_dt, resolved)
        coco_eval.params.catIds = sorted(counts)
        if image_ids is not None:
            coco_eval.params.imgIds = sorted(int(i) for i in image_ids)
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    summary = "\n".join(line for line in captured.getvalue().splitlines() if "Average" in line)
    stats = {name: float(value) for name, value in zip(KEYPOINT_STAT_NAMES, coco_eval.stats)}
    return KeypointEvaluation(stats=stats, per_class=_per_class(coco_gt, coco_eval), summary=summary,
                              coco_eval=coco_eval)


def _per_class(coco_gt: COCO, coco_eval: KeypointCOCOeval) -> list[dict[str, Any]]:
    precision = np.asarray(coco_eval.eval["precision"])  # [T, R, K, A, M], -1: no ground truth
    thresholds = np.asarray(coco_eval.params.iouThrs)
    counted = set(coco_eval.params.imgIds)
    num_instances = Counter(a["category_id"] for a in coco_gt.dataset.get("annotations", [])
                            if not a.get("iscrowd", 0) and a.get("num_keypoints", 0) > 0 and a["image_id"] in counted)
    rows = []
    for k, category_id in enumerate(coco_eval.params.catIds):
        def mean_ap(t: slice | int) -> float:
            values = precision[t, :, k, 0, -1]
            values = values[values > -1]
            return float(values.mean()) if values.size else -1.0

        rows.append({"category_id": int(category_id), "name": str(coco_gt.cats[category_id].get("name", category_id)),
                     "num_instances": num_instances[category_id], "AP": mean_ap(slice(None)),
                     "AP50": mean_ap(int(np.argmin(np.abs(thresholds - 0.5)))),
                     "AP75": mean_ap(int(np.argmin(np.abs(thresholds - 0.75))))})
    return rows


def keypoints_to_results(image_id: int, detection: Mapping[str, torch.Tensor], category_map: CategoryMap | None,
                         counts: Mapping[int, int], *, rounded: bool = False) -> list[dict[str, Any]]:
    """One image's detections with ``keypoints`` → COCO keypoint results (data set category ids).

    Args:
        detection: ``scores`` float [N], ``labels`` int64 [N] (model labels), ``keypoints`` float [N, K, 3]
            (pixel x, y in the original image, a per-point score).
        counts: ``{category id: K_c}``: each category's points are the first K_c of the K (a category of fewer
            points than the model predicts); a category without keypoints gets no entry.
        rounded: x, y to 0.01 pixel and scores to 1e-5 (a small predictions file).
    """
    if "keypoints" not in detection:
        raise ValueError(f"the detections of image {image_id} have no 'keypoints' (float [N, K, 3] pixels): keypoint "
                         "evaluation needs a model that predicts them")
    labels = detection["labels"].detach().long().cpu()
    category_ids = (labels if category_map is None else category_map.label_to_category_id(labels)).tolist()
    keypoints = detection["keypoints"].detach().cpu()  # as given: float32 from a model, exactly
    scores = detection["scores"].detach().double().cpu().tolist()
    results = []
    for category_id, points, score in zip(category_ids, keypoints, scores):
        count = counts.get(int(category_id))
        if count is None:
            continue
        results.append({"image_id": int(image_id), "category_id": int(category_id),
                        "keypoints": flat_keypoints(points[:count], rounded=rounded),
                        "score": round(score, 5) if rounded else float(score)})
    return results


def flat_keypoints(points: torch.Tensor, *, rounded: bool = False) -> list[float]:
    """float [K, 3] (pixel x, y, score) → COCO's flat ``[x1, y1, s1, ...]`` (``rounded``: x, y to 0.01 pixel,
    scores to 1e-5)."""
    flat = points.detach().double().cpu().reshape(-1).tolist()
    if not rounded:
        return flat
    return [round(value, 2 if i % 3 < 2 else 5) for i, value in enumerate(flat)]
