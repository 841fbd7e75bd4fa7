"""D-FINE's losses of boxes refined as edge distributions (Peng et al., "D-FINE", ICLR 2025, §3.2-3.3; the
authors' DFINECriterion ``loss_local``): a part of :class:`detr.loss.criterion.SetCriterion`.

- **FGL**, fine-grained localisation (§3.2): each matched query's four edge distributions are pulled towards
  the target's edge distances from b⁰ (:func:`edge_targets`: the two bins of W around the distance, weighted by
  closeness), cross-entropy weighted by the query's box IoU with its target, summed and divided by the box count.
- **DDF**, decoupled distillation focal (GO-LSD, §3.3): every earlier layer's distributions distil the last
  layer's (KL at temperature 5, × 25), weighted by the IoU for matched queries and by the last layer's best class
  probability for the others; the matched and unmatched means are mixed in the ratio √(matched) : √(unmatched)
  of the selected queries' edges (the denoising queries reuse that ratio, as the authors' code does).
- the first layer's plain-head predictions (``_pre``) as one more layer, with the criterion's terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detr.box_ops import cxcywh_to_xyxy, elementwise_box_iou
from detr.loss.criterion import LossContext, LossPart, SetCriterion
from detr.loss.parts import denoising_indices
from detr.loss.terms import Indices, Targets, matched_boxes, matched_query_index
from detr.models.outputs import DetectorOutput, DistributionOutput, LayerOutput

#: The self-distillation's temperature (the authors' T).
TEMPERATURE = 5.0


@torch.no_grad()
def edge_targets(initial: torch.Tensor, target_xyxy: torch.Tensor, project: torch.Tensor, reg_scale: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target distributions of the edges (the authors' ``bbox2distance`` and ``translate_gt``).

    Args:
        initial: b⁰ [N, 4] normalised cxcywh; target_xyxy: the targets [N, 4] normalised xyxy.
        project: W(n) [M + 1] (M = max_num_bins); reg_scale: [1].

    Returns, per edge [4 N] (left, top, right, bottom of each pair): the left bin as a float index in
    [0, M - 0.1] and the weights of the right and left bins (summing to 1; a distance beyond W's range
    puts all on the end bin).
    """
    num_bins = project.shape[0] - 1
    scale = reg_scale.abs()
    centre, size = initial[:, :2], initial[:, 2:] / scale + 1e-16
    distances = torch.cat([(centre - target_xyxy[:, :2]) / size, (target_xyxy[:, 2:] - centre) / size], 1)
    distances = (distances - 0.5 * scale).reshape(-1)  # [4N]: left, top, right, bottom of each pair
    left = ((project[None, :] - distances[:, None]) <= 0).sum(1).float() - 1  # the last bin at or below
    below_range, beyond = left < 0, left >= num_bins
    inside = ~below_range & ~beyond
    # every edge computes its two bins' weights (masks select, no indexing by mask: a GPU step does not wait)
    index = left.clamp(min=0, max=num_bins - 1).long()
    below, above = (distances - project[index]).abs(), (project[index + 1] - distances).abs()
    fraction = below / (below + above)
    weight_right = torch.where(inside, fraction, torch.where(beyond, 1.0, 0.0))
    weight_left = torch.where(inside, 1 - fraction, torch.where(below_range, 1.0, 0.0))
    left = torch.where(below_range, 0.0, torch.where(beyond, num_bins - 0.1, left))
    return left.clamp(min=0, max=num_bins - 0.1), weight_right, weight_left


