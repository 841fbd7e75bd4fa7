"""A family's training recipe as plain records: the loss (:class:`LossRecipe`) and the optimizer with its
learning-rate schedule (:class:`OptimizerRecipe`), together a :class:`Recipe`.

Each family states its authors' recipe in its own folder (``detr/models/<family>/recipe.py``: ``RECIPE``), and
:func:`detr.models.build.recipe_for` finds a model config's. The loss builder
(:func:`detr.loss.build.build_criterion`) reads the loss recipe's parts (the class loss, the proposals, the
denoising, the distribution terms) instead of the family's name; the training system (:class:`detr.lightning.system.DetrSystem`) takes both records
(``model.loss.*`` and ``model.optimizer.*`` in a YAML config).

A field left None takes the family's value (:meth:`LossRecipe.over`): ``LossRecipe(cost_class=8.0)`` is the
family's loss with a class cost of 8. A family's own records set every field. Plain data: no torch, no
Lightning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

#: The class loss of a sigmoid class head (a softmax head always trains with cross-entropy): "focal" (Deformable
#: DETR's sigmoid focal loss), "varifocal" (RT-DETR's IoU-weighted varifocal loss, which ``matchability`` turns
#: into DEIM's MAL) or "ia_bce" (RF-DETR's and LW-DETR's IoU-aware BCE).
ClassLoss = Literal["focal", "varifocal", "ia_bce"]
#: Which encoder proposals are scored as one more decoder layer: "two_stage" (a two-stage model's, class-agnostic:
#: Deformable DETR) or "selected" (every model of the family selects its queries from them; scored with their
#: classes: RT-DETR, D-FINE, DEIMv2, RF-DETR).
Proposals = Literal["two_stage", "selected"]

_Record = TypeVar("_Record", "LossRecipe", "OptimizerRecipe")


def _over(recipe: _Record, base: _Record) -> _Record:
    changes = {field.name: getattr(recipe, field.name) for field in dataclasses.fields(recipe)
               if getattr(recipe, field.name) is not None}
    return dataclasses.replace(base, **changes)


def _unset(recipe: LossRecipe | OptimizerRecipe) -> list[str]:
    return [f.name for f in dataclasses.fields(recipe) if getattr(recipe, f.name) is None]


@dataclass(frozen=True)
class LossRecipe:
    """The matcher's costs, the loss's weights and which loss terms a family trains with
    (:func:`detr.loss.build.build_criterion`). None: the family's value.

    Args:
        cost_class: weight of the class term in the Hungarian matching cost (DETR: 1).
        cost_bbox: weight of the L1 box term in the matching cost (DETR: 5).
        cost_giou: weight of the GIoU term in the matching cost (DETR: 2).
        loss_ce: weight of the class loss, in every auxiliary layer and the parts' terms too (DETR: 1).
        loss_bbox: weight of the L1 box loss, likewise (DETR: 5).
        loss_giou: weight of the GIoU box loss, likewise (DETR: 2).
        eos_coef: cross-entropy weight of the no-object class (softmax head only; DETR: 0.1).
        focal_alpha: α of the focal loss and the focal matching cost (sigmoid head; 0.25).
        focal_gamma: γ of the focal loss and the focal matching cost (sigmoid head; 2).
        class_loss: a sigmoid head's class loss (:data:`ClassLoss`).
        varifocal_alpha: α of the varifocal loss (RT-DETR: 0.75).
        matchability: DEIM's matchability-aware class loss (MAL, γ 1.5) in place of the varifocal loss
            (DEIMv2 trains with it).
        proposals: which encoder proposals are scored (:data:`Proposals`).
        contrastive_denoising: denoising queries scored with every class term (RT-DETR's contrastive groups),
            not DN-DETR's; read only for a model with denoising queries.
        distribution_terms: D-FINE's losses of its edge distributions (FGL and DDF; D-FINE, DEIMv2).
        loss_fgl: weight of the fine-grained localisation loss, every layer's (authors: 0.15).
        loss_ddf: weight of the decoupled distillation focal loss, every earlier layer's (authors: 1.5).
        matching_union: GO-LSD's union of every layer's matches for the localisation terms (D-FINE, DEIMv2).
        loss_mask_ce: a model with instance masks (RF-DETR's segmentation head): the weight of its point-sampled
            mask BCE, also its matching cost (authors: 5).
        loss_mask_dice: the weight of its point-sampled mask DICE, also its matching cost (authors: 5).
        mask_point_ratio: the matcher's points per mask are h · w / mask_point_ratio (authors: 16).
        loss_mask: the panoptic mask stage's focal mask loss weight (authors: 1).
        loss_dice: the panoptic mask stage's DICE loss weight (authors: 1).
        loss_keypoint_l1: a keypoint model's (GroupPose, :mod:`detr.loss.keypoints`) keypoint L1 weight, also its
            matching cost (the rfdetr package's keypoint recipe: 1).
        loss_keypoint_findable: a keypoint model's weight of the findable BCE, also its matching cost (1).
        loss_keypoint_visible: a keypoint model's weight of the visible BCE, also its matching cost (1).
        loss_keypoint_nll: a keypoint model's weight of the keypoints' Gaussian NLL, also its matching cost (1).
    """

    cost_class: float | None = None
    cost_bbox: float | None = None
    cost_giou: float | None = None
    loss_ce: float | None = None
    loss_bbox: float | None = None
    loss_giou: float | None = None
    eos_coef: float | None = None
    focal_alpha: float | None = None
    focal_gamma: float | None = None
    class_loss: ClassLoss | None = None
    varifocal_alpha: float | None = None
    matchability: bool | None = None
    proposals: Proposals | None = None
    contrastive_denoising: bool | None = None
    distribution_terms: bool | None = None
    loss_fgl: float | None = None
    loss_ddf: float | None = None
    matching_union: bool | None = None
    loss_mask_ce: float | None = None
    loss_mask_dice: float | None = None
    mask_point_ratio: int | None = None
    loss_mask: float | None = None
    loss_dice: float | None = None
    loss_keypoint_l1: float | None = None
    loss_keypoint_findable: float | None = None
    loss_keypoint_visible: float | None = None
    loss_keypoint_nll: float | None = None

    def over(self, base: LossRecipe) -> LossRecipe:
        """This recipe's fields that are set (not None), ``base``'s for the others."""
        return _over(self, base)

    def unset(self) -> list[str]:
        """The fields left None (a family's own recipe has none)."""
        return _unset(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OptimizerRecipe:
    """AdamW's rates and decays, and the learning-rate schedule (:mod:`detr.lightning.schedule`). None: the
    family's value.

    Args:
        lr: the learning rate outside the backbone (DETR: 1e-4; Deformable DETR's sampling offsets and reference
            points train at a tenth of it).
        lr_backbone: the learning rate of the backbone's trainable stages (DETR: 1e-5).
        lr_layer_decay: layer-wise decay of the backbone's rate (RF-DETR's ViT: 0.8): a parameter at depth k below
            the backbone's output trains at lr_backbone × lr_layer_decay^k (1: none).
        lr_component_decay: RF-DETR's component decay (0.7): its decoder layers train at lr × this, its backbone
            at lr_backbone × this² (1: none).
        weight_decay: AdamW's weight decay (DETR: 1e-4).
        lr_drop_epochs: multiply every learning rate by ``lr_drop_gamma`` at these epochs (DETR: [200] of 300;
            []: no drop).
        lr_drop_gamma: the factor of each drop (0.1).
        warmup_steps: linear warm-up from 1/1000 over this many optimizer steps (0: none).
        warmup_fraction: > 0: the warm-up lasts this share of the run's optimizer steps instead (the trainer's
            ``max_steps``, or ``max_epochs`` × batches), so that a short fine-tune is never all warm-up; in
            place of ``warmup_steps``.
        lr_decay_fraction: > 0: every learning rate falls linearly to zero over this last share of the run's
            optimizer steps (0: none).
        lr_flat_cosine_epochs: DEIM's FlatCosine: [flat, end]: every rate stays flat to epoch ``flat`` and
            falls on a half cosine to ``lr_flat_cosine_gamma`` × itself at epoch ``end`` (DEIM-D-FINE S:
            [64, 120]); []: off.
        lr_flat_cosine_gamma: the FlatCosine's final factor (the authors' lr_gamma, 0.5).
    """

    lr: float | None = None
    lr_backbone: float | None = None
    lr_layer_decay: float | None = None
    lr_component_decay: float | None = None
    weight_decay: float | None = None
    lr_drop_epochs: list[int] | None = None
    lr_drop_gamma: float | None = None
    warmup_steps: int | None = None
    warmup_fraction: float | None = None
    lr_decay_fraction: float | None = None
    lr_flat_cosine_epochs: list[int] | None = None
    lr_flat_cosine_gamma: float | None = None

    def over(self, base: OptimizerRecipe) -> OptimizerRecipe:
        """This recipe's fields that are set (not None), ``base``'s for the others."""
        return _over(self, base)

    def unset(self) -> list[str]:
        """The fields left None (a family's own recipe has none)."""
        return _unset(self)

    def to_dict(self) -> dict[str, Any]:
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class Recipe:
    """A family's training recipe: its loss and its optimizer."""

    loss: LossRecipe
    optimizer: OptimizerRecipe


#: The paper's DETR recipe (Carion et al. 2020, §4 and appendix A.4; the authors' main.py), on which the other
#: families' recipes build with ``dataclasses.replace``.
DETR_LOSS = LossRecipe(
    cost_class=1.0, cost_bbox=5.0, cost_giou=2.0, loss_ce=1.0, loss_bbox=5.0, loss_giou=2.0, eos_coef=0.1,
    focal_alpha=0.25, focal_gamma=2.0, class_loss="focal", varifocal_alpha=0.75, matchability=False,
    proposals="two_stage", contrastive_denoising=False, distribution_terms=False, loss_fgl=0.15, loss_ddf=1.5,
    matching_union=False, loss_mask_ce=5.0, loss_mask_dice=5.0, mask_point_ratio=16, loss_mask=1.0, loss_dice=1.0,
    loss_keypoint_l1=1.0, loss_keypoint_findable=1.0, loss_keypoint_visible=1.0, loss_keypoint_nll=1.0)
DETR_OPTIMIZER = OptimizerRecipe(
    lr=1e-4, lr_backbone=1e-5, lr_layer_decay=1.0, lr_component_decay=1.0, weight_decay=1e-4, lr_drop_epochs=[200],
    lr_drop_gamma=0.1, warmup_steps=0, warmup_fraction=0.0, lr_decay_fraction=0.0, lr_flat_cosine_epochs=[],
    lr_flat_cosine_gamma=0.5)
#: The paper's DETR, also with the anchor query options (the DETR family; the demo configs change its weights).
DETR_RECIPE = Recipe(DETR_LOSS, DETR_OPTIMIZER)


__all__ = ["ClassLoss", "DETR_LOSS", "DETR_OPTIMIZER", "DETR_RECIPE", "LossRecipe", "OptimizerRecipe", "Proposals",
           "Recipe"]
