"""RT-DETR's config (RT-DETR and RT-DETRv2; docs/models/rtdetr.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from detr.models.config import BackboneNorm, ClassHead, ModelConfig, check_choice

#: How deformable attention reads a sampling location: "bilinear" (grid_sample) or "discrete" (the nearest cell).
SamplingMethod = Literal["bilinear", "discrete"]


@dataclass(frozen=True)
class RTDETRConfig(ModelConfig):
    """RT-DETR and RT-DETRv2 (:class:`detr.models.rtdetr.model.RTDETR`): a ResNet-vd backbone, the hybrid encoder
    (``num_encoder_layers`` AIFI layers with CCFM fusion), a deformable decoder with box refinement and queries from
    the encoder's top ``num_queries``. Defaults are the authors' R50vd (300 queries, 1024-wide feed-forward
    networks, no dropout, 3 levels, a sigmoid head, contrastive denoising). Besides
    :class:`detr.models.config.ModelConfig`'s fields:

    Attributes:
        backbone: ResNet-vd depth: resnet18, resnet34, resnet50 or resnet101.
        num_encoder_layers: AIFI layers on the stride-32 map (1).
        backbone_norm: "frozen_batch_norm" (the authors' R50 and R101), "batch_norm" (R18, R34) or "group_norm".
        denoising: contrastive denoising queries in training (the forward then needs ``targets``).
        num_feature_levels: the decoder's levels: 3 (strides 8, 16, 32), more (further stride-2 levels).
        num_points: sampling points per head and level (4).
        encoder_hidden_dim: the hybrid encoder's width (None: hidden_dim; R101: 384).
        encoder_dim_feedforward: AIFI's feed-forward width (None: dim_feedforward; R101: 2048).
        csp_expansion: width of the CSP blocks' RepVGG branch relative to encoder_hidden_dim (1.0).
        sampling_offset_scale: RT-DETRv2's decoder offsets around a box in units of this × its size / points (0.5).
        sampling_method: "bilinear" or "discrete" (RT-DETRv2's nearest-cell sampling, without grid_sample).
    """

    family: ClassVar[str] = "rtdetr"
    backbones: ClassVar[tuple[str, ...]] = ("resnet18", "resnet34", "resnet50", "resnet101")

    num_queries: int = 300
    dim_feedforward: int = 1024
    dropout: float = 0.0
    class_head: ClassHead = "sigmoid"
    num_encoder_layers: int = 1
    backbone_norm: BackboneNorm = "frozen_batch_norm"
    denoising: bool = True
    num_feature_levels: int = 3
    num_points: int = 4
    encoder_hidden_dim: int | None = None
    encoder_dim_feedforward: int | None = None
    csp_expansion: float = 1.0
    sampling_offset_scale: float = 0.5
    sampling_method: SamplingMethod = "bilinear"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("sampling_method", self.sampling_method, ("bilinear", "discrete"))
        self._check_levels()
        encoder_hidden_dim = self.encoder_hidden_dim or self.hidden_dim
        if encoder_hidden_dim % self.num_heads or encoder_hidden_dim % 4:
            raise ValueError(f"{type(self).__name__} needs encoder_hidden_dim ({encoder_hidden_dim}) divisible by "
                             f"num_heads ({self.num_heads}) and by 4 (its 2-D sin-cos positions)")
        if self.class_head != "sigmoid":
            raise ValueError(f"{type(self).__name__} does not take class_head={self.class_head!r}: set "
                             f"class_head='sigmoid' (the varifocal head)")

    def _check_levels(self) -> None:
        if self.num_feature_levels < 3 or self.num_points < 1:
            raise ValueError(f"RT-DETR reads the backbone's strides 8, 16 and 32 (and optionally coarser levels): "
                             f"num_feature_levels must be at least 3 and num_points at least 1, got "
                             f"{self.num_feature_levels} and {self.num_points}")
