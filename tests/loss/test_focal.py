"""Sigmoid focal loss, its matching cost, the focal criterion and sigmoid post-processing."""

from __future__ import annotations

import math

import pytest
import torch

from detr.inference.postprocess import PostProcess
from detr.loss.criterion import SetCriterion
from detr.loss.focal import focal_class_cost, sigmoid_focal_loss
from detr.loss.matcher import HungarianMatcher
from detr.models.detr_family import DetrConfig
from tests.helpers import model_output


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _focal_term(logit: float, target: int, alpha: float = 0.25, gamma: float = 2.0) -> float:
    """Lin et al. eq. 5, written out for one element."""
    p = _sigmoid(logit)
    p_t = p if target == 1 else 1 - p
    alpha_t = alpha if target == 1 else 1 - alpha
    return -alpha_t * (1 - p_t) ** gamma * math.log(p_t)


def test_focal_loss_matches_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 0.0, 1.5]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    expected = sum(_focal_term(l, int(t)) for l, t in zip(logits.flatten().tolist(), targets.flatten().tolist()))
    assert sigmoid_focal_loss(logits, targets, 2.0).item() == pytest.approx(expected / 2.0, rel=1e-6)
    expected_g0 = sum(_focal_term(l, int(t), alpha=0.5, gamma=0.0) for l, t in
                      zip(logits.flatten().tolist(), targets.flatten().tolist()))
    # gamma 0, alpha 0.5: half the binary cross-entropy
    assert sigmoid_focal_loss(logits, targets, 1.0, alpha=0.5, gamma=0.0).item() == pytest.approx(expected_g0, rel=1e-6)


def test_focal_class_cost_matches_hand_computation():
    logits = torch.tensor([[[1.0, -2.0, 0.3], [-0.5, 2.5, 0.0]]])  # [B=1, Q=2, C=3]
    labels = torch.tensor([[2, 1]])  # [B=1, T=2]
    cost = focal_class_cost(logits, labels)
    assert cost.shape == (1, 2, 2)
    for q in range(2):
        for t, c in enumerate(labels[0].tolist()):
            x = logits[0, q, c].item()
            p = _sigmoid(x)
            expected = 0.25 * (1 - p) ** 2 * -math.log(p + 1e-8) - 0.75 * p ** 2 * -math.log(1 - p + 1e-8)
            assert cost[0, q, t].item() == pytest.approx(expected, rel=1e-5)
    # a confident correct query is cheaper than an unsure one
    assert cost[0, 1, 1] < cost[0, 0, 1]


def test_focal_matcher_pairs_confident_queries_with_their_class():
    logits = torch.full((1, 3, 4), -5.0)
    logits[0, 0, 2] = 5.0  # query 0 says class 2
    logits[0, 2, 1] = 5.0  # query 2 says class 1
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2]] * 3])
    targets = [{"labels": torch.tensor([1, 2]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]] * 2)}]
    matcher = HungarianMatcher(class_head="sigmoid")
    (queries, target_index), = matcher(model_output(logits=logits, boxes=boxes), targets)
    assert dict(zip(queries.tolist(), target_index.tolist())) == {0: 1, 2: 0}


def test_focal_criterion_loss_ce_is_the_focal_loss_of_the_matched_one_hot():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 3)
    boxes = torch.rand(2, 4, 2) * 0.5 + 0.25
    boxes = torch.cat([boxes, torch.full((2, 4, 2), 0.2)], dim=-1)
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.6, 0.6, 0.2, 0.2]])},
               {"labels": torch.tensor([], dtype=torch.int64), "boxes": torch.zeros(0, 4)}]
    criterion = SetCriterion(3, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid", num_decoder_layers=1)
    outputs = model_output(logits=logits, boxes=boxes)
    losses = criterion(outputs, targets)
    (queries, target_index), _ = criterion.matcher(outputs, targets)
    onehot = torch.zeros(2, 4, 3)
    onehot[0, queries, targets[0]["labels"][target_index]] = 1
    expected = sum(_focal_term(l, int(t)) for l, t in zip(logits.flatten().tolist(), onehot.flatten().tolist())) / 2
    assert losses["loss_ce"].item() == pytest.approx(expected, rel=1e-5)
    assert set(criterion.weight_dict) == {"loss_ce", "loss_bbox", "loss_giou"}
    # cardinality: queries with any class probability above 0.5
    predicted = (logits.sigmoid().amax(-1) > 0.5).sum(1).float()
    assert losses["cardinality_error"].item() == pytest.approx((predicted - torch.tensor([2.0, 0.0])).abs().mean().item())


def test_criterion_and_matcher_must_agree():
    with pytest.raises(ValueError, match="same cost"):
        SetCriterion(3, HungarianMatcher(), class_head="sigmoid")
    with pytest.raises(ValueError, match="'softmax' or 'sigmoid'"):  # the one place the word is checked
        DetrConfig(class_head="focal")
    assert SetCriterion(3, class_head="sigmoid").matcher.class_head == "sigmoid"


def test_sigmoid_postprocess_scores_with_independent_sigmoids():
    logits = torch.tensor([[[2.0, -1.0], [-4.0, -3.0]]])  # [1, Q=2, C=2]: no "no object" logit
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5]]])
    out = PostProcess(class_head="sigmoid")(model_output(logits=logits, boxes=boxes), torch.tensor([[100, 200]]))[0]
    assert out["labels"].tolist() == [0, 1]
    assert out["scores"].tolist() == pytest.approx([_sigmoid(2.0), _sigmoid(-3.0)], rel=1e-6)
    assert out["boxes"][0].tolist() == pytest.approx([50.0, 25.0, 150.0, 75.0])
    with pytest.raises(ValueError, match="class_head"):
        PostProcess(class_head="focal")
