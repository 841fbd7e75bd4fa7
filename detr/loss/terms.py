"""Loss terms on given (prediction, target) pairs, shared by the set loss and its parts.

The pairs come as the matcher's ``indices``: per image a pair of int64 tensors (prediction index,
target index) of equal length. :class:`detr.loss.criterion.SetCriterion` gets them from Hungarian matching,
the denoising loss from the way its queries were made, the dense loss from the cells inside each box
(:mod:`detr.loss.parts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detr.box_ops import cxcywh_to_xyxy, elementwise_generalized_box_iou

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


def box_losses(pred_boxes: torch.Tensor, targets: Targets, indices: Indices,
               num_boxes: float | torch.Tensor) -> dict[str, torch.Tensor]:
    """loss_bbox (L1) and loss_giou (1 − GIoU), each summed over the pairs and divided by ``num_boxes``.

    pred_boxes: [B, Q, 4] normalised cxcywh; ``targets[i]["boxes"]``: [T_i, 4] normalised cxcywh.
    """
    batch_index, query_index = matched_query_index(indices)
    pred = pred_boxes[batch_index, query_index].float()  # [N, 4] cxcywh
    target = torch.cat([t["boxes"][tgt] for t, (_, tgt) in zip(targets, indices)]).to(pred)
    loss_bbox = F.l1_loss(pred, target, reduction="none").sum() / num_boxes
    giou = elementwise_generalized_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(target))
    return {"loss_bbox": loss_bbox, "loss_giou": (1 - giou).sum() / num_boxes}
