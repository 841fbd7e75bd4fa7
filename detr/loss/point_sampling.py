"""Mask terms on sampled points (PointRend, Kirillov et al. 2020; Mask2Former, Cheng et al. 2022, §3.3), as RF-DETR's
authors train its masks (rf-detr's ``segmentation_head.py`` and ``lwdetr.py``, transformers' ``loss_rf_detr.py``).

Instead of upsampling every matched mask to the image, each mask is read at P points: the loss's points chosen by
importance (:func:`uncertain_points`: of ``oversample_ratio`` · P random points the ``importance_sample_ratio`` · P
whose logits are nearest 0, and the rest uniform), the matcher's P uniform points shared by every query and target.
Points are (x, y) in [0, 1] of the padded batch; logits are read bilinearly, targets by their nearest pixel, with
the border value outside the outermost pixel centres (the authors' ``point_sample``; transformers pads with zeros).

A layer's masks come as :class:`~detr.models.outputs.MaskFeatures` (training: the logits' two factors, so that only
the matched queries' maps are built and the matcher reads every query at its points alone) or as dense logits
``[B, Q, h, w]`` (evaluation); :data:`MaskSource` is either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detr.loss.terms import Indices, Targets
from detr.models.outputs import MaskFeatures

#: A layer's mask logits: as factors (training) or dense [B, Q, h, w] (evaluation).
MaskSource = MaskFeatures | torch.Tensor


def point_sample(maps: torch.Tensor, points: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """maps [N, C, H, W] read at points [N, P, 2] ((x, y) in [0, 1]) → [N, C, P], in float32 (the loss's
    precision: a model trained under bf16 autocast hands bf16 maps to a loss computed without it)."""
    grid = 2.0 * points[:, :, None].float() - 1.0  # [N, P, 1, 2] in grid_sample's [-1, 1]
    return F.grid_sample(maps.float(), grid, mode=mode, padding_mode="border", align_corners=False)[..., 0]


@torch.no_grad()
def uncertain_points(logits: torch.Tensor, num_points: int, oversample_ratio: float = 3.0,
                     importance_sample_ratio: float = 0.75) -> torch.Tensor:
    """Points [N, P, 2] for masks logits [N, 1, h, w]: of ``oversample_ratio`` · P uniform random points, the
    ``importance_sample_ratio`` · P whose logit is nearest 0 (uncertainty −|logit|, read at the point, not on the
    grid), then uniform random points for the rest (PointRend's ``get_uncertain_point_coords_with_randomness``;
    its draws from torch's global generator, in its order)."""
    count = logits.shape[0]
    candidates = torch.rand(count, int(num_points * oversample_ratio), 2, device=logits.device)
    uncertainty = -point_sample(logits, candidates).abs()  # [N, 1, kP]
    num_uncertain = int(importance_sample_ratio * num_points)
    chosen = uncertainty[:, 0].topk(num_uncertain, dim=1).indices  # [N, P_u]
    points = candidates.gather(1, chosen[..., None].expand(-1, -1, 2))
    if num_points > num_uncertain:
        points = torch.cat([points, torch.rand(count, num_points - num_uncertain, 2, device=logits.device)], 1)
    return points


def logits_at_points(source: MaskSource, points: torch.Tensor) -> torch.Tensor:
    """Every query's mask logit at points [P, 2] shared by the batch → [B, Q, P] (the matcher's read)."""
    if isinstance(source, MaskFeatures):
        pixels = point_sample(source.pixels, points[None].expand(len(source.pixels), -1, -1))  # [B, C, P]
        return torch.einsum("bcp,bqc->bqp", pixels, source.queries.float()) + source.bias.float()
    return point_sample(source, points[None].expand(len(source), -1, -1))  # queries as channels


def matched_mask_logits(source: MaskSource, indices: Indices) -> torch.Tensor:
    """The matched queries' full mask logits [N, h, w], in the order of the matches (image by image): only these
    maps are built from factors."""
    maps = []
    for image, (queries, _) in enumerate(indices):
        queries = queries.to(source.pixels.device if isinstance(source, MaskFeatures) else source.device)
        if isinstance(source, MaskFeatures):
            maps.append(torch.einsum("qc,chw->qhw", source.queries[image, queries].float(),
                                     source.pixels[image].float()) + source.bias.float())
        else:
            maps.append(source[image, queries])
    return torch.cat(maps)


def padded_size(targets: Targets) -> tuple[int, int]:
    """The batch's padded (height, width): the largest of its target masks' (each image's processed size)."""
    return max(int(t["masks"].shape[-2]) for t in targets), max(int(t["masks"].shape[-1]) for t in targets)


def padded_masks(target: dict[str, torch.Tensor], index: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """One image's target masks ``index`` as float [n, H, W], zero-padded to the batch's size (bottom and right,
    as the images are padded)."""
    masks = target["masks"][index.to(target["masks"].device)].float()
    if masks.shape[-2:] == size:  # the usual case: RF-DETR's same-size squares
        return masks
    return F.pad(masks, (0, size[1] - masks.shape[-1], 0, size[0] - masks.shape[-2]))


def targets_at_points(targets: Targets, indices: Indices, points: torch.Tensor) -> torch.Tensor:
    """The matched targets' masks at each pair's points [N, P, 2] (nearest pixel) → float [N, P] (0 or 1)."""
    size, labels, start = padded_size(targets), [], 0
    for target, (_, index) in zip(targets, indices):
        masks = padded_masks(target, index, size).to(points)
        labels.append(point_sample(masks[:, None], points[start:start + len(index)], mode="nearest")[:, 0])
        start += len(index)
    return torch.cat(labels) if labels else points.new_zeros(0, points.shape[1])


def sigmoid_ce_loss(logits: torch.Tensor, labels: torch.Tensor, num_boxes: float | torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits, logits and labels [N, P]: the mean over each mask's points, summed over
    masks / num_boxes."""
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(1).sum() / num_boxes


def dice_loss(logits: torch.Tensor, targets: torch.Tensor, num_boxes: float | torch.Tensor) -> torch.Tensor:
    """DICE loss (Milletari et al., 2016), the mask analogue of 1 − IoU, summed over masks / num_boxes.

    logits, targets: float [N, P] (P pixels or points per mask; targets 0 or 1). Per mask, with p =
    sigmoid(logits): ``1 − (2 Σ p·t + 1) / (Σ p + Σ t + 1)``; the +1 keeps empty masks finite.
    """
    probabilities = logits.sigmoid()
    numerator = 2 * (probabilities * targets).sum(-1) + 1
    denominator = probabilities.sum(-1) + targets.sum(-1) + 1
    return (1 - numerator / denominator).sum() / num_boxes


def pairwise_sigmoid_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """:func:`sigmoid_ce_loss` of every prediction [Q, P] against every target [T, P] → cost [Q, T] (each pair's
    mean over the points)."""
    positive = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
    negative = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
    return (positive @ labels.T + negative @ (1 - labels).T) / logits.shape[1]


def pairwise_dice(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """:func:`dice_loss` of every prediction [Q, P] against every target [T, P] → cost [Q, T]."""
    probabilities = logits.sigmoid()
    numerator = 2 * probabilities @ labels.T + 1
    denominator = probabilities.sum(-1)[:, None] + labels.sum(-1)[None, :] + 1
    return 1 - numerator / denominator
