"""The kernels that compute a paper's operation another way: the same values (to float rounding), faster on the
CPU or exportable without an operator, so that the model files read as their papers and call these where a choice
of kernel is made.

- :func:`dropout`: ``F.dropout`` whose CPU mask is drawn as 31-bit random integers (every transformer's dropout,
  :class:`detr.models.layers.attention.Dropout`).
- :func:`cpu_float32_training`: whether a computation is one these CPU training kernels are for.
- :func:`stage_layout` and :func:`strided_pointwise_conv`: a ResNet training step on the CPU (the frozen stages
  in NHWC, a stage's strided 1 × 1 shortcut as an unstrided one on every s-th pixel;
  :class:`detr.models.backbone.Backbone`).
- :func:`depthwise_conv_nhwc`: a training step's depthwise 5 × 5 convolution (D-FINE's HGNetV2) in NHWC, whose
  backward oneDNN runs several times faster there; a wide 3 × 3 convolution by Winograd's F(4 × 4, 3 × 3) is
  :mod:`detr.models.layers.winograd` (both chosen by :func:`detr.models.layers.conv_norm.training_conv`).
- :func:`bilinear_gather` and :func:`embedding_bag_sampling`: multi-scale deformable attention's bilinear sampling
  without ``grid_sample`` (four index gathers: exports for runtimes without a correct ``GridSample``; one weighted
  ``embedding_bag`` over every level, point and neighbouring cell: the fastest forward in PyTorch), chosen by
  :func:`detr.models.layers.deformable_attention.deformable_sampling`.

Measured figures are in docs/measurements/speed.md and docs/models/deformable.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

#: (height, width) of each feature level, finest first (as
#: :data:`detr.models.layers.deformable_attention.SpatialShapes`).
SpatialShapes = Sequence[tuple[int, int]]


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout``: each element zeroed with probability ``p``, the others scaled by 1 / (1 - p). On the CPU the
    mask is drawn as 31-bit random integers, an element kept where its integer is at least p · 2³¹ (p exact to
    2⁻³¹), half the time of torch's Bernoulli draw, which took 7 % of a DETR-R50 training step there
    (docs/measurements/speed.md); on a GPU ``F.dropout``, whose kernel draws and masks in one pass."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    keep = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_() >= round(p * 2**31)
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


def cpu_float32_training(x: torch.Tensor) -> bool:
    """Whether ``x`` enters a computation whose CPU training kernels this module and
    :mod:`detr.models.layers.winograd` choose: on the CPU, float32, gradients on, no autocast."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu"))


def stage_layout(stage: nn.Module, features: torch.Tensor, frozen_nhwc: bool) -> tuple[torch.Tensor, bool]:
    """A ResNet training step on the CPU: the frozen stages ahead of the first trained one (the paper's stem and
    layer1) run in NHWC, where oneDNN's pooling and convolutions are faster; the first trained stage gets NCHW
    back, whose weight gradients are the faster ones on CPUs without AMX (docs/measurements/speed.md, "Training
    step against the authors"). features [B, C, H, W] ahead of ``stage``, ``frozen_nhwc``: whether the stages so
    far ran in NHWC → the features in the layout ``stage`` runs in, and whether it is NHWC. Each conversion is a
    no-op but the first (none where the stem trains); after the last stage the caller makes the features
    contiguous if this still says NHWC."""
    if not frozen_nhwc:
        return features, False
    if any(parameter.requires_grad for parameter in stage.parameters()):
        return features.contiguous(), False
    return features.contiguous(memory_format=torch.channels_last), True


def strided_pointwise_conv(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                           ) -> torch.Tensor | None:
    """A strided 1 × 1 convolution (a ResNet stage's shortcut) with ``weight`` and ``bias`` on the CPU, as an
    unstrided one on every s-th pixel: the same product, whose forward and backward oneDNN runs faster there
    (docs/measurements/speed.md). x [B, C, H, W] → [B, C', ⌈H / s⌉, ⌈W / s⌉]; None for any other convolution
    or device (the caller runs it as it is)."""
    if x.device.type != "cpu" or conv.kernel_size != (1, 1) or conv.padding != (0, 0) or conv.stride == (1, 1):
        return None
    rows, columns = conv.stride
    return F.conv2d(x[..., ::rows, ::columns], weight, bias, 1, 0, conv.dilation, conv.groups)


