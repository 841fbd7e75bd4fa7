"""D-FINE's training recipe (DEIMv2's, built on it: detr/models/deimv2/recipe.py).

D-FINE (Peng et al. 2025; the authors' dfine_hgnetv2_s_coco.yml): RT-DETR's loss plus the losses of its edge
distributions (FGL 0.15, DDF 1.5) with GO-LSD's union of every layer's matches for the localisation terms;
AdamW 2e-4 (backbone 1e-4; the S model's), weight decay 1e-4, a 500-step warm-up, no drop.
"""

from __future__ import annotations

import dataclasses

from detr.models.recipe import DETR_OPTIMIZER, Recipe
from detr.models.rtdetr.recipe import LOSS as RTDETR_LOSS

LOSS = dataclasses.replace(RTDETR_LOSS, distribution_terms=True, loss_fgl=0.15, loss_ddf=1.5, matching_union=True)
RECIPE = Recipe(
    loss=LOSS,
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=2e-4, lr_backbone=1e-4, lr_drop_epochs=[], warmup_steps=500),
)
