"""RF-DETR's (and LW-DETR's) two-stage query selection and decoder, at inference (one query group), as
transformers' ``RfDetrModel`` computes them.

Query selection (LW-DETR §3.2, Deformable DETR's two-stage): every cell of the projector's maps is a proposal box
(its centre, side 0.05 · 2^level; within 1 % of the border: invalid, zeroed, never selected); ``enc_output`` (linear +
LayerNorm) and the encoder heads score it and move it by a delta in the "lite" parameterisation (centre + d_xy ·
size, size · exp(d_wh): no sigmoid, no logits); the ``num_queries`` best cells' boxes, detached, are moved once more
by the learned ``reference_points`` (same parameterisation) into the decoder's reference boxes. The content queries
are learned (``query_embed``), not the cells' features.

Decoder: RT-DETR's post-norm layers (:class:`detr.models.layers.decoder_layer.DecoderLayer`: self-attention, the shared
deformable cross-attention around the reference box, ReLU FFN), with separate self- and cross-attention head
counts. The reference boxes are not refined between layers: each query's position (an MLP of the boxes' sine
embedding) is computed once, and every layer's output (after the shared LayerNorm ``norm``) is read by the same
class head and box head, whose delta moves the reference box.

Group DETR (Chen et al., "Group DETR", ICCV 2023; LW-DETR §3.3), in training: ``num_groups`` (13 in the authors'
recipe) copies of the learned queries (``query_embed``, ``reference_points``: G · Q rows, group 1 first) and of the
encoder heads (``enc_output``, ``enc_output_norm``, ``enc_class_head``, ``enc_box_head``: one per group); each group
selects its own Q proposals with its own heads, decodes them with self-attention inside the group only, and is
matched one-to-one on its own (the criterion's matcher, ``group_size`` Q). Inference (eval mode) runs the first
group alone, as the authors' model and transformers' do.

Keypoints (GroupPose, the rfdetr package's ``RFDETRKeypointPreview``), with a ``keypoint_head``
(:class:`~detr.models.layers.keypoint_head.KeypointHead`): the keypoint queries start from the object queries'
content, each layer's object queries pass the head's layer (which also updates them) before the shared LayerNorm,
every layer's keypoints are predicted around the reference boxes, and the keypoints add their class shares to every
layer's class logits and the proposals' (the selected cells' keypoints from the head's encoder predictors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from detr.models.config import PRIOR_BIAS
from detr.models.layers.cell_anchors import cell_anchors, gather_cells, select_cells
from detr.models.layers.decoder_layer import DecoderLayer
from detr.models.layers.deformable_attention import SpatialShapes
from detr.models.layers.keypoint_head import KeypointHead
from detr.models.layers.mlp import MLP
from detr.models.layers.position_encoding import sine_embedding
from detr.models.size_constants import SizeConstants


def refine_boxes(boxes: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """LW-DETR's box update: boxes [..., 4] cxcywh, deltas [..., 4] → centre + d_xy · size, size · exp(d_wh)."""
    return torch.cat([deltas[..., :2] * boxes[..., 2:] + boxes[..., :2], deltas[..., 2:].exp() * boxes[..., 2:]], -1)


