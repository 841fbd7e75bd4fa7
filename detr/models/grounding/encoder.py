"""The feature enhancer (Grounding DINO §3.2, Fig. 3): per layer, image-text fusion, then the text's
self-attention (within each phrase) and the image's deformable self-attention, each followed by its FFN.

Names are the authors' (IDEA-Research/GroundingDINO ``TransformerEncoder``): ``fusion_layers.{i}``,
``text_layers.{i}`` (``self_attn`` with one ``in_proj``, ``linear1/2``, ``norm1/2``) and ``layers.{i}`` (Deformable
DETR's encoder layer, :class:`detr.models.deformable.transformer.DeformableEncoderLayer`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.deformable_attention import SpatialShapes
from detr.models.deformable.transformer import DeformableEncoderLayer
from detr.models.grounding.fusion import BiAttentionBlock


class TextEnhancerLayer(nn.Module):
    """Self-attention among the prompt's tokens (positions added to queries and keys), then the FFN; post-norm."""

    def __init__(self, hidden_dim: int, num_heads: int, dim_feedforward: int, *, dropout: float = 0.0,
                 layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.self_attn = nn.MultiheadAttention(hidden_dim, num_heads, dropout=0.0, batch_first=True)
        self.linear1 = nn.Linear(hidden_dim, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, hidden_dim)
        self.norm1 = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.norm2 = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, text: torch.Tensor, position: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """text, position [B, N, C]; allowed bool [B, N, N] (True: token i may attend to token j) → [B, N, C]."""
        blocked = (~allowed).repeat_interleave(self.num_heads, 0)  # [B·H, N, N]
        query = text + position
        attended = self.self_attn(query, query, text, attn_mask=blocked, need_weights=False)[0]
        text = self.norm1(text + self.dropout(attended))
        return self.norm2(text + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(text))))))


class FeatureEnhancer(nn.Module):
    """The stack of feature-enhancer layers: ``fusion_layers``, ``text_layers`` and ``layers`` (one of each per
    layer, run in that order)."""

    def __init__(self, fusion_layers: list[BiAttentionBlock], text_layers: list[TextEnhancerLayer],
                 layers: list[DeformableEncoderLayer]) -> None:
        super().__init__()
        if not len(fusion_layers) == len(text_layers) == len(layers):
            raise ValueError("the feature enhancer needs as many fusion and text layers as deformable ones, got "
                             f"{len(fusion_layers)}, {len(text_layers)} and {len(layers)}")
        self.fusion_layers = nn.ModuleList(fusion_layers)
        self.text_layers = nn.ModuleList(text_layers)
        self.layers = nn.ModuleList(layers)

    def forward(self, vision: torch.Tensor, vision_position: torch.Tensor, reference_points: torch.Tensor,
                spatial_shapes: SpatialShapes, vision_padding: torch.Tensor, text: torch.Tensor,
                text_position: torch.Tensor, text_padding: torch.Tensor, text_allowed: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """vision, vision_position [B, S, C] (the flattened levels, positions with level embeddings);
        reference_points [B, S, L, 2]; vision_padding bool [B, S]; text, text_position [B, N, C]; text_padding
        bool [B, N] (True = padding); text_allowed bool [B, N, N] (:func:`detr.models.grounding.text.phrase_attention`)
        → enhanced vision [B, S, C] and text [B, N, C]."""
        for fusion, text_layer, layer in zip(self.fusion_layers, self.text_layers, self.layers):
            vision, text = fusion(vision, text, vision_padding, text_padding)
            text = text_layer(text, text_position, text_allowed)
            vision = layer(vision, vision_position, reference_points, spatial_shapes, vision_padding)
        return vision, text
