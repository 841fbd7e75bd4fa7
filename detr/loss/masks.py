"""Mask losses: the panoptic model's (:class:`MaskLoss`) and RF-DETR's instance masks' (:class:`PointMaskLoss`).

:class:`MaskLoss`, the panoptic model's (paper §4.4): sigmoid focal loss and DICE on the matched queries' masks.

The matched query of every target (the same Hungarian matching as the box losses) predicts a mask logit
map at stride 4; it is upsampled (bilinear) to the padded batch size and compared with the target's binary
mask, zero-padded to that size. Both terms are summed over masks and divided by ``num_boxes``; they apply to
the last decoder layer only (the mask head runs on it alone). Weights 1 and 1, as the authors train the
second stage: ``loss_mask`` (focal, α 0.25, γ 2, mean over pixels) and ``loss_dice``.

:class:`PointMaskLoss`, RF-DETR's (the authors' ``loss_masks``; transformers' ``RfDetrImageLoss``): binary
cross-entropy and DICE on points sampled by uncertainty (:mod:`detr.loss.point_sampling`), for every decoder layer
and the encoder proposals, on each one's own matches (which the matcher makes with mask costs too:
:class:`~detr.loss.matcher.HungarianMatcher`'s ``cost_mask_ce`` and ``cost_mask_dice``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import sigmoid_focal_loss

from detr.loss.criterion import LossContext, LossPart
from detr.loss.point_sampling import (
    MaskSource,
    dice_loss,
    matched_mask_logits,
    point_sample,
    sigmoid_ce_loss,
    targets_at_points,
    uncertain_points,
)
from detr.loss.terms import Indices, Targets, matched_query_index
from detr.models.outputs import DetectorOutput, LayerOutput

_NEEDS_MASKS = ("mask losses need targets with 'masks' (bool [T, H, W] per image, at the processed image size): "
                "train with --data.masks true on annotations with segmentations")


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
            raise ValueError(_NEEDS_MASKS)
        indices = context.indices
        num_masked = outputs.masks.shape[1]
        if context.criterion.matcher.num_groups(outputs.logits.shape[1]) > 1:  # Group DETR: group 1 only
            indices = [(queries[queries < num_masked], matched[queries < num_masked]) for queries, matched in indices]
        predictions, target_masks = matched_masks(outputs.masks, targets, indices)
        return {"loss_mask": focal_mask_loss(predictions, target_masks, num_boxes, alpha=self.mask_alpha,
                                             gamma=self.mask_gamma),
                "loss_dice": dice_loss(predictions, target_masks, num_boxes)}


class PointMaskLoss(LossPart):
    """``loss_mask_ce`` (binary cross-entropy) and ``loss_mask_dice`` of an instance-mask model's layers, on points
    (:mod:`detr.loss.point_sampling`), as RF-DETR's authors train them: the last decoder layer's, every earlier
    layer's (``_i``) and the selected encoder proposals' (``_enc``), each on that layer's own matches (from the
    criterion: :class:`LossContext`), divided by num_boxes × Group DETR groups, as the box terms.

    Per matched mask, P = max(h, h · w / ``point_ratio``) points (h × w: the predicted mask, stride 4) chosen by
    :func:`~detr.loss.point_sampling.uncertain_points` (``oversample_ratio`` 3, ``importance_sample_ratio`` 0.75);
    the points are drawn from torch's global generator, the last layer first, then the earlier layers, then the
    proposals (the authors' order). The masks are read from each layer's ``mask_features`` (training), or from the
    output's dense ``masks`` for the last layer (evaluation: the other layers' terms are then zero, and all are
    zero when the targets have no masks).

    Args: num_decoder_layers (the criterion's layer count: one suffix per layer); the weights ``loss_mask_ce`` and
    ``loss_mask_dice`` (5, 5: the authors' ``SegmentationTrainConfig``); point_ratio (16), oversample_ratio (3),
    importance_sample_ratio (0.75); proposals: also score the encoder proposals (True).
    """

    output_field = "masks"
    also_reads = ("mask_features",)

    def __init__(self, num_decoder_layers: int = 1, *, loss_mask_ce: float = 5.0, loss_mask_dice: float = 5.0,
                 point_ratio: int = 16, oversample_ratio: float = 3.0, importance_sample_ratio: float = 0.75,
                 proposals: bool = True) -> None:
        super().__init__()
        if point_ratio < 1 or oversample_ratio < 1 or not 0 <= importance_sample_ratio <= 1:
            raise ValueError(f"PointMaskLoss: point_ratio >= 1 ({point_ratio}), oversample_ratio >= 1 "
                             f"({oversample_ratio}), importance_sample_ratio in [0, 1] ({importance_sample_ratio})")
        self.point_ratio, self.oversample_ratio = point_ratio, oversample_ratio
        self.importance_sample_ratio = importance_sample_ratio
        self.suffixes = ["", *(f"_{layer}" for layer in range(num_decoder_layers - 1)), *(["_enc"] if proposals else [])]
        base = {"loss_mask_ce": loss_mask_ce, "loss_mask_dice": loss_mask_dice}
        self.weight_dict = {f"{name}{suffix}": weight for suffix in self.suffixes for name, weight in base.items()}

    def num_points(self, height: int, width: int) -> int:
        """Points per mask of h × w logits: max(h, h · w // point_ratio), as the authors."""
        return max(height, height * width // self.point_ratio)

    def terms(self, source: MaskSource, targets: Targets, indices: Indices, num_boxes: float | torch.Tensor
              ) -> dict[str, torch.Tensor]:
        """Both terms of one layer's masks (``source``) on its matches."""
        logits = matched_mask_logits(source, indices)[:, None].float()  # [N, 1, h, w]
        if len(logits) == 0:
            zero = logits.sum()  # keeps the graph
            return {"loss_mask_ce": zero, "loss_mask_dice": zero}
        points = uncertain_points(logits, self.num_points(*logits.shape[-2:]), self.oversample_ratio,
                                  self.importance_sample_ratio)
        labels = targets_at_points(targets, indices, points)
        point_logits = point_sample(logits, points)[:, 0]  # [N, P]
        return {"loss_mask_ce": sigmoid_ce_loss(point_logits, labels, num_boxes),
                "loss_mask_dice": dice_loss(point_logits, labels, num_boxes)}

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        if outputs.mask_features is None and outputs.masks is None:
            return self.zeros(outputs)
        if context is None:
            raise ValueError("PointMaskLoss scores each layer's matches: call it through SetCriterion")
        if any("masks" not in t for t in targets):
            if outputs.mask_features is None:  # evaluation without target masks (mask AP reads the json's)
                return self.zeros(outputs)
            raise ValueError(_NEEDS_MASKS)
        matcher = context.criterion.matcher
        num_boxes = num_boxes * matcher.num_groups(outputs.logits.shape[1])
        layers: list[tuple[str, MaskSource | None, Indices]] = [
            ("", outputs.mask_features if outputs.mask_features is not None else outputs.masks, context.indices)]
        layers += [(suffix, layer.mask_features, indices)
                   for suffix, layer, indices in zip(self.suffixes[1:], outputs.aux, context.layer_indices[:-1])]
        if "_enc" in self.suffixes and outputs.proposals is not None:
            layers.append(("_enc", outputs.proposals.mask_features, self._proposal_indices(outputs.proposals, targets,
                                                                                         context)))
        losses = self.zeros(outputs)
        for suffix, source, indices in layers:
            if source is not None:
                losses.update({f"{name}{suffix}": value
                               for name, value in self.terms(source, targets, indices, num_boxes).items()})
        return losses

    @staticmethod
    def _proposal_indices(proposals: LayerOutput, targets: Targets, context: LossContext) -> Indices:
        """The proposals' matches: those :class:`~detr.loss.parts.ProposalLoss` made, else the criterion's matcher's."""
        made = context.part_indices.get("proposals")
        return made[0] if made else context.criterion.matcher(proposals, targets)
