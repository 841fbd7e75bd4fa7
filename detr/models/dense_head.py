"""A training-only dense head on the encoder output: one-to-many auxiliary supervision (docs/convergence.md).

Co-DETR (Zong et al., "DETRs with Collaborative Hybrid Assignments Training", ICCV 2023) trains DETR
faster by adding auxiliary heads with *one-to-many* label assignment (ATSS, Faster R-CNN) on the
encoder's output and dropping them at inference. The set loss supervises each ground truth through one
query per decoder layer; the encoder features under an object get no direct signal at all, so they
learn what the objects are slowly. This module is the simplest such head, FCOS-like (Tian et al.,
ICCV 2019), on DETR's single-scale memory:

- every feature cell predicts ``num_classes`` sigmoid scores and a box,
  ``sigmoid(mlp(memory) + inverse_sigmoid((cx, cy, 0.05, 0.05)))`` around its centre (Deformable
  DETR's proposal size);
- a cell is positive for a target when its centre lies inside the target box, and the cell that holds
  a target's centre is always positive for it (small objects cover no cell centre); a cell inside
  several boxes takes the smallest;
- losses (in :class:`detr.criterion.SetCriterion`): sigmoid focal over every real cell, L1 and GIoU on
  the positive cells, each divided by the number of positive cells.

Inference never runs it: the model's outputs, speed and attention are those of the model without it.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.box_ops import cxcywh_to_xyxy
from detr.focal import PRIOR_BIAS
from detr.models.anchor_decoder import inverse_sigmoid
from detr.models.mlp import MLP

#: Width and height (normalised) of the box each cell regresses from.
PROPOSAL_SIZE = 0.05


class DenseAuxiliaryHead(nn.Module):
    """Class and box predictions for every encoder cell (training only).

    Args:
        hidden_dim: width of the encoder memory.
        num_classes: real classes (sigmoid scores; no "no object" logit).
    """

    def __init__(self, hidden_dim: int, num_classes: int) -> None:
        super().__init__()
        self.class_embed = nn.Linear(hidden_dim, num_classes)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        nn.init.constant_(self.class_embed.bias, PRIOR_BIAS)  # every class starts at p = 0.01
        nn.init.zeros_(self.bbox_embed.layers[-1].weight)
        nn.init.zeros_(self.bbox_embed.layers[-1].bias)

    def forward(self, memory: torch.Tensor, padding_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """memory float [B, HW, C]; padding_mask bool [B, h, w] (True = padding) →
        pred_logits [B, HW, K], pred_boxes [B, HW, 4] normalised cxcywh of the unpadded image,
        centers [B, HW, 2] (cell centres, normalised x, y), valid bool [B, HW] (False = padding cell)."""
        batch, height, width = padding_mask.shape
        real = ~padding_mask
        # Normalise by each image's unpadded extent, as the sine position encoding and the boxes do.
        rows = real[:, :, 0].sum(1).clamp(min=1).to(memory.dtype)  # [B]
        cols = real[:, 0, :].sum(1).clamp(min=1).to(memory.dtype)
        y = (torch.arange(height, device=memory.device, dtype=memory.dtype) + 0.5)[None, :] / rows[:, None]
        x = (torch.arange(width, device=memory.device, dtype=memory.dtype) + 0.5)[None, :] / cols[:, None]
        centers = torch.stack([x[:, None, :].expand(-1, height, -1), y[:, :, None].expand(-1, -1, width)], dim=-1)
        centers = centers.flatten(1, 2)  # [B, HW, 2]
        reference = torch.cat([centers, centers.new_full(centers.shape, PROPOSAL_SIZE)], dim=-1)
        boxes = (self.bbox_embed(memory) + inverse_sigmoid(reference)).sigmoid()
        return {"pred_logits": self.class_embed(memory), "pred_boxes": boxes, "centers": centers,
                "valid": real.flatten(1)}


@torch.no_grad()
def dense_assignment(centers: torch.Tensor, valid: torch.Tensor, targets: list[dict[str, torch.Tensor]]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """One-to-many assignment of cells to targets.

    Args:
        centers: float [B, HW, 2] normalised (x, y) cell centres; valid: bool [B, HW].
        targets: per image labels int64 [T] and boxes float [T, 4] normalised cxcywh.

    Returns assigned int64 [B, HW]: the index of the cell's target in its image, -1 for a negative or
    padding cell. A cell is positive for every target box its centre lies in, and the cell nearest each
    target's centre is positive for that target whatever the box covers; a cell positive for several
    targets takes the smallest box.
    """
    batch, cells, _ = centers.shape
    assigned = torch.full((batch, cells), -1, dtype=torch.int64, device=centers.device)
    for index, target in enumerate(targets):
        boxes = target["boxes"].to(centers)
        if len(boxes) == 0:
            continue
        xyxy = cxcywh_to_xyxy(boxes)  # [T, 4]
        point = centers[index]  # [HW, 2]
        inside = ((point[:, None, 0] > xyxy[None, :, 0]) & (point[:, None, 0] < xyxy[None, :, 2])
                  & (point[:, None, 1] > xyxy[None, :, 1]) & (point[:, None, 1] < xyxy[None, :, 3]))  # [HW, T]
        distance = (point[:, None, :] - boxes[None, :, :2]).abs().amax(-1)  # [HW, T] Chebyshev to the centre
        distance = distance.masked_fill(~valid[index][:, None], float("inf"))
        nearest = distance.argmin(0)  # [T]: the cell holding each centre
        inside[nearest, torch.arange(len(boxes), device=centers.device)] = True
        inside &= valid[index][:, None]
        area = (boxes[:, 2] * boxes[:, 3])[None, :].expand_as(inside)
        area = area.masked_fill(~inside, float("inf"))
        smallest = area.argmin(1)  # [HW]
        assigned[index] = torch.where(inside.any(1), smallest, -1)
    return assigned
