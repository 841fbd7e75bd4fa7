"""RF-DETR's projector: the ViT's stages, concatenated along channels, through a C2f block (YOLOv8's cross-stage
partial block, LW-DETR §3.1) with LayerNorms instead of BatchNorms, then a LayerNorm: one map of ``hidden_dim``
channels at the patch stride.

C2f: a 1 × 1 convolution to 2 · h channels (h = ``expansion`` × ``hidden_dim``), split in two halves; the second half
goes through ``num_blocks`` bottlenecks (two 3 × 3 convolutions each, no shortcut), every intermediate kept; the two
halves and the ``num_blocks`` outputs are concatenated and a 1 × 1 convolution makes ``hidden_dim`` channels. Every
convolution is followed by a LayerNorm over channels and SiLU.

Parameter names follow transformers' ``RfDetrScaleProjector``: ``conv1``, ``bottlenecks.{j}.conv{1,2}``, ``conv2``
(each ``conv``, ``norm``), ``norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of a map [B, C, H, W]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNorm(nn.Module):
    """Convolution (no bias, "same" padding) → channel LayerNorm (eps 1e-5) → SiLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.norm = ChannelLayerNorm(out_channels, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3 × 3 :class:`ConvNorm` (no shortcut)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = ConvNorm(channels, channels, 3), ConvNorm(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class Projector(nn.Module):
    """The ViT's stages (each [B, C_i, h, w]) → one map [B, hidden_dim, h, w].

    Args:
        in_channels: the stages' channels (their sum enters the C2f block). hidden_dim: the output channels.
        expansion: the bottlenecks' width relative to ``hidden_dim``. num_blocks: the bottlenecks.
    """

    def __init__(self, in_channels: list[int], hidden_dim: int, *, expansion: float = 0.5, num_blocks: int = 3) -> None:
        super().__init__()
        self.hidden = int(hidden_dim * expansion)
        self.conv1 = ConvNorm(sum(in_channels), 2 * self.hidden, 1)
        self.bottlenecks = nn.ModuleList(Bottleneck(self.hidden) for _ in range(num_blocks))
        self.conv2 = ConvNorm((2 + num_blocks) * self.hidden, hidden_dim, 1)
        self.norm = ChannelLayerNorm(hidden_dim, eps=1e-6)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        parts = list(self.conv1(torch.cat(features, dim=1)).split(self.hidden, dim=1))
        x = parts[-1]
        for bottleneck in self.bottlenecks:
            x = bottleneck(x)
            parts.append(x)
        return self.norm(self.conv2(torch.cat(parts, dim=1)))
