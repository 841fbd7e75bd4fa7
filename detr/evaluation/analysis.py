"""Why a detector fails: per-class AP, precision-recall curves, a confusion matrix and TIDE's error
breakdown of one COCO results json, computed from pycocotools' own evaluation.

    coco_eval = evaluate_results(coco_gt, results)         # or the COCOeval an evaluation already ran
    analysis = analyze(coco_gt, coco_eval=coco_eval)
    analysis.errors.delta_ap["cls"]                         # AP50 lost to classification errors

Everything comes from one ``COCOeval`` after ``evaluate()`` and ``accumulate()``: the PR curves are its
``eval["precision"]`` arrays, per-class AR its ``eval["recall"]``, and the matches behind the confusion
matrix and the error breakdown its ``evalImgs`` (:mod:`detr.evaluation.matches`). Only the false
positives are compared once more with the objects of other classes (:mod:`detr.evaluation.tide`).
:mod:`detr.visualize.analysis_report` turns the result into figures and an HTML page.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pycocotools.coco import COCO

from detr.evaluation.coco_evaluator import garbage_collection_paused
from detr.evaluation.matches import MatchTable, image_pairs, iou_index, match_table, paired_iou
from detr.evaluation.tide import ERROR_NAMES, ERROR_TYPES, SPECIAL_ERRORS, ErrorBreakdown, tide_errors

logger = logging.getLogger(__name__)

#: COCOeval.stats in order.
COCO_STAT_NAMES: tuple[str, ...] = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs",
                                    "ARm", "ARl")


#: A results file whose lowest score is at least this looks cut at a score threshold (when its images also hold
#: different numbers of detections): an uncut file holds every query, and most of them score near 0.
CUT_MIN_SCORE = 0.1


class ResultsFileError(ValueError):
    """A COCO results json that cannot be scored against the given ground truth, or a ground truth that
    cannot score any (unreadable, or without annotations)."""


def _read_json(path: Path, what: str) -> Any:
    """The json in ``path``, or a :class:`ResultsFileError` that names the file and what is wrong with it."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsFileError(f"{path} does not exist: pass the {what}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ResultsFileError(f"{path} cannot be read as the {what}: {error}") from error
    except json.JSONDecodeError as error:
        raise ResultsFileError(f"{path} is not valid json ({error}): the file is truncated or is not the {what}; "
                               "write it again") from error


