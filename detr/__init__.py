"""detr: end-to-end object detection with transformers (Carion et al., 2020)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detr.categories import CategoryMap
    from detr.checkpoints import load_checkpoint
    from detr.inference.postprocess import PostProcess
    from detr.inference.predictor import Predictor
    from detr.loss.criterion import SetCriterion
    from detr.loss.matcher import HungarianMatcher
    from detr.models import (
        DETR,
        DetectorOutput,
        DetrConfig,
        DETRPanoptic,
        ModelConfig,
        build,
        build_detr,
        build_detr_panoptic,
        config_from_dict,
    )

__all__ = ["DETR", "CategoryMap", "DETRPanoptic", "DetectorOutput", "DetrConfig", "HungarianMatcher", "ModelConfig",
           "PostProcess", "Predictor", "SetCriterion", "build", "build_detr", "build_detr_panoptic", "config_from_dict",
           "load_checkpoint"]

# Each public name is imported on first use (PEP 562), so that importing a submodule (`detr.commands.predict`,
# whose --help needs no model) does not wait for torch; the Predictor also pulls in the image pipeline.
_MODULE_OF = {
    "CategoryMap": "detr.categories", "load_checkpoint": "detr.checkpoints",
    "PostProcess": "detr.inference.postprocess", "Predictor": "detr.inference.predictor",
    "SetCriterion": "detr.loss.criterion", "HungarianMatcher": "detr.loss.matcher",
    "DETR": "detr.models", "DetectorOutput": "detr.models", "DetrConfig": "detr.models", "DETRPanoptic": "detr.models",
    "build_detr": "detr.models", "build_detr_panoptic": "detr.models", "build": "detr.models",
    "ModelConfig": "detr.models", "config_from_dict": "detr.models",
}


def lazy_exports(package: str, module_of: dict[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports each public name from the module
    ``module_of`` names for it on first use; the next access is a plain attribute."""

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__getattr__ = lazy_exports(__name__, _MODULE_OF)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
