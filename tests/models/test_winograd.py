"""A training step's convolutions by the faster algorithm on the CPU (detr/models/layers/conv_norm.py
``training_conv``): a wide 3 × 3 one by Winograd's F(4 × 4, 3 × 3) (detr/models/layers/winograd.py), a depthwise
5 × 5 one in NHWC, a 1 × 1 one of an upsampled concatenation by parts, a backbone's stride-4 part in NHWC. The
same function as ``F.conv2d``: exact to float64 rounding in float64, within float32
rounding in float32, forward and backward; a model's training loss and gradients the plain path's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import detr.models.layers.conv_norm as conv_norm
import detr.models.layers.winograd as winograd
from detr.models.dfine.hgnetv2 import ConvBNAct
from detr.models.layers.conv_norm import ConvNorm, UpsampledConcat, concat_conv, direct_convolutions
from detr.models.layers.winograd import winograd_conv3x3, winograd_pays
from tests.helpers_realtime import tiny_model


def _outputs_and_gradients(convolve, x, weight, bias, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight) + ((bias,) if bias is not None else ())]
    out = convolve(leaves[0], leaves[1], leaves[2] if bias is not None else None)
    out.backward(grad_out)
    return [out.detach()] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("shape", [(1, 3, 8, 8), (2, 4, 9, 13), (1, 5, 4, 7), (2, 2, 1, 1)],
                         ids=["tiles", "ragged", "one-row-of-tiles", "one-pixel"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("chunk", [None, 36 * 6], ids=["whole-images-per-band", "a-row-of-tiles-per-band"])
def test_in_float64_it_is_the_convolution_to_rounding(shape, with_bias, chunk, monkeypatch) -> None:
    if chunk is not None:
        monkeypatch.setattr(winograd, "_CHUNK", chunk)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    weight = torch.randn(6, shape[1], 3, 3, generator=generator, dtype=torch.float64)
    bias = torch.randn(6, generator=generator, dtype=torch.float64) if with_bias else None
    grad_out = torch.randn(shape[0], 6, *shape[2:], generator=generator, dtype=torch.float64)
    ours = _outputs_and_gradients(winograd_conv3x3, x, weight, bias, grad_out)
    plain = _outputs_and_gradients(lambda a, w, b: F.conv2d(a, w, b, padding=1), x, weight, bias, grad_out)
    assert ours[0].shape == plain[0].shape and ours[0].is_contiguous()
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_in_float32_it_is_within_float_rounding_of_the_direct_kernel() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 18, 21, generator=generator)
    weight = torch.randn(16, 24, 3, 3, generator=generator) * 0.2
    bias = torch.randn(16, generator=generator)
    grad_out = torch.randn(2, 16, 18, 21, generator=generator)
    exact = _outputs_and_gradients(lambda a, w, b: F.conv2d(a, w, b, padding=1), x.double(), weight.double(),
                                   bias.double(), grad_out.double())
    ours = _outputs_and_gradients(winograd_conv3x3, x, weight, bias, grad_out)
    for a, b in zip(ours, exact, strict=True):  # relative to the largest value: F(4 × 4, 3 × 3) rounds to ~1e-6
        assert (a.double() - b).abs().max() <= 5e-5 * b.abs().max()


def test_it_runs_where_it_pays_and_nowhere_else() -> None:
    conv = torch.nn.Conv2d(128, 128, 3, padding=1, bias=False)
    x = torch.randn(1, 128, 80, 80)
    assert winograd_pays(conv, x)
    assert winograd_pays(torch.nn.Conv2d(256, 512, 3, padding=1), torch.randn(2, 256, 40, 40))
    with torch.no_grad():
        assert not winograd_pays(conv, x)  # inference keeps the direct kernel (and the reference's exact numbers)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not winograd_pays(conv, x)
    assert not winograd_pays(conv, x.double())
    assert not winograd_pays(conv, x.contiguous(memory_format=torch.channels_last))
    assert not winograd_pays(conv, x[..., :40, :40])  # a small map: the transforms cost more than they save
    wide = torch.nn.Conv2d(512, 512, 3, padding=1)
    assert winograd_pays(wide, torch.randn(4, 512, 20, 20))  # 512 channels on 20 × 20 pay from 4 images on
    assert not winograd_pays(wide, torch.randn(2, 512, 20, 20))
    for other in (torch.nn.Conv2d(128, 128, 3, stride=2, padding=1), torch.nn.Conv2d(128, 128, 3, padding=0),
                  torch.nn.Conv2d(128, 128, 3, padding=1, groups=2), torch.nn.Conv2d(128, 128, 3, padding=2,
                                                                                  dilation=2),
                  torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.Conv2d(128, 128, 1),
                  torch.nn.Conv2d(128, 128, 3, padding=1, padding_mode="reflect")):
        assert not winograd_pays(other, x)


def _spy(monkeypatch, name: str) -> list[int]:
    calls = []
    original = getattr(conv_norm, name)
    monkeypatch.setattr(conv_norm, name, lambda *args: calls.append(1) or original(*args))
    return calls


def _step(module: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor | None = None) -> list[torch.Tensor]:
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out = module(x)
    out.backward(grad_out if grad_out is not None else torch.ones_like(out))
    return [out.detach(), x.grad] + [p.grad for p in module.parameters() if p.grad is not None]


def test_a_wide_convnorm_trains_by_winograd_with_the_plain_outputs_and_gradients(monkeypatch) -> None:
    torch.manual_seed(0)
    module = ConvNorm(128, 128, 3, activation=torch.nn.SiLU()).train()  # a trained BatchNorm, as the encoders'
    x = torch.randn(2, 128, 80, 80)
    grad_out = torch.randn(2, 128, 80, 80)
    calls = _spy(monkeypatch, "winograd_conv3x3")
    ours = _step(module, x, grad_out)
    assert calls
    with direct_convolutions():
        plain = _step(module, x, grad_out)
    assert len(calls) == 1
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_a_depthwise_5x5_trains_in_nhwc_and_hands_back_nchw(monkeypatch) -> None:
    torch.manual_seed(0)
    module = ConvBNAct(16, 16, 5, groups=16, lab=True).train()
    x = torch.randn(2, 16, 12, 12)
    calls = _spy(monkeypatch, "depthwise_conv_nhwc")
    out = module(x)
    assert calls and out.is_contiguous()
    with direct_convolutions():
        plain = module(x)
    assert len(calls) == 1 and module(x) is not None and len(calls) == 2  # on again after the block
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["rtdetr", "dfine"])
def test_a_training_step_is_as_close_to_exact_as_the_direct_kernels(family, monkeypatch) -> None:
    """Every eligible convolution of a tiny model's backbone and encoder by Winograd (the thresholds lowered so that
    its narrow layers qualify): its encoder maps and every gradient (of a random projection of the maps) against
    the same step in float64: no farther than 10 times the direct kernels' float32 step, or 0.2 % of the largest
    value. (The gradients of a tiny random model include sums over whole maps that cancel, such as HGNetV2's
    affine biases, where float32 itself is off by 0.6 %. The decoder is left out: its top-k query selection may
    pick other queries after any rounding difference where a random model's scores nearly tie.)"""
    model = tiny_model(family).train()
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(3)
    projections: list[torch.Tensor] = []

    def step(model: torch.nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        maps = model.encoder(model.backbone(images))
        while len(projections) < len(maps):
            projections.append(torch.randn(maps[len(projections)].shape, generator=generator, dtype=torch.float64))
        sum((feature * projection.to(feature.dtype)).sum() for feature, projection in zip(maps, projections)
            ).backward()
        values = {f"map {level}": feature.detach().double() for level, feature in enumerate(maps)}
        return values | {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}

    exact = step(copy.deepcopy(model).double(), images.double())
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd, "MIN_WORK", 1)
    monkeypatch.setattr(winograd, "_CHUNK", 36 * 16 * 4)  # several bands of tiles per image
    calls = _spy(monkeypatch, "winograd_conv3x3")
    ours = step(model, images)
    assert len(calls) >= 3
    with direct_convolutions():
        direct = step(model, images)
    assert ours.keys() == direct.keys() == exact.keys()
    largest = max(value.abs().max().item() for name, value in exact.items() if not name.startswith("map"))
    for name, value in exact.items():
        scale = max(value.abs().max().item(), 1e-3 * (largest if not name.startswith("map") else 1.0))
        our_error = (ours[name] - value).abs().max().item() / scale
        direct_error = (direct[name] - value).abs().max().item() / scale
        assert our_error <= max(10 * direct_error, 2e-3), (name, our_error, direct_error)


def _maps_and_gradients(module: torch.nn.Module, forward) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``forward()``'s maps and ``module``'s parameter gradients of a fixed weighting of the maps."""
    module.zero_grad(set_to_none=True)
    maps = forward()
    sum((feature * torch.linspace(-1, 1, feature.numel()).view_as(feature)).sum() for feature in maps).backward()
    return [feature.detach() for feature in maps], [p.grad for p in module.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", ["rtdetr", "dfine"])
def test_the_stride_4_part_trains_in_nhwc_and_hands_nchw_to_the_next_stage(family) -> None:
    """A CPU training step runs the backbone's stem and first stage in NHWC (``stride_four_nhwc``), the second stage
    on in NCHW; its maps and gradients are the all-NCHW step's to float rounding; inference keeps NCHW."""
    model = tiny_model(family).train()
    backbone = model.backbone
    stem, stages = (backbone.conv1, backbone.res_layers) if family == "rtdetr" else (backbone.stem, backbone.stages)
    layouts: list[tuple[str, bool]] = []

    def record(name: str):
        return lambda module, inputs: layouts.append((name, inputs[0].is_contiguous()))
    stem.register_forward_pre_hook(record("stem"))
    stages[0].register_forward_pre_hook(record("stage 1"))
    stages[1].register_forward_pre_hook(record("stage 2"))
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))

    def step() -> list[torch.Tensor]:
        maps, gradients = _maps_and_gradients(backbone, lambda: backbone(images))
        assert all(feature.is_contiguous() for feature in maps)
        return maps + gradients

    ours = step()
    assert layouts == [("stem", False), ("stage 1", False), ("stage 2", True)]
    layouts.clear()
    with direct_convolutions():
        plain = step()
    assert layouts == [("stem", True), ("stage 1", True), ("stage 2", True)]
    assert len(ours) == len(plain) > 3
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(b.abs().max().item(), 1.0))
    layouts.clear()
    with torch.no_grad():
        backbone(images)
    assert all(contiguous for _, contiguous in layouts)


