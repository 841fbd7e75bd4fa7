"""DEIMv2's config: D-FINE's options, the encoder and decoder variants and the DINOv3 ViT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from detr.models.config import ViTSize
from detr.models.dfine.config import HGNETV2, DFINEConfig


@dataclass(frozen=True)
class DINOv3Size(ViTSize):
    """DEIMv2's DINOv3 ViT (``backbone="dinov3_vit"``): :class:`detr.models.config.ViTSize` (ViT-S/16 by default)
    and its own options.

    Attributes:
        register_tokens: register tokens (4).
        out_layers: the three blocks (1-based) whose patch tokens become the strides 8, 16, 32.
        gated_mlp: a gated (SwiGLU) MLP instead of the plain one (False).
    """

    register_tokens: int = 4
    out_layers: tuple[int, ...] = (5, 8, 11)
    gated_mlp: bool = False


@dataclass(frozen=True)
class DEIMv2Config(DFINEConfig):
    """DEIMv2 (:class:`detr.models.dfine.model.DFINE` with DEIMv2's parts). Besides
    :class:`detr.models.dfine.config.DFINEConfig`'s fields (``decoder.mlp_activation`` stays "relu": DEIMv2's
    query positions take ``decoder.activation``, its heads ReLU):

    Attributes:
        backbone: an HGNetV2 size or "dinov3_vit" (sized by ``vit``).
        lite_encoder: the Atto/Femto/Pico encoder (no AIFI, two levels; num_feature_levels=2,
            num_encoder_layers=0) instead of the hybrid encoder.
        decoder_gateway: the decoder layers' gate after the cross-attention (True); False: residual + RMSNorm.
        csp_trailing_conv: the 3×3 at the end of the fusion blocks' CSP layers (True; the DINOv3 models: False).
        vit: the DINOv3 ViT's size (backbone="dinov3_vit" only).
        adapter_channels: c of the spatial tuning adapter (2c, 4c, 4c channels at strides 8, 16, 32; 16).
    """

    family: ClassVar[str] = "deimv2"
    backbones: ClassVar[tuple[str, ...]] = (*HGNETV2, "dinov3_vit")

    lite_encoder: bool = False
    decoder_gateway: bool = True
    csp_trailing_conv: bool = True
    vit: DINOv3Size = DINOv3Size()
    adapter_channels: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lite_encoder and self.num_feature_levels != 2:
            raise ValueError(f"lite_encoder=True fuses HGNetV2's last 2 stages: set num_feature_levels=2, got "
                             f"{self.num_feature_levels}")
        if self.lite_encoder and self.num_encoder_layers:
            raise ValueError(f"lite_encoder=True has no AIFI layers: set num_encoder_layers=0, got "
                             f"{self.num_encoder_layers}")
        if self.backbone != "dinov3_vit" and (self.vit != DINOv3Size() or self.adapter_channels != 16):
            raise ValueError(f"vit={self.vit} and adapter_channels={self.adapter_channels} size the DINOv3 ViT: set "
                             f"backbone='dinov3_vit'")
        if self.backbone == "dinov3_vit" and (self.num_feature_levels != 3 or self.lite_encoder):
            raise ValueError("backbone='dinov3_vit' gives three levels to the hybrid encoder: set "
                             "num_feature_levels=3 and lite_encoder=False")
        if self.backbone == "dinov3_vit" and (self.vit.width // self.vit.heads % 4 or len(self.vit.out_layers) != 3):
            raise ValueError(f"the DINOv3 ViT needs heads of a width divisible by 4 (its rotary positions) and three "
                             f"out_layers, got width {self.vit.width}, {self.vit.heads} heads and {self.vit.out_layers}")
        if self.decoder.mlp_activation != "relu":
            raise ValueError(f"decoder.mlp_activation={self.decoder.mlp_activation!r} is D-FINE's (DEIM's) option: "
                             f"DEIMv2's query positions take decoder.activation, its heads ReLU")


#: Where the old one-record config's DEIMv2 options moved (:mod:`detr.models.legacy`).
FLAT_NAMES = {"vit_dim": "vit.width", "vit_depth": "vit.depth", "vit_heads": "vit.heads", "vit_mlp_dim": "vit.mlp_dim",
              "vit_register_tokens": "vit.register_tokens", "vit_out_layers": "vit.out_layers",
              "vit_gated_mlp": "vit.gated_mlp"}
