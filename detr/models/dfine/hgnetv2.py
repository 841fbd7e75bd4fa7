"""HGNetV2, D-FINE's backbone (PaddlePaddle's PP-HGNetV2; D-FINE, Peng et al. 2024, uses sizes B0-B5).

A stem of 3×3 and 2×2 convolutions with a max-pool branch (stride 4), then four stages; each stage halves the
map with a depthwise 3×3 stride-2 convolution (all but the first) and stacks HG blocks. An HG block runs
``layers`` convolutions in a chain (3×3, or "light": 1×1 then depthwise k×k), concatenates the block input with
every output and aggregates them with two 1×1 convolutions (squeeze to half the output width, then excite);
every block but a stage's first adds its input back. Every convolution is followed by a BatchNorm and, where it
has an activation, ReLU and optionally a learnable affine block (LAB: ``scale · x + bias``, two scalars; the
N/S/M models use it).

Parameter names are the authors' (Peterande/D-FINE, ``src/nn/backbone/hgnetv2.py``): ``stem.stem{1,2a,2b,3,4}``,
``stages.{s}.downsample``, ``stages.{s}.blocks.{b}.layers.{l}`` (light: ``.conv1``, ``.conv2``),
``stages.{s}.blocks.{b}.aggregation.{0,1}``, each a :class:`ConvBNAct` with ``conv``, ``bn`` and ``lab``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from detr.models.layers.conv_norm import (conv_frozen_norm, fold_norm_into_conv, fresh_activation, fresh_sum,
                                         stride_four_nhwc)


@dataclass(frozen=True)
class StageSpec:
    """One stage: input, middle (each layer's) and output channels, HG blocks, whether it halves the map,
    light blocks, the layers' kernel size and the layers per block."""

    in_channels: int
    mid_channels: int
    out_channels: int
    num_blocks: int
    downsample: bool
    light: bool
    kernel_size: int
    num_layers: int


@dataclass(frozen=True)
class HGNetV2Spec:
    """A size: the stem's (input, middle, output) channels and the four stages."""

    stem_channels: tuple[int, int, int]
    stages: tuple[StageSpec, StageSpec, StageSpec, StageSpec]


def _spec(stem: tuple[int, int, int], *stages: tuple) -> HGNetV2Spec:
    return HGNetV2Spec(stem, tuple(StageSpec(*stage) for stage in stages))  # type: ignore[arg-type]


#: The authors' sizes (their ``arch_configs``): stage rows are (in, mid, out, blocks, downsample, light, kernel,
#: layers).
SIZES: dict[str, HGNetV2Spec] = {
    "hgnetv2_b0": _spec((3, 16, 16), (16, 16, 64, 1, False, False, 3, 3), (64, 32, 256, 1, True, False, 3, 3),
                        (256, 64, 512, 2, True, True, 5, 3), (512, 128, 1024, 1, True, True, 5, 3)),
    "hgnetv2_b1": _spec((3, 24, 32), (32, 32, 64, 1, False, False, 3, 3), (64, 48, 256, 1, True, False, 3, 3),
                        (256, 96, 512, 2, True, True, 5, 3), (512, 192, 1024, 1, True, True, 5, 3)),
    "hgnetv2_b2": _spec((3, 24, 32), (32, 32, 96, 1, False, False, 3, 4), (96, 64, 384, 1, True, False, 3, 4),
                        (384, 128, 768, 3, True, True, 5, 4), (768, 256, 1536, 1, True, True, 5, 4)),
    "hgnetv2_b3": _spec((3, 24, 32), (32, 32, 128, 1, False, False, 3, 5), (128, 64, 512, 1, True, False, 3, 5),
                        (512, 128, 1024, 3, True, True, 5, 5), (1024, 256, 2048, 1, True, True, 5, 5)),
    "hgnetv2_b4": _spec((3, 32, 48), (48, 48, 128, 1, False, False, 3, 6), (128, 96, 512, 1, True, False, 3, 6),
                        (512, 192, 1024, 3, True, True, 5, 6), (1024, 384, 2048, 1, True, True, 5, 6)),
    "hgnetv2_b5": _spec((3, 32, 64), (64, 64, 128, 1, False, False, 3, 6), (128, 128, 512, 2, True, False, 3, 6),
                        (512, 256, 1024, 5, True, True, 5, 6), (1024, 512, 2048, 2, True, True, 5, 6)),
}


class LearnableAffineBlock(nn.Module):
    """``scale · x + bias`` with two learned scalars (``scale``, ``bias``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))
        #: the scale moved into the convolution before the ReLU (:meth:`HGNetV2.fold_batch_norms`): only the bias
        #: is added here
        self.scale_folded = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias if self.scale_folded else self.scale * x + self.bias

    def apply_(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` in place on ``x``, where autograd records nothing (a fresh map of
        :class:`ConvBNAct`'s in inference: no second map written, as :func:`fresh_activation`)."""
        return x.add_(self.bias) if self.scale_folded else x.mul_(self.scale).add_(self.bias)


class ConvBNAct(nn.Module):
    """Convolution (no bias, "same" padding for odd kernels; stride and groups as given) → BatchNorm → ReLU →
    LAB; without ``activation`` neither ReLU nor LAB: ``conv``, ``bn``, ``lab``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1, *,
                 activation: bool = True, lab: bool = False, frozen_norm: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=(kernel_size - 1) // 2,
                              groups=groups, bias=False)
        self.bn = FrozenBatchNorm2d(out_channels) if frozen_norm else nn.BatchNorm2d(out_channels)
        self.activation = activation
        self.lab = LearnableAffineBlock() if activation and lab else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a training forward folds the frozen norm into the convolution (conv_frozen_norm), as ConvNorm does
        if self.training and torch.is_grad_enabled():
            x = conv_frozen_norm(self.conv, self.bn, x)
        else:
            x = self.bn(self.conv(x))
        if not self.activation:
            return x
        x = fresh_activation(F.relu, x)
        if isinstance(self.lab, LearnableAffineBlock) and not torch.is_grad_enabled():
            return self.lab.apply_(x)
        return self.lab(x)


class LightConvBNAct(nn.Module):
    """A light layer: 1×1 (no activation) then a depthwise k×k convolution: ``conv1``, ``conv2``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, **options: bool) -> None:
        super().__init__()
        self.conv1 = ConvBNAct(in_channels, out_channels, 1, activation=False, **options)
        self.conv2 = ConvBNAct(out_channels, out_channels, kernel_size, groups=out_channels, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class StemBlock(nn.Module):
    """The stem (stride 4): 3×3/2 → (2×2 → 2×2, beside a 2×2 max-pool, on the map padded by one at the bottom
    and right) → concatenation → 3×3/2 → 1×1."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, **options: bool) -> None:
        super().__init__()
        self.stem1 = ConvBNAct(in_channels, mid_channels, 3, 2, **options)
        self.stem2a = ConvBNAct(mid_channels, mid_channels // 2, 2, **options)
        self.stem2b = ConvBNAct(mid_channels // 2, mid_channels, 2, **options)
        self.stem3 = ConvBNAct(mid_channels * 2, mid_channels, 3, 2, **options)
        self.stem4 = ConvBNAct(mid_channels, out_channels, 1, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(self.stem1(x), (0, 1, 0, 1))
        branch = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        pooled = F.max_pool2d(x, kernel_size=2, stride=1, ceil_mode=True)
        return self.stem4(self.stem3(torch.cat([pooled, branch], dim=1)))


class HGBlock(nn.Module):
    """``layers`` chained convolutions; the input and all their outputs concatenated, squeezed (1×1 to half the
    output width) and excited (1×1 to the output width): ``layers``, ``aggregation``; plus the input where
    ``residual``."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, num_layers: int, kernel_size: int,
                 *, residual: bool, light: bool, **options: bool) -> None:
        super().__init__()
        self.residual = residual
        layer = LightConvBNAct if light else ConvBNAct
        self.layers = nn.ModuleList(layer(in_channels if index == 0 else mid_channels, mid_channels, kernel_size,
                                          **options) for index in range(num_layers))
        self.aggregation = nn.Sequential(
            ConvBNAct(in_channels + num_layers * mid_channels, out_channels // 2, 1, **options),
            ConvBNAct(out_channels // 2, out_channels, 1, **options))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = [x]
        for layer in self.layers:
            outputs.append(layer(outputs[-1]))
        aggregated = self.aggregation(torch.cat(outputs, dim=1))
        return fresh_sum(aggregated, x) if self.residual else aggregated


class HGStage(nn.Module):
    """``downsample`` (a depthwise 3×3 stride-2 convolution without activation, or identity) → ``blocks``."""

    def __init__(self, spec: StageSpec, **options: bool) -> None:
        super().__init__()
        self.downsample = (ConvBNAct(spec.in_channels, spec.in_channels, 3, 2, groups=spec.in_channels,
                                     activation=False, **options) if spec.downsample else nn.Identity())
        self.blocks = nn.Sequential(*[
            HGBlock(spec.in_channels if index == 0 else spec.out_channels, spec.mid_channels, spec.out_channels,
                    spec.num_layers, spec.kernel_size, residual=index > 0, light=spec.light, **options)
            for index in range(spec.num_blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class HGNetV2(nn.Module):
    """HGNetV2: images [B, 3, H, W] → the maps of the last ``num_outputs`` stages (strides 8, 16, 32 for 3;
    16, 32 for 2), coarsest last.

    Args:
        name: the size, a key of :data:`SIZES` ("hgnetv2_b0" ... "hgnetv2_b5").
        learnable_affine: LAB after every activation (the authors' ``use_lab``: D-FINE N, S and M).
        num_outputs: how many of the last stages to return (3; 2 for D-FINE N).
        frozen_norm: frozen BatchNorms (the released models' and transformers' default) or trainable ones.
    """

    def __init__(self, name: str = "hgnetv2_b4", *, learnable_affine: bool = False, num_outputs: int = 3,
                 frozen_norm: bool = True) -> None:
        super().__init__()
        if name not in SIZES:
            raise ValueError(f"HGNetV2 size must be one of {sorted(SIZES)}, got {name!r}")
        if not 1 <= num_outputs <= 3:
            raise ValueError(f"num_outputs must be 1, 2 or 3 (of the stride-8, 16 and 32 stages), got {num_outputs}")
        spec = SIZES[name]
        options = {"lab": learnable_affine, "frozen_norm": frozen_norm}
        self.stem = StemBlock(*spec.stem_channels, **options)
        self.stages = nn.ModuleList(HGStage(stage, **options) for stage in spec.stages)
        self.num_outputs = num_outputs
        #: channels of the returned maps, finest first
        self.out_channels: list[int] = [stage.out_channels for stage in spec.stages[-num_outputs:]]
        self.channels_last = False

    @torch.no_grad()
    def fold_batch_norms(self) -> int:
        """Fold every (frozen or eval-mode) BatchNorm into its convolution, and a positive LAB scale after it too
        (``s · relu(y) = relu(s · y)``: one pass over the map fewer), for inference (outputs equal to float
        rounding; the state dict loses the authors' layout). Returns how many BatchNorms were folded."""
        layers = [m for m in self.modules() if isinstance(m, ConvBNAct) and not isinstance(m.bn, nn.Identity)]
        for layer in layers:
            fold_norm_into_conv(layer.conv, layer.bn)
            layer.bn = nn.Identity()
            lab = layer.lab
            if isinstance(lab, LearnableAffineBlock) and not lab.scale_folded and float(lab.scale) > 0:
                layer.conv.weight.mul_(lab.scale)
                layer.conv.bias.mul_(lab.scale)
                lab.scale_folded = True
        return len(layers)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """images [B, 3, H, W] → the last ``num_outputs`` stages' maps, each [B, c, H / s, W / s]."""
        if self.channels_last or stride_four_nhwc(self, images):
            images = images.contiguous(memory_format=torch.channels_last)
        x = self.stem(images)
        outputs = []
        for index, stage in enumerate(self.stages):
            if index == 1 and not self.channels_last:
                x = x.contiguous()  # NCHW from stride 8 on (a training step's stride-4 part ran in NHWC)
            x = stage(x)
            outputs.append(x)
        return outputs[-self.num_outputs:]
