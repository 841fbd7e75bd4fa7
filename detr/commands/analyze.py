"""Why does a detector fail? Error analysis of a COCO results json against its ground truth.

    detr-analyze data/coco-mini/annotations/instances_val2017.json outputs/pred/predictions.json \
        --images data/coco-mini/val2017 --out outputs/analysis

Works on any COCO results json (this project's, with or without file_name, or another detector's). Writes
OUT/report.html (self-contained: summary AP, TIDE error breakdown, PR curves, per-class table, confusion
matrix, worst cases), OUT/analysis.json and the figures as PNG, and prints the error breakdown.
"""

from __future__ import annotations

import argparse
import logging
import sys

from detr.inference.command_line import NumberRange, probability


class CocoIou(NumberRange):
    """argparse ``type`` of ``--iou``: one of the IoU thresholds COCOeval evaluates (0.5, 0.55, ..., 0.95)."""

    def __init__(self) -> None:
        super().__init__(float, 0.5, 0.95)

    def __call__(self, value: str) -> float:
        number = super().__call__(value)
        if abs(number * 20 - round(number * 20)) > 1e-6:
            raise argparse.ArgumentTypeError(f"{value} is not one of COCO's IoU thresholds 0.5, 0.55, ..., 0.95")
        return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ground_truth", metavar="GT_JSON", help="COCO annotation json")
    parser.add_argument("predictions", metavar="PREDICTIONS_JSON", help="COCO results json")
    parser.add_argument("--images", default=None, help="folder of the ground truth's file_names (worst-case crops)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--score-threshold", type=probability, default=0.5, help="confusion matrix score threshold")
    parser.add_argument("--iou", type=CocoIou(), default=0.5, help="confusion matrix IoU (one of 0.5:0.05:0.95)")
    parser.add_argument("--predicted-images-only", action="store_true",
                        help="score only images with a detection (default: every image of the ground truth)")
    args = parser.parse_args(argv)
    from detr.evaluation.analysis import ResultsFileError, analyze, load_ground_truth, load_results  # after --help
    from detr.visualize.analysis_report import write_analysis_report

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    try:
        coco_gt = load_ground_truth(args.ground_truth)
        results = load_results(args.predictions, coco_gt)
    except ResultsFileError as error:
        parser.error(str(error))
    if not results:  # a report of zeros would read as a detector that found nothing, not as no input
        print(f"error: {args.predictions} holds no detections of the ground truth's categories: nothing to "
              f"analyse (predict with a lower --threshold, or check that the results match {args.ground_truth})",
              file=sys.stderr)
        return 1
    image_ids = sorted({r["image_id"] for r in results}) if args.predicted_images_only else None
    analysis = analyze(coco_gt, results, image_ids=image_ids, score_threshold=args.score_threshold,
                       confusion_iou=args.iou)
    print(analysis.summary_text())
    page = write_analysis_report(analysis, args.out, images_dir=args.images,
                                 title=f"Error analysis: {args.predictions}")
    print(f"report: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
