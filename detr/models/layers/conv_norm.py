"""Convolution → BatchNorm → activation (:class:`ConvNorm`), the block of the real-time detectors' backbones and
encoders (RT-DETR's ResNet-vd and hybrid encoder, D-FINE's encoder blocks, DEIMv2's adapter), and the folding of a
BatchNorm into the convolution before it (every backbone's: ``bn(conv(x)) = conv'(x)`` with ``w' = w · s`` and
``b' = β − μ · s``, ``s = γ / sqrt(σ² + eps)``). A ConvNorm also takes an :class:`UpsampledConcat`, the
concatenation of a coarse map upsampled 2× and a fine one, which a 1 × 1 convolution reads by parts.
:func:`fresh_activation` and :func:`fresh_sum` apply an activation or a residual sum to a layer's fresh output in
place where autograd records nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from detr.models.layers.cpu_kernels import cpu_float32_training, depthwise_conv_nhwc, strided_pointwise_conv
from detr.models.layers.winograd import winograd_conv3x3, winograd_pays

#: A norm layer's constructor: channels → module (nn.BatchNorm2d, FrozenBatchNorm2d, ...).
Norm = Callable[[int], nn.Module]


class UpsampledConcat(NamedTuple):
    """``torch.cat([F.interpolate(coarse, scale_factor=2, mode="nearest"), fine], dim=1)`` kept in its parts: the
    input of RT-DETR's and D-FINE's top-down fusion blocks (:class:`detr.models.rtdetr.hybrid_encoder.HybridEncoder`),
    whose first convolutions are 1 × 1 ones. A 1 × 1 convolution commutes with nearest upsampling, so
    :func:`concat_conv` computes the coarse part's share on the coarse map (a quarter of the pixels), upsamples
    that and adds the fine part's: the same sum of products, in another order; the concatenation is not written."""

    coarse: torch.Tensor  # [B, C1, h, w]
    fine: torch.Tensor  # [B, C2, 2h, 2w]

    def tensor(self) -> torch.Tensor:
        """The concatenation itself, [B, C1 + C2, 2h, 2w]."""
        return torch.cat([F.interpolate(self.coarse, scale_factor=2.0, mode="nearest"), self.fine], dim=1)


def upsampled_concat(coarse: torch.Tensor, fine: torch.Tensor, by_parts: bool) -> torch.Tensor | UpsampledConcat:
    """The concatenation of ``coarse`` upsampled 2× (nearest) and ``fine``: an :class:`UpsampledConcat` where
    ``by_parts`` (and not within :func:`direct_convolutions`), for a block whose first convolutions are 1 × 1 ones
    (:class:`ConvNorm` reads it by parts), else the tensor itself."""
    parts = UpsampledConcat(coarse, fine)
    return parts if by_parts and not _direct_only else parts.tensor()


def concat_conv(conv: nn.Conv2d, x: UpsampledConcat, weight: torch.Tensor, bias: torch.Tensor | None
                ) -> torch.Tensor:
    """``conv``'s convolution of the concatenation ``x`` with ``weight`` and ``bias``: a 1 × 1 one (stride 1, no
    groups) by parts, ``W_f * fine + b + up(W_c * coarse)`` (:class:`UpsampledConcat`; adding the upsampled product
    in place: a broadcast add into 2 × 2 blocks was as fast forward and slower backward); any other convolution of
    the concatenation itself."""
    coarse, fine = x
    _, channels, height, width = coarse.shape
    if (conv.kernel_size != (1, 1) or conv.stride != (1, 1) or conv.groups != 1
            or fine.shape[-2:] != (2 * height, 2 * width)):
        return conv._conv_forward(x.tensor(), weight, bias)
    output = F.conv2d(fine, weight[:, channels:], bias)
    return output.add_(F.interpolate(F.conv2d(coarse, weight[:, :channels]), scale_factor=2.0, mode="nearest"))


