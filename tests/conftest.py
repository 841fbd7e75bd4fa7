"""Shared fixtures: tiny models and padded batches that keep the suite fast on 2 CPU cores."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr

TINY = dict(backbone="resnet18", hidden_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
            dim_feedforward=64, num_queries=10, num_classes=5)


@pytest.fixture
def tiny_config() -> dict:
    return dict(TINY)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return build_detr(**TINY, dropout=0.0).eval()


@pytest.fixture
def padded_batch():
    """Two images of different sizes, zero-padded to 96 × 128 (bottom/right), mask True on padding."""
    torch.manual_seed(1)
    images = torch.zeros(2, 3, 96, 128)
    mask = torch.ones(2, 96, 128, dtype=torch.bool)
    images[0], mask[0] = torch.randn(3, 96, 128), False
    images[1, :, :64, :96], mask[1, :64, :96] = torch.randn(3, 64, 96), False
    return images, mask
