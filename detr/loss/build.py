"""One loss builder: the criterion that fits a model's config and its family's loss recipe, with every optional
term as a part.

:func:`build_criterion` is what the training systems call (the box stage and the panoptic mask stage): the
matcher and the set loss in the model's class head, and the parts its config asks for, in the order their
terms are weighted: two-stage proposals (Deformable DETR; the selected proposals of RT-DETR, D-FINE and RF-DETR),
denoising queries and the dense head (the anchor recipe), masks (a panoptic model's, or the point-sampled terms of a
model with instance masks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from detr.loss.criterion import SetCriterion
from detr.loss.distribution import DistributionLoss
from detr.loss.keypoints import KeypointLoss
from detr.loss.masks import MaskLoss, PointMaskLoss
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import DenoisingLoss, DenseLoss, LossPart, ProposalLoss
from detr.models.build import recipe_for
from detr.models.config import ModelConfig
from detr.models.recipe import LossRecipe


def build_criterion(config: ModelConfig, recipe: LossRecipe | None = None, *, masks: bool = False,
                    training_only_parts: bool = True, **changes: Any) -> SetCriterion:
    """The criterion for a model built from ``config``, trained with the loss ``recipe``.

    Args:
        config: the model's config (its class head, layers, queries and the options that add outputs: two-stage
            proposals, denoising queries, the dense head, instance masks).
        recipe: the costs, weights and loss terms (:class:`detr.models.recipe.LossRecipe`); None, or a field left
            None: the family's (:func:`detr.models.build.recipe_for`).
        masks: a panoptic model's mask terms (the recipe's ``loss_mask``, ``loss_dice``).
        training_only_parts: False leaves out the parts that read training-only outputs (denoising, dense head),
            for a detector that stays in eval mode (a frozen one under the mask head).
        changes: recipe fields to replace (``cost_class=2.0``, ``matchability=True`` ...).

    Raises ValueError for a change that is no recipe field, or matchability without a varifocal loss to replace.

    The sigmoid head is trained with the recipe's ``class_loss`` and matched with the focal cost (Deformable
    DETR), the softmax head with cross-entropy (``eos_coef`` for no-object); the auxiliary losses cover every
    decoder layer when ``config.aux_loss``; Group DETR's query groups are matched group by group.

    "varifocal" (RT-DETR, D-FINE): the varifocal class loss (α ``varifocal_alpha``, γ ``focal_gamma``; the
    matcher keeps the focal cost with ``focal_alpha``), or with ``matchability`` DEIM's MAL (DEIMv2: its authors'
    ``DEIMCriterion``; transformers' ``Deimv2ForObjectDetectionLoss``). "ia_bce" (RF-DETR, LW-DETR: rf-detr's
    ``SetCriterion`` with ``ia_bce_loss``; transformers' ``LwDetrForObjectDetectionLoss``): the IoU-aware BCE (α
    ``focal_alpha``, γ ``focal_gamma``).

    Parts, in the order their terms are weighted: encoder proposals (``proposals``: a two-stage model's,
    class-agnostic; or every model's selected ones, matched with their classes: loss_*_enc, every query group's),
    denoising queries (``contrastive_denoising``: RT-DETR's groups scored with every class term, loss_*_dn), the
    edge distributions' losses (``distribution_terms``: :class:`~detr.loss.distribution.DistributionLoss`, FGL
    weighted ``loss_fgl``, DDF ``loss_ddf``, the first layer's plain head; with ``matching_union``, GO-LSD's union
    of every layer's matches for the localisation terms), the dense head, a panoptic model's masks, and a model with
    instance masks (``config.instance_masks``: RF-DETR's segmentation head, as rf-detr's ``loss_masks`` and
    transformers' ``RfDetrForSegmentationLoss``): :class:`~detr.loss.masks.PointMaskLoss` (point-sampled BCE
    weighted ``loss_mask_ce``, DICE ``loss_mask_dice``, on every decoder layer and the encoder proposals; h · w /
    ``mask_point_ratio`` points) and the same two as matching costs, at the same weights. A keypoint model
    (``config.num_keypoints_per_class``: RF-DETR's GroupPose head): :class:`~detr.loss.keypoints.KeypointLoss`
    (``loss_keypoint_{l1,findable,visible,nll}`` on every decoder layer and the proposals) and the same four as
    matching costs, as the rfdetr package's keypoint recipe.
    """
    try:
        recipe = dataclasses.replace(recipe or LossRecipe(), **changes).over(recipe_for(config).loss)
    except TypeError as error:
        raise ValueError(f"build_criterion: {error}; the changes are fields of detr.models.recipe.LossRecipe") from None
    if recipe.matchability and recipe.class_loss != "varifocal":
        raise ValueError("matchability=True (DEIM's class loss) replaces the varifocal loss of RT-DETR, D-FINE and "
                         f"DEIMv2: family {config.family!r} has none; set matchability false")
    two_stage, instance_masks = getattr(config, "two_stage", False), getattr(config, "instance_masks", False)
    denoising, dense_aux_head = getattr(config, "denoising", False), getattr(config, "dense_aux_head", False)
    selected = recipe.proposals == "selected"
    weights = {"loss_ce": recipe.loss_ce, "loss_bbox": recipe.loss_bbox, "loss_giou": recipe.loss_giou}
    focal = {"focal_alpha": recipe.focal_alpha, "focal_gamma": recipe.focal_gamma}
    layers = config.num_decoder_layers if config.aux_loss else 1
    parts: list[LossPart] = []
    if two_stage or selected:
        parts.append(ProposalLoss(**weights, class_agnostic=not selected))
    if denoising and training_only_parts:
        parts.append(DenoisingLoss(layers, class_head=config.class_head, **focal, **weights,
                                   contrastive=recipe.contrastive_denoising))
    if recipe.distribution_terms and training_only_parts:
        parts.append(DistributionLoss(layers, loss_fgl=recipe.loss_fgl, loss_ddf=recipe.loss_ddf, **weights))
    if dense_aux_head and training_only_parts:
        parts.append(DenseLoss(**focal, **weights))
    if masks:
        parts.append(MaskLoss(loss_mask=recipe.loss_mask, loss_dice=recipe.loss_dice))
    mask_costs = {}
    if instance_masks:
        parts.append(PointMaskLoss(layers, loss_mask_ce=recipe.loss_mask_ce, loss_mask_dice=recipe.loss_mask_dice,
                                   point_ratio=recipe.mask_point_ratio, proposals=two_stage or selected))
        mask_costs = {"cost_mask_ce": recipe.loss_mask_ce, "cost_mask_dice": recipe.loss_mask_dice,
                      "mask_point_ratio": recipe.mask_point_ratio}
    keypoint_costs = {}
    num_keypoints_per_class = tuple(getattr(config, "num_keypoints_per_class", ()))
    if num_keypoints_per_class:
        keypoint_weights = (recipe.loss_keypoint_l1, recipe.loss_keypoint_findable, recipe.loss_keypoint_visible,
                            recipe.loss_keypoint_nll)
        parts.append(KeypointLoss(num_keypoints_per_class, layers, **dict(zip(
            ("loss_l1", "loss_findable", "loss_visible", "loss_nll"), keypoint_weights))))
        keypoint_costs = {"num_keypoints_per_class": num_keypoints_per_class, **dict(zip(
            ("cost_keypoint_l1", "cost_keypoint_findable", "cost_keypoint_visible", "cost_keypoint_nll"),
            keypoint_weights))}
    matcher = HungarianMatcher(cost_class=recipe.cost_class, cost_bbox=recipe.cost_bbox, cost_giou=recipe.cost_giou,
                               class_head=config.class_head, **focal, **mask_costs, **keypoint_costs,
                               group_size=config.num_queries if getattr(config, "query_groups", 1) > 1 else None)
    loss_focal = {**focal, "focal_alpha": recipe.varifocal_alpha} if recipe.class_loss == "varifocal" else focal
    return SetCriterion(config.num_classes, matcher, eos_coef=recipe.eos_coef, **weights, num_decoder_layers=layers,
                        class_head=config.class_head, **loss_focal,
                        varifocal=recipe.class_loss == "varifocal" and not recipe.matchability,
                        matchability=recipe.matchability, ia_bce=recipe.class_loss == "ia_bce", parts=parts,
                        matching_union=recipe.matching_union)
