"""The cells of a detector's feature maps as anchor boxes: where two-stage query selection starts (RT-DETR: Zhao
et al. 2024, §4.3, the authors' ``_generate_anchors``; LW-DETR / RF-DETR: the authors'
``gen_encoder_output_proposals``).

Every cell of every level is a box centred on the cell, of side ``ANCHOR_SIZE · 2^level`` (0.05 of the image at the
finest level); a box with a coordinate within ``ANCHOR_MARGIN`` of 0 or 1 is invalid (never selected).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Anchor sizes: 0.05 of the image at the finest level, doubling per level; anchors whose centre or size lies
#: within ANCHOR_MARGIN of 0 or 1 are invalid (the authors' grid_size and eps).
ANCHOR_SIZE, ANCHOR_MARGIN = 0.05, 0.01


def cell_anchors(spatial_shapes: Sequence[tuple[int, int]], *, device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The levels' (h, w), finest first → every cell's box [1, S, 4] (cxcywh in [0, 1], the levels' cells
    flattened row by row, finest level first) and whether it is valid, bool [1, S, 1] (every coordinate within
    (ANCHOR_MARGIN, 1 − ANCHOR_MARGIN))."""
    levels = []
    for level, (height, width) in enumerate(spatial_shapes):
        rows, columns = torch.meshgrid(torch.arange(height, device=device).to(dtype),
                                       torch.arange(width, device=device).to(dtype), indexing="ij")
        centres = torch.stack([(columns + 0.5) / width, (rows + 0.5) / height], -1)  # [h, w, 2] (x, y)
        sizes = torch.full_like(centres, ANCHOR_SIZE * 2.0 ** level)
        levels.append(torch.cat([centres, sizes], -1).reshape(1, height * width, 4))
    boxes = torch.cat(levels, 1)
    valid = ((boxes > ANCHOR_MARGIN) & (boxes < 1 - ANCHOR_MARGIN)).all(-1, keepdim=True)
    return boxes, valid
