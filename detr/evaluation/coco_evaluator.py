"""COCO box evaluation of post-processed DETR detections, on pycocotools (or faster-coco-eval).

Flow: :meth:`CocoEvaluator.update` after every evaluation batch (post-processed detections, pixel xyxy
in the ORIGINAL image), :meth:`CocoEvaluator.compute` once at the end. ``compute`` first gathers the
detections of every process (``torch.distributed.all_gather_object`` when a process group is
initialised) and keeps one entry per image id: the distributed sampler pads its last batch with repeated
images, and an image counted twice would bias AP. It then runs COCOeval on exactly the images that were
predicted (so a run limited to a few validation batches still gets a meaningful number) and returns
the standard statistics, a per-class AP table and the COCO results json in the data set's own category
ids.

As in the authors' evaluation (PostProcess in their models/detr.py, then datasets/coco_eval.py), every query
goes to COCOeval: no score threshold, maxDets 100.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from pycocotools.coco import COCO
from torchvision.ops import box_convert

from detr.atomic_files import write_text_atomically
from detr.categories import CategoryMap

logger = logging.getLogger(__name__)

Backend = Literal["pycocotools", "faster_coco_eval"]

#: The statistics :meth:`CocoEvaluator.compute` returns, in this order, and their index in COCOeval.stats.
STAT_NAMES: tuple[str, ...] = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100")
_STAT_INDEX: dict[str, int] = {"AP": 0, "AP50": 1, "AP75": 2, "APs": 3, "APm": 4, "APl": 5, "AR100": 8}


@dataclass
class CocoEvaluation:
    """What one evaluation produced.

    stats: ``{"AP", "AP50", "AP75", "APs", "APm", "APl", "AR100"}`` as floats in [0, 1], or -1 where
        COCOeval has no ground truth to score (e.g. no small objects), exactly as pycocotools reports.
    per_class: one dict per ground-truth category: ``category_id``, ``name``, ``num_instances``
        (non-crowd boxes in the evaluated images), ``AP``, ``AP50``, ``AP75`` (-1 without ground truth).
    results: COCO results json entries ``{"image_id", "category_id", "bbox": [x, y, w, h] pixels,
        "score"}`` in the data set's own category ids.
    image_ids: the evaluated image ids, each once, sorted.
    summary: pycocotools' 12-line summary text.
    coco_eval: the COCOeval that produced these numbers (after accumulate), for analyses that reuse its
        matches (:func:`detr.evaluation.analysis.analyze`); None without predictions. DetrSystem drops it
        once its error analysis has run, since its per-image matches are large.
    """

    stats: dict[str, float]
    per_class: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    image_ids: list[int] = field(default_factory=list)
    summary: str = ""
    coco_eval: Any = field(default=None, repr=False, compare=False)

    def per_class_table(self) -> str:
        """The per-class AP table as fixed-width text (AP in percent, "-" where no ground truth)."""
        return format_per_class_table(self.per_class)

    def stats_table(self) -> str:
        """The seven statistics as a two-line text table (percent)."""
        header = " ".join(f"{name:>7}" for name in STAT_NAMES)
        values = " ".join(f"{_percent(self.stats[name]):>7}" for name in STAT_NAMES)
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


def detections_to_coco_results(
    image_id: int,
    detection: dict[str, torch.Tensor],
    category_map: CategoryMap | None = None,
    *,
    file_name: str | None = None,
    rounded: bool = False,
) -> list[dict[str, Any]]:
    """One image's post-processed detections → COCO results json entries.

    detection: ``scores`` float [Q], ``labels`` int64 [Q] (model labels), ``boxes`` float [Q, 4] pixel
    xyxy in the original image (the output of :class:`detr.PostProcess`). Labels become category ids
    through ``category_map`` (model label == category id when it is None); boxes become COCO xywh.
    ``file_name``, when given, is added to every entry. ``rounded`` rounds boxes to 0.01 pixel and scores
    to 1e-5, which keeps a predictions file small; evaluation keeps full precision.
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
    boxes_xywh = box_convert(boxes, in_fmt="xyxy", out_fmt="xywh")
    results = []
    for category_id, box, score in zip(category_ids.tolist(), boxes_xywh.tolist(), scores.tolist()):
        entry: dict[str, Any] = {
            "image_id": int(image_id),
            "category_id": int(category_id),
            "bbox": [round(float(v), 2) if rounded else float(v) for v in box],
            "score": round(float(score), 5) if rounded else float(score),
        }
        if file_name is not None:
            entry["file_name"] = file_name
        results.append(entry)
    return results


