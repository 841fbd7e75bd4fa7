"""RF-DETR (and LW-DETR) as a family: its config, builder and presets (configs/rfdetr_base_coco.yaml)."""

from __future__ import annotations

from detr.models.family import Family, register_family
from detr.models.recipe import Recipe
from detr.models.rfdetr.build import build_rfdetr
from detr.models.rfdetr.config import FLAT_NAMES, RFDETRConfig, WindowedViTSize, migrate_flat
from detr.models.rfdetr.recipe import KEYPOINT_RECIPE, RECIPE, SEGMENTATION_RECIPE


def rfdetr_base() -> RFDETRConfig:
    """RF-DETR base: DINOv2-S windowed (4 × 4 windows, patch 14), 3 decoder layers, 13 groups of 300 queries
    (configs/rfdetr_base_coco.yaml)."""
    return RFDETRConfig()


def rfdetr_keypoint_preview() -> RFDETRConfig:
    """The rfdetr package's ``RFDETRKeypointPreview``: RF-DETR base with the ViT's stages 3, 6, 9, 12, 2 × 2
    windows, patch 12 and a 576-pixel position table, 4 decoder layers of 100 queries, COCO's 91 labels with the
    persons' 17 keypoints (GroupPose) and the keypoints' own projector."""
    return RFDETRConfig(vit=WindowedViTSize(out_indices=(3, 6, 9, 12), num_windows=2, patch_size=12,
                                            position_size=576),
                        num_decoder_layers=4, num_queries=100, num_classes=91, num_keypoints_per_class=(0, 17),
                        keypoint_projector=True)


def recipe(config: RFDETRConfig) -> Recipe:
    """The authors' recipe; with instance masks, their segmentation recipe; with keypoints, their keypoint
    recipe."""
    if config.num_keypoints_per_class:
        return KEYPOINT_RECIPE
    return SEGMENTATION_RECIPE if config.instance_masks else RECIPE


FAMILY = register_family(Family(
    name="rfdetr", title="RF-DETR / LW-DETR", config_class=RFDETRConfig, builder=build_rfdetr,
    presets={"rfdetr_base": rfdetr_base, "rfdetr_keypoint_preview": rfdetr_keypoint_preview}, recipe=recipe,
    augmentation="rfdetr", flat_names=FLAT_NAMES, migrate_flat=migrate_flat,
))
