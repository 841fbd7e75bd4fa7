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

DEIMv2 (Huang et al. 2025) changes the fusion again: the two inputs are summed rather than concatenated, the block
is :class:`RepNCSPELAN5` (its CSP layers split one 1×1 convolution instead of running two, and the 3×3 after each
branch moves inside them), and its smallest models replace the whole encoder by :class:`LiteEncoder` (no AIFI).
These blocks carry transformers' parameter names (``Deimv2RepNCSPELAN5``, ``Deimv2LiteEncoder``): the authors'
DEIMv2 files are not read here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.conv_norm import ConvNorm, fresh_sum
from detr.models.rtdetr.hybrid_encoder import CSPRepLayer, HybridEncoder, RepVggBlock


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


class SplitCSPLayer(nn.Module):
    """DEIMv2's CSP layer: ``conv1`` (1×1, SiLU) to 2 · out channels split in a residual half r and a path p;
    ``conv2`` (3×3, SiLU; the identity without ``trailing_conv``, as in the DINOv3 models) of
    ``r + bottlenecks(p)``."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, trailing_conv: bool = True) -> None:
        super().__init__()
        self.conv1 = ConvNorm(in_channels, 2 * out_channels, 1, activation=nn.SiLU())
        self.bottlenecks = nn.Sequential(*[RepVggBlock(out_channels) for _ in range(num_blocks)])
        self.conv2 = ConvNorm(out_channels, out_channels, 3, activation=nn.SiLU()) if trailing_conv else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual, path = self.conv1(x).chunk(2, dim=1)
        return self.conv2(fresh_sum(self.bottlenecks(path), residual))


class RepNCSPELAN5(nn.Module):
    """DEIMv2's GELAN fusion: ``conv1`` (1×1, SiLU) to 2 · channels split in halves a, b; ``csp_rep1`` of b gives
    c, ``csp_rep2`` of c gives d (:class:`SplitCSPLayer`, ``branch_channels`` wide); ``conv2`` (1×1, SiLU) mixes
    [a, b, c, d] back to ``channels``.

    Args:
        channels: the encoder's width (the summed inputs and the output). branch_channels:
            ``round(expansion · channels // 2)``. num_blocks: RepVGG blocks per CSP layer (``round(3 · depth)``).
        trailing_conv: the CSP layers' final 3×3 (False in the DINOv3 models).
    """

    def __init__(self, channels: int, branch_channels: int, num_blocks: int, trailing_conv: bool = True) -> None:
        super().__init__()
        self.conv1 = ConvNorm(channels, 2 * channels, 1, activation=nn.SiLU())
        self.csp_rep1 = SplitCSPLayer(channels, branch_channels, num_blocks, trailing_conv)
        self.csp_rep2 = SplitCSPLayer(branch_channels, branch_channels, num_blocks, trailing_conv)
        self.conv2 = ConvNorm(2 * channels + 2 * branch_channels, channels, 1, activation=nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.conv1(x).chunk(2, dim=1))
        parts.append(self.csp_rep1(parts[-1]))
        parts.append(self.csp_rep2(parts[-1]))
        return self.conv2(torch.cat(parts, dim=1))


def deimv2_hybrid_encoder(in_channels: list[int], hidden_dim: int, *, num_heads: int, dim_feedforward: int,
                          num_layers: int, dropout: float, expansion: float, depth_multiplier: float,
                          trailing_conv: bool = True) -> HybridEncoder:
    """RT-DETR's hybrid encoder with DEIMv2's parts: summed inputs, :class:`RepNCSPELAN5`, SCDown and linear
    lateral convolutions."""
    branch, blocks = round(expansion * hidden_dim // 2), round(3 * depth_multiplier)
    return HybridEncoder(
        in_channels, hidden_dim, num_heads=num_heads, dim_feedforward=dim_feedforward, num_layers=num_layers,
        dropout=dropout, lateral_activation=False, fusion="sum",
        fusion_block=lambda: RepNCSPELAN5(hidden_dim, branch, blocks, trailing_conv),
        downsample=lambda: nn.Sequential(SCDown(hidden_dim)))


class LiteEncoder(nn.Module):
    """DEIMv2's encoder of its smallest models (Atto, Femto, Pico): two backbone maps (strides s, 2s) → two maps
    of ``hidden_dim`` channels at the same strides, without attention.

    Each map is projected (``input_proj``: 1×1 + BatchNorm); the coarse one, upsampled 2× (nearest), is added to
    the fine one and fused (``fpn_block``, a :class:`RepNCSPELAN5`): the first output; that output, average-pooled
    (3×3 stride 2) and projected (``down_conv2``, 1×1, SiLU), is added to the coarse map and fused (``pan_block``):
    the second. ``down_conv1`` and ``bi_fusion_conv`` (a stride-4s map with global context) are kept so that
    the weights load and save whole; transformers computes that map but no output depends on it, so it is
    skipped here.
    """

    def __init__(self, in_channels: list[int], hidden_dim: int, *, expansion: float, depth_multiplier: float) -> None:
        super().__init__()
        if len(in_channels) != 2:
            raise ValueError(f"the lite encoder fuses exactly two backbone maps, got {len(in_channels)}")
        branch, blocks = round(expansion * hidden_dim // 2), round(3 * depth_multiplier)
        self.hidden_dim = hidden_dim
        self.input_proj = nn.ModuleList(ConvNorm(channels, hidden_dim, 1) for channels in in_channels)
        self.down_conv1 = ConvNorm(hidden_dim, hidden_dim, 1, activation=nn.SiLU())
        self.down_conv2 = ConvNorm(hidden_dim, hidden_dim, 1, activation=nn.SiLU())
        self.bi_fusion_conv = ConvNorm(hidden_dim, hidden_dim, 1, activation=nn.SiLU())
        self.fpn_block = RepNCSPELAN5(hidden_dim, branch, blocks)
        self.pan_block = RepNCSPELAN5(hidden_dim, branch, blocks)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """[C_s, C_2s] → [P_s, P_2s], each [B, hidden_dim, h_l, w_l]."""
        fine, coarse = (projection(feature) for projection, feature in zip(self.input_proj, features))
        first = self.fpn_block(fine + F.interpolate(coarse, scale_factor=2.0, mode="nearest"))
        pooled = F.avg_pool2d(first, kernel_size=3, stride=2, padding=1)
        return [first, self.pan_block(coarse + self.down_conv2(pooled))]

    def reparameterize(self) -> int:
        """Fold every RepVGG block's two branches into one convolution (inference only); returns how many."""
        blocks = [module for module in self.modules() if isinstance(module, RepVggBlock) and module.fused is None]
        for block in blocks:
            block.reparameterize()
        return len(blocks)
