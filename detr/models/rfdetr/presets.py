"""RF-DETR's and LW-DETR's released sizes: the one table the family's presets (:mod:`detr.models.rfdetr.family`)
and the checkpoint readers (:mod:`detr.checkpoints.rfdetr_package`) read.

RF-DETR: the ``rfdetr`` package's model classes (roboflow/rf-detr ``rfdetr/config.py``: ``RFDETRNanoConfig`` ...
``RFDETRSeg2XLargeConfig``): DINOv2-S windowed (``dinov2_windowed_small``), 8 self- and 16 cross-attention heads,
2 points, one projector level (``P4``), 13 Group DETR groups; per size the patch, the windows, the ViT stages
(``out_feature_indexes``), the decoder layers, the queries, the position table (``positional_encoding_size`` ×
patch) and the eval square (``resolution``). LW-DETR: the authors' scripts (Atten4Vis/LW-DETR
``scripts/lwdetr_*_coco_eval.sh``, ``models/backbone/backbone.py``), as transformers' conversion writes them
(``lw_detr`` directories, AnnaZhang/lwdetr_*): a CAE ViT of 12 heads with 16-px patches, 4 × 4 windows and a
224-px position table; its stages are the authors' ``out_feature_indexes`` + 1 (an output after that many blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize


@dataclass(frozen=True)
class Release:
    """One released size: its config and what the config does not hold.

    Attributes:
        config: the model (COCO's 91 class logits, the config's default).
        resolution: the square side, in pixels, it was trained and evaluated at (the package's ``resolution``).
        package_file: the rfdetr package's weights file stem (``rf-detr-nano``; its ``pretrain_weights``), or None
            (LW-DETR, whose files the package does not write).
        package_class: the package's class of that model (``RFDETRNano``; a checkpoint's ``model_name``), or None.
        package_settings: settings of the package's model that neither its weights nor ``config`` show, which the
            rfdetr package reader needs (the keypoint model's ``{"dual_projector_kp_only": True}``).
    """

    config: RFDETRConfig
    resolution: int
    package_file: str | None = None
    package_class: str | None = None
    package_settings: Mapping[str, Any] = field(default_factory=dict)


def _rfdetr(*, patch: int, windows: int, stages: tuple[int, ...], layers: int,
            position_patches: int, queries: int = 300, masks: bool = False) -> RFDETRConfig:
    """An RF-DETR size: DINOv2-S windowed with ``patch``-px patches, ``windows`` per side, the ViT's ``stages``, a
    ``position_patches``-wide position table, ``layers`` decoder layers and ``queries`` per group."""
    vit = WindowedViTSize(out_indices=stages, num_windows=windows, patch_size=patch,
                          position_size=position_patches * patch)
    return RFDETRConfig(vit=vit, num_decoder_layers=layers, num_queries=queries, instance_masks=masks)


def _lwdetr(*, width: int, depth: int, windowed: tuple[int, ...], stages: tuple[int, ...], large: bool,
            queries: int = 300) -> RFDETRConfig:
    """An LW-DETR size: a CAE ViT ``width`` wide, ``depth`` blocks, ``windowed`` blocks within windows; the small
    decoder (256 wide, 8 / 16 heads, 2 points, one level) or the large one (384 wide, 12 / 24 heads, 4 points, the
    levels at 2 × and 0.5 × the patch grid)."""
    vit = WindowedViTSize(width=width, depth=depth, heads=12, mlp_dim=4 * width, out_indices=stages, num_windows=4,
                          patch_size=16, position_size=224, window_blocks=windowed)
    scales = (2.0, 0.5) if large else (1.0,)
    return RFDETRConfig(
        backbone="lwdetr_vit", vit=vit, hidden_dim=384 if large else 256, num_heads=12 if large else 8,
        cross_attention_heads=24 if large else 16, num_points=4 if large else 2, num_feature_levels=len(scales),
        projector_scales=scales, projector_norm="batch_norm", num_queries=queries)


_LW_WINDOWED = (0, 1, 3, 6, 7, 9)
_LW_STAGES = (3, 5, 6, 10)
_LATE = (3, 6, 9, 12)

#: Preset name → its released model.
RELEASES: dict[str, Release] = {
    "rfdetr_nano": Release(_rfdetr(patch=16, windows=2, stages=_LATE, layers=2, position_patches=24),
                           384, "rf-detr-nano", "RFDETRNano"),
    "rfdetr_small": Release(_rfdetr(patch=16, windows=2, stages=_LATE, layers=3, position_patches=32),
                            512, "rf-detr-small", "RFDETRSmall"),
    "rfdetr_medium": Release(_rfdetr(patch=16, windows=2, stages=_LATE, layers=4,
                                     position_patches=36), 576, "rf-detr-medium", "RFDETRMedium"),
    "rfdetr_base": Release(_rfdetr(patch=14, windows=4, stages=(2, 5, 8, 11), layers=3,
                                   position_patches=37), 560, "rf-detr-base", "RFDETRBase"),
    "rfdetr_large": Release(_rfdetr(patch=16, windows=2, stages=_LATE, layers=4, position_patches=44),
                            704, "rf-detr-large-2026", "RFDETRLarge"),
    **{f"rfdetr_seg_{size}": Release(
        _rfdetr(patch=12, windows=windows, stages=_LATE, layers=layers, position_patches=resolution // 12,
                queries=queries, masks=True), resolution, f"rf-detr-seg-{file_size}", f"RFDETRSeg{class_size}")
       for size, file_size, class_size, windows, layers, queries, resolution in (
           ("preview", "preview", "Preview", 2, 4, 200, 432), ("nano", "nano", "Nano", 1, 4, 100, 312),
           ("small", "small", "Small", 2, 4, 100, 384), ("medium", "medium", "Medium", 2, 5, 200, 432),
           ("large", "large", "Large", 2, 5, 200, 504), ("xlarge", "xlarge", "XLarge", 2, 6, 300, 624),
           ("2xlarge", "xxlarge", "2XLarge", 2, 6, 300, 768))},
    # the package's RFDETRKeypointPreview: the persons' 17 COCO keypoints (GroupPose) with the keypoints' own projector
    "rfdetr_keypoint_preview": Release(
        replace(_rfdetr(patch=12, windows=2, stages=_LATE, layers=4, position_patches=48, queries=100),
                num_keypoints_per_class=(0, 17), keypoint_projector=True),
        576, "rf-detr-keypoint-preview-xlarge", "RFDETRKeypointPreview",
        {"dual_projector_kp_only": True, "postprocess_trace_alpha": 0.2}),
    "lwdetr_tiny": Release(_lwdetr(width=192, depth=6, windowed=(0, 2, 4), stages=(2, 4, 6), large=False,
                                   queries=100), 640),
    "lwdetr_small": Release(_lwdetr(width=192, depth=10, windowed=_LW_WINDOWED, stages=_LW_STAGES, large=False), 640),
    "lwdetr_medium": Release(_lwdetr(width=384, depth=10, windowed=_LW_WINDOWED, stages=_LW_STAGES, large=False),
                             640),
    "lwdetr_large": Release(_lwdetr(width=384, depth=10, windowed=_LW_WINDOWED, stages=_LW_STAGES, large=True), 640),
    "lwdetr_xlarge": Release(_lwdetr(width=768, depth=10, windowed=_LW_WINDOWED, stages=_LW_STAGES, large=True), 640),
}


def release_of_package_name(name: str) -> Release | None:
    """The release the rfdetr package names ``name``: a weights file stem (``rf-detr-nano``, any case) or a model
    class (``RFDETRNano``); None for another name."""
    lowered = name.lower()
    return next((release for release in RELEASES.values()
                 if release.package_class == name or (release.package_file and release.package_file == lowered)),
                None)
