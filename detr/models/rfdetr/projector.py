"""RF-DETR's and LW-DETR's projector: the ViT's stages, concatenated along channels, through a C2f block (YOLOv8's
cross-stage partial block, LW-DETR §3.1), then a LayerNorm: one map of ``hidden_dim`` channels at the patch stride.
RF-DETR's block normalises with LayerNorms over channels; LW-DETR's with BatchNorms, and it makes one map per scale
(× 2: each stage first through a 2 × 2 transposed convolution, halving its channels, a quarter after a 1 × 1
convolution + BatchNorm + ReLU above 512; × 0.5: a stride-2 3 × 3 convolution + BatchNorm + ReLU).

C2f: a 1 × 1 convolution to 2 · h channels (h = ``expansion`` × ``hidden_dim``), split in two halves; the second half
goes through ``num_blocks`` bottlenecks (two 3 × 3 convolutions each, no shortcut), every intermediate kept; the two
halves and the ``num_blocks`` outputs are concatenated and a 1 × 1 convolution makes ``hidden_dim`` channels. Every
convolution is followed by a norm and SiLU.

Parameter names follow transformers' ``RfDetrScaleProjector`` / ``LwDetrScaleProjector``: ``sampling.{i}.{j}``,
``conv1``, ``bottlenecks.{j}.conv{1,2}``, ``conv2`` (each ``conv``, ``norm``), ``norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.conv_norm import fresh_activation
from detr.models.rfdetr.config import ProjectorNorm


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of a map [B, C, H, W]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNorm(nn.Module):
    """Convolution (no bias, "same" padding) → channel LayerNorm or BatchNorm (eps 1e-5) → SiLU (or ReLU)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, norm: ProjectorNorm = "layer_norm",
                 stride: int = 1, relu: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False)
        self.norm = (ChannelLayerNorm(out_channels, eps=1e-5) if norm == "layer_norm"
                     else nn.BatchNorm2d(out_channels, eps=1e-5))
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fresh_activation(F.relu if self.relu else F.silu, self.norm(self.conv(x)))


def sampling_layers(channels: int, scale: float, norm: ProjectorNorm) -> tuple[nn.Sequential, int]:
    """LW-DETR's resampling of one stage to ``scale`` × its size → (the layers, the channels they give)."""
    if scale == 2.0 and channels > 512:
        return nn.Sequential(ConvNorm(channels, channels // 2, 1, norm=norm, relu=True),
                             nn.ConvTranspose2d(channels // 2, channels // 4, 2, 2)), channels // 4
    if scale == 2.0:
        return nn.Sequential(nn.ConvTranspose2d(channels, channels // 2, 2, 2)), channels // 2
    if scale == 0.5:
        return nn.Sequential(ConvNorm(channels, channels, 3, norm=norm, stride=2, relu=True)), channels
    if scale != 1.0:
        raise ValueError(f"projector scales are 0.5, 1 or 2 (LW-DETR's), got {scale}")
    return nn.Sequential(), channels


class Bottleneck(nn.Module):
    """Two 3 × 3 :class:`ConvNorm` (no shortcut)."""

    def __init__(self, channels: int, norm: ProjectorNorm = "layer_norm") -> None:
        super().__init__()
        self.conv1, self.conv2 = ConvNorm(channels, channels, 3, norm=norm), ConvNorm(channels, channels, 3, norm=norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class Projector(nn.Module):
    """The ViT's stages (each [B, C_i, h, w]) → one map [B, hidden_dim, h · scale, w · scale].

    Args:
        in_channels: the stages' channels. hidden_dim: the output channels.
        expansion: the bottlenecks' width relative to ``hidden_dim``. num_blocks: the bottlenecks.
        scale: 1 (RF-DETR), or LW-DETR's 2 or 0.5 (each stage resampled first). norm: the C2f block's norms.
    """

    def __init__(self, in_channels: list[int], hidden_dim: int, *, expansion: float = 0.5, num_blocks: int = 3,
                 scale: float = 1.0, norm: ProjectorNorm = "layer_norm") -> None:
        super().__init__()
        self.scale = scale
        resampled = [sampling_layers(channels, scale, norm) for channels in in_channels]
        self.sampling = nn.ModuleList(layers for layers, _ in resampled)
        self.hidden = int(hidden_dim * expansion)
        self.conv1 = ConvNorm(sum(channels for _, channels in resampled), 2 * self.hidden, 1, norm=norm)
        self.bottlenecks = nn.ModuleList(Bottleneck(self.hidden, norm) for _ in range(num_blocks))
        self.conv2 = ConvNorm((2 + num_blocks) * self.hidden, hidden_dim, 1, norm=norm)
        self.norm = ChannelLayerNorm(hidden_dim, eps=1e-6)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        features = [layers(feature) for layers, feature in zip(self.sampling, features)]
        parts = list(self.conv1(torch.cat(features, dim=1)).split(self.hidden, dim=1))
        x = parts[-1]
        for bottleneck in self.bottlenecks:
            x = bottleneck(x)
            parts.append(x)
        return self.norm(self.conv2(torch.cat(parts, dim=1)))
