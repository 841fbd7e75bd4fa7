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

The sampling has three kernels with the same result (to float rounding): ``grid_sample`` per level, then the
samples weighted and summed (the authors' PyTorch form); ``"gather"``, the four neighbouring cells read by index
from the map padded with a border of zeros and mixed with their bilinear weights: an export without
``GridSample`` for runtimes that lack a correct one (TensorRT's has been wrong, NVIDIA/TensorRT#4646); and
``"embedding_bag"``, every level's, point's and neighbour's cell read and weighted in one
:func:`torch.nn.functional.embedding_bag` with the attention weights folded into the bilinear ones, which never
builds the [·, D, Q, L·P] samples (5 to 7× faster than grid_sample on the encoder's 18k queries on a CPU,
benchmarks/deformable_attention.py; its backward is slower than grid_sample's). The default, ``"auto"``, is
"embedding_bag" when no gradient is asked for (inference, validation) and grid_sample otherwise; exports write
grid_sample or the gathers (:func:`detr.checkpoints.export.prepare_for_export`). :func:`use_bilinear_kernel`
switches a model's modules. The two kernels other than grid_sample are in :mod:`detr.models.layers.cpu_kernels`.

D-FINE (Peng et al. 2024) adds two more: a point count per level (``num_points=(3, 6, 3)``: more points on the
middle level) with offsets scaled by 1 / that level's count, and no value or output projection
(``projections=False``: the decoder reads the encoder's memory as it is).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.cpu_kernels import bilinear_gather, embedding_bag_sampling
from detr.models.size_constants import SizeConstants

#: (height, width) of each feature level, finest first.
SpatialShapes = list[tuple[int, int]]
#: How a sampling location reads its level: "bilinear" (grid_sample, the papers' default) or "discrete" (the
#: nearest cell, clamped to the map: RT-DETRv2's option).
SamplingMethod = Literal["bilinear", "discrete"]
#: How the sampling is computed (the same values to float rounding): torch's ``grid_sample`` per level, four index
#: gathers per level (no GridSample in an export), one weighted ``embedding_bag`` over every level, point and
#: neighbouring cell with the attention weights folded in (the fastest forward in PyTorch), or "auto": the
#: embedding bag when no gradient is needed, else grid_sample (whose backward is faster).
BilinearKernel = Literal["auto", "grid_sample", "gather", "embedding_bag"]
BILINEAR_KERNELS: tuple[str, ...] = ("auto", "grid_sample", "gather", "embedding_bag")


def _nearest_cells(level_value: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
    """level_value [N, D, h, w], locations [N, Q, P, 2] (x, y) in [0, 1] → [N, D, Q, P] (or any two middle
    dimensions: :func:`deformable_sampling` passes [N, P, Q, 2]): the value of the cell that holds each location
    (``int(x · w + 0.5)``, truncated toward zero, then clamped into the map, as RT-DETRv2's discrete sampling)."""
    count, channels, height, width = level_value.shape
    _, queries, points, _ = locations.shape
    cells = (locations * torch.tensor([width, height], dtype=locations.dtype, device=locations.device) + 0.5
             ).to(torch.int64)
    column = cells[..., 0].clamp(0, width - 1)
    row = cells[..., 1].clamp(0, height - 1)
    # reshape, not view: a level's locations are a strided split of the caller's [B·H, ΣP, Q, 2]
    index = (row * width + column).reshape(count, 1, queries * points).expand(count, channels, queries * points)
    return level_value.flatten(2).gather(2, index).view(count, channels, queries, points)


def deformable_sampling(value: torch.Tensor, spatial_shapes: SpatialShapes, sampling_locations: torch.Tensor,
                        attention_weights: torch.Tensor, method: SamplingMethod = "bilinear",
                        points_per_level: Sequence[int] | None = None,
                        kernel: BilinearKernel = "auto") -> torch.Tensor:
    """The attention's core: sample ``value`` at the locations and sum with the weights.

    value [B, S, H, D] (the levels flattened and concatenated, finest first); sampling_locations
    [B, Q, H, L, P, 2] as (x, y) in [0, 1] of each level's map; attention_weights [B, Q, H, L, P]
    (summing to 1 over L × P) → [B, Q, H·D]. With ``points_per_level`` (a count per level, D-FINE's), the
    points of every level are concatenated instead: locations [B, Q, H, ΣP, 2], weights [B, Q, H, ΣP].
    "bilinear": locations outside the map read zeros; "discrete": the nearest cell inside the map. ``kernel``
    (the same values, see :data:`BilinearKernel`): "grid_sample" or "gather" per level, "embedding_bag" for all
    at once, "auto" the embedding bag unless a gradient is needed.
    """
    batch, _, heads, head_dim = value.shape
    if points_per_level is None:  # one count for every level: the same points, concatenated level by level
        points_per_level = [sampling_locations.shape[4]] * sampling_locations.shape[3]
        sampling_locations, attention_weights = sampling_locations.flatten(3, 4), attention_weights.flatten(3, 4)
    if kernel == "auto":
        needs_gradient = torch.is_grad_enabled() and any(
            tensor.requires_grad for tensor in (value, sampling_locations, attention_weights))
        kernel = "grid_sample" if needs_gradient else "embedding_bag"
    if kernel == "embedding_bag":
        return embedding_bag_sampling(value, spatial_shapes, sampling_locations, attention_weights,
                                       points_per_level, method)
    queries, total_points = sampling_locations.shape[1], sampling_locations.shape[3]
    # One layout change for every level, each level a view of it (the kernels read strided maps): value [B, S, H, D]
    # → [B·H, D, S], locations [B, Q, H, ΣP, 2] → [B·H, ΣP, Q, 2] (grid_sample's [-1, 1] for "bilinear"). The
    # points come before the queries, so that the samples [B·H, D, ΣP, Q] are weighted and summed over the points
    # with the queries innermost: torch's product, sum and their gradients run several times slower over a run of
    # a few points
    value = value.permute(0, 2, 3, 1).reshape(batch * heads, head_dim, -1)
    locations = sampling_locations.movedim(1, 3).reshape(batch * heads, total_points, queries, 2)
    grid_sample = method == "bilinear" and kernel == "grid_sample"
    if grid_sample:
        locations = 2 * locations - 1
    values = value.split([height * width for height, width in spatial_shapes], dim=2)
    level_locations = locations.split(list(points_per_level), dim=1)
    sampled = []
    for level, (height, width) in enumerate(spatial_shapes):
        level_value = values[level].view(batch * heads, head_dim, height, width)
        if method == "discrete":
            sampled.append(_nearest_cells(level_value, level_locations[level]))  # [B·H, D, P_l, Q]
        elif kernel == "gather":
            sampled.append(bilinear_gather(level_value, level_locations[level]))
        else:  # a contiguous grid: torch's CPU kernel reads a strided one 2-3 times slower, forward and backward
            sampled.append(F.grid_sample(level_value, level_locations[level].contiguous(), mode="bilinear",
                                         padding_mode="zeros", align_corners=False))  # [B·H, D, P_l, Q]
    weights = attention_weights.movedim(1, 3).reshape(batch * heads, 1, total_points, queries)
    output = (torch.cat(sampled, dim=2) * weights).sum(2)  # [B·H, D, Q]
    return output.view(batch, heads * head_dim, queries).transpose(1, 2).contiguous()


def _point_levels(points_per_level: tuple[int, ...], *, device: torch.device, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A point count per level → each point's level int64 [ΣP] and its offsets' scale 1 / that count [ΣP, 1]."""
    level_of_point = torch.cat([torch.full((count,), level, device=device)
                                for level, count in enumerate(points_per_level)])
    scale = torch.cat([torch.full((count, 1), 1.0 / count, dtype=dtype, device=device) for count in points_per_level])
    return level_of_point, scale


def pad_points(locations: torch.Tensor, weights: torch.Tensor, points_per_level: Sequence[int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-level point counts → the common layout: locations [B, Q, H, ΣP, 2] and weights [B, Q, H, ΣP] →
    [B, Q, H, L, max P, 2] and [B, Q, H, L, max P], the missing points of a level at its first point with
    weight 0 (so that readers of the sampling points, which take one count for every level, see nothing there)."""
    most = max(points_per_level)
    padded_locations, padded_weights = [], []
    for level_locations, level_weights in zip(locations.split(list(points_per_level), dim=3),
                                              weights.split(list(points_per_level), dim=3)):
        missing = most - level_locations.shape[3]
        padded_locations.append(torch.cat([level_locations, level_locations[:, :, :, :1].expand(
            -1, -1, -1, missing, -1)], dim=3))
        padded_weights.append(F.pad(level_weights, (0, missing)))
    return torch.stack(padded_locations, dim=3), torch.stack(padded_weights, dim=3)


class MultiScaleDeformableAttention(nn.Module):
    """Deformable attention over L feature levels (the encoder's self-attention, the decoder's cross-attention).

    Args:
        hidden_dim: C. num_heads: H (C must divide by it). num_levels: L. num_points: P per head and level, or
            one count per level (D-FINE's ``(3, 6, 3)``; then the reference must be a box).
        offset_scale: around a box, the offsets are in units of ``offset_scale`` × its size / P (0.5: half
            the box, Deformable DETR's; RT-DETRv2 makes it an option).
        sampling_method: "bilinear" (grid_sample) or "discrete" (the nearest cell; RT-DETRv2's option).
        projections: the value and output projections (``value_proj``, ``output_proj``); D-FINE has neither.

    Attributes:
        bilinear_kernel: how the sampling is computed, "auto" (default), "grid_sample", "gather" or
            "embedding_bag" (the same values: :data:`BilinearKernel`; set by :func:`use_bilinear_kernel`).
    """

    def __init__(self, hidden_dim: int = 256, num_heads: int = 8, num_levels: int = 4,
                 num_points: int | Sequence[int] = 4, *, offset_scale: float = 0.5,
                 sampling_method: SamplingMethod = "bilinear", projections: bool = True) -> None:
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(f"hidden_dim {hidden_dim} must divide by num_heads {num_heads}")
        if sampling_method not in ("bilinear", "discrete"):
            raise ValueError(f"sampling_method must be 'bilinear' or 'discrete', got {sampling_method!r}")
        points = (num_points,) * num_levels if isinstance(num_points, int) else tuple(num_points)
        if len(points) != num_levels or min(points) < 1:
            raise ValueError(f"num_points must be a count >= 1 or one per level ({num_levels}), got {num_points}")
        #: the sampling points of each level; num_points: their count when every level has the same, else None
        self.points_per_level = points
        self.num_points = points[0] if len(set(points)) == 1 else None
        self.hidden_dim, self.num_heads, self.num_levels = hidden_dim, num_heads, num_levels
        self.offset_scale, self.sampling_method = offset_scale, sampling_method
        self.bilinear_kernel: BilinearKernel = "auto"
        self.point_levels = SizeConstants(_point_levels)
        self.sampling_offsets = nn.Linear(hidden_dim, num_heads * sum(points) * 2)
        self.attention_weights = nn.Linear(hidden_dim, num_heads * sum(points))
        self.value_proj = nn.Linear(hidden_dim, hidden_dim) if projections else None
        self.output_proj = nn.Linear(hidden_dim, hidden_dim) if projections else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The authors' initialisation: offsets start as rays in H directions, point k of each level at distance
        k (in cells of each level), uniform weights."""
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        thetas = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(self.num_heads, 1, 2)
        distances = torch.cat([torch.arange(1, count + 1, dtype=torch.float32) for count in self.points_per_level])
        self.sampling_offsets.bias.copy_((grid * distances[None, :, None]).view(-1))
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        for projection in (self.value_proj, self.output_proj):
            if projection is not None:
                nn.init.xavier_uniform_(projection.weight)
                nn.init.constant_(projection.bias, 0.0)

    def sampling(self, query: torch.Tensor, reference_points: torch.Tensor, spatial_shapes: SpatialShapes
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each query samples and with which weights.

        query [B, Q, C] (with its position added); reference_points [B, Q, L, 2] as (x, y), or [B, Q, L, 4]
        as boxes (cx, cy, w, h), normalised to each level's padded map → sampling_locations
        [B, Q, H, L, P, 2] (x, y) and attention_weights [B, Q, H, L, P] (with a count per level:
        [B, Q, H, ΣP, 2] and [B, Q, H, ΣP], the levels' points concatenated). Around a point the offsets are in
        cells of each level; around a box, in fractions of ``offset_scale`` × its size per point (the refinement's
        form; half its size by default).
        """
        batch, queries, _ = query.shape
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        if points is None:
            return self._sampling_per_level_counts(query, reference_points)
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
            raise ValueError(f"reference_points must end in 2 (points) or 4 (boxes), "
                             f"got {tuple(reference_points.shape)}")
        return locations, weights

    def _sampling_per_level_counts(self, query: torch.Tensor, reference_points: torch.Tensor
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sampling` with a point count per level (D-FINE's): around a box only, each point's offset
        times 1 / its level's count → locations [B, Q, H, ΣP, 2], weights [B, Q, H, ΣP]."""
        if reference_points.shape[-1] != 4:
            raise ValueError("a point count per level samples around boxes: reference_points must end in 4, got "
                             f"{tuple(reference_points.shape)}")
        batch, queries, _ = query.shape
        total = sum(self.points_per_level)
        offsets = self.sampling_offsets(query).view(batch, queries, self.num_heads, total, 2)
        weights = self.attention_weights(query).view(batch, queries, self.num_heads, total).softmax(-1)
        level_of_point, scale = self.point_levels(self.points_per_level, device=query.device, dtype=query.dtype)
        if reference_points.shape[2] == 1:  # one box for every level (RT-DETR's decoders): broadcast it
            boxes = reference_points[:, :, None]  # [B, Q, 1, 1, 4]
        else:
            boxes = reference_points[:, :, None, level_of_point]  # [B, Q, 1, ΣP, 4]
        return boxes[..., :2] + offsets * scale * boxes[..., 2:] * self.offset_scale, weights

    def forward(self, query: torch.Tensor, reference_points: torch.Tensor, value: torch.Tensor,
                spatial_shapes: SpatialShapes, padding_mask: torch.Tensor | None = None,
                return_sampling: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """query [B, Q, C] (position included), reference_points [B, Q, L, 2 or 4] (see :meth:`sampling`),
        value [B, S, C] (the flattened levels), padding_mask bool [B, S] (True = padding: reads zero) →
        output [B, Q, C] and, if ``return_sampling``, (sampling_locations [B, Q, H, L, P, 2],
        attention_weights [B, Q, H, L, P]) else None; with a count per level, P is the largest and a level's
        missing points have weight 0 (:func:`pad_points`)."""
        batch, length, _ = value.shape
        if length != sum(height * width for height, width in spatial_shapes):
            raise ValueError(f"value has {length} positions but the spatial shapes {spatial_shapes} hold "
                             f"{sum(h * w for h, w in spatial_shapes)}")
        if self.value_proj is not None:
            value = _project(self.value_proj, value)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        value = value.view(batch, length, self.num_heads, self.hidden_dim // self.num_heads)
        locations, weights = self.sampling(query, reference_points, spatial_shapes)
        per_level = self.points_per_level if self.num_points is None else None
        output = deformable_sampling(value, spatial_shapes, locations, weights, self.sampling_method, per_level,
                                     self.bilinear_kernel)
        if self.output_proj is not None:
            output = self.output_proj(output)
        if return_sampling and per_level is not None:
            locations, weights = pad_points(locations, weights, per_level)
        return output, ((locations, weights) if return_sampling else None)


def _project(projection: nn.Linear, value: torch.Tensor) -> torch.Tensor:
    """``projection(value)``, value [B, S, C]. A channel-first value (a transposed view of [B, C, S], as a training
    step's decoder hands its memory over) is projected in that layout, as a 1 × 1 convolution over the S cells, so
    that the sampling's [B·H, D, S] maps stay views of it (``F.linear`` would copy it to [B, S, C] first, and the
    sampling copy the result back)."""
    if value.is_contiguous() or not value.transpose(1, 2).is_contiguous():
        return projection(value)
    return F.conv1d(value.transpose(1, 2), projection.weight[:, :, None], projection.bias).transpose(1, 2)


def use_bilinear_kernel(model: nn.Module, kernel: BilinearKernel) -> int:
    """Compute every :class:`MultiScaleDeformableAttention` of ``model`` with ``kernel`` (one of
    :data:`BILINEAR_KERNELS`: the same values); returns how many modules there are (0: the model has no
    deformable attention)."""
    if kernel not in BILINEAR_KERNELS:
        raise ValueError(f"bilinear kernel must be one of {', '.join(BILINEAR_KERNELS)}, got {kernel!r}")
    modules = [module for module in model.modules() if isinstance(module, MultiScaleDeformableAttention)]
    for module in modules:
        module.bilinear_kernel = kernel
    return len(modules)
