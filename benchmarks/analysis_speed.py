"""How long the error analysis takes next to the COCO evaluation it builds on.

    .venv/bin/python benchmarks/analysis_speed.py                  # 5,000 images, 100 detections each
    .venv/bin/python benchmarks/analysis_speed.py --images 500 --report /tmp/report

Makes a synthetic COCO-val-like ground truth (80 categories with COCO's ids, about 7 objects per image,
some crowd regions) and a results file with 100 detections per image: jittered copies of the objects
(some with another class, some duplicates) scored high, and boxes anywhere scored low. Times pycocotools'
COCOeval (evaluate + accumulate, what every validation runs) against :func:`detr.evaluation.analysis.analyze`
on that COCOeval, and, with --report, writing the figures and the HTML page (no image gallery: the images
do not exist).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detr.evaluation.analysis import analyze

COCO_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]


def synthetic(num_images: int, detections_per_image: int, seed: int = 0) -> tuple[dict, list[dict]]:
    """A ground-truth dict and a results list (see the module docstring)."""
    rng = np.random.default_rng(seed)
    images, annotations, results = [], [], []
    for image_id in range(1, num_images + 1):
        width, height = 640, int(rng.integers(400, 640))
        images.append({"id": image_id, "width": width, "height": height, "file_name": f"{image_id:012d}.jpg"})
        num_objects = int(rng.poisson(7))
        w = rng.uniform(8, 300, num_objects)
        h = rng.uniform(8, 300, num_objects)
        x = rng.uniform(0, width - w)
        y = rng.uniform(0, height - h)
        categories = rng.choice(COCO_IDS, num_objects)
        for j in range(num_objects):
            crowd = int(rng.random() < 0.01)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(categories[j]),
                                "bbox": [x[j], y[j], w[j], h[j]], "area": w[j] * h[j], "iscrowd": crowd})
        near = min(detections_per_image, 2 * num_objects)
        source = rng.integers(0, max(num_objects, 1), near)
        for n in range(detections_per_image):
            if n < near and num_objects:
                j = source[n]
                jitter = rng.normal(0, 0.15, 4) * [w[j], h[j], w[j], h[j]]
                box = [x[j] + jitter[0], y[j] + jitter[1], max(2.0, w[j] + jitter[2]), max(2.0, h[j] + jitter[3])]
                category = int(categories[j]) if rng.random() < 0.8 else int(rng.choice(COCO_IDS))
                score = float(rng.uniform(0.3, 1.0))
            else:
                bw, bh = rng.uniform(5, 200, 2)
                box = [float(rng.uniform(0, width - bw)), float(rng.uniform(0, height - bh)), bw, bh]
                category, score = int(rng.choice(COCO_IDS)), float(rng.uniform(0.0, 0.4))
            results.append({"image_id": image_id, "category_id": category, "bbox": [float(v) for v in box],
                            "score": score})
    categories = [{"id": c, "name": f"class{c}"} for c in COCO_IDS]
    return {"images": images, "annotations": annotations, "categories": categories}, results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--detections", type=int, default=100, help="per image")
    parser.add_argument("--report", default=None, help="also write figures and the HTML report here, timed")
    args = parser.parse_args(argv)

    dataset, results = synthetic(args.images, args.detections)
    print(f"{len(dataset['images'])} images, {len(dataset['annotations'])} objects, {len(results)} detections")
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = dataset
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(results)
        start = time.perf_counter()
        coco_eval = COCOeval(coco_gt, coco_dt, iouType="bbox")
        coco_eval.evaluate()
        coco_eval.accumulate()
        cocoeval_seconds = time.perf_counter() - start
        coco_eval.summarize()
    print(f"COCOeval evaluate + accumulate: {cocoeval_seconds:7.1f} s (AP50 {coco_eval.stats[1]:.3f})")
    start = time.perf_counter()
    analysis = analyze(coco_gt, coco_eval=coco_eval)
    analysis_seconds = time.perf_counter() - start
    print(f"analyze (per class, PR, confusion, TIDE): {analysis_seconds:7.1f} s "
          f"({analysis_seconds / cocoeval_seconds:.2f}x COCOeval)")
    print("dAP " + "  ".join(f"{k} {100 * v:.2f}" for k, v in analysis.errors.delta_ap.items()))
    if args.report:
        from detr.visualize.analysis_report import write_analysis_report

        start = time.perf_counter()
        report = write_analysis_report(analysis, args.report, images_dir=None)
        print(f"figures + HTML report (no gallery): {time.perf_counter() - start:7.1f} s -> {report}")


if __name__ == "__main__":
    main()
