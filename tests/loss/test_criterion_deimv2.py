"""DEIMv2's loss as the one criterion builds it for ``architecture="deimv2"``, against transformers'
Deimv2ForObjectDetectionLoss on the same predictions and targets: D-FINE's terms with the matchability-aware class
loss (MAL) in place of the varifocal loss, and the union of every layer's matches (transformers' "dense one-to-one"
indices) for the box and localisation terms."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from detr.models.deimv2.config import DEIMv2Config
from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.loss.build import build_criterion
from detr.loss.parts import DenoisingLoss, ProposalLoss
from detr.loss.distribution import DistributionLoss

from detr.models.dfine.decoder import weighting_function
from detr.models.outputs import DenoisingMeta, DenoisingOutput, DetectorOutput, DistributionOutput, LayerOutput
from tests.helpers_rtdetr import RECIPE, loss_targets, our_term_name, random_layer, transformers_loss_arguments

NUM_CLASSES, LAYERS, BINS = 4, 3, 32
#: Twice the largest target count (3), as in tests/loss/test_criterion_dfine.py (DDF's weighting of the
#: denoising queries is the same in both then).
NUM_QUERIES = 6
MAL_GAMMA = 1.5  # the authors' DEIMCriterion gamma
CONFIG = DEIMv2Config(class_head="sigmoid", backbone="hgnetv2_b0", num_classes=NUM_CLASSES, num_queries=NUM_QUERIES,
                      num_decoder_layers=LAYERS, denoising=True, pretrained_backbone=False, num_feature_levels=3,
                      dim_feedforward=2048, dropout=0.1, num_encoder_layers=6, backbone_norm='frozen_batch_norm',
                      csp_expansion=1.0, backbone_learnable_affine=False, csp_depth_multiplier=1.0,
                      decoder=DistributionDecoder(num_points_per_level=(3, 6, 3)))
UP, REG_SCALE = torch.tensor([0.5]), torch.tensor([4.0])


def _distributions(batch: int, queries: int, generator: torch.Generator, pre: LayerOutput | None = None
                   ) -> DistributionOutput:
    corners = torch.randn(LAYERS, batch, queries, 4 * (BINS + 1), generator=generator) * 2
    if pre is None:
        centres = torch.rand(batch, queries, 2, generator=generator) * 0.6 + 0.2
        initial = torch.cat([centres, torch.rand(batch, queries, 2, generator=generator) * 0.4 + 0.05], -1)
        pre = LayerOutput(torch.randn(batch, queries, NUM_CLASSES, generator=generator) - 2, initial)
    return DistributionOutput(corners, pre.boxes, weighting_function(BINS, UP, REG_SCALE), REG_SCALE, pre)


def _outputs(meta: DenoisingMeta, batch: int, *, agreeing: bool = False) -> DetectorOutput:
    """Random predictions; ``agreeing``: every layer but the first, the first layer's plain head and the encoder
    proposals are copies of the last layer, so that each is matched as the last layer is and the union's choice
    of target per query cannot depend on whether the plain head joins it (the authors put it in, transformers
    leaves it out)."""
    generator = torch.Generator().manual_seed(0)
    layers = [random_layer(NUM_CLASSES, batch, NUM_QUERIES, generator) for _ in range(LAYERS)]
    proposals = random_layer(NUM_CLASSES, batch, NUM_QUERIES, generator)
    pre = None
    if agreeing:
        last = layers[-1]
        layers[1:-1] = [LayerOutput(last.logits.clone(), last.boxes.clone()) for _ in layers[1:-1]]
        proposals = LayerOutput(last.logits.clone(), last.boxes.clone())
        pre = LayerOutput(last.logits.clone(), last.boxes.clone())
    dn_layers = [random_layer(NUM_CLASSES, batch, meta.num_queries, generator) for _ in range(LAYERS)]
    denoising = DenoisingOutput(dn_layers[-1].logits, dn_layers[-1].boxes, aux=dn_layers[:-1], meta=meta,
                                distributions=_distributions(batch, meta.num_queries, generator))
    return DetectorOutput(layers[-1].logits, layers[-1].boxes, aux=layers[:-1], class_head="sigmoid",
                          proposals=proposals, denoising=denoising,
                          distributions=_distributions(batch, NUM_QUERIES, generator, pre))


def _theirs(outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]], *, union: bool
            ) -> dict[str, torch.Tensor]:
    """transformers' loss on the same predictions, laid out as its model hands them over (every layer's
    denoising queries ahead of the selected ones; b⁰ per layer)."""
    transformers = pytest.importorskip("transformers")
    from transformers.loss.loss_deimv2 import Deimv2ForObjectDetectionLoss

    config = transformers.Deimv2Config(num_labels=NUM_CLASSES, decoder_layers=LAYERS, max_num_bins=BINS,
                                       matcher_class_cost=RECIPE["cost_class"], matcher_bbox_cost=RECIPE["cost_bbox"],
                                       matcher_giou_cost=RECIPE["cost_giou"], focal_loss_gamma=MAL_GAMMA,
                                       use_dense_one_to_one=union)
    _, losses, _ = Deimv2ForObjectDetectionLoss(**transformers_loss_arguments(outputs, targets), device="cpu",
                                                config=config)
    return losses


def _compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], criterion,
             balanced_elsewhere: frozenset[str] = frozenset()) -> None:
    theirs = {our_term_name(name, LAYERS, "loss_mal"): value for name, value in theirs.items()}
    # transformers distils the last denoising layer into itself (always 0), and leaves out the last layer's FGL
    # and the first layer's plain head, which the authors' criterion trains
    assert theirs.pop("loss_ddf_dn").item() == 0
    extra = {"loss_fgl"} | {f"{name}{pre}" for name in ("loss_ce", "loss_bbox", "loss_giou")
                            for pre in ("_pre", "_dn_pre")}
    assert set(theirs) == set(criterion.weight_dict) - extra
    differences = {name: abs(float(ours[name] * criterion.weight_dict[name] - value)) for name, value in theirs.items()
                   if name not in balanced_elsewhere}
    assert max(differences.values()) <= 1e-5, differences
    assert all(torch.isfinite(ours[name]) and ours[name] > 0 for name in extra | balanced_elsewhere)


def test_deimv2_builds_dfines_parts_with_mal_and_the_union():
    criterion = build_criterion(CONFIG, **RECIPE)
    assert criterion.matchability and not criterion.varifocal
    assert criterion.matching_union
    assert {type(part) for part in criterion.parts} == {ProposalLoss, DenoisingLoss, DistributionLoss}
    # the same as D-FINE's criterion with MAL asked for
    same = {name: value for name, value in CONFIG.to_dict().items()
            if name in DFINEConfig.__dataclass_fields__ and name != "family"}
    dfine = build_criterion(DFINEConfig.from_dict(same), **RECIPE, matchability=True)
    targets = loss_targets(NUM_CLASSES)
    outputs = _outputs(DenoisingMeta(num_groups=4, group_size=6), len(targets))
    ours, theirs = criterion(outputs, targets), dfine(outputs, targets)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    # a DEIMv2 model can still be trained with the varifocal loss when asked for
    assert build_criterion(CONFIG, **RECIPE, matchability=False).varifocal


def test_deimv2_loss_is_transformers_layer_by_layer():
    targets = loss_targets(NUM_CLASSES)
    outputs = _outputs(DenoisingMeta(num_groups=4, group_size=2 * 3), len(targets))
    criterion = build_criterion(CONFIG, **RECIPE, matching_union=False)
    _compare(criterion(outputs, targets), _theirs(outputs, targets, union=False), criterion)


def test_deimv2_loss_is_transformers_with_dense_one_to_one():
    targets = loss_targets(NUM_CLASSES)
    outputs = _outputs(DenoisingMeta(num_groups=4, group_size=2 * 3), len(targets), agreeing=True)
    criterion = build_criterion(CONFIG, **RECIPE)  # the union, as the authors and transformers train DEIMv2
    ours = criterion(outputs, targets)
    # The denoising queries' DDF weighs matched and unmatched edges by the selected queries' counts (the authors'
    # criterion; here those of the union), transformers' by the denoising queries' own: equal only when the two
    # ratios are (test_deimv2_loss_is_transformers_layer_by_layer), so those terms are compared there.
    dn_ddf = frozenset(f"loss_ddf_dn_{layer}" for layer in range(LAYERS - 1))
    _compare(ours, _theirs(outputs, targets, union=True), criterion, dn_ddf)
    # the first layer's predictions differ from the others': the union is larger than one layer's matches
    matched = sum(len(t["labels"]) for t in targets)
    union = criterion.matcher(outputs.aux[0], targets)
    assert any(len(q) for q, _ in union) and matched > 0
    separate = build_criterion(CONFIG, **RECIPE, matching_union=False)(outputs, targets)
    assert ours["loss_bbox_0"] != separate["loss_bbox_0"]
