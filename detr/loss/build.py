"""One loss builder: the criterion that fits a model's config, with every optional term as a part.

:func:`build_criterion` is what the training systems call (the box stage and the panoptic mask stage): the
matcher and the set loss in the model's class head, and the parts its config asks for, in the order their
terms are weighted: two-stage proposals (Deformable DETR; the selected proposals of RT-DETR, D-FINE and RF-DETR),
denoising queries and the dense head (the anchor recipe), masks (a panoptic model's, or the point-sampled terms of a
model with instance masks).
"""

from __future__ import annotations

from detr.loss.criterion import SetCriterion
from detr.loss.distribution import DistributionLoss
from detr.loss.masks import MaskLoss, PointMaskLoss
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import DenoisingLoss, DenseLoss, LossPart, ProposalLoss
from detr.models.config import ModelConfig
from detr.models.deimv2.config import DEIMv2Config
from detr.models.dfine.config import DFINEConfig
from detr.models.family import family_of
from detr.models.rfdetr.config import RFDETRConfig


def build_criterion(config: ModelConfig, *, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0,
                    loss_ce: float = 1.0, loss_bbox: float = 5.0, loss_giou: float = 2.0, eos_coef: float = 0.1,
                    focal_alpha: float = 0.25, focal_gamma: float = 2.0, masks: bool = False,
                    loss_mask: float = 1.0, loss_dice: float = 1.0, training_only_parts: bool = True,
                    varifocal_alpha: float = 0.75, loss_fgl: float = 0.15, loss_ddf: float = 1.5,
                    matchability: bool | None = None, matching_union: bool | None = None, loss_mask_ce: float = 5.0,
                    loss_mask_dice: float = 5.0, mask_point_ratio: int = 16) -> SetCriterion:
    """The criterion for a model built from ``config``.

    The sigmoid head is trained with the focal loss and matched with the focal cost (Deformable DETR); the
    auxiliary losses cover every decoder layer when ``config.aux_loss``; Group DETR's query groups are matched
    group by group. Args: the matching costs, the loss weights, the no-object weight ``eos_coef`` (softmax
    head) and the focal parameters (sigmoid head), all the paper's by default; ``masks``: a panoptic model's
    mask terms (``loss_mask``, ``loss_dice``); ``training_only_parts=False`` leaves out the parts that read
    training-only outputs (denoising, dense head), for a detector that stays in eval mode (a frozen one under
    the mask head).

    RT-DETR (a real-time family: ``Family.real_time``) is trained as its authors do: the varifocal class loss
    (α ``varifocal_alpha``, γ ``focal_gamma``; the matcher keeps the focal cost with ``focal_alpha``), its
    selected encoder proposals scored as one more decoder layer (matched with their classes, loss_*_enc) and
    its contrastive denoising groups scored with the same terms (loss_*_dn). The recipe's costs and weights
    (class cost 2, VFL 1, L1 5, GIoU 2) are the caller's (configs/rtdetr_*.yaml).

    D-FINE (``"dfine"``) is trained as RT-DETR, plus the losses of its edge distributions
    (:class:`~detr.loss.distribution.DistributionLoss`: FGL weighted ``loss_fgl``, DDF ``loss_ddf``, the first
    layer's plain head), with GO-LSD's union of every layer's matches for the localisation terms
    (``matching_union``; None: on for D-FINE and DEIMv2, as their authors train them, off otherwise).
    ``matchability``: DEIM's matchability-aware class loss (MAL) in place of the varifocal loss (an RT-DETR, D-FINE
    or DEIMv2 model; None: the family's, which is MAL for DEIMv2 only).

    DEIMv2 (``"deimv2"``) is trained as D-FINE with MAL (its authors' ``DEIMCriterion`` with losses mal, boxes and
    local; transformers' ``Deimv2ForObjectDetectionLoss``): the same parts and the same union of matches (the
    authors' "dense one-to-one" indices; transformers leaves the first layer's plain head out of it, the authors
    put it in, as here).

    RF-DETR and LW-DETR (``"rfdetr"``) are trained as their authors do (rf-detr's ``SetCriterion`` with
    ``ia_bce_loss``; transformers' ``LwDetrForObjectDetectionLoss``): the IoU-aware BCE class loss (α ``focal_alpha``,
    γ ``focal_gamma``), every decoder layer's terms, and the selected encoder proposals of every query group
    matched with their classes and scored with the same terms (loss_*_enc); Group DETR's groups (the model's
    ``query_groups``) matched group by group, each term divided by groups × num_boxes. The recipe's costs and
    weights (class cost 2, class 1, L1 5, GIoU 2) are the caller's (configs/rfdetr_*.yaml).

    A model with instance masks (``config.instance_masks``: RF-DETR's segmentation head) is trained as the authors
    train it (rf-detr's ``loss_masks`` and matcher; transformers' ``RfDetrForSegmentationLoss``):
    :class:`~detr.loss.masks.PointMaskLoss` (point-sampled BCE weighted ``loss_mask_ce``, DICE ``loss_mask_dice``, on
    every decoder layer and the encoder proposals; h · w / ``mask_point_ratio`` points) and the same two as matching
    costs, at the same weights (5 and 5: the authors' ``SegmentationTrainConfig``, which also sets the class weight
    to 5: the caller's).
    """
    # until the families' recipes say which parts they train with: the family's record and config class
    rtdetr = family_of(config).real_time
    distributions = isinstance(config, DFINEConfig)
    rfdetr = isinstance(config, RFDETRConfig)
    two_stage, instance_masks = getattr(config, "two_stage", False), getattr(config, "instance_masks", False)
    denoising, dense_aux_head = getattr(config, "denoising", False), getattr(config, "dense_aux_head", False)
    query_groups = getattr(config, "query_groups", 1)
    if matchability is None:
        matchability = isinstance(config, DEIMv2Config)
    if matchability and not rtdetr:
        raise ValueError("matchability=True (DEIM's class loss) replaces the varifocal loss of RT-DETR, D-FINE and "
                         f"DEIMv2: family {config.family!r} has none; set matchability false")
    weights = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
    focal = {"focal_alpha": focal_alpha, "focal_gamma": focal_gamma}
    layers = config.num_decoder_layers if config.aux_loss else 1
    parts: list[LossPart] = []
    if two_stage or rtdetr or rfdetr:
        parts.append(ProposalLoss(**weights, class_agnostic=not (rtdetr or rfdetr)))
    if denoising and training_only_parts:
        parts.append(DenoisingLoss(layers, class_head=config.class_head, **focal, **weights, contrastive=rtdetr))
    if distributions and training_only_parts:
        parts.append(DistributionLoss(layers, loss_fgl=loss_fgl, loss_ddf=loss_ddf, **weights))
    if dense_aux_head and training_only_parts:
        parts.append(DenseLoss(**focal, **weights))
    if masks:
        parts.append(MaskLoss(loss_mask=loss_mask, loss_dice=loss_dice))
    mask_costs = {}
    if instance_masks:
        parts.append(PointMaskLoss(layers, loss_mask_ce=loss_mask_ce, loss_mask_dice=loss_mask_dice,
                                   point_ratio=mask_point_ratio, proposals=two_stage or rtdetr or rfdetr))
        mask_costs = {"cost_mask_ce": loss_mask_ce, "cost_mask_dice": loss_mask_dice,
                      "mask_point_ratio": mask_point_ratio}
    matcher = HungarianMatcher(cost_class=cost_class, cost_bbox=cost_bbox, cost_giou=cost_giou,
                               class_head=config.class_head, **focal, **mask_costs,
                               group_size=config.num_queries if query_groups > 1 else None)
    loss_focal = {**focal, "focal_alpha": varifocal_alpha} if rtdetr else focal
    return SetCriterion(config.num_classes, matcher, eos_coef=eos_coef, **weights, num_decoder_layers=layers,
                        class_head=config.class_head, **loss_focal, varifocal=rtdetr and not matchability,
                        matchability=matchability, ia_bce=rfdetr, parts=parts,
                        matching_union=distributions if matching_union is None else matching_union)
