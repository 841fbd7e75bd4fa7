"""Set loss against values computed by hand on a small case, with and without targets."""

from __future__ import annotations

import math

import torch

from detr import HungarianMatcher, SetCriterion
from tests.helpers import model_output


def one_image_case():
    # 3 queries, 2 real classes (+ no-object). Query 0 predicts class 1 at the target box.
    logits = torch.tensor([[[0.0, 2.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.1], [0.7, 0.7, 0.2, 0.2]]])
    target = {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.4]])}
    return model_output(logits=logits, boxes=boxes), [target]


def test_losses_by_hand():
    outputs, targets = one_image_case()
    criterion = SetCriterion(num_classes=2, matcher=HungarianMatcher(), eos_coef=0.1, num_decoder_layers=1)
    losses = criterion(outputs, targets)
    logits = outputs.logits[0]
    # query 0 matched to class 1; queries 1, 2 get no-object (label 2) with weight 0.1.
    nll = [-torch.log_softmax(logits[0], -1)[1], -torch.log_softmax(logits[1], -1)[2],
           -torch.log_softmax(logits[2], -1)[2]]
    expected_ce = (1.0 * nll[0] + 0.1 * nll[1] + 0.1 * nll[2]) / (1.0 + 0.1 + 0.1)
    torch.testing.assert_close(losses["loss_ce"], expected_ce)
    # L1: |0.2 - 0.4| on h only; one box.
    torch.testing.assert_close(losses["loss_bbox"], torch.tensor(0.2))
    # GIoU of [0.4,0.4,0.6,0.6] inside [0.4,0.3,0.6,0.7]: IoU = 0.04/0.08, enclosing = union → GIoU 0.5.
    torch.testing.assert_close(losses["loss_giou"], torch.tensor(0.5))
    assert losses["class_error"].item() == 0.0
    # predicted non-empty: query 0 (class 1) and query 1 (class 0) → 2 vs 1 target.
    assert losses["cardinality_error"].item() == 1.0


def test_num_boxes_divides_box_losses_not_class_loss():
    outputs, targets = one_image_case()
    criterion = SetCriterion(num_classes=2, num_decoder_layers=1)
    base = criterion(outputs, targets)
    scaled = criterion(outputs, targets, num_boxes=4.0)
    torch.testing.assert_close(scaled["loss_bbox"], base["loss_bbox"] / 4)
    torch.testing.assert_close(scaled["loss_giou"], base["loss_giou"] / 4)
    torch.testing.assert_close(scaled["loss_ce"], base["loss_ce"])


def test_no_targets_only_no_object_loss():
    outputs, _ = one_image_case()
    criterion = SetCriterion(num_classes=2, num_decoder_layers=1)
    losses = criterion(outputs, [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}])
    expected = -torch.log_softmax(outputs.logits[0], -1)[:, 2].mean()
    torch.testing.assert_close(losses["loss_ce"], expected)
    assert losses["loss_bbox"].item() == 0 and losses["loss_giou"].item() == 0
    assert losses["class_error"].item() == 100.0
    assert math.isfinite(losses["loss_ce"].item())


def test_aux_losses_names_and_weights():
    outputs, targets = one_image_case()
    outputs.aux = [model_output(outputs.logits, outputs.boxes), model_output(outputs.logits, outputs.boxes)]
    criterion = SetCriterion(num_classes=2, num_decoder_layers=3)
    losses = criterion(outputs, targets)
    for suffix in ("", "_0", "_1"):
        for name in ("loss_ce", "loss_bbox", "loss_giou"):
            assert name + suffix in losses and name + suffix in criterion.weight_dict
        torch.testing.assert_close(losses["loss_giou" + suffix], losses["loss_giou"])
    assert "class_error_0" not in losses
    assert criterion.weight_dict["loss_bbox_1"] == 5 and criterion.weight_dict["loss_giou"] == 2


def test_gradients_flow_to_predictions():
    outputs, targets = one_image_case()
    outputs = outputs.apply(lambda value: value.clone().requires_grad_(True))
    criterion = SetCriterion(num_classes=2, num_decoder_layers=1)
    losses = criterion(outputs, targets)
    total = sum(losses[k] * w for k, w in criterion.weight_dict.items())
    total.backward()
    assert outputs.boxes.grad[0, 0].abs().sum() > 0 and outputs.boxes.grad[0, 1].abs().sum() == 0
