"""RF-DETR's and LW-DETR's loss as parts of the one criterion, against transformers' LwDetrForObjectDetectionLoss
(the function both RfDetrForObjectDetection and LwDetrForObjectDetection train with; the authors' rf-detr
``SetCriterion`` with ``ia_bce_loss``): the IoU-aware BCE class loss, L1 and GIoU of every decoder layer and of the
selected encoder proposals, Group DETR's groups matched one by one, with the recipe's costs and weights; on random
predictions, and on the predictions of the two models in training mode from the same weights."""

from __future__ import annotations

import pytest
import torch

import detr
from detr.loss.build import build_criterion
from detr.loss.focal import ia_bce_loss
from detr.models.config import DetrConfig
from detr.models.outputs import DetectorOutput, LayerOutput
from tests.helpers_rfdetr import hf_lwdetr, hf_model
from tests.helpers_rtdetr import RECIPE, loss_targets, random_layer, square_photos

NUM_CLASSES, NUM_QUERIES, GROUPS, LAYERS = 4, 6, 3, 3
CONFIG = DetrConfig(architecture="rfdetr", backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=1,
                    num_classes=NUM_CLASSES, num_queries=NUM_QUERIES, query_groups=GROUPS, num_decoder_layers=LAYERS)


def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]], groups: int,
            num_layers: int = LAYERS) -> dict[str, torch.Tensor]:
    """transformers' loss terms (unweighted) on the same predictions, as its models hand them over."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_lw_detr import LwDetrForObjectDetectionLoss

    layers = outputs.layers
    config = transformers.LwDetrConfig(num_labels=NUM_CLASSES, group_detr=groups, decoder_layers=num_layers)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    _, losses, _ = LwDetrForObjectDetectionLoss(
        logits=outputs.logits, labels=labels, device="cpu", pred_boxes=outputs.boxes, config=config,
        outputs_class=torch.stack([layer.logits for layer in layers]),
        outputs_coord=torch.stack([layer.boxes for layer in layers]),
        enc_outputs_class=outputs.proposals.logits, enc_outputs_coord=outputs.proposals.boxes)
    return losses


def _weighted_differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor],
                          weight_dict: dict[str, float]) -> dict[str, float]:
    """Every term transformers weighs (weights 1, 5, 2 there too) → |ours · weight − theirs · weight|."""
    trained = {name: value for name, value in theirs.items() if not name.startswith("cardinality_error")}
    assert set(trained) == set(weight_dict)
    return {name: abs(float((ours[name] - value).detach() * weight_dict[name])) for name, value in trained.items()}


def test_rfdetr_loss_is_transformers_on_random_predictions():
    targets = loss_targets(NUM_CLASSES)
    generator = torch.Generator().manual_seed(0)
    batch, queries = len(targets), GROUPS * NUM_QUERIES
    layers = [random_layer(NUM_CLASSES, batch, queries, generator) for _ in range(LAYERS)]
    for layer in layers:
        layer.logits.requires_grad_(True)
    outputs = DetectorOutput(layers[-1].logits, layers[-1].boxes, aux=layers[:-1],
                             proposals=random_layer(NUM_CLASSES, batch, queries, generator), class_head="sigmoid")
    criterion = build_criterion(CONFIG, **RECIPE)
    ours = criterion(outputs, targets)
    theirs = _theirs(outputs, targets, GROUPS)

    differences = _weighted_differences(ours, theirs, criterion.weight_dict)
    assert max(differences.values()) <= 1e-5, differences
    # the class loss's gradient too: the negatives' weight p^γ keeps its gradient in both
    for layer, name in zip(layers, ["loss_ce_0", "loss_ce_1", "loss_ce"]):
        ours_grad, = torch.autograd.grad(ours[name], layer.logits, retain_graph=True)
        theirs_grad, = torch.autograd.grad(theirs[name], layer.logits, retain_graph=True)
        assert torch.allclose(ours_grad, theirs_grad, atol=1e-7), name


def test_each_group_is_matched_on_its_own_and_the_terms_divide_by_groups():
    """Three identical groups: each is matched as the first is alone, so every term equals one group's."""
    targets = loss_targets(NUM_CLASSES)
    generator = torch.Generator().manual_seed(1)
    one = [random_layer(NUM_CLASSES, len(targets), NUM_QUERIES, generator) for _ in range(LAYERS + 1)]
    def repeated(layer: LayerOutput) -> LayerOutput:
        return LayerOutput(layer.logits.repeat(1, GROUPS, 1), layer.boxes.repeat(1, GROUPS, 1))

    last = repeated(one[LAYERS - 1])
    grouped = DetectorOutput(last.logits, last.boxes, aux=[repeated(x) for x in one[:LAYERS - 1]],
                             proposals=repeated(one[LAYERS]), class_head="sigmoid")
    single = DetectorOutput(one[LAYERS - 1].logits, one[LAYERS - 1].boxes, aux=one[:LAYERS - 1], proposals=one[LAYERS],
                            class_head="sigmoid")
    ours = build_criterion(CONFIG, **RECIPE)(grouped, targets)
    alone = build_criterion(CONFIG.replace(query_groups=1), **RECIPE)(single, targets)
    for name in build_criterion(CONFIG).weight_dict:
        assert ours[name].item() == pytest.approx(alone[name].item(), rel=1e-5), name


