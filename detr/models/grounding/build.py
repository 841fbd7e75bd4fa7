"""A :class:`GroundingConfig` → its :class:`~detr.models.grounding.model.GroundingDINO` (random weights)."""

from __future__ import annotations

from detr.models.backbone import Backbone, Joiner
from detr.models.deformable.model import stage_channels
from detr.models.deformable.transformer import DeformableEncoderLayer
from detr.models.grounding.config import GroundingConfig
from detr.models.grounding.decoder import CrossModalityDecoder, CrossModalityDecoderLayer
from detr.models.grounding.encoder import FeatureEnhancer, TextEnhancerLayer
from detr.models.grounding.fusion import BiAttentionBlock
from detr.models.grounding.model import GroundingDINO
from detr.models.grounding.swin import SwinStages, build_transformers_backbone
from detr.models.grounding.text import build_bert
from detr.models.grounding.transformer import GroundingTransformer
from detr.models.layers.position_encoding import PositionEmbeddingSine


def build_grounding(config: GroundingConfig) -> GroundingDINO:
    """The model ``config`` describes (its ``pretrained_backbone`` as :class:`detr.models.backbone.Backbone`'s
    ``pretrained``). Needs transformers (the BERT text encoder)."""
    c = config
    pretrained_backbone = c.pretrained_backbone
    stages = ("layer2", "layer3", "layer4")[-min(c.num_feature_levels, 3):]
    if c.backbone == "swin":
        if pretrained_backbone:
            raise ValueError("pretrained_backbone: a Swin backbone's weights come with the checkpoint it is read from")
        body = SwinStages(build_transformers_backbone(c.backbone_config))
        channels = body.channels[-len(stages):]
    else:
        body = Backbone(c.backbone, pretrained=pretrained_backbone)
        channels = [stage_channels(body, stage) for stage in stages]
    backbone = Joiner(body, PositionEmbeddingSine(c.hidden_dim // 2, temperature=c.position_temperature,
                                                  normalize=True))
    half_heads, half_ffn = c.encoder_heads // 2, c.encoder_ffn_dim // 2
    encoder = FeatureEnhancer(
        [BiAttentionBlock(c.hidden_dim, half_ffn, half_heads, drop_path=c.fusion_drop_path,
                          layer_norm_eps=c.layer_norm_eps) for _ in range(c.encoder_layers)],
        [TextEnhancerLayer(c.hidden_dim, half_heads, half_ffn, layer_norm_eps=c.layer_norm_eps)
         for _ in range(c.encoder_layers)],
        [DeformableEncoderLayer(c.hidden_dim, c.encoder_heads, c.num_feature_levels, c.encoder_points,
                                c.encoder_ffn_dim, c.dropout) for _ in range(c.encoder_layers)])
    decoder = CrossModalityDecoder(
        [CrossModalityDecoderLayer(c.hidden_dim, c.num_heads, c.num_feature_levels, c.decoder_points,
                                   c.dim_feedforward, dropout=c.dropout, layer_norm_eps=c.layer_norm_eps)
         for _ in range(c.num_decoder_layers)], c.hidden_dim, layer_norm_eps=c.layer_norm_eps)
    transformer = GroundingTransformer(encoder, decoder, hidden_dim=c.hidden_dim, num_queries=c.num_queries,
                                       num_levels=c.num_feature_levels, max_text_len=c.num_classes,
                                       contrastive_head=c.contrastive_head, layer_norm_eps=c.layer_norm_eps)
    return GroundingDINO(backbone, build_bert(c.text_config), transformer, c, channels=channels,
                         aux_loss=c.aux_loss)
