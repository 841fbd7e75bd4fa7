"""detr: end-to-end object detection with transformers (Carion et al., 2020)."""

from detr.categories import CategoryMap
from detr.checkpoints import load_checkpoint
from detr.inference.postprocess import PostProcess
from detr.loss.criterion import SetCriterion
from detr.loss.matcher import HungarianMatcher
from detr.models import DETR, DetectorOutput, DetrConfig, DETRPanoptic, build_detr, build_detr_panoptic

__all__ = ["DETR", "CategoryMap", "DETRPanoptic", "DetectorOutput", "DetrConfig", "HungarianMatcher", "PostProcess",
           "Predictor", "SetCriterion", "build_detr", "build_detr_panoptic", "load_checkpoint"]


def __getattr__(name: str):
    # The predictor pulls in the image pipeline (albumentations, OpenCV); import it only when used, so
    # `import detr` stays light for exporters and notebooks that need only the model.
    if name == "Predictor":
        from detr.inference.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'detr' has no attribute {name!r}")
