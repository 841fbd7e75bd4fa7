"""Panoptic quality (PQ, SQ, RQ; all, things, stuff) exactly as the COCO panoptic API's ``pq_compute`` defines it
(Kirillov et al., "Panoptic Segmentation", CVPR 2019), on id maps + segments lists in COCO's panoptic format.

Per image, a predicted and a ground-truth segment of the same category match when their IoU is above 0.5
(so matches are unique); the union leaves out the predicted pixels that fall on void (unlabelled, id 0)
ground truth. Crowd ground truth (``iscrowd`` 1) never matches and is no false negative; an unmatched
prediction is no false positive when more than half of it lies on void or on crowd regions of its own
category. Per category: PQ = Σ IoU(matches) / (TP + FP/2 + FN/2), SQ = Σ IoU / TP, RQ = TP / (TP + FP/2 +
FN/2); the averages run over the categories with TP + FP + FN > 0.

torchmetrics' PanopticQuality is not used: it has no crowd handling, and it also discounts ground-truth
pixels predicted as void from the union and ignores mostly-void false negatives, which COCO's API does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detr.data.file_names import resolve_file_name

OFFSET = 256 ** 3  # ids are below 256³ (three 8-bit channels): gt · OFFSET + pred is a unique pair code
VOID = 0


@dataclass
class CategoryStat:
    iou: float = 0.0
    tp: int = 0
    fp: int = 0
    fn: int = 0


def _id_map(ids: Any) -> torch.Tensor:
    ids = ids if isinstance(ids, torch.Tensor) else torch.from_numpy(np.array(ids))
    if ids.dim() == 3 and ids.shape[-1] == 3:  # an RGB-encoded PNG
        ids = ids.long()
        ids = ids[..., 0] + 256 * ids[..., 1] + 65536 * ids[..., 2]
    if ids.dim() != 2:
        raise ValueError(f"expected an id map [H, W] or an RGB panoptic PNG [H, W, 3], got shape {tuple(ids.shape)}")
    return ids.long().cpu()


class PanopticQuality:
    """Accumulates the COCO panoptic statistics over images; :meth:`compute` gives PQ, SQ, RQ.

    Args:
        categories: the data set's categories, each with ``id`` and ``isthing`` (as in a COCO panoptic json;
            :func:`detr.categories.coco_panoptic_categories_json` for COCO).
    """

    def __init__(self, categories: Iterable[dict[str, Any]]) -> None:
        self.categories = {int(c["id"]): dict(c) for c in categories}
        if not self.categories:
            raise ValueError("PanopticQuality needs the categories (id, isthing) of the data set")
        self.stats = {category_id: CategoryStat() for category_id in self.categories}
        self.num_images = 0

    def update(self, gt_ids: Any, gt_segments: list[dict[str, Any]], pred_ids: Any,
               pred_segments: list[dict[str, Any]]) -> None:
        """Add one image.

        gt_ids, pred_ids: int id maps [H, W] (or RGB-encoded PNG arrays [H, W, 3]), 0 = void. gt_segments:
        dicts with id, category_id, iscrowd (default 0) and area (default: counted from the map);
        pred_segments: id and category_id (areas are counted from the map, as the API does).
        A segment id that is in the map but not in the list (or the reverse) raises ValueError, as do a
        category the data set lacks and a segment id listed twice.
        """
        gt_ids, pred_ids = _id_map(gt_ids), _id_map(pred_ids)
        if gt_ids.shape != pred_ids.shape:
            raise ValueError(f"ground truth and prediction sizes differ: {tuple(gt_ids.shape)} vs "
                             f"{tuple(pred_ids.shape)}")
        for what, segments in (("ground-truth", gt_segments), ("predicted", pred_segments)):
            ids = [int(s["id"]) for s in segments]
            if len(set(ids)) < len(ids):
                twice = sorted({i for i in ids if ids.count(i) > 1})
                raise ValueError(f"the {what} segments_info lists segment id(s) {twice[:5]} twice: the json is at "
                                 "fault, not the PNG (each segment needs its own id): remove the repeated entries")
        gt = {int(s["id"]): s for s in gt_segments}
        pred = {int(s["id"]): s for s in pred_segments}
        unknown = sorted({int(s["category_id"]) for s in gt.values()} - set(self.categories))
        if unknown:
            raise ValueError(f"ground-truth segments have categories {unknown}, not among the categories")
        pred_area = self._pred_areas(pred_ids, pred)
        gt_labels, gt_counts = gt_ids.unique(return_counts=True)
        gt_area = {int(s): int(s_area) for s, s_area in zip(gt_labels.tolist(), gt_counts.tolist())}

        pairs, counts = (gt_ids * OFFSET + pred_ids).unique(return_counts=True)
        overlap = {(int(p) // OFFSET, int(p) % OFFSET): int(c) for p, c in zip(pairs.tolist(), counts.tolist())}

        gt_matched, pred_matched = set(), set()
        for (gt_id, pred_id), intersection in overlap.items():
            if gt_id not in gt or pred_id not in pred or gt[gt_id].get("iscrowd", 0) == 1:
                continue
            category = int(gt[gt_id]["category_id"])
            if category != int(pred[pred_id]["category_id"]):
                continue
            area = int(gt[gt_id].get("area", gt_area.get(gt_id, 0)))
            union = pred_area[pred_id] + area - intersection - overlap.get((VOID, pred_id), 0)
            iou = intersection / union
            if iou > 0.5:
                self.stats[category].tp += 1
                self.stats[category].iou += iou
                gt_matched.add(gt_id)
                pred_matched.add(pred_id)

        crowd = {}  # category → its crowd segment id
        for gt_id, segment in gt.items():
            category = int(segment["category_id"])
            if gt_id in gt_matched:
                continue
            if segment.get("iscrowd", 0) == 1:
                crowd[category] = gt_id
                continue
            self.stats[category].fn += 1
        for pred_id, segment in pred.items():
            if pred_id in pred_matched:
                continue
            category = int(segment["category_id"])
            ignored = overlap.get((VOID, pred_id), 0)
            if category in crowd:
                ignored += overlap.get((crowd[category], pred_id), 0)
            if ignored / pred_area[pred_id] > 0.5:  # mostly on void or on crowd of its category
                continue
            self.stats[category].fp += 1
        self.num_images += 1

    def _pred_areas(self, pred_ids: torch.Tensor, pred: dict[int, dict[str, Any]]) -> dict[int, int]:
        labels, counts = pred_ids.unique(return_counts=True)
        areas = {}
        for label, count in zip(labels.tolist(), counts.tolist()):
            if label not in pred:
                if label == VOID:
                    continue
                raise ValueError(f"predicted segment id {label} is in the id map but not in the segments list")
            if int(pred[label]["category_id"]) not in self.categories:
                raise ValueError(f"predicted segment {label} has unknown category_id {pred[label]['category_id']}")
            areas[label] = count
        absent = sorted(set(pred) - set(areas))
        if absent:
            raise ValueError(f"predicted segment ids {absent} are in the segments list but not in the id map")
        return areas

    @classmethod
    def merged(cls, metrics: Iterable[PanopticQuality]) -> PanopticQuality:
        """One metric holding the summed statistics of ``metrics`` (e.g. every process's; same categories)."""
        metrics = list(metrics)
        total = cls(metrics[0].categories.values())
        for metric in metrics:
            for category_id, stat in metric.stats.items():
                summed = total.stats[category_id]
                summed.iou, summed.tp = summed.iou + stat.iou, summed.tp + stat.tp
                summed.fp, summed.fn = summed.fp + stat.fp, summed.fn + stat.fn
            total.num_images += metric.num_images
        return total

    def compute(self) -> dict[str, Any]:
        """→ {"All" | "Things" | "Stuff": {pq, sq, rq, n}, "per_class": {category_id: {pq, sq, rq}}}, values
        in [0, 1]; n = categories that have a ground-truth or predicted segment (the averaged ones)."""
        results: dict[str, Any] = {}
        per_class = {}
        for name, isthing in (("All", None), ("Things", True), ("Stuff", False)):
            totals, n = np.zeros(3), 0
            for category_id, info in self.categories.items():
                if isthing is not None and bool(info["isthing"]) != isthing:
                    continue
                stat = self.stats[category_id]
                denominator = stat.tp + 0.5 * stat.fp + 0.5 * stat.fn
                if denominator == 0:
                    per_class.setdefault(category_id, {"pq": 0.0, "sq": 0.0, "rq": 0.0})
                    continue
                pq, sq, rq = stat.iou / denominator, stat.iou / stat.tp if stat.tp else 0.0, stat.tp / denominator
                per_class[category_id] = {"pq": pq, "sq": sq, "rq": rq}
                totals += (pq, sq, rq)
                n += 1
            pq, sq, rq = totals / n if n else (0.0, 0.0, 0.0)
            results[name] = {"pq": float(pq), "sq": float(sq), "rq": float(rq), "n": n}
        results["per_class"] = per_class
        return results


def evaluate_panoptic_files(gt_json: str | Path, pred_json: str | Path, gt_folder: str | Path | None = None,
                            pred_folder: str | Path | None = None) -> dict[str, Any]:
    """PQ of a predictions json + PNG folder against COCO panoptic ground truth (the API's ``pq_compute``
    inputs; folders default to the json path without ``.json``). Categories come from the ground truth. PNG
    file names follow :mod:`detr.data.file_names` (backslashes are separators; a name outside its folder is
    refused)."""
    from PIL import Image  # pillow is a dependency; imported here so `import detr` stays light

    gt_json, pred_json = Path(gt_json), Path(pred_json)
    gt_folder = Path(gt_folder) if gt_folder else gt_json.with_suffix("")
    pred_folder = Path(pred_folder) if pred_folder else pred_json.with_suffix("")
    gt_data, pred_data = json.loads(gt_json.read_text()), json.loads(pred_json.read_text())
    predictions = {annotation["image_id"]: annotation for annotation in pred_data["annotations"]}
    metric = PanopticQuality(gt_data["categories"])
    for gt_annotation in gt_data["annotations"]:
        image_id = gt_annotation["image_id"]
        if image_id not in predictions:
            raise ValueError(f"{pred_json}: no prediction for image {image_id}")
        prediction = predictions[image_id]
        gt_png = np.asarray(Image.open(resolve_file_name(gt_folder, gt_annotation["file_name"],
                                                         annotations_file=gt_json, image_id=image_id,
                                                         what="panoptic PNG")).convert("RGB"))
        pred_png = np.asarray(Image.open(resolve_file_name(pred_folder, prediction["file_name"],
                                                           annotations_file=pred_json, image_id=image_id,
                                                           what="panoptic PNG")).convert("RGB"))
        try:
            metric.update(gt_png, gt_annotation["segments_info"], pred_png, prediction["segments_info"])
        except ValueError as error:
            raise ValueError(f"image {image_id} of '{gt_json}' and '{pred_json}': {error}") from None
    return metric.compute()


def format_panoptic_table(results: dict[str, Any]) -> str:
    """The API's summary table: PQ, SQ, RQ (in %) and N for All, Things and Stuff."""
    lines = [f"{'':10s}| {'PQ':>5s}  {'SQ':>5s}  {'RQ':>5s} {'N':>5s}", "-" * 38]
    for name in ("All", "Things", "Stuff"):
        row = results[name]
        pq, sq, rq = (100 * row[key] for key in ("pq", "sq", "rq"))
        lines.append(f"{name:10s}| {pq:5.1f}  {sq:5.1f}  {rq:5.1f} {row['n']:5d}")
    return "\n".join(lines)
