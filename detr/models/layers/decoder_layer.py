"""RT-DETR's decoder layer (Zhao et al. 2024, §4.3; the authors' ``TransformerDecoderLayer`` in
``src/zoo/rtdetr/rtdetrv2_decoder.py``), which D-FINE's and RF-DETR's decoders reuse: self-attention among the
queries, multi-scale deformable cross-attention around each query's reference box
(:class:`~detr.models.layers.deformable_attention.MultiScaleDeformableAttention`), a ReLU feed-forward network; each
with a residual and a LayerNorm after it. Parameter names are the authors': ``self_attn``, ``norm1``,
``cross_attn``, ``norm2``, ``linear1``, ``linear2``, ``norm3``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.attention import MultiheadAttention
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, SamplingMethod, SpatialShapes


class DecoderLayer(nn.Module):
    """Self-attention → deformable cross-attention → FFN, each with a residual and a LayerNorm after it
    (``cross_attention_heads``: the cross-attention's heads when they differ from the self-attention's, as
    RF-DETR's 16 beside 8)."""

    def __init__(self, hidden_dim: int, num_heads: int, num_levels: int, num_points: int, dim_feedforward: int,
                 dropout: float = 0.0, *, offset_scale: float = 0.5, sampling_method: SamplingMethod = "bilinear",
                 cross_attention_heads: int | None = None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(hidden_dim, num_heads, dropout=dropout)
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.cross_attn = MultiScaleDeformableAttention(hidden_dim, cross_attention_heads or num_heads, num_levels,
                                                        num_points, offset_scale=offset_scale,
                                                        sampling_method=sampling_method)
        self.norm2 = nn.LayerNorm(hidden_dim)
        self.linear1 = nn.Linear(hidden_dim, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, hidden_dim)
        self.norm3 = nn.LayerNorm(hidden_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, target: torch.Tensor, query_pos: torch.Tensor, reference_boxes: torch.Tensor,
                memory: torch.Tensor, spatial_shapes: SpatialShapes, self_attn_mask: torch.Tensor | None = None,
                return_sampling: bool = False, query_groups: int = 1
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """target, query_pos [B, Q, C]; reference_boxes [B, Q, 1, 4] cxcywh in [0, 1]; memory [B, S, C] →
        target [B, Q, C] and, with ``return_sampling``, the cross-attention's (locations, weights).
        ``query_groups`` G > 1: the Q queries are G groups (Group DETR, as RF-DETR trains), each attending only
        within itself: the groups go through the self-attention as separate batch entries, as the authors do."""
        q = k = target + query_pos
        if query_groups > 1:
            batch, length, dim = target.shape
            q, k, v = (x.reshape(batch * query_groups, length // query_groups, dim) for x in (q, k, target))
            attended = self.self_attn(q, k, v, self_attn_mask)[0].reshape(batch, length, dim)
        else:
            attended = self.self_attn(q, k, target, self_attn_mask)[0]
        target = self.norm1(target + self.dropout(attended))
        attended, sampling = self.cross_attn(target + query_pos, reference_boxes, memory, spatial_shapes,
                                             return_sampling=return_sampling)
        target = self.norm2(target + self.dropout(attended))
        ffn = self.linear2(self.dropout(F.relu(self.linear1(target))))
        # the authors clamp to float16's range before the last norm, so that half-precision runs stay finite
        return self.norm3((target + self.dropout(ffn)).clamp(min=-65504, max=65504)), sampling
