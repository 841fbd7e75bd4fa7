"""Deformable DETR's config (Zhu et al., 2021; docs/models/deformable.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from detr.models.config import BackboneNorm, ClassHead, ModelConfig
from detr.models.detr_family import RESNETS, ResNetName


@dataclass(frozen=True)
class DeformableConfig(ModelConfig):
    """Deformable DETR: multi-scale deformable attention (:class:`detr.models.deformable.model.DeformableDETR`) on
    a ResNet. Defaults are the authors' COCO model (R50, 4 levels, 4 points, 300 queries, a sigmoid head, 1024-wide
    feed-forward networks). Besides :class:`detr.models.config.ModelConfig`'s fields:

    Attributes:
        backbone: ResNet depth: resnet18, resnet34, resnet50 (the authors') or resnet101.
        dilation: DC5: layer4 dilated instead of strided (ResNet-50/101 only).
        num_encoder_layers: deformable encoder layers (6).
        backbone_norm: "frozen_batch_norm" (the authors', with pretrained weights), "batch_norm" or "group_norm".
        backbone_trainable_layers: ResNet stages that train, counted from the top (3 = layer2–4).
        num_feature_levels: input levels: 4 (layer2–4 + one stride-64 level, the paper), 1 (single-scale:
            layer4), 2 or 3 (the last stages), more (further stride-2 levels).
        num_points: sampling points per head and level (4).
        box_refine: iterative bounding-box refinement (§4.2).
        two_stage: queries from the encoder's best proposals (§4.2; needs box_refine).
    """

    family: ClassVar[str] = "deformable"
    backbones: ClassVar[tuple[str, ...]] = RESNETS

    num_queries: int = 300
    dim_feedforward: int = 1024
    class_head: ClassHead = "sigmoid"
    backbone: ResNetName = "resnet50"
    dilation: bool = False
    num_encoder_layers: int = 6
    backbone_norm: BackboneNorm = "frozen_batch_norm"
    backbone_trainable_layers: int = 3
    num_feature_levels: int = 4
    num_points: int = 4
    box_refine: bool = False
    two_stage: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_feature_levels < 1 or self.num_points < 1:
            raise ValueError(f"num_feature_levels and num_points must be at least 1, got {self.num_feature_levels} "
                             f"and {self.num_points}")
        if self.two_stage and not self.box_refine:
            raise ValueError("two_stage=True needs box_refine=True (as in the authors' Deformable DETR)")
        if self.hidden_dim % 32:
            raise ValueError(f"Deformable DETR projects every level with GroupNorm(32): hidden_dim must divide by 32, "
                             f"got {self.hidden_dim}")
        if self.class_head != "sigmoid":
            raise ValueError(f"Deformable DETR does not take class_head={self.class_head!r}: set "
                             f"class_head='sigmoid' (the focal head)")
        if self.dilation and self.backbone in ("resnet18", "resnet34"):
            raise ValueError(f"dilation (DC5) needs bottleneck blocks: use resnet50 or resnet101, not {self.backbone}")
