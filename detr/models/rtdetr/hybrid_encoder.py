"""RT-DETR's hybrid encoder (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024, §4.2).

The backbone's three maps (strides 8, 16, 32) are projected to the encoder's width (1×1 conv + BatchNorm), then:

- AIFI (attention-based intra-scale feature interaction): transformer encoder layers (post-norm, GELU FFN) on
  the stride-32 map only, with fixed 2-D sin-cos positions (:func:`sincos_position_embedding`): self-attention
  on the coarsest map carries most of the benefit at a fraction of the cost of attending over every level.
- CCFM (CNN-based cross-scale feature fusion): a top-down pass (1×1 lateral conv, nearest 2× upsampling, concat
  with the finer map, a CSP block) and a bottom-up pass (3×3 stride-2 conv, concat, a CSP block), as a PAN.
  The CSP blocks (:class:`CSPRepLayer`) hold RepVGG blocks: a 3×3 and a 1×1 branch summed (one 3×3 after
  re-parameterisation), SiLU.

Parameter names are the authors' (``src/zoo/rtdetr/hybrid_encoder.py``, RT-DETRv2's spelling): ``input_proj.{l}.
{conv,norm}``, ``encoder.0.layers.{i}.{self_attn,linear1,linear2,norm1,norm2}``, ``lateral_convs``,
``fpn_blocks``, ``downsample_convs``, ``pan_blocks``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.conv_norm import ConvNorm, UpsampledConcat, fresh_activation, fresh_sum, upsampled_concat
from detr.models.size_constants import SizeConstants
from detr.models.transformer import TransformerEncoderLayer


def sincos_position_embedding(height: int, width: int, dim: int, temperature: float = 10000.0, *,
                              device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The fixed 2-D positions of an h × w map, row-major → [1, h·w, dim]: ``[sin(y ω), cos(y ω), sin(x ω),
    cos(x ω)]`` with ``ω_i = temperature^(-i / (dim / 4))``, i < dim / 4; computed in float64 then cast, as
    transformers does (the authors' code computes in float32 and, on non-square maps, pairs the frequencies with
    the transposed grid; on the square maps of their input contract both agree)."""
    if dim % 4:
        raise ValueError(f"the 2-D sin-cos embedding needs a width divisible by 4, got {dim}")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64, device=device) / quarter)
    rows, columns = torch.meshgrid(torch.arange(height, dtype=torch.float64, device=device),
                                   torch.arange(width, dtype=torch.float64, device=device), indexing="ij")
    y, x = rows.flatten().outer(omega), columns.flatten().outer(omega)  # [h·w, dim / 4] each
    return torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=1).to(dtype)[None]


