"""anchor_local_attention: the anchor decoder's first cross-attention starts centred on each anchor."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from tests.helpers import tiny_config_with

SMALL = tiny_config_with(hidden_dim=64, num_heads=4, num_queries=6, num_classes=3, dropout=0.0, query_type="anchor",
                         backbone_last_stage="layer3")


def peak_distance(model: torch.nn.Module) -> float:
    """Mean distance (in feature cells) between each query's first-layer attention peak and its anchor."""
    torch.manual_seed(0)
    images, mask = torch.randn(1, 3, 256, 256), torch.zeros(1, 256, 256, dtype=torch.bool)
    with torch.no_grad():
        out = model.eval()(images, mask, return_attention=True)
    attention = out.attention.decoder[0, 0]  # [Q, h, w], first layer
    queries, height, width = attention.shape
    peaks = attention.flatten(1).argmax(1)
    peak_y, peak_x = (peaks // width).float() + 0.5, (peaks % width).float() + 0.5
    anchors = model.refpoint_embed.weight.sigmoid()  # [Q, 4] cxcywh in [0, 1]
    return torch.hypot(peak_x - anchors[:, 0] * width, peak_y - anchors[:, 1] * height).mean().item()


def test_local_init_puts_attention_on_the_anchor():
    torch.manual_seed(1)
    local = build_detr(SMALL, anchor_local_attention=4.0)
    torch.manual_seed(1)
    default = build_detr(SMALL)
    with torch.no_grad():  # the same anchors for both, spread over the image
        anchors = torch.logit(torch.tensor([[0.2, 0.2, 0.1, 0.1], [0.8, 0.3, 0.1, 0.1], [0.5, 0.5, 0.1, 0.1],
                                            [0.3, 0.8, 0.1, 0.1], [0.7, 0.7, 0.1, 0.1], [0.1, 0.6, 0.1, 0.1]]))
        local.refpoint_embed.weight.copy_(anchors)
        default.refpoint_embed.weight.copy_(anchors)
    assert peak_distance(local) < 1.5  # within about one 16-pixel cell of the anchor centre
    assert peak_distance(default) > peak_distance(local)
    assert local.config.anchor_local_attention == 4.0


def test_local_init_needs_anchor_queries():
    with pytest.raises(ValueError, match="query_type='anchor'"):
        build_detr(backbone="resnet18", anchor_local_attention=4.0)
