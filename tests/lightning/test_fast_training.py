"""The training step's speed-ups change no number: a step with every fast option on (frozen BatchNorms folded
into the convolutions, the NHWC backbone) gives the plain step's losses and gradients to float rounding.

The model runs in float64: a random ResNet amplifies float32 rounding in its backward to relative gradient
differences of 1e-2 (the NHWC layout alone does), which would hide a real error; in float64 the paths agree to
1e-14, so any tolerance above that catches a wrong formula."""

from __future__ import annotations

import pytest
import torch

from detr.lightning import DetrSystem
from detr.lightning.options import EvaluationOptions, RuntimeOptions
from detr.models.detr_family import DetrConfig
from tests.helpers import randomise, tiny_config_with

pytestmark = pytest.mark.usefixtures("one_thread")


def _batch() -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 96, 128, generator=generator)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    images[1, :, :, 100:] = 0
    mask[1, :, 100:] = True  # the second image is padded on the right
    targets = [{"boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3], [0.3, 0.6, 0.2, 0.2]]), "labels": torch.tensor([1, 4])},
               {"boxes": torch.tensor([[0.4, 0.4, 0.5, 0.5]]), "labels": torch.tensor([2])}]
    return images, mask, targets


def _step(config: DetrConfig, **options) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward, loss and backward of a DetrSystem from fixed random weights (frozen BatchNorm statistics
    far from the identity, so that folding has something to fold): the loss terms and every gradient."""
    torch.manual_seed(0)
    system = DetrSystem(detr=config, evaluation=EvaluationOptions(evaluation_dir=""),
                        runtime=RuntimeOptions(**options)).train()
    randomise(system.model, seed=2)
    system.model.double()
    images, mask, targets = _batch()
    torch.manual_seed(3)  # the same dropout masks on both paths
    outputs = system(images.double(), mask, targets)
    losses = system.compute_losses(outputs, targets)
    losses["loss"].backward()
    gradients = {name: p.grad for name, p in system.model.named_parameters() if p.grad is not None}
    return {name: value.detach() for name, value in losses.items()}, gradients


@pytest.mark.parametrize("trainable_layers", [3, 5])  # the paper's (stem and layer1 frozen); all trained
def test_fast_options_give_the_plain_losses_and_gradients(trainable_layers: int) -> None:
    config = tiny_config_with(backbone_trainable_layers=trainable_layers)
    plain_losses, plain_gradients = _step(config, fold_batch_norm=False)  # folding is DetrSystem's default
    fast_losses, fast_gradients = _step(config, fold_batch_norm=True, channels_last=True)
    assert fast_losses.keys() == plain_losses.keys()
    for name, value in plain_losses.items():
        torch.testing.assert_close(fast_losses[name], value, rtol=1e-9, atol=1e-9)
    assert fast_gradients.keys() == plain_gradients.keys()
    assert any(name.startswith("backbone.0.body.layer4") for name in plain_gradients)
    assert any(name.startswith("backbone.0.body.conv1") for name in plain_gradients) == (trainable_layers == 5)
    for name, value in plain_gradients.items():
        scale = value.abs().max().clamp(min=1e-6)
        torch.testing.assert_close(fast_gradients[name] / scale, value / scale, rtol=1e-9, atol=1e-9)


def test_folding_keeps_the_state_dict() -> None:
    torch.manual_seed(0)
    system = DetrSystem(detr=tiny_config_with(), evaluation=EvaluationOptions(evaluation_dir=""))  # folding by default
    assert system.model.backbone[0].fold_in_training
    trainable = DetrSystem(detr=tiny_config_with(backbone_norm="batch_norm"),
                           evaluation=EvaluationOptions(evaluation_dir=""))
    assert not trainable.model.backbone[0].fold_in_training  # nothing frozen to fold: torchvision's forward
    keys = set(system.model.state_dict())
    assert "backbone.0.body.layer1.0.bn1.running_var" in keys and "backbone.0.body.bn1.weight" in keys
