"""RT-DETR's loss as parts of the one criterion, against transformers' RTDetrForObjectDetectionLoss on the same
predictions and targets: the varifocal class loss, L1 and GIoU of the last layer, the auxiliary layers, the
selected encoder proposals and the contrastive denoising groups, with the recipe's costs and weights."""

from __future__ import annotations

import pytest
import torch

from detr.models.rtdetr.config import RTDETRConfig
from detr.loss.build import build_criterion
from detr.loss.focal import varifocal_loss

from detr.models.outputs import DenoisingMeta, DenoisingOutput, DetectorOutput
from tests.helpers_rtdetr import RECIPE, loss_targets, our_term_name, random_layer, transformers_loss_arguments

NUM_CLASSES, NUM_QUERIES, LAYERS = 4, 12, 3
CONFIG = RTDETRConfig(class_head="sigmoid", backbone="resnet18", num_classes=NUM_CLASSES, num_queries=NUM_QUERIES,
                      num_decoder_layers=LAYERS, denoising=True, pretrained_backbone=False, dim_feedforward=2048,
                      dropout=0.1, num_encoder_layers=6, num_feature_levels=4)
def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """transformers' loss on the same predictions."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_rt_detr import RTDetrForObjectDetectionLoss

    _, losses, _ = RTDetrForObjectDetectionLoss(**transformers_loss_arguments(outputs, targets), device="cpu",
                                                config=transformers.RTDetrConfig(num_labels=NUM_CLASSES))
    return losses


def test_rtdetr_loss_is_transformers():
    targets = loss_targets(NUM_CLASSES)
    generator = torch.Generator().manual_seed(0)
    meta = DenoisingMeta(num_groups=4, group_size=2 * 3)  # 4 groups of a positive and a negative copy of 3 slots
    batch = len(targets)
    layers = [random_layer(NUM_CLASSES, batch, NUM_QUERIES, generator) for _ in range(LAYERS)]
    dn_layers = [random_layer(NUM_CLASSES, batch, meta.num_queries, generator) for _ in range(LAYERS)]
    outputs = DetectorOutput(layers[-1].logits, layers[-1].boxes, aux=layers[:-1],
                             proposals=random_layer(NUM_CLASSES, batch, NUM_QUERIES, generator), class_head="sigmoid",
                             denoising=DenoisingOutput(dn_layers[-1].logits, dn_layers[-1].boxes, aux=dn_layers[:-1],
                                                       meta=meta))
    criterion = build_criterion(CONFIG, **RECIPE)
    ours = criterion(outputs, targets)
    theirs = _theirs(outputs, targets)

    weighted = {our_term_name(name, LAYERS): value for name, value in theirs.items()}
    assert set(weighted) == set(criterion.weight_dict)
    differences = {name: abs(float(ours[name] * criterion.weight_dict[name] - value))
                   for name, value in weighted.items()}
    assert max(differences.values()) <= 1e-5, differences
    total = sum(ours[name] * weight for name, weight in criterion.weight_dict.items())
    assert total.item() == pytest.approx(sum(theirs.values()).item(), abs=1e-5)


def test_varifocal_loss_scores_positives_by_their_iou():
    logits = torch.tensor([[2.0, -1.0], [0.5, -3.0]])
    onehot = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    for iou in (0.2, 0.9):
        scores = onehot * iou
        loss = varifocal_loss(logits, onehot, scores, 1.0)
        probability = logits.sigmoid()
        # the positive: BCE towards the IoU, weighted by it; negatives: α p^γ · -log(1 - p)
        positive = -iou * (iou * probability[0, 0].log() + (1 - iou) * (1 - probability[0, 0]).log())
        negatives = (0.75 * probability.pow(2) * -(1 - probability).log())[onehot == 0].sum()
        assert loss.item() == pytest.approx((positive + negatives).item(), rel=1e-6)


def test_varifocal_needs_the_sigmoid_head():
    from detr.loss.criterion import SetCriterion

    with pytest.raises(ValueError, match="class_head='sigmoid'"):
        SetCriterion(NUM_CLASSES, varifocal=True)
