"""Multi-scale deformable attention (Zhu et al., "Deformable DETR", ICLR 2021, §4.1, eq. 3), in PyTorch.

Each query attends to ``num_points`` sampled locations per head and per feature level, placed around its
reference point by learned offsets, and mixes them with learned weights (softmax over levels × points)
instead of attending to every position. The sampling is bilinear (:func:`torch.nn.functional.grid_sample`,
``align_corners=False``, zero padding), as the authors' ``ms_deform_attn_core_pytorch``: correct on CPU and
GPU and exportable to ONNX (``GridSample``, opset 16), at the cost of the authors' CUDA kernel's speed.

Shapes: B images, Q queries, S = Σ h_l·w_l flattened positions over the L levels, H heads, P points,
C = hidden size, D = C / H per head. Positions are normalised to [0, 1] of the padded feature map.

The parameters are named as the authors' ``MSDeformAttn`` and transformers'
``DeformableDetrMultiscaleDeformableAttention``: ``sampling_offsets``, ``attention_weights``,
``value_proj``, ``output_proj``.

RT-DETRv2 (Lv et al. 2024) adds two options used by RT-DETR's decoder: the scale of the offsets around a
box (``offset_scale``, 0.5 in Deformable DETR and by default) and a "discrete" sampling that reads the nearest
cell instead of interpolating (``sampling_method="discrete"``: a gather, which deploys without grid_sample).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

#: (height, width) of each feature level, finest first.
SpatialShapes = list[tuple[int, int]]
#: How a sampling location reads its level: "bilinear" (grid_sample, the papers' default) or "discrete" (the
#: nearest cell, clamped to the map: RT-DETRv2's option).
SamplingMethod = Literal["bilinear", "discrete"]


def _nearest_cells(level_value: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
    """level_value [N, D, h, w], locations [N, Q, P, 2] (x, y) in [0, 1] → [N, D, Q, P]: the value of the cell
    that holds each location (``int(x · w + 0.5)``, truncated toward zero, then clamped into the map, as
    RT-DETRv2's discrete sampling)."""
    count, channels, height, width = level_value.shape
    _, queries, points, _ = locations.shape
    cells = (locations * torch.tensor([width, height], dtype=locations.dtype, device=locations.device) + 0.5
             ).to(torch.int64)
    column = cells[..., 0].clamp(0, width - 1)
    row = cells[..., 1].clamp(0, height - 1)
    index = (row * width + column).view(count, 1, queries * points).expand(count, channels, queries * points)
    return level_value.flatten(2).gather(2, index).view(count, channels, queries, points)


def deformable_sampling(value: torch.Tensor, spatial_shapes: SpatialShapes, sampling_locations: torch.Tensor,
                        attention_weights: torch.Tensor, method: SamplingMethod = "bilinear") -> torch.Tensor:
    """The attention's core: sample ``value`` at the locations and sum with the weights.

    value [B, S, H, D] (the levels flattened and concatenated, finest first); sampling_locations
    [B, Q, H, L, P, 2] as (x, y) in [0, 1] of each level's map; attention_weights [B, Q, H, L, P]
    (summing to 1 over L × P) → [B, Q, H·D]. "bilinear": locations outside the map read zeros; "discrete":
    the nearest cell inside the map.
    """
    batch, _, heads, head_dim = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    values = value.split([height * width for height, width in spatial_shapes], dim=1)
    grids = 2 * sampling_locations - 1  # grid_sample's [-1, 1]
    sampled = []
    for level, (height, width) in enumerate(spatial_shapes):
        # [B, h·w, H, D] → [B·H, D, h, w]
        level_value = values[level].flatten(2).transpose(1, 2).reshape(batch * heads, head_dim, height, width)
        if method == "discrete":
            level_locations = sampling_locations[:, :, :, level].transpose(1, 2).flatten(0, 1)
            sampled.append(_nearest_cells(level_value, level_locations))  # [B·H, D, Q, P]
            continue
        # [B, Q, H, P, 2] → [B·H, Q, P, 2]
        level_grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(level_value, level_grid, mode="bilinear", padding_mode="zeros",
                                     align_corners=False))  # [B·H, D, Q, P]
    weights = attention_weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    output = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)  # [B·H, D, Q]
    return output.view(batch, heads * head_dim, queries).transpose(1, 2).contiguous()


