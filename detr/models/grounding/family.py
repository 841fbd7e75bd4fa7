"""Grounding DINO (and MM-Grounding-DINO) as a family: its config, builder and presets. It detects what a text
prompt names and is read from transformers' directories (:mod:`detr.checkpoints.grounding`). Its record has no
recipe for the detection training system, so ``detr fit`` refuses it; it predicts, labels and serves, and
:func:`detr.lightning.grounding_system.fine_tune_grounding` fine-tunes it (its loss recipe: :mod:`.recipe`)."""

from __future__ import annotations

from detr.models.family import Family, register_family
from detr.models.grounding.build import build_grounding
from detr.models.grounding.config import GroundingConfig

#: transformers' ``SwinConfig`` of Swin-T putting out stage2–stage4 (IDEA-Research/grounding-dino-tiny's backbone).
SWIN_T = {"model_type": "swin", "embed_dim": 96, "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24],
          "window_size": 7, "out_features": ["stage2", "stage3", "stage4"]}


def grounding_dino_tiny() -> GroundingConfig:
    """Grounding DINO-T: Swin-T, bert-base-uncased, 900 queries, 4 levels, 6 + 6 layers, prompts of at most 256
    tokens (IDEA-Research/grounding-dino-tiny)."""
    return GroundingConfig(backbone="swin", backbone_config=SWIN_T)


def mm_grounding_dino_tiny() -> GroundingConfig:
    """MM-Grounding-DINO-T: Grounding DINO-T with the scaled contrastive head (a learned bias; transformers'
    ``MMGroundingDinoConfig`` defaults)."""
    return GroundingConfig(backbone="swin", backbone_config=SWIN_T, contrastive_head="scaled_bias")


FAMILY = register_family(Family(
    name="grounding", title="Grounding DINO", config_class=GroundingConfig, builder=build_grounding,
    presets={"grounding_dino_tiny": grounding_dino_tiny, "mm_grounding_dino_tiny": mm_grounding_dino_tiny},
    parent="deformable",
))
