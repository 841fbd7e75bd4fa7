"""Grounding DINO's transformer: the feature enhancer, language-guided query selection (§3.3) and the
cross-modality decoder.

Language-guided query selection: every encoder position proposes a box (Deformable DETR's two-stage proposals)
and is scored by its best token logit (the contrastive head on the enhanced text); the ``num_queries`` best give
the decoder's reference boxes, while the decoder's content queries are learned (``tgt_embed``), as DINO's mixed
query selection.

Names are the authors' (IDEA-Research/GroundingDINO ``Transformer``): ``level_embed``, ``encoder``, ``decoder``,
``tgt_embed``, ``enc_output``, ``enc_output_norm``, ``enc_out_bbox_embed``, ``enc_out_class_embed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from detr.models.layers.cell_anchors import gather_cells, select_cells
from detr.models.layers.deformable_attention import SpatialShapes
from detr.models.deformable.transformer import encoder_proposals, encoder_reference_points, valid_ratios
from detr.models.grounding.config import ContrastiveHead
from detr.models.grounding.contrastive import ContrastiveEmbed
from detr.models.grounding.decoder import CrossModalityDecoder, LayerAttention
from detr.models.grounding.encoder import FeatureEnhancer
from detr.models.layers.mlp import MLP


@dataclass
class GroundingTransformerOutput:
    """hidden: every decoder layer's normalised output [layers, B, Q, C]; references: the box each layer started
    from, first to last, [layers, B, Q, 4] (cxcywh in [0, 1]); text: the enhanced text [B, N, C];
    encoder_logits [B, Q, max_text_len] and encoder_boxes [B, Q, 4]: the ``num_queries`` selected proposals'
    logits and sigmoid boxes (with their gradient, for the encoder loss); spatial_shapes, valid_ratios [B, L, 2]
    of the levels; attention: each decoder layer's :class:`~detr.models.grounding.decoder.LayerAttention` when asked
    (else empty)."""

    hidden: torch.Tensor
    references: torch.Tensor
    text: torch.Tensor
    encoder_logits: torch.Tensor
    encoder_boxes: torch.Tensor
    spatial_shapes: SpatialShapes
    valid_ratios: torch.Tensor
    attention: list[LayerAttention]


class GroundingTransformer(nn.Module):
    """Feature enhancer → query selection → cross-modality decoder.

    Args:
        encoder: the :class:`FeatureEnhancer`. decoder: the :class:`CrossModalityDecoder`.
        num_queries: Q (the released models: 900). num_levels: L. max_text_len, contrastive_head: the proposals'
            contrastive head (:class:`ContrastiveEmbed`).
    """

    def __init__(self, encoder: FeatureEnhancer, decoder: CrossModalityDecoder, *, hidden_dim: int, num_queries: int,
                 num_levels: int, max_text_len: int, contrastive_head: ContrastiveHead = "dot",
                 layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.num_queries, self.num_levels = num_queries, num_levels
        self.level_embed = nn.Parameter(torch.randn(num_levels, hidden_dim))
        self.tgt_embed = nn.Embedding(num_queries, hidden_dim)
        self.enc_output = nn.Linear(hidden_dim, hidden_dim)
        self.enc_output_norm = nn.LayerNorm(hidden_dim, layer_norm_eps)
        self.enc_out_bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        self.enc_out_class_embed = ContrastiveEmbed(max_text_len, contrastive_head)

    def forward(self, sources: list[torch.Tensor], masks: list[torch.Tensor], positions: list[torch.Tensor],
                text: torch.Tensor, text_position: torch.Tensor, text_mask: torch.Tensor, text_allowed: torch.Tensor,
                box_heads: Sequence[nn.Module], return_attention: bool = False) -> GroundingTransformerOutput:
        """Per level: sources [B, C, h, w], masks bool [B, h, w] (True = padding), positions [B, C, h, w]; text,
        text_position [B, N, C]; text_mask bool [B, N] (True = a real token); text_allowed bool [B, N, N];
        box_heads: the decoder's refinement heads, one per layer; return_attention: keep where each decoder layer's
        queries looked in the image and the prompt."""
        spatial_shapes = [(source.shape[-2], source.shape[-1]) for source in sources]
        memory = torch.cat([source.flatten(2).transpose(1, 2) for source in sources], 1)  # [B, S, C]
        padding = torch.cat([mask.flatten(1) for mask in masks], 1)  # [B, S]
        position = torch.cat([pos.flatten(2).transpose(1, 2) + self.level_embed[level].view(1, 1, -1)
                              for level, pos in enumerate(positions)], 1)
        ratios = torch.stack([valid_ratios(mask).to(memory.dtype) for mask in masks], 1)  # [B, L, 2]
        reference_points = encoder_reference_points(spatial_shapes, ratios)
        memory, text = self.encoder(memory, position, reference_points, spatial_shapes, padding, text, text_position,
                                    ~text_mask, text_allowed)
        # language-guided query selection
        proposal_memory, proposals = encoder_proposals(memory, padding, spatial_shapes)

        def score(cells: torch.Tensor, _: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            features = self.enc_output_norm(self.enc_output(cells))
            return features, self.enc_out_class_embed(features, text, text_mask)  # [B, N, T]

        selected, selected_features, selected_logits = select_cells(
            score, proposal_memory, self.num_queries, trained=self.training and torch.is_grad_enabled())
        # the box head is per cell: run on the selected cells only (the same values)
        selected_boxes = (self.enc_out_bbox_embed(selected_features) + gather_cells(proposals, selected)).sigmoid()
        reference_boxes = selected_boxes.detach()
        target = self.tgt_embed.weight[None].expand(memory.shape[0], -1, -1)
        hidden, refined, attention = self.decoder(target, reference_boxes, memory, spatial_shapes, ratios, padding,
                                                  text, ~text_mask, box_heads, return_attention)
        references = torch.stack([reference_boxes, *refined[:-1]])
        return GroundingTransformerOutput(hidden, references, text, selected_logits, selected_boxes, spatial_shapes,
                                          ratios, attention)
