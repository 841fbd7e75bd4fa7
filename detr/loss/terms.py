"""Loss terms on given (prediction, target) pairs, shared by the set loss and its parts.

The pairs come as the matcher's ``indices``: per image a pair of int64 tensors (prediction index,
target index) of equal length. :class:`detr.loss.criterion.SetCriterion` gets them from Hungarian matching,
the denoising loss from the way its queries were made, the dense loss from the cells inside each box
(:mod:`detr.loss.parts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detr.box_ops import cxcywh_to_xyxy, elementwise_box_iou, elementwise_generalized_box_iou

Targets = list[dict[str, torch.Tensor]]
Indices = list[tuple[torch.Tensor, torch.Tensor]]


def matched_query_index(indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch index, query index) of every matched prediction, for advanced indexing of [B, Q, ...]."""
    batch_index = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    query_index = torch.cat([src for src, _ in indices])
    return batch_index, query_index


def matched_labels(targets: Targets, indices: Indices) -> torch.Tensor:
    """int64 [N]: the class of each pair's target, in the order of :func:`matched_query_index`."""
    return torch.cat([t["labels"][tgt] for t, (_, tgt) in zip(targets, indices)])


def matched_token_maps(targets: Targets, indices: Indices) -> torch.Tensor | None:
    """float [N, C]: the prompt tokens of each pair's target (``token_map``, a grounding model's targets), in the
    order of :func:`matched_query_index`; None for targets without token maps."""
    if not targets or "token_map" not in targets[0]:
        return None
    return torch.cat([t["token_map"][tgt] for t, (_, tgt) in zip(targets, indices)])


def matched_boxes(pred_boxes: torch.Tensor, targets: Targets, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs' boxes: predictions float32 [N, 4] and targets [N, 4], normalised cxcywh, in the order of
    :func:`matched_query_index`."""
    batch_index, query_index = matched_query_index(indices)
    pred = pred_boxes[batch_index, query_index].float()  # [N, 4] cxcywh
    target = torch.cat([t["boxes"][tgt] for t, (_, tgt) in zip(targets, indices)]).to(pred)
    return pred, target


@torch.no_grad()
def matched_box_iou(pred_boxes: torch.Tensor, targets: Targets, indices: Indices) -> torch.Tensor:
    """float32 [N]: the IoU of each pair's predicted box with its target's (no gradient: the varifocal
    loss's target score)."""
    pred, target = matched_boxes(pred_boxes, targets, indices)
    return elementwise_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(target))


def box_losses(pred_boxes: torch.Tensor, targets: Targets, indices: Indices,
               num_boxes: float | torch.Tensor) -> dict[str, torch.Tensor]:
    """loss_bbox (L1) and loss_giou (1 − GIoU), each summed over the pairs and divided by ``num_boxes``.

    pred_boxes: [B, Q, 4] normalised cxcywh; ``targets[i]["boxes"]``: [T_i, 4] normalised cxcywh.
    """
    pred, target = matched_boxes(pred_boxes, targets, indices)
    loss_bbox = F.l1_loss(pred, target, reduction="none").sum() / num_boxes
    giou = elementwise_generalized_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(target))
    return {"loss_bbox": loss_bbox, "loss_giou": (1 - giou).sum() / num_boxes}