def depthwise_conv_nhwc(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                        ) -> torch.Tensor | None:
    """A depthwise convolution of kernel 5 or more and stride 1 with ``weight`` and ``bias`` in a training step on
    the CPU, run in NHWC and handed back in NCHW: the same product, whose backward oneDNN runs several times faster
    in NHWC (2 × 64 × 40 × 40, 5 × 5, 2 threads: 14.8 against 2.1 ms forward and backward with both conversions:
    benchmarks/convolutions.py); its forward alone is no faster, so inference keeps NCHW. None for any other
    convolution, device or layout (an NHWC ``x`` runs in NHWC anyway: the caller runs it as it is)."""
    if (x.device.type != "cpu" or not torch.is_grad_enabled() or not x.is_contiguous() or conv.groups == 1
            or not conv.groups == conv.in_channels == conv.out_channels or conv.stride != (1, 1)
            or min(conv.kernel_size) < 5):
        return None
    nhwc = x.contiguous(memory_format=torch.channels_last)
    return conv._conv_forward(nhwc, weight, bias).contiguous()


def bilinear_gather(level_value: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
    """``grid_sample(level_value, 2 · locations − 1, "bilinear", padding_mode="zeros", align_corners=False)``
    as four gathers (the "gather" kernel: an export without ``GridSample``): level_value [N, D, h, w], locations
    [N, Q, P, 2] (x, y) in [0, 1] → [N, D, Q, P] (or any two middle dimensions, as grid_sample:
    :func:`detr.models.layers.deformable_attention.deformable_sampling` passes [N, P, Q, 2]).

    The map gets a border of zeros one cell wide, so a neighbour outside the map reads 0 (any farther one is
    clamped onto that border) and no mask is needed."""
    count, channels, height, width = level_value.shape
    _, queries, points, _ = locations.shape
    padded = F.pad(level_value, (1, 1, 1, 1)).flatten(2)  # [N, D, (h + 2)·(w + 2)]
    x = locations[..., 0] * width - 0.5  # pixel centres at integers (align_corners=False)
    y = locations[..., 1] * height - 0.5
    x0, y0 = x.floor(), y.floor()
    fx, fy = x - x0, y - y0
    column = (x0 + 1).to(torch.int64)  # in the padded map
    row = (y0 + 1).to(torch.int64)
    output = level_value.new_zeros(count, channels, queries, points)
    for dy, weight_y in ((0, 1 - fy), (1, fy)):
        rows = (row + dy).clamp(0, height + 1) * (width + 2)
        for dx, weight_x in ((0, 1 - fx), (1, fx)):
            index = (rows + (column + dx).clamp(0, width + 1)).reshape(count, 1, queries * points)
            cells = padded.gather(2, index.expand(count, channels, queries * points))
            output = output + cells.view(count, channels, queries, points) * (weight_y * weight_x).unsqueeze(1)
    return output


def _bag_constants(spatial_shapes: SpatialShapes, points_per_level: Sequence[int], *, device: torch.device,
                   dtype: torch.dtype, index_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """What :func:`embedding_bag_sampling` reads per point [ΣP, ...] in a table whose levels have a border of zeros
    one cell wide: its level's (w, h) and (w − 1, h − 1) in ``dtype``; the row of its level's cell (0, 0) within one
    head's table, and its level's bordered row length (w + 2), in ``index_dtype``."""
    first_cells, row_lengths, sizes = [], [], []
    start = 0
    for (height, width), count in zip(spatial_shapes, points_per_level):
        first_cells += [start + (width + 2) + 1] * count  # (0, 0) is one row and one column into the border
        row_lengths += [width + 2] * count
        sizes += [(width, height)] * count
        start += (height + 2) * (width + 2)
    size = torch.tensor(sizes, dtype=dtype, device=device)
    return (size, size - 1, torch.tensor(first_cells, dtype=index_dtype, device=device),
            torch.tensor(row_lengths, dtype=index_dtype, device=device))


def _bordered_table(value: torch.Tensor, spatial_shapes: SpatialShapes) -> torch.Tensor:
    """value [B, S, H, D] → rows [B·H·Σ (h + 2)(w + 2), D]: per image and head, each level's map with a border of
    zeros one cell wide, levels one after another. Each map is copied once, into the inside of its bordered block
    of a zeroed table (padding then concatenating copies every map twice)."""
    batch, _, heads, head_dim = value.shape
    levels = value.split([height * width for height, width in spatial_shapes], dim=1)
    blocks = [(height + 2) * (width + 2) for height, width in spatial_shapes]
    table = value.new_zeros(batch, heads, sum(blocks), head_dim)
    start = 0
    for level, block, (height, width) in zip(levels, blocks, spatial_shapes):
        inside = table[:, :, start:start + block].view(batch, heads, height + 2, width + 2, head_dim)[:, :, 1:-1, 1:-1]
        inside.copy_(level.view(batch, height, width, heads, head_dim).permute(0, 3, 1, 2, 4))
        start += block
    return table.view(-1, head_dim)


def embedding_bag_sampling(value: torch.Tensor, spatial_shapes: SpatialShapes, locations: torch.Tensor,
                           weights: torch.Tensor, points_per_level: Sequence[int],
                           method: Literal["bilinear", "discrete"]) -> torch.Tensor:
    """The sampling and the weighted sum in one ``embedding_bag`` (the "embedding_bag" kernel): the value's maps,
    each with a border of zeros, are a table of rows of D; each (image, query, head) is a bag of the cells its
    points read (the four neighbours of each point for "bilinear", the nearest cell for "discrete"), each weighted
    by its attention weight times its bilinear weight. A neighbour outside the map reads the border (zero:
    grid_sample's padding); a point farther out than one cell gets weight 0. value [B, S, H, D], locations
    [B, Q, H, ΣP, 2] (x, y) in [0, 1], weights [B, Q, H, ΣP] → [B, Q, H·D]; nothing of size [·, D, Q, ΣP] is
    built."""
    batch, _, heads, head_dim = value.shape
    queries = locations.shape[1]
    table = _bordered_table(value, spatial_shapes)
    head_rows = table.shape[0] // (batch * heads)  # Σ (h + 2)(w + 2)
    index_dtype = torch.int32 if table.shape[0] < 2**31 else torch.int64  # int32: half the index arithmetic's bytes
    size, last, first_cell, row_length = _bag_constants(spatial_shapes, points_per_level, device=value.device,
                                                        dtype=locations.dtype, index_dtype=index_dtype)
    first_row = (torch.arange(batch, dtype=index_dtype, device=value.device).view(batch, 1, 1, 1) * heads
                 + torch.arange(heads, dtype=index_dtype, device=value.device).view(1, 1, heads, 1)) * head_rows
    first_row = first_row + first_cell  # [B, 1, H, ΣP]: the row of cell (0, 0) of each point's level
    if method == "discrete":  # the cell holding each location, int(x · w + 0.5) truncated, clamped into the map
        cell = torch.minimum(torch.addcmul(torch.full_like(size, 0.5), locations, size).nan_to_num_(0.0)
                             .clamp_(min=0), last).to(index_dtype)
        index = (cell[..., 1] * row_length + cell[..., 0] + first_row)[..., None]
        cell_weights = weights[..., None]
    else:
        xy = torch.addcmul(torch.full_like(size, -0.5), locations, size)  # pixel centres at integers
        corner = xy.floor()
        fraction = xy - corner
        near = ((corner >= -1) & (corner <= last)).all(-1)  # a neighbour in the map: else every one reads 0
        corner = torch.minimum(corner.nan_to_num_(-1.0).clamp_(min=-1), last).to(index_dtype)
        top_left = corner[..., 1] * row_length + corner[..., 0] + first_row
        offsets = torch.stack((torch.zeros_like(row_length), torch.ones_like(row_length), row_length,
                               row_length + 1), -1)  # top-left, top-right, bottom-left, bottom-right
        index = top_left[..., None] + offsets
        weight_y = torch.stack((1 - fraction[..., 1], fraction[..., 1]), -1) * (weights * near)[..., None]
        weight_x = torch.stack((1 - fraction[..., 0], fraction[..., 0]), -1)
        cell_weights = (weight_y[..., :, None] * weight_x[..., None, :]).flatten(-2)
    bags = batch * queries * heads
    output = F.embedding_bag(index.reshape(bags, -1), table, mode="sum",
                             per_sample_weights=cell_weights.reshape(bags, -1).to(table.dtype))
    return output.view(batch, queries, heads * head_dim)
