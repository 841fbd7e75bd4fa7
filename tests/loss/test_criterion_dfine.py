"""D-FINE's loss as parts of the one criterion, against transformers' DFineForObjectDetectionLoss on the same
predictions and targets: RT-DETR's terms plus FGL and DDF of every layer's edge distributions, of the selected
and the denoising queries; and DEIM's matchability-aware class loss by its formula (DEIM is not in
transformers)."""

from __future__ import annotations

import pytest
import torch

from detr.loss.build import build_criterion
from detr.loss.distribution import edge_targets
from detr.loss.focal import matchability_loss
from detr.models.config import DetrConfig
from detr.models.dfine.decoder import weighting_function
from detr.models.outputs import DenoisingMeta, DenoisingOutput, DetectorOutput, DistributionOutput, LayerOutput
from tests.loss.test_criterion_rtdetr import RECIPE, _layer, _targets

NUM_CLASSES, LAYERS, BINS = 4, 3, 32
#: Twice the largest target count (3): the authors weigh the denoising queries' DDF with the selected queries'
#: matched / unmatched counts, transformers with their own; with Q = 2 T the two ratios are equal.
NUM_QUERIES = 6
CONFIG = DetrConfig(architecture="dfine", class_head="sigmoid", backbone="hgnetv2_b0", num_classes=NUM_CLASSES,
                    num_queries=NUM_QUERIES, num_decoder_layers=LAYERS, denoising=True, pretrained_backbone=False,
                    num_feature_levels=3, num_points_per_level=(3, 6, 3))
UP, REG_SCALE = torch.tensor([0.5]), torch.tensor([4.0])


def _distributions(batch: int, queries: int, generator: torch.Generator) -> DistributionOutput:
    corners = torch.randn(LAYERS, batch, queries, 4 * (BINS + 1), generator=generator) * 2
    centres = torch.rand(batch, queries, 2, generator=generator) * 0.6 + 0.2
    initial = torch.cat([centres, torch.rand(batch, queries, 2, generator=generator) * 0.4 + 0.05], -1)
    pre = LayerOutput(torch.randn(batch, queries, NUM_CLASSES, generator=generator) - 2, initial)
    return DistributionOutput(corners, initial, weighting_function(BINS, UP, REG_SCALE), REG_SCALE, pre)


def _outputs(meta: DenoisingMeta, batch: int) -> DetectorOutput:
    generator = torch.Generator().manual_seed(0)
    layers = [_layer(batch, NUM_QUERIES, generator) for _ in range(LAYERS)]
    dn_layers = [_layer(batch, meta.num_queries, generator) for _ in range(LAYERS)]
    denoising = DenoisingOutput(dn_layers[-1].logits, dn_layers[-1].boxes, aux=dn_layers[:-1], meta=meta,
                                distributions=_distributions(batch, meta.num_queries, generator))
    return DetectorOutput(layers[-1].logits, layers[-1].boxes, aux=layers[:-1], class_head="sigmoid",
                          proposals=_layer(batch, NUM_QUERIES, generator), denoising=denoising,
                          distributions=_distributions(batch, NUM_QUERIES, generator))


