"""Mask losses for the panoptic model (paper §4.4): sigmoid focal loss and DICE on the matched queries' masks.

The matched query of every target (the same Hungarian matching as the box losses) predicts a mask logit
map at stride 4; it is upsampled (bilinear) to the padded batch size and compared with the target's binary
mask, zero-padded to that size. Both terms are summed over masks and divided by ``num_boxes``; they apply to
the last decoder layer only (the mask head runs on it alone). Weights 1 and 1, as the authors train the
second stage: ``loss_mask`` (focal, α 0.25, γ 2, mean over pixels) and ``loss_dice``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import sigmoid_focal_loss

from detr.loss.criterion import LossContext, LossPart
from detr.loss.terms import Indices, Targets, matched_query_index
from detr.models.outputs import DetectorOutput


def dice_loss(logits: torch.Tensor, targets: torch.Tensor, num_boxes: float | torch.Tensor) -> torch.Tensor:
    """DICE loss (Milletari et al., 2016), the mask analogue of 1 − IoU, summed over masks / num_boxes.

    logits, targets: float [N, P] (P pixels per mask; targets 0 or 1). Per mask, with p = sigmoid(logits):
    ``1 − (2 Σ p·t + 1) / (Σ p + Σ t + 1)``; the +1 keeps empty masks finite.
    """
    probabilities = logits.sigmoid()
    numerator = 2 * (probabilities * targets).sum(-1) + 1
    denominator = probabilities.sum(-1) + targets.sum(-1) + 1
    return (1 - numerator / denominator).sum() / num_boxes


def focal_mask_loss(logits: torch.Tensor, targets: torch.Tensor, num_boxes: float | torch.Tensor, *,
                    alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    """Sigmoid focal loss (Lin et al., 2017) per pixel, averaged over each mask's pixels, summed over masks
    and divided by num_boxes. logits, targets: float [N, P]."""
    per_pixel = sigmoid_focal_loss(logits, targets, alpha=alpha, gamma=gamma, reduction="none")
    return per_pixel.mean(-1).sum() / num_boxes


def matched_masks(pred_masks: torch.Tensor, targets: Targets, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
    """The matched queries' mask logits (of ``pred_masks`` [B, Q, h', w']), upsampled to the padded batch size,
    and their targets, zero-padded to
    it: both float [N, H · W]. ``targets[i]["masks"]``: bool or 0/1 [T_i, h_i, w_i] at the image's processed
    size; the padded size is the largest (h_i, w_i) of the batch, as the batch's images are padded."""
    batch_index, query_index = matched_query_index(indices)
    height = max(int(t["masks"].shape[-2]) for t in targets)
    width = max(int(t["masks"].shape[-1]) for t in targets)
    predictions = pred_masks[batch_index, query_index].float()  # [N, h', w']
    if len(predictions):
        predictions = F.interpolate(predictions[:, None], size=(height, width), mode="bilinear",
                                    align_corners=False)[:, 0]
    else:
        predictions = predictions.new_zeros(0, height, width)
    padded = []
    for target, (_, target_index) in zip(targets, indices):
        masks = target["masks"][target_index].to(predictions)
        padded.append(F.pad(masks, (0, width - masks.shape[-1], 0, height - masks.shape[-2])))
    target_masks = torch.cat(padded) if padded else predictions.new_zeros(0, height, width)
    return predictions.flatten(1), target_masks.flatten(1)


class MaskLoss(LossPart):
    """``loss_mask`` (focal) and ``loss_dice`` of a panoptic model's ``masks`` on the last decoder layer's
    matches (the box terms' Hungarian matching: :class:`LossContext`). Targets also need ``masks`` (see
    :func:`matched_masks`); both terms are divided by num_boxes.

    Args: the weights ``loss_mask`` and ``loss_dice`` (1, 1), the focal ``mask_alpha`` and ``mask_gamma``
    (0.25, 2).

    With Group DETR's query groups (G > 1 groups of predictions, an unfrozen detector in training) ``masks``
    covers group 1 only (the queries inference decodes): the mask terms use group 1's matches.
    """

    output_field = "masks"

    def __init__(self, *, loss_mask: float = 1.0, loss_dice: float = 1.0, mask_alpha: float = 0.25,
                 mask_gamma: float = 2.0) -> None:
        super().__init__()
        self.mask_alpha, self.mask_gamma = mask_alpha, mask_gamma
        self.weight_dict = {"loss_mask": loss_mask, "loss_dice": loss_dice}

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        if outputs.masks is None:
            return self.zeros(outputs)
        if context is None:
            raise ValueError("MaskLoss scores the box terms' matches: call it through SetCriterion")
        if any("masks" not in t for t in targets):
            raise ValueError("mask losses need targets with 'masks' (bool [T, H, W] per image, at the processed "
                             "image size); the panoptic data pipeline provides them")
        indices = context.indices
        num_masked = outputs.masks.shape[1]
        if context.criterion.matcher.num_groups(outputs.logits.shape[1]) > 1:  # Group DETR: group 1 only
            indices = [(queries[queries < num_masked], matched[queries < num_masked]) for queries, matched in indices]
        predictions, target_masks = matched_masks(outputs.masks, targets, indices)
        return {"loss_mask": focal_mask_loss(predictions, target_masks, num_boxes, alpha=self.mask_alpha,
                                             gamma=self.mask_gamma),
                "loss_dice": dice_loss(predictions, target_masks, num_boxes)}