def write_coco_results(path: str | Path, results: Sequence[dict[str, Any]]) -> Path:
    """Write COCO results json entries to ``path`` (parents created), atomically: a crash leaves the old
    file or the new one, never a part.

    Raises:
        ValueError: when a value is NaN or infinite, which JSON cannot hold (leave out the predictions of
            a model whose outputs are not finite).
    """
    return write_text_atomically(path, json.dumps(list(results), allow_nan=False))


class CocoEvaluator:
    """Accumulates detections over an evaluation epoch and scores them against COCO ground truth.

    Args:
        coco_gt: ground truth as a pycocotools ``COCO`` (crowd regions included; they are ignored by
            COCOeval as in the official evaluation), e.g. ``datamodule.val_dataset.coco``.
        category_map: maps model labels to the data set's category ids; None means the labels already
            are category ids (the raw-id convention of the released COCO checkpoints).
        backend: "pycocotools" (reference) or "faster_coco_eval" (C++ accumulate, same numbers; needs
            ``pip install faster-coco-eval``).
        progress: show a tqdm progress bar while pycocotools matches detections (a minute on COCO val).
    """

    def __init__(
        self,
        coco_gt: COCO,
        *,
        category_map: CategoryMap | None = None,
        backend: Backend = "pycocotools",
        progress: bool = False,
    ) -> None:
        if backend not in ("pycocotools", "faster_coco_eval"):
            raise ValueError(f"CocoEvaluator backend must be 'pycocotools' or 'faster_coco_eval', got {backend!r}")
        if backend == "faster_coco_eval":
            try:
                import faster_coco_eval  # noqa: F401
            except ImportError as error:  # pragma: no cover - depends on the environment
                raise ValueError(
                    "CocoEvaluator backend 'faster_coco_eval' needs the faster-coco-eval package: "
                    "pip install faster-coco-eval, or use backend='pycocotools'"
                ) from error
        self.coco_gt = coco_gt
        self.category_map = category_map
        self.backend = backend
        self.progress = progress
        self._known_image_ids = set(coco_gt.getImgIds())
        self._results: dict[int, list[dict[str, Any]]] = {}

    def reset(self) -> None:
        """Forget the accumulated detections (call at the start of every evaluation epoch)."""
        self._results = {}

    @property
    def num_images(self) -> int:
        """Images accumulated on this process so far (each id once)."""
        return len(self._results)

    def update(self, image_ids: Sequence[int] | torch.Tensor, detections: Sequence[dict[str, torch.Tensor]]) -> None:
        """Add one batch: ``image_ids[i]`` is the image of ``detections[i]`` (see detections_to_coco_results).

        An image seen again (padding of the distributed sampler) keeps its first detections.
        """
        ids = [int(i) for i in (image_ids.tolist() if isinstance(image_ids, torch.Tensor) else image_ids)]
        if len(ids) != len(detections):
            raise ValueError(f"CocoEvaluator.update got {len(ids)} image ids for {len(detections)} detection dicts")
        for image_id, detection in zip(ids, detections):
            if image_id not in self._known_image_ids:
                raise ValueError(
                    f"image id {image_id} is not in the ground-truth annotation json; evaluate with the "
                    "annotation file of the images being predicted"
                )
            if image_id not in self._results:
                self._results[image_id] = detections_to_coco_results(image_id, detection, self.category_map)

    def gather(self) -> dict[int, list[dict[str, Any]]]:
        """Detections of all processes, one entry per image id (first one wins); local when not distributed."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return dict(self._results)
        gathered: list[dict[int, list[dict[str, Any]]] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self._results)
        merged: dict[int, list[dict[str, Any]]] = {}
        for part in gathered:
            for image_id, results in (part or {}).items():
                merged.setdefault(image_id, results)
        return merged

    def compute(self) -> CocoEvaluation:
        """Gather, deduplicate and run COCOeval (bbox) on the predicted images.

        Every process must call it (it all-gathers); every process gets the same result.
        """
        per_image = self.gather()
        image_ids = sorted(per_image)
        results = [entry for image_id in image_ids for entry in per_image[image_id]]
        if not image_ids:
            logger.warning("CocoEvaluator.compute called without any predicted image; all stats are -1")
            return CocoEvaluation(stats={name: -1.0 for name in STAT_NAMES})
        coco_eval, summary = self._run_cocoeval(results, image_ids)
        stats = {name: float(coco_eval.stats[_STAT_INDEX[name]]) for name in STAT_NAMES}
        return CocoEvaluation(
            stats=stats,
            per_class=self._per_class(coco_eval, image_ids),
            results=results,
            image_ids=image_ids,
            summary=summary,
            coco_eval=coco_eval,
        )

    def _run_cocoeval(self, results: list[dict[str, Any]], image_ids: list[int]) -> tuple[Any, str]:
        if self.backend == "faster_coco_eval":
            from faster_coco_eval import COCO as FastCOCO
            from faster_coco_eval import COCOeval_faster as COCOeval

            coco_gt = FastCOCO(copy.deepcopy(self.coco_gt.dataset))
            result_coco_class = FastCOCO
        else:
            from pycocotools.cocoeval import COCOeval

            coco_gt = self.coco_gt
            result_coco_class = COCO
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):  # pycocotools prints; keep library output on logging
            coco_dt = _load_results(coco_gt, results, result_coco_class)
            coco_eval = COCOeval(coco_gt, coco_dt, iouType="bbox")
            coco_eval.params.imgIds = image_ids
            with _progress_bar(coco_eval, enabled=self.progress and self.backend == "pycocotools"):
                coco_eval.evaluate()
            coco_eval.accumulate()
            coco_eval.summarize()
        summary = "\n".join(line for line in captured.getvalue().splitlines() if "Average" in line)
        logger.debug("COCOeval (%s) output:\n%s", self.backend, captured.getvalue())
        return coco_eval, summary

    def _per_class(self, coco_eval: Any, image_ids: list[int]) -> list[dict[str, Any]]:
        # precision: [T iou thresholds, R recall thresholds, K categories, A area ranges, M max dets];
        # -1 marks "no ground truth" (COCOeval's own convention).
        precision = np.asarray(coco_eval.eval["precision"])
        category_ids = list(coco_eval.params.catIds)
        iou_thresholds = np.asarray(coco_eval.params.iouThrs)
        counted = set(image_ids)
        rows = []
        for k, category_id in enumerate(category_ids):
            annotations = self.coco_gt.loadAnns(self.coco_gt.getAnnIds(catIds=[category_id], iscrowd=False))
            num_instances = sum(1 for a in annotations if a["image_id"] in counted)

            def mean_ap(t: slice | int) -> float:
                values = precision[t, :, k, 0, -1]
                values = values[values > -1]
                return float(values.mean()) if values.size else -1.0

            rows.append(
                {
                    "category_id": int(category_id),
                    "name": str(self.coco_gt.cats[category_id].get("name", category_id)),
                    "num_instances": num_instances,
                    "AP": mean_ap(slice(None)),
                    "AP50": mean_ap(int(np.argmin(np.abs(iou_thresholds - 0.5)))),
                    "AP75": mean_ap(int(np.argmin(np.abs(iou_thresholds - 0.75)))),
                }
            )
        return rows


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


def _load_results(coco_gt: Any, results: list[dict[str, Any]], coco_class: type) -> Any:
    """``coco_gt.loadRes(results)``, also when ``results`` is empty (pycocotools indexes results[0])."""
    if results:
        return coco_gt.loadRes(copy.deepcopy(results))  # loadRes adds keys to the dicts it is given
    coco_dt = coco_class()
    coco_dt.dataset = {
        "images": list(coco_gt.dataset["images"]),
        "categories": copy.deepcopy(coco_gt.dataset["categories"]),
        "annotations": [],
    }
    coco_dt.createIndex()
    return coco_dt
