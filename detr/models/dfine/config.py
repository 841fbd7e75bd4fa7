"""D-FINE's config (docs/models/dfine.md): RT-DETR's options, HGNetV2 and the distribution-refinement decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from detr.models.config import BackboneNorm, check_choice
from detr.models.rtdetr.config import RTDETRConfig

Activation = Literal["relu", "silu"]
HGNETV2 = ("hgnetv2_b0", "hgnetv2_b1", "hgnetv2_b2", "hgnetv2_b3", "hgnetv2_b4", "hgnetv2_b5")


@dataclass(frozen=True)
class DistributionDecoder:
    """D-FINE's decoder options: points per level, the edge distributions (fine-grained distribution refinement),
    the localisation-quality head and the activations.

    Attributes:
        num_points_per_level: sampling points per level (S-X: (3, 6, 3)); None: ``num_points`` at each.
        max_num_bins: N, each box edge is a distribution over N + 1 bins (32).
        reg_scale: the weighting function's curvature (4.0, the authors' reg_scale).
        reg_up: the weighting function's range (0.5, the authors' up).
        lqe_top_k: top probabilities of each edge the localisation-quality head reads (4).
        lqe_hidden_dim: the localisation-quality head's hidden width (64).
        lqe_layers: the localisation-quality head's layers (2).
        activation: "relu" or "silu" in the decoder layers' feed-forward networks (DEIM: "silu"); DEIMv2 (whose
            feed-forward networks are SwiGLU): between the layers of the query-position MLP (transformers'
            decoder_activation_function in both).
        mlp_activation: "relu" or "silu" in the decoder's MLPs: the query positions, the encoder's box head, the
            first layer's box head, the distribution heads and the quality heads (DEIM's mlp_act: "silu";
            transformers' D-FINE has ReLU there; DEIMv2: ReLU).
    """

    num_points_per_level: tuple[int, ...] | None = None
    max_num_bins: int = 32
    reg_scale: float = 4.0
    reg_up: float = 0.5
    lqe_top_k: int = 4
    lqe_hidden_dim: int = 64
    lqe_layers: int = 2
    activation: Activation = "relu"
    mlp_activation: Activation = "relu"

    def __post_init__(self) -> None:
        if self.num_points_per_level is not None:
            object.__setattr__(self, "num_points_per_level", tuple(self.num_points_per_level))
        if self.max_num_bins < 4 or self.max_num_bins % 2 or self.lqe_top_k > self.max_num_bins + 1:
            raise ValueError(f"max_num_bins must be even and at least 4, and lqe_top_k at most max_num_bins + 1, got "
                             f"{self.max_num_bins} and {self.lqe_top_k}")
        check_choice("activation", self.activation, ("relu", "silu"))
        check_choice("mlp_activation", self.mlp_activation, ("relu", "silu"))


@dataclass(frozen=True)
class DFINEConfig(RTDETRConfig):
    """D-FINE (:class:`detr.models.dfine.model.DFINE`): RT-DETR with HGNetV2, D-FINE's fusion blocks and the
    distribution-refinement decoder. Defaults are the authors' S model (HGNetV2-B0 with learnable affine blocks and
    trained norms, a 256-wide encoder of depth 0.34 and expansion 0.5, 3 decoder layers of (3, 6, 3) points).
    Besides :class:`detr.models.rtdetr.config.RTDETRConfig`'s fields:

    Attributes:
        backbone: an HGNetV2 size, "hgnetv2_b0" ... "hgnetv2_b5".
        num_feature_levels: HGNetV2's last 3 stages (or 2, the N model), one decoder level each.
        backbone_learnable_affine: HGNetV2's learnable affine blocks (the authors' use_lab: N, S and M).
        csp_depth_multiplier: RepVGG blocks per CSP layer of the encoder's fusion blocks = round(3 × this).
        decoder: the distribution-refinement decoder's options (:class:`DistributionDecoder`).
    """

    family: ClassVar[str] = "dfine"
    backbones: ClassVar[tuple[str, ...]] = HGNETV2

    num_decoder_layers: int = 3
    backbone: str = "hgnetv2_b0"
    backbone_norm: BackboneNorm = "batch_norm"
    csp_expansion: float = 0.5
    backbone_learnable_affine: bool = True
    csp_depth_multiplier: float = 0.34
    decoder: DistributionDecoder = DistributionDecoder(num_points_per_level=(3, 6, 3))

    def _check_levels(self) -> None:
        if self.num_feature_levels not in (2, 3) or self.num_points < 1:
            raise ValueError(f"{type(self).__name__} reads HGNetV2's last 3 stages (or 2, the N models), one decoder "
                             f"level each: num_feature_levels must be 2 or 3 and num_points at least 1, got "
                             f"{self.num_feature_levels} and {self.num_points}")
        points = self.decoder.num_points_per_level
        if points is not None and (len(points) != self.num_feature_levels or min(points) < 1):
            raise ValueError(f"decoder.num_points_per_level must give a count >= 1 for each of the "
                             f"{self.num_feature_levels} levels, got {points}")

    @property
    def points_per_level(self) -> tuple[int, ...]:
        """The decoder's sampling points at each level."""
        return self.decoder.num_points_per_level or (self.num_points,) * self.num_feature_levels


#: Where the old one-record config's D-FINE options moved (:mod:`detr.models.legacy`).
FLAT_NAMES = {"num_points_per_level": "decoder.num_points_per_level", "max_num_bins": "decoder.max_num_bins",
              "reg_scale": "decoder.reg_scale", "reg_up": "decoder.reg_up", "lqe_top_k": "decoder.lqe_top_k",
              "lqe_hidden_dim": "decoder.lqe_hidden_dim", "lqe_layers": "decoder.lqe_layers",
              "decoder_activation": "decoder.activation", "decoder_mlp_activation": "decoder.mlp_activation"}
