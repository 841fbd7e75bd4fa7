"""The keypoint losses and matching costs of GroupPose keypoints (:mod:`detr.models.layers.keypoint_head`), as the
rfdetr package (1.8.0, ``compute_l1_keypoint_loss``, ``compute_keypoint_matching_cost``) computes them: what the
loss part (:class:`detr.loss.keypoints.KeypointLoss`) and the matcher (:class:`detr.loss.matcher.HungarianMatcher`)
read.

Predictions are the head's padded layout, ``[..., C_k · K_max, 8]`` (x, y normalised; findable and visible logits;
log l11, l21, log l22 of the precision's Cholesky factor; class); targets hold ``keypoints`` float ``[T, K_max, 3]``:
x, y normalised to the image as the boxes, and COCO's visibility v (0 not labelled, 1 labelled but hidden, 2
visible), class c's keypoints in its first K_c rows. Per target of class c, over its K_c keypoints:

- l1: Σ |Δx| + |Δy| over the labelled keypoints (v > 0) / their count / √area (area: the target box's w · h);
- findable, visible: binary cross-entropy of channels 2 and 3 against v > 0 and v = 2, mean over the K_c;
- nll: the Gaussian negative log-likelihood without its constant, ½ · |L^T Δ|² / area − (log l11 + log l22), mean
  over the labelled keypoints (unclamped: it may be negative).

Non-finite values are kept out as the package does (``nan_to_num`` and masks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detr.models.layers.keypoint_head import KeypointSchema

#: The four terms, in the order the functions return them.
TERMS = ("l1", "findable", "visible", "nll")


def _per_class(keypoints: torch.Tensor, schema: KeypointSchema) -> torch.Tensor:
    """[..., C_k · K_max, D] → [..., C_k, K_max, D]."""
    if keypoints.shape[-2] != schema.num_classes * schema.max_count or keypoints.shape[-1] < 7:
        raise ValueError(f"keypoint predictions must be [..., {schema.num_classes * schema.max_count}, >= 7] for "
                         f"num_keypoints_per_class {list(schema.counts)}, got {tuple(keypoints.shape)}")
    return keypoints.unflatten(-2, (schema.num_classes, schema.max_count))


def check_keypoint_labels(labels: torch.Tensor, schema: KeypointSchema) -> None:
    """Raise ValueError if a target's class (``labels`` int64 [T]) has no keypoint count in ``schema``."""
    if len(labels) and int(labels.max()) >= schema.num_classes:
        raise ValueError(f"a target of class {int(labels.max())} has no keypoint count: num_keypoints_per_class "
                         f"{list(schema.counts)} covers classes 0-{schema.num_classes - 1}; list every class (0 for "
                         "a class without keypoints)")


def _check_labels(labels: torch.Tensor, schema: KeypointSchema) -> None:
    """:func:`check_keypoint_labels` for labels on the CPU; on a GPU the training system checks them on the host
    before the batch moves there (:meth:`detr.lightning.system.DetrSystem.on_before_batch_transfer`), so that a
    step does not wait to read them back."""
    if labels.device.type == "cpu":
        check_keypoint_labels(labels, schema)