def load_ground_truth(path: str | Path) -> COCO:
    """A pycocotools COCO from an annotation json, without pycocotools' prints.

    Raises:
        ResultsFileError: the file is missing or not valid json (truncated), is not a COCO annotation json
            (no images or categories), or has no annotations: nothing to score detections against (a test
            split's image list, say); pycocotools' errors for these were tracebacks deep in the matching.
    """
    path = Path(path)
    dataset = _read_json(path, "COCO annotation json (the ground truth)")
    missing = [key for key in ("images", "categories") if not isinstance(dataset, dict) or key not in dataset]
    if missing:
        raise ResultsFileError(f"{path} is not a COCO annotation json: it has no {' and no '.join(missing)}")
    if not dataset.get("annotations"):
        raise ResultsFileError(
            f"{path} has no annotations: there is nothing to score the detections against (a test split's image "
            "list?); pass the annotation json that holds the ground-truth boxes")
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def load_results(results: str | Path | Sequence[dict[str, Any]], coco_gt: COCO) -> list[dict[str, Any]]:
    """COCO results entries (``image_id``, ``category_id``, ``bbox`` xywh pixels, ``score``) ready for
    ``coco_gt.loadRes``, from a json file or a list.

    An entry with a ``file_name`` that the ground truth knows gets that image's id (``detr-predict``
    numbers images it cannot number from the file name 1, 2, ...); otherwise its ``image_id`` must be one
    of the ground truth's. Entries of categories the ground truth does not have are dropped (logged).
    A score or box that is NaN or infinite (json reads ``NaN`` and ``Infinity``), or a box of negative width or
    height, raises :class:`ResultsFileError` naming the entries: the first would rank anywhere and make up the
    AP, the second matches nothing (AP 0) where the writer is broken. Results that look cut at a score threshold
    (:func:`cut_results_message`) are logged at WARNING: COCO AP needs every detection.
    """
    source = str(results) if isinstance(results, (str, Path)) else "results"
    entries = (_read_json(Path(results), "COCO results json (the detections)") if isinstance(results, (str, Path))
               else list(results))
    if not isinstance(entries, list):
        raise ResultsFileError(f"{source}: a COCO results json is a list of detections, got {type(entries).__name__}")
    by_file = {image["file_name"]: image_id for image_id, image in coco_gt.imgs.items() if "file_name" in image}
    known_categories = set(coco_gt.getCatIds())
    loaded, unknown_categories, non_finite, negative = [], 0, [], []
    for index, entry in enumerate(entries):
        missing = [key for key in ("category_id", "bbox", "score") if key not in entry]
        if missing:
            raise ResultsFileError(f"{source}: entry {index} has no {', '.join(missing)}; each detection needs "
                                   "image_id (or file_name), category_id, bbox [x, y, w, h] and score")
        image_id = by_file.get(entry.get("file_name"), entry.get("image_id"))
        if image_id not in coco_gt.imgs:
            raise ResultsFileError(
                f"{source}: entry {index} (image_id {entry.get('image_id')!r}, file_name "
                f"{entry.get('file_name')!r}) matches no image of the ground truth; evaluate with the "
                "annotation json of the predicted images"
            )
        if entry["category_id"] not in known_categories:
            unknown_categories += 1
            continue
        bbox, score = [float(v) for v in entry["bbox"]], float(entry["score"])
        if not np.isfinite([*bbox, score]).all():
            non_finite.append(index)
            continue
        if bbox[2] < 0 or bbox[3] < 0:
            negative.append((index, entry["bbox"]))
            continue
        loaded.append({"image_id": int(image_id), "category_id": int(entry["category_id"]), "bbox": bbox,
                       "score": score})
    if non_finite:
        raise ResultsFileError(
            f"{source}: {len(non_finite)} entries {non_finite[:20]}{' ...' if len(non_finite) > 20 else ''} have a "
            f"score or bbox that is not finite (NaN or Infinity): the detector that wrote them is broken, e.g. "
            f"NaN weights; predict again with a sound checkpoint")
    if negative:
        (index, bbox), more = negative[0], len(negative) - 1
        raise ResultsFileError(
            f"{source}: {len(negative)} entries have a bbox of negative width or height (entry {index}: bbox {bbox}"
            f"{f', and {more} more' if more else ''}); COCO results are [x, y, width, height] in pixels: they would "
            "match nothing (AP 0). Was the file written as [x1, y1, x2, y2] with swapped corners? Fix the writer "
            "and predict again")
    if unknown_categories:
        logger.warning("%s: %d detections of categories the ground truth does not have were dropped", source,
                       unknown_categories)
    cut = cut_results_message(loaded, coco_gt.getImgIds())
    if cut is not None:
        logger.warning("%s: %s", source, cut)
    return loaded


def cut_results_message(results: Sequence[dict[str, Any]], image_ids: Sequence[int]) -> str | None:
    """Why ``results`` (COCO results entries) look cut at a score threshold, or None when they do not.

    A file written for COCO AP holds every query of every image (``detr-predict --all-queries``, the
    evaluation's own results): the same number per image, most scoring near 0. A thresholded file
    (``detr-predict``'s default) starts at its threshold and holds a different number per image: its AP is
    lower (recall ends at the threshold), and nothing in the numbers says so. Cut means: the lowest score is
    at least :data:`CUT_MIN_SCORE` and ``image_ids`` (the ground truth's) hold different numbers of entries.
    """
    if not results:
        return None
    lowest = min(float(entry["score"]) for entry in results)
    counts = dict.fromkeys(image_ids, 0)
    for entry in results:
        counts[entry["image_id"]] = counts.get(entry["image_id"], 0) + 1
    if lowest < CUT_MIN_SCORE or len(set(counts.values())) < 2:
        return None
    return (f"the detections look cut at a score threshold: the lowest score is {lowest:.3g} and images hold "
            f"{min(counts.values())} to {max(counts.values())} detections (an uncut file holds every query of "
            "each image); COCO AP counts only what the file holds, so this AP is lower than the model's: write "
            "every query for AP (detr-predict --all-queries)")


def evaluate_results(coco_gt: COCO, results: Sequence[dict[str, Any]], image_ids: Sequence[int] | None = None) -> Any:
    """pycocotools' bbox COCOeval of ``results`` on ``image_ids`` (default: every image of the ground
    truth), after evaluate, accumulate and summarize (its prints are dropped)."""
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()), garbage_collection_paused():
        if results:
            coco_dt = coco_gt.loadRes([dict(entry) for entry in results])  # loadRes adds keys to the entries
        else:  # loadRes indexes results[0]
            coco_dt = COCO()
            coco_dt.dataset = {"images": list(coco_gt.dataset["images"]),
                               "categories": copy.deepcopy(coco_gt.dataset["categories"]), "annotations": []}
            coco_dt.createIndex()
        coco_eval = COCOeval(coco_gt, coco_dt, iouType="bbox")
        if image_ids is not None:
            coco_eval.params.imgIds = sorted(int(i) for i in image_ids)
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    return coco_eval


