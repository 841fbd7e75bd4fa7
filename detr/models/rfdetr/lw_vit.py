"""LW-DETR's backbone (Chen et al., "LW-DETR", 2024, §3.1): a plain ViT (CAE-pretrained in the paper) with windowed
and global attention interleaved, as transformers' ``LwDetrViTBackbone`` builds it.

Patches (a strided convolution) plus a learned position table (learned at ``position_size`` pixels, its [CLS] entry
unused, bicubically interpolated without antialiasing to other sizes); no [CLS] token. The patch grid is split into
``num_windows`` × ``num_windows`` windows that travel as separate sequences; the blocks of ``window_blocks`` attend
within their window, the others join an image's windows for their attention. Pre-norm blocks with layer scale
(CAE's ``gamma``), the key projection without bias. The stages of ``out_indices`` are stitched back into maps
[B, C, H / patch, W / patch], without a final norm.

Parameter names: ``patch_embed``, ``position_embeddings``, ``blocks.{i}.{norm1,attention.{q,k,v,o}_proj,
layer_scale1,norm2,mlp.{fc1,fc2},layer_scale2}`` (:mod:`detr.checkpoints.rfdetr` maps transformers' to them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.rfdetr.vit import Mlp


class Attention(nn.Module):
    """Multi-head self-attention, q, k (no bias), v and output projections (scaled dot product)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, C] → [N, L, C]."""
        count, length, dim = x.shape
        q, k, v = (projection(x).view(count, length, self.num_heads, -1).transpose(1, 2)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(count, length, dim))


class Block(nn.Module):
    """A pre-norm ViT block with layer scale; ``window``: its attention stays within each window."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int, *, window: bool, windows: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attention = Attention(dim, num_heads)
        self.layer_scale1 = nn.Parameter(torch.full((dim,), 0.1))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, dim * mlp_ratio)
        self.layer_scale2 = nn.Parameter(torch.full((dim,), 0.1))
        self.window, self.windows = window, windows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B · windows, L, C] → the same shape."""
        count, length, dim = x.shape
        normed = self.norm1(x)
        if not self.window:
            normed = normed.reshape(count // self.windows, self.windows * length, dim)
        x = x + (self.attention(normed) * self.layer_scale1).reshape(count, length, dim)
        return x + self.mlp(self.norm2(x)) * self.layer_scale2


class LwDetrViT(nn.Module):
    """Images [B, 3, H, W] (H and W multiples of ``patch_size`` × ``num_windows``) → one map
    [B, hidden_dim, H / patch_size, W / patch_size] per stage of ``out_indices``.

    Args:
        hidden_dim, num_layers, num_heads, mlp_ratio: the ViT's width, blocks, heads and MLP ratio.
        out_indices: the stages returned (the output after that many blocks), increasing.
        window_blocks: the blocks that attend within windows. num_windows: windows per side.
        patch_size: pixels per patch side. position_size: the image side of the position table.
    """

    def __init__(self, hidden_dim: int = 192, num_layers: int = 10, num_heads: int = 3, mlp_ratio: int = 4, *,
                 out_indices: Sequence[int] = (2, 4, 5, 9), window_blocks: Sequence[int] = (0, 1, 3, 6, 7, 9),
                 num_windows: int = 4, patch_size: int = 16, position_size: int = 224) -> None:
        super().__init__()
        self.out_indices, self.num_windows, self.patch_size = tuple(out_indices), num_windows, patch_size
        self.out_channels = [hidden_dim] * len(self.out_indices)
        self.patch_embed = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        self.position_embeddings = nn.Parameter(torch.zeros(1, (position_size // patch_size) ** 2 + 1, hidden_dim))
        nn.init.trunc_normal_(self.position_embeddings, std=0.02)
        self.blocks = nn.ModuleList(Block(hidden_dim, num_heads, mlp_ratio, window=i in set(window_blocks),
                                          windows=num_windows ** 2) for i in range(num_layers))

    @property
    def multiple(self) -> int:
        """What the input's height and width must divide by."""
        return self.patch_size * self.num_windows

    def positions(self, rows: int, columns: int) -> torch.Tensor:
        """The position table (its [CLS] entry dropped) for a rows × columns patch grid → [1, rows, columns, C]."""
        table = self.position_embeddings[:, 1:]
        side = int(table.shape[1] ** 0.5)
        grid = table.reshape(1, side, side, -1)
        if rows == columns == side:
            return grid
        resized = F.interpolate(grid.permute(0, 3, 1, 2), size=(rows, columns), mode="bicubic", align_corners=False)
        return resized.permute(0, 2, 3, 1)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        batch, _, height, width = images.shape
        if height % self.multiple or width % self.multiple:
            raise ValueError(f"LW-DETR's ViT takes images whose sides divide by patch_size × num_windows "
                             f"({self.multiple}), got {height} × {width}")
        grid = self.patch_embed(images).permute(0, 2, 3, 1)  # [B, rows, columns, C]
        _, rows, columns, dim = grid.shape
        grid = grid + self.positions(rows, columns)
        side, window_rows, window_columns = self.num_windows, rows // self.num_windows, columns // self.num_windows
        x = grid.reshape(batch, side, window_rows, side, window_columns, dim).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(batch * side ** 2, window_rows * window_columns, dim)
        features = []
        for index, block in enumerate(self.blocks[: self.out_indices[-1]], start=1):
            x = block(x)
            if index in self.out_indices:
                stage = x.reshape(batch, side, side, window_rows, window_columns, dim).permute(0, 5, 1, 3, 2, 4)
                features.append(stage.reshape(batch, dim, rows, columns))
        return features
