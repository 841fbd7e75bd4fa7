"""RF-DETR's config (RF-DETR and LW-DETR; docs/models/rfdetr.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from detr.models.config import ClassHead, ModelConfig, ViTSize, check_choice

#: The norm of RF-DETR's projector ("layer_norm") or LW-DETR's ("batch_norm").
ProjectorNorm = Literal["layer_norm", "batch_norm"]


@dataclass(frozen=True)
class WindowedViTSize(ViTSize):
    """RF-DETR's windowed DINOv2 ViT (``backbone="dinov2_windowed"``) or LW-DETR's ViT (``"lwdetr_vit"``):
    :class:`detr.models.config.ViTSize` (DINOv2-S by default) and the windows.

    Attributes:
        out_indices: the stages (outputs after that many blocks) the projector reads; those blocks and the ones
            after the last attend globally, the others within windows ((2, 5, 8, 11)).
        num_windows: windows per side of the windowed blocks (4: 16 windows; 1: none).
        patch_size: pixels per patch side (14).
        position_size: the image side the position table was learned at (518: 37 × 37 patches), interpolated to
            other sizes.
        window_blocks: LW-DETR's ViT: the blocks that attend within windows (None: RF-DETR's rule above).
    """

    out_indices: tuple[int, ...] = (2, 5, 8, 11)
    num_windows: int = 4
    patch_size: int = 14
    position_size: int = 518
    window_blocks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RFDETRConfig(ModelConfig):
    """RF-DETR and LW-DETR (:class:`detr.models.rfdetr.model.RFDETR`): a windowed ViT, C2f projectors (one feature
    level per projector scale), two-stage query selection and a deformable decoder with Group DETR's training
    groups. Defaults are RF-DETR base (configs/rfdetr_base_coco.yaml). Besides
    :class:`detr.models.config.ModelConfig`'s fields:

    Attributes:
        backbone: "dinov2_windowed" (RF-DETR) or "lwdetr_vit" (LW-DETR).
        num_feature_levels: one per projector scale.
        num_points: the decoder's sampling points per head and level (2).
        query_groups: Group DETR's groups of queries in training, each matched on its own; inference decodes
            group 1 only (the authors: 13).
        vit: the ViT's size and windows (:class:`WindowedViTSize`).
        cross_attention_heads: heads of the decoder's deformable cross-attention (16; ``num_heads`` is its
            self-attention's).
        projector_expansion: the C2f projector's hidden width (× hidden_dim; 0.5).
        projector_blocks: the C2f projector's blocks (3).
        instance_masks: the segmentation head (query features × pixel features): masks beside the boxes.
        mask_dim_feedforward: the segmentation head's query MLP width (1024).
        projector_scales: one projector per feature level, at this scale of the patch grid (RF-DETR: (1.0,);
            LW-DETR: (2.0, 0.5) and the like).
        projector_norm: "layer_norm" (RF-DETR) or "batch_norm" (LW-DETR) in the projector's C2f blocks.
        num_keypoints_per_class: GroupPose keypoints (:mod:`detr.models.layers.keypoint_head`): per class id its
            keypoint count, 0 for a class without (COCO's persons: (0, 17)); () for none (boxes only).
        keypoint_dim_divisor: the keypoint queries' width is hidden_dim / this (the package's
            ``grouppose_keypoint_dim_downscale``, 1).
        keypoint_cross_attention: the keypoint queries sample the image by deformable attention (True).
        keypoint_inter_instance_attention: each keypoint attends to the same keypoint of every query (False).
        keypoint_projector: a second C2f projector whose maps only the keypoints' cross-attention reads (the
            package's ``dual_projector`` with ``dual_projector_kp_only``); False: they read the decoder's maps.
        keypoint_trace_alpha: post-processing fuses a detection's score with its keypoints' uncertainty,
            sigmoid(log s − α · log mean trace of their covariance) (the package's ``postprocess_trace_alpha``,
            0.2; 0: scores as the class head gives them).
    """

    family: ClassVar[str] = "rfdetr"
    backbones: ClassVar[tuple[str, ...]] = ("dinov2_windowed", "lwdetr_vit")

    num_queries: int = 300
    num_decoder_layers: int = 3
    dropout: float = 0.0
    class_head: ClassHead = "sigmoid"
    backbone: str = "dinov2_windowed"
    num_feature_levels: int = 1
    num_points: int = 2
    query_groups: int = 13
    vit: WindowedViTSize = WindowedViTSize()
    cross_attention_heads: int = 16
    projector_expansion: float = 0.5
    projector_blocks: int = 3
    instance_masks: bool = False
    mask_dim_feedforward: int = 1024
    projector_scales: tuple[float, ...] = (1.0,)
    projector_norm: ProjectorNorm = "layer_norm"
    num_keypoints_per_class: tuple[int, ...] = ()
    keypoint_dim_divisor: int = 1
    keypoint_cross_attention: bool = True
    keypoint_inter_instance_attention: bool = False
    keypoint_projector: bool = False
    keypoint_trace_alpha: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "projector_scales", tuple(float(scale) for scale in self.projector_scales))
        check_choice("projector_norm", self.projector_norm, ("layer_norm", "batch_norm"))
        vit = self.vit
        out = vit.out_indices
        if not out or list(out) != sorted(set(out)) or out[0] < 1 or out[-1] > vit.depth:
            raise ValueError(f"vit.out_indices must be increasing stages in 1..vit.depth ({vit.depth}), got {list(out)}")
        if vit.mlp_dim % vit.width:
            raise ValueError(f"vit.mlp_dim ({vit.mlp_dim}) must be a multiple of vit.width ({vit.width})")
        if self.hidden_dim % self.cross_attention_heads:
            raise ValueError(f"hidden_dim ({self.hidden_dim}) must divide by cross_attention_heads "
                             f"({self.cross_attention_heads})")
        if min(vit.num_windows, vit.patch_size, vit.position_size, self.num_points, self.query_groups) < 1:
            raise ValueError("vit.num_windows, vit.patch_size, vit.position_size, num_points and query_groups must be "
                             "at least 1")
        if self.num_feature_levels != len(self.projector_scales):
            raise ValueError(f"RF-DETR has one feature level per projector scale: set "
                             f"num_feature_levels={len(self.projector_scales)}, got {self.num_feature_levels}")
        if any(scale not in (0.5, 1.0, 2.0) for scale in self.projector_scales):
            raise ValueError(f"projector_scales must be among 0.5, 1.0 and 2.0 (LW-DETR's), got {self.projector_scales}")
        object.__setattr__(self, "num_keypoints_per_class", tuple(int(n) for n in self.num_keypoints_per_class))
        if self.num_keypoints_per_class:
            if min(self.num_keypoints_per_class) < 0 or sum(self.num_keypoints_per_class) == 0:
                raise ValueError(f"num_keypoints_per_class must list a count >= 0 per class id, at least one above 0 "
                                 f"(e.g. [0, 17] for COCO's persons), got {list(self.num_keypoints_per_class)}")
            if len(self.num_keypoints_per_class) > self.num_classes:
                raise ValueError(f"num_keypoints_per_class lists {len(self.num_keypoints_per_class)} classes but "
                                 f"num_classes is {self.num_classes}: shorten the list or raise num_classes")
            if self.keypoint_dim_divisor < 1 or self.hidden_dim % self.keypoint_dim_divisor:
                raise ValueError(f"keypoint_dim_divisor must divide hidden_dim ({self.hidden_dim}), got "
                                 f"{self.keypoint_dim_divisor}")
            if self.keypoint_trace_alpha < 0:
                raise ValueError(f"keypoint_trace_alpha must be >= 0, got {self.keypoint_trace_alpha}")
            if self.instance_masks:
                raise ValueError("RF-DETR predicts instance masks or keypoints, not both: set instance_masks=False "
                                 "or num_keypoints_per_class=[]")
        elif self.keypoint_projector:
            raise ValueError("keypoint_projector=True is a keypoint model's second projector: set "
                             "num_keypoints_per_class (e.g. [0, 17]) or keypoint_projector=False")
        if self.class_head != "sigmoid":
            raise ValueError(f"RF-DETR does not take class_head={self.class_head!r}: set class_head='sigmoid'")


#: Where the old one-record config's RF-DETR options moved (:mod:`detr.models.legacy`).
FLAT_NAMES = {"vit_hidden_dim": "vit.width", "vit_num_layers": "vit.depth", "vit_num_heads": "vit.heads",
              "rfdetr_vit_mlp_dim": "vit.mlp_dim", "vit_out_indices": "vit.out_indices",
              "vit_num_windows": "vit.num_windows", "vit_patch_size": "vit.patch_size",
              "vit_position_size": "vit.position_size", "vit_window_blocks": "vit.window_blocks"}


def migrate_flat(values: dict[str, Any]) -> dict[str, Any]:
    """The old one record's ``vit_mlp_ratio`` (MLP width over width) as the ViT's MLP width."""
    values = dict(values)
    values["rfdetr_vit_mlp_dim"] = int(values.pop("vit_mlp_ratio")) * int(values["vit_hidden_dim"])
    return values
