"""DEIMv2's released sizes that this project builds: the one table the family's presets
(:mod:`detr.models.deimv2.family`) read.

From the authors' configs (Intellindust-AI-Lab/DEIMv2 ``configs/deimv2/*.yml`` over ``configs/base/deimv2.yml``):
SiLU query positions (``mlp_act``), 300 queries, 8 heads, points (3, 6, 3) on three levels, a 640-px square.

- N (``deimv2_hgnetv2_n_coco.yml``): HGNetV2-B0's last two stages, a 128-wide hybrid encoder and decoder (FFN 512),
  CSP expansion 0.34 and depth 0.5, 6 points per level, 3 decoder layers.
- L (``deimv2_dinov3_l_coco.yml``): DINOv3 ViT-S/16 (4 register tokens, plain MLP; the authors' blocks 5, 8, 11
  counted from 0 are the outputs after 6, 9 and 12 layers), an adapter of 32 channels, a 224-wide encoder (FFN 896)
  and decoder (FFN 1792, 4 layers).
- X (``deimv2_dinov3_x_coco.yml``): DINOv3 ViT-S/16+ (its SwiGLU MLP 1536 wide), an adapter of 64 channels, a
  256-wide encoder (FFN 1024, CSP expansion 1.25 and depth 1.37) and decoder (FFN 2048, 6 layers).

The DINOv3 models' fusion blocks have no trailing 3×3 (transformers' ``encoder_has_trailing_conv=False``), and
``backbone_learnable_affine`` (HGNetV2's) is False there, as the reader writes it. Not here:
Atto, Femto and Pico (cut-down HGNetV2 layouts this project's HGNetV2 does not have, and a shared box head), S and M
(a distilled ViT-Tiny with key biases and without layer scales, which this project's DINOv3 ViT does not build).
"""

from __future__ import annotations

from detr.models.deimv2.config import DEIMv2Config, DINOv3Size
from detr.models.dfine.config import DistributionDecoder

#: The authors' square, in pixels, of every size here.
RESOLUTION = 640


def deimv2_n() -> DEIMv2Config:
    """N: HGNetV2-B0, 2 levels, 128 wide (the authors' 3.6 M parameters)."""
    return DEIMv2Config(hidden_dim=128, dim_feedforward=512, num_feature_levels=2, csp_expansion=0.34,
                        csp_depth_multiplier=0.5, num_points=6,
                        decoder=DistributionDecoder(num_points_per_level=None, activation="silu"))


def deimv2_l() -> DEIMv2Config:
    """L: DINOv3 ViT-S/16, 224 wide, 4 decoder layers (the authors' 32.2 M parameters, RepVGG blocks folded)."""
    return DEIMv2Config(backbone="dinov3_vit", backbone_learnable_affine=False,
                        vit=DINOv3Size(out_layers=(6, 9, 12)), adapter_channels=32, hidden_dim=224,
                        encoder_dim_feedforward=896, dim_feedforward=1792, num_decoder_layers=4, csp_expansion=1.0,
                        csp_depth_multiplier=1.0, csp_trailing_conv=False,
                        decoder=DistributionDecoder(num_points_per_level=(3, 6, 3), activation="silu"))


def deimv2_x() -> DEIMv2Config:
    """X: DINOv3 ViT-S/16+, 256 wide, 6 decoder layers (the authors' 50.3 M parameters, RepVGG blocks folded)."""
    return DEIMv2Config(backbone="dinov3_vit", backbone_learnable_affine=False,
                        vit=DINOv3Size(out_layers=(6, 9, 12), gated_mlp=True), adapter_channels=64,
                        encoder_dim_feedforward=1024, dim_feedforward=2048, num_decoder_layers=6,
                        csp_expansion=1.25, csp_depth_multiplier=1.37, csp_trailing_conv=False,
                        decoder=DistributionDecoder(num_points_per_level=(3, 6, 3), activation="silu"))


#: Preset name → its config.
PRESETS = {"deimv2_n": deimv2_n, "deimv2_l": deimv2_l, "deimv2_x": deimv2_x}