def localization_loss(corners: torch.Tensor, boxes: torch.Tensor, distributions: DistributionOutput,
                      targets: Targets, indices: Indices, num_boxes: float | torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """FGL of one layer on given pairs, and the pairs' IoUs [N] (detached: the weights).

    corners: the layer's edge logits [B, Q, 4 (M + 1)]; boxes: its boxes [B, Q, 4] cxcywh."""
    bins = distributions.project.shape[0]
    batch_index, query_index = matched_query_index(indices)
    predicted, target = matched_boxes(boxes, targets, indices)
    iou = elementwise_box_iou(cxcywh_to_xyxy(predicted), cxcywh_to_xyxy(target)).detach()  # [N]
    logits = corners[batch_index, query_index].float().reshape(-1, bins)  # [4N, M + 1]
    initial = distributions.initial[batch_index, query_index].float()
    left, weight_right, weight_left = edge_targets(initial, cxcywh_to_xyxy(target), distributions.project.float(),
                                                   distributions.reg_scale.float())
    left = left.long()
    loss = (F.cross_entropy(logits, left, reduction="none") * weight_left
            + F.cross_entropy(logits, left + 1, reduction="none") * weight_right)
    return (loss * iou.repeat_interleave(4)).sum() / num_boxes, iou


def distillation_loss(corners: torch.Tensor, teacher_corners: torch.Tensor, teacher_logits: torch.Tensor,
                      indices: Indices, iou: torch.Tensor, balance: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """DDF of one layer against the last (the teacher, detached), and the √-count balance it used.

    corners, teacher_corners [B, Q, 4 (M + 1)]; teacher_logits [B, Q, K]; iou [N]: the pairs' (in the order of
    ``indices``). ``balance``: (√ matched edges, √ unmatched edges) to use instead of this layer's own."""
    bins = corners.shape[-1] // 4
    weight = teacher_logits.detach().float().sigmoid().amax(-1)  # [B, Q]
    matched = torch.zeros_like(weight, dtype=torch.bool)
    batch_index, query_index = matched_query_index(indices)
    matched[batch_index, query_index] = True
    weight[batch_index, query_index] = iou.to(weight)
    weight, matched = weight.repeat_interleave(4, -1).flatten(), matched.repeat_interleave(4, -1).flatten()
    student = F.log_softmax(corners.float().reshape(-1, bins) / TEMPERATURE, -1)
    teacher = F.softmax(teacher_corners.detach().float().reshape(-1, bins) / TEMPERATURE, -1)
    loss = weight * TEMPERATURE ** 2 * F.kl_div(student, teacher, reduction="none").sum(-1)  # [4 B Q]
    matched_count = matched.sum()
    unmatched_count = matched.numel() - matched_count
    if balance is None:
        balance = (matched_count.float().sqrt(), unmatched_count.float().sqrt())
    # the means over the matched and the unmatched edges (0 where there are none), by masks: no host sync
    positive = torch.where(matched, loss, 0.0).sum() / matched_count.clamp(min=1)
    negative = torch.where(matched, 0.0, loss).sum() / unmatched_count.clamp(min=1)
    return (positive * balance[0] + negative * balance[1]) / (balance[0] + balance[1]), balance


class DistributionLoss(LossPart):
    """loss_fgl (the last layer), loss_fgl_i and loss_ddf_i (earlier layer i), loss_{ce,bbox,giou}_pre (the first
    layer's plain head), and the same of the denoising queries (``_dn``, ``_dn_i``, ``_dn_pre``) on their fixed
    pairs. Each layer's FGL and DDF use its own Hungarian matches (:class:`LossContext`), or GO-LSD's union of
    every layer's where the criterion makes one (``matching_union``, then divided by the union's pair count); the
    box count divides FGL (× denoising groups for the denoising queries).

    Args:
        num_decoder_layers: the criterion's layer count. loss_fgl, loss_ddf: the weights (0.15, 1.5: the authors').
        loss_ce, loss_bbox, loss_giou: the ``_pre`` terms' weights (the main terms').
    """

    output_field = "distributions"

    def __init__(self, num_decoder_layers: int = 6, *, loss_fgl: float = 0.15, loss_ddf: float = 1.5,
                 loss_ce: float = 1.0, loss_bbox: float = 5.0, loss_giou: float = 2.0) -> None:
        super().__init__()
        self.num_decoder_layers = num_decoder_layers
        earlier = [f"_{layer}" for layer in range(num_decoder_layers - 1)]
        pre = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        self.weight_dict = {}
        for prefix in ("", "_dn"):
            self.weight_dict[f"loss_fgl{prefix}"] = loss_fgl
            self.weight_dict.update({f"loss_fgl{prefix}{suffix}": loss_fgl for suffix in earlier})
            self.weight_dict.update({f"loss_ddf{prefix}{suffix}": loss_ddf for suffix in earlier})
            self.weight_dict.update({f"{name}{prefix}_pre": weight for name, weight in pre.items()})

    def match(self, outputs: DetectorOutput, targets: Targets, criterion: SetCriterion) -> list[Indices]:
        """The first layer's plain-head matches (they join GO-LSD's union, as the authors' ``pre_outputs``)."""
        if outputs.distributions is None:
            return []
        return [criterion.matcher(outputs.distributions.pre, targets)]

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        """outputs: the model's output (``distributions``, and ``denoising.distributions`` where denoising);
        num_boxes: reduced across processes, at least 1; context: the criterion and every layer's matches."""
        losses = self.zeros(outputs)
        if outputs.distributions is None:
            return losses
        if context is None:
            raise ValueError("DistributionLoss reads its criterion's matches: call it through SetCriterion")
        layers = outputs.layers
        if context.union is not None:  # GO-LSD: every layer's localisation on the union of the matches
            union, union_num_boxes = context.union
            balance = self._layers(losses, "", outputs.distributions, layers, [union] * len(layers), targets,
                                   union_num_boxes)
        else:
            balance = self._layers(losses, "", outputs.distributions, layers, context.layer_indices, targets,
                                   num_boxes)
        (pre_indices,) = context.part_indices.get(self.output_field) or self.match(outputs, targets, context.criterion)
        pre = context.criterion.assigned_losses(outputs.distributions.pre, targets, pre_indices, num_boxes,
                                                boxes_on=context.union)
        losses.update({f"{name}_pre": pre[name] for name in ("loss_ce", "loss_bbox", "loss_giou")})
        denoising = outputs.denoising
        if denoising is not None and denoising.distributions is not None:
            indices = denoising_indices(denoising.meta, targets)
            dn_num_boxes = num_boxes * denoising.meta.num_groups
            dn_layers = [*denoising.aux, LayerOutput(denoising.logits, denoising.boxes)]
            self._layers(losses, "_dn", denoising.distributions, dn_layers, [indices] * len(dn_layers), targets,
                         dn_num_boxes, balance)
            pre = context.criterion.assigned_losses(denoising.distributions.pre, targets, indices, dn_num_boxes)
            losses.update({f"{name}_dn_pre": pre[name] for name in ("loss_ce", "loss_bbox", "loss_giou")})
        return losses

    def _layers(self, losses: dict[str, torch.Tensor], prefix: str, distributions: DistributionOutput,
                layers: list[LayerOutput], indices: list[Indices], targets: Targets, num_boxes: torch.Tensor,
                balance: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """FGL of every layer and DDF of the earlier ones into ``losses``; the last balance DDF used."""
        corners = distributions.corners[-len(layers):]
        teacher_corners, teacher_logits = corners[-1], layers[-1].logits
        for layer, (output, layer_corners, layer_indices) in enumerate(zip(layers, corners, indices)):
            last = layer == len(layers) - 1
            suffix = "" if last else f"_{layer}"
            fgl, iou = localization_loss(layer_corners, output.boxes, distributions, targets, layer_indices, num_boxes)
            losses[f"loss_fgl{prefix}{suffix}"] = fgl
            if not last:
                losses[f"loss_ddf{prefix}{suffix}"], own = distillation_loss(
                    layer_corners, teacher_corners, teacher_logits, layer_indices, iou, balance if prefix else None)
                if not prefix:
                    balance = own
        return balance
