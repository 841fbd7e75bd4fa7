"""build_detr with options only: each family's defaults where the caller leaves a field unset."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.models.detr_family import DetrConfig


@pytest.mark.parametrize("architecture", [name for name in ARCHITECTURE_DEFAULTS if name != "detr"])
def test_build_detr_with_only_the_architecture_builds_the_family_default(architecture):
    # DetrConfig's defaults are DETR's: RT-DETR, D-FINE and RF-DETR refused them one at a time
    with torch.device("meta"):
        model = build_detr(architecture=architecture, pretrained_backbone=False)
    config = model.config
    assert config.family == architecture and config.class_head == "sigmoid"
    assert all(getattr(config, name) == value for name, value in ARCHITECTURE_DEFAULTS[architecture].items())


@pytest.mark.parametrize("architecture, backbone, queries", [
    ("rtdetr", "resnet50", 300), ("dfine", "hgnetv2_b0", 300), ("rfdetr", "dinov2_windowed", 300),
    ("deformable", "resnet50", 300), ("detr", "resnet50", 100)])
def test_the_defaults_are_the_authors_coco_models(architecture, backbone, queries):
    with torch.device("meta"):
        config = build_detr(architecture=architecture, pretrained_backbone=False).config
    assert (config.backbone, config.num_queries, config.num_classes) == (backbone, queries, 91)


def test_the_caller_s_options_win_and_a_config_is_taken_as_it_is():
    with torch.device("meta"):
        model = build_detr(architecture="rtdetr", backbone="resnet18", num_decoder_layers=3, num_classes=5,
                           pretrained_backbone=False)
    assert (model.config.backbone, model.config.num_decoder_layers, model.config.num_encoder_layers) == \
        ("resnet18", 3, 1)
    with torch.device("meta"):
        assert build_detr(DetrConfig(pretrained_backbone=False), num_classes=5).config.num_queries == 100
