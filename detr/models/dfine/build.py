"""D-FINE and DEIMv2 from a :class:`detr.models.config.DetrConfig` (``architecture="dfine"`` or ``"deimv2"``): the
families' builder in :data:`detr.models.build.ARCHITECTURES`."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from detr.models.config import DetrConfig
from detr.models.dfine.decoder import DFineDecoder
from detr.models.dfine.dinov3 import DINOv3Backbone
from detr.models.dfine.encoder import LiteEncoder, deimv2_hybrid_encoder, dfine_hybrid_encoder
from detr.models.dfine.hgnetv2 import HGNetV2
from detr.models.dfine.model import DFINE
from detr.models.layers.mlp import MLP


def build_dfine(config: DetrConfig) -> DFINE:
    """HGNetV2 of ``config.backbone`` (its last ``num_feature_levels`` stages), the hybrid encoder with D-FINE's
    fusion blocks, the distribution-refinement decoder and its heads; with ``architecture="deimv2"``, DEIMv2's
    encoder (summed RepNCSPELAN5 fusion, or the lite encoder) and decoder layers (RMSNorm, SwiGLU), on HGNetV2 or the
    DINOv3 ViT with its spatial tuning adapter (``backbone="dinov3_vit"``)."""
    deimv2 = config.architecture == "deimv2"
    backbone: HGNetV2 | DINOv3Backbone
    if config.backbone == "dinov3_vit":
        backbone = DINOv3Backbone(config.vit_dim, config.vit_depth, config.vit_heads, config.vit_mlp_dim,
                                  num_register_tokens=config.vit_register_tokens, out_layers=config.vit_out_layers,
                                  gated_mlp=config.vit_gated_mlp, adapter_channels=config.adapter_channels)
    else:
        backbone = HGNetV2(config.backbone, learnable_affine=config.backbone_learnable_affine,
                           num_outputs=config.num_feature_levels,
                           frozen_norm=config.backbone_norm == "frozen_batch_norm")
    encoder_dim = config.encoder_hidden_dim or config.hidden_dim
    encoder: nn.Module
    if config.lite_encoder:
        encoder = LiteEncoder(backbone.out_channels, encoder_dim, expansion=config.csp_expansion,
                              depth_multiplier=config.csp_depth_multiplier)
    elif deimv2:
        encoder = deimv2_hybrid_encoder(
            backbone.out_channels, encoder_dim, num_heads=config.num_heads,
            dim_feedforward=config.encoder_dim_feedforward or config.dim_feedforward,
            num_layers=config.num_encoder_layers, dropout=config.dropout, expansion=config.csp_expansion,
            depth_multiplier=config.csp_depth_multiplier, trailing_conv=config.csp_trailing_conv)
    else:
        encoder = dfine_hybrid_encoder(
            backbone.out_channels, encoder_dim, num_heads=config.num_heads,
            dim_feedforward=config.encoder_dim_feedforward or config.dim_feedforward,
            num_layers=config.num_encoder_layers, dropout=config.dropout, expansion=config.csp_expansion,
            depth_multiplier=config.csp_depth_multiplier)
    points = config.num_points_per_level or (config.num_points,) * config.num_feature_levels
    activation = F.silu if config.decoder_activation == "silu" else F.relu
    mlp_activation = F.silu if config.decoder_mlp_activation == "silu" else F.relu
    query_pos_head = None
    if deimv2:  # DEIMv2's decoder_activation is its query positions' (its feed-forward networks are SwiGLU)
        query_pos_head = MLP(4, config.hidden_dim, config.hidden_dim, 3, activation=activation)
        activation = F.relu
    decoder = DFineDecoder([encoder_dim] * len(backbone.out_channels), num_classes=config.num_classes,
                           hidden_dim=config.hidden_dim, num_queries=config.num_queries,
                           num_layers=config.num_decoder_layers, num_heads=config.num_heads,
                           num_levels=config.num_feature_levels, num_points=points,
                           dim_feedforward=config.dim_feedforward, dropout=config.dropout,
                           offset_scale=config.sampling_offset_scale, sampling_method=config.sampling_method,
                           denoising=config.denoising, max_num_bins=config.max_num_bins, reg_scale=config.reg_scale,
                           up=config.reg_up, lqe_top_k=config.lqe_top_k, lqe_hidden_dim=config.lqe_hidden_dim,
                           lqe_layers=config.lqe_layers, norm="rms_norm" if deimv2 else "layer_norm",
                           feedforward="swiglu" if deimv2 else "relu", gateway=config.decoder_gateway,
                           query_pos_head=query_pos_head, activation=activation, mlp_activation=mlp_activation)
    return DFINE(backbone, encoder, decoder, num_classes=config.num_classes, aux_loss=config.aux_loss)
