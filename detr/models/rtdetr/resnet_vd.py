"""ResNet-vd, RT-DETR's backbone (He et al., "Bag of Tricks for Image Classification", §4.2: tweaks C and D).

Two changes to the ResNet of torchvision: the stem is three 3×3 convolutions (32, 32, 64 channels, the first
with stride 2) instead of one 7×7, and a shortcut that halves the map average-pools (2×2, stride 2) before its
1×1 convolution instead of striding it, so that it reads every input cell. Every convolution is followed by a
BatchNorm (frozen where the recipe freezes it); blocks are the basic (ResNet-18/34) or bottleneck (50/101)
ones, with the bottleneck's stride on its 3×3 convolution.

Parameter names are the authors' (lyuwenyu/RT-DETR, ``src/nn/backbone/presnet.py``): ``conv1.conv1_{1,2,3}``,
``res_layers.{stage}.blocks.{block}.branch2{a,b,c}`` and ``short`` (``short.conv`` behind the pooling), each a
:class:`~detr.models.layers.conv_norm.ConvNorm` with ``conv`` and ``norm``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.backbone import norm_layer, own_autocast
from detr.models.config import BackboneName, BackboneNorm
from detr.models.layers.conv_norm import ConvNorm, Norm, fresh_activation, fresh_sum, stride_four_nhwc

#: Blocks per stage and whether they are bottlenecks, per depth (as torchvision's ResNets).
DEPTHS: dict[str, tuple[tuple[int, int, int, int], bool]] = {
    "resnet18": ((2, 2, 2, 2), False),
    "resnet34": ((3, 4, 6, 3), False),
    "resnet50": ((3, 4, 6, 3), True),
    "resnet101": ((3, 4, 23, 3), True),
}
#: The stages' base widths (a bottleneck's output is 4 times its base width).
_WIDTHS = (64, 128, 256, 512)


def _shortcut(in_channels: int, out_channels: int, stride: int, norm: Norm) -> nn.Module:
    """The first block's projection shortcut: average pooling then a 1×1 convolution where the block halves the
    map (tweak D), else a 1×1 convolution."""
    if stride == 1:
        return ConvNorm(in_channels, out_channels, 1, norm=norm)
    return nn.Sequential(OrderedDict(pool=nn.AvgPool2d(2, 2, 0, ceil_mode=True),
                                     conv=ConvNorm(in_channels, out_channels, 1, norm=norm)))


class BasicBlock(nn.Module):
    """Two 3×3 convolutions and the shortcut (identity, or a projection in each stage's first block)."""

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int, project: bool, norm: Norm) -> None:
        super().__init__()
        self.branch2a = ConvNorm(in_channels, width, 3, stride, norm=norm, activation=nn.ReLU())
        self.branch2b = ConvNorm(width, width, 3, norm=norm)
        self.short = _shortcut(in_channels, width, stride, norm) if project else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch2b(self.branch2a(x))
        return fresh_activation(F.relu, fresh_sum(out, x if self.short is None else self.short(x)))


class Bottleneck(nn.Module):
    """1×1 → 3×3 (with the stride) → 1×1 (4 × width) convolutions and the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int, project: bool, norm: Norm) -> None:
        super().__init__()
        self.branch2a = ConvNorm(in_channels, width, 1, norm=norm, activation=nn.ReLU())
        self.branch2b = ConvNorm(width, width, 3, stride, norm=norm, activation=nn.ReLU())
        self.branch2c = ConvNorm(width, width * self.expansion, 1, norm=norm)
        self.short = _shortcut(in_channels, width * self.expansion, stride, norm) if project else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch2c(self.branch2b(self.branch2a(x)))
        return fresh_activation(F.relu, fresh_sum(out, x if self.short is None else self.short(x)))


class Stage(nn.Module):
    """``blocks``: the first projects (and halves the map, except in the first stage), the rest keep the width."""

    def __init__(self, block: type[BasicBlock | Bottleneck], in_channels: int, width: int, count: int, stride: int,
                 norm: Norm) -> None:
        super().__init__()
        out_channels = width * block.expansion
        self.blocks = nn.ModuleList(
            block(in_channels if index == 0 else out_channels, width, stride if index == 0 else 1, index == 0, norm)
            for index in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class ResNetVd(nn.Module):
    """ResNet-vd: images [B, 3, H, W] → the feature maps of stages 2-4 (strides 8, 16, 32), coarsest last.

    Args:
        name: the depth ("resnet18", "resnet34", "resnet50", "resnet101").
        norm: "frozen_batch_norm" (the released models' backbones), "batch_norm" or "group_norm".
    """

    def __init__(self, name: BackboneName = "resnet50", *, norm: BackboneNorm = "frozen_batch_norm") -> None:
        super().__init__()
        if name not in DEPTHS:
            raise ValueError(f"ResNet-vd depth must be one of {sorted(DEPTHS)}, got {name!r}")
        counts, bottleneck = DEPTHS[name]
        block = Bottleneck if bottleneck else BasicBlock
        norm_fn = norm_layer(norm)
        stem = (("conv1_1", 3, 32, 2), ("conv1_2", 32, 32, 1), ("conv1_3", 32, 64, 1))
        self.conv1 = nn.Sequential(OrderedDict(
            (key, ConvNorm(c_in, c_out, 3, stride, norm=norm_fn, activation=nn.ReLU()))
            for key, c_in, c_out, stride in stem))
        stages, in_channels = [], 64
        for index, (count, width) in enumerate(zip(counts, _WIDTHS)):
            stages.append(Stage(block, in_channels, width, count, 1 if index == 0 else 2, norm_fn))
            in_channels = width * block.expansion
        self.res_layers = nn.ModuleList(stages)
        #: channels of the returned maps (strides 8, 16, 32)
        self.out_channels: list[int] = [width * block.expansion for width in _WIDTHS[1:]]
        self.channels_last = False
        #: the dtype the convolutions run in under torch.autocast (None: no autocast of its own)
        self.autocast_dtype: torch.dtype | None = None

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """images [B, 3, H, W] → [C3 [B, c3, H/8, W/8], C4 [.., H/16, ..], C5 [.., H/32, ..]] (sizes rounded up);
        float32 maps when ``autocast_dtype`` is set."""
        if self.channels_last or stride_four_nhwc(self, images):
            images = images.contiguous(memory_format=torch.channels_last)
        with own_autocast(images.device.type, self.autocast_dtype):
            x = F.max_pool2d(self.conv1(images), kernel_size=3, stride=2, padding=1)
            outputs = []
            for index, stage in enumerate(self.res_layers):
                if index == 1 and not self.channels_last:
                    x = x.contiguous()  # NCHW from stride 8 on (a training step's stride-4 part ran in NHWC)
                x = stage(x)
                if index > 0:
                    outputs.append(x)
        if self.autocast_dtype is not None:
            outputs = [output.float() for output in outputs]
        return outputs
