"""DETR's parts: backbone, position encodings, transformer, the composed models and the panoptic mask head."""

from detr.models.detr import DETR, MLP, build_detr
from detr.models.anchor_detr import AnchorDETR
from detr.models.config import DetrConfig
from detr.models.segmentation import DETRPanoptic, build_detr_panoptic

__all__ = ["DETR", "AnchorDETR", "DETRPanoptic", "DetrConfig", "MLP", "build_detr", "build_detr_panoptic"]
