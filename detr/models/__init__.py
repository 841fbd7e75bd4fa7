"""DETR's parts: backbone, position encodings, transformer, the composed models and the panoptic mask head."""

from detr.models.anchor.model import AnchorDETR
from detr.models.build import build_detr
from detr.models.config import DetrConfig
from detr.models.detector import Detector
from detr.models.detr import DETR
from detr.models.layers.mlp import MLP
from detr.models.outputs import DetectorOutput, LayerOutput
from detr.models.segmentation import DETRPanoptic, build_detr_panoptic
from detr.models.single_scale import SingleScaleDetector

__all__ = ["DETR", "AnchorDETR", "Detector", "DetectorOutput", "DETRPanoptic", "DetrConfig", "LayerOutput", "MLP",
           "SingleScaleDetector", "build_detr", "build_detr_panoptic"]
