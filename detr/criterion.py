"""DETR's set loss (Carion et al. 2020, section 3.1 and appendix A.2; the authors' SetCriterion in models/detr.py).

A pure function of predictions and targets: the caller passes ``num_boxes`` already reduced across
processes (the training system all-reduces it); nothing here talks to torch.distributed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.box_ops import cxcywh_to_xyxy, elementwise_generalized_box_iou
from detr.focal import ClassHead, resolve_class_head, sigmoid_focal_loss
from detr.matcher import HungarianMatcher
from detr.models.dense_head import dense_assignment

Outputs = dict[str, torch.Tensor]
Targets = list[dict[str, torch.Tensor]]
Indices = list[tuple[torch.Tensor, torch.Tensor]]


def _matched_query_index(indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch index, query index) of every matched query, for advanced indexing of [B, Q, ...]."""
    batch_index = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    query_index = torch.cat([src for src, _ in indices])
    return batch_index, query_index


class SetCriterion(nn.Module):
    """Hungarian-matched losses for the final and every auxiliary decoder layer.

    Returns UNWEIGHTED terms under the authors' names: loss_ce (weighted cross-entropy, no-object weight
    ``eos_coef``, mean over all B × Q queries), loss_bbox (L1 over matched boxes / num_boxes), loss_giou
    ((1 − GIoU) over matched boxes / num_boxes), and the logged-only class_error (100 − top-1 accuracy
    of matched queries) and cardinality_error. Auxiliary layer i adds the suffix ``_i``.
    ``weight_dict`` maps each trained term to its weight (1, 5, 2).

    Options for training from scratch on a short budget (docs/convergence.md; defaults are the paper's):
        class_head: the model's class head: "softmax" (paper: cross-entropy with a no-object class) or
            "sigmoid" (sigmoid focal loss over ``num_classes`` logits, summed and divided by num_boxes, as
            Deformable DETR); the matcher must have the same ``class_head``. focal_alpha, focal_gamma:
            0.25, 2. (``class_loss="softmax"|"focal"`` is its deprecated old name.)
        Group DETR: outputs with ``query_groups`` G > 1 are matched group by group (see the matcher) and
            the box and focal terms are divided by G · num_boxes: the mean over groups of each group's
            loss (the softmax term is a mean over all queries already). cardinality_error counts group 1.
        denoising: also compute loss_ce_dn, loss_bbox_dn, loss_giou_dn (+ ``_dn_i`` per aux layer) on the
            model's ``dn_outputs``: each denoising query against the ground truth it was made from, no
            matching, divided by num_boxes × groups (DN-DETR). They are zero when the outputs have none
            (evaluation mode), so ``weight_dict`` always finds them.
        dense_aux: also compute loss_ce_dense, loss_bbox_dense, loss_giou_dense on the model's
            ``dense_outputs`` (:mod:`detr.models.dense_head`, one-to-many: every cell inside a box):
            sigmoid focal over the real cells, L1 and GIoU over the positive cells, each divided by this
            process's positive-cell count; weighted like the main terms. Zeros without dense outputs.
    """

    def __init__(self, num_classes: int, matcher: HungarianMatcher | None = None, eos_coef: float = 0.1, *,
                 loss_ce: float = 1.0, loss_bbox: float = 5.0, loss_giou: float = 2.0,
                 num_decoder_layers: int = 6, class_head: ClassHead | None = None,
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0, denoising: bool = False,
                 dense_aux: bool = False, class_loss: str | None = None) -> None:
        super().__init__()
        class_head = resolve_class_head(class_head, class_loss, "SetCriterion")
        self.num_classes = num_classes
        self.matcher = matcher if matcher is not None else HungarianMatcher(class_head=class_head)
        if self.matcher.class_head != class_head:
            raise ValueError(f"SetCriterion(class_head={class_head!r}) needs a matcher with the same cost: "
                             f"HungarianMatcher(class_head={class_head!r}), got {self.matcher.class_head!r}")
        self.class_head, self.focal_alpha, self.focal_gamma = class_head, focal_alpha, focal_gamma
        self.denoising, self.num_decoder_layers, self.dense_aux = denoising, num_decoder_layers, dense_aux
        self.eos_coef = eos_coef
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight)
        base = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.weight_dict: dict[str, float] = dict(base)
        for layer in range(num_decoder_layers - 1):
            self.weight_dict.update({f"{name}_{layer}": weight for name, weight in base.items()})
        if denoising:
            self.weight_dict.update({f"{name}_dn": weight for name, weight in base.items()})
            for layer in range(num_decoder_layers - 1):
                self.weight_dict.update({f"{name}_dn_{layer}": weight for name, weight in base.items()})
        if dense_aux:
            self.weight_dict.update({f"{name}_dense": weight for name, weight in base.items()})

    def loss_labels(self, outputs: Outputs, targets: Targets, indices: Indices,
                    num_boxes: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
        """num_boxes: divides the focal loss only (the softmax loss is a mean over all queries)."""
        logits = outputs["pred_logits"].float()  # [B, Q, C+1] softmax, [B, Q, C] sigmoid
        batch_index, query_index = _matched_query_index(indices)
        matched_labels = torch.cat([t["labels"][tgt] for t, (_, tgt) in zip(targets, indices)]).to(logits.device)
        if self.class_head == "sigmoid":
            onehot = torch.zeros_like(logits)  # unmatched queries: every class negative
            onehot[batch_index, query_index, matched_labels] = 1.0
            loss_ce = sigmoid_focal_loss(logits, onehot, num_boxes, alpha=self.focal_alpha, gamma=self.focal_gamma)
        else:
            target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
            target_classes[batch_index, query_index] = matched_labels
            loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, self.empty_weight)
        if matched_labels.numel() == 0:
            accuracy = logits.new_zeros(())  # the authors' convention: class_error 100 with no targets
        else:
            accuracy = (logits[batch_index, query_index].argmax(-1) == matched_labels).float().mean() * 100
        return {"loss_ce": loss_ce, "class_error": 100 - accuracy}

    @torch.no_grad()
    def loss_cardinality(self, outputs: Outputs, targets: Targets) -> dict[str, torch.Tensor]:
        logits = outputs["pred_logits"]
        groups = int(outputs.get("query_groups", 1))
        logits = logits[:, : logits.shape[1] // groups]  # Group DETR: the first group (what inference keeps)
        if self.class_head == "sigmoid":  # no "no object" logit: a query predicts an object when a class p > 0.5
            predicted = (logits.amax(-1) > 0).sum(1).float()
        else:
            predicted = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1).float()  # [B] non-empty predictions
        target_lengths = torch.as_tensor([len(t["labels"]) for t in targets], dtype=torch.float32, device=logits.device)
        return {"cardinality_error": F.l1_loss(predicted, target_lengths)}

    def loss_boxes(self, outputs: Outputs, targets: Targets, indices: Indices, num_boxes: float) -> dict[str, torch.Tensor]:
        batch_index, query_index = _matched_query_index(indices)
        pred = outputs["pred_boxes"][batch_index, query_index].float()  # [N, 4] cxcywh
        target = torch.cat([t["boxes"][tgt] for t, (_, tgt) in zip(targets, indices)]).to(pred)
        loss_bbox = F.l1_loss(pred, target, reduction="none").sum() / num_boxes
        giou = elementwise_generalized_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(target))
        return {"loss_bbox": loss_bbox, "loss_giou": (1 - giou).sum() / num_boxes}

    def layer_losses(self, outputs: Outputs, targets: Targets, num_boxes: float) -> dict[str, torch.Tensor]:
        """Match, then every loss term for one decoder layer's predictions."""
        indices = self.matcher(outputs, targets)
        num_boxes = num_boxes * int(outputs.get("query_groups", 1))
        losses = self.loss_labels(outputs, targets, indices, num_boxes)
        losses.update(self.loss_cardinality(outputs, targets))
        losses.update(self.loss_boxes(outputs, targets, indices, num_boxes))
        return losses

    def forward(self, outputs: dict, targets: Targets, num_boxes: float | torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        """outputs: the model's dict (pred_logits, pred_boxes, optional aux_outputs); targets: per image
        labels int64 [T] and boxes [T, 4] normalised cxcywh; num_boxes: the batch's target count,
        averaged over processes by the caller (local count when None), clamped to at least 1."""
        if num_boxes is None:
            num_boxes = float(sum(len(t["labels"]) for t in targets))
        num_boxes = torch.as_tensor(num_boxes, dtype=torch.float32, device=outputs["pred_logits"].device).clamp(min=1)
        losses = self.layer_losses(outputs, targets, num_boxes)
        for layer, aux in enumerate(outputs.get("aux_outputs", [])):
            aux_losses = self.layer_losses(aux, targets, num_boxes)
            aux_losses.pop("class_error")  # logged for the last layer only, as the authors do
            losses.update({f"{name}_{layer}": value for name, value in aux_losses.items()})
        if self.denoising:
            losses.update(self.denoising_losses(outputs, targets, num_boxes))
        elif "dn_outputs" in outputs:
            raise ValueError("the outputs hold denoising predictions (dn_outputs) but the criterion ignores them: "
                             "build it with SetCriterion(..., denoising=True)")
        if self.dense_aux:
            losses.update(self.dense_losses(outputs, targets))
        elif "dense_outputs" in outputs:
            raise ValueError("the outputs hold dense auxiliary predictions (dense_outputs) but the criterion ignores "
                             "them: build it with SetCriterion(..., dense_aux=True)")
        return losses

    def dense_losses(self, outputs: dict, targets: Targets) -> dict[str, torch.Tensor]:
        """loss_{ce,bbox,giou}_dense of the training-only dense head (one-to-many assignment of
        :func:`detr.models.dense_head.dense_assignment`); zeros when the outputs have none."""
        if "dense_outputs" not in outputs:
            zero = outputs["pred_logits"].new_zeros((), dtype=torch.float32)
            return {"loss_ce_dense": zero, "loss_bbox_dense": zero, "loss_giou_dense": zero}
        dense = outputs["dense_outputs"]
        logits = dense["pred_logits"].float()  # [B, HW, K]
        assigned = dense_assignment(dense["centers"], dense["valid"], targets)  # [B, HW], -1 = negative
        indices = []  # per image (positive cells, their targets): the layout of the matcher's indices
        for row in assigned:
            cells = (row >= 0).nonzero().flatten()
            indices.append((cells, row[cells]))
        num_positive = (assigned >= 0).sum().clamp(min=1).float()
        batch_index, cell_index = _matched_query_index(indices)
        labels = torch.cat([t["labels"][tgt] for t, (_, tgt) in zip(targets, indices)]).to(logits.device)
        onehot = torch.zeros_like(logits)
        onehot[batch_index, cell_index, labels] = 1.0
        valid = dense["valid"]
        loss_ce = sigmoid_focal_loss(logits[valid], onehot[valid], num_positive, alpha=self.focal_alpha,
                                     gamma=self.focal_gamma)
        boxes = self.loss_boxes({"pred_boxes": dense["pred_boxes"]}, targets, indices, num_positive)
        return {"loss_ce_dense": loss_ce, "loss_bbox_dense": boxes["loss_bbox"], "loss_giou_dense": boxes["loss_giou"]}

    def denoising_losses(self, outputs: dict, targets: Targets, num_boxes: torch.Tensor) -> dict[str, torch.Tensor]:
        """loss_{ce,bbox,giou}_dn (+ ``_dn_i`` per aux layer) of the denoising queries (DN-DETR): each
        query is scored against the target it was noised from (``outputs["dn_meta"].indices``), with no
        matching; the class loss covers those queries only; everything is divided by num_boxes × groups.
        Zeros when the outputs have no denoising part (evaluation, or a batch without targets)."""
        names = ("loss_ce", "loss_bbox", "loss_giou")
        suffixes = ["_dn"] + [f"_dn_{layer}" for layer in range(self.num_decoder_layers - 1)]
        if "dn_outputs" not in outputs:
            zero = outputs["pred_logits"].new_zeros((), dtype=torch.float32)
            return {f"{name}{suffix}": zero for suffix in suffixes for name in names}
        meta, dn_outputs = outputs["dn_meta"], outputs["dn_outputs"]
        indices = meta.indices(targets)
        dn_num_boxes = num_boxes * meta.num_groups
        batch_index, query_index = _matched_query_index(indices)
        labels = torch.cat([t["labels"][tgt] for t, (_, tgt) in zip(targets, indices)])
        losses = {}
        for suffix, layer in zip(suffixes, [dn_outputs, *dn_outputs.get("aux_outputs", [])]):
            logits = layer["pred_logits"][batch_index, query_index].float()  # [N, C(+1)]
            labels = labels.to(logits.device)
            if self.class_head == "sigmoid":
                onehot = F.one_hot(labels, logits.shape[-1]).to(logits.dtype)
                loss_ce = sigmoid_focal_loss(logits, onehot, dn_num_boxes, alpha=self.focal_alpha, gamma=self.focal_gamma)
            else:
                loss_ce = F.cross_entropy(logits, labels)
            layer_losses = {"loss_ce": loss_ce, **self.loss_boxes(layer, targets, indices, dn_num_boxes)}
            losses.update({f"{name}{suffix}": layer_losses[name] for name in names})
        return losses
