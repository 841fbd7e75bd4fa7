"""2-D position encodings computed from the padding mask (the authors' models/layers/position_encoding.py).

Both encodings return ``pos`` float32 [B, hidden_dim, h, w] for a feature map of size h × w.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sine_embedding(angles: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """float [...] angles (positions already scaled, e.g. to [0, 2π]) → float32 [..., num_feats]: channel ``i``
    is ``angle / temperature ** (2 ⌊i/2⌋ / num_feats)``, sin on even and cos on odd channels (interleaved),
    "Attention is all you need"'s encoding, which DETR's feature-map positions, DAB-DETR's anchor boxes
    and Deformable DETR's two-stage proposals all use."""
    dim_t = torch.arange(num_feats, dtype=torch.float32, device=angles.device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / num_feats)
    scaled = angles[..., None] / dim_t
    return torch.stack((scaled[..., 0::2].sin(), scaled[..., 1::2].cos()), dim=-1).flatten(-2)


class PositionEmbeddingSine(nn.Module):
    """The paper's sine encoding, generalised from "Attention is all you need" to 2-D.

    Each axis gets ``num_pos_feats = hidden_dim / 2`` channels. Positions are the cumulative count of
    non-padded pixels along the axis (1 at the first pixel), normalised by the last value (+1e-6) and
    scaled to 2π, so padding never shifts the encoding of real pixels. Channel ``i`` uses frequency
    ``temperature ** (2 * (i // 2) / num_pos_feats)``, sin on even and cos on odd channels (interleaved),
    and the output is ``concat(y, x)``: y first. ``offset`` is added to the count before normalising: 0 for
    DETR, -0.5 (cell centres) for Deformable DETR, as the authors' code of each.
    """

    def __init__(self, num_pos_feats: int = 128, temperature: float = 10000.0, normalize: bool = True,
                 scale: float = 2 * math.pi, offset: float = 0.0) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.offset = offset
        self.temperature = temperature
        self.normalize = normalize
        self.scale = scale

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """mask bool [B, h, w] (True = padding) → pos float32 [B, 2 * num_pos_feats, h, w]."""
        not_mask = ~mask
        y_embed = not_mask.cumsum(1, dtype=torch.float32)  # [B, h, w]
        x_embed = not_mask.cumsum(2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = (y_embed + self.offset) / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = (x_embed + self.offset) / (x_embed[:, :, -1:] + eps) * self.scale
        pos_x = sine_embedding(x_embed, self.num_pos_feats, self.temperature)  # [B, h, w, F]
        pos_y = sine_embedding(y_embed, self.num_pos_feats, self.temperature)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class PositionEmbeddingLearned(nn.Module):
    """Learned absolute encoding: 50 row and 50 column embeddings, output ``concat(x, y)``: x first."""

    def __init__(self, num_pos_feats: int = 128, max_size: int = 50) -> None:
        super().__init__()
        self.row_embed = nn.Embedding(max_size, num_pos_feats)
        self.col_embed = nn.Embedding(max_size, num_pos_feats)
        nn.init.uniform_(self.row_embed.weight)
        nn.init.uniform_(self.col_embed.weight)

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """mask bool [B, h, w] → pos float32 [B, 2 * num_pos_feats, h, w]; h, w ≤ 50."""
        h, w = mask.shape[-2:]
        if h > self.row_embed.num_embeddings or w > self.col_embed.num_embeddings:
            raise ValueError(
                f"learned position encoding covers feature maps up to {self.row_embed.num_embeddings} × "
                f"{self.col_embed.num_embeddings}, got {h} × {w}; use smaller images or position_encoding='sine'"
            )
        x_emb = self.col_embed(torch.arange(w, device=mask.device))  # [w, F]
        y_emb = self.row_embed(torch.arange(h, device=mask.device))  # [h, F]
        pos = torch.cat([x_emb.unsqueeze(0).expand(h, -1, -1), y_emb.unsqueeze(1).expand(-1, w, -1)], dim=-1)
        return pos.permute(2, 0, 1).unsqueeze(0).expand(mask.shape[0], -1, -1, -1)
