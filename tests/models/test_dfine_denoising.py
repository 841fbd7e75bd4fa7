"""D-FINE in training: RT-DETR's contrastive denoising queries leave the selected queries' predictions alone,
the edge distributions its losses read come out for both (training only), and one loss step reaches every head."""

from __future__ import annotations

import torch

from detr import build_detr
from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.loss.build import build_criterion


NUM_CLASSES, NUM_QUERIES, BINS = 6, 10, 32
TINY_DFINE = DFINEConfig(class_head="sigmoid", backbone="hgnetv2_b0", hidden_dim=32, num_heads=4, dim_feedforward=48,
                         num_decoder_layers=2, num_queries=NUM_QUERIES, num_classes=NUM_CLASSES,
                         num_feature_levels=3, denoising=True, dropout=0.0, backbone_norm="batch_norm",
                         pretrained_backbone=False, num_encoder_layers=6, csp_expansion=1.0,
                         backbone_learnable_affine=False, csp_depth_multiplier=1.0,
                         decoder=DistributionDecoder(num_points_per_level=(2, 2, 2)))


def _targets(counts: tuple[int, ...]) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [{"labels": torch.randint(0, NUM_CLASSES, (count,), generator=generator),
             "boxes": torch.cat([torch.rand(count, 2, generator=generator) * 0.5 + 0.25,
                                 torch.rand(count, 2, generator=generator) * 0.3 + 0.1], 1)} for count in counts]


def test_denoising_and_distributions_in_training_only():
    torch.manual_seed(0)
    model = build_detr(TINY_DFINE).train()
    images, mask = torch.rand(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.bool)
    targets = _targets((2, 1))
    with torch.no_grad():
        plain = model(images, mask)
        with_denoising = model(images, mask, targets=targets)
    meta = with_denoising.denoising.meta
    layers = TINY_DFINE.num_decoder_layers
    distributions, dn_distributions = with_denoising.distributions, with_denoising.denoising.distributions
    assert distributions.corners.shape == (layers, 2, NUM_QUERIES, 4 * (BINS + 1))
    assert dn_distributions.corners.shape == (layers, 2, meta.num_queries, 4 * (BINS + 1))
    assert distributions.initial.shape == (2, NUM_QUERIES, 4) and dn_distributions.pre.logits.shape[1] == meta.num_queries
    assert plain.denoising is None and plain.distributions is not None
    torch.testing.assert_close(with_denoising.logits, plain.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(with_denoising.boxes, plain.boxes, rtol=0, atol=1e-6)
    torch.testing.assert_close(with_denoising.distributions.corners, plain.distributions.corners, rtol=0, atol=1e-5)
    model.eval()
    with torch.no_grad():
        evaluated = model(images, mask, targets=targets)
    assert evaluated.denoising is None and evaluated.distributions is None  # inference never builds them


def test_training_reaches_every_head():
    torch.manual_seed(0)
    model = build_detr(TINY_DFINE).train()
    criterion = build_criterion(TINY_DFINE, cost_class=2.0)
    targets = _targets((2, 1))
    outputs = model(torch.rand(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.bool), targets=targets)
    losses = criterion(outputs, targets)
    sum(losses[name] * weight for name, weight in criterion.weight_dict.items()).backward()
    decoder = model.decoder
    heads = [decoder.denoising_class_embed, decoder.enc_score_head, decoder.enc_bbox_head.layers[-1],
             decoder.pre_bbox_head.layers[-1], *decoder.dec_score_head,
             *(head.layers[-1] for head in decoder.dec_bbox_head),
             *(quality.reg_conf.layers[-1] for quality in decoder.decoder.lqe_layers)]
    assert all(head.weight.grad is not None and head.weight.grad.abs().sum() > 0 for head in heads)
