"""DETR's parts: backbone, position encodings, transformer, the composed models and the panoptic mask head; the
model families (importing this package registers each: :mod:`detr.models.family`)."""

from detr.models import detr_family
from detr.models.anchor.model import AnchorDETR
from detr.models.build import build, build_detr
from detr.models.config import ModelConfig
from detr.models.deformable import family as deformable_family
from detr.models.deimv2 import family as deimv2_family
from detr.models.detector import Detector
from detr.models.detr import DETR
from detr.models.detr_family import DetrConfig
from detr.models.dfine import family as dfine_family
from detr.models.family import Family, config_from_dict, families, family_named, family_of, register_family
from detr.models.grounding import family as grounding_family
from detr.models.layers.mlp import MLP
from detr.models.outputs import DetectorOutput, LayerOutput
from detr.models.rfdetr import family as rfdetr_family
from detr.models.rtdetr import family as rtdetr_family
from detr.models.segmentation import DETRPanoptic, build_detr_panoptic
from detr.models.single_scale import SingleScaleDetector

#: The package's own families, in the order ``detr --help`` lists them.
FAMILIES = (detr_family.FAMILY, deformable_family.FAMILY, rtdetr_family.FAMILY, dfine_family.FAMILY,
            deimv2_family.FAMILY, rfdetr_family.FAMILY, grounding_family.FAMILY)

__all__ = ["DETR", "FAMILIES", "AnchorDETR", "Detector", "DetectorOutput", "DETRPanoptic", "DetrConfig", "Family",
           "LayerOutput", "MLP", "ModelConfig", "SingleScaleDetector", "build", "build_detr", "build_detr_panoptic",
           "config_from_dict", "families", "family_named", "family_of", "register_family"]
