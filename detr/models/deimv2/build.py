"""DEIMv2 from its :class:`detr.models.deimv2.config.DEIMv2Config`: D-FINE's parts (:mod:`detr.models.dfine.build`)
with DEIMv2's encoder (summed RepNCSPELAN5 fusion, or the lite encoder) and decoder layers (RMSNorm, SwiGLU), on
HGNetV2 or the DINOv3 ViT with its spatial tuning adapter."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from detr.models.deimv2.config import DEIMv2Config
from detr.models.dfine.build import activation_function, distribution_decoder, hgnetv2_backbone
from detr.models.dfine.dinov3 import DINOv3Backbone
from detr.models.dfine.encoder import LiteEncoder, deimv2_hybrid_encoder
from detr.models.dfine.hgnetv2 import HGNetV2
from detr.models.dfine.model import DFINE
from detr.models.layers.mlp import MLP


def build_deimv2(config: DEIMv2Config) -> DFINE:
    """The backbone (HGNetV2, or the DINOv3 ViT of ``config.vit``), DEIMv2's encoder and its decoder layers."""
    backbone: HGNetV2 | DINOv3Backbone
    if config.backbone == "dinov3_vit":
        vit = config.vit
        backbone = DINOv3Backbone(vit.width, vit.depth, vit.heads, vit.mlp_dim, num_register_tokens=vit.register_tokens,
                                  out_layers=vit.out_layers, gated_mlp=vit.gated_mlp,
                                  adapter_channels=config.adapter_channels)
    else:
        backbone = hgnetv2_backbone(config)
    encoder_dim = config.encoder_hidden_dim or config.hidden_dim
    encoder: nn.Module
    if config.lite_encoder:
        encoder = LiteEncoder(backbone.out_channels, encoder_dim, expansion=config.csp_expansion,
                              depth_multiplier=config.csp_depth_multiplier)
    else:
        encoder = deimv2_hybrid_encoder(
            backbone.out_channels, encoder_dim, num_heads=config.num_heads,
            dim_feedforward=config.encoder_dim_feedforward or config.dim_feedforward,
            num_layers=config.num_encoder_layers, dropout=config.dropout, expansion=config.csp_expansion,
            depth_multiplier=config.csp_depth_multiplier, trailing_conv=config.csp_trailing_conv)
    # DEIMv2's decoder.activation is its query positions' (its feed-forward networks are SwiGLU)
    query_pos_head = MLP(4, config.hidden_dim, config.hidden_dim, 3,
                         activation=activation_function(config.decoder.activation))
    decoder = distribution_decoder(config, [encoder_dim] * len(backbone.out_channels), norm="rms_norm",
                                   feedforward="swiglu", gateway=config.decoder_gateway,
                                   query_pos_head=query_pos_head, activation=F.relu)
    return DFINE(backbone, encoder, decoder, num_classes=config.num_classes, aux_loss=config.aux_loss)
