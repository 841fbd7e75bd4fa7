"""The loss part of GroupPose keypoints (:mod:`detr.models.layers.keypoint_head`): the rfdetr package's keypoint
terms (:mod:`detr.loss.keypoint_terms`: L1, findable and visible BCE, Gaussian NLL) of the matched queries, each
summed over the matched targets and divided by num_boxes (× query groups), for the last decoder layer, every earlier
one (``_i``) and the encoder proposals (``_enc``), as the package's ``SetCriterion.loss_keypoints``.
"""

from __future__ import annotations

import torch

from detr.loss.criterion import LossContext, LossPart
from detr.loss.keypoint_terms import TERMS, keypoint_losses
from detr.loss.terms import Targets, matched_query_index
from detr.models.layers.keypoint_head import KeypointSchema
from detr.models.outputs import DetectorOutput, LayerOutput


class KeypointLoss(LossPart):
    """loss_keypoints_{l1,findable,visible,nll} of the matched queries' keypoints: the last decoder layer's, each
    earlier layer's (suffix ``_i``, on its own matches) and the encoder proposals' (``_enc``, on the proposals'
    matches with the targets' classes), each summed over the pairs and divided by num_boxes × query groups.

    Targets need ``keypoints`` [T, K_max, 3] (see the module's docstring) beside ``labels`` and ``boxes``.

    Args:
        num_keypoints_per_class: the head's schema. num_decoder_layers: the decoder's layers (one suffix each).
        loss_l1, loss_findable, loss_visible, loss_nll: the weights (1 each: the package's keypoint recipe).
    """

    output_field = "keypoints"

    def __init__(self, num_keypoints_per_class: tuple[int, ...] | list[int], num_decoder_layers: int = 6, *,
                 loss_l1: float = 1.0, loss_findable: float = 1.0, loss_visible: float = 1.0,
                 loss_nll: float = 1.0) -> None:
        super().__init__()
        self.schema = KeypointSchema(tuple(num_keypoints_per_class))
        self.suffixes = ["", *(f"_{layer}" for layer in range(num_decoder_layers - 1)), "_enc"]
        weights = dict(zip(TERMS, (loss_l1, loss_findable, loss_visible, loss_nll)))
        self.weight_dict = {f"loss_keypoints_{term}{suffix}": weights[term] for suffix in self.suffixes
                            for term in TERMS}

    def terms(self, layer: LayerOutput, targets: Targets, indices, num_boxes: torch.Tensor) -> list[torch.Tensor]:
        """The four terms of one layer's keypoints on its matches ``indices``, summed and divided by num_boxes."""
        batch_index, query_index = matched_query_index(indices)
        keypoints = layer.keypoints[batch_index, query_index]  # [N, C_k · K_max, 8]
        device = keypoints.device
        picked = [(target, tgt.to(target["labels"].device)) for target, (_, tgt) in zip(targets, indices)]
        target_keypoints = torch.cat([t["keypoints"][tgt] for t, tgt in picked]).to(device)
        labels = torch.cat([t["labels"][tgt] for t, tgt in picked]).to(device)
        boxes = torch.cat([t["boxes"][tgt] for t, tgt in picked]).to(device)
        values = keypoint_losses(keypoints, target_keypoints, labels, boxes[:, 2] * boxes[:, 3], self.schema)
        return [value.sum() / num_boxes for value in values]

    def forward(self, outputs: DetectorOutput, targets: Targets, num_boxes: torch.Tensor,
                context: LossContext | None = None) -> dict[str, torch.Tensor]:
        """outputs: a model's output whose layers carry ``keypoints``; num_boxes: the batch's target count, reduced
        across processes; context: the criterion's matches (required)."""
        if outputs.keypoints is None:
            return self.zeros(outputs)
        if context is None:
            raise ValueError("KeypointLoss scores the criterion's matches: call it through SetCriterion")
        groups = context.criterion.matcher.num_groups(outputs.logits.shape[1])
        losses = self.zeros(outputs)
        layers = list(zip(context.layer_indices, outputs.layers))
        pairs = [(suffix, layer, indices)
                 for suffix, (indices, layer) in zip(self.suffixes, [layers[-1], *layers[:-1]])]
        if outputs.proposals is not None and outputs.proposals.keypoints is not None:
            indices = (context.part_indices.get("proposals") or [context.criterion.matcher(outputs.proposals,
                                                                                           targets)])[0]
            pairs.append(("_enc", outputs.proposals, indices))
        for suffix, layer, indices in pairs:
            if layer.keypoints is None:
                continue
            values = self.terms(layer, targets, indices, num_boxes * groups)
            losses.update({f"loss_keypoints_{term}{suffix}": value for term, value in zip(TERMS, values)})
        return losses
