"""Denoising queries (DN-DETR): noise, attention mask, no leakage, losses without matching."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.loss.criterion import SetCriterion
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import DenoisingLoss, denoising_indices
import detr.models.anchor.denoising as denoising
from detr.models.anchor.denoising import DenoisingQueries
from detr.models.layers.denoising import DenoisingMeta, denoising_attention_mask
from tests.helpers import tiny_config_with

TINY = tiny_config_with(num_queries=6, num_classes=4, dropout=0.0)


def _targets(seed: int, counts: tuple[int, ...]) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    targets = []
    for count in counts:
        centre = torch.rand(count, 2, generator=generator) * 0.6 + 0.2
        size = torch.rand(count, 2, generator=generator) * 0.2 + 0.05
        labels = torch.randint(0, TINY.num_classes, (count,), generator=generator)
        targets.append({"labels": labels, "boxes": torch.cat([centre, size], dim=1)})
    return targets


def _batch():
    torch.manual_seed(1)
    return torch.randn(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.bool)


@pytest.fixture
def dn_model():
    torch.manual_seed(0)
    model = build_detr(TINY, query_type="anchor", denoising=True, denoising_groups=3).train()
    with torch.no_grad():  # build_detr starts the box deltas at zero: make boxes depend on the queries
        model.bbox_embed.layers[-1].weight.normal_(0, 0.5)
    return model


def test_attention_mask_blocks_matching_from_denoising_and_groups_from_each_other():
    mask = denoising_attention_mask(num_groups=2, group_size=2, num_queries=3)
    A, B = True, False  # A: may attend
    expected = torch.tensor([
        # g0 g0 g1 g1 m  m  m
        [A, A, B, B, A, A, A],
        [A, A, B, B, A, A, A],
        [B, B, A, A, A, A, A],
        [B, B, A, A, A, A, A],
        [B, B, B, B, A, A, A],
        [B, B, B, B, A, A, A],
        [B, B, B, B, A, A, A],
    ])
    assert torch.equal(mask, expected)


def test_changing_the_denoising_queries_does_not_change_the_matched_queries(dn_model):
    images, mask = _batch()
    out_a = dn_model(images, mask, targets=_targets(0, (3, 1)))
    out_b = dn_model(images, mask, targets=_targets(7, (2, 5)))  # other boxes, labels and group size
    assert out_a.denoising.meta.group_size == 3 and out_b.denoising.meta.group_size == 5
    assert not torch.allclose(out_a.denoising.boxes[:, :2], out_b.denoising.boxes[:, :2])
    for key in ("logits", "boxes"):
        torch.testing.assert_close(getattr(out_a, key), getattr(out_b, key), rtol=1e-5, atol=1e-5)
        for aux_a, aux_b in zip(out_a.aux, out_b.aux):
            torch.testing.assert_close(getattr(aux_a, key), getattr(aux_b, key), rtol=1e-5, atol=1e-5)
    # the matching queries in training equal the inference model's (no denoising queries at all)
    dn_model.eval()
    with torch.no_grad():
        plain = dn_model(images, mask)
    assert plain.denoising is None
    torch.testing.assert_close(out_a.boxes, plain.boxes, rtol=1e-5, atol=1e-5)


def test_groups_do_not_see_each_other(dn_model, monkeypatch):
    """Group 0 keeps the clean ground truth; the other groups' noise changes: group 0's outputs must not."""
    images, mask = _batch()
    targets = _targets(0, (3, 2))
    noise = dn_model.denoising.noise

    def noise_all_but_group0(labels, boxes):  # labels [G · T], boxes [G · T, 4], group-major
        noised_labels, noised_boxes = noise(labels, boxes)
        count = len(labels) // dn_model.denoising.num_groups
        noised_labels[:count], noised_boxes[:count] = labels[:count], boxes[:count]
        return noised_labels, noised_boxes

    monkeypatch.setattr(dn_model.denoising, "noise", noise_all_but_group0)
    torch.manual_seed(10)
    out_a = dn_model(images, mask, targets=targets)
    torch.manual_seed(11)
    out_b = dn_model(images, mask, targets=targets)
    size = out_a.denoising.meta.group_size
    for key in ("logits", "boxes"):
        assert not torch.allclose(getattr(out_a.denoising, key)[:, size:], getattr(out_b.denoising, key)[:, size:])
        torch.testing.assert_close(getattr(out_a.denoising, key)[:, :size], getattr(out_b.denoising, key)[:, :size],
                                   rtol=1e-5, atol=1e-5)


def test_leakage_test_is_sensitive_without_the_mask(dn_model, monkeypatch):
    """Control: with an all-True mask, the matched queries do see the denoising queries."""
    monkeypatch.setattr(denoising, "denoising_attention_mask",
                        lambda g, s, q, device=None: torch.ones(g * s + q, g * s + q, dtype=torch.bool, device=device))
    images, mask = _batch()
    out_a = dn_model(images, mask, targets=_targets(0, (3, 1)))
    out_b = dn_model(images, mask, targets=_targets(7, (2, 5)))
    assert not torch.allclose(out_a.logits, out_b.logits, atol=1e-5)
    assert not torch.allclose(out_a.boxes, out_b.boxes, atol=1e-5)


def test_noise_stays_within_the_papers_bounds():
    torch.manual_seed(0)
    queries = DenoisingQueries(num_classes=7, hidden_dim=16, num_groups=1, label_noise=0.0, box_noise=0.4)
    boxes = torch.tensor([[0.5, 0.5, 0.2, 0.1]]).repeat(2000, 1)
    labels = torch.full((2000,), 3)
    noised_labels, noised = queries.noise(labels, boxes)
    assert torch.equal(noised_labels, labels)
    shift = (noised[:, :2] - boxes[:, :2]).abs()
    assert (shift <= 0.4 * boxes[:, 2:] / 2 + 1e-6).all() and shift.max() > 0.3 * 0.4 * 0.1
    ratio = noised[:, 2:] / boxes[:, 2:]
    assert (ratio >= 0.6 - 1e-6).all() and (ratio <= 1.4 + 1e-6).all()
    flipping = DenoisingQueries(num_classes=7, hidden_dim=16, label_noise=1.0, box_noise=0.0)
    flipped, same_boxes = flipping.noise(labels, boxes)
    assert torch.equal(same_boxes, boxes) and flipped.min() >= 0 and flipped.max() < 7
    assert (flipped != 3).float().mean() > 0.7  # uniformly redrawn: 6/7 differ


def test_queries_layout_and_denoising_indices():
    torch.manual_seed(0)
    queries = DenoisingQueries(num_classes=4, hidden_dim=8, num_groups=2, label_noise=0.0, box_noise=0.0)
    targets = _targets(0, (2, 0, 1))
    tgt = queries.matching_content(3, 5)
    anchors = torch.zeros(3, 5, 4)
    new_tgt, new_anchors, mask, meta = queries(tgt, anchors, targets)
    assert meta == DenoisingMeta(num_groups=2, group_size=2) and mask.shape == (9, 9)
    assert new_tgt.shape == (3, 9, 8) and new_anchors.shape == (3, 9, 4)
    assert (new_tgt[:, :4, -1] == 1).all() and (new_tgt[:, 4:, -1] == 0).all()  # indicator channel
    # with no noise, query g * group_size + t holds target t's box and label
    torch.testing.assert_close(new_anchors[0, [0, 1, 2, 3]].sigmoid(), targets[0]["boxes"].repeat(2, 1), atol=1e-4, rtol=0)
    torch.testing.assert_close(new_tgt[0, 2, :-1], queries.label_embed.weight[targets[0]["labels"][0]])
    indices = denoising_indices(meta, targets)
    assert indices[0][0].tolist() == [0, 1, 2, 3] and indices[0][1].tolist() == [0, 1, 0, 1]
    assert indices[1][0].numel() == 0 and indices[2][0].tolist() == [0, 2]
    # no targets at all: nothing is added
    unchanged = queries(tgt, anchors, _targets(0, (0, 0, 0)))
    assert unchanged[2] is None and unchanged[3] is None and unchanged[0] is tgt


def test_denoising_losses_without_matching(dn_model):
    images, mask = _batch()
    targets = _targets(3, (2, 1))
    out = dn_model(images, mask, targets=targets)
    criterion = SetCriterion(TINY.num_classes, num_decoder_layers=2, parts=[DenoisingLoss(2)])
    losses = criterion(out, targets)
    dn_keys = {f"{n}_dn" for n in ("loss_ce", "loss_bbox", "loss_giou")} | {
        f"{n}_dn_0" for n in ("loss_ce", "loss_bbox", "loss_giou")}
    assert dn_keys <= set(criterion.weight_dict) and dn_keys <= set(losses)
    # hand computation for the last layer: fixed pairs, divided by num_boxes × groups
    meta, dn = out.denoising.meta, out.denoising
    l1, ce = 0.0, []
    for b, target in enumerate(targets):
        for g in range(meta.num_groups):
            for t in range(len(target["labels"])):
                q = g * meta.group_size + t
                l1 += (dn.boxes[b, q] - target["boxes"][t]).abs().sum()
                ce.append(torch.nn.functional.cross_entropy(dn.logits[b, q][None], target["labels"][t][None]))
    assert losses["loss_bbox_dn"].item() == pytest.approx(l1.item() / (3 * 3), rel=1e-5)
    assert losses["loss_ce_dn"].item() == pytest.approx(torch.stack(ce).mean().item(), rel=1e-5)
    total = sum(losses[k] * w for k, w in criterion.weight_dict.items())
    total.backward()
    assert dn_model.denoising.label_embed.weight.grad.abs().sum() > 0
    # evaluation mode: no denoising outputs, the dn terms are zero so weight_dict still applies
    dn_model.eval()
    with torch.no_grad():
        eval_losses = criterion(dn_model(images, mask), targets)
    assert all(eval_losses[k].item() == 0 for k in dn_keys)
    # a criterion without denoising refuses dn outputs instead of silently ignoring them
    with pytest.raises(ValueError, match="DenoisingLoss"):
        SetCriterion(TINY.num_classes, num_decoder_layers=2)(out, targets)


def test_focal_denoising_class_loss():
    torch.manual_seed(0)
    model = build_detr(TINY, query_type="anchor", class_head="sigmoid", denoising=True).train()
    images, mask = _batch()
    targets = _targets(3, (2, 1))
    out = model(images, mask, targets=targets)
    criterion = SetCriterion(TINY.num_classes, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid",
                             num_decoder_layers=2, parts=[DenoisingLoss(2, class_head="sigmoid")])
    losses = criterion(out, targets)
    meta, dn = out.denoising.meta, out.denoising
    indices = denoising_indices(meta, targets)
    logits = torch.cat([dn.logits[b, q] for b, (q, _) in enumerate(indices)])
    labels = torch.cat([t["labels"][i] for t, (_, i) in zip(targets, indices)])
    onehot = torch.nn.functional.one_hot(labels, TINY.num_classes).float()
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, onehot, reduction="none")
    p = logits.sigmoid()
    p_t = p * onehot + (1 - p) * (1 - onehot)
    expected = (expected * (1 - p_t) ** 2 * (0.25 * onehot + 0.75 * (1 - onehot))).sum() / (3 * meta.num_groups)
    assert losses["loss_ce_dn"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_training_forward_needs_targets(dn_model):
    images, mask = _batch()
    with pytest.raises(ValueError, match="targets"):
        dn_model(images, mask)
    with pytest.raises(ValueError, match="query_type='anchor'"):
        build_detr(TINY, denoising=True)
