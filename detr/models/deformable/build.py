"""Deformable DETR from its :class:`detr.models.deformable.config.DeformableConfig`: the family's builder."""

from __future__ import annotations

from detr.models.backbone import Joiner, backbone_from_config
from detr.models.deformable.config import DeformableConfig
from detr.models.deformable.model import DeformableDETR
from detr.models.deformable.transformer import (
    DeformableDecoder,
    DeformableDecoderLayer,
    DeformableEncoder,
    DeformableEncoderLayer,
    DeformableTransformer,
)
from detr.models.layers.position_encoding import PositionEmbeddingSine


def build_deformable_detr(config: DeformableConfig) -> DeformableDETR:
    """The ResNet with the sine encoding at cell centres (``offset=-0.5``, as the authors'), the deformable
    encoder and decoder, and the per-layer heads (box refinement and two-stage as the config says)."""
    backbone = Joiner(backbone_from_config(config), PositionEmbeddingSine(config.hidden_dim // 2, offset=-0.5))
    sizes = (config.hidden_dim, config.num_heads, config.num_feature_levels, config.num_points,
             config.dim_feedforward, config.dropout)
    encoder = DeformableEncoder([DeformableEncoderLayer(*sizes) for _ in range(config.num_encoder_layers)])
    decoder = DeformableDecoder([DeformableDecoderLayer(*sizes) for _ in range(config.num_decoder_layers)])
    transformer = DeformableTransformer(encoder, decoder, hidden_dim=config.hidden_dim,
                                        num_levels=config.num_feature_levels, two_stage=config.two_stage,
                                        num_queries=config.num_queries)
    return DeformableDETR(backbone, transformer, num_classes=config.num_classes, num_queries=config.num_queries,
                          aux_loss=config.aux_loss, box_refine=config.box_refine, two_stage=config.two_stage)
