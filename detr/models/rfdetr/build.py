"""RF-DETR from its :class:`detr.models.rfdetr.config.RFDETRConfig`: the family's builder."""

from __future__ import annotations

from torch import nn

from detr.models.layers.keypoint_head import KeypointHead
from detr.models.rfdetr.config import RFDETRConfig
from detr.models.rfdetr.decoder import RFDETRDecoder
from detr.models.rfdetr.lw_vit import LwDetrViT
from detr.models.rfdetr.model import RFDETR
from detr.models.rfdetr.projector import Projector
from detr.models.rfdetr.segmentation import MaskHead
from detr.models.rfdetr.vit import WindowedViT


def build_rfdetr(config: RFDETRConfig) -> RFDETR:
    """The windowed ViT of ``config.vit`` (DINOv2's, or LW-DETR's for ``backbone="lwdetr_vit"``), a C2f
    projector per scale, the decoder and its heads (``query_groups`` Group DETR groups in training), and the mask head
    when ``instance_masks``; with ``num_keypoints_per_class``, the GroupPose keypoint head (and its second
    projector with ``keypoint_projector``)."""
    vit = config.vit
    sizes = (vit.width, vit.depth, vit.heads, vit.mlp_dim // vit.width)
    common = {"out_indices": vit.out_indices, "num_windows": vit.num_windows, "patch_size": vit.patch_size,
              "position_size": vit.position_size}
    backbone = (LwDetrViT(*sizes, window_blocks=vit.window_blocks or (), **common)
                if config.backbone == "lwdetr_vit" else WindowedViT(*sizes, **common))
    def projectors() -> nn.ModuleList:
        return nn.ModuleList(
            Projector(backbone.out_channels, config.hidden_dim, expansion=config.projector_expansion,
                      num_blocks=config.projector_blocks, scale=scale, norm=config.projector_norm)
            for scale in config.projector_scales)

    keypoint_head = None
    if config.num_keypoints_per_class:
        keypoint_head = KeypointHead(
            config.num_keypoints_per_class, hidden_dim=config.hidden_dim, num_layers=config.num_decoder_layers,
            num_heads=config.num_heads, cross_attention_heads=config.cross_attention_heads,
            num_levels=config.num_feature_levels, num_points=config.num_points,
            dim_divisor=config.keypoint_dim_divisor, dropout=config.dropout,
            cross_attention=config.keypoint_cross_attention,
            inter_instance_attention=config.keypoint_inter_instance_attention, num_groups=config.query_groups)
    decoder = RFDETRDecoder(num_classes=config.num_classes, hidden_dim=config.hidden_dim,
                            num_queries=config.num_queries, num_layers=config.num_decoder_layers,
                            num_heads=config.num_heads, cross_attention_heads=config.cross_attention_heads,
                            num_levels=config.num_feature_levels, num_points=config.num_points, dim_feedforward=config.dim_feedforward,
                            dropout=config.dropout, num_groups=config.query_groups,
                            keypoint_head=keypoint_head)
    mask_head = (MaskHead(config.hidden_dim, config.num_decoder_layers, config.mask_dim_feedforward)
                 if config.instance_masks else None)
    model = RFDETR(backbone, projectors(), decoder, mask_head, num_classes=config.num_classes,
                   aux_loss=config.aux_loss, keypoint_projector=projectors() if config.keypoint_projector else None)
    if keypoint_head is not None:
        model.keypoint_trace_alpha = config.keypoint_trace_alpha
    return model
