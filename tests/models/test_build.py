"""build_detr and the presets: each family's config class, its presets (named builders, detr.build) and the one
registry every lookup derives from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import detr
from detr import build_detr
from detr.models import FAMILIES
from detr.models.config import ModelConfig
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict, families, family_named, family_of, preset_config, presets

PRESETS = sorted(presets())


def _field_count(config_class: type) -> int:
    return len(dataclasses.fields(config_class))


def test_the_largest_config_class_has_at_most_30_fields():
    counts = {family.name: _field_count(family.config_class) for family in families()}
    assert max(counts.values()) <= 30, counts


def test_every_family_is_registered_once_and_found_by_its_config():
    assert [family.name for family in FAMILIES] == ["detr", "deformable", "rtdetr", "dfine", "deimv2", "rfdetr",
                                                 "grounding"]
    for family in FAMILIES:
        assert family_named(family.name) is family
        assert family_of(family.config_class()) is family
        assert family.parent is None or family_named(family.parent)
    assert family_named("deimv2").parent == "dfine" and family_named("dfine").parent == "rtdetr"
    with pytest.raises(ValueError, match="unknown model family 'yolo'"):
        family_named("yolo")


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_its_family_on_the_meta_device(name):
    with torch.device("meta"):
        model = detr.build(name, num_classes=3)
    assert isinstance(model.config, presets()[name].config_class)
    assert model.config.num_classes == 3 and model.num_classes == 3
    assert config_from_dict(model.config.to_dict()) == model.config


@pytest.mark.parametrize("name, expected", [
    ("dfine_s", {"backbone": "hgnetv2_b0", "num_decoder_layers": 3, "num_queries": 300}),
    ("dfine_x", {"backbone": "hgnetv2_b5", "encoder_hidden_dim": 384, "num_decoder_layers": 6}),
    ("rtdetr_r18vd", {"backbone": "resnet18", "num_decoder_layers": 3, "backbone_norm": "batch_norm"}),
    ("rtdetr_r50vd", {"backbone": "resnet50", "num_decoder_layers": 6}),
    ("rfdetr_base", {"backbone": "dinov2_windowed", "query_groups": 13, "num_decoder_layers": 3}),
    ("detr_r50", {"backbone": "resnet50", "num_queries": 100, "class_head": "softmax"}),
    ("detr_r101_dc5", {"backbone": "resnet101", "dilation": True}),
    ("deformable_detr", {"backbone": "resnet50", "num_queries": 300, "class_head": "sigmoid"}),
])
def test_the_presets_are_the_configs_models(name, expected):
    config = preset_config(name)
    assert {key: getattr(config, key) for key in expected} == expected


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_each_family_page_lists_its_presets(family):
    """docs/models/<family>.md names every preset of its family."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "models" / f"{family.name}.md").read_text()
    assert [name for name in family.presets if f"`{name}`" not in page] == []


def test_an_unknown_preset_names_the_presets():
    with pytest.raises(ValueError, match="unknown model preset 'dfine_q'.*dfine_s"):
        preset_config("dfine_q")


def test_the_caller_s_options_win_and_a_config_is_taken_as_it_is():
    with torch.device("meta"):
        model = build_detr(preset_config("rtdetr_r50vd", backbone="resnet18", num_decoder_layers=3, num_classes=5))
    assert (model.config.backbone, model.config.num_decoder_layers, model.config.num_encoder_layers) == \
        ("resnet18", 3, 1)
    with torch.device("meta"):
        assert build_detr(DetrConfig(pretrained_backbone=False), num_classes=5).config.num_queries == 100
        assert build_detr(num_classes=5).config == DetrConfig(num_classes=5)


def test_a_family_config_takes_only_its_own_options():
    with pytest.raises(ValueError, match="unknown model option.*max_num_bins"):
        preset_config("rtdetr_r50vd", max_num_bins=16)
    with pytest.raises(ValueError, match="unknown model option.*box_refine"):
        DetrConfig.from_dict({"box_refine": True})


def test_a_record_field_takes_a_dict_of_its_fields():
    config = preset_config("dfine_s", decoder={"max_num_bins": 16})  # the other fields kept
    assert config.decoder.max_num_bins == 16 and config.decoder.num_points_per_level == (3, 6, 3)
    with pytest.raises(ValueError, match="unknown model option.*bins"):
        preset_config("dfine_s", decoder={"bins": 16})


def test_every_config_class_is_a_model_config_with_its_family_s_name():
    for family in families():
        assert issubclass(family.config_class, ModelConfig)
        assert family.config_class.family == family.name