@pytest.mark.parametrize("kernel", [1, 3], ids=["1x1-by-parts", "3x3-written-out"])
def test_a_convolution_of_an_upsampled_concatenation_is_the_concatenations(kernel) -> None:
    generator = torch.Generator().manual_seed(5)
    coarse = torch.randn(2, 3, 4, 5, generator=generator, dtype=torch.float64)
    fine = torch.randn(2, 4, 8, 10, generator=generator, dtype=torch.float64)
    conv = torch.nn.Conv2d(7, 6, kernel, padding=kernel // 2).double()
    grad_out = torch.randn(2, 6, 8, 10, generator=generator, dtype=torch.float64)

    def outputs_and_gradients(convolve) -> list[torch.Tensor]:
        leaves = [t.detach().clone().requires_grad_() for t in (coarse, fine, conv.weight, conv.bias)]
        out = convolve(UpsampledConcat(leaves[0], leaves[1]), leaves[2], leaves[3])
        out.backward(grad_out)
        return [out.detach()] + [leaf.grad for leaf in leaves]

    ours = outputs_and_gradients(lambda x, weight, bias: concat_conv(conv, x, weight, bias))
    written = outputs_and_gradients(lambda x, weight, bias: F.conv2d(
        torch.cat([F.interpolate(x.coarse, scale_factor=2.0), x.fine], dim=1), weight, bias, padding=kernel // 2))
    for a, b in zip(ours, written, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ["rtdetr", "dfine"])
def test_the_top_down_fusion_reads_its_concatenation_by_parts_in_training_and_once_optimized(family) -> None:
    """The encoder's top-down fusion blocks get an ``UpsampledConcat`` in a training step (its maps and gradients
    the written-out concatenation's, ``direct_convolutions``, to float rounding) and after ``reparameterize``; the
    reference's inference forward gets the concatenation itself."""
    model = tiny_model(family).train()
    encoder = model.encoder
    seen: list[type] = []
    for block in encoder.fpn_blocks:
        block.register_forward_pre_hook(lambda module, inputs: seen.append(type(inputs[0])))
    features = [feature.detach() for feature in model.backbone(torch.rand(2, 3, 64, 64))]

    def step() -> list[torch.Tensor]:
        maps, gradients = _maps_and_gradients(
            encoder, lambda: encoder([feature.clone().requires_grad_() for feature in features]))
        return maps + gradients

    ours = step()
    assert seen and set(seen) == {UpsampledConcat}
    seen.clear()
    with direct_convolutions():
        written = step()
    assert seen and set(seen) == {torch.Tensor}
    largest = max(b.abs().max().item() for b in written)  # (a BatchNorm's bias gradient sums a map that cancels)
    for a, b in zip(ours, written, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * largest)
    encoder.eval()
    seen.clear()
    with torch.no_grad():
        reference = encoder(features)
        encoder.reparameterize()
        optimized = encoder(features)
    assert seen[:len(seen) // 2] == [torch.Tensor] * (len(seen) // 2)
    assert seen[len(seen) // 2:] == [UpsampledConcat] * (len(seen) // 2)
    for a, b in zip(optimized, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(b.abs().max().item(), 1.0))
