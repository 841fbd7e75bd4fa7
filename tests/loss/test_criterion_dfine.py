"""D-FINE's loss as parts of the one criterion, against transformers' DFineForObjectDetectionLoss on the same
predictions and targets: RT-DETR's terms plus FGL and DDF of every layer's edge distributions, of the selected
and the denoising queries; and DEIM's matchability-aware class loss by its formula (DEIM is not in
transformers)."""

from __future__ import annotations

import pytest
import torch

from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.loss.build import build_criterion
from detr.loss.criterion import matching_union
from detr.loss.distribution import edge_targets, localization_loss
from detr.loss.focal import matchability_loss
from detr.loss.terms import box_losses
from detr.models.detr_family import DetrConfig
from detr.models.dfine.decoder import weighting_function
from detr.models.outputs import DenoisingMeta, DenoisingOutput, DetectorOutput, DistributionOutput, LayerOutput
from tests.helpers_rtdetr import RECIPE, loss_targets, our_term_name, random_layer, transformers_loss_arguments

NUM_CLASSES, LAYERS, BINS = 4, 3, 32
#: Twice the largest target count (3): the authors weigh the denoising queries' DDF with the selected queries'
#: matched / unmatched counts, transformers with their own; with Q = 2 T the two ratios are equal.
NUM_QUERIES = 6
CONFIG = DFINEConfig(class_head="sigmoid", backbone="hgnetv2_b0", num_classes=NUM_CLASSES, num_queries=NUM_QUERIES,
                     num_decoder_layers=LAYERS, denoising=True, pretrained_backbone=False, num_feature_levels=3,
                     dim_feedforward=2048, dropout=0.1, num_encoder_layers=6, backbone_norm='frozen_batch_norm',
                     csp_expansion=1.0, backbone_learnable_affine=False, csp_depth_multiplier=1.0,
                     decoder=DistributionDecoder(num_points_per_level=(3, 6, 3)))
UP, REG_SCALE = torch.tensor([0.5]), torch.tensor([4.0])


def _distributions(batch: int, queries: int, generator: torch.Generator) -> DistributionOutput:
    corners = torch.randn(LAYERS, batch, queries, 4 * (BINS + 1), generator=generator) * 2
    centres = torch.rand(batch, queries, 2, generator=generator) * 0.6 + 0.2
    initial = torch.cat([centres, torch.rand(batch, queries, 2, generator=generator) * 0.4 + 0.05], -1)
    pre = LayerOutput(torch.randn(batch, queries, NUM_CLASSES, generator=generator) - 2, initial)
    return DistributionOutput(corners, initial, weighting_function(BINS, UP, REG_SCALE), REG_SCALE, pre)


def _outputs(meta: DenoisingMeta, batch: int) -> DetectorOutput:
    generator = torch.Generator().manual_seed(0)
    layers = [random_layer(NUM_CLASSES, batch, NUM_QUERIES, generator) for _ in range(LAYERS)]
    dn_layers = [random_layer(NUM_CLASSES, batch, meta.num_queries, generator) for _ in range(LAYERS)]
    denoising = DenoisingOutput(dn_layers[-1].logits, dn_layers[-1].boxes, aux=dn_layers[:-1], meta=meta,
                                distributions=_distributions(batch, meta.num_queries, generator))
    return DetectorOutput(layers[-1].logits, layers[-1].boxes, aux=layers[:-1], class_head="sigmoid",
                          proposals=random_layer(NUM_CLASSES, batch, NUM_QUERIES, generator), denoising=denoising,
                          distributions=_distributions(batch, NUM_QUERIES, generator))


