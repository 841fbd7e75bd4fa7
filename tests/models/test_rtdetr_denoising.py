"""RT-DETR's contrastive denoising groups: the same queries, mask and positives as transformers'
get_contrastive_denoising_training_group on one seed, the noise ranges of positive and negative copies, the
selected queries blind to the denoising ones, and inference untouched."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.models.rtdetr.config import RTDETRConfig
from detr.box_ops import cxcywh_to_xyxy
from detr.loss.parts import denoising_indices

from detr.models.rtdetr.denoising import contrastive_denoising_queries

NUM_CLASSES, NUM_QUERIES = 6, 10
TINY_RTDETR = RTDETRConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=4, dim_feedforward=48,
                           num_decoder_layers=2, num_queries=NUM_QUERIES, num_classes=NUM_CLASSES, dropout=0.0,
                           num_points=2, denoising=True, pretrained_backbone=False, num_encoder_layers=6,
                           num_feature_levels=4)


def _targets(counts=(3, 1, 0)) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [{"labels": torch.randint(0, NUM_CLASSES, (count,), generator=generator),
             "boxes": torch.cat([torch.rand(count, 2, generator=generator) * 0.2 + 0.4,
                                 torch.rand(count, 2, generator=generator) * 0.1 + 0.05], 1)} for count in counts]


@pytest.mark.parametrize("num_denoising", [100, 2])  # 2 < the largest target count: one group
def test_denoising_queries_are_transformers(num_denoising):
    rt_detr = pytest.importorskip("transformers.models.rt_detr.modeling_rt_detr")
    targets = _targets()
    embed = torch.nn.Embedding(NUM_CLASSES + 1, 8, padding_idx=NUM_CLASSES)
    torch.manual_seed(11)
    content, logits, mask, meta = contrastive_denoising_queries(
        targets, embed, num_classes=NUM_CLASSES, num_queries=NUM_QUERIES, num_denoising=num_denoising)
    torch.manual_seed(11)
    their_content, their_logits, their_mask, their_meta = rt_detr.get_contrastive_denoising_training_group(
        [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets], NUM_CLASSES, NUM_QUERIES, embed,
        num_denoising_queries=num_denoising, label_noise_ratio=0.5, box_noise_scale=1.0)
    assert (meta.num_groups, meta.num_queries) == (their_meta["dn_num_group"], their_meta["dn_num_split"][0])
    assert torch.equal(content, their_content)
    assert (logits - their_logits).abs().max() <= 1e-5
    assert torch.equal(mask, their_mask == 0)  # theirs: 0 = may attend, -inf = blocked
    for (queries, slots), positives, target in zip(denoising_indices(meta, targets), their_meta["dn_positive_idx"],
                                                   targets):
        assert torch.equal(queries, positives)
        assert torch.equal(slots, torch.arange(len(target["labels"])).repeat(meta.num_groups))


def test_positive_copies_stay_within_half_a_box_and_negatives_beyond():
    targets = _targets((4, 2))
    embed = torch.nn.Embedding(NUM_CLASSES + 1, 8, padding_idx=NUM_CLASSES)
    torch.manual_seed(0)
    _, logits, mask, meta = contrastive_denoising_queries(targets, embed, num_classes=NUM_CLASSES,
                                                          num_queries=NUM_QUERIES, label_noise_ratio=0.0)
    largest = meta.group_size // 2
    boxes = logits.sigmoid().view(len(targets), meta.num_groups, 2, largest, 4)
    corners = cxcywh_to_xyxy(boxes)
    # a negative copy whose corners crossed has a negative size, which the box logits clamp: leave those out
    kept = (boxes[..., 2:] > 1e-3).all(-1, keepdim=True)
    for index, target in enumerate(targets):
        count = len(target["labels"])
        truth = cxcywh_to_xyxy(target["boxes"])  # [T, 4], far from the border: nothing is clipped
        half = target["boxes"][:, 2:].repeat(1, 2) / 2  # [T, 4]: each corner's noise unit
        moved = ((corners[index, :, :, :count] - truth) / half).abs()  # [G, 2, T, 4]
        positive, negative = moved[:, 0], moved[:, 1][kept[index, :, 1, :count].expand(-1, -1, 4)]
        assert kept[index, :, 0, :count].all() and positive.max() < 1 + 1e-4  # positives: under one half size
        assert negative.numel() > 0 and negative.min() > 1 - 1e-4 and negative.max() < 2 + 1e-4  # one to two
    group = torch.arange(meta.num_queries + NUM_QUERIES) // meta.group_size
    denoising = torch.arange(meta.num_queries + NUM_QUERIES) < meta.num_queries
    assert not mask[~denoising][:, denoising].any()  # the selected queries never see a denoising one
    assert torch.equal(mask[denoising][:, denoising], (group[:, None] == group[None, :])[denoising][:, denoising])
    assert mask[:, ~denoising].all()


def test_selected_queries_do_not_depend_on_the_denoising_queries():
    torch.manual_seed(0)
    model = build_detr(TINY_RTDETR).train()
    images = torch.rand(2, 3, 64, 64)
    mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    targets = _targets((2, 1))
    with torch.no_grad():
        plain = model(images, mask)
        with_denoising = model(images, mask, targets=targets)
    meta = with_denoising.denoising.meta
    assert with_denoising.denoising.logits.shape == (2, meta.num_queries, NUM_CLASSES)
    assert len(with_denoising.denoising.aux) == TINY_RTDETR.num_decoder_layers - 1
    assert plain.denoising is None
    torch.testing.assert_close(with_denoising.logits, plain.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(with_denoising.boxes, plain.boxes, rtol=0, atol=1e-6)
    model.eval()
    with torch.no_grad():
        evaluated = model(images, mask, targets=targets)
    assert evaluated.denoising is None  # inference never builds them


def test_training_reaches_every_head():
    torch.manual_seed(0)
    model = build_detr(TINY_RTDETR).train()
    from detr.loss.build import build_criterion

    criterion = build_criterion(TINY_RTDETR, cost_class=2.0)
    targets = _targets((2, 1))
    outputs = model(torch.rand(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.bool), targets=targets)
    losses = criterion(outputs, targets)
    sum(losses[name] * weight for name, weight in criterion.weight_dict.items()).backward()
    decoder = model.decoder
    heads = [decoder.denoising_class_embed, decoder.enc_score_head, decoder.enc_bbox_head.layers[-1],
             *decoder.dec_score_head, *(head.layers[-1] for head in decoder.dec_bbox_head)]
    assert all(head.weight.grad is not None and head.weight.grad.abs().sum() > 0 for head in heads)
