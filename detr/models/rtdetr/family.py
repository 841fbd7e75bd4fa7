"""RT-DETR as a family: its config, builder and presets (configs/rtdetr_*_coco.yaml)."""

from __future__ import annotations

from detr.models.family import Family, register_family
from detr.models.rtdetr.recipe import RECIPE
from detr.models.rtdetr.build import build_rtdetr
from detr.models.rtdetr.config import RTDETRConfig


def rtdetr_r18vd() -> RTDETRConfig:
    """R18vd: trained BatchNorms, 3 decoder layers (configs/rtdetr_r18vd_coco.yaml)."""
    return RTDETRConfig(backbone="resnet18", backbone_norm="batch_norm", num_decoder_layers=3)


def rtdetr_r50vd() -> RTDETRConfig:
    """R50vd, the standard size (configs/rtdetr_r50vd_coco.yaml)."""
    return RTDETRConfig(backbone="resnet50")


def rtdetr_r101vd() -> RTDETRConfig:
    """R101vd: a 384-wide hybrid encoder with 2048-wide AIFI feed-forward networks (the authors' R101)."""
    return RTDETRConfig(backbone="resnet101", encoder_hidden_dim=384, encoder_dim_feedforward=2048)


FAMILY = register_family(Family(
    name="rtdetr", title="RT-DETR", config_class=RTDETRConfig, builder=build_rtdetr,
    presets={"rtdetr_r18vd": rtdetr_r18vd, "rtdetr_r50vd": rtdetr_r50vd, "rtdetr_r101vd": rtdetr_r101vd},
    augmentation="rtdetr", real_time=True, recipe=RECIPE,
))