def test_ia_bce_on_a_hand_computed_case():
    """LW-DETR's eq. 1 by hand: the positive at t = max(p^α IoU^(1−α), 0.01), the negatives at −p^γ log(1 − p)."""
    logits = torch.tensor([[1.5, -2.0], [0.3, -4.0]])
    onehot = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    for iou, expected_target in ((0.6, None), (0.0, 0.01)):
        scores = onehot * iou
        p = logits.sigmoid()
        target = max(p[0, 0].item() ** 0.25 * iou ** 0.75, 0.01)
        if expected_target is not None:
            assert target == expected_target
        positive = -(target * p[0, 0].log() + (1 - target) * (1 - p[0, 0]).log())
        negatives = (p.pow(2) * -(1 - p).log())[onehot == 0].sum()
        loss = ia_bce_loss(logits, onehot, scores, 2.0)
        assert loss.item() == pytest.approx(((positive + negatives) / 2).item(), rel=1e-6)


def _train_mode_losses(hf, directory, photos, targets, **recipe):
    """transformers' model in training mode with labels, and this project's model read from its save, in training
    mode, through the criterion: (ours, theirs, weight_dict)."""
    hf.save_pretrained(directory)
    model = detr.load_checkpoint(directory).train()
    hf.train()
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    theirs = hf(pixel_values=photos, labels=labels).loss_dict
    criterion = build_criterion(model.config, **recipe)
    outputs = model(photos, torch.zeros(photos.shape[0], *photos.shape[-2:], dtype=torch.bool))
    return criterion(outputs, targets), theirs, criterion.weight_dict


@pytest.mark.parametrize("family", ["rfdetr", "lwdetr"])
def test_training_losses_equal_transformers_from_the_same_weights(tmp_path, family):
    """The whole training step's loss: the model's Group DETR forward (3 groups: their encoder heads, proposals and
    group-masked self-attention) and the criterion, against transformers' training forward and loss."""
    pytest.importorskip("transformers")
    photos = square_photos(112)
    targets = loss_targets(NUM_CLASSES)[:2]
    if family == "rfdetr":
        hf = hf_model(NUM_CLASSES, seed=4, dropout=0.0)
    else:
        hf = hf_lwdetr(NUM_CLASSES, seed=4)
    torch.manual_seed(0)
    ours, theirs, weight_dict = _train_mode_losses(hf, tmp_path, photos, targets, **RECIPE)
    differences = _weighted_differences(ours, theirs, weight_dict)
    assert max(differences.values()) <= 1e-4, differences
