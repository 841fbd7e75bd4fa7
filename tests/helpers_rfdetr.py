"""Shared by the RF-DETR tests: tiny transformers RF-DETR models (a small windowed ViT, projector and decoder) with
random weights (hf_model imports transformers: call it from tests that skip without it)."""

from __future__ import annotations

import torch

from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from tests.helpers import randomise

#: A small ViT: 4 blocks of width 48, stages 1, 2 and 4 read, 2 × 2 windows, a 4 × 4 position table.
TINY_VIT = {"hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "out_indices": [1, 2, 4],
            "num_windows": 2, "image_size": 56, "patch_size": 14}
#: A small decoder: width 64, 4 self- and 8 cross-attention heads, 2 layers, 20 queries, 3 training groups.
TINY = {"d_model": 64, "decoder_self_attention_heads": 4, "decoder_cross_attention_heads": 8, "decoder_ffn_dim": 96,
        "decoder_layers": 2, "num_queries": 20, "group_detr": 3, "intermediate_size": 32, "c2f_num_blocks": 2}


def hf_config(num_labels: int = 80, vit: dict | None = None, **options):
    """transformers' RfDetrConfig of :data:`TINY` (and :data:`TINY_VIT`), with ``vit`` and ``options`` changed."""
    import transformers

    vit_config = transformers.RfDetrDinov2Config(**{**TINY_VIT, **(vit or {})})
    return transformers.RfDetrConfig(backbone_config=vit_config, num_labels=num_labels,
                                     id2label={i: f"thing {i}" for i in range(num_labels)}, **{**TINY, **options})


def hf_model(num_labels: int = 80, *, vit: dict | None = None, masks: bool = False, seed: int = 0, **options):
    """A transformers RF-DETR (``RfDetrForInstanceSegmentation`` with ``masks``) with random weights everywhere
    (transformers' init starts every query at the same box)."""
    import transformers

    config = hf_config(num_labels, vit, **options)
    torch.manual_seed(seed)
    family = transformers.RfDetrForInstanceSegmentation if masks else transformers.RfDetrForObjectDetection
    model = family(config).eval()
    randomise(model, seed)
    return model


#: A small LW-DETR ViT: 4 blocks of width 48 (blocks 0 and 2 windowed, 4 windows), stages 2 and 4 read, patch 14,
#: a 4 × 4 position table.
TINY_LW_VIT = {"hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "window_block_indices": [0, 2],
               "out_indices": [2, 4], "num_windows": 4, "pretrain_image_size": 56, "patch_size": 14}


def hf_lwdetr(num_labels: int = 80, *, vit: dict | None = None, seed: int = 0, **options):
    """A transformers LW-DETR (two projector levels, strides 7 and 28 of patch 14) with random weights everywhere."""
    import transformers

    vit_config = transformers.LwDetrViTConfig(**{**TINY_LW_VIT, **(vit or {})})
    settings = {**TINY, "projector_scale_factors": [2.0, 0.5], "num_feature_levels": 2, **options}
    settings.pop("intermediate_size")
    config = transformers.LwDetrConfig(backbone_config=vit_config, num_labels=num_labels,
                                       id2label={i: f"thing {i}" for i in range(num_labels)}, **settings)
    torch.manual_seed(seed)
    model = transformers.LwDetrForObjectDetection(config).eval()
    randomise(model, seed)
    return model


#: A tiny RF-DETR with GroupPose keypoints (classes with 0, 3 and 2 keypoints, the second projector): 32-px squares.
KEYPOINT_COUNTS = (0, 3, 2)
TINY_KEYPOINT_RFDETR = RFDETRConfig(
    hidden_dim=32, num_heads=4, cross_attention_heads=8, dim_feedforward=48, num_decoder_layers=2, num_queries=6,
    num_classes=4, projector_blocks=1, num_points=2, query_groups=2,
    vit=WindowedViTSize(width=24, depth=3, heads=3, out_indices=(1, 3), num_windows=2, patch_size=8, position_size=32,
                        mlp_dim=48),
    num_keypoints_per_class=KEYPOINT_COUNTS, keypoint_projector=True, pretrained_backbone=False)
