"""Hungarian matching between predictions and targets (paper §3.1; the authors' models/matcher.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from detr.box_ops import batched_generalized_box_iou, cxcywh_to_xyxy
from detr.loss.focal import focal_class_cost, focal_token_cost
from detr.loss.keypoint_terms import keypoint_matching_costs
from detr.loss.point_sampling import (
    logits_at_points,
    padded_masks,
    padded_size,
    pairwise_dice,
    pairwise_sigmoid_ce,
    point_sample,
)
from detr.models.config import ClassHead
from detr.models.layers.keypoint_head import KeypointSchema
from detr.models.outputs import LayerOutput


class HungarianMatcher(nn.Module):
    """One-to-one assignment of queries to targets that minimises

        cost = cost_class · (−p(target class)) + cost_bbox · L1(cxcywh) + cost_giou · (−GIoU(xyxy)).

    The costs of every image are computed in one batched pass (each image only against its own targets,
    targets padded to the batch maximum), moved to the CPU once, then solved per image by scipy.

    Group DETR (Chen et al. 2023; docs/measurements/convergence.md): built with ``group_size`` (the model's num_queries),
    predictions of G · group_size queries (a training pass with G query groups) are matched group by group,
    each to the targets on its own (one-to-many overall); the indices are into all G · group_size queries.
    Predictions of group_size queries (an inference pass decodes group 1 only) are one group.

    ``class_head="sigmoid"`` replaces −p(target class) by the focal cost of
    :func:`detr.loss.focal.focal_class_cost` for a sigmoid head (``num_classes`` logits; Deformable DETR).

    Mask costs (RF-DETR's authors' matcher for a model with masks): with ``cost_mask_ce`` or ``cost_mask_dice``
    non-zero, a layer that carries its masks as ``mask_features`` (a model with instance masks, in training)
    matched against targets with ``masks`` also costs ``cost_mask_ce`` · BCE + ``cost_mask_dice`` · DICE of
    every (query, target) pair, both on h · w / ``mask_point_ratio`` uniform random points (h × w: the predicted
    masks; one draw from torch's global generator per call, shared by every query and target:
    :mod:`detr.loss.point_sampling`). transformers' ``RfDetrHungarianMatcher`` draws its point count from the
    flattened boxes' shape (B · Q · 4 / ratio) instead; the authors' count is the one used here.

    Keypoint costs (the rfdetr package's matcher for a keypoint model): with ``num_keypoints_per_class`` and a
    non-zero ``cost_keypoint_l1``, ``cost_keypoint_findable``, ``cost_keypoint_visible`` or ``cost_keypoint_nll``, a
    layer that carries ``keypoints`` matched against targets with ``keypoints`` also costs those weights times
    the terms of :func:`detr.loss.keypoint_terms.keypoint_matching_costs`.
    """

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, *,
                 class_head: ClassHead = "softmax", focal_alpha: float = 0.25, focal_gamma: float = 2.0,
                 group_size: int | None = None, cost_mask_ce: float = 0.0, cost_mask_dice: float = 0.0,
                 mask_point_ratio: int = 16, num_keypoints_per_class: tuple[int, ...] | list[int] | None = None,
                 cost_keypoint_l1: float = 0.0, cost_keypoint_findable: float = 0.0,
                 cost_keypoint_visible: float = 0.0, cost_keypoint_nll: float = 0.0) -> None:
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("at least one of cost_class, cost_bbox, cost_giou must be non-zero")
        if group_size is not None and group_size < 1:
            raise ValueError(f"HungarianMatcher: group_size is the model's num_queries (>= 1), got {group_size}")
        self.class_head, self.group_size = class_head, group_size
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma
        self.cost_mask_ce, self.cost_mask_dice, self.mask_point_ratio = cost_mask_ce, cost_mask_dice, mask_point_ratio
        self.keypoint_costs = (cost_keypoint_l1, cost_keypoint_findable, cost_keypoint_visible, cost_keypoint_nll)
        self.keypoint_schema = KeypointSchema(tuple(num_keypoints_per_class)) if num_keypoints_per_class else None
        if any(self.keypoint_costs) and self.keypoint_schema is None:
            raise ValueError("HungarianMatcher: keypoint costs need num_keypoints_per_class (the keypoint head's)")

    def num_groups(self, num_predictions: int) -> int:
        """How many query groups ``num_predictions`` predictions per image hold: num_predictions / group_size,
        1 without groups. Raises ValueError when they do not split into groups of ``group_size``."""
        if self.group_size is None:
            return 1
        if num_predictions % self.group_size:
            raise ValueError(f"{num_predictions} predictions per image do not split into query groups of "
                             f"group_size={self.group_size}: build the matcher with the model's num_queries")
        return num_predictions // self.group_size

    def class_cost(self, logits: torch.Tensor, labels: torch.Tensor, token_maps: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """logits [B, Q, C+1] (softmax; [B, Q, C] for focal), labels int64 [B, T] → cost [B, Q, T]: minus
        the softmax probability (paper), or the focal cost; with ``token_maps`` float [B, T, C] (targets named by
        prompt tokens, a grounding model's), the focal cost averaged over each target's tokens."""
        if token_maps is not None:
            if self.class_head != "sigmoid":
                raise ValueError("targets with a token_map (a grounding model's) are matched with a sigmoid class "
                                 "head: build the matcher with class_head='sigmoid'")
            return focal_token_cost(logits, token_maps, alpha=self.focal_alpha, gamma=self.focal_gamma)
        if self.class_head == "sigmoid":
            return focal_class_cost(logits, labels, alpha=self.focal_alpha, gamma=self.focal_gamma)
        prob = logits.float().softmax(-1)
        return -prob.gather(2, labels[:, None, :].expand(-1, prob.shape[1], -1))

    def mask_cost(self, outputs: LayerOutput, targets: list[dict[str, torch.Tensor]], longest: int
                  ) -> torch.Tensor | None:
        """cost_mask_ce · BCE + cost_mask_dice · DICE [B, Q, T_max] of the layer's masks on shared random points
        (padding columns 0), or None when the costs are 0, the layer has no masks or the targets none."""
        source = outputs.mask_features
        if (self.cost_mask_ce == 0 and self.cost_mask_dice == 0) or source is None or "masks" not in targets[0]:
            return None
        height, width = source.pixels.shape[-2:]
        points = torch.rand(1, height * width // self.mask_point_ratio, 2, device=outputs.logits.device)
        logits = logits_at_points(source, points[0]).float()  # [B, Q, P]
        size = padded_size(targets)
        cost = logits.new_zeros(*logits.shape[:2], longest)
        for index, target in enumerate(targets):
            count = len(target["masks"])
            if count == 0:
                continue
            masks = padded_masks(target, torch.arange(count), size).to(logits)
            labels = point_sample(masks[:, None], points.expand(count, -1, -1), mode="nearest")[:, 0]  # [T, P]
            cost[index, :, :count] = (self.cost_mask_ce * pairwise_sigmoid_ce(logits[index], labels)
                                      + self.cost_mask_dice * pairwise_dice(logits[index], labels))
        return cost

    def keypoint_cost(self, outputs: LayerOutput, targets: list[dict[str, torch.Tensor]], longest: int
                      ) -> torch.Tensor | None:
        """The weighted keypoint costs [B, Q, T_max] of the layer's keypoints against each image's targets (padding
        columns 0), or None when the weights are 0, the layer has no keypoints or the targets none."""
        if not any(self.keypoint_costs) or outputs.keypoints is None or "keypoints" not in targets[0]:
            return None
        keypoints = outputs.keypoints
        device = keypoints.device
        boxes = torch.cat([t["boxes"] for t in targets]).to(device)
        terms = keypoint_matching_costs(keypoints, torch.cat([t["keypoints"] for t in targets]).to(device),
                                        torch.cat([t["labels"] for t in targets]).to(device),
                                        boxes[:, 2] * boxes[:, 3], self.keypoint_schema)  # each [B, Q, ΣT]
        total = sum(weight * term.float() for weight, term in zip(self.keypoint_costs, terms))
        cost = total.new_zeros(*total.shape[:2], longest)
        start = 0
        for index, target in enumerate(targets):
            count = len(target["labels"])
            cost[index, :, :count] = total[index, :, start:start + count]  # each image against its own targets
            start += count
        return cost

    @torch.no_grad()
    def match_layers(self, layers: Sequence[LayerOutput], targets: list[dict[str, torch.Tensor]]
                     ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """:meth:`forward` for several layers' predictions (every decoder layer's, first to last): the layers of
        one shape in one batched pass (one cost computation over [L · B, Q, T], one device-to-host copy instead of
        L); the same matches as one call per layer. Returns per layer what :meth:`forward` returns."""
        shapes = {(layer.logits.shape, layer.boxes.shape, None if layer.keypoints is None else layer.keypoints.shape)
                  for layer in layers}
        if len(layers) < 2 or len(shapes) > 1:
            return [self(layer, targets) for layer in layers]
        batch = layers[0].logits.shape[0]
        keypoints = None if layers[0].keypoints is None else torch.cat([layer.keypoints for layer in layers])
        stacked = LayerOutput(torch.cat([layer.logits for layer in layers]),
                              torch.cat([layer.boxes for layer in layers]), keypoints=keypoints)
        indices = self(stacked, list(targets) * len(layers))
        return [indices[start:start + batch] for start in range(0, len(indices), batch)]

    @torch.no_grad()
    def forward(self, outputs: LayerOutput, targets: list[dict[str, torch.Tensor]]
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """outputs: one layer's predictions (a :class:`detr.models.outputs.LayerOutput`, e.g. a model's
        :class:`~detr.models.outputs.DetectorOutput`): logits [B, Q, C+1], boxes [B, Q, 4] normalised cxcywh;
        targets: per image labels int64 [T] and boxes [T, 4] normalised cxcywh, and for a grounding model
        ``token_map`` float [T, C] (each target's prompt tokens: :mod:`detr.loss.grounding`). Returns per image
        (query indices, target indices), two int64 tensors of length min(Q, T), sorted by query index."""
        logits, pred_boxes = outputs.logits, outputs.boxes.float()
        batch, num_queries = logits.shape[:2]
        sizes = [len(t["boxes"]) for t in targets]
        empty = torch.empty(0, dtype=torch.int64)
        if max(sizes, default=0) == 0:
            return [(empty, empty) for _ in range(batch)]
        longest = max(sizes)
        labels = logits.new_zeros((batch, longest), dtype=torch.int64)
        # Padding boxes are valid (non-degenerate) so the GIoU stays finite; their columns are dropped.
        boxes = pred_boxes.new_tensor([0.5, 0.5, 1.0, 1.0]).repeat(batch, longest, 1)
        token_maps = (logits.new_zeros((batch, longest, logits.shape[-1]), dtype=torch.float32)
                      if "token_map" in targets[0] else None)
        for index, (target, size) in enumerate(zip(targets, sizes)):
            labels[index, :size] = target["labels"]
            boxes[index, :size] = target["boxes"].float()
            if token_maps is not None:
                token_maps[index, :size] = target["token_map"]
        cost = (self.cost_bbox * torch.cdist(pred_boxes, boxes, p=1)
                + self.cost_class * self.class_cost(logits, labels, token_maps)
                - self.cost_giou * batched_generalized_box_iou(cxcywh_to_xyxy(pred_boxes), cxcywh_to_xyxy(boxes)))
        for extra in (self.mask_cost(outputs, targets, longest), self.keypoint_cost(outputs, targets, longest)):
            if extra is not None:
                cost = cost + extra
        return assign(cost.cpu(), sizes, self.num_groups(num_queries))  # the one device-to-host copy


def assign(cost: torch.Tensor, sizes: Sequence[int], groups: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The Hungarian assignment on the host: cost [B, Q, T_max] on the CPU (image b's first ``sizes[b]`` columns
    are its targets), the queries in ``groups`` equal groups each matched on its own (Group DETR) → per image
    (query indices, target indices), int64 on the CPU, sorted by query index within each group. A cost with NaN
    or infinite values raises FloatingPointError."""
    if not torch.isfinite(cost).all():
        raise FloatingPointError(
            "the matching cost has NaN or infinite values: the model's predictions are not finite "
            "(diverged training; lower the learning rate or check the inputs)"
        )
    group_size = cost.shape[1] // groups
    indices = []
    for index, size in enumerate(sizes):
        rows, cols = [], []
        for group in range(groups):
            block = cost[index, group * group_size:(group + 1) * group_size, :size].numpy()
            group_rows, group_cols = linear_sum_assignment(block)
            rows.append(group_rows + group * group_size)
            cols.append(group_cols)
        indices.append((torch.as_tensor(np.concatenate(rows), dtype=torch.int64),
                        torch.as_tensor(np.concatenate(cols), dtype=torch.int64)))
    return indices