def _positions(size: tuple[int, int, int, float], *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(height, width, dim, temperature) → :func:`sincos_position_embedding`."""
    return sincos_position_embedding(*size, device=device, dtype=dtype)


class RepVggBlock(nn.Module):
    """RepVGG (Ding et al. 2021): ``act(conv3x3(x) + conv1x1(x))``, each branch conv + BatchNorm.

    :meth:`reparameterize` folds both branches into one 3×3 convolution with a bias (``fused``) for inference:
    the same function with one convolution instead of two (and no separate norms)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvNorm(channels, channels, 3)
        self.conv2 = ConvNorm(channels, channels, 1)
        self.fused: nn.Conv2d | None = None

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Replace the two branches by their sum, one 3×3 convolution (inference only; call in eval mode)."""
        weight, bias = _fold(self.conv1)
        weight_1x1, bias_1x1 = _fold(self.conv2)
        weight = weight + F.pad(weight_1x1, [1, 1, 1, 1])
        conv = self.conv1.conv
        self.fused = nn.Conv2d(conv.in_channels, conv.out_channels, 3, padding=1).to(weight.device, weight.dtype)
        self.fused.weight.copy_(weight)
        self.fused.bias.copy_(bias + bias_1x1)
        del self.conv1, self.conv2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return fresh_activation(F.silu, self.fused(x))
        return fresh_activation(F.silu, fresh_sum(self.conv1(x), self.conv2(x)))


def _fold(layer: ConvNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the convolution followed by its (eval-mode) BatchNorm."""
    norm = layer.norm
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    return layer.conv.weight * scale[:, None, None, None], norm.bias - norm.running_mean * scale


class CSPRepLayer(nn.Module):
    """Cross-stage-partial block: ``conv3(blocks(conv1(x)) + conv2(x))``; conv1/conv2 are 1×1 + SiLU to
    ``expansion × out`` channels, conv3 a 1×1 + SiLU back to ``out`` (identity when they are equal)."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 3, expansion: float = 1.0) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = ConvNorm(in_channels, hidden, 1, activation=nn.SiLU())
        self.conv2 = ConvNorm(in_channels, hidden, 1, activation=nn.SiLU())
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden) for _ in range(num_blocks)])
        self.conv3 = (ConvNorm(hidden, out_channels, 1, activation=nn.SiLU()) if hidden != out_channels
                      else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(fresh_sum(self.bottlenecks(self.conv1(x)), self.conv2(x)))


class AIFI(nn.Module):
    """Transformer encoder layers over one map (``layers``), with its 2-D sin-cos positions."""

    def __init__(self, layers: list[TransformerEncoderLayer], temperature: float = 10000.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.temperature = temperature
        self.positions = SizeConstants(_positions)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[B, C, h, w] → [B, C, h, w]."""
        batch, channels, height, width = features.shape
        x = features.flatten(2).transpose(1, 2)  # [B, h·w, C]
        pos = self.positions((height, width, channels, self.temperature), device=x.device, dtype=x.dtype)
        for layer in self.layers:
            x, _ = layer(x, pos, None)
        return x.transpose(1, 2).reshape(batch, channels, height, width).contiguous()


class HybridEncoder(nn.Module):
    """Projection → AIFI on the coarsest map → CCFM. Maps [C3, C4, C5] of the backbone → three maps of
    ``hidden_dim`` channels at the same strides.

    Args:
        in_channels: the backbone maps' channels, finest first. hidden_dim: the encoder's width (256; 384 R101).
        num_heads, dim_feedforward, num_layers, dropout: the AIFI layers' (8, 1024, 1, 0.0).
        expansion: the CSP blocks' hidden width relative to hidden_dim (1.0; 0.5 for RT-DETRv2-S/M).
        temperature: of the sin-cos positions (10000).
        fusion_block, downsample: D-FINE's parts (``models/dfine/encoder.py``): a function that makes one fusion
            block (2 · hidden_dim → hidden_dim channels) and one stride-2 downsampling; None: RT-DETR's
            :class:`CSPRepLayer` and 3×3 stride-2 conv. lateral_activation: SiLU after the lateral 1×1 convs
            (RT-DETR's; D-FINE has none). fusion: how a fusion block's two inputs meet: "concat" (RT-DETR's and
            D-FINE's: the block takes 2 · hidden_dim channels) or "sum" (DEIMv2's: hidden_dim).
    """

    def __init__(self, in_channels: list[int], hidden_dim: int = 256, *, num_heads: int = 8,
                 dim_feedforward: int = 1024, num_layers: int = 1, dropout: float = 0.0, expansion: float = 1.0,
                 temperature: float = 10000.0, fusion_block: Callable[[], nn.Module] | None = None,
                 downsample: Callable[[], nn.Module] | None = None, lateral_activation: bool = True,
                 fusion: Literal["concat", "sum"] = "concat") -> None:
        super().__init__()
        if fusion not in ("concat", "sum"):
            raise ValueError(f"fusion must be 'concat' or 'sum', got {fusion!r}")
        self.hidden_dim = hidden_dim
        self.fusion = fusion
        #: whether an inference forward keeps the top-down concatenations in parts (set by :meth:`reparameterize`)
        self.concat_by_parts = False
        self.input_proj = nn.ModuleList(
            nn.Sequential(OrderedDict(conv=nn.Conv2d(channels, hidden_dim, 1, bias=False),
                                      norm=nn.BatchNorm2d(hidden_dim))) for channels in in_channels)
        layers = [TransformerEncoderLayer(hidden_dim, num_heads, dim_feedforward, dropout, activation=F.gelu)
                  for _ in range(num_layers)]
        self.encoder = nn.ModuleList([AIFI(layers, temperature)] if num_layers else [])
        fusions = len(in_channels) - 1
        if fusion_block is None:
            def fusion_block() -> nn.Module:
                return CSPRepLayer(hidden_dim * 2, hidden_dim, expansion=expansion)
        if downsample is None:
            def downsample() -> nn.Module:
                return ConvNorm(hidden_dim, hidden_dim, 3, 2, activation=nn.SiLU())
        self.lateral_convs = nn.ModuleList(
            ConvNorm(hidden_dim, hidden_dim, 1, activation=nn.SiLU() if lateral_activation else None)
            for _ in range(fusions))
        self.fpn_blocks = nn.ModuleList(fusion_block() for _ in range(fusions))
        self.downsample_convs = nn.ModuleList(downsample() for _ in range(fusions))
        self.pan_blocks = nn.ModuleList(fusion_block() for _ in range(fusions))

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """[C3, C4, C5] (finest first) → [P3, P4, P5], each [B, hidden_dim, h_l, w_l]."""
        projected = [projection(feature) for projection, feature in zip(self.input_proj, features)]
        for aifi in self.encoder:
            projected[-1] = aifi(projected[-1])
        # top-down: each coarser map, through its lateral conv, is upsampled and fused with the next finer one
        inner = [projected[-1]]  # coarsest first while building
        for index, (lateral, block) in enumerate(zip(self.lateral_convs, self.fpn_blocks)):
            high = lateral(inner[0])
            inner[0] = high
            finer = projected[len(projected) - 2 - index]
            inner.insert(0, block(self._fuse_upsampled(high, finer)))
        # bottom-up: each finer output is downsampled and fused with the next coarser top-down map
        outputs = [inner[0]]
        for index, (downsample, block) in enumerate(zip(self.downsample_convs, self.pan_blocks)):
            outputs.append(block(self._fuse(downsample(outputs[-1]), inner[index + 1])))
        return outputs

    def _fuse(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return first + second if self.fusion == "sum" else torch.cat([first, second], dim=1)

    def _fuse_upsampled(self, coarse: torch.Tensor, fine: torch.Tensor) -> torch.Tensor | UpsampledConcat:
        """The top-down fusion of ``coarse`` upsampled 2× (nearest) with ``fine``. A concatenation stays in its
        parts in a training step and once re-parameterised (:class:`~detr.models.layers.conv_norm.UpsampledConcat`:
        the fusion blocks' first 1 × 1 convolutions read the coarse part on the coarse map, the same sums in
        another order); the reference's forward writes it out."""
        if self.fusion == "concat":
            return upsampled_concat(coarse, fine, self.concat_by_parts or (self.training and torch.is_grad_enabled()))
        return F.interpolate(coarse, scale_factor=2.0, mode="nearest") + fine

    def reparameterize(self) -> int:
        """Fold every RepVGG block's two branches into one convolution (inference only), and read the top-down
        concatenations by parts from now on (:meth:`_fuse_upsampled`); returns how many blocks were folded."""
        self.concat_by_parts = True
        blocks = [module for module in self.modules() if isinstance(module, RepVggBlock) and module.fused is None]
        for block in blocks:
            block.reparameterize()
        return len(blocks)
