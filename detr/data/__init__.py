"""Data: image decoding, the COCO data set (and YOLO and Pascal VOC read as COCO), the authors' transforms, batching,
synthetic shapes, checks.

Flow: image file → :mod:`~detr.data.images` (RGB uint8, EXIF applied) → :class:`~detr.data.coco.CocoDetection`
(pixel xyxy boxes, labels) → :mod:`~detr.data.transforms` (albumentations) →
:func:`~detr.data.collate.collate_detection` (padded batch + mask, normalised cxcywh boxes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from detr import lazy_exports

if TYPE_CHECKING:
    from detr.data.checker import Problem, check_dataset, format_problems
    from detr.data.coco import (
        AnnotationFileError,
        CocoDetection,
        ImageSizeMismatchError,
        category_map_from_categories,
        load_coco_json,
    )
    from detr.data.coco_panoptic import CocoPanoptic
    from detr.data.collate import collate_detection, pad_images
    from detr.data.formats import detect_format, read_split
    from detr.data.images import ImageFilesDataset, ImageLoadError, decode_image, load_rgb_image
    from detr.data.shapes import SHAPE_NAMES, ShapesConfig, write_shapes_dataset
    from detr.data.shapes_panoptic import write_shapes_panoptic
    from detr.data.transforms import make_eval_transform, make_normalize_transform, make_train_transform, resize_shape

__all__ = [
    "SHAPE_NAMES",
    "AnnotationFileError",
    "CocoDetection",
    "CocoPanoptic",
    "ImageFilesDataset",
    "ImageLoadError",
    "ImageSizeMismatchError",
    "Problem",
    "ShapesConfig",
    "category_map_from_categories",
    "check_dataset",
    "collate_detection",
    "decode_image",
    "detect_format",
    "format_problems",
    "load_coco_json",
    "load_rgb_image",
    "make_eval_transform",
    "make_normalize_transform",
    "make_train_transform",
    "pad_images",
    "read_split",
    "resize_shape",
    "write_shapes_dataset",
    "write_shapes_panoptic",
]

# Imported on first use (PEP 562): a module that needs one generator (detr-make-shapes: detr.data.shapes, numpy
# and PIL) does not load the training pipeline (albumentations, OpenCV, torch) with it.
_MODULE_OF = {
    "AnnotationFileError": "detr.data.coco",
    "CocoDetection": "detr.data.coco",
    "CocoPanoptic": "detr.data.coco_panoptic",
    "ImageFilesDataset": "detr.data.images",
    "ImageLoadError": "detr.data.images",
    "ImageSizeMismatchError": "detr.data.coco",
    "Problem": "detr.data.checker",
    "SHAPE_NAMES": "detr.data.shapes",
    "ShapesConfig": "detr.data.shapes",
    "category_map_from_categories": "detr.data.coco",
    "check_dataset": "detr.data.checker",
    "collate_detection": "detr.data.collate",
    "decode_image": "detr.data.images",
    "detect_format": "detr.data.formats",
    "format_problems": "detr.data.checker",
    "load_coco_json": "detr.data.coco",
    "load_rgb_image": "detr.data.images",
    "make_eval_transform": "detr.data.transforms",
    "make_normalize_transform": "detr.data.transforms",
    "make_train_transform": "detr.data.transforms",
    "pad_images": "detr.data.collate",
    "read_split": "detr.data.formats",
    "resize_shape": "detr.data.transforms",
    "write_shapes_dataset": "detr.data.shapes",
    "write_shapes_panoptic": "detr.data.shapes_panoptic",
}


__getattr__ = lazy_exports(__name__, _MODULE_OF)
