"""D-FINE's parts of the hybrid encoder (Peng et al. 2024; the authors' ``src/zoo/dfine/hybrid_encoder.py``).

D-FINE keeps RT-DETR's hybrid encoder (:class:`detr.models.rtdetr.hybrid_encoder.HybridEncoder`: input
projection, AIFI on the coarsest map, top-down then bottom-up fusion) and changes three of its parts, which it
takes as arguments: the fusion blocks are :class:`RepNCSPELAN4` (GELAN, from YOLOv9: a 1×1 convolution split in
two halves, two chained CSP-RepVGG branches on one half, everything concatenated and mixed by a 1×1), the
stride-2 downsampling is :class:`SCDown` (1×1 then a depthwise 3×3 stride 2, from YOLOv10), and the lateral 1×1
convolutions have no activation.

Parameter names are the authors': ``fpn_blocks.{i}`` / ``pan_blocks.{i}``: ``cv1``, ``cv2.0`` (a CSP layer:
``conv1``, ``conv2``, ``bottlenecks.{j}.{conv1,conv2}``), ``cv2.1``, ``cv3.0``, ``cv3.1``, ``cv4``;
``downsample_convs.{i}.0.{cv1,cv2}``.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.models.rtdetr.hybrid_encoder import CSPRepLayer, HybridEncoder
from detr.models.rtdetr.resnet_vd import ConvNorm


class RepNCSPELAN4(nn.Module):
    """GELAN fusion: ``cv1`` (1×1, SiLU) to 2 · hidden channels split in halves a, b; ``cv2`` (CSP-RepVGG of b →
    ``branch`` channels, then 3×3) gives c, ``cv3`` (the same on c) gives d; ``cv4`` (1×1, SiLU) mixes
    [a, b, c, d] to ``out_channels``.

    Args:
        in_channels: the concatenated maps' channels (2 · hidden). out_channels: hidden. branch_channels:
            ``round(expansion · hidden / 2)``. num_blocks: RepVGG blocks per CSP layer (``round(3 · depth_mult)``).
    """

    def __init__(self, in_channels: int, out_channels: int, branch_channels: int, num_blocks: int) -> None:
        super().__init__()
        self.half = in_channels // 2
        silu = nn.SiLU
        self.cv1 = ConvNorm(in_channels, in_channels, 1, activation=silu())
        self.cv2 = nn.Sequential(CSPRepLayer(self.half, branch_channels, num_blocks),
                                 ConvNorm(branch_channels, branch_channels, 3, activation=silu()))
        self.cv3 = nn.Sequential(CSPRepLayer(branch_channels, branch_channels, num_blocks),
                                 ConvNorm(branch_channels, branch_channels, 3, activation=silu()))
        self.cv4 = ConvNorm(in_channels + 2 * branch_channels, out_channels, 1, activation=silu())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).split((self.half, self.half), dim=1))
        parts.append(self.cv2(parts[-1]))
        parts.append(self.cv3(parts[-1]))
        return self.cv4(torch.cat(parts, dim=1))


class SCDown(nn.Module):
    """Spatial-channel decoupled downsampling: ``cv1`` (1×1) then ``cv2`` (depthwise 3×3, stride 2), no
    activation."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.cv1 = ConvNorm(channels, channels, 1)
        self.cv2 = ConvNorm(channels, channels, 3, 2, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


def dfine_hybrid_encoder(in_channels: list[int], hidden_dim: int, *, num_heads: int, dim_feedforward: int,
                         num_layers: int, dropout: float, expansion: float, depth_multiplier: float
                         ) -> HybridEncoder:
    """RT-DETR's hybrid encoder with D-FINE's fusion blocks, SCDown and linear lateral convolutions."""
    branch, blocks = round(expansion * hidden_dim // 2), round(3 * depth_multiplier)
    return HybridEncoder(
        in_channels, hidden_dim, num_heads=num_heads, dim_feedforward=dim_feedforward, num_layers=num_layers,
        dropout=dropout, lateral_activation=False,
        fusion_block=lambda: RepNCSPELAN4(hidden_dim * 2, hidden_dim, branch, blocks),
        downsample=lambda: nn.Sequential(SCDown(hidden_dim)))
