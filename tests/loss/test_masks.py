"""Mask losses: DICE and focal by hand, the upsampling and padding of matched masks, and the criterion's terms
on the panoptic model's outputs (last layer only, same matching as the boxes)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from detr.loss.criterion import SetCriterion
from detr.loss.masks import MaskLoss, focal_mask_loss, matched_masks
from detr.loss.point_sampling import dice_loss
from tests.helpers import tiny_config_with


def test_dice_by_hand():
    logits = torch.zeros(1, 4)  # p = 0.5 everywhere
    targets = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert dice_loss(logits, targets, 1).item() == pytest.approx(1 - (2 * 1.0 + 1) / (2 + 2 + 1))
    perfect = torch.tensor([[30.0, 30.0, -30.0, -30.0]])
    assert dice_loss(perfect, targets, 1).item() == pytest.approx(0, abs=1e-6)
    assert dice_loss(torch.cat([logits, perfect]), torch.cat([targets, targets]), 2).item() == pytest.approx(0.2)


def test_focal_mask_loss_is_the_formula_averaged_over_pixels():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, generator=generator)
    targets = (torch.rand(3, 10, generator=generator) > 0.5).float()
    expected = 0.0
    for mask_logits, mask_targets in zip(logits.tolist(), targets.tolist()):
        terms = []
        for x, t in zip(mask_logits, mask_targets):
            p = 1 / (1 + math.exp(-x))
            p_t, alpha_t = (p, 0.25) if t == 1 else (1 - p, 0.75)
            terms.append(-alpha_t * (1 - p_t) ** 2 * math.log(p_t))
        expected += sum(terms) / len(terms)
    assert focal_mask_loss(logits, targets, 4).item() == pytest.approx(expected / 4, rel=1e-5)


def test_matched_masks_upsample_predictions_and_pad_targets():
    """Image 0 is 8 × 8 (the padded size), image 1 is 4 × 6; predictions are at stride 4 (2 × 2)."""
    generator = torch.Generator().manual_seed(1)
    pred_masks = torch.randn(2, 3, 2, 2, generator=generator)
    masks0 = torch.zeros(1, 8, 8, dtype=torch.bool)
    masks0[0, :3] = True
    masks1 = torch.ones(2, 4, 6, dtype=torch.bool)
    targets = [{"masks": masks0}, {"masks": masks1}]
    indices = [(torch.tensor([2]), torch.tensor([0])), (torch.tensor([0, 1]), torch.tensor([1, 0]))]
    predictions, target_masks = matched_masks(pred_masks, targets, indices)
    assert predictions.shape == target_masks.shape == (3, 64)
    upsampled = F.interpolate(pred_masks, size=(8, 8), mode="bilinear", align_corners=False)
    torch.testing.assert_close(predictions, torch.stack([upsampled[0, 2], upsampled[1, 0], upsampled[1, 1]]).flatten(1))
    torch.testing.assert_close(target_masks[0].view(8, 8), masks0[0].float())
    padded = torch.zeros(8, 8)
    padded[:4, :6] = 1
    torch.testing.assert_close(target_masks[1].view(8, 8), padded)


def test_criterion_adds_mask_terms_to_the_last_layer_only(padded_batch):
    from detr.models.segmentation import build_detr_panoptic

    torch.manual_seed(0)
    model = build_detr_panoptic(tiny_config_with(hidden_dim=128, num_heads=8, num_queries=6, num_classes=3),
                                freeze_detr=True)
    images, padding_mask = padded_batch  # 96 × 128 and 64 × 96
    masks0 = torch.zeros(2, 96, 128, dtype=torch.bool)
    masks0[0, 10:40, 20:60], masks0[1, 50:90, 70:120] = True, True
    masks1 = torch.zeros(1, 64, 96, dtype=torch.bool)
    masks1[0, 5:30, 5:50] = True
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.26, 0.3, 0.3], [0.74, 0.73, 0.4, 0.4]]),
                "masks": masks0},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.28, 0.27, 0.47, 0.4]]), "masks": masks1}]
    criterion = SetCriterion(3, num_decoder_layers=2, parts=[MaskLoss()])
    outputs = model(images, padding_mask)
    losses = criterion(outputs, targets)
    assert {"loss_mask", "loss_dice"} <= losses.keys() and "loss_mask_0" not in losses
    assert criterion.weight_dict["loss_mask"] == criterion.weight_dict["loss_dice"] == 1.0
    indices = criterion.matcher(outputs, targets)
    predictions, target_masks = matched_masks(outputs.masks, targets, indices)
    torch.testing.assert_close(losses["loss_dice"], dice_loss(predictions, target_masks, 3))
    torch.testing.assert_close(losses["loss_mask"], focal_mask_loss(predictions, target_masks, 3))
    (losses["loss_mask"] + losses["loss_dice"]).backward()  # only the (unfrozen) mask head gets gradients
    assert model.mask_head.lay1.weight.grad.abs().sum() > 0 and model.detr.class_embed.weight.grad is None
    with pytest.raises(ValueError, match="masks"):
        criterion(outputs, [{k: v for k, v in t.items() if k != "masks"} for t in targets])
