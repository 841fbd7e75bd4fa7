"""Raw predictions → per-image scores, labels and pixel boxes (REFERENCE.md, "Post-processing")."""

from __future__ import annotations

import torch
from torch import nn

from detr.box_ops import cxcywh_to_xyxy


class PostProcess(nn.Module):
    """Softmax over all logits; score and label = max over the real classes (no-object excluded);
    boxes cxcywh → xyxy scaled to each ORIGINAL image. No threshold and no top-k: all queries are kept."""

    @torch.no_grad()
    def forward(self, outputs: dict[str, torch.Tensor], target_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """outputs: pred_logits [B, Q, C+1], pred_boxes [B, Q, 4]; target_sizes [B, 2] as (height, width)
        of the original images. Returns per image {scores float [Q], labels int64 [Q], boxes float [Q, 4]
        pixel xyxy}."""
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        if len(logits) != len(target_sizes) or target_sizes.shape[-1] != 2:
            raise ValueError(f"target_sizes must be [B, 2] (height, width) with B = {len(logits)}, "
                             f"got {tuple(target_sizes.shape)}")
        scores, labels = logits.float().softmax(-1)[..., :-1].max(-1)
        height, width = target_sizes.to(boxes.device).float().unbind(1)
        scale = torch.stack([width, height, width, height], dim=1)  # [B, 4]
        boxes = cxcywh_to_xyxy(boxes.float()) * scale[:, None, :]
        return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, boxes)]
