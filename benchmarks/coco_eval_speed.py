"""How long a COCO evaluation of 5,000 images × 100 detections takes per backend, and whether the numbers agree.

    .venv/bin/python benchmarks/coco_eval_speed.py                                  # both backends, 5,000 images
    .venv/bin/python benchmarks/coco_eval_speed.py --backends faster_coco_eval --profile 15

The ground truth and detections are benchmarks/analysis_speed.py's synthetic COCO-val-like set (80 categories
with COCO's ids, about 7 objects per image, some crowd regions; 100 detections per image, jittered copies of
the objects and boxes anywhere). The detections go through :class:`detr.evaluation.CocoEvaluator` as a
validation feeds them: post-processed tensors (labels, pixel xyxy boxes, scores), a few images per ``update``;
then one ``compute`` (results loading, COCOeval evaluate + accumulate + summarize, the per-class table).
Prints the wall time of each part per backend and the CPU time of this process (what other work on a
shared machine does not change, as long as it does not evict the caches), then the largest difference of every COCOeval statistic (AP, AP50,
AP75, APs/m/l, AR1/10/100, ARs/m/l), of the precision and recall arrays and of the per-class AP from the first
backend's. ``--profile N`` prints the N functions with the most cumulative time in each ``compute``;
``--analysis`` also times the error analysis after each evaluation (:func:`detr.evaluation.analysis.analyze`,
which evaluates the results again with pycocotools after faster-coco-eval).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time

import numpy as np
import torch
from analysis_speed import synthetic
from pycocotools.coco import COCO

from detr.evaluation import CocoEvaluation, CocoEvaluator
from detr.evaluation.analysis import analyze


def detections_per_image(results: list[dict]) -> dict[int, dict[str, torch.Tensor]]:
    """COCO results entries → post-processed detections per image (labels = category ids, xyxy float32)."""
    per_image: dict[int, list[dict]] = {}
    for entry in results:
        per_image.setdefault(entry["image_id"], []).append(entry)
    detections = {}
    for image_id, entries in per_image.items():
        boxes = torch.tensor([entry["bbox"] for entry in entries], dtype=torch.float64)
        detections[image_id] = {"labels": torch.tensor([entry["category_id"] for entry in entries]),
                                "boxes": torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1).float(),
                                "scores": torch.tensor([entry["score"] for entry in entries], dtype=torch.float32)}
    return detections


def evaluate(coco_gt: COCO, detections: dict[int, dict[str, torch.Tensor]], backend: str, batch_size: int,
             profile: int) -> tuple[CocoEvaluation, str, float, float, float]:
    """One evaluation as a validation runs it; (evaluation, the backend that ran, update seconds, compute
    seconds, this process's CPU seconds for both)."""
    evaluator = CocoEvaluator(coco_gt, backend=backend)
    image_ids = list(detections)
    cpu_start = time.process_time()
    start = time.perf_counter()
    for first in range(0, len(image_ids), batch_size):
        batch = image_ids[first:first + batch_size]
        evaluator.update(batch, [detections[image_id] for image_id in batch])
    update_seconds = time.perf_counter() - start
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    evaluation = evaluator.compute()
    if profiler is not None:
        profiler.disable()
    compute_seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(profile)
        print(text.getvalue())
    return evaluation, evaluator.backend, update_seconds, compute_seconds, cpu_seconds


def largest_differences(evaluation: CocoEvaluation, reference: CocoEvaluation) -> dict[str, float]:
    """max |Δ| of the 12 statistics, the precision / recall arrays and the per-class AP, AP50, AP75."""
    a, b = evaluation.coco_eval, reference.coco_eval
    per_class = [abs(x[key] - y[key]) for x, y in zip(evaluation.per_class, reference.per_class)
                 for key in ("AP", "AP50", "AP75")]
    return {"stats": float(np.abs(np.asarray(a.stats[:12]) - np.asarray(b.stats[:12])).max()),
            "precision": float(np.abs(a.eval["precision"] - b.eval["precision"]).max()),
            "recall": float(np.abs(a.eval["recall"] - b.eval["recall"]).max()),
            "per-class AP": max(per_class)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--detections", type=int, default=100, help="per image")
    parser.add_argument("--backends", nargs="+", default=["pycocotools", "faster_coco_eval"],
                        choices=["auto", "pycocotools", "faster_coco_eval"], help="the first is the reference")
    parser.add_argument("--batch-size", type=int, default=2, help="images per update (a validation batch)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N slowest functions")
    parser.add_argument("--analysis", action="store_true", help="also time the error analysis after each backend")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    dataset, results = synthetic(args.images, args.detections)
    coco_gt = COCO()
    coco_gt.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints
        coco_gt.createIndex()
    detections = detections_per_image(results)
    print(f"{len(dataset['images'])} images, {len(dataset['annotations'])} objects, {len(results)} detections, "
          f"{args.batch_size} images per update, torch threads {args.threads}")
    print(f"{'backend':<18} {'update s':>9} {'compute s':>10} {'total s':>8} {'CPU s':>6} {'AP':>7} {'AP50':>7} "
          f"{'AR100':>7}")
    evaluations = {}
    for backend in args.backends:
        evaluation, ran, update_seconds, compute_seconds, cpu_seconds = evaluate(
            coco_gt, detections, backend, args.batch_size, args.profile)
        evaluations[backend] = evaluation
        print(f"{ran:<18} {update_seconds:9.1f} {compute_seconds:10.1f} "
              f"{update_seconds + compute_seconds:8.1f} {cpu_seconds:6.1f} {evaluation.stats['AP']:7.4f} {evaluation.stats['AP50']:7.4f} "
              f"{evaluation.stats['AR100']:7.4f}", flush=True)
        if args.analysis:
            cpu_start, start = time.process_time(), time.perf_counter()
            analysis = analyze(coco_gt, evaluation.results, coco_eval=evaluation.coco_eval,
                               image_ids=evaluation.image_ids)
            print(f"  error analysis after {ran}: {time.perf_counter() - start:.1f} s, CPU "
                  f"{time.process_time() - cpu_start:.1f} s (AP50 {analysis.stats['AP50']:.4f})", flush=True)
    reference_name, *others = args.backends
    for backend in others:
        differences = largest_differences(evaluations[backend], evaluations[reference_name])
        print(f"{backend} vs {reference_name}, max |difference|: "
              + ", ".join(f"{name} {value:.1e}" for name, value in differences.items()))


if __name__ == "__main__":
    main()
