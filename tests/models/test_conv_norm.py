"""A training forward folds a frozen BatchNorm into the convolution before it (detr/models/layers/conv_norm.py
``conv_frozen_norm``: RT-DETR's ResNet-vd ConvNorm, D-FINE's HGNetV2 ConvBNAct): outputs and gradients equal the
plain ``norm(conv(x))``'s within 1e-5; inference keeps the plain path, bit for bit. A layer's fresh output gets its
activation and residual sum in place where that is safe (``fresh_activation``, ``fresh_sum``): the same values and
gradients."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from detr.models.dfine.hgnetv2 import ConvBNAct
from detr.models.layers.conv_norm import ConvNorm, fresh_activation, fresh_sum


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


@pytest.mark.parametrize("activation", [torch.nn.ReLU(), torch.nn.SiLU(), torch.nn.functional.relu,
                                        torch.nn.functional.silu, torch.nn.GELU()],
                         ids=["relu", "silu", "f.relu", "f.silu", "gelu"])
def test_a_fresh_maps_activation_runs_in_place_where_that_is_safe(activation) -> None:
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        fresh = x.clone()
        out = fresh_activation(activation, fresh)
    assert torch.equal(out, activation(x))
    in_place = not isinstance(activation, torch.nn.GELU)
    assert (out.data_ptr() == fresh.data_ptr()) == in_place
    # with gradients: ReLU in place (its backward reads its output), SiLU not (its backward reads its input); the
    # gradients are the plain activation's
    leaf = x.clone().requires_grad_()
    fresh = leaf * 1.0
    out = fresh_activation(activation, fresh)
    relu = isinstance(activation, torch.nn.ReLU) or activation is torch.nn.functional.relu
    assert (out.data_ptr() == fresh.data_ptr()) == relu
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    plain = x.clone().requires_grad_()
    activation(plain).backward(grad_out)
    assert torch.equal(leaf.grad, plain.grad)


def test_a_fresh_maps_sum_runs_in_place_only_without_gradients() -> None:
    a, b = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        fresh = a.clone()
        assert fresh_sum(fresh, b).data_ptr() == fresh.data_ptr() and torch.equal(fresh, a + b)
        small = a[:, :, :1].clone()  # broadcast to a larger sum: a new tensor
        assert torch.equal(fresh_sum(small, b), a[:, :, :1] + b) and torch.equal(small, a[:, :, :1])
    weight = torch.ones(1, requires_grad=True)
    fresh = a * weight
    out = fresh_sum(fresh, b)
    assert out.data_ptr() != fresh.data_ptr()
    out.sum().backward()
    assert weight.grad.item() == pytest.approx(a.sum().item(), rel=1e-5)