@dataclass
class ConfusionMatrix:
    """Counts at one IoU and score threshold over ``K`` classes.

    matrix: int64 [K + 1, K + 1]; row = ground-truth class, last row "background" (detections that
        overlap no free object: false positives); column = predicted class, last column "missed" (objects
        no detection above the threshold found: false negatives). The diagonal holds COCOeval's matches
        of detections scoring at least ``score_threshold``; an off-diagonal cell a detection of another
        class that overlaps a still unmatched object by at least ``iou_threshold`` (greedy by score, then
        IoU, as COCOeval matches).
    """

    iou_threshold: float
    score_threshold: float
    category_ids: np.ndarray
    names: list[str]
    matrix: np.ndarray

    def confusions(self, top: int = 10) -> list[tuple[str, str, int]]:
        """The ``top`` largest off-diagonal class confusions: (true name, predicted name, count)."""
        k = len(self.names)
        inner = self.matrix[:k, :k].copy()
        np.fill_diagonal(inner, 0)
        flat = np.argsort(-inner, axis=None, kind="stable")[:top]
        return [(self.names[i], self.names[j], int(inner[i, j])) for i, j in zip(*np.unravel_index(flat, inner.shape))
                if inner[i, j] > 0]


def confusion_matrix(table: MatchTable, names: Sequence[str], *, score_threshold: float = 0.5) -> ConfusionMatrix:
    """The :class:`ConfusionMatrix` of ``table`` (matched at its ``iou_threshold``) for detections scoring at
    least ``score_threshold``."""
    k = len(table.category_ids)
    det_class, gt_class = table.det_class, table.gt_class
    matrix = np.zeros((k + 1, k + 1), dtype=np.int64)
    shown = ~table.det_ignore & (table.det_score >= score_threshold)
    matched = shown & (table.det_gt >= 0)
    np.add.at(matrix, (gt_class[table.det_gt[matched]], det_class[matched]), 1)
    gt_free = ~table.gt_crowd
    gt_free[table.det_gt[matched]] = False
    det_rows = np.flatnonzero(shown & ~matched)
    gt_rows = np.flatnonzero(gt_free)
    pair_det, pair_gt = image_pairs(table.det_image[det_rows], table.gt_image[gt_rows])
    pair_det, pair_gt = det_rows[pair_det], gt_rows[pair_gt]
    iou = paired_iou(table.det_box[pair_det], table.gt_box[pair_gt])
    close = iou >= table.iou_threshold
    pair_det, pair_gt, iou = pair_det[close], pair_gt[close], iou[close]
    det_free = np.zeros(len(table.det_score), dtype=bool)
    det_free[det_rows] = True
    # Few pairs are left (other-class overlaps of unmatched detections): a plain greedy loop.
    for p in np.lexsort((-iou, pair_det, -table.det_score[pair_det])):
        d, g = pair_det[p], pair_gt[p]
        if det_free[d] and gt_free[g]:
            det_free[d] = gt_free[g] = False
            matrix[gt_class[g], det_class[d]] += 1
    np.add.at(matrix, (k, det_class[det_free]), 1)
    np.add.at(matrix, (gt_class[gt_free], k), 1)
    return ConfusionMatrix(iou_threshold=table.iou_threshold, score_threshold=score_threshold,
                           category_ids=table.category_ids, names=list(names), matrix=matrix)


