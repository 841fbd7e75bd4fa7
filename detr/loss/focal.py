"""Sigmoid focal classification: the loss and the matching cost that goes with it.

Focal loss (Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017) as Deformable DETR (Zhu et
al., ICLR 2021) and DAB-/DN-DETR use it in place of DETR's softmax with a "no object" class: every class
is an independent sigmoid; a query matched to a target of class c has the one-hot target e_c, every other
query the all-zero target. Down-weighting the many easy negatives (the unmatched queries) lets the
matched ones drive the classifier from the first steps, which is what a short training run needs
(docs/measurements/convergence.md).

RT-DETR trains the sigmoid head with the varifocal loss instead (:func:`varifocal_loss`), matched with the same
focal cost; RF-DETR and LW-DETR with the IoU-aware BCE (:func:`ia_bce_loss`).

A sigmoid head has ``num_classes`` logits, no "no object" logit (see :func:`detr.build_detr`'s
``class_head``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import sigmoid_focal_loss as _torchvision_sigmoid_focal_loss


def sigmoid_focal_loss(logits: torch.Tensor, targets: torch.Tensor, num_boxes: float | torch.Tensor, *,
                       alpha: float = 0.25, gamma: float = 2.0, where: torch.Tensor | None = None) -> torch.Tensor:
    """Focal loss summed over every element and divided by ``num_boxes`` (Deformable DETR's normalisation:
    its ``loss.mean(1).sum() / num_boxes * num_queries``).

    Per element, with p = sigmoid(logit) and t ∈ {0, 1}: ``-α_t (1 - p_t)^γ log(p_t)`` where
    p_t = p if t = 1 else 1 - p and α_t = α if t = 1 else 1 - α.

    Args:
        logits: float [..., num_classes] raw scores.
        targets: float, same shape, one-hot (all zero for unmatched queries).
        num_boxes: the batch's target count (already reduced across processes by the caller), ≥ 1.
        alpha, gamma: 0.25 and 2 in the papers.
        where: bool, same shape: sum these elements only (a grounding model's prompt tokens, whose other logits
            are −inf), selected by masks rather than indexing, so that a GPU step does not wait for the host.

    Returns a float scalar.
    """
    if where is None:
        return _torchvision_sigmoid_focal_loss(logits, targets, alpha=alpha, gamma=gamma, reduction="sum") / num_boxes
    loss = _torchvision_sigmoid_focal_loss(logits.masked_fill(~where, 0.0), targets, alpha=alpha, gamma=gamma,
                                           reduction="none")
    return torch.where(where, loss, 0.0).sum() / num_boxes


def focal_class_cost(logits: torch.Tensor, labels: torch.Tensor, *, alpha: float = 0.25,
                     gamma: float = 2.0) -> torch.Tensor:
    """Matching cost for a sigmoid focal head (Deformable DETR's matcher).

    The cost of giving target class c to a query is the focal loss it would pay as a positive minus the
    focal loss it pays now as a negative, for class c only:
    ``α (1 - p)^γ (-log p) - (1 - α) p^γ (-log(1 - p))`` with p = sigmoid(logit_c).

    Args:
        logits: float [B, Q, num_classes]; labels: int64 [B, T] (target classes, padded per image).

    Returns cost float32 [B, Q, T].
    """
    prob = logits.float().sigmoid()
    negative = (1 - alpha) * prob.pow(gamma) * -(1 - prob + 1e-8).log()
    positive = alpha * (1 - prob).pow(gamma) * -(prob + 1e-8).log()
    index = labels[:, None, :].expand(-1, prob.shape[1], -1)  # [B, Q, T]
    return positive.gather(2, index) - negative.gather(2, index)


def focal_token_cost(logits: torch.Tensor, token_maps: torch.Tensor, *, alpha: float = 0.25,
                     gamma: float = 2.0) -> torch.Tensor:
    """The focal matching cost of :func:`focal_class_cost` for targets named by spans of prompt tokens (Grounding
    DINO: a target's "class" is the phrase of the prompt that names it): the cost of each token, averaged over the
    target's tokens.

    Args:
        logits: float [B, Q, N] (a logit per prompt token; −inf outside the prompt gives p = 0);
        token_maps: float [B, T, N]: 1 at the tokens of each target's phrase, 0 elsewhere (padding targets: all 0).

    Returns cost float32 [B, Q, T] (0 for an all-zero map).
    """
    prob = logits.float().sigmoid()
    negative = (1 - alpha) * prob.pow(gamma) * -(1 - prob + 1e-8).log()
    positive = alpha * (1 - prob).pow(gamma) * -(prob + 1e-8).log()
    weights = token_maps.float() / token_maps.float().sum(-1, keepdim=True).clamp(min=1)  # mean over the span
    return (positive - negative) @ weights.transpose(1, 2)


def varifocal_loss(logits: torch.Tensor, onehot: torch.Tensor, scores: torch.Tensor, num_boxes: float | torch.Tensor,
                   *, alpha: float = 0.75, gamma: float = 2.0) -> torch.Tensor:
    """Varifocal loss (Zhang et al., "VarifocalNet", CVPR 2021), as RT-DETR trains its class head: binary
    cross-entropy towards an IoU-aware target, summed over every element and divided by ``num_boxes``.

    Per element, with p = sigmoid(logit) (detached in the weight): the target is ``scores`` (the IoU of the
    query's box with its matched target, at the target's class; 0 elsewhere) and the weight
    ``α p^γ (1 - onehot) + scores``: negatives are down-weighted like the focal loss, positives weighted by
    their IoU.

    Args:
        logits: float [..., num_classes] raw scores.
        onehot: float, same shape: 1 at each matched query's target class.
        scores: float, same shape: the IoU-aware target (``iou · onehot``), detached.
        num_boxes: the batch's target count (already reduced across processes by the caller), ≥ 1.
        alpha, gamma: 0.75 and 2 in RT-DETR.

    Returns a float scalar.
    """
    weight = alpha * logits.detach().sigmoid().pow(gamma) * (1 - onehot) + scores
    loss = F.binary_cross_entropy_with_logits(logits, scores, weight=weight, reduction="sum")
    return loss / num_boxes


def matchability_loss(logits: torch.Tensor, onehot: torch.Tensor, scores: torch.Tensor,
                      num_boxes: float | torch.Tensor, *, gamma: float = 1.5) -> torch.Tensor:
    """Matchability-aware loss (Huang et al., "DEIM: DETR with Improved Matching for Fast Convergence", CVPR 2025,
    §3.3; their ``loss_labels_mal``): binary cross-entropy towards IoU^γ at the matched queries' target class,
    summed over every element and divided by ``num_boxes``.

    Per element, with p = sigmoid(logit) (detached in the weight): the target is ``scores^γ`` and the weight
    ``p^γ (1 - onehot) + onehot``: negatives are down-weighted as the varifocal loss's (without α), positives all
    weigh 1 whatever their IoU, so a low-IoU match still learns a low score (the varifocal loss barely trains it).

    Args:
        logits: float [..., num_classes] raw scores.
        onehot: float, same shape: 1 at each matched query's target class.
        scores: float, same shape: the IoU of each matched query's box with its target at its class (0 elsewhere),
            detached.
        num_boxes: the batch's target count (already reduced across processes by the caller), ≥ 1.
        gamma: 1.5 in DEIM.

    Returns a float scalar.
    """
    weight = logits.detach().sigmoid().pow(gamma) * (1 - onehot) + onehot
    loss = F.binary_cross_entropy_with_logits(logits, scores.pow(gamma), weight=weight, reduction="sum")
    return loss / num_boxes


def ia_bce_loss(logits: torch.Tensor, onehot: torch.Tensor, scores: torch.Tensor, num_boxes: float | torch.Tensor,
                *, alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    """IoU-aware BCE (LW-DETR, Chen et al. 2024, §3.3, eq. 1; the authors' ``ia_bce_loss`` in rf-detr's
    ``SetCriterion.loss_labels``, transformers' ``LwDetrImageLoss.loss_labels``): binary cross-entropy summed over
    every element and divided by ``num_boxes``.

    Per element, with p = sigmoid(logit): at a matched query's target class the target is the IoU-aware score
    ``t = max(p^α · IoU^(1−α), 0.01)`` (detached) and the loss ``−t log p − (1 − t) log(1 − p)``; everywhere else
    ``−p^γ log(1 − p)``, whose weight p^γ keeps its gradient as in the authors' code. Computed through
    ``logsigmoid``, as the authors' (−log(1 − p) = logit − logsigmoid(logit)).

    Args:
        logits: float [..., num_classes] raw scores.
        onehot: float, same shape: 1 at each matched query's target class.
        scores: float, same shape: the IoU of each matched query's box with its target at that class (0 elsewhere),
            detached.
        num_boxes: the normaliser (the batch's target count, times the query groups; reduced across processes by
            the caller), ≥ 1.
        alpha, gamma: 0.25 and 2 in LW-DETR and RF-DETR.

    Returns a float scalar.
    """
    prob = logits.sigmoid()
    positive = onehot > 0
    quality = (prob.detach().pow(alpha) * scores.pow(1 - alpha)).clamp(min=0.01)
    positive_weight = torch.where(positive, quality, torch.zeros_like(prob))
    negative_weight = torch.where(positive, 1 - quality, prob.pow(gamma))
    loss = negative_weight * logits - F.logsigmoid(logits) * (positive_weight + negative_weight)
    return loss.sum() / num_boxes
