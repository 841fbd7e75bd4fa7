"""A training forward folds a frozen BatchNorm into the convolution before it (detr/models/layers/conv_norm.py
``conv_frozen_norm``: RT-DETR's ResNet-vd ConvNorm, D-FINE's HGNetV2 ConvBNAct): outputs and gradients equal the
plain ``norm(conv(x))``'s within 1e-5; inference keeps the plain path, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from detr.models.dfine.hgnetv2 import ConvBNAct
from detr.models.layers.conv_norm import ConvNorm


def _frozen(module: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    for norm in module.modules():
        if isinstance(norm, FrozenBatchNorm2d):
            channels = norm.weight.shape[0]
            norm.weight.copy_(torch.rand(channels, generator=generator) + 0.5)
            norm.bias.copy_(torch.randn(channels, generator=generator))
            norm.running_mean.copy_(torch.randn(channels, generator=generator))
            norm.running_var.copy_(torch.rand(channels, generator=generator) + 0.1)
    return module


def _plain(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, ConvNorm):
        return module.activation(module.norm(module.conv(x)))
    y = module.bn(module.conv(x))
    return module.lab(torch.relu(y)) if module.activation else y


@pytest.mark.parametrize("make", [
    lambda: ConvNorm(6, 8, 3, 2, norm=FrozenBatchNorm2d, activation=torch.nn.ReLU()),
    lambda: ConvNorm(6, 8, 1, norm=FrozenBatchNorm2d),
    lambda: ConvBNAct(6, 8, 3, lab=True),
    lambda: ConvBNAct(8, 8, 5, groups=8, lab=True),
    lambda: ConvBNAct(6, 8, 1, activation=False),
], ids=["resnet-vd-3x3-stride-2", "resnet-vd-1x1", "hgnetv2-lab", "hgnetv2-depthwise", "hgnetv2-plain"])
def test_the_folded_training_forward_has_the_plain_outputs_and_gradients(make) -> None:
    torch.manual_seed(0)
    module = _frozen(make()).train()
    x = torch.randn(2, module.conv.in_channels, 9, 11, requires_grad=True)
    grad_out = None
    results = []
    for forward in (module, lambda inputs: _plain(module, inputs)):
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = forward(x)
        grad_out = torch.randn_like(out, generator=torch.Generator().manual_seed(1)) if grad_out is None else grad_out
        out.backward(grad_out)
        results.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
    folded, plain = results
    for a, b in zip(folded, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_inference_keeps_the_plain_path_bit_for_bit() -> None:
    module = _frozen(ConvBNAct(6, 8, 3, lab=True)).eval()
    x = torch.randn(2, 6, 9, 11)
    with torch.no_grad():
        assert torch.equal(module(x), _plain(module, x))
    module.train()
    with torch.no_grad():  # no gradient: the plain path too
        assert torch.equal(module(x), _plain(module, x))


def test_a_training_forward_runs_the_folded_convolution(monkeypatch) -> None:
    import detr.models.dfine.hgnetv2 as hgnetv2
    import detr.models.layers.conv_norm as conv_norm

    calls = []
    for module in (conv_norm, hgnetv2):
        original = module.conv_frozen_norm
        monkeypatch.setattr(module, "conv_frozen_norm",
                            lambda *args, original=original: calls.append(1) or original(*args))
    x = torch.randn(1, 6, 8, 8)
    _frozen(ConvNorm(6, 8, 3, norm=FrozenBatchNorm2d)).train()(x)
    _frozen(ConvBNAct(6, 8, 3)).train()(x)
    assert len(calls) == 2
