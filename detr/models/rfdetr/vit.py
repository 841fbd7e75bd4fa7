"""RF-DETR's backbone: a DINOv2 ViT (Oquab et al. 2023) whose blocks attend within windows except a few that attend
globally (Robinson et al., "RF-DETR", 2025; LW-DETR, Chen et al. 2024, §3.1), as transformers'
``RfDetrDinov2Backbone`` builds it.

The image is cut into ``patch_size`` patches (a strided convolution); a [CLS] token and a learned position table
(learned at ``position_size`` pixels, bicubically interpolated, antialiased, to other sizes) are added; the patch grid
is then split into ``num_windows`` × ``num_windows`` windows, each with a copy of the [CLS] token, and the windows
travel as separate sequences. A windowed block attends within its window; a global block joins an image's windows
into one sequence for its attention (and splits them again after it). The stages named by ``out_indices`` (the
output after that many blocks) are layer-normed, stitched back into maps [B, C, H / patch, W / patch] and
returned; those blocks, and the ones after the last, are the global ones.

Parameter names follow transformers': ``patch_embed`` (its ``patch_embeddings.projection``), ``cls_token``,
``mask_token`` (only training's masked modelling reads it), ``position_embeddings``,
``blocks.{i}.{norm1,attention.{q,k,v,o}_proj,layer_scale1,norm2,mlp.{fc1,fc2},layer_scale2}``, ``norm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.size_constants import SizeConstants


class Attention(nn.Module):
    """Multi-head self-attention with separate q, k, v and output projections (scaled dot product)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, C] → [N, L, C]."""
        count, length, dim = x.shape
        q, k, v = (projection(x).view(count, length, self.num_heads, -1).transpose(1, 2)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))  # [N, heads, L, C / heads]
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(count, length, dim))


class Mlp(nn.Module):
    """fc1 → GELU → fc2."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm ViT block with layer scale; ``global_attention``: its attention joins an image's windows."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int, *, global_attention: bool, num_windows: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attention = Attention(dim, num_heads)
        self.layer_scale1 = nn.Parameter(torch.ones(dim))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, dim * mlp_ratio)
        self.layer_scale2 = nn.Parameter(torch.ones(dim))
        self.global_attention, self.windows = global_attention, num_windows ** 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B · windows, L, C] (each window a sequence) → the same shape."""
        count, length, dim = x.shape
        joined = x.view(count // self.windows, self.windows * length, dim) if self.global_attention else x
        attended = self.attention(self.norm1(joined)).view(count, length, dim)
        x = x + attended * self.layer_scale1
        return x + self.mlp(self.norm2(x)) * self.layer_scale2


class WindowedViT(nn.Module):
    """Images [B, 3, H, W] (H and W multiples of ``patch_size`` × ``num_windows``) → one map
    [B, hidden_dim, H / patch_size, W / patch_size] per stage of ``out_indices``.

    Args:
        hidden_dim, num_layers, num_heads, mlp_ratio: the ViT's width, blocks, heads and MLP ratio.
        out_indices: the stages returned (the output after that many blocks), increasing.
        num_windows: windows per side (1: every block attends globally).
        patch_size: pixels per patch side. position_size: the image side of the position table.
    """

    def __init__(self, hidden_dim: int = 384, num_layers: int = 12, num_heads: int = 6, mlp_ratio: int = 4, *,
                 out_indices: Sequence[int] = (2, 5, 8, 11), num_windows: int = 4, patch_size: int = 14,
                 position_size: int = 518) -> None:
        super().__init__()
        self.out_indices, self.num_windows, self.patch_size = tuple(out_indices), num_windows, patch_size
        self.out_channels = [hidden_dim] * len(self.out_indices)
        self.patch_embed = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, hidden_dim))
        self.position_embeddings = nn.Parameter(torch.zeros(1, (position_size // patch_size) ** 2 + 1, hidden_dim))
        nn.init.trunc_normal_(self.position_embeddings, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        windowed = set(range(self.out_indices[-1] + 1)) - set(self.out_indices)
        self.blocks = nn.ModuleList(Block(hidden_dim, num_heads, mlp_ratio, global_attention=i not in windowed,
                                          num_windows=num_windows) for i in range(num_layers))
        self.norm = nn.LayerNorm(hidden_dim, eps=1e-6)
        # the interpolated table, kept per grid under inference mode only (keyed by the table's version, so that a
        # change of the weights computes it afresh)
        self._positions = SizeConstants(self._interpolated_positions)

    @property
    def multiple(self) -> int:
        """What the input's height and width must divide by."""
        return self.patch_size * self.num_windows

    def positions(self, rows: int, columns: int) -> torch.Tensor:
        """The position table for a rows × columns patch grid → [1, 1 + rows · columns, C] ([CLS] first)."""
        table = self.position_embeddings
        side = int((table.shape[1] - 1) ** 0.5)
        if rows == columns == side:
            return table
        if not torch.is_inference_mode_enabled():  # a traced or trained forward computes it (the key reads storage)
            return self._interpolated_positions((rows, columns), device=table.device, dtype=table.dtype)
        key = (rows, columns, table._version, table.data_ptr())
        return self._positions(key, device=table.device, dtype=table.dtype)

    def _interpolated_positions(self, key: tuple[int, ...], *, device: torch.device, dtype: torch.dtype
                                ) -> torch.Tensor:
        rows, columns = key[:2]
        table = self.position_embeddings
        side = int((table.shape[1] - 1) ** 0.5)
        grid = table[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid.float(), size=(rows, columns), mode="bicubic", align_corners=False,
                             antialias=True).to(table.dtype)
        return torch.cat([table[:, :1], grid.permute(0, 2, 3, 1).reshape(1, rows * columns, -1)], dim=1)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        batch, _, height, width = images.shape
        if height % self.multiple or width % self.multiple:
            raise ValueError(f"the windowed ViT takes images whose sides divide by patch_size × num_windows "
                             f"({self.multiple}), got {height} × {width}")
        if self.num_windows > 1 and height != width:
            raise ValueError(f"the windowed ViT takes square images (the authors' window reshape, which transformers "
                             f"keeps, mixes up rows and columns otherwise), got {height} × {width}: resize to a square, "
                             f"as the model's input_spec does")
        rows, columns = height // self.patch_size, width // self.patch_size
        tokens = self.patch_embed(images).flatten(2).transpose(1, 2)  # [B, rows · columns, C]
        tokens = torch.cat([self.cls_token.expand(batch, -1, -1), tokens], dim=1) + self.positions(rows, columns)
        x = self._partition(tokens, rows, columns)
        features = []
        for index, block in enumerate(self.blocks[: self.out_indices[-1]], start=1):
            x = block(x)
            if index in self.out_indices:
                features.append(self._unpartition(self.norm(x)[:, 1:], batch, rows, columns))
        return features

    def _partition(self, tokens: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        """[B, 1 + rows · columns, C] → [B · windows², 1 + patches per window, C], [CLS] copied into each window.
        The reshape is the authors' and transformers' (which name the split sizes the other way round: right on the
        square grids that :meth:`forward` allows)."""
        windows = self.num_windows
        if windows == 1:
            return tokens
        batch, _, dim = tokens.shape
        grid = tokens[:, 1:].reshape(batch, windows, columns // windows, windows, rows // windows, dim)
        grid = grid.transpose(2, 3).reshape(batch * windows ** 2, (rows // windows) * (columns // windows), dim)
        return torch.cat([tokens[:, :1].repeat(windows ** 2, 1, 1), grid], dim=1)

    def _unpartition(self, patches: torch.Tensor, batch: int, rows: int, columns: int) -> torch.Tensor:
        """[B · windows², patches per window, C] (no [CLS]) → the map [B, C, rows, columns]."""
        windows, dim = self.num_windows, patches.shape[-1]
        if windows > 1:
            patches = patches.reshape(batch, windows, windows, rows // windows, columns // windows, dim).transpose(2, 3)
        return patches.reshape(batch, rows, columns, dim).permute(0, 3, 1, 2).contiguous()
