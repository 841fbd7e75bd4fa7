"""D-FINE as a family: its config, builder and presets (configs/dfine_*_coco.yaml, configs/deim_dfine_s_coco.yaml)."""

from __future__ import annotations

from detr.models.dfine.build import build_dfine
from detr.models.dfine.config import FLAT_NAMES, DFINEConfig, DistributionDecoder
from detr.models.family import Family, register_family
from detr.models.dfine.recipe import RECIPE


def dfine_n() -> DFINEConfig:
    """N: HGNetV2-B0, 128 wide, 2 levels of 6 points (configs/dfine_n_coco.yaml)."""
    return DFINEConfig(hidden_dim=128, dim_feedforward=512, num_feature_levels=2, csp_expansion=0.34,
                       csp_depth_multiplier=0.5, decoder=DistributionDecoder(num_points_per_level=(6, 6)))


def dfine_s() -> DFINEConfig:
    """S: HGNetV2-B0 (configs/dfine_s_coco.yaml; the config's defaults)."""
    return DFINEConfig()


def dfine_m() -> DFINEConfig:
    """M: HGNetV2-B2, 4 decoder layers (configs/dfine_m_coco.yaml)."""
    return DFINEConfig(backbone="hgnetv2_b2", num_decoder_layers=4, csp_expansion=1.0, csp_depth_multiplier=0.67)


def dfine_l() -> DFINEConfig:
    """L: HGNetV2-B4 with frozen norms, 6 decoder layers (configs/dfine_l_coco.yaml)."""
    return DFINEConfig(backbone="hgnetv2_b4", backbone_norm="frozen_batch_norm", backbone_learnable_affine=False,
                       num_decoder_layers=6, csp_expansion=1.0, csp_depth_multiplier=1.0)


def dfine_x() -> DFINEConfig:
    """X: HGNetV2-B5, a 384-wide encoder, reg_scale 8 (configs/dfine_x_coco.yaml)."""
    return DFINEConfig(backbone="hgnetv2_b5", backbone_norm="frozen_batch_norm", backbone_learnable_affine=False,
                       encoder_hidden_dim=384, encoder_dim_feedforward=2048, num_decoder_layers=6, csp_expansion=1.0,
                       csp_depth_multiplier=1.0,
                       decoder=DistributionDecoder(num_points_per_level=(3, 6, 3), reg_scale=8.0))


def deim_dfine_s() -> DFINEConfig:
    """DEIM's D-FINE S: SiLU in the decoder (configs/deim_dfine_s_coco.yaml)."""
    return DFINEConfig(decoder=DistributionDecoder(num_points_per_level=(3, 6, 3), activation="silu",
                                                   mlp_activation="silu"))


FAMILY = register_family(Family(
    name="dfine", title="D-FINE", config_class=DFINEConfig, builder=build_dfine, parent="rtdetr",
    presets={"dfine_n": dfine_n, "dfine_s": dfine_s, "dfine_m": dfine_m, "dfine_l": dfine_l, "dfine_x": dfine_x,
             "deim_dfine_s": deim_dfine_s},
    augmentation="rtdetr", real_time=True, flat_names=FLAT_NAMES, recipe=RECIPE,
))
