"""RF-DETR's instance-segmentation head (transformers' ``RfDetrForInstanceSegmentation``): per-query masks as the
product of query features and pixel features.

Pixel features: the projector's map, resized (bilinear) to a quarter of the input, then through one block per
decoder layer (a depthwise 3 × 3 convolution, a LayerNorm over channels, a pointwise linear layer and GELU, with a
residual: a ConvNeXt-like block), each followed by the shared 1 × 1 ``spatial_proj``. Query features: a decoder
layer's output through a pre-norm MLP block with a residual (``query_block``) and ``query_proj``. Mask logits
[B, Q, H / 4, W / 4] = query features · pixel features + ``bias``. Inference reads the last layer's.

Training (the authors' ``sparse_forward``; transformers' ``RfDetrForInstanceSegmentation``): every decoder layer's
masks, layer i on the pixel features after block i, and the selected encoder proposals' masks, on the resized
projector map itself (no block, no ``spatial_proj``: the authors' ``skip_blocks``), all kept as their two factors
(:class:`~detr.models.outputs.MaskFeatures`) for the point-sampled mask loss (:mod:`detr.loss.masks`).

Parameter names follow transformers': ``blocks.{i}.{depthwise_conv,norm,pointwise_conv}``, ``spatial_proj``,
``query_block.{norm,fc1,fc2}``, ``query_proj``, ``bias``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.outputs import MaskFeatures

#: Mask logits come at this stride of the input.
MASK_STRIDE = 4


class PixelBlock(nn.Module):
    """Depthwise 3 × 3 → LayerNorm (channels, eps 1e-6) → linear → GELU, plus the input."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.depthwise_conv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pointwise_conv = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.depthwise_conv(x).permute(0, 2, 3, 1))
        return x + F.gelu(self.pointwise_conv(y)).permute(0, 3, 1, 2)


class QueryBlock(nn.Module):
    """x + fc2(GELU(fc1(LayerNorm(x))))."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class MaskHead(nn.Module):
    """Args: dim: the decoder's width. num_layers: the decoder's layers (one pixel block each). hidden_dim: the
    query block's MLP width."""

    def __init__(self, dim: int, num_layers: int, hidden_dim: int = 1024) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PixelBlock(dim) for _ in range(num_layers))
        self.spatial_proj = nn.Conv2d(dim, dim, kernel_size=1)
        self.query_block = QueryBlock(dim, hidden_dim)
        self.query_proj = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(1))

    def _resized(self, features: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        size = (image_size[0] // MASK_STRIDE, image_size[1] // MASK_STRIDE)
        return F.interpolate(features, size=size, mode="bilinear", align_corners=False)

    def _queries(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.query_proj(self.query_block(hidden))

    def layer_features(self, features: torch.Tensor, queries: torch.Tensor, image_size: tuple[int, int]
                       ) -> list[MaskFeatures]:
        """Every layer's masks as factors (training): features [B, C, h, w] (the projector's map); queries
        [L, B, Q, C] (each decoder layer's output); image_size (H, W) → per layer :class:`MaskFeatures` with pixels
        [B, C, H / 4, W / 4] (after that layer's block and ``spatial_proj``) and queries [B, Q, C]."""
        pixels = self._resized(features, image_size)
        result = []
        for block, hidden in zip(self.blocks, queries):
            pixels = block(pixels)
            result.append(MaskFeatures(self.spatial_proj(pixels), self._queries(hidden), self.bias))
        return result

    def proposal_features(self, features: torch.Tensor, hidden: torch.Tensor, image_size: tuple[int, int]
                          ) -> MaskFeatures:
        """The selected encoder proposals' masks as factors: hidden [B, Q, C] (their features) against the resized
        projector map, with no pixel block and no ``spatial_proj`` (the authors' and transformers' ``skip_blocks``)."""
        return MaskFeatures(self._resized(features, image_size), self._queries(hidden), self.bias)

    def forward(self, features: torch.Tensor, queries: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """features [B, C, h, w] (the projector's map); queries [L, B, Q, C] (each decoder layer's output, or the
        first ones: the pixel blocks run up to the last given); image_size (H, W) of the input → mask logits
        [B, Q, H / 4, W / 4] of the last layer given."""
        pixels = self._resized(features, image_size)
        for block in self.blocks[: len(queries)]:
            pixels = block(pixels)
        pixels = self.spatial_proj(pixels)
        query = self._queries(queries[-1])  # [B, Q, C]
        masks = torch.matmul(query, pixels.flatten(2))  # [B, Q, h'·w']
        return masks.view(*query.shape[:2], *pixels.shape[-2:]) + self.bias
