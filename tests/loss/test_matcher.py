"""Hungarian matcher: optimal against brute force, batched = per image, empty targets."""

from __future__ import annotations

import itertools

import torch
from torchvision.ops import generalized_box_iou

from detr import HungarianMatcher
from detr.box_ops import cxcywh_to_xyxy
from tests.helpers import model_output


def random_problem(batch, queries, classes, sizes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    outputs = model_output(logits=torch.randn(batch, queries, classes + 1, generator=generator),
                           boxes=torch.rand(batch, queries, 4, generator=generator) * 0.5 + 0.25)
    targets = [{"labels": torch.randint(0, classes, (n,), generator=generator),
                "boxes": torch.rand(n, 4, generator=generator) * 0.5 + 0.25} for n in sizes]
    return outputs, targets


def reference_cost(matcher, logits, boxes, target):
    """The cost as paper section 3.1 writes it (−p̂(class) + 5 L1 + 2 (−GIoU)), for one image, with
    torchvision's pairwise GIoU."""
    prob = logits.softmax(-1)
    return (matcher.cost_bbox * torch.cdist(boxes, target["boxes"], p=1)
            - matcher.cost_class * prob[:, target["labels"]]
            - matcher.cost_giou * generalized_box_iou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(target["boxes"])))


def test_matches_brute_force_optimum():
    matcher = HungarianMatcher()
    outputs, targets = random_problem(3, 5, 4, [3, 1, 5], seed=1)
    indices = matcher(outputs, targets)
    for image, ((rows, cols), target) in enumerate(zip(indices, targets)):
        cost = reference_cost(matcher, outputs.logits[image], outputs.boxes[image], target)
        found = cost[rows, cols].sum()
        best = min(sum(cost[q, t] for t, q in enumerate(perm))
                   for perm in itertools.permutations(range(5), len(target["labels"])))
        assert len(rows) == len(target["labels"])
        torch.testing.assert_close(found, torch.as_tensor(best, dtype=found.dtype))


def test_batched_equals_per_image():
    matcher = HungarianMatcher()
    outputs, targets = random_problem(4, 8, 3, [2, 0, 6, 3], seed=2)
    batched = matcher(outputs, targets)
    for image, target in enumerate(targets):
        single = matcher(outputs.apply(lambda value: value[image:image + 1]), [target])[0]
        assert torch.equal(batched[image][0], single[0]) and torch.equal(batched[image][1], single[1])


def test_empty_targets_get_no_pairs():
    matcher = HungarianMatcher()
    outputs, targets = random_problem(2, 4, 3, [0, 0])
    for rows, cols in matcher(outputs, targets):
        assert rows.numel() == 0 and cols.numel() == 0 and rows.dtype == torch.int64


def test_more_targets_than_queries_matches_every_query():
    matcher = HungarianMatcher()
    outputs, targets = random_problem(1, 3, 3, [5])
    rows, cols = matcher(outputs, targets)[0]
    assert sorted(rows.tolist()) == [0, 1, 2] and len(set(cols.tolist())) == 3


def test_non_finite_predictions_raise_a_clear_error():
    matcher = HungarianMatcher()
    outputs, targets = random_problem(1, 3, 3, [2])
    outputs.boxes[0, 0, 0] = float("nan")
    try:
        matcher(outputs, targets)
    except FloatingPointError as error:
        assert "not finite" in str(error)
    else:
        raise AssertionError("NaN predictions were matched silently")


def test_every_layer_in_one_pass_equals_one_call_per_layer():
    matcher = HungarianMatcher()
    layers = [random_problem(2, 12, 5, [1, 1], seed=seed)[0] for seed in range(4)]
    _, targets = random_problem(2, 12, 5, [4, 7], seed=9)
    together = matcher.match_layers(layers, targets)
    assert len(together) == len(layers)
    for layer, indices in zip(layers, together):
        for (rows, cols), (expected_rows, expected_cols) in zip(indices, matcher(layer, targets), strict=True):
            assert torch.equal(rows, expected_rows) and torch.equal(cols, expected_cols)
    # layers of different shapes (or one layer) are matched one by one
    mixed = [layers[0], random_problem(2, 8, 5, [1, 1], seed=5)[0]]
    assert [len(indices) for indices in matcher.match_layers(mixed, targets)] == [2, 2]
