"""RF-DETR's and LW-DETR's training recipe (the authors' rfdetr ``TrainConfig`` and ``SetCriterion``; transformers'
``LwDetrForObjectDetectionLoss``): the IoU-aware BCE class loss (α 0.25, γ 2) at weight 1 with a class matching
cost of 2, L1 5, GIoU 2; the selected encoder proposals of every query group scored with the same terms; AdamW
1e-4, the ViT at 1.5e-4 (``lr_encoder``) with layer-wise decay 0.8 and component decay 0.7, weight decay 1e-4,
no warm-up, no drop within the run.

With instance masks (``SEGMENTATION_RECIPE``: the authors' ``SegmentationTrainConfig``): the class weight 5 and the
point-sampled mask BCE and DICE at 5 each, also as matching costs, on h · w / 16 points.

With keypoints (``KEYPOINT_RECIPE``: the package's ``KeypointTrainConfig``): the class weight 2 and the four
keypoint terms (L1, findable, visible, NLL) at 1 each, also as matching costs.
"""

from __future__ import annotations

import dataclasses

from detr.models.recipe import DETR_LOSS, DETR_OPTIMIZER, Recipe

RECIPE = Recipe(
    loss=dataclasses.replace(DETR_LOSS, cost_class=2.0, loss_ce=1.0, class_loss="ia_bce", proposals="selected"),
    optimizer=dataclasses.replace(DETR_OPTIMIZER, lr=1e-4, lr_backbone=1.5e-4, lr_layer_decay=0.8,
                                  lr_component_decay=0.7, lr_drop_epochs=[], warmup_steps=0),
)
SEGMENTATION_RECIPE = dataclasses.replace(RECIPE, loss=dataclasses.replace(
    RECIPE.loss, loss_ce=5.0, loss_mask_ce=5.0, loss_mask_dice=5.0, mask_point_ratio=16))
KEYPOINT_RECIPE = dataclasses.replace(RECIPE, loss=dataclasses.replace(
    RECIPE.loss, loss_ce=2.0, loss_keypoint_l1=1.0, loss_keypoint_findable=1.0, loss_keypoint_visible=1.0,
    loss_keypoint_nll=1.0))
