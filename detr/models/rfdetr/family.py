"""RF-DETR (and LW-DETR) as a family: its config, builder and presets, one per released size
(:data:`detr.models.rfdetr.presets.RELEASES`; configs/rfdetr_base_coco.yaml)."""

from __future__ import annotations

from collections.abc import Callable

from detr.models.family import Family, register_family
from detr.models.recipe import Recipe
from detr.models.rfdetr.build import build_rfdetr
from detr.models.rfdetr.config import FLAT_NAMES, RFDETRConfig, migrate_flat
from detr.models.rfdetr.presets import RELEASES
from detr.models.rfdetr.recipe import KEYPOINT_RECIPE, RECIPE, SEGMENTATION_RECIPE


def _preset(name: str) -> Callable[[], RFDETRConfig]:
    def config() -> RFDETRConfig:
        return RELEASES[name].config

    config.__name__ = config.__qualname__ = name
    config.__doc__ = f"The released {name} (its eval square: {RELEASES[name].resolution} px)."
    return config


def recipe(config: RFDETRConfig) -> Recipe:
    """The authors' recipe; with instance masks, their segmentation recipe; with keypoints, their keypoint
    recipe."""
    if config.num_keypoints_per_class:
        return KEYPOINT_RECIPE
    return SEGMENTATION_RECIPE if config.instance_masks else RECIPE


FAMILY = register_family(Family(
    name="rfdetr", title="RF-DETR / LW-DETR", config_class=RFDETRConfig, builder=build_rfdetr,
    presets={name: _preset(name) for name in RELEASES}, recipe=recipe, augmentation="rfdetr", flat_names=FLAT_NAMES,
    migrate_flat=migrate_flat,
))
