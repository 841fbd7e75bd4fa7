"""Deformable DETR's encoder and decoder (Zhu et al. 2021, §4.1; the authors' deformable_transformer.py).

Encoder: every position of every level attends, by deformable self-attention, to P points per head and
level around its own location. Decoder: the queries attend to each other (standard multi-head
self-attention), then, by deformable cross-attention, to P points per head and level around each query's
reference point (a point, or a box once refined). Both are post-norm with ReLU FFNs. Iterative box
refinement (§4.2) moves each query's reference box by the box head of every layer; two-stage (§4.2) takes
the reference boxes and queries from the encoder's best-scoring positions.

Module names follow the authors' layout (``transformer.encoder.layers.N.self_attn``, ``norm1``,
``linear1``; ``transformer.decoder.layers.N.cross_attn``, ``self_attn`` …), which
:mod:`detr.checkpoints.huggingface_deformable` maps onto transformers' names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.layers.attention import Dropout
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, SpatialShapes
from detr.models.layers.position_encoding import sine_embedding

#: inverse_sigmoid's eps in the authors' and transformers' Deformable DETR.
REFERENCE_EPS = 1e-5


class DeformableEncoderLayer(nn.Module):
    """Deformable self-attention over all levels, then the FFN; post-norm."""

    def __init__(self, hidden_dim: int, num_heads: int, num_levels: int, num_points: int, dim_feedforward: int,
                 dropout: float) -> None:
        super().__init__()
        self.self_attn = MultiScaleDeformableAttention(hidden_dim, num_heads, num_levels, num_points)
        self.dropout1 = Dropout(dropout)
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.linear1 = nn.Linear(hidden_dim, dim_feedforward)
        self.dropout2 = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, hidden_dim)
        self.dropout3 = Dropout(dropout)
        self.norm2 = nn.LayerNorm(hidden_dim)

    def forward(self, src: torch.Tensor, pos: torch.Tensor, reference_points: torch.Tensor,
                spatial_shapes: SpatialShapes, padding_mask: torch.Tensor) -> torch.Tensor:
        """src, pos [B, S, C]; reference_points [B, S, L, 2]; padding_mask bool [B, S] → [B, S, C]."""
        attended, _ = self.self_attn(src + pos, reference_points, src, spatial_shapes, padding_mask)
        src = self.norm1(src + self.dropout1(attended))
        return self.norm2(src + self.dropout3(self.linear2(self.dropout2(F.relu(self.linear1(src))))))


class DeformableDecoderLayer(nn.Module):
    """Self-attention among the queries, deformable cross-attention to the encoder output, the FFN; post-norm.
    ``norm2`` follows the self-attention and ``norm1`` the cross-attention (the authors' names)."""

    def __init__(self, hidden_dim: int, num_heads: int, num_levels: int, num_points: int, dim_feedforward: int,
                 dropout: float) -> None:
        super().__init__()
        self.cross_attn = MultiScaleDeformableAttention(hidden_dim, num_heads, num_levels, num_points)
        self.dropout1 = Dropout(dropout)
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.self_attn = nn.MultiheadAttention(hidden_dim, num_heads, dropout=dropout, batch_first=True)
        self.dropout2 = Dropout(dropout)
        self.norm2 = nn.LayerNorm(hidden_dim)
        self.linear1 = nn.Linear(hidden_dim, dim_feedforward)
        self.dropout3 = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, hidden_dim)
        self.dropout4 = Dropout(dropout)
        self.norm3 = nn.LayerNorm(hidden_dim)

    def forward(self, tgt: torch.Tensor, query_pos: torch.Tensor, reference_points: torch.Tensor,
                memory: torch.Tensor, spatial_shapes: SpatialShapes, padding_mask: torch.Tensor,
                return_sampling: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """tgt, query_pos [B, Q, C]; reference_points [B, Q, L, 2 or 4]; memory [B, S, C]; padding_mask
        bool [B, S] → tgt [B, Q, C] and the cross-attention's (sampling_locations, attention_weights) if asked."""
        q = k = tgt + query_pos
        tgt = self.norm2(tgt + self.dropout2(self.self_attn(q, k, tgt, need_weights=False)[0]))
        attended, sampling = self.cross_attn(tgt + query_pos, reference_points, memory, spatial_shapes, padding_mask,
                                             return_sampling)
        tgt = self.norm1(tgt + self.dropout1(attended))
        tgt = self.norm3(tgt + self.dropout4(self.linear2(self.dropout3(F.relu(self.linear1(tgt))))))
        return tgt, sampling


def valid_ratios(mask: torch.Tensor) -> torch.Tensor:
    """mask bool [B, h, w] (True = padding) → [B, 2]: the unpadded fraction of the width and of the height."""
    height, width = mask.shape[-2:]
    valid_height = (~mask[:, :, 0]).sum(1).float() / height
    valid_width = (~mask[:, 0, :]).sum(1).float() / width
    return torch.stack([valid_width, valid_height], -1)


def encoder_reference_points(spatial_shapes: SpatialShapes, ratios: torch.Tensor) -> torch.Tensor:
    """Every position's centre, per level, as (x, y) normalised to the unpadded image, then rescaled to each
    level's padded map: ratios [B, L, 2] → [B, S, L, 2]."""
    points = []
    for level, (height, width) in enumerate(spatial_shapes):
        # arange + 0.5 is linspace(0.5, size - 0.5, size) to the bit, and keeps the size symbolic in an export
        ref_y, ref_x = torch.meshgrid(torch.arange(height, dtype=ratios.dtype, device=ratios.device) + 0.5,
                                      torch.arange(width, dtype=ratios.dtype, device=ratios.device) + 0.5,
                                      indexing="ij")
        ref_y = ref_y.reshape(-1)[None] / (ratios[:, None, level, 1] * height)
        ref_x = ref_x.reshape(-1)[None] / (ratios[:, None, level, 0] * width)
        points.append(torch.stack((ref_x, ref_y), -1))
    return torch.cat(points, 1)[:, :, None] * ratios[:, None]


class DeformableEncoder(nn.Module):
    def __init__(self, layers: list[DeformableEncoderLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, src: torch.Tensor, pos: torch.Tensor, spatial_shapes: SpatialShapes, ratios: torch.Tensor,
                padding_mask: torch.Tensor) -> torch.Tensor:
        """src, pos [B, S, C]; ratios [B, L, 2] (:func:`valid_ratios`); padding_mask [B, S] → memory [B, S, C]."""
        reference_points = encoder_reference_points(spatial_shapes, ratios)
        for layer in self.layers:
            src = layer(src, pos, reference_points, spatial_shapes, padding_mask)
        return src


@dataclass
class DecoderOutput:
    """hidden [L, B, Q, C] (every layer's output); references: per layer [B, Q, 2 or 4], the reference its box
    head refines (layer 0: the initial point or box; layer l: layer l-1's refined box), in [0, 1]; sampling: per
    layer (sampling_locations [B, Q, H, levels, P, 2], attention_weights [B, Q, H, levels, P]) when asked."""

    hidden: torch.Tensor
    references: list[torch.Tensor]
    sampling: list[tuple[torch.Tensor, torch.Tensor]] | None = None


class DeformableDecoder(nn.Module):
    def __init__(self, layers: list[DeformableDecoderLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, tgt: torch.Tensor, query_pos: torch.Tensor, reference_points: torch.Tensor,
                memory: torch.Tensor, spatial_shapes: SpatialShapes, ratios: torch.Tensor,
                padding_mask: torch.Tensor, box_heads: nn.ModuleList | None = None,
                return_sampling: bool = False) -> DecoderOutput:
        """tgt, query_pos [B, Q, C]; reference_points [B, Q, 2 or 4] in [0, 1] of the unpadded image;
        box_heads: with iterative refinement, layer l's box head moves the reference box after layer l (the
        moved box is detached: gradients do not flow through the references, §4.2); None keeps them."""
        hidden, references, sampling = [], [], []
        for index, layer in enumerate(self.layers):
            references.append(reference_points)
            scale = ratios if reference_points.shape[-1] == 2 else torch.cat([ratios, ratios], -1)
            tgt, layer_sampling = layer(tgt, query_pos, reference_points[:, :, None] * scale[:, None], memory,
                                        spatial_shapes, padding_mask, return_sampling)
            if box_heads is not None:
                delta = box_heads[index](tgt)
                if reference_points.shape[-1] == 4:
                    refined = delta + inverse_sigmoid(reference_points, eps=REFERENCE_EPS)
                else:
                    refined = torch.cat([delta[..., :2] + inverse_sigmoid(reference_points, eps=REFERENCE_EPS),
                                         delta[..., 2:]], -1)
                reference_points = refined.sigmoid().detach()
            hidden.append(tgt)
            if layer_sampling is not None:
                sampling.append(layer_sampling)
        return DecoderOutput(torch.stack(hidden), references, sampling if return_sampling else None)


def proposal_position_embedding(proposals: torch.Tensor, hidden_dim: int, temperature: float = 10000.0
                                ) -> torch.Tensor:
    """Two-stage query positions: proposals [B, K, 4] (inverse-sigmoid boxes) → [B, K, 2·hidden_dim], a sine
    encoding of hidden_dim / 2 features for each of cx, cy, w, h."""
    return sine_embedding(proposals.sigmoid() * (2 * math.pi), hidden_dim // 2, temperature).flatten(2)


def encoder_proposals(memory: torch.Tensor, padding_mask: torch.Tensor, spatial_shapes: SpatialShapes
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-stage: one proposal box per encoder position, centred on it, of side 0.05 · 2^level (in the unpadded
    image), as the authors' ``gen_encoder_output_proposals``.

    memory [B, S, C], padding_mask bool [B, S] → memory with padded and out-of-range positions zeroed
    [B, S, C], proposals [B, S, 4] in inverse-sigmoid space (+inf where padded or too close to the border).
    """
    batch = memory.shape[0]
    proposals, start = [], 0
    for level, (height, width) in enumerate(spatial_shapes):
        mask = padding_mask[:, start:start + height * width].view(batch, height, width)
        valid_height = (~mask[:, :, 0]).sum(1)
        valid_width = (~mask[:, 0, :]).sum(1)
        grid_y, grid_x = torch.meshgrid(torch.arange(height, dtype=memory.dtype, device=memory.device),
                                        torch.arange(width, dtype=memory.dtype, device=memory.device), indexing="ij")
        grid = torch.cat([grid_x.unsqueeze(-1), grid_y.unsqueeze(-1)], -1)
        scale = torch.cat([valid_width.unsqueeze(-1), valid_height.unsqueeze(-1)], 1).view(batch, 1, 1, 2)
        grid = (grid.unsqueeze(0).expand(batch, -1, -1, -1) + 0.5) / scale
        size = torch.ones_like(grid) * 0.05 * (2.0 ** level)
        proposals.append(torch.cat((grid, size), -1).view(batch, -1, 4))
        start += height * width
    proposals = torch.cat(proposals, 1)
    valid = ((proposals > 0.01) & (proposals < 0.99)).all(-1, keepdim=True)
    proposals = torch.log(proposals / (1 - proposals))
    proposals = proposals.masked_fill(padding_mask.unsqueeze(-1), float("inf")).masked_fill(~valid, float("inf"))
    memory = memory.masked_fill(padding_mask.unsqueeze(-1), 0.0).masked_fill(~valid, 0.0)
    return memory, proposals


@dataclass
class TransformerOutput:
    """decoder: :class:`DecoderOutput`; memory [B, S, C] (the encoder output); spatial_shapes: per level
    (h, w); valid_ratios [B, levels, 2]: the unpadded fraction of each level's width and height;
    encoder_logits [B, S, K] and encoder_boxes [B, S, 4] (normalised cxcywh): the two-stage encoder
    head's predictions for every position (what its loss reads), None for one stage."""

    decoder: DecoderOutput
    memory: torch.Tensor
    spatial_shapes: SpatialShapes
    valid_ratios: torch.Tensor
    encoder_logits: torch.Tensor | None = None
    encoder_boxes: torch.Tensor | None = None


class DeformableTransformer(nn.Module):
    """The encoder, the decoder and what feeds them: the level embedding and the query source.

    One stage: the queries come from ``query_embed`` [Q, 2C] (split into position and content) and
    ``reference_points`` (a linear layer on the query position, sigmoid) gives each its reference point.
    Two stage (``two_stage=True``, needs box heads with one extra head for the encoder): every encoder
    position proposes a box; the ``num_queries`` best (by the encoder class head's first logit) become the
    reference boxes, and ``pos_trans`` on their sine encoding gives the query positions and contents.
    """

    def __init__(self, encoder: DeformableEncoder, decoder: DeformableDecoder, *, hidden_dim: int, num_levels: int,
                 two_stage: bool = False, num_queries: int = 300) -> None:
        super().__init__()
        self.d_model, self.num_levels, self.two_stage, self.num_queries = hidden_dim, num_levels, two_stage, num_queries
        self.encoder, self.decoder = encoder, decoder
        self.level_embed = nn.Parameter(torch.empty(num_levels, hidden_dim))
        if two_stage:
            self.enc_output = nn.Linear(hidden_dim, hidden_dim)
            self.enc_output_norm = nn.LayerNorm(hidden_dim)
            self.pos_trans = nn.Linear(hidden_dim * 2, hidden_dim * 2)
            self.pos_trans_norm = nn.LayerNorm(hidden_dim * 2)
        else:
            self.reference_points = nn.Linear(hidden_dim, 2)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The authors' initialisation: Xavier for every matrix, the deformable attentions' own scheme, a normal
        level embedding."""
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        for module in self.modules():
            if isinstance(module, MultiScaleDeformableAttention):
                module.reset_parameters()
        if not self.two_stage:
            nn.init.xavier_uniform_(self.reference_points.weight, gain=1.0)
            nn.init.constant_(self.reference_points.bias, 0.0)
        nn.init.normal_(self.level_embed)

    def forward(self, sources: list[torch.Tensor], masks: list[torch.Tensor], positions: list[torch.Tensor],
                query_embed: torch.Tensor | None, class_heads: nn.ModuleList, box_heads: nn.ModuleList,
                box_refine: bool, return_sampling: bool = False) -> TransformerOutput:
        """sources, positions: per level [B, C, h_l, w_l]; masks: per level bool [B, h_l, w_l] (True =
        padding); query_embed [Q, 2C] (one stage) or None (two stage); class_heads, box_heads: the detector's
        per-layer heads (the two-stage encoder head is the last); box_refine: refine reference boxes layer by
        layer with ``box_heads``."""
        spatial_shapes = [(src.shape[-2], src.shape[-1]) for src in sources]  # no int(): export keeps sizes symbolic
        src = torch.cat([s.flatten(2).transpose(1, 2) for s in sources], 1)  # [B, S, C]
        pos = torch.cat([p.flatten(2).transpose(1, 2) + self.level_embed[level].view(1, 1, -1)
                         for level, p in enumerate(positions)], 1)
        padding_mask = torch.cat([m.flatten(1) for m in masks], 1)  # [B, S]
        ratios = torch.stack([valid_ratios(m) for m in masks], 1)  # [B, L, 2]
        memory = self.encoder(src, pos, spatial_shapes, ratios, padding_mask)

        batch, _, channels = memory.shape
        encoder_logits = encoder_boxes = None
        if self.two_stage:
            # checked in eager runs only: in an export the comparison would fix the symbolic image size
            if not torch.compiler.is_exporting() and memory.shape[1] < self.num_queries:
                raise ValueError(f"two-stage Deformable DETR picks num_queries={self.num_queries} of the encoder's "
                                 f"positions, but these images give only {memory.shape[1]} over the levels "
                                 f"{spatial_shapes}: use larger images or fewer queries")
            queries, proposals = encoder_proposals(memory, padding_mask, spatial_shapes)
            queries = self.enc_output_norm(self.enc_output(queries))
            encoder_logits = class_heads[-1](queries)  # [B, S, K]
            encoder_box_logits = box_heads[-1](queries) + proposals  # [B, S, 4], inverse sigmoid
            encoder_boxes = encoder_box_logits.sigmoid()
            top = torch.topk(encoder_logits[..., 0], self.num_queries, dim=1)[1]  # [B, Q]
            top_boxes = torch.gather(encoder_box_logits, 1, top.unsqueeze(-1).repeat(1, 1, 4)).detach()
            reference_points = top_boxes.sigmoid()
            query_pos, tgt = torch.split(
                self.pos_trans_norm(self.pos_trans(proposal_position_embedding(top_boxes, channels))), channels, dim=2)
        else:
            query_pos, tgt = torch.split(query_embed, channels, dim=1)
            query_pos = query_pos.unsqueeze(0).expand(batch, -1, -1)
            tgt = tgt.unsqueeze(0).expand(batch, -1, -1)
            reference_points = self.reference_points(query_pos).sigmoid()
        decoded = self.decoder(tgt, query_pos, reference_points, memory, spatial_shapes, ratios, padding_mask,
                               box_heads if box_refine else None, return_sampling)
        return TransformerOutput(decoded, memory, spatial_shapes, ratios, encoder_logits, encoder_boxes)
