"""The cross-modality decoder (Grounding DINO §3.4, Fig. 3): per layer, self-attention among the queries,
cross-attention to the prompt's tokens, deformable cross-attention to the image, the FFN; each box refined
layer by layer as in Deformable DETR's iterative refinement.

Names are the authors' (IDEA-Research/GroundingDINO ``DeformableTransformerDecoderLayer``): ``self_attn`` +
``norm2``, ``ca_text`` + ``catext_norm``, ``cross_attn`` + ``norm1``, ``linear1/2`` + ``norm3``; the decoder's
``norm`` and ``ref_point_head``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, SpatialShapes
from detr.models.deformable.transformer import REFERENCE_EPS
from detr.models.grounding.text import box_position_embedding
from detr.models.layers.mlp import MLP


@dataclass
class LayerAttention:
    """Where one decoder layer's queries looked (``return_attention``): in the image, the deformable
    cross-attention's sampling_locations [B, Q, heads, levels, P, 2] (x, y in [0, 1] of each level's padded map)
    and weights [B, Q, heads, levels, P] (summing to 1 per head); in the prompt, the text cross-attention's
    text_weights [B, heads, Q, N] (softmax over the prompt's tokens: 1 per head and query, 0 at padding)."""

    sampling_locations: torch.Tensor
    sampling_weights: torch.Tensor
    text_weights: torch.Tensor


class CrossModalityDecoderLayer(nn.Module):
    """One decoder layer; post-norm after each of its four blocks."""

    def __init__(self, hidden_dim: int, num_heads: int, num_levels: int, num_points: int, dim_feedforward: int, *,
                 dropout: float = 0.1, layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(hidden_dim, num_heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.ca_text = nn.MultiheadAttention(hidden_dim, num_heads, dropout=dropout, batch_first=True)
        self.catext_norm = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.cross_attn = MultiScaleDeformableAttention(hidden_dim, num_heads, num_levels, num_points)
        self.norm1 = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.linear1 = nn.Linear(hidden_dim, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, hidden_dim)
        self.norm3 = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, target: torch.Tensor, query_pos: torch.Tensor, reference_points: torch.Tensor,
                memory: torch.Tensor, spatial_shapes: SpatialShapes, memory_padding: torch.Tensor,
                text: torch.Tensor, text_padding: torch.Tensor, return_attention: bool = False
                ) -> tuple[torch.Tensor, LayerAttention | None]:
        """target, query_pos [B, Q, C]; reference_points [B, Q, L, 4] (boxes in each level's padded map);
        memory [B, S, C] with memory_padding bool [B, S]; text [B, N, C] with text_padding bool [B, N]
        (True = padding) → ([B, Q, C], with ``return_attention`` the layer's :class:`LayerAttention`, else
        None)."""
        query = target + query_pos
        attended = self.self_attn(query, query, target, need_weights=False)[0]
        target = self.norm2(target + self.dropout(attended))
        attended, text_weights = self.ca_text(target + query_pos, text, text, key_padding_mask=text_padding,
                                              need_weights=return_attention, average_attn_weights=False)
        target = self.catext_norm(target + self.dropout(attended))
        attended, sampling = self.cross_attn(target + query_pos, reference_points, memory, spatial_shapes,
                                             memory_padding, return_attention)
        target = self.norm1(target + self.dropout(attended))
        target = self.norm3(target + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(target))))))
        if not return_attention:
            return target, None
        return target, LayerAttention(sampling[0], sampling[1], text_weights)


class CrossModalityDecoder(nn.Module):
    """The decoder layers, the final ``norm`` and ``ref_point_head`` (each query's position from its box: the
    box's sine encoding through a 2-layer MLP, as DINO's)."""

    def __init__(self, layers: list[CrossModalityDecoderLayer], hidden_dim: int, *,
                 layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.ref_point_head = MLP(2 * hidden_dim, hidden_dim, hidden_dim, 2)
        self.hidden_dim = hidden_dim

    def forward(self, target: torch.Tensor, reference_boxes: torch.Tensor, memory: torch.Tensor,
                spatial_shapes: SpatialShapes, ratios: torch.Tensor, memory_padding: torch.Tensor,
                text: torch.Tensor, text_padding: torch.Tensor, box_heads: Sequence[nn.Module],
                return_attention: bool = False) -> tuple[torch.Tensor, list[torch.Tensor], list[LayerAttention]]:
        """target [B, Q, C]; reference_boxes [B, Q, 4] (cxcywh in [0, 1] of the unpadded image, detached);
        ratios [B, L, 2] (the unpadded fraction of each level); box_heads: one per layer, predicting the
        inverse-sigmoid update of its box → (every layer's normalised output [layers, B, Q, C], the reference
        box each layer leaves [B, Q, 4] per layer, with ``return_attention`` each layer's :class:`LayerAttention`
        (else empty))."""
        hidden, references, attention = [], [], []
        for layer, box_head in zip(self.layers, box_heads):
            level_boxes = reference_boxes[:, :, None] * torch.cat([ratios, ratios], -1)[:, None]  # [B, Q, L, 4]
            query_pos = self.ref_point_head(box_position_embedding(level_boxes[:, :, 0], self.hidden_dim))
            target, layer_attention = layer(target, query_pos, level_boxes, memory, spatial_shapes, memory_padding,
                                            text, text_padding, return_attention)
            if layer_attention is not None:
                attention.append(layer_attention)
            # the refinement reads the layer's output before the final norm (the heads read it after)
            update = box_head(target) + inverse_sigmoid(reference_boxes, eps=REFERENCE_EPS)
            reference_boxes = update.sigmoid().detach()
            hidden.append(self.norm(target))
            references.append(reference_boxes)
        return torch.stack(hidden), references, attention
