"""The optimizer's parameter groups (detr/lightning/param_groups.py), made in the training layer from the model's
declarative hooks: the same groups, rates and weight decays for every family as when the model base class made them
(the table below: written by Detector.parameter_groups at the commit before they moved)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from detr import build_detr
from detr.lightning.param_groups import parameter_groups
from tests.helpers import TINY, tiny_config_with
from tests.helpers_realtime import CONFIGS

FAMILIES = {
    "detr": TINY,
    "anchor": TINY.replace(query_type="anchor", denoising=True, dense_aux_head=True, class_head="sigmoid"),
    "deformable": tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2, num_feature_levels=2),
    **CONFIGS,
}
#: family → groups as (name, parameter count, hash of the parameters' names in order, lr, weight_decay or None), at
#: lr 1e-4, lr_backbone 1e-5 and (RF-DETR) layer decay 0.8, component decay 0.7.
BEFORE = {
    "detr": [
        ('transformer', 61, '498227ed5dee', 0.0001, None),
        ('backbone', 15, '3dd5b46dd6ad', 1e-05, None),
    ],
    "anchor": [
        ('transformer', 116, 'a0006ca48e5a', 0.0001, None),
        ('backbone', 15, '3dd5b46dd6ad', 1e-05, None),
    ],
    "deformable": [
        ('transformer', 72, '7c793fcb28ee', 0.0001, None),
        ('sampling_offsets', 8, '23347dc84a63', 1e-05, None),
        ('backbone', 15, '3dd5b46dd6ad', 1e-05, None),
    ],
    "rtdetr": [
        ('transformer', 152, '5f5d81364f05', 0.0001, None),
        ('norms', 122, 'dcae1adbcb1e', 0.0001, 0.0),
        ('backbone', 23, '7612b8f9ad3f', 1e-05, None),
    ],
    "dfine": [
        ('transformer', 177, 'cd7912be4e40', 0.0001, None),
        ('norms', 152, '9c3a8b8f722d', 0.0001, 0.0),
        ('backbone', 102, '66fc7a21022b', 1e-05, None),
    ],
    "deimv2": [
        ('transformer', 195, 'ecabc38f62c8', 0.0001, None),
        ('norms', 108, '6e5d003a909e', 0.0001, 0.0),
        ('backbone', 48, '2f4b8456ed90', 1e-05, None),
    ],
    "rfdetr": [
        ('transformer', 59, '0e3c395858ec', 0.0001, None),
        ('decoder', 50, '62cdb86710be', 7e-05, None),
        ('backbone.depth0.no_decay', 2, 'ba7adf8d5f0a', 4.9e-06, 0.0),
        ('backbone.depth2', 8, '5624fa02b8e0', 3.1360000000000006e-06, None),
        ('backbone.depth2.no_decay', 10, '1c03aa6f5396', 3.1360000000000006e-06, 0.0),
        ('backbone.depth3', 8, '0e094c408738', 2.5088000000000004e-06, None),
        ('backbone.depth3.no_decay', 10, '3de751078ea9', 2.5088000000000004e-06, 0.0),
        ('backbone.depth4', 8, 'cb8c955ad6cb', 2.0070400000000003e-06, None),
        ('backbone.depth4.no_decay', 10, 'cc8273d33214', 2.0070400000000003e-06, 0.0),
        ('backbone.depth5.no_decay', 5, '29705e7aa12a', 1.6056320000000004e-06, 0.0),
    ],
}


def _groups(model: torch.nn.Module, groups: list[dict]) -> list[tuple]:
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return [(group["name"], len(group["params"]),
             hashlib.sha1(",".join(names[id(p)] for p in group["params"]).encode()).hexdigest()[:12],
             group["lr"], group.get("weight_decay")) for group in groups]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_groups_are_those_the_model_made(family: str) -> None:
    torch.manual_seed(0)
    model = build_detr(FAMILIES[family])
    decays = {"lr_layer_decay": 0.8, "lr_component_decay": 0.7} if family == "rfdetr" else {}
    groups = _groups(model, parameter_groups(model, lr=1e-4, lr_backbone=1e-5, **decays))
    assert [group[:3] + (group[4],) for group in groups] == [group[:3] + (group[4],) for group in BEFORE[family]]
    assert [group[3] for group in groups] == pytest.approx([group[3] for group in BEFORE[family]], rel=1e-12)


def test_the_model_keeps_only_declarative_hooks() -> None:
    model = build_detr(TINY)
    assert not hasattr(model, "parameter_groups")
    for hook in ("backbone_parameters", "slow_modules", "no_weight_decay_parameters", "backbone_layer_depths",
                 "decoder_parameters"):
        assert callable(getattr(model, hook))


def test_a_decay_the_model_has_nothing_for_is_refused() -> None:
    with pytest.raises(ValueError, match="lr_layer_decay=0.8: DETR has no backbone layer depths"):
        parameter_groups(build_detr(TINY), lr=1e-4, lr_backbone=1e-5, lr_layer_decay=0.8)
