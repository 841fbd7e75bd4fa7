"""Losses that :class:`detr.loss.criterion.SetCriterion` adds to the paper's set loss, one part per training aid.

A part reads one field of the model's :class:`~detr.models.outputs.DetectorOutput` (``output_field``), names
its terms and their weights in ``weight_dict``, and is called as ``part(outputs, targets, num_boxes,
context)`` → those terms, unweighted; ``context`` (:class:`LossContext`) holds the criterion (its matcher
and per-layer terms) and the last layer's matches. It returns zeros when that field is None (evaluation
mode), so ``weight_dict`` always finds them.

- :class:`ProposalLoss`: Deformable DETR's two-stage encoder proposals (``proposals``).
- :class:`DenoisingLoss` (DN-DETR, Li et al. 2022): the model's denoising queries (``denoising``).
- :class:`DenseLoss`: the training-only dense head on the encoder (``dense``,
  :mod:`detr.models.dense_head`), one-to-many.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detr.box_ops import cxcywh_to_xyxy
from detr.loss.criterion import LossContext, LossPart, SetCriterion
from detr.loss.focal import sigmoid_focal_loss
from detr.loss.terms import Indices, Targets, box_losses, matched_labels, matched_query_index
from detr.models.config import ClassHead
from detr.models.layers.denoising import DenoisingMeta
from detr.models.outputs import DetectorOutput


class ProposalLoss(LossPart):
    """loss_{ce,bbox,giou}_enc of the encoder's proposals: the set loss with the criterion's matcher and terms,
    matched class-agnostically (every target is class 0: Deformable DETR's two-stage, as the authors' code) or
    with the targets' classes (``class_agnostic=False``: RT-DETR's selected proposals, which the authors weigh
    as one more decoder layer).

    Args: the weights loss_ce, loss_bbox, loss_giou (1, 5, 2: the main terms'); class_agnostic (True).
    """

    output_field = "proposals"

    def __init__(self, *, loss_ce: float = 1.0, loss_bbox: float = 5.0, loss_giou: float = 2.0,
                 class_agnostic: bool = True) -> None:
        super().__init__()
        self.class_agnostic = class_agnostic
        base = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.weight_dict = {f"{name}_enc": weight for name, weight in base.items()}

    def _targets(self, targets: Targets) -> Targets:
        if self.class_agnostic:
            return [{**target, "labels": torch.zeros_like(target["labels"])} for target in targets]
        return targets

    def match(self, outputs: DetectorOutput, targets: Targets, criterion: SetCriterion) -> list[Indices]:
        """The proposals' matches (they join GO-LSD's union, as the authors' encoder outputs do)."""
        if outputs.proposals is None:
            return []
        return [criterion.matcher(outputs.proposals, self._targets(targets))]

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        """The set loss of the proposals, on their matches from ``context`` (the box terms on the union where the
        criterion makes one)."""
        if outputs.proposals is None:
            return self.zeros(outputs)
        if context is None:
            raise ValueError("ProposalLoss matches with its criterion's matcher: call it through SetCriterion")
        targets = self._targets(targets)
        (indices,) = context.part_indices.get(self.output_field) or self.match(outputs, targets, context.criterion)
        groups = context.criterion.matcher.num_groups(outputs.proposals.logits.shape[1])
        losses = context.criterion.assigned_losses(outputs.proposals, targets, indices, num_boxes * groups,
                                                   boxes_on=context.union)
        losses.pop("class_error")
        return {f"{name}_enc": value for name, value in losses.items()}


def denoising_indices(meta: DenoisingMeta, targets: Targets) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image (query indices into the denoising queries, target indices), int64 [G · T_b] each: the fixed
    assignment, made by the way the queries were noised (:class:`DenoisingMeta`), that replaces matching for
    the denoising losses."""
    result = []
    for target in targets:
        count = len(target["labels"])
        slot = torch.arange(count, dtype=torch.int64)
        group = torch.arange(meta.num_groups, dtype=torch.int64)
        result.append(((group[:, None] * meta.group_size + slot[None, :]).flatten(), slot.repeat(meta.num_groups)))
    return result


class DenoisingLoss(LossPart):
    """loss_{ce,bbox,giou}_dn, plus ``_dn_i`` for auxiliary decoder layer i, of the denoising queries.

    Each query is scored against the target it was noised from (:func:`denoising_indices`), with no
    matching; the class loss covers those queries only (cross-entropy for the softmax head, focal summed
    and divided like the boxes for the sigmoid head); L1 and 1 − GIoU are summed and divided by
    num_boxes × denoising groups.

    ``contrastive=True`` (RT-DETR's contrastive denoising, whose groups hold a positive and a negative copy of
    every target): the criterion's own terms (:meth:`SetCriterion.assigned_losses`) on the positives'
    fixed pairs, so the class term (varifocal for RT-DETR) covers every denoising query, the negatives and
    the padding as background; the same division by num_boxes × groups.

    Args:
        num_decoder_layers: the decoder's layers (the criterion's count: one suffix per layer).
        class_head: the model's class head, as the criterion's.
        focal_alpha, focal_gamma: the sigmoid head's focal loss (0.25, 2).
        loss_ce, loss_bbox, loss_giou: the weights (1, 5, 2: the main terms').
        contrastive: score with the criterion's terms over every denoising query (RT-DETR).
    """

    output_field = "denoising"

    def __init__(self, num_decoder_layers: int = 6, *, class_head: ClassHead = "softmax",
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0, loss_ce: float = 1.0,
                 loss_bbox: float = 5.0, loss_giou: float = 2.0, contrastive: bool = False) -> None:
        super().__init__()
        self.contrastive = contrastive
        self.class_head, self.focal_alpha, self.focal_gamma = class_head, focal_alpha, focal_gamma
        self.suffixes = ["_dn"] + [f"_dn_{layer}" for layer in range(num_decoder_layers - 1)]
        base = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.weight_dict = {f"{name}{suffix}": weight for suffix in self.suffixes for name, weight in base.items()}

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        """outputs: the model's output (its ``denoising`` predictions); num_boxes: the batch's target count,
        reduced across processes and at least 1; ``context``: the criterion, whose terms score the layers when
        ``contrastive`` (not read otherwise: the queries' targets are fixed)."""
        if outputs.denoising is None:  # evaluation, or a batch without targets
            return self.zeros(outputs)
        meta, denoising = outputs.denoising.meta, outputs.denoising
        indices = denoising_indices(meta, targets)
        dn_num_boxes = num_boxes * meta.num_groups
        if self.contrastive:
            if context is None:
                raise ValueError("DenoisingLoss(contrastive=True) scores with its criterion's terms: call it "
                                 "through SetCriterion")
            losses = {}
            for suffix, layer in zip(self.suffixes, [denoising, *denoising.aux]):
                terms = context.criterion.assigned_losses(layer, targets, indices, dn_num_boxes)
                losses.update({f"{name}{suffix}": terms[name] for name in ("loss_ce", "loss_bbox", "loss_giou")})
            return losses
        batch_index, query_index = matched_query_index(indices)
        labels = matched_labels(targets, indices)
        losses = {}
        for suffix, layer in zip(self.suffixes, [denoising, *denoising.aux]):
            logits = layer.logits[batch_index, query_index].float()  # [N, C(+1)]
            labels = labels.to(logits.device)
            if self.class_head == "sigmoid":
                onehot = F.one_hot(labels, logits.shape[-1]).to(logits.dtype)
                loss_ce = sigmoid_focal_loss(logits, onehot, dn_num_boxes, alpha=self.focal_alpha,
                                             gamma=self.focal_gamma)
            else:
                loss_ce = F.cross_entropy(logits, labels)
            layer_losses = {"loss_ce": loss_ce, **box_losses(layer.boxes, targets, indices, dn_num_boxes)}
            losses.update({f"{name}{suffix}": value for name, value in layer_losses.items()})
        return losses


class DenseLoss(LossPart):
    """loss_ce_dense, loss_bbox_dense, loss_giou_dense of the dense head's cells.

    Every cell whose centre lies inside a box is a positive for it
    (:func:`dense_assignment`). Sigmoid focal over the real (unpadded) cells, L1 and
    1 − GIoU over the positive cells, each divided by this process's positive-cell count (not num_boxes).

    Args:
        focal_alpha, focal_gamma: the focal loss (0.25, 2).
        loss_ce, loss_bbox, loss_giou: the weights (1, 5, 2: the main terms').
    """

    output_field = "dense"

    def __init__(self, *, focal_alpha: float = 0.25, focal_gamma: float = 2.0, loss_ce: float = 1.0,
                 loss_bbox: float = 5.0, loss_giou: float = 2.0) -> None:
        super().__init__()
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma
        self.weight_dict = {"loss_ce_dense": loss_ce, "loss_bbox_dense": loss_bbox, "loss_giou_dense": loss_giou}

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor | None = None,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        """outputs: the model's output; its ``dense`` predictions (:class:`detr.models.outputs.DenseOutput`).
        num_boxes, context: unused (the part divides by its own positive-cell count and assigns cells itself);
        taken so every part is called alike."""
        if outputs.dense is None:
            return self.zeros(outputs)
        dense = outputs.dense
        logits = dense.logits.float()  # [B, HW, K]
        assigned = dense_assignment(dense.centers, dense.valid, targets)  # [B, HW], -1 = negative
        indices = []  # per image (positive cells, their targets): the layout of the matcher's indices
        for row in assigned:
            cells = (row >= 0).nonzero().flatten()
            indices.append((cells, row[cells]))
        num_positive = (assigned >= 0).sum().clamp(min=1).float()
        batch_index, cell_index = matched_query_index(indices)
        onehot = torch.zeros_like(logits)
        onehot[batch_index, cell_index, matched_labels(targets, indices).to(logits.device)] = 1.0
        valid = dense.valid
        loss_ce = sigmoid_focal_loss(logits[valid], onehot[valid], num_positive, alpha=self.focal_alpha,
                                     gamma=self.focal_gamma)
        boxes = box_losses(dense.boxes, targets, indices, num_positive)
        return {"loss_ce_dense": loss_ce, "loss_bbox_dense": boxes["loss_bbox"], "loss_giou_dense": boxes["loss_giou"]}


@torch.no_grad()
def dense_assignment(centers: torch.Tensor, valid: torch.Tensor, targets: list[dict[str, torch.Tensor]]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """One-to-many assignment of cells to targets.

    Args:
        centers: float [B, HW, 2] normalised (x, y) cell centres; valid: bool [B, HW].
        targets: per image labels int64 [T] and boxes float [T, 4] normalised cxcywh.

    Returns assigned int64 [B, HW]: the index of the cell's target in its image, -1 for a negative or
    padding cell. A cell is positive for every target box its centre lies in, and the cell nearest each
    target's centre is positive for that target whatever the box covers; a cell positive for several
    targets takes the smallest box.
    """
    batch, cells, _ = centers.shape
    assigned = torch.full((batch, cells), -1, dtype=torch.int64, device=centers.device)
    for index, target in enumerate(targets):
        boxes = target["boxes"].to(centers)
        if len(boxes) == 0:
            continue
        xyxy = cxcywh_to_xyxy(boxes)  # [T, 4]
        point = centers[index]  # [HW, 2]
        inside = ((point[:, None, 0] > xyxy[None, :, 0]) & (point[:, None, 0] < xyxy[None, :, 2])
                  & (point[:, None, 1] > xyxy[None, :, 1]) & (point[:, None, 1] < xyxy[None, :, 3]))  # [HW, T]
        distance = (point[:, None, :] - boxes[None, :, :2]).abs().amax(-1)  # [HW, T] Chebyshev to the centre
        distance = distance.masked_fill(~valid[index][:, None], float("inf"))
        nearest = distance.argmin(0)  # [T]: the cell holding each centre
        inside[nearest, torch.arange(len(boxes), device=centers.device)] = True
        inside &= valid[index][:, None]
        area = (boxes[:, 2] * boxes[:, 3])[None, :].expand_as(inside)
        area = area.masked_fill(~inside, float("inf"))
        smallest = area.argmin(1)  # [HW]
        assigned[index] = torch.where(inside.any(1), smallest, -1)
    return assigned