def folded_weight_and_bias(conv: nn.Conv2d, norm: nn.BatchNorm2d | FrozenBatchNorm2d
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``conv`` followed by the BatchNorm ``norm`` (frozen or in eval mode) as one
    convolution: ``w · s`` and ``β − μ · s (+ b · s)``, ``s = γ / sqrt(σ² + eps)``."""
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    bias = norm.bias - norm.running_mean * scale
    if conv.bias is not None:
        bias = bias + conv.bias * scale
    return conv.weight * scale[:, None, None, None], bias


@torch.no_grad()
def fold_norm_into_conv(conv: nn.Conv2d, norm: nn.BatchNorm2d | FrozenBatchNorm2d) -> None:
    """Fold the BatchNorm ``norm`` (frozen or in eval mode) that follows ``conv`` into ``conv``'s weight and bias:
    :func:`folded_weight_and_bias`. The caller removes ``norm``."""
    weight, bias = folded_weight_and_bias(conv, norm)
    conv.weight.copy_(weight)
    conv.bias = nn.Parameter(bias, requires_grad=False)


def conv_frozen_norm(conv: nn.Conv2d, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(conv(x))`` in a training step: a FrozenBatchNorm2d ``norm`` folded into the convolution's weight and
    bias on the fly (``w · s``, ``β − μ · s (+ b · s)``, ``s = γ / sqrt(σ² + eps)``): one pass over the activations
    fewer forward and backward; gradients reach ``conv.weight`` through the product (equal to the plain path's up
    to float rounding). Any other norm runs as it is. On the CPU the convolution runs by the faster algorithm
    where there is one (:func:`training_conv`)."""
    if not isinstance(norm, FrozenBatchNorm2d):
        return norm(training_conv(conv, x, conv.weight, conv.bias))
    weight, bias = folded_weight_and_bias(conv, norm)
    return training_conv(conv, x, weight, bias)


_direct_only = False


@contextlib.contextmanager
def direct_convolutions() -> Iterator[None]:
    """Within the block, :func:`training_conv` runs every convolution by oneDNN's direct kernel in NCHW: no
    Winograd, no NHWC depthwise, no NHWC stem (:func:`stride_four_nhwc`; for comparisons: the benchmarks'
    ``--direct-convolutions``; the numbers differ by float rounding only). Process-wide, not per thread."""
    global _direct_only
    before, _direct_only = _direct_only, True
    try:
        yield
    finally:
        _direct_only = before


def training_conv(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """``conv``'s convolution of ``x`` with ``weight`` and ``bias`` (its own, or with a norm folded in) in a
    training step, by the faster algorithm where there is one on the CPU (the same function up to float rounding:
    docs/measurements/speed.md): a wide 3 × 3 convolution on a large map by Winograd
    (:func:`~detr.models.layers.winograd.winograd_conv3x3` where :func:`~detr.models.layers.winograd.winograd_pays`),
    a stage's strided 1 × 1 shortcut on every s-th pixel, a depthwise 5 × 5 one in NHWC; otherwise the direct
    kernel. ``x`` may be an :class:`UpsampledConcat` (:func:`concat_conv`)."""
    if isinstance(x, UpsampledConcat):
        return concat_conv(conv, x, weight, bias)
    if not _direct_only:
        if winograd_pays(conv, x):
            return winograd_conv3x3(x, weight, bias)
        depthwise = depthwise_conv_nhwc(conv, x, weight, bias)
        if depthwise is not None:
            return depthwise
    shortcut = strided_pointwise_conv(conv, x, weight, bias)
    return shortcut if shortcut is not None else conv._conv_forward(x, weight, bias)


def stride_four_nhwc(backbone: nn.Module, images: torch.Tensor) -> bool:
    """Whether a training step of ``backbone`` (RT-DETR's ResNet-vd, HGNetV2) runs its part at stride 4 or less
    (the stem and the first stage: 16 to 64 channels on maps of 320² and 160² at 640²) in NHWC and hands NCHW to
    the second stage: on the CPU, float32, with gradients. There oneDNN's convolutions of few channels on large maps
    and their backward, and the max-pool, are faster in NHWC (2 threads, batch 2 at 640², forward and backward:
    ResNet-18-vd's stem and layer1 535 against 441 ms, HGNetV2-B0's stem and first stage 157 against 105 ms:
    benchmarks/convolutions.py; not within :func:`direct_convolutions`); from the second stage on, the wider
    layers run in NCHW, where Winograd's convolutions run (:func:`training_conv`). Inference keeps its layout
    (NCHW, or NHWC throughout once optimized)."""
    return not _direct_only and backbone.training and cpu_float32_training(images)


def fresh_activation(activation: nn.Module | Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
                     ) -> torch.Tensor:
    """``activation(x)`` for an ``x`` that only the caller holds (a layer's fresh output), in place where that is
    safe: a forward then writes one map per layer instead of two, and every fresh map costs a pass over memory and
    its page faults (docs/measurements/speed.md, "Activations in place"). ReLU runs in place always (its backward
    reads its output, and the layers that make ``x`` do not keep it), SiLU where autograd records nothing for ``x``
    (inference, ``no_grad``, a frozen layer: its backward would need the input); anything else (``nn.Identity``,
    GELU, ...) as it is. The same values and gradients either way."""
    if isinstance(activation, nn.ReLU) or activation is F.relu:
        return x.relu_()
    if not x.requires_grad and (isinstance(activation, nn.SiLU) or activation is F.silu):
        return F.silu(x, inplace=True)
    return activation(x)


def fresh_sum(fresh: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``fresh + other`` for a ``fresh`` that only the caller holds, of the sum's shape: added in place where
    autograd records nothing for either (as :func:`fresh_activation`)."""
    if fresh.requires_grad or other.requires_grad or fresh.shape != torch.broadcast_shapes(fresh.shape, other.shape):
        return fresh + other
    return fresh.add_(other)


class ConvNorm(nn.Module):
    """Convolution (no bias, "same" padding for odd kernels, ``groups``) → norm → optional activation: ``conv``,
    ``norm``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, *,
                 norm: Norm = nn.BatchNorm2d, activation: nn.Module | None = None, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=(kernel_size - 1) // 2,
                              groups=groups, bias=False)
        self.norm = norm(out_channels)
        self.activation = activation if activation is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a training forward folds a frozen norm into the convolution (conv_frozen_norm); inference keeps the
        # separate norm, whose outputs equal the reference's bit for bit (optimize_for_inference folds for good)
        if self.training and torch.is_grad_enabled():
            y = conv_frozen_norm(self.conv, self.norm, x)
        elif isinstance(x, UpsampledConcat):
            y = self.norm(concat_conv(self.conv, x, self.conv.weight, self.conv.bias))
        else:
            y = self.norm(self.conv(x))
        return fresh_activation(self.activation, y)


@torch.no_grad()
def fold_batch_norms(module: nn.Module) -> int:
    """Fold every (eval-mode or frozen) BatchNorm that directly follows a convolution inside ``module`` (a
    :class:`ConvNorm`'s ``norm``, or the ``norm`` beside a ``conv`` in a Sequential) into that convolution, for
    inference: ``w' = w · s``, ``b' = β − μ · s``, ``s = γ / sqrt(σ² + eps)``, one pass over the activations
    fewer per layer. Outputs change only by float rounding; the state dict loses the authors' layout. Returns
    how many were folded."""
    folded = 0
    for parent in list(module.modules()):
        conv, norm = getattr(parent, "conv", None), getattr(parent, "norm", None)
        if not isinstance(conv, nn.Conv2d) or not isinstance(norm, (nn.BatchNorm2d, FrozenBatchNorm2d)):
            continue
        fold_norm_into_conv(conv, norm)
        parent.norm = nn.Identity()
        folded += 1
    return folded
