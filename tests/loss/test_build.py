"""build_criterion: one loss builder for every model config, each optional term a part."""

from __future__ import annotations

import pytest

from detr.loss.build import build_criterion
from detr.loss.masks import MaskLoss
from detr.loss.parts import DenoisingLoss, DenseLoss, ProposalLoss
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict

PAPER = DetrConfig()


@pytest.mark.parametrize("changes, masks, training_only, parts", [
    ({}, False, True, []),
    ({"architecture": "deformable", "class_head": "sigmoid", "box_refine": True, "two_stage": True}, False, True,
     [ProposalLoss]),
    ({"query_type": "anchor", "denoising": True, "dense_aux_head": True}, False, True, [DenoisingLoss, DenseLoss]),
    ({"query_type": "anchor", "denoising": True, "dense_aux_head": True}, True, False, [MaskLoss]),
    ({}, True, True, [MaskLoss]),
])
def test_the_parts_follow_the_config(changes, masks, training_only, parts):
    config = PAPER.replace(**changes) if "architecture" not in changes else config_from_dict(changes)
    criterion = build_criterion(config, masks=masks, training_only_parts=training_only, loss_bbox=4.0)
    assert [type(part) for part in criterion.parts] == parts
    assert criterion.class_head == config.class_head == criterion.matcher.class_head
    # weighted in the order the terms are computed: the last layer, the earlier layers, then each part's
    names = list(criterion.weight_dict)
    assert names[:3] == ["loss_ce", "loss_bbox", "loss_giou"] and names[3:6] == ["loss_ce_0", "loss_bbox_0", "loss_giou_0"]
    expected_tail = [name for part in criterion.parts for name in part.weight_dict]
    assert names[len(names) - len(expected_tail):] == expected_tail
    assert criterion.weight_dict["loss_bbox"] == 4.0
    if ProposalLoss in parts:
        assert criterion.weight_dict["loss_bbox_enc"] == 4.0


def test_query_groups_are_matched_group_by_group_and_aux_loss_off_leaves_one_layer():
    grouped = build_criterion(PAPER.replace(query_type="anchor", query_groups=3, num_queries=10))
    assert grouped.matcher.group_size == 10
    single = build_criterion(PAPER.replace(aux_loss=False))
    assert single.num_decoder_layers == 1 and "loss_ce_0" not in single.weight_dict
