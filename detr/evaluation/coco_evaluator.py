"""COCO evaluation of post-processed DETR predictions, boxes ("bbox"), masks ("segm") and keypoints ("keypoints":
OKS AP, :mod:`detr.evaluation.keypoints`), on faster-coco-eval where it is installed, else pycocotools (the same
numbers: tests/evaluation/test_coco_evaluator.py compares every statistic; keypoints always on pycocotools, whose
OKS takes each category's own sigmas there).

Flow: :meth:`CocoEvaluator.update` after every evaluation batch (post-processed detections, pixel xyxy
in the ORIGINAL image; for "segm" also their masks at that size), kept per image (boxes as one float64
array in the layout of ``COCO.loadRes``'s arrays, masks as COCO RLE results); :meth:`CocoEvaluator.compute`
once at the end. The ground truth is a pycocotools ``COCO`` given up front, or, where it is made image by
image (the panoptic masks), :meth:`CocoEvaluator.add_ground_truth` beside each update. Under
``torch.distributed``, ``compute`` gathers every process's images to rank 0 once
(:func:`detr.evaluation.gather.on_rank_zero`) and keeps one entry per image id: the distributed sampler
pads its last batch with repeated images, and an image counted twice would bias AP. Rank 0 alone runs
COCOeval, on exactly the images that were predicted (so a run limited to a few validation batches still
gets a meaningful number), and broadcasts the standard statistics and the per-class AP table to the other
ranks; the COCO results json (data set's own category ids) and the COCOeval stay on rank 0.

As in the authors' evaluation (PostProcess in their models/detr.py, then datasets/coco_eval.py), every query
goes to COCOeval: no score threshold, maxDets 100.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import io
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from torchvision.ops import box_convert

from detr.atomic_files import write_text_atomically
from detr.categories import CategoryMap
from detr.evaluation.gather import on_rank_zero
from detr.evaluation.keypoints import (
    KEYPOINT_STAT_NAMES,
    category_keypoint_counts,
    evaluate_keypoints,
    ground_truth_sigmas,
    keypoints_to_results,
)

logger = logging.getLogger(__name__)

Backend = Literal["auto", "pycocotools", "faster_coco_eval"]
#: What COCOeval scores: boxes, instance masks or keypoints (OKS).
IouType = Literal["bbox", "segm", "keypoints"]
BACKENDS: tuple[str, ...] = ("auto", "pycocotools", "faster_coco_eval")

#: The columns of a detections array (:func:`detections_to_array`): COCO.loadRes's numpy layout, box xywh pixels.
ARRAY_COLUMNS: tuple[str, ...] = ("image_id", "x", "y", "w", "h", "score", "category_id")

#: The statistics :meth:`CocoEvaluator.compute` returns, in this order, and their index in COCOeval.stats.
STAT_NAMES: tuple[str, ...] = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100")
_STAT_INDEX: dict[str, int] = {"AP": 0, "AP50": 1, "AP75": 2, "APs": 3, "APm": 4, "APl": 5, "AR100": 8}

#: COCOeval's largest ``maxDets``: per image and category, the detections it scores.
MAX_DETECTIONS = 100


@dataclass
class CocoEvaluation:
    """What one evaluation produced.

    stats: ``{"AP", "AP50", "AP75", "APs", "APm", "APl", "AR100"}`` as floats in [0, 1], or -1 where
        COCOeval has no ground truth to score (e.g. no small objects), exactly as pycocotools reports; for
        keypoints pycocotools' ten instead (:data:`detr.evaluation.keypoints.KEYPOINT_STAT_NAMES`: no small objects,
        AR at 20 detections).
    per_class: one dict per ground-truth category: ``category_id``, ``name``, ``num_instances``
        (non-crowd boxes in the evaluated images), ``AP``, ``AP50``, ``AP75`` (-1 without ground truth).
    results: COCO results json entries ``{"image_id", "category_id", "bbox": [x, y, w, h] pixels,
        "score"}`` in the data set's own category ids; empty on the ranks other than 0 of a distributed run.
    image_ids: the evaluated image ids, each once, sorted.
    summary: pycocotools' 12-line summary text.
    coco_eval: the COCOeval that produced these numbers (after accumulate), for analyses that reuse its
        matches (:func:`detr.evaluation.analysis.analyze`, which needs pycocotools' per-image matches and
        evaluates the results again where faster-coco-eval kept none); None without predictions and on
        the ranks other than 0. DetrSystem drops it once its error analysis has run, since its per-image
        matches are large.
    backend: the library that ran COCOeval ("pycocotools" or "faster_coco_eval"; "" without predictions).
    best_threshold: the detection score threshold with the best mean F1 over the classes at IoU 0.5
        (:func:`f1_best_threshold`; None for masks or without predictions).
    """

    stats: dict[str, float]
    per_class: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    image_ids: list[int] = field(default_factory=list)
    summary: str = ""
    coco_eval: Any = field(default=None, repr=False, compare=False)
    backend: str = ""
    best_threshold: float | None = None

    def per_class_table(self) -> str:
        """The per-class AP table as fixed-width text (AP in percent, "-" where no ground truth)."""
        return format_per_class_table(self.per_class)

    def stats_table(self) -> str:
        """The statistics (seven; ten for keypoints) as a two-line text table (percent)."""
        header = " ".join(f"{name:>7}" for name in self.stats)
        values = " ".join(f"{_percent(value):>7}" for value in self.stats.values())
        return f"{header}\n{values}"

    def write(self, directory: str | Path, *, prefix: str = "") -> dict[str, Path]:
        """Write ``{prefix}predictions.json``, ``{prefix}metrics.json`` and ``{prefix}per_class_ap.txt``.

        Returns the written paths by kind ("predictions", "metrics", "per_class").
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "predictions": out / f"{prefix}predictions.json",
            "metrics": out / f"{prefix}metrics.json",
            "per_class": out / f"{prefix}per_class_ap.txt",
        }
        write_coco_results(paths["predictions"], self.results)
        paths["metrics"].write_text(json.dumps(self.stats, indent=2) + "\n")
        paths["per_class"].write_text(self.per_class_table() + "\n\n" + self.summary)
        return paths


