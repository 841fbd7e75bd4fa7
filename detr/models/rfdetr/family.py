"""RF-DETR (and LW-DETR) as a family: its config, builder and presets (configs/rfdetr_base_coco.yaml)."""

from __future__ import annotations

from detr.models.family import Family, register_family
from detr.models.recipe import Recipe
from detr.models.rfdetr.build import build_rfdetr
from detr.models.rfdetr.config import FLAT_NAMES, RFDETRConfig, migrate_flat
from detr.models.rfdetr.recipe import RECIPE, SEGMENTATION_RECIPE


def rfdetr_base() -> RFDETRConfig:
    """RF-DETR base: DINOv2-S windowed (4 × 4 windows, patch 14), 3 decoder layers, 13 groups of 300 queries
    (configs/rfdetr_base_coco.yaml)."""
    return RFDETRConfig()


def recipe(config: RFDETRConfig) -> Recipe:
    """The authors' recipe; with instance masks, their segmentation recipe."""
    return SEGMENTATION_RECIPE if config.instance_masks else RECIPE


FAMILY = register_family(Family(
    name="rfdetr", title="RF-DETR / LW-DETR", config_class=RFDETRConfig, builder=build_rfdetr,
    presets={"rfdetr_base": rfdetr_base}, recipe=recipe, augmentation="rfdetr", flat_names=FLAT_NAMES,
    migrate_flat=migrate_flat,
))
