"""DEIMv2's training recipe (Huang et al. 2025; transformers' ``Deimv2ForObjectDetectionLoss``, the authors'
``DEIMCriterion``): D-FINE's loss with DEIM's matchability-aware class loss (MAL) in place of the varifocal loss, and
DEIM's schedule (the authors' deim_hgnetv2_s_coco.yml, as configs/deim_dfine_s_coco.yaml): AdamW 4e-4 (backbone
2e-4), a 2,000-step warm-up, FlatCosine flat to epoch 64 then down to half by epoch 120.
"""

from __future__ import annotations

import dataclasses

from detr.models.dfine.recipe import LOSS as DFINE_LOSS
from detr.models.recipe import DETR_OPTIMIZER, Recipe

RECIPE = Recipe(
    loss=dataclasses.replace(DFINE_LOSS, matchability=True),
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=4e-4, lr_backbone=2e-4, lr_drop_epochs=[], warmup_steps=2000,
                                  lr_flat_cosine_epochs=[64, 120], lr_flat_cosine_gamma=0.5),
)
