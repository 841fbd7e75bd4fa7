"""DETR's set loss (Carion et al. 2020, section 3.1 and appendix A.2; the authors' SetCriterion in models/detr.py).

A pure function of predictions and targets: the caller passes ``num_boxes`` already reduced across
processes (the training system all-reduces it); nothing here talks to torch.distributed. Every optional
term (two-stage proposals, denoising queries, the dense head, masks) is a part it composes (:class:`LossPart`:
:mod:`detr.loss.parts`, :mod:`detr.loss.masks`); :func:`detr.loss.build.build_criterion` chooses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from detr.loss.focal import ia_bce_loss, matchability_loss, sigmoid_focal_loss, varifocal_loss
from detr.loss.matcher import HungarianMatcher
from detr.loss.terms import (
    Indices,
    Targets,
    box_losses,
    matched_box_iou,
    matched_labels,
    matched_query_index,
    matched_token_maps,
)
from detr.models.config import ClassHead
from detr.models.outputs import DetectorOutput, LayerOutput

#: Output fields that only a part reads: (what they are, the part). A criterion without the part refuses them
#: rather than train without their loss.
_PART_OUTPUTS = {"proposals": ("two-stage encoder proposals", "detr.loss.parts.ProposalLoss"),
                 "denoising": ("denoising predictions", "detr.loss.parts.DenoisingLoss"),
                 "dense": ("dense auxiliary predictions", "detr.loss.parts.DenseLoss"),
                 "masks": ("masks", "detr.loss.masks.MaskLoss"),
                 "mask_features": ("every layer's masks as features", "detr.loss.masks.PointMaskLoss"),
                 "distributions": ("edge distributions", "detr.loss.distribution.DistributionLoss"),
                 "keypoints": ("keypoints", "detr.loss.keypoints.KeypointLoss")}


@dataclass
class LossContext:
    """What the criterion hands its parts beside the outputs: itself (its matcher, class head and per-layer
    terms: :meth:`SetCriterion.layer_losses`), the Hungarian matches of the last decoder layer (``indices``) and
    of every layer, first to last (``layer_indices``, as :attr:`DetectorOutput.layers`), each part's own
    matches (``part_indices``: what :meth:`LossPart.match` returned, by output field) and, for a criterion built
    with ``matching_union``, the union of all of them and its pair count (``union``; None otherwise)."""

    criterion: SetCriterion
    indices: Indices
    layer_indices: list[Indices]
    part_indices: dict[str, list[Indices]] = field(default_factory=dict)
    union: tuple[Indices, torch.Tensor] | None = None


class LossPart(nn.Module):
    """One optional term of the loss: the output field it reads and the weight of each term it returns.

    Subclasses set ``output_field`` (a :class:`DetectorOutput` field; ``also_reads``: other fields it scores) and
    ``weight_dict`` and implement
    ``forward(outputs, targets, num_boxes, context=None)`` → dict of float scalars named as in
    ``weight_dict``, unweighted; :meth:`zeros` when the outputs lack the field (evaluation mode), so that
    ``weight_dict`` always finds them.
    """

    output_field: str
    also_reads: tuple[str, ...] = ()
    weight_dict: dict[str, float]

    def match(self, outputs: DetectorOutput, targets: Targets, criterion: SetCriterion) -> list[Indices]:
        """The Hungarian matches of this part's predictions that join a criterion's ``matching_union`` (none
        unless a part says so); handed back in :attr:`LossContext.part_indices`."""
        return []

    def zeros(self, outputs: DetectorOutput) -> dict[str, torch.Tensor]:
        """Every term at zero: what a part returns when the outputs lack its field."""
        zero = outputs.logits.new_zeros((), dtype=torch.float32)
        return {name: zero for name in self.weight_dict}


class SetCriterion(nn.Module):
    """Hungarian-matched losses for the final and every auxiliary decoder layer, plus its parts' losses.

    Returns UNWEIGHTED terms under the authors' names: loss_ce (weighted cross-entropy, no-object weight
    ``eos_coef``, mean over all B × Q queries), loss_bbox (L1 over matched boxes / num_boxes), loss_giou
    ((1 − GIoU) over matched boxes / num_boxes), and the logged-only class_error (100 − top-1 accuracy
    of matched queries) and cardinality_error. Auxiliary layer i adds the suffix ``_i``.
    ``weight_dict`` maps each trained term to its weight (1, 5, 2), the parts' terms included.

    Options for training from scratch on a short budget (docs/measurements/convergence.md; defaults are the paper's):
        class_head: the model's class head: "softmax" (paper: cross-entropy with a no-object class) or
            "sigmoid" (sigmoid focal loss over ``num_classes`` logits, summed and divided by num_boxes, as
            Deformable DETR); the matcher must have the same ``class_head``. focal_alpha, focal_gamma:
            0.25, 2.
        varifocal: with the sigmoid head, the varifocal loss (:func:`detr.loss.focal.varifocal_loss`: the
            target class scored by the IoU of the query's box with its target) instead of the focal loss, as
            RT-DETR trains (with focal_alpha 0.75); still named loss_ce, divided by num_boxes.
        matchability: with the sigmoid head, DEIM's matchability-aware loss
            (:func:`detr.loss.focal.matchability_loss`: the target class scored IoU^γ, γ ``matchability_gamma``
            1.5) instead; still named loss_ce, divided by num_boxes.
        ia_bce: with the sigmoid head, LW-DETR's IoU-aware BCE (:func:`detr.loss.focal.ia_bce_loss`: the target
            class scored p^α IoU^(1−α), negatives weighted p^γ; α ``focal_alpha`` 0.25, γ ``focal_gamma`` 2), as
            RF-DETR and LW-DETR train; still named loss_ce, divided by num_boxes.
        matching_union: D-FINE's GO-LSD (§3.3, the authors' ``use_uni_set``): the box terms (and the parts'
            localisation terms) of every layer are computed on the union of every layer's matches (the decoder
            layers' and those the parts add: the first layer's plain head, the encoder proposals), each query
            keeping the target it was matched to most often, and divided by the union's pair count (this
            process's: the authors average it across processes); the class terms keep each layer's own matches.
        Group DETR: with a matcher built with ``group_size``, predictions of G query groups are matched
            group by group (see the matcher) and the box and focal terms are divided by G · num_boxes: the
            mean over groups of each group's loss (the softmax term is a mean over all queries already).
            cardinality_error counts group 1.
        parts: the optional terms (:class:`LossPart`), each called with the outputs, the targets, num_boxes
            and a :class:`LossContext` (this criterion and the last layer's matches):
            :class:`~detr.loss.parts.ProposalLoss` for Deformable DETR's two-stage proposals (loss_*_enc),
            :class:`~detr.loss.parts.DenoisingLoss` for a model with denoising queries (loss_*_dn,
            loss_*_dn_i), :class:`~detr.loss.parts.DenseLoss` for one with the dense head (loss_*_dense),
            :class:`detr.loss.masks.MaskLoss` for a panoptic model's masks (loss_mask, loss_dice),
            :class:`detr.loss.masks.PointMaskLoss` for instance masks (loss_mask_ce, loss_mask_dice per layer). Outputs
            holding a field one of them reads need that part. :func:`detr.loss.build.build_criterion`
            chooses them for a model's config.
    """

    def __init__(self, num_classes: int, matcher: HungarianMatcher | None = None, eos_coef: float = 0.1, *,
                 loss_ce: float = 1.0, loss_bbox: float = 5.0, loss_giou: float = 2.0,
                 num_decoder_layers: int = 6, class_head: ClassHead = "softmax",
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0, varifocal: bool = False,
                 matchability: bool = False, matchability_gamma: float = 1.5, ia_bce: bool = False,
                 matching_union: bool = False, parts: Sequence[LossPart] = ()) -> None:
        super().__init__()
        chosen = [name for name, value in (("varifocal", varifocal), ("matchability", matchability),
                                           ("ia_bce", ia_bce)) if value]
        if chosen and class_head != "sigmoid":
            raise ValueError(f"SetCriterion({chosen[0]}=True) scores sigmoid logits: build it with class_head='sigmoid'")
        if len(chosen) > 1:
            raise ValueError(f"SetCriterion: {' and '.join(chosen)} are different class losses; choose one")
        self.varifocal, self.matchability, self.matchability_gamma = varifocal, matchability, matchability_gamma
        self.ia_bce = ia_bce
        self.matching_union = matching_union
        self.num_classes = num_classes
        self.matcher = matcher if matcher is not None else HungarianMatcher(class_head=class_head)
        if self.matcher.class_head != class_head:
            raise ValueError(f"SetCriterion(class_head={class_head!r}) needs a matcher with the same cost: "
                             f"HungarianMatcher(class_head={class_head!r}), got {self.matcher.class_head!r}")
        self.class_head, self.focal_alpha, self.focal_gamma = class_head, focal_alpha, focal_gamma
        self.num_decoder_layers, self.eos_coef = num_decoder_layers, eos_coef
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight)
        base = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.weight_dict: dict[str, float] = dict(base)
        for layer in range(num_decoder_layers - 1):
            self.weight_dict.update({f"{name}_{layer}": weight for name, weight in base.items()})

        parts = list(parts)
        for part in parts:
            if part.output_field in {other.output_field for other in parts if other is not part}:
                raise ValueError(f"SetCriterion: two parts read {part.output_field!r}; pass each part once")
            if getattr(part, "class_head", class_head) != class_head:
                raise ValueError(f"SetCriterion(class_head={class_head!r}): the part {type(part).__name__} has "
                                 f"class_head={part.class_head!r}; give both the model's class head")
            self.weight_dict.update(part.weight_dict)
        self.parts = nn.ModuleList(parts)

    def loss_labels(self, outputs: LayerOutput, targets: Targets, indices: Indices,
                    num_boxes: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
        """num_boxes: divides the focal loss only (the softmax loss is a mean over all queries)."""
        logits = outputs.logits.float()  # [B, Q, C+1] softmax, [B, Q, C] sigmoid
        batch_index, query_index = matched_query_index(indices)
        labels = matched_labels(targets, indices).to(logits.device)
        token_maps = matched_token_maps(targets, indices)
        if token_maps is not None:  # a grounding model's: a target's class is its phrase's tokens
            return self.token_loss_labels(logits, batch_index, query_index, token_maps.to(logits), num_boxes)
        if self.class_head == "sigmoid":
            onehot = torch.zeros_like(logits)  # unmatched queries: every class negative
            onehot[batch_index, query_index, labels] = 1.0
            if self.varifocal or self.matchability or self.ia_bce:
                scores = torch.zeros_like(logits)  # the target class at the box's IoU with its target
                scores[batch_index, query_index, labels] = matched_box_iou(outputs.boxes, targets, indices).to(logits)
            if self.ia_bce:
                loss_ce = ia_bce_loss(logits, onehot, scores, num_boxes, alpha=self.focal_alpha, gamma=self.focal_gamma)
            elif self.matchability:
                loss_ce = matchability_loss(logits, onehot, scores, num_boxes, gamma=self.matchability_gamma)
            elif self.varifocal:
                loss_ce = varifocal_loss(logits, onehot, scores, num_boxes, alpha=self.focal_alpha,
                                         gamma=self.focal_gamma)
            else:
                loss_ce = sigmoid_focal_loss(logits, onehot, num_boxes, alpha=self.focal_alpha,
                                             gamma=self.focal_gamma)
        else:
            target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
            target_classes[batch_index, query_index] = labels
            loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, self.empty_weight)
        if labels.numel() == 0:
            accuracy = logits.new_zeros(())  # the authors' convention: class_error 100 with no targets
        else:
            accuracy = (logits[batch_index, query_index].argmax(-1) == labels).float().mean() * 100
        return {"loss_ce": loss_ce, "class_error": 100 - accuracy}

    def token_loss_labels(self, logits: torch.Tensor, batch_index: torch.Tensor, query_index: torch.Tensor,
                          token_maps: torch.Tensor, num_boxes: float | torch.Tensor) -> dict[str, torch.Tensor]:
        """The focal loss of a grounding model's logits [B, Q, N] (one per prompt token, −inf outside the prompt):
        a matched query's target is its target's token map [N], every other query's all zero; summed over the
        prompt's tokens only (the finite logits) and divided by ``num_boxes``. class_error: 100 − the share of
        matched queries whose best token is one of their target's."""
        if self.class_head != "sigmoid" or self.varifocal or self.matchability or self.ia_bce:
            raise ValueError("targets with a token_map (a grounding model's) train the sigmoid focal loss: build the "
                             "criterion with class_head='sigmoid' and class_loss 'focal'")
        onehot = torch.zeros_like(logits)
        onehot[batch_index, query_index] = token_maps
        loss_ce = sigmoid_focal_loss(logits, onehot, num_boxes, alpha=self.focal_alpha, gamma=self.focal_gamma,
                                     where=logits.isfinite())
        if len(token_maps) == 0:
            accuracy = logits.new_zeros(())
        else:
            best = logits[batch_index, query_index].argmax(-1)
            accuracy = (token_maps.gather(1, best[:, None]) > 0).float().mean() * 100
        return {"loss_ce": loss_ce, "class_error": 100 - accuracy}

    @torch.no_grad()
    def loss_cardinality(self, outputs: LayerOutput, targets: Targets) -> dict[str, torch.Tensor]:
        logits = outputs.logits
        groups = self.matcher.num_groups(logits.shape[1])
        logits = logits[:, : logits.shape[1] // groups]  # Group DETR: the first group (what inference keeps)
        if self.class_head == "sigmoid":  # no "no object" logit: a query predicts an object when a class p > 0.5
            predicted = (logits.amax(-1) > 0).sum(1).float()
        else:
            predicted = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1).float()  # [B] non-empty predictions
        target_lengths = torch.as_tensor([len(t["labels"]) for t in targets], dtype=torch.float32, device=logits.device)
        return {"cardinality_error": F.l1_loss(predicted, target_lengths)}

    def loss_boxes(self, outputs: LayerOutput, targets: Targets, indices: Indices, num_boxes: float
                   ) -> dict[str, torch.Tensor]:
        return box_losses(outputs.boxes, targets, indices, num_boxes)

    def layer_losses(self, outputs: LayerOutput, targets: Targets, num_boxes: float) -> dict[str, torch.Tensor]:
        """Match, then every loss term for one decoder layer's predictions."""
        return self.matched_layer_losses(outputs, targets, num_boxes)[0]

    def matched_layer_losses(self, outputs: LayerOutput, targets: Targets, num_boxes: float
                             ) -> tuple[dict[str, torch.Tensor], Indices]:
        """:meth:`layer_losses` and the matches they were computed on."""
        indices = self.matcher(outputs, targets)
        num_boxes = num_boxes * self.matcher.num_groups(outputs.logits.shape[1])
        return self.assigned_losses(outputs, targets, indices, num_boxes), indices

    def assigned_losses(self, outputs: LayerOutput, targets: Targets, indices: Indices,
                        num_boxes: float | torch.Tensor, boxes_on: tuple[Indices, torch.Tensor] | None = None
                        ) -> dict[str, torch.Tensor]:
        """Every loss term for one layer's predictions on given (query, target) pairs (the matcher's, or a
        part's fixed assignment): the class term over all queries (the unpaired ones as background).
        ``boxes_on``: other pairs and their count for the box terms (GO-LSD's union)."""
        losses = self.loss_labels(outputs, targets, indices, num_boxes)
        losses.update(self.loss_cardinality(outputs, targets))
        losses.update(self.loss_boxes(outputs, targets, *(boxes_on or (indices, num_boxes))))
        return losses

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: float | torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        """outputs: the model's :class:`DetectorOutput` (logits, boxes, aux layers, and what the parts read);
        targets: per image labels int64 [T] and boxes [T, 4] normalised cxcywh; num_boxes: the batch's
        target count, averaged over processes by the caller (local count when None), clamped to at least 1."""
        read = {name for part in self.parts for name in (part.output_field, *part.also_reads)}
        for name, (what, part) in _PART_OUTPUTS.items():
            if getattr(outputs, name) is not None and name not in read:
                raise ValueError(f"the outputs hold {what} ({name}) but the criterion ignores them: build it with "
                                 f"SetCriterion(..., parts=[{part}(...)]), or with detr.loss.build.build_criterion "
                                 "(the model's config)")
        if num_boxes is None:
            num_boxes = float(sum(len(t["labels"]) for t in targets))
        num_boxes = torch.as_tensor(num_boxes, dtype=torch.float32, device=outputs.logits.device).clamp(min=1)
        layers = outputs.layers
        layer_indices = self.matcher.match_layers(layers, targets)
        part_indices = {part.output_field: part.match(outputs, targets, self) for part in self.parts}
        union = None
        if self.matching_union:
            pairs = matching_union([layer_indices[-1], *layer_indices[:-1],
                                    *(indices for matches in part_indices.values() for indices in matches)])
            count = torch.as_tensor(float(sum(len(query) for query, _ in pairs)), device=num_boxes.device)
            union = (pairs, count.clamp(min=1))
        layer_num_boxes = num_boxes * self.matcher.num_groups(outputs.logits.shape[1])
        losses: dict[str, torch.Tensor] = {}
        for layer, (output, indices) in enumerate(zip(layers, layer_indices)):
            terms = self.assigned_losses(output, targets, indices, layer_num_boxes, boxes_on=union)
            if layer == len(layers) - 1:
                losses.update(terms)
            else:
                terms.pop("class_error")  # logged for the last layer only, as the authors do
                losses.update({f"{name}_{layer}": value for name, value in terms.items()})
        context = LossContext(self, layer_indices[-1], layer_indices, part_indices, union)
        for part in self.parts:
            losses.update(part(outputs, targets, num_boxes, context))
        return losses


def matching_union(matches: Sequence[Indices]) -> Indices:
    """GO-LSD's union of several layers' matches (D-FINE §3.3; the authors' ``_get_go_indices``): per image, every
    (query, target) pair any layer made, each query keeping the target it was paired with most often.

    Args: matches: per layer, per image (query indices, target indices) int64. Returns per image (query indices,
    target indices) int64, queries unique.
    """
    result = []
    for image in zip(*matches):
        pairs = torch.cat([torch.stack([query, target], 1) for query, target in image])  # [P, 2]
        if len(pairs) == 0:
            result.append((pairs.new_zeros(0), pairs.new_zeros(0)))
            continue
        unique, counts = torch.unique(pairs, return_counts=True, dim=0)
        chosen: dict[int, int] = {}
        for query, target in unique[torch.argsort(counts, descending=True)].tolist():
            chosen.setdefault(query, target)  # the most frequent pair of each query comes first
        result.append((torch.tensor(list(chosen), dtype=torch.int64, device=pairs.device),
                       torch.tensor(list(chosen.values()), dtype=torch.int64, device=pairs.device)))
    return result
