"""The keypoint losses and matching costs (detr.loss.keypoint_terms) equal the rfdetr package's (1.8.0:
``compute_l1_keypoint_loss``, ``compute_keypoint_matching_cost``, ``SetCriterion.loss_keypoints``) on the same
predictions and matches; the part runs inside the set loss for every layer and the proposals."""

from __future__ import annotations

import pytest
import torch

from detr.loss.criterion import SetCriterion
from detr.loss.keypoint_terms import keypoint_losses, keypoint_matching_costs
from detr.loss.keypoints import KeypointLoss
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import ProposalLoss
from detr.models.layers.keypoint_head import KeypointSchema
from detr.models.outputs import DetectorOutput, LayerOutput
from tests.helpers_rfdetr_package import rfdetr_module

pytestmark = pytest.mark.usefixtures("one_thread")

COUNTS = (0, 3, 2)  # class 0 without keypoints, class 1 with three, class 2 with two: K_max 3, 9 padded slots
SLOTS = len(COUNTS) * max(COUNTS)


def _keypoints(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Raw predictions [..., 9, 8]: x, y near the image, logits, precision factors around 0."""
    keypoints = torch.randn(*shape, SLOTS, 8, generator=generator)
    keypoints[..., :2] = torch.rand(*shape, SLOTS, 2, generator=generator)
    return keypoints


def _targets(count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """labels [T] in 0..2, boxes [T, 4] cxcywh, keypoints [T, 3, 3] with visibility 0, 1 and 2 mixed."""
    keypoints = torch.rand(count, max(COUNTS), 3, generator=generator)
    keypoints[..., 2] = torch.randint(0, 3, (count, max(COUNTS)), generator=generator).float()
    boxes = torch.cat([torch.rand(count, 2, generator=generator) * 0.5 + 0.25,
                       torch.rand(count, 2, generator=generator) * 0.4 + 0.05], 1)
    labels = torch.randint(0, len(COUNTS), (count,), generator=generator)
    return {"labels": labels, "boxes": boxes, "keypoints": keypoints}


def test_the_losses_equal_the_package():
    heads = rfdetr_module("models.heads.keypoints")
    generator = torch.Generator().manual_seed(0)
    predictions = _keypoints((12,), generator)
    predictions[0, 3, 4] = float("inf")  # a non-finite precision is left out of the NLL, as the package does
    target = _targets(12, generator)
    target["labels"][1], target["keypoints"][1, :, 2] = 1, 0  # a person with no labelled keypoint: no l1, no NLL
    areas = target["boxes"][:, 2] * target["boxes"][:, 3]
    ours = keypoint_losses(predictions, target["keypoints"], target["labels"], areas, KeypointSchema(COUNTS))
    theirs = heads.compute_l1_keypoint_loss(predictions, target["keypoints"], target["labels"], areas, list(COUNTS))
    for mine, package in zip(ours, theirs):
        torch.testing.assert_close(mine, package, rtol=1e-6, atol=1e-6)
    l1, findable, visible, nll = ours
    assert l1[1] == 0 and nll[1] == 0 and findable[1] > 0 and visible[1] > 0  # every keypoint is (not) findable


def test_the_matching_costs_equal_the_package():
    heads = rfdetr_module("models.heads.keypoints")
    generator = torch.Generator().manual_seed(1)
    predictions = _keypoints((2, 6), generator)
    target = _targets(7, generator)
    areas = target["boxes"][:, 2] * target["boxes"][:, 3]
    ours = keypoint_matching_costs(predictions, target["keypoints"], target["labels"], areas, KeypointSchema(COUNTS))
    theirs = heads.compute_keypoint_matching_cost(predictions, target["keypoints"], target["labels"], areas,
                                                  list(COUNTS))
    for mine, package in zip(ours, theirs):
        assert mine.shape == (2, 6, 7)
        torch.testing.assert_close(mine, package, rtol=1e-5, atol=1e-5)


def _outputs(generator: torch.Generator, layers: int = 2, queries: int = 6) -> DetectorOutput:
    def layer(**kwargs):
        return dict(logits=torch.randn(2, queries, 3, generator=generator),
                    boxes=torch.rand(2, queries, 4, generator=generator) * 0.5 + 0.2,
                    keypoints=_keypoints((2, queries), generator), **kwargs)
    aux = [LayerOutput(**layer()) for _ in range(layers - 1)]
    return DetectorOutput(**layer(), aux=aux, proposals=LayerOutput(**layer()), class_head="sigmoid")


def test_the_part_equals_the_package_on_the_same_matches():
    criterion_module = rfdetr_module("models.criterion")
    generator = torch.Generator().manual_seed(2)
    outputs = _outputs(generator)
    targets = [_targets(3, generator), _targets(2, generator)]
    indices = [(torch.tensor([4, 0, 2]), torch.tensor([1, 2, 0])), (torch.tensor([5, 1]), torch.tensor([0, 1]))]
    part = KeypointLoss(COUNTS, num_decoder_layers=2)
    ours = part.terms(outputs, targets, indices, torch.tensor(5.0))
    package = criterion_module.SetCriterion.__new__(criterion_module.SetCriterion)
    package.num_keypoints_per_class = list(COUNTS)
    theirs = package.loss_keypoints({"pred_keypoints": outputs.keypoints}, targets, indices, torch.tensor(5.0))
    for mine, term in zip(ours, ("l1", "findable", "visible", "nll")):
        torch.testing.assert_close(mine, theirs[f"loss_keypoints_{term}"])


def test_the_part_scores_every_layer_and_the_proposals_in_the_set_loss():
    generator = torch.Generator().manual_seed(3)
    outputs = _outputs(generator, layers=3)
    targets = [_targets(3, generator), _targets(2, generator)]
    part = KeypointLoss(COUNTS, num_decoder_layers=3)
    criterion = SetCriterion(3, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid", num_decoder_layers=3,
                             parts=[part, ProposalLoss(class_agnostic=False)])
    losses = criterion(outputs, targets)
    names = [f"loss_keypoints_{term}{suffix}" for suffix in ("", "_0", "_1", "_enc")
             for term in ("l1", "findable", "visible", "nll")]
    assert set(names) <= set(losses) and set(names) == set(part.weight_dict)
    assert all(losses[name] != 0 for name in names)
    matched = criterion.matcher(outputs, targets)
    expected = part.terms(outputs, targets, matched, torch.tensor(5.0))
    torch.testing.assert_close(losses["loss_keypoints_l1"], expected[0])
    proposals = criterion.matcher(outputs.proposals, targets)
    expected = part.terms(outputs.proposals, targets, proposals, torch.tensor(5.0))
    torch.testing.assert_close(losses["loss_keypoints_nll_enc"], expected[3])
    with pytest.raises(ValueError, match="KeypointLoss"):
        SetCriterion(3, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid", num_decoder_layers=3,
                     parts=[ProposalLoss(class_agnostic=False)])(outputs, targets)


def test_a_target_class_without_a_keypoint_count_is_refused():
    generator = torch.Generator().manual_seed(4)
    with pytest.raises(ValueError, match="num_keypoints_per_class"):
        keypoint_losses(_keypoints((1,), generator), torch.zeros(1, 3, 3), torch.tensor([3]), torch.ones(1),
                        KeypointSchema(COUNTS))


def test_the_matcher_with_keypoint_costs_matches_as_the_package():
    matcher_module = rfdetr_module("models.matcher")
    generator = torch.Generator().manual_seed(5)
    outputs = _outputs(generator, layers=2, queries=8)
    targets = [_targets(4, generator), _targets(3, generator)]
    weights = {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}
    ours = HungarianMatcher(**weights, class_head="sigmoid", num_keypoints_per_class=COUNTS, cost_keypoint_l1=1.0,
                            cost_keypoint_findable=1.0, cost_keypoint_visible=1.0, cost_keypoint_nll=1.0)
    theirs = matcher_module.HungarianMatcher(
        **weights, num_keypoints_per_class=list(COUNTS), keypoint_l1_loss_coef=1.0, keypoint_findable_loss_coef=1.0,
        keypoint_visible_loss_coef=1.0, keypoint_nll_loss_coef=1.0)
    package = theirs({"pred_logits": outputs.logits, "pred_boxes": outputs.boxes, "pred_keypoints": outputs.keypoints},
                     targets)
    without_keypoints = HungarianMatcher(**weights, class_head="sigmoid")(outputs, targets)
    for layer_indices in (ours(outputs, targets), ours.match_layers(outputs.layers, targets)[-1]):
        for (queries, columns), (package_queries, package_columns) in zip(layer_indices, package):
            order = torch.as_tensor(package_queries).argsort()
            assert queries.tolist() == torch.as_tensor(package_queries)[order].tolist()
            assert columns.tolist() == torch.as_tensor(package_columns)[order].tolist()
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(ours(outputs, targets), without_keypoints))
    with pytest.raises(ValueError, match="num_keypoints_per_class"):
        HungarianMatcher(cost_keypoint_nll=1.0)
