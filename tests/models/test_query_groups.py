"""query_groups (Group DETR's one-to-many assignment) and the stride-8 backbone cut."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.loss.criterion import SetCriterion
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import DenoisingLoss
from detr.models.anchor.model import query_group_attention_mask
from tests.helpers import model_output, tiny_config_with

TINY = tiny_config_with(num_queries=6, num_classes=4, dropout=0.0, backbone_last_stage="layer3", query_type="anchor",
                        class_head="sigmoid")


def _batch():
    torch.manual_seed(1)
    images = torch.randn(2, 3, 64, 64)
    mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    targets = [{"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
               {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.4, 0.5, 0.3, 0.4]])}]
    return images, mask, targets


def test_group_mask_blocks_other_groups_and_keeps_the_denoising_mask():
    dn = torch.tensor([[True, False, True, True, True, True],
                       [False, True, True, True, True, True],
                       [False, False, True, True, True, True],
                       [False, False, True, True, True, True],
                       [False, False, True, True, True, True],
                       [False, False, True, True, True, True]])
    mask = query_group_attention_mask(2, 2, num_before=2, mask=dn)
    assert torch.equal(mask[:2], dn[:2])  # denoising rows untouched
    assert torch.equal(mask[2:, 2:], torch.tensor([[True, True, False, False], [True, True, False, False],
                                                   [False, False, True, True], [False, False, True, True]]))
    assert not mask[2:, :2].any()  # matching queries still blind to the denoising ones
    assert torch.equal(query_group_attention_mask(3, 1), torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("denoising", [False, True])
def test_groups_train_on_every_group_and_infer_with_the_first(denoising):
    torch.manual_seed(0)
    model = build_detr(TINY, denoising=denoising, query_groups=3)
    assert model.refpoint_embed.weight.shape == (18, 4)
    images, mask, targets = _batch()
    model.eval()
    with torch.no_grad():
        inference = model(images, mask)
    assert inference.logits.shape == (2, 6, 4)
    model.train()
    out = model(images, mask, targets=targets)
    # the group count reaches the matcher when it is built (group_size), not through the outputs
    assert out.logits.shape == (2, 18, 4)
    assert all(aux.boxes.shape == (2, 18, 4) for aux in out.aux)
    # The first group sees neither the other groups nor the denoising queries: in training it gives
    # exactly what inference gives (no dropout), so the extra groups change nothing at test time.
    torch.testing.assert_close(out.boxes[:, :6], inference.boxes, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.logits[:, :6], inference.logits, rtol=0, atol=1e-5)

    criterion = SetCriterion(4, HungarianMatcher(class_head="sigmoid", group_size=6), class_head="sigmoid",
                             num_decoder_layers=2, parts=[DenoisingLoss(2, class_head="sigmoid")] if denoising else [])
    indices = criterion.matcher(out, targets)
    for (queries, target_index), target in zip(indices, targets):
        # one-to-one inside each group: every target once per group
        assert len(queries) == 3 * len(target["labels"])
        for group in range(3):
            in_group = (queries >= 6 * group) & (queries < 6 * (group + 1))
            assert sorted(target_index[in_group].tolist()) == list(range(len(target["labels"])))
    losses = criterion(out, targets)
    total = sum(losses[name] * weight for name, weight in criterion.weight_dict.items())
    total.backward()
    # every group's anchors receive a gradient: all groups are trained
    grad = model.refpoint_embed.weight.grad.view(3, 6, 4)
    assert all(grad[group].abs().sum() > 0 for group in range(3))


def test_group_matcher_equals_matching_each_group_alone():
    torch.manual_seed(0)
    matcher = HungarianMatcher(class_head="sigmoid", group_size=4)
    logits, boxes = torch.randn(2, 12, 4), torch.rand(2, 12, 4) * 0.5 + 0.25
    _, _, targets = _batch()
    grouped = matcher(model_output(logits=logits, boxes=boxes), targets)
    for group in range(3):
        part = slice(4 * group, 4 * (group + 1))
        alone = matcher(model_output(logits=logits[:, part], boxes=boxes[:, part]), targets)
        for (queries, target_index), (alone_queries, alone_targets) in zip(grouped, alone):
            in_group = (queries >= 4 * group) & (queries < 4 * (group + 1))
            assert torch.equal(queries[in_group] - 4 * group, alone_queries)
            assert torch.equal(target_index[in_group], alone_targets)


def test_group_losses_are_the_mean_of_each_group_alone():
    torch.manual_seed(0)
    criterion = SetCriterion(4, HungarianMatcher(class_head="sigmoid", group_size=4), class_head="sigmoid",
                             num_decoder_layers=1)
    logits, boxes = torch.randn(2, 8, 4), torch.rand(2, 8, 4) * 0.5 + 0.25
    _, _, targets = _batch()
    grouped = criterion(model_output(logits=logits, boxes=boxes), targets)
    alone = [criterion(model_output(logits=logits[:, g * 4:(g + 1) * 4], boxes=boxes[:, g * 4:(g + 1) * 4]),
                       targets) for g in range(2)]
    for name in ("loss_ce", "loss_bbox", "loss_giou"):
        torch.testing.assert_close(grouped[name], (alone[0][name] + alone[1][name]) / 2)
    torch.testing.assert_close(grouped["cardinality_error"], alone[0]["cardinality_error"])


def test_the_matcher_counts_groups_from_its_group_size():
    matcher = HungarianMatcher(group_size=6)
    assert matcher.num_groups(18) == 3 and matcher.num_groups(6) == 1  # training pass, inference pass
    assert HungarianMatcher().num_groups(18) == 1
    with pytest.raises(ValueError, match="group_size=6"):
        matcher.num_groups(10)
    with pytest.raises(ValueError, match="group_size"):
        HungarianMatcher(group_size=0)


def test_query_groups_are_validated_and_stored():
    with pytest.raises(ValueError, match="query_groups must be at least 1"):
        build_detr(TINY, query_groups=0)
    with pytest.raises(ValueError, match="query_type='anchor'"):
        build_detr(TINY, query_type="learned", query_groups=2)
    assert build_detr(TINY, query_groups=2).config.query_groups == 2


def test_layer2_cut_gives_a_stride_8_map():
    model = build_detr(TINY, backbone_last_stage="layer2", backbone_norm="batch_norm",
                       backbone_trainable_layers=5)
    body = model.backbone[0]
    features, _ = body(torch.randn(1, 3, 128, 128), torch.zeros(1, 128, 128, dtype=torch.bool))
    assert features.shape == (1, 128, 16, 16) and body.stride == 8 and body.num_channels == 128
    assert not any(k.startswith(("backbone.0.body.layer3", "backbone.0.body.layer4")) for k in model.state_dict())
    with pytest.raises(ValueError, match="'layer2'"):
        build_detr(backbone="resnet50", dilation=True, backbone_last_stage="layer2")