@dataclass
class DetectionAnalysis:
    """What :func:`analyze` found; AP values are fractions in [0, 1], -1 where undefined (no ground truth).

    stats: COCOeval's 12 statistics by :data:`COCO_STAT_NAMES`.
    per_class: one dict per category: ``category_id``, ``name``, ``num_gt`` (non-crowd boxes), ``num_det``
        (scored detections), ``AP``, ``AP50``, ``AP75``, ``AR100``, ``dAP`` (per error type, this class's
        AP50 gained by the fix), ``errors`` (count per error type).
    recall_thresholds: float [R] (101 points).
    precision: {"0.5": float [K, R], "0.75": float [K, R]}: COCOeval's interpolated precision per class
        (area "all", 100 detections), -1 for a class without ground truth.
    table: the matches at IoU 0.5 (:class:`MatchTable`); errors: TIDE's breakdown on it.
    confusion: the confusion matrix.
    image_files: image id → file_name from the ground truth (for drawing cases).
    """

    stats: dict[str, float]
    per_class: list[dict[str, Any]]
    recall_thresholds: np.ndarray
    precision: dict[str, np.ndarray]
    table: MatchTable
    errors: ErrorBreakdown
    confusion: ConfusionMatrix
    names: list[str]
    image_files: dict[int, str] = field(default_factory=dict)

    @property
    def num_images(self) -> int:
        return len(self.table.image_ids)

    def overall_precision(self, iou: str) -> np.ndarray:
        """float [R]: COCOeval's precision at IoU ``iou`` ("0.5" or "0.75") averaged over classes with
        ground truth (the curve whose mean is AP50 / AP75); -1 where no class has ground truth."""
        precision = self.precision[iou]
        valid = precision > -1
        counts = valid.sum(axis=0)
        return np.where(counts > 0, np.where(valid, precision, 0).sum(axis=0) / np.maximum(counts, 1), -1.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no per-detection arrays)."""
        errors = self.errors
        return {
            "num_images": self.num_images,
            "num_detections": int((~self.table.det_ignore).sum()),
            "num_objects": int((~self.table.gt_crowd).sum()),
            "stats": self.stats,
            "per_class": self.per_class,
            "errors": {
                "iou_foreground": errors.iou_foreground, "iou_background": errors.iou_background,
                "AP50": errors.ap, "dAP": errors.delta_ap, "counts": errors.counts,
                "most_affected": {t: [{"category_id": c, "name": self.name_of(c), "dAP": v}
                                      for c, v in errors.most_affected(t)] for t in ERROR_TYPES},
            },
            "confusion": {"iou_threshold": self.confusion.iou_threshold,
                          "score_threshold": self.confusion.score_threshold,
                          "labels": self.names, "matrix": self.confusion.matrix.tolist()},
            "pr_curves": {"recall": self.recall_thresholds.tolist(),
                          **{f"precision@{iou}": self.overall_precision(iou).tolist() for iou in self.precision}},
        }

    def name_of(self, category_id: int) -> str:
        return self.names[int(np.searchsorted(self.table.category_ids, category_id))]

    def summary_text(self) -> str:
        """AP, AP50 and the error breakdown as a few lines of fixed-width text (AP points)."""
        errors = self.errors
        lines = [f"AP {100 * self.stats['AP']:.1f}  AP50 {100 * self.stats['AP50']:.1f}  AP75 "
                 f"{100 * self.stats['AP75']:.1f}  ({self.num_images} images)",
                 f"{'error':<30} {'count':>7} {'dAP50':>6}  most affected"]
        for t in ERROR_TYPES + SPECIAL_ERRORS:
            affected = ", ".join(f"{self.name_of(c)} {100 * v:.1f}" for c, v in errors.most_affected(t)) \
                if t in ERROR_TYPES else ""
            lines.append(f"{ERROR_NAMES[t]:<30} {errors.counts[t]:>7} {100 * errors.delta_ap[t]:>6.2f}  {affected}")
        return "\n".join(lines)


@garbage_collection_paused()  # the match tables and TIDE build one object per detection, none in a cycle
def analyze(
    coco_gt: COCO,
    results: Sequence[dict[str, Any]] | None = None,
    *,
    coco_eval: Any = None,
    image_ids: Sequence[int] | None = None,
    score_threshold: float = 0.5,
    confusion_iou: float = 0.5,
    iou_background: float = 0.1,
) -> DetectionAnalysis:
    """Analyse ``results`` (COCO results entries with ground-truth image ids, see :func:`load_results`)
    against ``coco_gt``, or reuse ``coco_eval``, a pycocotools bbox COCOeval after evaluate() and
    accumulate() with its default parameters (e.g. the one :class:`detr.evaluation.CocoEvaluator` ran).

    image_ids: the images to score when ``coco_eval`` is not given (default: all of the ground truth's).
    score_threshold, confusion_iou: the confusion matrix's (detections below the score are not shown;
        the IoU must be one of COCOeval's thresholds, 0.5:0.05:0.95).
    iou_background: TIDE's background threshold t_b (its foreground threshold t_f is 0.5, AP50's).
    """
    if coco_eval is None or not isinstance(getattr(coco_eval, "evalImgs", None), list) or not coco_eval.evalImgs:
        if results is None:
            raise ValueError("analyze needs results or a pycocotools COCOeval after evaluate() and accumulate()")
        coco_eval = evaluate_results(coco_gt, results, image_ids)
    with contextlib.redirect_stdout(io.StringIO()):
        if not getattr(coco_eval, "eval", None):
            coco_eval.accumulate()
        if not len(getattr(coco_eval, "stats", [])):
            coco_eval.summarize()
    params = coco_eval.params
    category_ids = [int(c) for c in params.catIds]
    names = [str(coco_gt.cats[c].get("name", c)) for c in category_ids]
    table = match_table(coco_eval, 0.5)
    errors = tide_errors(table, iou_background=iou_background)
    confusion_table = table if abs(confusion_iou - 0.5) < 1e-6 else match_table(coco_eval, confusion_iou)
    confusion = confusion_matrix(confusion_table, names, score_threshold=score_threshold)

    # precision: [T, R, K, A, M], recall: [T, K, A, M]; area "all" is A = 0 and 100 detections M = -1.
    precision_all = np.asarray(coco_eval.eval["precision"])[:, :, :, 0, -1]
    recall_all = np.asarray(coco_eval.eval["recall"])[:, :, 0, -1]
    t50, t75 = iou_index(coco_eval, 0.5), iou_index(coco_eval, 0.75)

    def mean_valid(values: np.ndarray) -> float:
        values = values[values > -1]
        return float(values.mean()) if values.size else -1.0

    num_gt = np.bincount(table.gt_class[~table.gt_crowd], minlength=len(category_ids))
    num_det = np.bincount(table.det_class[~table.det_ignore], minlength=len(category_ids))
    per_class = []
    for k, category_id in enumerate(category_ids):
        per_class.append({
            "category_id": category_id, "name": names[k], "num_gt": int(num_gt[k]), "num_det": int(num_det[k]),
            "AP": mean_valid(precision_all[:, :, k]), "AP50": mean_valid(precision_all[t50, :, k]),
            "AP75": mean_valid(precision_all[t75, :, k]), "AR100": mean_valid(recall_all[:, k]),
            "dAP": {t: float(errors.class_delta_ap[t][k]) for t in ERROR_TYPES + SPECIAL_ERRORS},
            "errors": {t: int(errors.class_counts[t][k]) for t in ERROR_TYPES},
        })
    return DetectionAnalysis(
        stats={name: float(v) for name, v in zip(COCO_STAT_NAMES, coco_eval.stats)},
        per_class=per_class,
        recall_thresholds=np.asarray(params.recThrs, dtype=float),
        precision={"0.5": precision_all[t50].T.copy(), "0.75": precision_all[t75].T.copy()},
        table=table, errors=errors, confusion=confusion, names=names,
        image_files={int(i): str(image.get("file_name", "")) for i, image in coco_gt.imgs.items()},
    )


@dataclass
class Case:
    """One error to draw: the detection (absent for "missed") and the object it concerns (absent for
    "bkg"); boxes pixel xywh."""

    error_type: str
    image_id: int
    file_name: str
    det_box: list[float] | None = None
    det_name: str | None = None
    det_score: float | None = None
    gt_box: list[float] | None = None
    gt_name: str | None = None
    iou: float | None = None


def worst_cases(analysis: DetectionAnalysis, error_type: str, top: int = 8) -> list[Case]:
    """The ``top`` most confident detections of an error type, or for "missed" the largest missed objects."""
    table, errors = analysis.table, analysis.errors
    det_class, gt_class = table.det_class, table.gt_class
    cases = []
    if error_type == "missed":
        rows = np.flatnonzero(errors.gt_missed)
        area = table.gt_box[rows, 2] * table.gt_box[rows, 3]
        for g in rows[np.argsort(-area, kind="stable")[:top]]:
            image_id = int(table.gt_image[g])
            cases.append(Case(error_type, image_id, analysis.image_files.get(image_id, ""),
                              gt_box=table.gt_box[g].tolist(), gt_name=analysis.names[gt_class[g]]))
        return cases
    rows = np.flatnonzero(errors.det_error == ERROR_TYPES.index(error_type))
    for d in rows[np.argsort(-table.det_score[rows], kind="stable")[:top]]:
        image_id, g = int(table.det_image[d]), int(errors.det_target[d])
        cases.append(Case(
            error_type, image_id, analysis.image_files.get(image_id, ""), det_box=table.det_box[d].tolist(),
            det_name=analysis.names[det_class[d]], det_score=float(table.det_score[d]),
            gt_box=table.gt_box[g].tolist() if g >= 0 else None,
            gt_name=analysis.names[gt_class[g]] if g >= 0 else None,
            iou=float(errors.det_best_iou[d]),
        ))
    return cases