def _percent(value: float) -> str:
    return "-" if value < 0 else f"{100.0 * value:.1f}"


def format_per_class_table(per_class: Sequence[dict[str, Any]]) -> str:
    """Fixed-width text table of :attr:`CocoEvaluation.per_class` rows."""
    width = max([len("category")] + [len(str(row["name"])) for row in per_class])
    lines = [f"{'id':>5}  {'category':<{width}}  {'#gt':>6}  {'AP':>6}  {'AP50':>6}  {'AP75':>6}"]
    for row in per_class:
        lines.append(
            f"{row['category_id']:>5}  {row['name']:<{width}}  {row['num_instances']:>6}  "
            f"{_percent(row['AP']):>6}  {_percent(row['AP50']):>6}  {_percent(row['AP75']):>6}"
        )
    return "\n".join(lines)


def detections_to_array(
    image_id: int, detection: dict[str, torch.Tensor], category_map: CategoryMap | None = None
) -> np.ndarray:
    """One image's post-processed detections → float64 [Q, 7] rows of :data:`ARRAY_COLUMNS`.

    detection: ``scores`` float [Q], ``labels`` int64 [Q] (model labels), ``boxes`` float [Q, 4] pixel
    xyxy in the original image (the output of :class:`detr.PostProcess`). Labels become category ids
    through ``category_map`` (model label == category id when it is None); boxes become COCO xywh, in
    float32 as the model computed them, then stored exactly in float64.
    """
    scores = detection["scores"].detach().float().cpu()
    labels = detection["labels"].detach().long().cpu()
    boxes = detection["boxes"].detach().float().cpu()
    if boxes.ndim != 2 or boxes.shape[-1] != 4 or not (len(boxes) == len(scores) == len(labels)):
        raise ValueError(
            f"detections for image {image_id} need scores [Q], labels [Q] and boxes [Q, 4]; got shapes "
            f"{tuple(scores.shape)}, {tuple(labels.shape)}, {tuple(boxes.shape)}"
        )
    category_ids = labels if category_map is None else category_map.label_to_category_id(labels)
    rows = np.empty((len(scores), len(ARRAY_COLUMNS)), dtype=np.float64)
    rows[:, 0] = int(image_id)
    rows[:, 1:5] = box_convert(boxes, in_fmt="xyxy", out_fmt="xywh").numpy()
    rows[:, 5] = scores.numpy()
    rows[:, 6] = category_ids.numpy()
    return rows


