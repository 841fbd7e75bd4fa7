"""The ResNet backbone's CPU training paths (frozen stages in NHWC, frozen norms folded on the fly) are used in a
training forward only: an inference forward runs torchvision's own modules in NCHW, so that a loaded model's
outputs round exactly as the reference's do."""

from __future__ import annotations

import pytest
import torch

from detr.models.backbone import Backbone


def _plain(backbone: Backbone, images: torch.Tensor) -> torch.Tensor:
    features = images
    for stage in backbone.body.values():
        features = stage(features)
    return features


@pytest.fixture
def backbone() -> Backbone:
    torch.manual_seed(0)
    backbone = Backbone("resnet18", trainable_layers=3)
    for module in backbone.modules():  # frozen norms with statistics that are not the identity
        if hasattr(module, "running_mean"):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.2, 0.2)
    backbone.use_folded_batch_norm()
    assert backbone.fold_in_training and backbone.frozen_stages_channels_last
    return backbone


def test_an_inference_forward_is_torchvisions_bit_for_bit(backbone):
    images = torch.randn(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    expected = _plain(backbone, images)
    for train in (False, True):
        backbone.train(train)
        with torch.no_grad():
            features, _ = backbone(images, mask)
        assert features.is_contiguous()
        assert torch.equal(features, expected), f"train={train}: the no-gradient forward left torchvision's path"
    backbone.eval()
    features, _ = backbone(images, mask)  # eval mode with gradients on (an attribution, an export trace)
    assert torch.equal(features.detach(), expected)


def test_a_training_forward_takes_the_fast_paths_with_the_same_numbers(backbone, monkeypatch):
    images = torch.randn(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    folded = []
    import detr.models.backbone as module
    original = module.conv_frozen_norm
    monkeypatch.setattr(module, "conv_frozen_norm", lambda *args: folded.append(1) or original(*args))
    backbone.train()
    features, _ = backbone(images, mask)
    assert folded  # the folded convolutions ran
    torch.testing.assert_close(features.detach(), _plain(backbone, images).detach(), rtol=1e-4, atol=1e-5)
