"""Deformable DETR as a family: its config, builder and presets (configs/deformable_detr_coco.yaml)."""

from __future__ import annotations

from detr.models.deformable.build import build_deformable_detr
from detr.models.deformable.config import DeformableConfig
from detr.models.family import Family, register_family
from detr.models.deformable.recipe import RECIPE


def deformable_detr() -> DeformableConfig:
    """The authors' single-scale-query model (R50, 4 levels; configs/deformable_detr_coco.yaml)."""
    return DeformableConfig()


def deformable_detr_box_refine() -> DeformableConfig:
    """With iterative box refinement (configs/deformable_detr_coco.yaml's ``--model.detr.box_refine=true``)."""
    return DeformableConfig(box_refine=True)


def deformable_detr_two_stage() -> DeformableConfig:
    """With box refinement and two-stage queries (the authors' best)."""
    return DeformableConfig(box_refine=True, two_stage=True)


FAMILY = register_family(Family(
    name="deformable", title="Deformable DETR", config_class=DeformableConfig, builder=build_deformable_detr,
    presets={"deformable_detr": deformable_detr, "deformable_detr_box_refine": deformable_detr_box_refine,
             "deformable_detr_two_stage": deformable_detr_two_stage},
    augmentation="default", recipe=RECIPE,
))