def _gaussian_nll(delta: torch.Tensor, precision: torch.Tensor, area: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """delta [..., 2] float32 (prediction − target), precision [..., 3] float32 (log l11, l21, log l22), area
    broadcast to [...] → ½ |L^T Δ|² / area − log l11 − log l22 [...], non-finite values replaced as the package
    does, and where u, |u|² are finite."""
    log_l11, l21, log_l22 = precision.unbind(-1)
    u0 = log_l11.exp() * delta[..., 0] + l21 * delta[..., 1]
    u1 = log_l22.exp() * delta[..., 1]
    squared = u0 * u0 + u1 * u1
    finite = torch.isfinite(u0) & torch.isfinite(u1) & torch.isfinite(squared)
    nll = 0.5 * (squared / area) - (log_l11 + log_l22)
    return torch.nan_to_num(nll, nan=0.0, posinf=0.0, neginf=torch.finfo(nll.dtype).min), finite


def keypoint_losses(keypoints: torch.Tensor, target_keypoints: torch.Tensor, labels: torch.Tensor,
                    areas: torch.Tensor, schema: KeypointSchema) -> tuple[torch.Tensor, ...]:
    """Per matched pair: keypoints [N, C_k · K_max, ≥ 7] (padded), target_keypoints [N, K_max, 3], labels int64 [N],
    areas [N] (normalised box w · h) → (l1, findable, visible, nll), each [N] (see the module's docstring)."""
    _check_labels(labels, schema)
    selected = _per_class(keypoints, schema)[torch.arange(len(labels), device=labels.device), labels]  # [N, Km, D]
    dtype = selected.dtype
    active = schema.active(labels.device)[labels]  # [N, K_max]
    area = areas.to(torch.float32)
    eps = torch.finfo(area.dtype).eps
    finite_xy = torch.isfinite(selected[..., :2]).all(-1) & torch.isfinite(target_keypoints[..., :2]).all(-1)
    labelled = torch.isfinite(target_keypoints[..., 2]) & (target_keypoints[..., 2] > 0)
    located = active & labelled & finite_xy & (torch.isfinite(area) & (area > eps))[:, None]  # [N, K_max]
    located_count = located.sum(-1).to(dtype).clamp(min=1)
    per_class_count = active.sum(-1).to(dtype).clamp(min=1)
    distance = F.l1_loss(selected[..., :2], target_keypoints[..., :2], reduction="none").sum(-1)
    l1 = (distance * located.to(dtype) / area.clamp_min(eps).sqrt()[:, None]).sum(-1) / located_count

    def bce(channel: int, target: torch.Tensor) -> torch.Tensor:
        loss = F.binary_cross_entropy_with_logits(selected[..., channel], target.to(dtype), reduction="none")
        return (loss * active.to(dtype)).sum(-1) / per_class_count

    findable = bce(2, target_keypoints[..., 2] > 0)
    visible = bce(3, target_keypoints[..., 2] > 1)
    precision = selected[..., 4:7].to(torch.float32)
    nll, finite = _gaussian_nll((selected[..., :2] - target_keypoints[..., :2]).to(torch.float32), precision,
                                area.clamp_min(eps)[:, None])
    scored = located & torch.isfinite(precision).all(-1) & finite
    scored_count = scored.sum(-1).to(dtype)
    nll = nll.masked_fill(~scored, 0.0).sum(-1) / scored_count.clamp(min=1)
    nll = torch.where(scored_count <= 0, torch.zeros_like(nll), nll)
    return l1, findable, visible, nll


def _pairwise_bce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [P, K], targets [T, K] in {0, 1} → [P, T]: Σ_k BCE-with-logits of each pair."""
    return F.softplus(logits).sum(1, keepdim=True) - logits @ targets.to(logits.dtype).t()


def keypoint_matching_costs(keypoints: torch.Tensor, target_keypoints: torch.Tensor, labels: torch.Tensor,
                            areas: torch.Tensor, schema: KeypointSchema) -> tuple[torch.Tensor, ...]:
    """Every query against every target of the batch: keypoints [B, Q, C_k · K_max, ≥ 7], target_keypoints
    [T, K_max, 3], labels int64 [T], areas [T] → (l1, findable, visible, nll) costs, each [B, Q, T]: the losses'
    terms with the query read as the target's class (findable and visible: the sum over K_c / K_c)."""
    _check_labels(labels, schema)
    batch, queries = keypoints.shape[:2]
    per_class = _per_class(keypoints, schema).flatten(0, 1)  # [B·Q, C_k, K_max, D]
    costs = [keypoints.new_zeros((batch * queries, len(labels))) for _ in TERMS]
    # Each class's terms against every target, kept at that class's targets by a mask (the targets of one class
    # are not gathered: a GPU does not wait for the host to count them)
    for label, count in enumerate(schema.counts):
        if count == 0:
            continue
        predicted = per_class[:, label, :count]  # [P, K_c, D]
        target = target_keypoints[:, :count]  # [T, K_c, 3]
        area = areas.to(torch.float32)
        eps = torch.finfo(area.dtype).eps
        labelled = (torch.isfinite(target[..., 2]) & (target[..., 2] > 0) & torch.isfinite(target[..., :2]).all(-1)
                    & (torch.isfinite(area) & (area > eps))[:, None])  # [T, K_c]
        labelled_count = labelled.sum(1).to(torch.float32)
        divisor = labelled_count.clamp(min=1)
        delta = predicted[:, None, :, :2].to(torch.float32) - target[None, :, :, :2].to(torch.float32)  # [P, T, K_c, 2]
        distance = delta.abs().sum(-1).masked_fill(~labelled[None], 0.0).sum(-1)  # [P, T]
        l1 = torch.nan_to_num(distance / divisor / area.clamp_min(eps).sqrt(), nan=0.0, posinf=0.0, neginf=0.0)
        precision = predicted[..., 4:7].to(torch.float32)  # [P, K_c, 3]
        finite = torch.isfinite(predicted[..., :2].to(torch.float32)).all(-1) & torch.isfinite(precision).all(-1)
        nll, finite_u = _gaussian_nll(delta, precision[:, None], area.clamp_min(eps)[None, :, None])
        nll = nll.masked_fill(~(labelled[None] & finite[:, None] & finite_u), 0.0).sum(-1) / divisor
        nll = nll.masked_fill(~(labelled_count > 0)[None], 0.0)
        findable = _pairwise_bce(predicted[..., 2], target[..., 2] > 0) / float(count)
        visible = _pairwise_bce(predicted[..., 3], target[..., 2] > 1) / float(count)
        of_class = labels == label  # [T]
        costs = [torch.where(of_class, value.to(cost.dtype), cost)
                 for cost, value in zip(costs, (l1, findable, visible, nll))]
    return tuple(cost.view(batch, queries, len(labels)) for cost in costs)
