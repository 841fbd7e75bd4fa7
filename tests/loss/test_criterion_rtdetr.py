"""RT-DETR's loss as parts of the one criterion, against transformers' RTDetrForObjectDetectionLoss on the same
predictions and targets: the varifocal class loss, L1 and GIoU of the last layer, the auxiliary layers, the
selected encoder proposals and the contrastive denoising groups, with the recipe's costs and weights."""

from __future__ import annotations

import pytest
import torch

from detr.loss.build import build_criterion
from detr.loss.focal import varifocal_loss
from detr.models.config import DetrConfig
from detr.models.outputs import DenoisingMeta, DenoisingOutput, DetectorOutput
from tests.helpers_rtdetr import RECIPE, loss_targets, random_layer

NUM_CLASSES, NUM_QUERIES, LAYERS = 4, 12, 3
CONFIG = DetrConfig(architecture="rtdetr", class_head="sigmoid", backbone="resnet18", num_classes=NUM_CLASSES,
                    num_queries=NUM_QUERIES, num_decoder_layers=LAYERS, denoising=True, pretrained_backbone=False)
def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]], meta: DenoisingMeta
            ) -> dict[str, torch.Tensor]:
    """transformers' loss on the same predictions, laid out as its model hands them over (every layer's
    denoising queries ahead of the selected ones)."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_rt_detr import RTDetrForObjectDetectionLoss

    from detr.loss.parts import denoising_indices

    dn_layers = [*outputs.denoising.aux, outputs.denoising]
    layers = [*outputs.aux, outputs]
    classes = torch.stack([torch.cat([d.logits, m.logits], 1) for d, m in zip(dn_layers, layers)], 1)  # [B, L, D+Q, K]
    coords = torch.stack([torch.cat([d.boxes, m.boxes], 1) for d, m in zip(dn_layers, layers)], 1)
    config = transformers.RTDetrConfig(num_labels=NUM_CLASSES)
    dn_meta = {"dn_positive_idx": [queries for queries, _ in denoising_indices(meta, targets)],
               "dn_num_group": meta.num_groups, "dn_num_split": [meta.num_queries, NUM_QUERIES]}
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    _, losses, _ = RTDetrForObjectDetectionLoss(
        logits=classes[:, -1], labels=labels, device="cpu", pred_boxes=coords[:, -1], config=config,
        outputs_class=classes, outputs_coord=coords, enc_topk_logits=outputs.proposals.logits,
        enc_topk_bboxes=outputs.proposals.boxes, denoising_meta_values=dn_meta)
    return losses


def _our_name(name: str) -> str:
    """transformers' term name → ours (loss_vfl is our loss_ce; its aux layer L-1 is our encoder proposals; its
    denoising layers count every layer, ours name the last one plain)."""
    name = name.replace("loss_vfl", "loss_ce")
    if name.endswith(f"_aux_{LAYERS - 1}"):
        return name.replace(f"_aux_{LAYERS - 1}", "_enc")
    if name.endswith(f"_dn_{LAYERS - 1}"):
        return name.replace(f"_dn_{LAYERS - 1}", "_dn")
    return name.replace("_aux_", "_")


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
    theirs = _theirs(outputs, targets, meta)

    weighted = {_our_name(name): value for name, value in theirs.items()}
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
