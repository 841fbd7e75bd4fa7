"""COCO evaluation of DETR detections (faster-coco-eval where installed, else pycocotools), OKS AP of keypoints and
panoptic quality."""

from detr.evaluation.coco_evaluator import (
    STAT_NAMES,
    CocoEvaluation,
    CocoEvaluator,
    detections_to_coco_results,
    format_per_class_table,
    resolve_backend,
    write_coco_results,
)
from detr.evaluation.keypoints import KeypointEvaluation, evaluate_keypoints
from detr.evaluation.panoptic import PanopticQuality, evaluate_panoptic_files, format_panoptic_table

__all__ = [
    "STAT_NAMES",
    "CocoEvaluation",
    "CocoEvaluator",
    "detections_to_coco_results",
    "format_per_class_table",
    "KeypointEvaluation",
    "evaluate_keypoints",
    "resolve_backend",
    "write_coco_results",
    "PanopticQuality",
    "evaluate_panoptic_files",
    "format_panoptic_table",
]
