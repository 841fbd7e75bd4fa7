"""D-FINE's and DEIMv2's training recipes.

D-FINE (Peng et al. 2025; the authors' dfine_hgnetv2_s_coco.yml): RT-DETR's loss plus the losses of its edge
distributions (FGL 0.15, DDF 1.5) with GO-LSD's union of every layer's matches for the localisation terms;
AdamW 2e-4 (backbone 1e-4; the S model's), weight decay 1e-4, a 500-step warm-up, no drop.

DEIMv2 (Huang et al. 2025; transformers' ``Deimv2ForObjectDetectionLoss``, the authors' ``DEIMCriterion``): D-FINE's
loss with DEIM's matchability-aware class loss (MAL) in place of the varifocal loss, and DEIM's schedule (the
authors' deim_hgnetv2_s_coco.yml, as configs/deim_dfine_s_coco.yaml): AdamW 4e-4 (backbone 2e-4), a 2,000-step
warm-up, FlatCosine flat to epoch 64 then down to half by epoch 120.
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
DEIMV2_RECIPE = Recipe(
    loss=dataclasses.replace(LOSS, matchability=True),
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=4e-4, lr_backbone=2e-4, lr_drop_epochs=[], warmup_steps=2000,
                                  lr_flat_cosine_epochs=[64, 120], lr_flat_cosine_gamma=0.5),
)