def masks_to_rle(masks: torch.Tensor) -> list[dict[str, Any]]:
    """bool [Q, H, W] instance masks → COCO run-length encodings (``{"size": [H, W], "counts": str}``), the
    ``segmentation`` of COCO "segm" results (pycocotools' encoding; the counts decoded to text for json)."""
    array = np.asfortranarray(masks.cpu().numpy().astype(np.uint8).transpose(1, 2, 0))  # [H, W, Q], as it wants
    encoded = mask_utils.encode(array)
    return [{"size": rle["size"], "counts": rle["counts"].decode("ascii")} for rle in encoded]


def detections_to_mask_results(image_id: int, detection: dict[str, torch.Tensor],
                               category_map: CategoryMap | None = None) -> list[dict[str, Any]]:
    """One image's detections with their ``masks`` (bool [Q, H, W] at the original size) → COCO "segm"
    results ``{"image_id", "category_id", "segmentation": RLE, "score"}`` (data set ids, as
    :func:`detections_to_array`)."""
    labels = detection["labels"].detach().long().cpu()
    category_ids = labels if category_map is None else category_map.label_to_category_id(labels)
    return [{"image_id": int(image_id), "category_id": int(category_id), "segmentation": rle, "score": float(score)}
            for rle, category_id, score in zip(masks_to_rle(detection["masks"]), category_ids.tolist(),
                                               detection["scores"].detach().float().cpu().tolist())]


def scored_detections(labels: torch.Tensor, scores: torch.Tensor, max_detections: int = MAX_DETECTIONS
                      ) -> torch.Tensor:
    """int64 [K] positions, increasing, of the detections COCOeval scores among one image's (``labels`` [Q],
    ``scores`` [Q]): per label, the ``max_detections`` best, ties in the order given (COCOeval's stable sort).
    Leaving the others out changes no statistic; it spares a mask evaluation every other detection's
    full-size mask."""
    order = np.argsort(-scores.detach().cpu().double().numpy(), kind="stable")
    seen: Counter[int] = Counter()
    keep = []
    for position, label in zip(order.tolist(), labels.detach().cpu()[order].tolist()):
        seen[label] += 1
        if seen[label] <= max_detections:
            keep.append(position)
    return torch.tensor(sorted(keep), dtype=torch.int64)


def array_to_coco_results(
    rows: np.ndarray, *, file_name: str | None = None, rounded: bool = False
) -> list[dict[str, Any]]:
    """float64 [N, 7] rows of :data:`ARRAY_COLUMNS` → COCO results json entries (Python numbers).

    ``file_name``, when given, is added to every entry. ``rounded`` rounds boxes to 0.01 pixel and scores
    to 1e-5, which keeps a predictions file small; evaluation keeps full precision.
    """
    image_ids = rows[:, 0].astype(np.int64).tolist()
    category_ids = rows[:, 6].astype(np.int64).tolist()
    boxes, scores = rows[:, 1:5].tolist(), rows[:, 5].tolist()
    if rounded:  # Python's round (correctly rounded decimals), as json readers expect
        boxes = [[round(v, 2) for v in box] for box in boxes]
        scores = [round(score, 5) for score in scores]
    if file_name is None:
        return [{"image_id": i, "category_id": c, "bbox": b, "score": s}
                for i, c, b, s in zip(image_ids, category_ids, boxes, scores)]
    return [{"image_id": i, "category_id": c, "bbox": b, "score": s, "file_name": file_name}
            for i, c, b, s in zip(image_ids, category_ids, boxes, scores)]


