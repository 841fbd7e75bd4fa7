"""DEIMv2's S-X backbone: a DINOv3 ViT (Siméoni et al. 2025) beside a small convolutional spatial tuning adapter
(STA), as transformers' ``Deimv2DINOv3ConvEncoder`` runs them.

The ViT cuts the image into 16 × 16 patches (``embeddings.patch_embeddings``), prepends a class token and
``num_register_tokens`` register tokens, and runs pre-norm layers (LayerNorm → attention → layer scale, residual;
LayerNorm → MLP → layer scale, residual). Positions are rotary (RoPE) on the patch tokens only: each head's query
and key rotate by angles ``2π · c · θ_i`` of the patch centre c ∈ [-1, 1]² (y for the first half of the
frequencies, x for the second), ``θ_i = base^(-4i / head_dim)``, so a map of any size has positions. The patch
tokens of the layers in ``out_layers`` (each through the final LayerNorm) are three stride-16 maps, resized
bilinearly to strides 8, 16 and 32 (semantic features). The STA (``spatial_tuning_adapter``: a 3×3 stride-2 conv
with GELU, a max-pool, then three 3×3 stride-2 convs, GELU between them) gives 2c, 4c and 4c channels at strides
8, 16, 32 (detail features). Each level returns [semantic, detail] concatenated; the hybrid encoder's 1×1 input
projections are transformers' ``fusion_proj``.

Parameter names are transformers' (``backbone.embeddings.*``, ``backbone.layer.{i}.*``, as transformers writes them, ``backbone.norm``,
``spatial_tuning_adapter.*``): the authors' DEIMv2 files are not read here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.conv_norm import ConvNorm, fold_batch_norms


PATCH_SIZE = 16


def rope_angles(height: int, width: int, head_dim: int, base: float, *, device: torch.device | None = None
                ) -> torch.Tensor:
    """The rotary angles of an h × w patch grid → [h·w, head_dim]: for centres (y, x) in [-1, 1],
    ``[2π y θ, 2π x θ]`` tiled twice, ``θ_i = base^(-4i / head_dim)``, i < head_dim / 4."""
    frequencies = 1 / base ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=device)
    rows = torch.arange(0.5, height, dtype=torch.float32, device=device) / height
    columns = torch.arange(0.5, width, dtype=torch.float32, device=device) / width
    centres = torch.stack(torch.meshgrid(rows, columns, indexing="ij"), dim=-1).flatten(0, 1) * 2 - 1  # [h·w, 2]
    angles = (2 * math.pi * centres[:, :, None] * frequencies[None, None, :]).flatten(1, 2)
    return angles.tile(2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Attention(nn.Module):
    """Multi-head self-attention with RoPE on the patch tokens (the first ``num_prefix`` tokens unrotated):
    ``q_proj``, ``k_proj`` (no bias), ``v_proj``, ``o_proj``."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_prefix: int) -> torch.Tensor:
        """x [B, T, C], cos / sin [h·w, C / heads] → [B, T, C]."""
        batch, tokens, dim = x.shape
        q, k, v = (projection(x).view(batch, tokens, self.num_heads, -1).transpose(1, 2)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        q = torch.cat([q[:, :, :num_prefix], _rotate(q[:, :, num_prefix:], cos, sin)], dim=2)
        k = torch.cat([k[:, :, :num_prefix], _rotate(k[:, :, num_prefix:], cos, sin)], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v)
        return self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, dim))


class LayerScale(nn.Module):
    """``x · lambda1``, one learned scale per channel."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1


class Mlp(nn.Module):
    """``down_proj(gelu(up_proj(x)))``, or gated (``down_proj(silu(gate_proj(x)) · up_proj(x))``)."""

    def __init__(self, dim: int, hidden_dim: int, *, gated: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim) if gated else None
        self.up_proj = nn.Linear(dim, hidden_dim)
        self.down_proj = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is not None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class Layer(nn.Module):
    """A pre-norm ViT layer with layer scales: ``norm1``, ``attention``, ``layer_scale1``, ``norm2``, ``mlp``,
    ``layer_scale2``."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *, gated: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Attention(dim, num_heads)
        self.layer_scale1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim, gated=gated)
        self.layer_scale2 = LayerScale(dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_prefix: int) -> torch.Tensor:
        x = x + self.layer_scale1(self.attention(self.norm1(x), cos, sin, num_prefix))
        return x + self.layer_scale2(self.mlp(self.norm2(x)))