class MultiScaleDeformableAttention(nn.Module):
    """Deformable attention over L feature levels (the encoder's self-attention, the decoder's cross-attention).

    Args:
        hidden_dim: C. num_heads: H (C must divide by it). num_levels: L. num_points: P per head and level.
        offset_scale: around a box, the offsets are in units of ``offset_scale`` × its size / P (0.5: half
            the box, Deformable DETR's; RT-DETRv2 makes it an option).
        sampling_method: "bilinear" (grid_sample) or "discrete" (the nearest cell; RT-DETRv2's option).
    """

    def __init__(self, hidden_dim: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4, *,
                 offset_scale: float = 0.5, sampling_method: SamplingMethod = "bilinear") -> None:
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(f"hidden_dim {hidden_dim} must divide by num_heads {num_heads}")
        if sampling_method not in ("bilinear", "discrete"):
            raise ValueError(f"sampling_method must be 'bilinear' or 'discrete', got {sampling_method!r}")
        self.hidden_dim, self.num_heads, self.num_levels, self.num_points = hidden_dim, num_heads, num_levels, num_points
        self.offset_scale, self.sampling_method = offset_scale, sampling_method
        self.sampling_offsets = nn.Linear(hidden_dim, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(hidden_dim, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(hidden_dim, hidden_dim)
        self.output_proj = nn.Linear(hidden_dim, hidden_dim)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The authors' initialisation: offsets start as rays in H directions, point k at distance k (in cells of
        each level), uniform weights."""
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        thetas = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(self.num_heads, 1, 1, 2)
        grid = grid.repeat(1, self.num_levels, self.num_points, 1)
        for point in range(self.num_points):
            grid[:, :, point, :] *= point + 1
        self.sampling_offsets.bias.copy_(grid.view(-1))
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        nn.init.xavier_uniform_(self.value_proj.weight)
        nn.init.constant_(self.value_proj.bias, 0.0)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.constant_(self.output_proj.bias, 0.0)

    def sampling(self, query: torch.Tensor, reference_points: torch.Tensor, spatial_shapes: SpatialShapes
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each query samples and with which weights.

        query [B, Q, C] (with its position added); reference_points [B, Q, L, 2] as (x, y), or [B, Q, L, 4]
        as boxes (cx, cy, w, h), normalised to each level's padded map → sampling_locations
        [B, Q, H, L, P, 2] (x, y) and attention_weights [B, Q, H, L, P]. Around a point the offsets are in
        cells of each level; around a box, in fractions of ``offset_scale`` × its size per point (the refinement's
        form; half its size by default).
        """
        batch, queries, _ = query.shape
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        offsets = self.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)
        weights = self.attention_weights(query).view(batch, queries, heads, levels * points)
        weights = weights.softmax(-1).view(batch, queries, heads, levels, points)
        if reference_points.shape[-1] == 2:
            # per level, offsets / (w, h): python sizes rather than a tensor of them, so export traces them
            locations = torch.stack([
                reference_points[:, :, None, level, None, :]
                + torch.stack((offsets[:, :, :, level, :, 0] / width, offsets[:, :, :, level, :, 1] / height), -1)
                for level, (height, width) in enumerate(spatial_shapes)], dim=3)
        elif reference_points.shape[-1] == 4:
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / points * reference_points[:, :, None, :, None, 2:] * self.offset_scale)
        else:
            raise ValueError(f"reference_points must end in 2 (points) or 4 (boxes), got {tuple(reference_points.shape)}")
        return locations, weights

    def forward(self, query: torch.Tensor, reference_points: torch.Tensor, value: torch.Tensor,
                spatial_shapes: SpatialShapes, padding_mask: torch.Tensor | None = None,
                return_sampling: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """query [B, Q, C] (position included), reference_points [B, Q, L, 2 or 4] (see :meth:`sampling`),
        value [B, S, C] (the flattened levels), padding_mask bool [B, S] (True = padding: reads zero) →
        output [B, Q, C] and, if ``return_sampling``, (sampling_locations [B, Q, H, L, P, 2],
        attention_weights [B, Q, H, L, P]) else None."""
        batch, length, _ = value.shape
        if length != sum(height * width for height, width in spatial_shapes):
            raise ValueError(f"value has {length} positions but the spatial shapes {spatial_shapes} hold "
                             f"{sum(h * w for h, w in spatial_shapes)}")
        value = self.value_proj(value)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        value = value.view(batch, length, self.num_heads, self.hidden_dim // self.num_heads)
        locations, weights = self.sampling(query, reference_points, spatial_shapes)
        output = self.output_proj(deformable_sampling(value, spatial_shapes, locations, weights, self.sampling_method))
        return output, ((locations, weights) if return_sampling else None)