def detections_to_coco_results(
    image_id: int,
    detection: dict[str, torch.Tensor],
    category_map: CategoryMap | None = None,
    *,
    file_name: str | None = None,
    rounded: bool = False,
) -> list[dict[str, Any]]:
    """One image's post-processed detections → COCO results json entries
    (:func:`detections_to_array`, then :func:`array_to_coco_results`)."""
    return array_to_coco_results(detections_to_array(image_id, detection, category_map), file_name=file_name,
                                 rounded=rounded)


def resolve_backend(backend: str) -> Literal["pycocotools", "faster_coco_eval"]:
    """The COCOeval library ``backend`` names: "auto" is faster-coco-eval where it imports, else pycocotools.

    Raises:
        ValueError: for an unknown name, or "faster_coco_eval" when the package is not installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"COCO evaluator backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "pycocotools":
        return "pycocotools"
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError as error:
        if backend == "auto":
            return "pycocotools"
        raise ValueError(
            "COCO evaluator backend 'faster_coco_eval' needs the faster-coco-eval package: "
            "pip install faster-coco-eval, or use backend 'auto' or 'pycocotools'"
        ) from error
    return "faster_coco_eval"


def write_coco_results(path: str | Path, results: Sequence[dict[str, Any]]) -> Path:
    """Write COCO results json entries to ``path`` (parents created), atomically: a crash leaves the old
    file or the new one, never a part.

    Raises:
        ValueError: when a value is NaN or infinite, which JSON cannot hold (leave out the predictions of
            a model whose outputs are not finite).
    """
    return write_text_atomically(path, json.dumps(list(results), allow_nan=False))


class CocoEvaluator:
    """Accumulates predictions over an evaluation epoch and scores them against COCO ground truth.

    Args:
        coco_gt: ground truth as a pycocotools ``COCO`` (crowd regions included; they are ignored by
            COCOeval as in the official evaluation), e.g. ``datamodule.val_dataset.coco``; None when it is
            made image by image with :meth:`add_ground_truth` (then ``categories`` lists the data set's).
        iou_type: "bbox" (box AP), "segm" (mask AP: the detections need ``masks``) or "keypoints" (OKS AP: the
            detections need ``keypoints`` [Q, K, 3] pixels; always pycocotools; ``coco_gt`` needed).
        categories: the data set's categories (``id``, ``name``) for ground truth given image by image.
        category_map: maps model labels to the data set's category ids; None means the labels already
            are category ids (the raw-id convention of the released COCO checkpoints).
        backend: "auto" (faster_coco_eval where installed, else pycocotools), "pycocotools" (the
            reference) or "faster_coco_eval" (C++ matching and accumulate, the same numbers; ``pip install
            faster-coco-eval``). :attr:`backend` holds the resolved name.
        progress: show a tqdm progress bar while pycocotools matches detections (a minute on COCO val;
            faster-coco-eval takes seconds and shows none).
        keypoint_sigmas: OKS sigmas per category id (``{id: [K numbers]}``; "keypoints" only); a category without
            takes its json ``sigmas`` field, else COCO's person sigmas for 17 points
            (:func:`detr.evaluation.keypoints.ground_truth_sigmas`, checked here: a missing one fails at start).
    """

    def __init__(
        self,
        coco_gt: COCO | None = None,
        *,
        iou_type: IouType = "bbox",
        categories: Sequence[dict[str, Any]] | None = None,
        category_map: CategoryMap | None = None,
        backend: Backend = "auto",
        progress: bool = False,
        keypoint_sigmas: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        if iou_type not in ("bbox", "segm", "keypoints"):
            raise ValueError(f"iou_type must be 'bbox', 'segm' or 'keypoints', got {iou_type!r}")
        self.keypoint_sigmas: dict[int, np.ndarray] = {}
        self.keypoint_counts: dict[int, int] = {}
        if iou_type == "keypoints":
            if coco_gt is None:
                raise ValueError("CocoEvaluator(iou_type='keypoints') needs coco_gt, the ground truth with keypoints")
            if backend == "faster_coco_eval":
                raise ValueError("keypoint evaluation runs on pycocotools (each category's own OKS sigmas): pass "
                                 "backend='auto' or 'pycocotools'")
            backend = "pycocotools"
            self.keypoint_sigmas = ground_truth_sigmas(coco_gt, keypoint_sigmas)
            self.keypoint_counts = category_keypoint_counts(coco_gt)
        if coco_gt is None and categories is None:
            raise ValueError("CocoEvaluator without coco_gt needs the data set's categories (ground truth then "
                             "comes image by image: add_ground_truth)")
        self.coco_gt = coco_gt
        self.iou_type = iou_type
        self.categories = [dict(c) for c in categories] if categories is not None else None
        self.category_map = category_map
        self.backend = resolve_backend(backend)
        self.progress = progress
        self._known_image_ids = set(coco_gt.getImgIds()) if coco_gt is not None else None
        self.reset()

    def reset(self) -> None:
        """Forget the accumulated predictions and per-image ground truth (call at the start of every epoch)."""
        # image id -> its results: float64 [Q, 7] rows (ARRAY_COLUMNS) for "bbox", COCO RLE results for "segm"
        self._results: dict[int, Any] = {}
        self._ground_truth: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}

    @property
    def num_images(self) -> int:
        """Images accumulated on this process so far (each id once)."""
        return len(self._results)

    def add_ground_truth(self, images: Sequence[dict[str, Any]], annotations: Sequence[Sequence[dict[str, Any]]]
                         ) -> None:
        """Ground truth of images evaluated without a ``coco_gt``: per image its COCO ``images`` entry (``id``,
        ``height``, ``width``) and its annotations (``category_id``, ``bbox`` xywh, ``area``, ``iscrowd`` and,
        for "segm", ``segmentation`` RLE). An image seen again keeps its first ground truth."""
        if self.coco_gt is not None:
            raise ValueError("this CocoEvaluator has its ground truth (coco_gt); add_ground_truth is for one built "
                             "without it")
        for image, image_annotations in zip(images, annotations):
            self._ground_truth.setdefault(int(image["id"]), (dict(image), [dict(a) for a in image_annotations]))

    def update(self, image_ids: Sequence[int] | torch.Tensor, detections: Sequence[dict[str, torch.Tensor]]) -> None:
        """Add one batch: ``image_ids[i]`` is the image of ``detections[i]`` (see :func:`detections_to_array`;
        for "segm" also ``masks`` bool [Q, H, W] at the original size).

        An image seen again (padding of the distributed sampler) keeps its first detections.
        """
        ids = [int(i) for i in (image_ids.tolist() if isinstance(image_ids, torch.Tensor) else image_ids)]
        if len(ids) != len(detections):
            raise ValueError(f"CocoEvaluator.update got {len(ids)} image ids for {len(detections)} detection dicts")
        known = self._known_image_ids if self._known_image_ids is not None else set(self._ground_truth)
        source = "the ground-truth annotation json" if self.coco_gt is not None else "the ground truth added so far"
        for image_id, detection in zip(ids, detections):
            if image_id not in known:
                raise ValueError(f"image id {image_id} is not in {source}; evaluate with the ground truth of the "
                                 "images being predicted")
            if image_id in self._results:
                continue
            if self.iou_type == "segm":
                self._results[image_id] = detections_to_mask_results(image_id, detection, self.category_map)
            elif self.iou_type == "keypoints":
                self._results[image_id] = keypoints_to_results(image_id, detection, self.category_map,
                                                               self.keypoint_counts)
            else:
                self._results[image_id] = detections_to_array(image_id, detection, self.category_map)

    def compute(self) -> CocoEvaluation:
        """Gather, deduplicate and run COCOeval on the predicted images, once.

        Every process must call it. Without a process group (or with one process) it evaluates the local
        predictions. Under ``torch.distributed`` the predictions go to rank 0 once, rank 0 evaluates, and
        every rank gets the same ``stats``, ``per_class``, ``image_ids`` and ``summary``; ``results`` and
        ``coco_eval`` only rank 0 (see :class:`CocoEvaluation`). An error on rank 0 is raised on every rank.
        """
        return on_rank_zero((self._results, self._ground_truth), self._evaluate_gathered,
                            shared=lambda evaluation: dataclasses.replace(evaluation, results=[], coco_eval=None),
                            what="COCO evaluation")

    def _evaluate_gathered(self, parts: list[tuple[dict[int, Any], dict[int, Any]]]) -> CocoEvaluation:
        results: dict[int, Any] = {}
        ground_truth: dict[int, Any] = {}
        for part_results, part_ground_truth in parts:  # rank order: the first copy of a repeated image wins
            for image_id, rows in part_results.items():
                results.setdefault(image_id, rows)
            for image_id, truth in part_ground_truth.items():
                ground_truth.setdefault(image_id, truth)
        return self._evaluate(results, ground_truth)

    def _evaluate(self, per_image: dict[int, Any], ground_truth: dict[int, Any]) -> CocoEvaluation:
        image_ids = sorted(per_image)
        names = KEYPOINT_STAT_NAMES if self.iou_type == "keypoints" else STAT_NAMES
        if not image_ids:
            logger.warning("CocoEvaluator.compute called without any predicted image; all stats are -1")
            return CocoEvaluation(stats={name: -1.0 for name in names})
        coco_gt = self.coco_gt if self.coco_gt is not None else self._ground_truth_coco(ground_truth)
        if self.iou_type == "keypoints":
            results = [dict(entry) for image_id in image_ids for entry in per_image[image_id]]
            evaluation = evaluate_keypoints(coco_gt, results, sigmas=self.keypoint_sigmas, image_ids=image_ids)
            return CocoEvaluation(stats=evaluation.stats, per_class=evaluation.per_class, results=results,
                                  image_ids=image_ids, summary=evaluation.summary, coco_eval=evaluation.coco_eval,
                                  backend=self.backend)
        if self.iou_type == "segm":
            results = [dict(entry) for image_id in image_ids for entry in per_image[image_id]]
        else:
            rows = np.concatenate([per_image[image_id] for image_id in image_ids])
            results = array_to_coco_results(rows)
        with garbage_collection_paused():
            coco_eval, summary = self._run_cocoeval(coco_gt, results, image_ids)
            stats = {name: float(coco_eval.stats[_STAT_INDEX[name]]) for name in STAT_NAMES}
            return CocoEvaluation(
                stats=stats,
                per_class=self._per_class(coco_gt, coco_eval, image_ids),
                results=results,
                image_ids=image_ids,
                summary=summary,
                coco_eval=coco_eval,
                backend=self.backend,
                best_threshold=f1_best_threshold(coco_eval) if self.iou_type == "bbox" else None,
            )

    def _ground_truth_coco(self, ground_truth: dict[int, Any]) -> COCO:
        """The ``COCO`` of the ground truth given image by image (annotation ids numbered from 1)."""
        images = [ground_truth[image_id][0] for image_id in sorted(ground_truth)]
        annotations = [dict(a) for image_id in sorted(ground_truth) for a in ground_truth[image_id][1]]
        for index, annotation in enumerate(annotations):
            annotation["id"] = index + 1
        category_ids = {int(c["id"]) for c in self.categories or []} | {int(a["category_id"]) for a in annotations}
        names = {int(c["id"]): c.get("name", c["id"]) for c in self.categories or []}
        coco = COCO()
        coco.dataset = {"images": images, "annotations": annotations,
                        "categories": [{"id": i, "name": names.get(i, i)} for i in sorted(category_ids)]}
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints "creating index..."
            coco.createIndex()
        return coco

    def _run_cocoeval(self, coco_gt: COCO, results: list[dict[str, Any]], image_ids: list[int]) -> tuple[Any, str]:
        """COCOeval of ``results`` (COCO results json entries) on ``image_ids``; its summary text."""
        options: dict[str, Any] = {}
        if self.backend == "faster_coco_eval":
            from faster_coco_eval import COCO as FastCOCO
            from faster_coco_eval import COCOeval_faster as COCOeval

            dataset = _box_ground_truth(coco_gt.dataset) if self.iou_type == "bbox" else copy.deepcopy(coco_gt.dataset)
            coco_gt = FastCOCO(dataset)
            result_coco_class = FastCOCO
            options["print_function"] = print  # its log lines and summary, captured below as pycocotools' prints
        else:
            from pycocotools.cocoeval import COCOeval

            result_coco_class = COCO
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):  # pycocotools prints; keep library output on logging
            # fresh dicts: loadRes adds keys to the entries it is given
            coco_dt = _load_results(coco_gt, [dict(entry) for entry in results], result_coco_class)
            coco_eval = COCOeval(coco_gt, coco_dt, iouType=self.iou_type, **options)
            coco_eval.params.imgIds = image_ids
            with _progress_bar(coco_eval, enabled=self.progress and self.backend == "pycocotools"):
                coco_eval.evaluate()
            coco_eval.accumulate()
            coco_eval.summarize()
        # pycocotools' 12 lines (faster-coco-eval adds AR at IoU 0.5 and 0.75 after them)
        summary = "\n".join([line for line in captured.getvalue().splitlines() if "Average" in line][:12])
        logger.debug("COCOeval (%s, %s) output:\n%s", self.backend, self.iou_type, captured.getvalue())
        return coco_eval, summary

    def _per_class(self, coco_gt: COCO, coco_eval: Any, image_ids: list[int]) -> list[dict[str, Any]]:
        # precision: [T iou thresholds, R recall thresholds, K categories, A area ranges, M max dets];
        # -1 marks "no ground truth" (COCOeval's own convention).
        precision = np.asarray(coco_eval.eval["precision"])
        category_ids = list(coco_eval.params.catIds)
        iou_thresholds = np.asarray(coco_eval.params.iouThrs)
        counted = set(image_ids)
        num_instances = Counter(a["category_id"] for a in coco_gt.dataset.get("annotations", [])
                                if not a.get("iscrowd", 0) and a["image_id"] in counted)
        rows = []
        for k, category_id in enumerate(category_ids):

            def mean_ap(t: slice | int) -> float:
                values = precision[t, :, k, 0, -1]
                values = values[values > -1]
                return float(values.mean()) if values.size else -1.0

            rows.append(
                {
                    "category_id": int(category_id),
                    "name": str(coco_gt.cats[category_id].get("name", category_id)),
                    "num_instances": num_instances[category_id],
                    "AP": mean_ap(slice(None)),
                    "AP50": mean_ap(int(np.argmin(np.abs(iou_thresholds - 0.5)))),
                    "AP75": mean_ap(int(np.argmin(np.abs(iou_thresholds - 0.75)))),
                }
            )
        return rows


#: The score thresholds :func:`f1_best_threshold` chooses from.
THRESHOLD_CANDIDATES: np.ndarray = np.round(np.arange(0.05, 0.951, 0.01), 2)


def f1_best_threshold(coco_eval: Any) -> float | None:
    """The detection score threshold whose detections have the best mean F1 over the classes with ground
    truth, at IoU 0.5 (all areas, 100 detections an image), from an accumulated COCOeval (no second matching):
    for a threshold, each class's recall is the highest of COCOeval's recall points that detections scoring
    at least that reach (``eval["scores"]``), its precision the interpolated precision there
    (``eval["precision"]``). Candidates 0.05 .. 0.95 in steps of 0.01; the highest of equal ones wins: the
    table shows no false positive scoring below a class's last true positive, so a lower threshold that
    gains no recall only adds boxes. None without ground truth, without the scores table, or where F1 is 0 at
    every candidate (no detection matched an object: no threshold is better than another, and the highest
    would read as a finding)."""
    if "scores" not in coco_eval.eval:
        return None
    t = int(np.argmin(np.abs(np.asarray(coco_eval.params.iouThrs) - 0.5)))
    precision = np.asarray(coco_eval.eval["precision"])[t, :, :, 0, -1]  # [R recall points, K classes]
    scores = np.asarray(coco_eval.eval["scores"])[t, :, :, 0, -1]
    recall = np.asarray(coco_eval.params.recThrs, dtype=np.float64)
    with_truth = (precision > -1).any(axis=0)
    if not with_truth.any():
        return None
    classes = np.arange(precision.shape[1])
    best, best_f1 = None, -1.0
    for candidate in THRESHOLD_CANDIDATES:
        reached = (scores >= candidate) & (precision > 0)  # [R, K]
        last = precision.shape[0] - 1 - np.argmax(reached[::-1], axis=0)  # the highest recall point reached
        hit = reached.any(axis=0)
        r = np.where(hit, recall[last], 0.0)
        p = np.where(hit, precision[last, classes], 0.0)
        f1 = np.divide(2 * p * r, p + r, out=np.zeros_like(p), where=(p + r) > 0)
        mean = float(f1[with_truth].mean())
        if mean >= best_f1 - 1e-12:
            best, best_f1 = float(candidate), max(mean, best_f1)
    return best if best_f1 > 0 else None


@contextlib.contextmanager
def _progress_bar(coco_eval: Any, *, enabled: bool) -> Iterator[None]:
    """Count pycocotools' per-(image, category) IoU and matching calls on a tqdm bar (to stderr).

    The calls are wrapped on this instance only, so the evaluation itself is pycocotools' own."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    params = coco_eval.params
    num_categories = len(params.catIds) if params.useCats else 1
    total = len(set(params.imgIds)) * num_categories * (1 + len(params.areaRng))
    bar = tqdm(total=total, desc="COCO eval", unit="pair", file=sys.stderr, leave=False)

    def counted(function: Any) -> Any:
        def call(*args: Any) -> Any:
            bar.update(1)
            return function(*args)

        return call

    coco_eval.computeIoU = counted(coco_eval.computeIoU)
    coco_eval.evaluateImg = counted(coco_eval.evaluateImg)
    try:
        yield
    finally:
        del coco_eval.computeIoU, coco_eval.evaluateImg  # back to the class's methods
        bar.close()


@contextlib.contextmanager
def garbage_collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (the collector's previous state is restored on exit): COCOeval
    makes millions of dicts, lists and tuples (one dict per detection, one list per image and category),
    each allocation burst triggers a full collection that walks all of them, and none of them forms a
    cycle; the collections took over half of a 5,000-image evaluation (docs/measurements/evaluation.md). Reference
    counting frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _box_ground_truth(dataset: dict[str, Any]) -> dict[str, Any]:
    """A copy of a COCO ground-truth dict for box evaluation: the annotations are new dicts without their
    polygons (COCOeval adds keys to them; a deep copy of COCO val's polygons would cost seconds), the
    images and categories are shared."""
    annotations = [{key: value for key, value in annotation.items() if key != "segmentation"}
                   for annotation in dataset.get("annotations", [])]
    return {"images": list(dataset.get("images", [])), "categories": list(dataset.get("categories", [])),
            "annotations": annotations}


def _load_results(coco_gt: Any, results: list[dict[str, Any]], coco_class: type) -> Any:
    """``coco_gt.loadRes(results)`` (which adds keys to ``results``' dicts), also when ``results`` is empty
    (pycocotools indexes results[0])."""
    if results:
        return coco_gt.loadRes(results)
    coco_dt = coco_class()
    coco_dt.dataset = {
        "images": list(coco_gt.dataset["images"]),
        "categories": copy.deepcopy(coco_gt.dataset["categories"]),
        "annotations": [],
    }
    coco_dt.createIndex()
    return coco_dt
