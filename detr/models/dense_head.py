"""A training-only dense head on the encoder output: one-to-many auxiliary supervision (docs/measurements/convergence.md).

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
- losses (in :class:`detr.loss.criterion.SetCriterion`): sigmoid focal over every real cell, L1 and GIoU on
  the positive cells, each divided by the number of positive cells.

Inference never runs it: the model's outputs, speed and attention are those of the model without it.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.config import PRIOR_BIAS
from detr.models.layers.mlp import MLP
from detr.models.outputs import DenseOutput

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

    def forward(self, memory: torch.Tensor, padding_mask: torch.Tensor) -> DenseOutput:
        """memory float [B, HW, C]; padding_mask bool [B, h, w] (True = padding) → :class:`DenseOutput`:
        logits [B, HW, K], boxes [B, HW, 4] normalised cxcywh of the unpadded image,
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
        return DenseOutput(self.class_embed(memory), boxes, centers, real.flatten(1))
