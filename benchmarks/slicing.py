"""Sliced inference against the whole image and against sahi: box AP, AP50, AP_small and seconds per image on
large synthetic canvases of small shapes, with a model trained on small images (the demo model: 128-px shapes
images). docs/measurements/slicing.md shows the table, the command that made it and what it chose.

    make demo                                  # outputs/demo/checkpoints/best-*.ckpt (10 minutes on a CPU)
    python benchmarks/slicing.py --checkpoint outputs/demo/checkpoints/best-*.ckpt
    python benchmarks/slicing.py --checkpoint C --canvas 1024 --objects 40 --sizes 16 32 --slice 128 --images 8

The canvases are detr.data.shapes sets (``ShapesConfig``: ``--canvas``-px images, up to ``--objects`` shapes of
``--sizes`` px each, no empty image), written once into ``--data`` and kept. Every setting predicts every canvas
and is scored by pycocotools on the canvases' own annotations, once per ``--thresholds`` entry: "all" keeps every
query (as COCO evaluation wants), "default" is the checkpoint's own score threshold (what ``detr-predict`` keeps),
a number is that score threshold. The settings:

- the whole image at the model's input size;
- ``--slice`` tiles at each ``--overlaps``, for each merge ("nms", "nmm"), with and without the whole-image pass
  and with and without ``drop_cut`` (the rule that drops detections cut by an inner tile edge);
- sahi's own slicing (``sahi.predict.get_sliced_prediction``, its standard pass on) of the same Predictor, through
  :class:`SahiDetector`, with sahi's default merge (GREEDYNMM over intersection over the smaller box) and with
  its NMS over IoU, at the same tiles and threshold (``--no-sahi`` leaves it out; sahi is a test-only
  dependency: ``pip install sahi``).

The time is the whole prediction call per image (reading the file excluded). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from machine import describe_machine
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from sahi.models.base import DetectionModel
from sahi.prediction import ObjectPrediction
from sahi.predict import get_sliced_prediction
from sahi.slicing import get_slice_bboxes

from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.inference.images import to_rgb_array
from detr.inference.predictor import Predictor
from detr.inference.slicing import SliceSettings

#: One image's detections: (pixel xyxy boxes, scores, model labels).
Detections = tuple[list[list[float]], list[float], list[int]]


def coco_scores(ground_truth: COCO, results: list[dict]) -> dict[str, float]:
    """AP, AP50 and AP_small (COCO's ``stats`` 0, 1 and 3) of ``results`` on ``ground_truth``, in points."""
    if not results:
        return {"AP": 0.0, "AP50": 0.0, "AP_small": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(ground_truth, ground_truth.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    stats = evaluation.stats
    return {"AP": 100 * stats[0], "AP50": 100 * stats[1], "AP_small": 100 * max(stats[3], 0.0)}


def run(predictor: Predictor, ground_truth: COCO, folder: Path,
        predict: Callable[[np.ndarray], Detections]) -> dict[str, float]:
    """Score and time one setting (``predict``: an RGB canvas to its detections) over every canvas."""
    results, seconds = [], 0.0
    category_ids = predictor.category_map.category_ids if predictor.category_map is not None else None
    for image in ground_truth.loadImgs(ground_truth.getImgIds()):
        array = to_rgb_array(folder / image["file_name"])
        start = time.perf_counter()
        boxes, scores, labels = predict(array)
        seconds += time.perf_counter() - start
        for (x0, y0, x1, y1), score, label in zip(boxes, scores, labels):
            results.append({"image_id": image["id"], "score": score, "bbox": [x0, y0, x1 - x0, y1 - y0],
                            "category_id": category_ids[label] if category_ids is not None else label})
    return {**coco_scores(ground_truth, results), "seconds": seconds / len(ground_truth.getImgIds())}


def detr_setting(predictor: Predictor, settings: SliceSettings | None,
                 threshold: float | None) -> Callable[[np.ndarray], Detections]:
    """This project's prediction of a canvas: the whole image (``settings`` None) or sliced; ``threshold`` None
    keeps every query."""
    def predict(array: np.ndarray) -> Detections:
        (prediction,) = predictor.predict(array, all_queries=threshold is None, threshold=threshold, slice=settings)
        return prediction.boxes.tolist(), prediction.scores.tolist(), prediction.labels.tolist()

    return predict


def sahi_setting(predictor: Predictor, size: int, overlap: float, threshold: float | None, merge: str,
                 batch_size: int) -> Callable[[np.ndarray], Detections]:
    """sahi's slicing of the same predictor: ``merge`` "GREEDYNMM" (sahi's default: intersection over the
    smaller box) or "NMS" (IoU), threshold 0.5, class-wise, the standard (whole-image) pass on."""
    model = SahiDetector(predictor, threshold)
    metric = "IOS" if merge == "GREEDYNMM" else "IOU"

    def predict(array: np.ndarray) -> Detections:
        result = get_sliced_prediction(array, model, slice_height=size, slice_width=size,
                                       overlap_height_ratio=overlap, overlap_width_ratio=overlap,
                                       perform_standard_pred=True, postprocess_type=merge,
                                       postprocess_match_metric=metric, postprocess_match_threshold=0.5,
                                       verbose=0, batch_size=batch_size, force_postprocess_type=True)
        found = result.object_prediction_list
        return ([list(map(float, p.bbox.to_xyxy())) for p in found], [float(p.score.value) for p in found],
                [int(p.category.id) for p in found])

    return predict


class SahiDetector(DetectionModel):
    """A :class:`Predictor` as a sahi detection model (sahi does not know this project's models): every tile goes
    through ``Predictor.predict_arrays``, in sahi's batches; labels are the model's label indices. ``threshold``
    None keeps every query."""

    def __init__(self, predictor: Predictor, threshold: float | None) -> None:
        self.threshold = threshold
        super().__init__(model=predictor, device="cpu", confidence_threshold=threshold or 0.0)

    def set_model(self, model: Predictor, **kwargs) -> None:
        self.model = model

    def perform_inference(self, image: np.ndarray) -> None:
        self.perform_batch_inference([image])

    def perform_batch_inference(self, images: list[np.ndarray]) -> None:
        self._original_predictions = self.model.predict_arrays([np.ascontiguousarray(image) for image in images],
                                                               threshold=self.threshold)

    def _create_object_prediction_list_from_original_predictions(self, shift_amount_list=((0, 0),),
                                                                 full_shape_list=None) -> None:
        # sahi passes one [x, y] shift and one [height, width] for a single image, lists of them for a batch
        if shift_amount_list and isinstance(shift_amount_list[0], (int, float)):
            shift_amount_list = [shift_amount_list]
        if full_shape_list and isinstance(full_shape_list[0], (int, float)):
            full_shape_list = [full_shape_list]
        per_image = []
        for index, prediction in enumerate(self._original_predictions):
            shift = list(shift_amount_list[index]) if shift_amount_list else [0, 0]
            full_shape = list(full_shape_list[index]) if full_shape_list else None
            per_image.append([
                ObjectPrediction(bbox=box, category_id=label, category_name=name, score=score, shift_amount=shift,
                                 full_shape=full_shape)
                for box, score, label, name in zip(prediction.boxes.tolist(), prediction.scores.tolist(),
                                                   prediction.labels.tolist(), prediction.label_names)
                if box[2] > box[0] and box[3] > box[1]])  # sahi refuses an empty box
        self._object_prediction_list_per_image = per_image


def parse_threshold(value: str, predictor: Predictor) -> float | None:
    """"all" → None (every query), "default" → the predictor's threshold, else the number."""
    return None if value == "all" else predictor.threshold if value == "default" else float(value)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a model trained on small images (the demo model)")
    parser.add_argument("--data", default="outputs/slicing_canvases", help="where the canvases are written (kept)")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--canvas", type=int, default=1024, help="canvas side, pixels")
    parser.add_argument("--objects", type=int, default=40, help="most shapes per canvas")
    parser.add_argument("--sizes", type=int, nargs=2, default=(16, 32), help="shape diameters, pixels")
    parser.add_argument("--slice", type=int, default=128, help="tile side, pixels (the demo model's input: 128)")
    parser.add_argument("--overlaps", type=float, nargs="+", default=(0.2,))
    parser.add_argument("--merges", nargs="+", default=("nms", "nmm"), choices=("nms", "nmm"))
    parser.add_argument("--thresholds", nargs="+", default=("all", "default"),
                        help='"all" (every query), "default" (the checkpoint\'s) or a score threshold')
    parser.add_argument("--no-sahi", action="store_true", help="leave out sahi's slicing")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    config = ShapesConfig(num_train=0, num_val=args.images, image_size=args.canvas, max_objects=args.objects,
                          empty_fraction=0.0, min_object_size=args.sizes[0], max_object_size=args.sizes[1], seed=60)
    write_shapes_dataset(args.data, config)
    folder = Path(args.data) / "val2017"
    with contextlib.redirect_stdout(io.StringIO()):
        ground_truth = COCO(str(Path(args.data) / "annotations" / "instances_val2017.json"))
    predictor = Predictor.from_checkpoint(args.checkpoint, device="cpu", batch_size=args.batch_size)

    print(f"{describe_machine()}\n{args.images} canvases of {args.canvas} px, up to {args.objects} shapes of "
          f"{args.sizes[0]}-{args.sizes[1]} px; {args.checkpoint} ({predictor.input_spec.resize} "
          f"{predictor.input_spec.size} px input, {predictor.model.num_queries} queries, score threshold "
          f"{predictor.threshold:g})\n")
    print("| threshold | setting | model inputs per image | AP | AP50 | AP_small | seconds per image |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for threshold_name in args.thresholds:
        threshold = parse_threshold(threshold_name, predictor)
        shown = "every query" if threshold is None else f"{threshold:g}"
        settings: list[tuple[str, int, Callable[[np.ndarray], Detections]]] = [
            ("whole image", 1, detr_setting(predictor, None, threshold))]
        for overlap in args.overlaps:
            for merge in args.merges:
                for whole_image in (True, False):
                    for drop_cut in (False, True):
                        setting = SliceSettings(args.slice, overlap=overlap, merge=merge, whole_image=whole_image,
                                                drop_cut=drop_cut)
                        name = (f"slice {args.slice}, overlap {overlap:g}, {merge}"
                                f"{', whole image' if whole_image else ''}{', drop_cut' if drop_cut else ''}")
                        settings.append((name, setting.count(args.canvas, args.canvas),
                                         detr_setting(predictor, setting, threshold)))
            if not args.no_sahi:
                inputs = len(get_slice_bboxes(args.canvas, args.canvas, args.slice, args.slice, False, overlap,
                                              overlap)) + 1  # its tiles and its standard pass
                for merge in ("GREEDYNMM", "NMS"):
                    settings.append((f"sahi, slice {args.slice}, overlap {overlap:g}, {merge}, whole image", inputs,
                                     sahi_setting(predictor, args.slice, overlap, threshold, merge,
                                                  args.batch_size)))
        for name, inputs, predict in settings:
            row = {"threshold": shown, "setting": name, "inputs": inputs,
                   **run(predictor, ground_truth, folder, predict)}
            rows.append(row)
            print(f"| {shown} | {name} | {inputs} | {row['AP']:.1f} | {row['AP50']:.1f} | {row['AP_small']:.1f} | "
                  f"{row['seconds']:.2f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
