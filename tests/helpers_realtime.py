"""Shared by the tests that run the commands (detr-predict, detr-serve, detr-explore, detr-analyze) on the real-time
families: one tiny model of each, built from this project's config with random weights and saved as this project's
checkpoint (config, category names and eval size travel with it)."""

from __future__ import annotations

from pathlib import Path

import torch

from detr import build_detr
from detr.models.deimv2.config import DEIMv2Config, DINOv3Size
from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from detr.models.rtdetr.config import RTDETRConfig
from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.models.config import ModelMeta
from tests.helpers import randomise

_RTDETR = RTDETRConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=4, dim_feedforward=48,
                       num_decoder_layers=2, num_queries=12, num_classes=5, dropout=0.0, num_points=2,
                       num_feature_levels=3, num_encoder_layers=6, denoising=False)
#: A tiny model's config per family: RT-DETR (ResNet-18), D-FINE (HGNetV2-B0, the S-X models' 3, 6 and 3 points per
#: level), DEIMv2 (a small DINOv3 ViT and its adapter), RF-DETR (a small windowed DINOv2 ViT, instance masks).
CONFIGS = {
    "rtdetr": _RTDETR,
    "dfine": DFINEConfig(class_head="sigmoid", backbone="hgnetv2_b0", hidden_dim=32, num_heads=4, dim_feedforward=48,
                         num_decoder_layers=2, num_queries=12, num_classes=5, dropout=0.0, num_feature_levels=3,
                         csp_expansion=0.5, csp_depth_multiplier=0.34, backbone_learnable_affine=True,
                         num_encoder_layers=6, backbone_norm='frozen_batch_norm', denoising=False,
                         decoder=DistributionDecoder(num_points_per_level=(3, 6, 3), max_num_bins=8)),
    "deimv2": DEIMv2Config(class_head="sigmoid", backbone="dinov3_vit", hidden_dim=32, num_heads=4,
                           dim_feedforward=48, num_decoder_layers=2, num_queries=12, num_classes=5, dropout=0.0,
                           num_feature_levels=3, num_points=2, csp_expansion=0.5, csp_depth_multiplier=0.34,
                           adapter_channels=4, csp_trailing_conv=False, num_encoder_layers=6,
                           backbone_norm='frozen_batch_norm', denoising=False, backbone_learnable_affine=False,
                           decoder=DistributionDecoder(max_num_bins=8, num_points_per_level=None),
                           vit=DINOv3Size(width=32, depth=3, heads=2, mlp_dim=48, register_tokens=2,
                                          out_layers=(1, 2, 3))),
    "rfdetr": RFDETRConfig(backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=1, hidden_dim=32,
                           num_heads=4, cross_attention_heads=8, dim_feedforward=48, num_decoder_layers=2,
                           num_queries=12, num_classes=5, dropout=0.0, projector_blocks=1, instance_masks=True,
                           mask_dim_feedforward=16, num_points=4, query_groups=1,
                           vit=WindowedViTSize(width=24, depth=3, heads=3, out_indices=(1, 3), num_windows=2,
                                               position_size=56, mlp_dim=96)),
}
#: Each family's square input: 160 (strides 8, 16 and 32: 20, 10 and 5 cells); RF-DETR's a multiple of its patch
#: (14) times its windows (2).
EVAL_SIZES = {"rtdetr": 160, "dfine": 160, "deimv2": 160, "rfdetr": 112}
#: The five classes' names and data set ids (with gaps, as COCO's).
CATEGORIES = CategoryMap((3, 7, 9, 11, 12), ("circle", "square", "triangle", "star", "ring"))


def tiny_model(family: str, seed: int = 0, category_map: CategoryMap = CATEGORIES, **changes) -> torch.nn.Module:
    """The family's tiny model (:data:`CONFIGS`, with config fields ``changes``) with random weights (the authors'
    inits start every query at the same box), D-FINE's weighting constants kept, in eval mode, its classes and meta
    those of ``category_map`` at its square :data:`EVAL_SIZES`."""
    torch.manual_seed(seed)
    model = build_detr(CONFIGS[family].replace(num_classes=category_map.num_classes, **changes)).eval()
    constants = {name: buffer.clone() for name, buffer in model.named_buffers() if name.startswith("decoder.decoder.")}
    randomise(model, seed)
    model.load_state_dict(constants, strict=False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("lab.scale"):  # keep HGNetV2's affine blocks near the identity, so signals survive
                parameter.add_(1.0)
    size = EVAL_SIZES[family]
    model.meta = ModelMeta(category_map=category_map, eval_size=(size, size))
    return model


def tiny_checkpoint(family: str, folder: Path) -> Path:
    """:func:`tiny_model` saved as ``folder/<family>.ckpt`` (:func:`detr.checkpoints.save_checkpoint`)."""
    return save_checkpoint(tiny_model(family), Path(folder) / f"{family}.ckpt")
