"""RT-DETR's training recipe (Zhao et al. 2024; the authors' rtdetr_pytorch configs, transformers'
``RTDetrConfig``): the varifocal class loss (α 0.75, γ 2) at weight 1 with a focal matching cost of 2, L1 5,
GIoU 2; the selected encoder proposals and the contrastive denoising groups scored with the same terms; AdamW
1e-4 (backbone 1e-5), weight decay 1e-4, a 2,000-step warm-up and no drop within the 72 epochs."""

from __future__ import annotations

import dataclasses

from detr.models.recipe import DETR_LOSS, DETR_OPTIMIZER, Recipe

LOSS = dataclasses.replace(DETR_LOSS, cost_class=2.0, loss_ce=1.0, class_loss="varifocal", proposals="selected",
                           contrastive_denoising=True)
RECIPE = Recipe(
    loss=LOSS,
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=1e-4, lr_backbone=1e-5, lr_drop_epochs=[], warmup_steps=2000),
)
