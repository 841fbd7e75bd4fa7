"""RT-DETR from its :class:`detr.models.rtdetr.config.RTDETRConfig`: the family's builder."""

from __future__ import annotations

from detr.models.rtdetr.config import RTDETRConfig
from detr.models.rtdetr.decoder import RTDETRDecoder
from detr.models.rtdetr.hybrid_encoder import HybridEncoder
from detr.models.rtdetr.model import RTDETR
from detr.models.rtdetr.resnet_vd import ResNetVd


def build_rtdetr(config: RTDETRConfig) -> RTDETR:
    """ResNet-vd of ``config.backbone``, the hybrid encoder (``encoder_hidden_dim``, ``encoder_dim_feedforward``
    when set, else the decoder's), the decoder and its heads."""
    backbone = ResNetVd(config.backbone, norm=config.backbone_norm)
    encoder_dim = config.encoder_hidden_dim or config.hidden_dim
    encoder = HybridEncoder(backbone.out_channels, encoder_dim, num_heads=config.num_heads,
                            dim_feedforward=config.encoder_dim_feedforward or config.dim_feedforward,
                            num_layers=config.num_encoder_layers, dropout=config.dropout,
                            expansion=config.csp_expansion)
    decoder = RTDETRDecoder([encoder_dim] * len(backbone.out_channels), num_classes=config.num_classes,
                            hidden_dim=config.hidden_dim, num_queries=config.num_queries,
                            num_layers=config.num_decoder_layers, num_heads=config.num_heads,
                            num_levels=config.num_feature_levels, num_points=config.num_points,
                            dim_feedforward=config.dim_feedforward, dropout=config.dropout,
                            offset_scale=config.sampling_offset_scale, sampling_method=config.sampling_method,
                            denoising=config.denoising)
    return RTDETR(backbone, encoder, decoder, num_classes=config.num_classes, aux_loss=config.aux_loss)
