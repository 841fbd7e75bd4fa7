"""Grounding DINO's training recipe (transformers' ``GroundingDinoForObjectDetectionLoss``, after the authors'
DINO criterion): the sigmoid focal loss over the prompt's tokens (α 0.25, γ 2; a target's positive tokens are its
phrase's, :mod:`detr.loss.grounding`) at weight 2, L1 5, GIoU 2; matching costs class 1, L1 5, GIoU 2; every decoder
layer's and the selected encoder proposals' terms, the proposals matched with their phrases; AdamW 1e-4, the image
backbone at 1e-5 (DINO's rates), weight decay 1e-4, no drop within a fine-tuning run.
"""

from __future__ import annotations

import dataclasses

from detr.models.recipe import DETR_LOSS, DETR_OPTIMIZER, Recipe

RECIPE = Recipe(
    loss=dataclasses.replace(DETR_LOSS, cost_class=1.0, loss_ce=2.0, class_loss="focal", proposals="selected"),
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=1e-4, lr_backbone=1e-5, weight_decay=1e-4, lr_drop_epochs=[]),
)
