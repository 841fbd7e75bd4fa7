"""Box helpers that torchvision.ops does not have in the form DETR needs.

Formats: ``cxcywh`` is (center x, center y, width, height), ``xyxy`` is (x0, y0, x1, y1); both either
normalised to [0, 1] or in pixels, as each caller's docstring says. The conversions compute what
:func:`torchvision.ops.box_convert` does, element for element (the same values), on the two halves of a box
instead of its four coordinates apart: four operations instead of eight or nine, which a training step's loss
(several conversions per decoder layer) pays in kernel launches on a GPU (docs/measurements/speed.md).
"""

from __future__ import annotations

import torch


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """[..., 4] cxcywh → [..., 4] xyxy (same units)."""
    centre, half = boxes[..., :2], 0.5 * boxes[..., 2:]
    return torch.cat([centre - half, centre + half], -1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """[..., 4] xyxy → [..., 4] cxcywh (same units)."""
    top_left, bottom_right = boxes[..., :2], boxes[..., 2:]
    return torch.cat([(top_left + bottom_right) / 2, bottom_right - top_left], -1)


def _area(boxes: torch.Tensor) -> torch.Tensor:
    return _product(boxes[..., 2:] - boxes[..., :2])


def _product(sides: torch.Tensor) -> torch.Tensor:
    """[..., 2] → [...]: width × height (``prod(-1)``'s values, with a backward of two products instead of
    ``prod``'s cumulative products)."""
    return sides[..., 0] * sides[..., 1]


def batched_generalized_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Pairwise GIoU per batch element: [B, N, 4] xyxy × [B, M, 4] xyxy → [B, N, M].

    The same arithmetic as :func:`torchvision.ops.generalized_box_iou` (no epsilon, so values equal the
    authors' to float precision), batched so the matcher computes only each image's own block.
    """
    area1, area2 = _area(boxes1), _area(boxes2)  # [B, N], [B, M]
    lt = torch.max(boxes1[:, :, None, :2], boxes2[:, None, :, :2])  # [B, N, M, 2]
    rb = torch.min(boxes1[:, :, None, 2:], boxes2[:, None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)  # [B, N, M]
    union = area1[:, :, None] + area2[:, None, :] - inter
    iou = inter / union
    lt_c = torch.min(boxes1[:, :, None, :2], boxes2[:, None, :, :2])
    rb_c = torch.max(boxes1[:, :, None, 2:], boxes2[:, None, :, 2:])
    area_c = (rb_c - lt_c).clamp(min=0).prod(-1)
    return iou - (area_c - union) / area_c


def elementwise_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """IoU of matched pairs: [N, 4] xyxy and [N, 4] xyxy → [N] (the diagonal of the pairwise IoU)."""
    lt = torch.max(boxes1[:, :2], boxes2[:, :2])
    rb = torch.min(boxes1[:, 2:], boxes2[:, 2:])
    inter = _product((rb - lt).clamp(min=0))
    return inter / (_area(boxes1) + _area(boxes2) - inter)


def elementwise_generalized_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """GIoU of matched pairs: [N, 4] xyxy and [N, 4] xyxy → [N].

    Equals the diagonal of the pairwise GIoU (what the authors' loss takes) without the N × N matrix.
    """
    area1, area2 = _area(boxes1), _area(boxes2)
    lt = torch.max(boxes1[:, :2], boxes2[:, :2])
    rb = torch.min(boxes1[:, 2:], boxes2[:, 2:])
    inter = _product((rb - lt).clamp(min=0))
    union = area1 + area2 - inter
    iou = inter / union
    area_c = _product((torch.max(boxes1[:, 2:], boxes2[:, 2:]) - torch.min(boxes1[:, :2], boxes2[:, :2])).clamp(min=0))
    return iou - (area_c - union) / area_c


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """logit(x) with x clamped to [eps, 1 - eps] (DAB-DETR's eps), so boxes at 0 or 1 stay finite."""
    # DAB-DETR clamps to [0, 1] first, then each operand to eps; one clamp per operand gives the same
    # numbers, and the ONNX exporter's graph optimiser (onnxscript 0.7) writes an invalid graph when it
    # merges the chained clamps.
    return torch.log(x.clamp(min=eps, max=1.0) / (1 - x).clamp(min=eps, max=1.0))
