"""DETR's parts: backbone, position encodings, transformer, the composed model and its panoptic mask head."""

from detr.models.detr import DETR, MLP, build_detr
from detr.models.segmentation import DETRPanoptic, build_detr_panoptic

__all__ = ["DETR", "DETRPanoptic", "MLP", "build_detr", "build_detr_panoptic"]
