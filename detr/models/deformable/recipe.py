"""Deformable DETR's training recipe (Zhu et al. 2021, §4.1; the authors' main.py and configs/r50_deformable_detr.sh):
the focal class loss at weight 2 (matching cost 2), a two-stage model's proposals scored class-agnostic, AdamW at
2e-4 (backbone 2e-5; the sampling offsets and reference points at a tenth), the rates dropped × 0.1 at epoch 40
of 50."""

from __future__ import annotations

import dataclasses

from detr.models.recipe import DETR_LOSS, DETR_OPTIMIZER, Recipe

RECIPE = Recipe(
    loss=dataclasses.replace(DETR_LOSS, cost_class=2.0, loss_ce=2.0, class_loss="focal", proposals="two_stage"),
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=2e-4, lr_backbone=2e-5, lr_drop_epochs=[40]),
)
