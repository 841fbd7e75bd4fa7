"""Sliced inference against the whole image: box AP, AP50, AP_small and seconds per image on large synthetic
canvases of small shapes, with a model trained on small images (the demo model: 128-px shapes images).

    make demo                                  # outputs/demo/checkpoints/best-*.ckpt (10 minutes on a CPU)
    python benchmarks/slicing.py --checkpoint outputs/demo/checkpoints/best-*.ckpt
    python benchmarks/slicing.py --checkpoint C --canvas 1024 --objects 40 --sizes 16 32 --slice 128 --images 8

The canvases are detr.data.shapes sets (``ShapesConfig``: ``--canvas``-px images, up to ``--objects`` shapes of
``--sizes`` px each, no empty image), written once into ``--data`` and kept. Each setting predicts every canvas
with every query kept (``all_queries``, as COCO evaluation wants) and is scored by pycocotools on the canvases'
own annotations: the whole image at the model's input size, then ``--slice`` tiles with each ``--overlaps`` and
each merge ("nms", "nmm"; with ``--drop-cut`` also NMS after dropping the detections cut by inner tile
edges). The time is the whole ``Predictor.predict`` call per image (reading the file excluded). Prints a Markdown table; docs/guides/large-images.md shows one with the command that made it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from pathlib import Path

import torch
from machine import describe_machine
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.inference.images import to_rgb_array
from detr.inference.predictor import Predictor
from detr.inference.slicing import SliceSettings


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


def run(predictor: Predictor, ground_truth: COCO, folder: Path, settings: SliceSettings | None) -> dict[str, float]:
    """Score and time one setting over every canvas."""
    results, seconds = [], 0.0
    category_ids = predictor.category_map.category_ids if predictor.category_map is not None else None
    for image in ground_truth.loadImgs(ground_truth.getImgIds()):
        array = to_rgb_array(folder / image["file_name"])
        start = time.perf_counter()
        (prediction,) = predictor.predict(array, all_queries=True, slice=settings)
        seconds += time.perf_counter() - start
        for box, score, label in zip(prediction.boxes.tolist(), prediction.scores.tolist(),
                                     prediction.labels.tolist()):
            x0, y0, x1, y1 = box
            results.append({"image_id": image["id"], "score": score, "bbox": [x0, y0, x1 - x0, y1 - y0],
                            "category_id": category_ids[label] if category_ids is not None else label})
    return {**coco_scores(ground_truth, results), "seconds": seconds / len(ground_truth.getImgIds())}


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
    parser.add_argument("--drop-cut", action="store_true", help="also NMS with drop_cut (SliceSettings.drop_cut)")
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

    settings: list[tuple[str, SliceSettings | None]] = [("whole image", None)]
    settings += [(f"slice {args.slice}, overlap {overlap:g}, {merge}", SliceSettings(args.slice, overlap=overlap,
                                                                                     merge=merge))
                 for overlap in args.overlaps for merge in args.merges]
    if args.drop_cut:
        settings += [(f"slice {args.slice}, overlap {overlap:g}, nms, drop_cut", SliceSettings(
            args.slice, overlap=overlap, drop_cut=True)) for overlap in args.overlaps]
    rows = []
    print(f"{describe_machine()}; {args.images} canvases of {args.canvas} px, up to {args.objects} shapes of "
          f"{args.sizes[0]}-{args.sizes[1]} px; {args.checkpoint} ({predictor.input_spec.resize} "
          f"{predictor.input_spec.size} px input, {predictor.model.num_queries} queries)\n")
    print("| setting | model inputs per image | AP | AP50 | AP_small | seconds per image |")
    print("|---|---|---|---|---|---|")
    for name, setting in settings:
        inputs = setting.count(args.canvas, args.canvas) if setting is not None else 1
        row = {"setting": name, "inputs": inputs, **run(predictor, ground_truth, folder, setting)}
        rows.append(row)
        print(f"| {name} | {inputs} | {row['AP']:.1f} | {row['AP50']:.1f} | {row['AP_small']:.1f} | "
              f"{row['seconds']:.2f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