def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """transformers' loss on the same predictions, laid out as its model hands them over (every layer's
    denoising queries ahead of the selected ones; b⁰ per layer)."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_d_fine import DFineForObjectDetectionLoss

    config = transformers.DFineConfig(num_labels=NUM_CLASSES, decoder_layers=LAYERS, max_num_bins=BINS,
                                      matcher_class_cost=RECIPE["cost_class"], matcher_bbox_cost=RECIPE["cost_bbox"],
                                      matcher_giou_cost=RECIPE["cost_giou"])
    _, losses, _ = DFineForObjectDetectionLoss(**transformers_loss_arguments(outputs, targets), device="cpu",
                                               config=config)
    return losses


def test_dfine_loss_is_transformers():
    targets = loss_targets(NUM_CLASSES)
    meta = DenoisingMeta(num_groups=4, group_size=2 * 3)
    outputs = _outputs(meta, len(targets))
    criterion = build_criterion(CONFIG, **RECIPE, matching_union=False)  # transformers matches layer by layer
    ours = criterion(outputs, targets)
    theirs = {our_term_name(name, LAYERS, "loss_vfl"): value for name, value in _theirs(outputs, targets).items()}

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


def test_matching_union_keeps_each_querys_most_frequent_target():
    def pairs(queries: list[int], targets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(queries, dtype=torch.int64), torch.tensor(targets, dtype=torch.int64)

    # image 0: query 4 goes to target 0 twice and to target 1 once; image 1 has no targets
    layers = [[pairs([4, 2], [0, 1]), pairs([], [])], [pairs([4, 7], [0, 1]), pairs([], [])],
              [pairs([4, 2], [1, 0]), pairs([], [])]]
    (queries, targets), (empty_queries, _) = matching_union(layers)
    assert dict(zip(queries.tolist(), targets.tolist()))[4] == 0
    assert sorted(queries.tolist()) == [2, 4, 7] and len(empty_queries) == 0


def test_go_lsd_scores_every_layers_boxes_on_the_union():
    """With the union, the box and localisation terms of every layer (and of the plain head and the proposals)
    are computed on the union's pairs and divided by its size; the class terms keep each layer's matches."""
    targets = loss_targets(NUM_CLASSES)
    outputs = _outputs(DenoisingMeta(num_groups=4, group_size=6), len(targets))
    criterion = build_criterion(CONFIG, **RECIPE)
    assert criterion.matching_union  # the authors' D-FINE
    ours = criterion(outputs, targets)
    separate = build_criterion(CONFIG, **RECIPE, matching_union=False)(outputs, targets)
    matcher = criterion.matcher
    union = matching_union([matcher(layer, targets) for layer in [outputs, *outputs.aux]]
                           + [matcher(outputs.distributions.pre, targets), matcher(outputs.proposals, targets)])
    count = sum(len(query) for query, _ in union)
    assert count > sum(len(t["labels"]) for t in targets)  # the layers disagree: the union is larger
    for name, layer in (("", outputs), ("_0", outputs.aux[0]), ("_pre", outputs.distributions.pre),
                        ("_enc", outputs.proposals)):
        expected = box_losses(layer.boxes, targets, union, count)
        assert ours[f"loss_bbox{name}"].item() == pytest.approx(expected["loss_bbox"].item(), rel=1e-6)
        assert ours[f"loss_giou{name}"].item() == pytest.approx(expected["loss_giou"].item(), rel=1e-6)
        assert ours[f"loss_ce{name}"] == separate[f"loss_ce{name}"]
    fgl, _ = localization_loss(outputs.distributions.corners[0], outputs.aux[0].boxes, outputs.distributions,
                               targets, union, count)
    assert ours["loss_fgl_0"].item() == pytest.approx(fgl.item(), rel=1e-6)
    assert ours["loss_fgl_dn"] == separate["loss_fgl_dn"]  # the denoising queries keep their fixed pairs


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
    targets = loss_targets(NUM_CLASSES)
    outputs = _outputs(DenoisingMeta(num_groups=4, group_size=6), len(targets))
    varifocal = build_criterion(CONFIG, **RECIPE)(outputs, targets)
    matchability = build_criterion(CONFIG, **RECIPE, matchability=True)(outputs, targets)
    assert matchability["loss_ce"] != varifocal["loss_ce"]
    assert matchability["loss_bbox"] == varifocal["loss_bbox"] and matchability["loss_fgl"] == varifocal["loss_fgl"]
    with pytest.raises(ValueError, match="set matchability false"):
        build_criterion(DetrConfig(), matchability=True)
