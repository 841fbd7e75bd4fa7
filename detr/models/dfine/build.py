"""D-FINE from a :class:`detr.models.dfine.config.DFINEConfig`: the family's builder, and the parts DEIMv2's builder
(:mod:`detr.models.deimv2.build`) shares: the HGNetV2 backbone and the distribution-refinement decoder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from detr.models.dfine.config import Activation, DFINEConfig
from detr.models.dfine.decoder import DFineDecoder
from detr.models.dfine.encoder import dfine_hybrid_encoder
from detr.models.dfine.hgnetv2 import HGNetV2
from detr.models.dfine.model import DFINE


def build_dfine(config: DFINEConfig) -> DFINE:
    """HGNetV2 of ``config.backbone`` (its last ``num_feature_levels`` stages), the hybrid encoder with D-FINE's
    fusion blocks, the distribution-refinement decoder and its heads."""
    backbone = hgnetv2_backbone(config)
    encoder_dim = config.encoder_hidden_dim or config.hidden_dim
    encoder = dfine_hybrid_encoder(
        backbone.out_channels, encoder_dim, num_heads=config.num_heads,
        dim_feedforward=config.encoder_dim_feedforward or config.dim_feedforward,
        num_layers=config.num_encoder_layers, dropout=config.dropout, expansion=config.csp_expansion,
        depth_multiplier=config.csp_depth_multiplier)
    decoder = distribution_decoder(config, [encoder_dim] * len(backbone.out_channels),
                                   activation=activation_function(config.decoder.activation))
    return DFINE(backbone, encoder, decoder, num_classes=config.num_classes, aux_loss=config.aux_loss)


def hgnetv2_backbone(config: DFINEConfig) -> HGNetV2:
    """HGNetV2 of ``config.backbone``, its last ``num_feature_levels`` stages."""
    return HGNetV2(config.backbone, learnable_affine=config.backbone_learnable_affine,
                   num_outputs=config.num_feature_levels, frozen_norm=config.backbone_norm == "frozen_batch_norm")


def activation_function(name: Activation) -> Callable[[torch.Tensor], torch.Tensor]:
    """``F.silu`` or ``F.relu``."""
    return F.silu if name == "silu" else F.relu


def distribution_decoder(config: DFINEConfig, in_channels: list[int], **layers: Any) -> DFineDecoder:
    """The distribution-refinement decoder ``config`` describes over encoder levels of ``in_channels``;
    ``layers`` are :class:`DFineDecoder`'s layer options (``activation``; DEIMv2's ``norm``, ``feedforward``,
    ``gateway``, ``query_pos_head``)."""
    options = config.decoder
    return DFineDecoder(in_channels, num_classes=config.num_classes, hidden_dim=config.hidden_dim,
                        num_queries=config.num_queries, num_layers=config.num_decoder_layers,
                        num_heads=config.num_heads, num_levels=config.num_feature_levels,
                        num_points=config.points_per_level, dim_feedforward=config.dim_feedforward,
                        dropout=config.dropout, offset_scale=config.sampling_offset_scale,
                        sampling_method=config.sampling_method, denoising=config.denoising,
                        max_num_bins=options.max_num_bins, reg_scale=options.reg_scale, up=options.reg_up,
                        lqe_top_k=options.lqe_top_k, lqe_hidden_dim=options.lqe_hidden_dim,
                        lqe_layers=options.lqe_layers, mlp_activation=activation_function(options.mlp_activation),
                        **layers)
