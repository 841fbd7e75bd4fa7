"""TIDE error breakdown: how much AP each kind of mistake costs.

TIDE (Bolya, Foley, Hays, Hoffman, "TIDE: A General Toolbox for Identifying Object Detection Errors",
ECCV 2020) sorts every false positive at the foreground IoU ``t_f`` (0.5) by its best IoU with the
ground truth of the image (``t_b`` = 0.1 is the background threshold), tested in this order:

- loc (localisation): right class, ``t_b <= IoU < t_f`` with a ground truth of its class.
- cls (classification): ``IoU >= t_f`` with a ground truth of another class.
- dupe (duplicate): ``IoU >= t_f`` with a ground truth of its class that a higher-scoring detection
  already matched.
- bkg (background): ``IoU < t_b`` with every ground truth.
- both (classification and localisation): the rest, ``t_b <= IoU < t_f`` with another class only.
- missed: a ground truth no detection matched and no cls or loc error could be fixed into.

Each error type's dAP is the AP50 after an oracle fixes every error of that type alone, minus the AP50
(negative differences, from the 101-point interpolation, count as 0, as in TIDE). The oracles:
cls becomes a true positive of the ground truth's class, loc a true positive of its class (only the
highest-scoring cls or loc error of one unmatched ground truth is fixed, the others are removed, and
errors on an already matched ground truth are removed); dupe, bkg and both are removed; missed ground
truth is taken out of the count of positives. "false positives" (every false positive scored below every
true positive) and "false negatives" (every unmatched ground truth taken out) bound what precision and
recall alone could gain.

The reference implementation, the ``tidecv`` package (1.0.1, 2020, unmaintained since), still runs with
numpy 2 (it uses none of the removed aliases such as ``np.float``) and its numbers are the reference the
tests compare with, but it is not a dependency: it imports OpenCV, pandas and seaborn, matches every
image again with its own matcher and classifies and fixes errors in Python loops over detection dicts.
Here the matches are pycocotools' own and one vectorised comparison of the false positives with the
objects of their image classifies them, so the base AP is COCOeval's AP50. The numbers equal tidecv's
(the tests check error counts and every dAP on random detections) when every image has at most 100
detections (DETR's queries; tidecv keeps 100 per image, COCOeval 100 per image and class), there are no
crowd regions and every predicted class has ground truth. Otherwise they differ where tidecv differs
from COCOeval: tidecv averages AP over classes that have detections but no ground truth (AP 0; here, as
in COCOeval, only classes with ground truth count) and lets detections inside crowd regions (ignored by
COCOeval) count as errors; and at an IoU of exactly ``t_f`` with an already matched object tidecv calls
the detection a localisation error, here a duplicate (the paper's ``IoU < t_f`` for localisation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detr.evaluation.matches import MatchTable, image_pairs, paired_iou, run_max

#: The main error types in TIDE's order, and the two special ones.
ERROR_TYPES: tuple[str, ...] = ("cls", "loc", "both", "dupe", "bkg", "missed")
SPECIAL_ERRORS: tuple[str, ...] = ("false_positives", "false_negatives")
ERROR_NAMES: dict[str, str] = {
    "cls": "classification", "loc": "localisation", "both": "classification + localisation",
    "dupe": "duplicate", "bkg": "background", "missed": "missed ground truth",
    "false_positives": "all false positives", "false_negatives": "all false negatives",
}
ERROR_DESCRIPTIONS: dict[str, str] = {
    "cls": "IoU ≥ t_f with an object of another class",
    "loc": "right class, t_b ≤ IoU < t_f",
    "both": "wrong class and t_b ≤ IoU < t_f",
    "dupe": "IoU ≥ t_f with an object already matched by a higher score",
    "bkg": "IoU < t_b with every object",
    "missed": "object no detection found or could be fixed into",
    "false_positives": "every false positive scored below every true positive",
    "false_negatives": "every object nobody matched removed",
}
#: 101 recall points of COCO's interpolated AP.
RECALL_THRESHOLDS = np.linspace(0.0, 1.0, 101)


@dataclass
class ErrorBreakdown:
    """TIDE's error analysis of one evaluation; AP values are fractions in [0, 1].

    ap: AP at ``iou_foreground`` (COCOeval's AP50 at the default), the base of every dAP.
    delta_ap: dAP per type of :data:`ERROR_TYPES` and :data:`SPECIAL_ERRORS`.
    counts: errors per type (detections; ground-truth boxes for "missed" and "false_negatives").
    class_ap: float [K] AP per class (-1 without ground truth), in ``category_ids`` order.
    class_delta_ap: per type, float [K] the class's AP after the fix minus its AP (0 without ground truth).
    class_counts: per main type, int64 [K] errors of the class (the detection's class; the ground truth's
        for "missed").
    det_error: int8 [D] index into :data:`ERROR_TYPES` per detection of the match table (-1: true
        positive or ignored).
    det_target: int64 [D] the ground-truth row the error refers to (cls, loc, both: the best-overlapping
        object; dupe: the object already matched), -1 otherwise.
    det_best_iou: float [D] that IoU (for bkg: the best IoU with any object).
    gt_missed: bool [G] missed ground truth.
    """

    iou_foreground: float
    iou_background: float
    category_ids: np.ndarray
    ap: float
    delta_ap: dict[str, float]
    counts: dict[str, int]
    class_ap: np.ndarray
    class_delta_ap: dict[str, np.ndarray]
    class_counts: dict[str, np.ndarray]
    det_error: np.ndarray
    det_target: np.ndarray
    det_best_iou: np.ndarray
    gt_missed: np.ndarray
    notes: list[str] = field(default_factory=list)

    def most_affected(self, error_type: str, top: int = 3) -> list[tuple[int, float]]:
        """The ``top`` (category id, class dAP) pairs with the largest dAP of ``error_type`` (dAP > 0 only)."""
        values = self.class_delta_ap[error_type]
        order = np.argsort(-values, kind="stable")[:top]
        return [(int(self.category_ids[k]), float(values[k])) for k in order if values[k] > 0]


def class_average_precision(
    det_class: np.ndarray, det_score: np.ndarray, det_true: np.ndarray, num_positives: np.ndarray
) -> np.ndarray:
    """COCO's 101-point interpolated AP per class, from ranked true / false positives.

    det_class: int [N] class index in [0, K); det_score: float [N]; det_true: bool [N] true positive;
    num_positives: int [K] ground-truth boxes per class. Ties in score keep the input order (COCOeval's
    stable sort). Returns float [K]: -1 for a class without positives or detections, 0 for a class with
    detections but no positives (as tidecv scores it).
    """
    num_classes = len(num_positives)
    order = np.lexsort((-det_score, det_class))
    classes, true = det_class[order], det_true[order]
    bounds = np.searchsorted(classes, np.arange(num_classes + 1))
    ap = np.full(num_classes, -1.0)
    for k in range(num_classes):
        start, stop = bounds[k], bounds[k + 1]
        if num_positives[k] <= 0:
            if stop > start:
                ap[k] = 0.0
            continue
        if stop == start:  # positives but no detection
            ap[k] = 0.0
            continue
        tp = np.cumsum(true[start:stop], dtype=float)
        fp = np.cumsum(~true[start:stop], dtype=float)
        recall = tp / num_positives[k]
        precision = tp / (tp + fp + np.spacing(1))
        precision = np.maximum.accumulate(precision[::-1])[::-1]  # the precision envelope
        index = np.searchsorted(recall, RECALL_THRESHOLDS, side="left")
        reached = index < len(precision)
        ap[k] = float(np.where(reached, precision[np.minimum(index, len(precision) - 1)], 0.0).mean())
    return ap


def _mean(ap: np.ndarray) -> float:
    valid = ap[ap > -1]
    return float(valid.mean()) if valid.size else -1.0


def tide_errors(table: MatchTable, *, iou_background: float = 0.1) -> ErrorBreakdown:
    """Classify the false positives of ``table`` (matched at t_f = ``table.iou_threshold``) and compute
    every error type's dAP by its oracle (see the module docstring)."""
    t_f, t_b = table.iou_threshold, iou_background
    num_dets, num_gts = len(table.det_score), len(table.gt_id)
    num_classes = len(table.category_ids)
    det_class, gt_class = table.det_class, table.gt_class
    counted = ~table.det_ignore
    true_positive = table.det_gt >= 0
    false_positive = counted & ~true_positive
    objects = ~table.gt_crowd

    # One rematch: IoU of every false positive with every (non-crowd) object of its image.
    fp_rows = np.flatnonzero(false_positive)
    gt_rows = np.flatnonzero(objects)
    pair_fp, pair_gt = image_pairs(table.det_image[fp_rows], table.gt_image[gt_rows])
    pair_gt = gt_rows[pair_gt]
    iou = paired_iou(table.det_box[fp_rows[pair_fp]], table.gt_box[pair_gt])
    same = det_class[fp_rows[pair_fp]] == gt_class[pair_gt]
    n = len(fp_rows)
    same_iou, same_at = run_max(np.where(same, iou, 0.0), pair_fp, n)
    other_iou, other_at = run_max(np.where(same, 0.0, iou), pair_fp, n)
    used_iou, used_at = run_max(np.where(same & table.gt_matched[pair_gt], iou, 0.0), pair_fp, n)

    loc = (same_iou >= t_b) & (same_iou < t_f)
    cls = ~loc & (other_iou >= t_f)
    dupe = ~loc & ~cls & (used_iou >= t_f)
    bkg = ~loc & ~cls & ~dupe & (np.maximum(same_iou, other_iou) < t_b)
    both = ~(loc | cls | dupe | bkg)
    kind = np.select([cls, loc, both, dupe, bkg], [0, 1, 2, 3, 4], -1).astype(np.int8)
    target_pair = np.select([cls | both, loc, dupe], [other_at, same_at, used_at], -1)
    det_error = np.full(num_dets, -1, dtype=np.int8)
    det_error[fp_rows] = kind
    det_target = np.full(num_dets, -1, dtype=np.int64)
    det_target[fp_rows] = np.where(target_pair >= 0, pair_gt[np.maximum(target_pair, 0)], -1)
    det_best_iou = np.zeros(num_dets)
    det_best_iou[fp_rows] = np.select([cls | both, loc | dupe], [other_iou, same_iou], np.maximum(same_iou, other_iou))

    # The oracle of cls and loc: the highest-scoring such error of each unmatched object becomes its
    # true positive; the others, and those on matched objects, are removed.
    fixable = ((det_error == 0) | (det_error == 1)) & (det_target >= 0)
    fixable &= ~table.gt_matched[np.maximum(det_target, 0)]
    candidates = np.flatnonzero(fixable)
    ranked = candidates[np.lexsort((-table.det_score[candidates], det_target[candidates]))]
    _, first = np.unique(det_target[ranked], return_index=True)
    fixed = np.zeros(num_dets, dtype=bool)
    fixed[ranked[first]] = True
    usable = np.zeros(num_gts, dtype=bool)
    usable[det_target[candidates]] = True
    gt_missed = objects & ~table.gt_matched & ~usable

    num_positives = np.bincount(gt_class[objects], minlength=num_classes)
    base_ap = class_average_precision(det_class[counted], table.det_score[counted], true_positive[counted],
                                      num_positives)
    base_ap = np.where(num_positives > 0, base_ap, -1.0)  # COCOeval's classes: those with ground truth
    base = _mean(base_ap)

    def fixed_ap(error_type: str) -> np.ndarray:
        keep = counted.copy()
        classes, true, scores = det_class.copy(), true_positive.copy(), table.det_score.copy()
        positives = num_positives.copy()
        if error_type in ("cls", "loc"):
            code = ERROR_TYPES.index(error_type)
            errors = det_error == code
            keep &= ~errors | fixed
            true |= errors & fixed
            if error_type == "cls":
                moved = errors & fixed
                classes[moved] = gt_class[det_target[moved]]
        elif error_type in ("both", "dupe", "bkg"):
            keep &= det_error != ERROR_TYPES.index(error_type)
        elif error_type == "missed":
            positives -= np.bincount(gt_class[gt_missed], minlength=num_classes)
        elif error_type == "false_positives":
            scores = np.where(true, scores, -1.0)  # every false positive below every true positive
        elif error_type == "false_negatives":
            positives = np.bincount(classes[keep & true], minlength=num_classes)
        ap = class_average_precision(classes[keep], scores[keep], true[keep], positives)
        ap[num_positives == 0] = -1.0
        return ap

    delta_ap, class_delta_ap = {}, {}
    for error_type in ERROR_TYPES + SPECIAL_ERRORS:
        ap = fixed_ap(error_type)
        delta_ap[error_type] = max(_mean(ap) - base, 0.0) if base >= 0 else 0.0
        class_delta_ap[error_type] = np.where(base_ap > -1, np.where(ap > -1, ap, 0.0) - base_ap, 0.0)
    class_counts = {name: np.bincount(det_class[det_error == code], minlength=num_classes)
                    for code, name in enumerate(ERROR_TYPES[:5])}
    class_counts["missed"] = np.bincount(gt_class[gt_missed], minlength=num_classes)
    counts = {name: int(values.sum()) for name, values in class_counts.items()}
    counts["false_positives"] = int(false_positive.sum())
    counts["false_negatives"] = int((objects & ~table.gt_matched).sum())
    return ErrorBreakdown(
        iou_foreground=t_f, iou_background=t_b, category_ids=table.category_ids, ap=base, delta_ap=delta_ap,
        counts=counts, class_ap=base_ap, class_delta_ap=class_delta_ap, class_counts=class_counts,
        det_error=det_error, det_target=det_target, det_best_iou=det_best_iou, gt_missed=gt_missed,
    )