def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """transformers' loss on the same predictions, laid out as its model hands them over (every layer's
    denoising queries ahead of the selected ones; b⁰ per layer)."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_d_fine import DFineForObjectDetectionLoss

    from detr.loss.parts import denoising_indices

    meta, denoising = outputs.denoising.meta, outputs.denoising
    dn_layers, layers = [*denoising.aux, denoising], [*outputs.aux, outputs]
    classes = torch.stack([torch.cat([d.logits, m.logits], 1) for d, m in zip(dn_layers, layers)], 1)  # [B, L, D+Q, K]
    coords = torch.stack([torch.cat([d.boxes, m.boxes], 1) for d, m in zip(dn_layers, layers)], 1)
    corners = torch.cat([denoising.distributions.corners, outputs.distributions.corners], 2).transpose(0, 1)
    initial = torch.cat([denoising.distributions.initial, outputs.distributions.initial], 1)
    config = transformers.DFineConfig(num_labels=NUM_CLASSES, decoder_layers=LAYERS, max_num_bins=BINS,
                                      matcher_class_cost=RECIPE["cost_class"], matcher_bbox_cost=RECIPE["cost_bbox"],
                                      matcher_giou_cost=RECIPE["cost_giou"])
    dn_meta = {"dn_positive_idx": [queries for queries, _ in denoising_indices(meta, targets)],
               "dn_num_group": meta.num_groups, "dn_num_split": [meta.num_queries, NUM_QUERIES]}
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    _, losses, _ = DFineForObjectDetectionLoss(
        logits=classes[:, -1], labels=labels, device="cpu", pred_boxes=coords[:, -1], config=config,
        outputs_class=classes, outputs_coord=coords, enc_topk_logits=outputs.proposals.logits,
        enc_topk_bboxes=outputs.proposals.boxes, denoising_meta_values=dn_meta, predicted_corners=corners,
        initial_reference_points=initial[:, None].expand(-1, LAYERS, -1, -1))
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


def test_dfine_loss_is_transformers():
    targets = _targets()
    meta = DenoisingMeta(num_groups=4, group_size=2 * 3)
    outputs = _outputs(meta, len(targets))
    criterion = build_criterion(CONFIG, **RECIPE)
    ours = criterion(outputs, targets)
    theirs = {_our_name(name): value for name, value in _theirs(outputs, targets).items()}

    # transformers distils the last denoising layer into itself (always 0), and leaves out the last layer's FGL
    # and the first layer's plain head, which the authors' criterion trains
    assert theirs.pop("loss_ddf_dn").item() == 0
    extra = {"loss_fgl"} | {f"{name}{pre}" for name in ("loss_ce", "loss_bbox", "loss_giou")
                            for pre in ("_pre", "_dn_pre")}
    assert set(theirs) == set(criterion.weight_dict) - extra
    differences = {name: abs(float(ours[name] * criterion.weight_dict[name] - value)) for name, value in theirs.items()}
    assert max(differences.values()) <= 1e-5, differences
    assert all(ours[name] > 0 for name in theirs if "fgl" in name or "ddf" in name)
    assert all(torch.isfinite(ours[name]) and ours[name] > 0 for name in extra)


def test_edge_targets_put_the_distance_between_two_bins():
    """A target edge at a distance d from b⁰'s (in W's units) gets the two bins around d, weighted so that their
    expectation under W is d; one beyond W's range gets all on the end bin."""
    project = weighting_function(BINS, UP, REG_SCALE)
    initial = torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.2]])
    target = torch.tensor([[0.37, 0.41, 0.63, 0.62], [0.0, 0.0, 1.0, 1.0]])  # the second: far beyond W's ±2
    left, right_weight, left_weight = edge_targets(initial, target, project, REG_SCALE)
    scale = REG_SCALE.item()
    distances = torch.cat([(0.5 - target[0, :2]), (target[0, 2:] - 0.5)]) / (0.2 / scale) - scale / 2
    index = left[:4].long()
    expected = project[index] * left_weight[:4] + project[index + 1] * right_weight[:4]
    torch.testing.assert_close(expected, distances, atol=1e-5, rtol=0)
    assert (left_weight + right_weight == 1).all()
    assert torch.equal(right_weight[4:], torch.ones(4)) and (left[4:] == BINS - 0.1).all()


def test_matchability_loss_is_deims_formula():
    logits = torch.tensor([[2.0, -1.0], [0.5, -3.0]])
    onehot = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    for iou in (0.2, 0.9):
        loss = matchability_loss(logits, onehot, onehot * iou, 2.0, gamma=1.5)
        probability = logits.sigmoid()
        # the positive: BCE towards IoU^γ with weight 1; negatives: p^γ · -log(1 - p)
        target = iou ** 1.5
        positive = -(target * probability[0, 0].log() + (1 - target) * (1 - probability[0, 0]).log())
        negatives = (probability.pow(1.5) * -(1 - probability).log())[onehot == 0].sum()
        assert loss.item() == pytest.approx(((positive + negatives) / 2).item(), rel=1e-6)


def test_matchability_is_chosen_by_a_flag():
    targets = _targets()
    outputs = _outputs(DenoisingMeta(num_groups=4, group_size=6), len(targets))
    varifocal = build_criterion(CONFIG, **RECIPE)(outputs, targets)
    matchability = build_criterion(CONFIG, **RECIPE, matchability=True)(outputs, targets)
    assert matchability["loss_ce"] != varifocal["loss_ce"]
    assert matchability["loss_bbox"] == varifocal["loss_bbox"] and matchability["loss_fgl"] == varifocal["loss_fgl"]
    with pytest.raises(ValueError, match="set matchability false"):
        build_criterion(DetrConfig(), matchability=True)