def proposals_for(spatial_shapes: SpatialShapes, *, device: torch.device | None = None,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Every cell's proposal box of the levels → boxes [1, S, 4] (cxcywh, side 0.05 · 2^level, 0 where invalid),
    valid bool [1, S, 1] (every coordinate within (0.01, 0.99)): :func:`~detr.models.layers.cell_anchors.cell_anchors`
    with the invalid boxes zeroed."""
    boxes, valid = cell_anchors(spatial_shapes, device=device, dtype=dtype)
    return boxes.masked_fill(~valid, 0.0), valid


def _proposals(spatial_shapes: tuple[tuple[int, int], ...], *, device: torch.device, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return proposals_for(list(spatial_shapes), device=device, dtype=dtype)


@dataclass
class DecoderOutput:
    """hidden [L, B, Q, C]: every layer's output after the final LayerNorm; logits [L, B, Q, K], boxes [L, B, Q, 4]
    (cxcywh in [0, 1] of the input); reference_boxes [B, Q, 4]; proposal_logits [B, Q, K], proposal_boxes [B, Q, 4]:
    the selected encoder proposals (their boxes keep their gradient: the encoder heads' loss), proposal_hidden
    [B, Q, C] their features (what the mask head reads for their masks); sampling: per layer
    (locations, weights) when asked for, else None. In training Q is G · num_queries, group by group."""

    hidden: torch.Tensor
    logits: torch.Tensor
    boxes: torch.Tensor
    reference_boxes: torch.Tensor
    proposal_logits: torch.Tensor
    proposal_boxes: torch.Tensor
    sampling: list[tuple[torch.Tensor, torch.Tensor]] | None
    proposal_hidden: torch.Tensor
    keypoints: torch.Tensor | None = None
    proposal_keypoints: torch.Tensor | None = None


class RFDETRDecoder(nn.Module):
    """The projector's maps (each [B, C, h_l, w_l]) → :class:`DecoderOutput`.

    Args:
        num_classes: sigmoid class logits. hidden_dim: C. num_queries: queries selected and decoded (per group).
        num_layers, num_heads, cross_attention_heads, num_levels, num_points, dim_feedforward, dropout: the decoder
            layers'.
        num_groups: Group DETR's query groups in training (1: none; the authors' recipe: 13).
        keypoint_head: a :class:`KeypointHead` (GroupPose keypoints, built for these layers and groups), or None.
    """

    def __init__(self, *, num_classes: int, hidden_dim: int = 256, num_queries: int = 300, num_layers: int = 3,
                 num_heads: int = 8, cross_attention_heads: int = 16, num_levels: int = 1, num_points: int = 4,
                 dim_feedforward: int = 2048, dropout: float = 0.0, num_groups: int = 1,
                 keypoint_head: KeypointHead | None = None) -> None:
        super().__init__()
        self.num_queries, self.num_levels, self.num_groups = num_queries, num_levels, num_groups
        self.layers = nn.ModuleList(
            DecoderLayer(hidden_dim, num_heads, num_levels, num_points, dim_feedforward, dropout,
                         cross_attention_heads=cross_attention_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden_dim)
        self.ref_point_head = MLP(2 * hidden_dim, hidden_dim, hidden_dim, 2)
        self.query_embed = nn.Embedding(num_queries * num_groups, hidden_dim)
        self.reference_points = nn.Embedding(num_queries * num_groups, 4)
        self.enc_output = nn.ModuleList(nn.Linear(hidden_dim, hidden_dim) for _ in range(num_groups))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(hidden_dim) for _ in range(num_groups))
        self.enc_class_head = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_groups))
        self.enc_box_head = nn.ModuleList(MLP(hidden_dim, hidden_dim, 4, 3) for _ in range(num_groups))
        self.class_head = nn.Linear(hidden_dim, num_classes)
        self.box_head = MLP(hidden_dim, hidden_dim, 4, 3)
        self.keypoint_head = keypoint_head
        self.proposals = SizeConstants(_proposals)  # kept per size under inference mode only
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The authors' start: class heads at the focal prior, box deltas and reference offsets at zero."""
        for head in (self.class_head, *self.enc_class_head):
            nn.init.constant_(head.bias, PRIOR_BIAS)
        for head in (self.box_head, *self.enc_box_head):
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)
        nn.init.zeros_(self.reference_points.weight)

    def select(self, memory: torch.Tensor, spatial_shapes: SpatialShapes, group: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """memory [B, S, C] → with query group ``group``'s encoder heads, the selected proposals' boxes [B, Q, 4]
        (with their gradient), their logits [B, Q, K], and the selected cells' features [B, Q, C]."""
        proposals, valid = self.proposals(tuple(spatial_shapes), device=memory.device, dtype=memory.dtype)

        def score(cells: torch.Tensor, cells_valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            features = self.enc_output_norm[group](self.enc_output[group](cells.masked_fill(~cells_valid, 0.0)))
            return features, self.enc_class_head[group](features)

        index, selected, selected_logits = select_cells(score, memory, self.num_queries, valid=valid,
                                                        skip_invalid=True,
                                                        trained=self.training and torch.is_grad_enabled())
        # the box head is per cell: run on the selected cells only (the authors run it on every cell, then select)
        boxes = refine_boxes(gather_cells(proposals.expand(memory.shape[0], -1, -1), index),
                             self.enc_box_head[group](selected))
        return boxes, selected_logits, selected

    def forward(self, features: list[torch.Tensor], return_sampling: bool = False,
                keypoint_features: list[torch.Tensor] | None = None) -> DecoderOutput:
        """features: the projector's maps, each [B, C, h_l, w_l]; keypoint_features: the keypoint projector's (same
        shapes; what the keypoint head's cross-attention reads instead of ``features``), or None."""
        batch, dim = features[0].shape[:2]
        spatial_shapes = [(int(f.shape[-2]), int(f.shape[-1])) for f in features]
        memory = torch.cat([f.flatten(2).transpose(1, 2) for f in features], 1)  # [B, S, C]
        groups = self.num_groups if self.training else 1  # Group DETR: the extra groups in training only
        selections = [self.select(memory, spatial_shapes, group) for group in range(groups)]
        proposal_boxes = torch.cat([boxes for boxes, _, _ in selections], 1)  # [B, G · Q, 4]
        proposal_logits = torch.cat([logits for _, logits, _ in selections], 1)
        proposal_hidden = torch.cat([selected for _, _, selected in selections], 1)
        queries = groups * self.num_queries
        # the decoder starts from the proposals, detached (their boxes train the encoder heads only)
        reference = refine_boxes(proposal_boxes.detach(), self.reference_points.weight[None, :queries])  # [B, G·Q, 4]
        # the query position: the sine of (y, x, w, h), 2π-scaled, C / 2 channels each → MLP → C
        angles = reference[..., [1, 0, 2, 3]] * (2 * math.pi)
        query_pos = self.ref_point_head(sine_embedding(angles, dim // 2).flatten(-2))
        target = self.query_embed.weight[None, :queries].expand(batch, -1, -1)
        head = self.keypoint_head
        if head is not None:
            keypoint_memory = (memory if keypoint_features is None else
                               torch.cat([f.flatten(2).transpose(1, 2) for f in keypoint_features], 1))
            keypoints, keypoint_states = head.start(target), []  # [B, G·Q, K, D]
        hidden, sampling = [], [] if return_sampling else None
        for index, layer in enumerate(self.layers):
            levels = reference[:, :, None].expand(-1, -1, len(spatial_shapes), -1)  # one box for every level
            target, points = layer(target, query_pos, levels, memory, spatial_shapes,
                                   return_sampling=return_sampling, query_groups=groups)
            if head is not None:
                target, keypoints = head.layer(index, target, query_pos, keypoints, levels, keypoint_memory,
                                               spatial_shapes)
                keypoint_states.append(keypoints)
            hidden.append(self.norm(target))
            if sampling is not None:
                sampling.append(points)
        stacked = torch.stack(hidden)  # [L, B, Q, C]
        boxes = refine_boxes(reference[None], self.box_head(stacked))
        logits = self.class_head(stacked)
        keypoints = proposal_keypoints = None
        if head is not None:
            keypoints = head.predict(torch.stack(keypoint_states), reference)  # [L, B, Q, C_k · K_max, 8]
            logits = logits + head.schema.class_logits(keypoints, logits.shape[-1])
            proposal_keypoints = head.encoder_keypoints(proposal_hidden, proposal_boxes)
            proposal_logits = proposal_logits + head.schema.class_logits(proposal_keypoints, logits.shape[-1])
        return DecoderOutput(stacked, logits, boxes, reference, proposal_logits, proposal_boxes, sampling,
                             proposal_hidden, keypoints, proposal_keypoints)