class Embeddings(nn.Module):
    """Patches (``patch_embeddings``, a 16 × 16 stride-16 conv) after the class and register tokens; ``mask_token``
    (pre-training only) is kept so that the weights load whole."""

    def __init__(self, dim: int, num_register_tokens: int) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, dim))
        self.patch_embeddings = nn.Conv2d(3, dim, PATCH_SIZE, PATCH_SIZE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embeddings(images).flatten(2).transpose(1, 2)  # [B, h·w, C]
        batch = patches.shape[0]
        return torch.cat([self.cls_token.expand(batch, -1, -1), self.register_tokens.expand(batch, -1, -1), patches], 1)


class DINOv3ViT(nn.Module):
    """The ViT: images [B, 3, H, W] (H, W multiples of 16) → the patch tokens of the layers ``out_layers``
    (1-based: layer i's output; each through ``norm``) as maps [B, C, H / 16, W / 16]."""

    def __init__(self, dim: int, depth: int, num_heads: int, mlp_dim: int, *, num_register_tokens: int,
                 out_layers: tuple[int, ...], gated_mlp: bool = False, rope_base: float = 100.0) -> None:
        super().__init__()
        self.embeddings = Embeddings(dim, num_register_tokens)
        self.layer = nn.ModuleList(Layer(dim, num_heads, mlp_dim, gated=gated_mlp) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head_dim, self.rope_base = dim // num_heads, rope_base
        self.num_prefix = 1 + num_register_tokens
        self.out_layers = tuple(out_layers)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        batch, _, height, width = images.shape
        rows, columns = height // PATCH_SIZE, width // PATCH_SIZE
        angles = rope_angles(rows, columns, self.head_dim, self.rope_base, device=images.device)
        cos, sin = angles.cos().to(images.dtype), angles.sin().to(images.dtype)
        x = self.embeddings(images)
        maps = []
        for index, layer in enumerate(self.layer, start=1):
            x = layer(x, cos, sin, self.num_prefix)
            if index in self.out_layers:
                patches = self.norm(x)[:, self.num_prefix:]
                maps.append(patches.transpose(1, 2).reshape(batch, -1, rows, columns))
        return maps


class SpatialTuningAdapter(nn.Module):
    """Detail features: images → maps of 2c, 4c, 4c channels at strides 8, 16, 32 (``stem_conv``, a max-pool,
    ``conv2`` .. ``conv4``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.stem_conv = ConvNorm(3, channels, 3, 2, activation=nn.GELU())
        self.conv2 = ConvNorm(channels, 2 * channels, 3, 2)
        self.conv3 = ConvNorm(2 * channels, 4 * channels, 3, 2)
        self.conv4 = ConvNorm(4 * channels, 4 * channels, 3, 2)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        stride_8 = self.conv2(F.max_pool2d(self.stem_conv(images), 3, 2, 1))
        stride_16 = self.conv3(F.gelu(stride_8))
        return [stride_8, stride_16, self.conv4(F.gelu(stride_16))]


class DINOv3Backbone(nn.Module):
    """The ViT's semantic and the adapter's detail features: images [B, 3, H, W] (H, W multiples of 32) → three
    maps at strides 8, 16, 32 of ``out_channels`` = (C + 2c, C + 4c, C + 4c) channels (semantic first).

    Args: the ViT's (:class:`DINOv3ViT`: width ``dim``, ``depth`` layers, ``num_heads``, ``mlp_dim``,
        ``num_register_tokens``, three ``out_layers``, ``gated_mlp``) and ``adapter_channels`` (c, 16).
    """

    def __init__(self, dim: int, depth: int, num_heads: int, mlp_dim: int, *, num_register_tokens: int,
                 out_layers: tuple[int, ...], gated_mlp: bool = False, adapter_channels: int = 16) -> None:
        super().__init__()
        if len(out_layers) != 3 or not all(1 <= layer <= depth for layer in out_layers):
            raise ValueError(f"out_layers must name three of the ViT's layers 1 ... {depth}, got {out_layers}")
        self.backbone = DINOv3ViT(dim, depth, num_heads, mlp_dim, num_register_tokens=num_register_tokens,
                                  out_layers=out_layers, gated_mlp=gated_mlp)
        self.spatial_tuning_adapter = SpatialTuningAdapter(adapter_channels)
        self.out_channels = [dim + 2 * adapter_channels, dim + 4 * adapter_channels, dim + 4 * adapter_channels]
        self.channels_last = False  # the RT-DETR family's switch; the ViT runs on tokens

    @torch.no_grad()
    def fold_batch_norms(self) -> int:
        """Fold the adapter's BatchNorms into its convolutions (inference only); returns how many."""
        return fold_batch_norms(self.spatial_tuning_adapter)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        rows, columns = images.shape[-2] // PATCH_SIZE, images.shape[-1] // PATCH_SIZE
        semantic = [F.interpolate(feature, size=[int(rows * scale), int(columns * scale)], mode="bilinear",
                                  align_corners=False)
                    for feature, scale in zip(self.backbone(images), (2, 1, 0.5))]
        detail = self.spatial_tuning_adapter(images)
        return [torch.cat([coarse, fine], dim=1) for coarse, fine in zip(semantic, detail)]
