"""The cells of a detector's feature maps as anchor boxes: where two-stage query selection starts (RT-DETR: Zhao
et al. 2024, §4.3, the authors' ``_generate_anchors``; LW-DETR / RF-DETR: the authors'
``gen_encoder_output_proposals``), and the selection itself (:func:`select_cells`: RT-DETR, D-FINE, DEIMv2,
RF-DETR, Grounding DINO).

Every cell of every level is a box centred on the cell, of side ``ANCHOR_SIZE · 2^level`` (0.05 of the image at the
finest level); a box with a coordinate within ``ANCHOR_MARGIN`` of 0 or 1 is invalid (never selected).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

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


#: A selection's heads: cells [B, N, C] and their validity [B, N, 1] (None without one) → their features
#: [B, N, C'] and class logits [B, N, K], row by row.
CellScore = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


def gather_cells(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, S, D] at the cells index [B, Q] → [B, Q, D]. A channel-first ``values`` (a transposed view of
    [B, D, S], as a training step's decoder hands its memory over) is read in that layout, so that its gradient
    (zeros but at the Q cells) is laid out as the value projections' gradients it is summed with: torch's sum of
    two [B, S, D] tensors in different layouts is several times slower than in one."""
    if not values.is_contiguous() and values.transpose(1, 2).is_contiguous():
        channels_first = values.transpose(1, 2)
        return channels_first.gather(2, index[:, None].expand(-1, channels_first.shape[1], -1)).transpose(1, 2)
    return values.gather(1, index[..., None].expand(-1, -1, values.shape[-1]))


def select_cells(score: CellScore, memory: torch.Tensor, count: int, *, valid: torch.Tensor | None = None,
                 skip_invalid: bool = False, trained: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two-stage query selection: the ``count`` cells of ``memory`` [B, S, C] whose best class logit
    (:data:`CellScore` ``score``) is highest → their index [B, Q], features [B, Q, C'] and class logits [B, Q, K].
    ``valid`` [1 or B, S, 1] (bool, or 1.0 and 0.0) goes to ``score`` with the cells; with ``skip_invalid`` an
    invalid cell is never selected.

    Only the selected rows reach a loss, so with ``trained`` (a training step) the pass over all S cells (which
    cells) runs without gradients and the selected rows run ``score`` again with them: the same values, and the
    backward covers Q rows instead of S, of which S − Q had zero gradients."""
    with torch.no_grad() if trained else contextlib.nullcontext():
        features, logits = score(memory, valid)
        best = logits.max(-1).values  # [B, S]
        if skip_invalid and valid is not None:
            best = best.masked_fill(valid[..., 0].logical_not(), float("-inf"))
        index = best.topk(count, dim=1).indices
    if not trained:
        return index, gather_cells(features, index), gather_cells(logits, index)
    rows_valid = None if valid is None else gather_cells(valid.expand(memory.shape[0], -1, -1), index)
    return index, *score(gather_cells(memory, index), rows_valid)
