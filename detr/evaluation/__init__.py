"""COCO evaluation of DETR detections (pycocotools, optionally faster-coco-eval)."""

from detr.evaluation.coco_evaluator import (
    STAT_NAMES,
    CocoEvaluation,
    CocoEvaluator,
    detections_to_coco_results,
    format_per_class_table,
)

__all__ = [
    "STAT_NAMES",
    "CocoEvaluation",
    "CocoEvaluator",
    "detections_to_coco_results",
    "format_per_class_table",
]
