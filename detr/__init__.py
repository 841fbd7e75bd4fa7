"""detr: end-to-end object detection with transformers (Carion et al., 2020)."""

from detr.categories import CategoryMap
from detr.checkpoints import load_checkpoint
from detr.criterion import SetCriterion
from detr.matcher import HungarianMatcher
from detr.models import DETR, build_detr
from detr.postprocess import PostProcess

__all__ = ["DETR", "CategoryMap", "HungarianMatcher", "PostProcess", "SetCriterion", "build_detr",
           "load_checkpoint"]
