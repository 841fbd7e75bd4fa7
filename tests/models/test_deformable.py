"""Deformable DETR: the sampling core against bilinear interpolation by hand, the four variants' outputs,
the config's checks, gradients through the sampling offsets, and the sampling points it reports."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.models.deformable.config import DeformableConfig
from detr.models.detr_family import DetrConfig
from detr.models.layers.deformable_attention import (
    MultiScaleDeformableAttention,
    deformable_sampling,
    use_bilinear_kernel,
)
from tests.helpers import tiny_config_with

TINY_DEFORMABLE = tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2, dropout=0.0)
VARIANTS = {"plain": {}, "box_refine": {"box_refine": True}, "two_stage": {"box_refine": True, "two_stage": True},
            "single_scale": {"num_feature_levels": 1}}


def _batch():
    torch.manual_seed(1)
    images = torch.randn(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 80:] = True
    return images, mask


def test_sampling_at_cell_centres_reads_the_cells_and_bilinear_between():
    torch.manual_seed(0)
    shapes = [(3, 4), (2, 2)]
    value = torch.randn(1, 3 * 4 + 2 * 2, 1, 5)  # [B, S, H, D]
    level0 = value[0, :12, 0].view(3, 4, 5)
    # one query, one head, two levels, one point each; all the weight on level 0
    weights = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2, 1)
    centre = torch.tensor([(2 + 0.5) / 4, (1 + 0.5) / 3])  # cell (y=1, x=2)
    locations = torch.stack([centre, centre]).view(1, 1, 1, 2, 1, 2)
    assert torch.allclose(deformable_sampling(value, shapes, locations, weights)[0, 0], level0[1, 2], atol=1e-6)
    # half-way between cells (1, 2) and (1, 3): their mean
    between = torch.tensor([(3 + 0.0) / 4, (1 + 0.5) / 3])
    locations = torch.stack([between, between]).view(1, 1, 1, 2, 1, 2)
    expected = (level0[1, 2] + level0[1, 3]) / 2
    assert torch.allclose(deformable_sampling(value, shapes, locations, weights)[0, 0], expected, atol=1e-6)
    # outside the map: zeros
    outside = torch.tensor([1.5, 1.5]).expand(2, 2).reshape(1, 1, 1, 2, 1, 2)
    assert deformable_sampling(value, shapes, outside, weights).abs().max() == 0


def test_initial_offsets_are_rays_of_growing_length_and_uniform_weights():
    attention = MultiScaleDeformableAttention(hidden_dim=32, num_heads=4, num_levels=2, num_points=3)
    query = torch.randn(1, 5, 32)
    reference = torch.full((1, 5, 2, 2), 0.5)
    locations, weights = attention.sampling(query, reference, [(10, 10), (5, 5)])
    assert locations.shape == (1, 5, 4, 2, 3, 2) and weights.shape == (1, 5, 4, 2, 3)
    assert torch.allclose(weights, torch.full_like(weights, 1 / 6))
    # head 0 looks along +x: points 1, 2, 3 cells away on each level
    assert torch.allclose(locations[0, 0, 0, 0, :, 0], 0.5 + torch.tensor([1.0, 2.0, 3.0]) / 10)
    assert torch.allclose(locations[0, 0, 0, 1, :, 0], 0.5 + torch.tensor([1.0, 2.0, 3.0]) / 5)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_predicts_every_layer_and_reports_its_sampling(variant):
    model = build_detr(TINY_DEFORMABLE, **VARIANTS[variant]).eval()
    images, mask = _batch()
    with torch.no_grad():
        out = model(images, mask, return_attention=True)
    config = model.config
    queries, classes = config.num_queries, config.num_classes
    assert out.logits.shape == (2, queries, classes) and out.boxes.shape == (2, queries, 4)
    assert len(out.aux) == config.num_decoder_layers - 1
    assert ((out.boxes >= 0) & (out.boxes <= 1)).all()
    assert (out.proposals is not None) == (variant == "two_stage")
    levels = config.num_feature_levels
    assert out.sampling.locations.shape == (config.num_decoder_layers, 2, queries, config.num_heads, levels,
                                               config.num_points, 2)
    assert torch.allclose(out.sampling.weights.sum((-1, -2)), torch.ones(()), atol=1e-5)
    expected_shapes = [(12, 16), (6, 8), (3, 4), (2, 2)] if levels == 4 else [(3, 4)]
    assert out.sampling.spatial_shapes.tolist() == [list(s) for s in expected_shapes]
    assert model.stride == (8 if levels == 4 else 32)
    with torch.no_grad():  # return_attention changes nothing else
        plain = model(images, mask)
    assert torch.equal(plain.boxes, out.boxes)


def test_heads_are_shared_without_refinement_and_separate_with_it():
    shared = build_detr(TINY_DEFORMABLE)
    assert shared.class_embed[0] is shared.class_embed[1] and shared.bbox_embed[0] is shared.bbox_embed[1]
    refined = build_detr(TINY_DEFORMABLE, box_refine=True, two_stage=True)
    assert len(refined.class_embed) == TINY_DEFORMABLE.num_decoder_layers + 1  # + the encoder's head
    assert refined.class_embed[0] is not refined.class_embed[1]
    assert "query_embed.weight" not in refined.state_dict() and "transformer.enc_output.weight" in refined.state_dict()


def test_the_loss_reaches_the_sampling_offsets_and_the_backbone():
    model = build_detr(TINY_DEFORMABLE, box_refine=True).train()
    images, mask = _batch()
    out = model(images, mask)
    (out.boxes.sum() + out.logits.sum()).backward()
    layer = model.transformer.decoder.layers[0].cross_attn
    assert layer.sampling_offsets.weight.grad.abs().sum() > 0
    assert model.backbone[0].body.layer2[0].conv1.weight.grad.abs().sum() > 0
    assert model.input_proj[3][0].weight.grad.abs().sum() > 0


def test_two_stage_on_images_too_small_for_its_queries_says_so():
    model = build_detr(TINY_DEFORMABLE, box_refine=True, two_stage=True, num_queries=300).eval()
    with pytest.raises(ValueError, match="use larger images or fewer queries"):
        model(torch.randn(1, 3, 96, 96), torch.zeros(1, 96, 96, dtype=torch.bool))  # 193 positions


@pytest.mark.parametrize("changes, message", [
    ({"class_head": "softmax"}, "class_head='sigmoid'"),
    ({"hidden_dim": 48}, "divide by 32"),
    ({"two_stage": True}, "needs box_refine"),
    ({"query_type": "anchor"}, "unknown model option"),
])
def test_config_refuses_what_the_model_lacks(changes, message):
    with pytest.raises(ValueError, match=message):
        DeformableConfig.from_dict(changes)


def test_deformable_options_are_deformable_s_config_s_only():
    with pytest.raises(ValueError, match="unknown model option.*box_refine"):
        DetrConfig.from_dict({"box_refine": True})


def _sampling_case(points_per_level, dtype=torch.float32):
    """value, locations and weights on two levels at every kind of location: inside, on the border, partly and
    far outside the map (and on both sides of it)."""
    torch.manual_seed(0)
    shapes = [(5, 7), (3, 4)]
    value = torch.randn(2, sum(h * w for h, w in shapes), 2, 4, dtype=dtype)
    total = 4 if points_per_level is None else sum(points_per_level)
    locations = torch.rand(2, 9, 2, total, 2, dtype=dtype) * 1.6 - 0.3
    locations[0, 0, 0, 0] = torch.tensor([0.0, 1.0])  # the map's corner
    locations[0, 0, 0, 1] = torch.tensor([-5.0, 0.5])  # far outside
    locations[0, 0, 1, 1] = torch.tensor([0.5, 7.0])
    weights = torch.rand(2, 9, 2, total, dtype=dtype)
    if points_per_level is None:
        locations = locations.view(2, 9, 2, 2, 2, 2)
        weights = weights.view(2, 9, 2, 2, 2)
    return shapes, value, locations, weights


@pytest.mark.parametrize("kernel", ["gather", "embedding_bag"])
@pytest.mark.parametrize("points_per_level", [None, (1, 3)])
def test_each_kernel_samples_what_grid_sample_samples(kernel, points_per_level):
    """Four index gathers from the map padded with zeros, and the one embedding bag over every level, equal
    grid_sample (bilinear, zero padding, align_corners=False) at every location: inside, on the border, partly
    and far outside the map."""
    shapes, value, locations, weights = _sampling_case(points_per_level)
    expected = deformable_sampling(value, shapes, locations, weights, points_per_level=points_per_level,
                                   kernel="grid_sample")
    got = deformable_sampling(value, shapes, locations, weights, points_per_level=points_per_level, kernel=kernel)
    assert (got - expected).abs().max() < 1e-5


@pytest.mark.parametrize("points_per_level", [None, (1, 3)])
def test_the_embedding_bag_reads_the_nearest_cell_as_the_discrete_sampling(points_per_level):
    shapes, value, locations, weights = _sampling_case(points_per_level, torch.float64)
    expected = deformable_sampling(value, shapes, locations, weights, "discrete", points_per_level, kernel="gather")
    got = deformable_sampling(value, shapes, locations, weights, "discrete", points_per_level, kernel="embedding_bag")
    assert (got - expected).abs().max() < 1e-12


def test_the_embedding_bag_has_grid_samples_gradients():
    """In float64 the embedding bag's gradients of the value, the locations and the weights are grid_sample's
    (the bilinear weights carry the locations' gradient)."""
    gradients = {}
    for kernel in ("grid_sample", "embedding_bag"):
        shapes, value, locations, weights = _sampling_case((1, 3), torch.float64)
        locations = locations.clamp(-0.2, 1.2)  # no location exactly on a cell's edge: the gradient jumps there
        inputs = [tensor.requires_grad_() for tensor in (value, locations, weights)]
        deformable_sampling(*inputs[:1], shapes, *inputs[1:], points_per_level=(1, 3), kernel=kernel
                            ).square().sum().backward()
        gradients[kernel] = [tensor.grad for tensor in inputs]
    for expected, got in zip(gradients["grid_sample"], gradients["embedding_bag"]):
        assert torch.allclose(got, expected, atol=1e-10)


def test_auto_bags_without_a_gradient_and_grid_samples_with_one(monkeypatch):
    """The default kernel: the embedding bag in inference (its forward is the fastest), grid_sample when a
    gradient is needed (its backward is the faster); a location that is not finite reads nothing and breaks no
    index."""
    shapes, value, locations, weights = _sampling_case(None)
    calls = []
    embedding_bag = torch.nn.functional.embedding_bag
    monkeypatch.setattr(torch.nn.functional, "embedding_bag", lambda *a, **k: calls.append(1) or embedding_bag(*a, **k))
    with torch.no_grad():
        deformable_sampling(value, shapes, locations, weights)
    assert len(calls) == 1
    deformable_sampling(value.requires_grad_(), shapes, locations, weights)
    assert len(calls) == 1
    locations[0, 0, 0, 0, 0] = torch.tensor([float("nan"), float("inf")])
    with torch.no_grad():
        got = deformable_sampling(value, shapes, locations, weights)
    assert torch.isfinite(got[1]).all()


def test_a_model_switched_to_each_kernel_predicts_the_same():
    model = build_detr(tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2,
                                        box_refine=True, two_stage=True)).eval()
    images = torch.randn(1, 3, 64, 96)
    mask = torch.zeros(1, 64, 96, dtype=torch.bool)
    mask[:, :, 80:] = True
    with torch.no_grad():
        assert {module.bilinear_kernel for module in model.modules()
                if isinstance(module, MultiScaleDeformableAttention)} == {"auto"}
        use_bilinear_kernel(model, "grid_sample")
        expected = model(images, mask)
        for kernel in ("gather", "embedding_bag", "auto"):
            assert use_bilinear_kernel(model, kernel) == sum(
                isinstance(m, MultiScaleDeformableAttention) for m in model.modules()) > 0
            got = model(images, mask)
            assert (got.logits - expected.logits).abs().max() < 1e-4 and (got.boxes - expected.boxes).abs().max() < 1e-4
    with pytest.raises(ValueError, match="bilinear kernel must be one of auto, grid_sample, gather, embedding_bag"):
        use_bilinear_kernel(model, "nearest")


def test_the_bordered_table_is_each_map_padded_with_zeros():
    """The embedding bag's table, built by one copy per map, is exactly each level padded by one zero cell and the
    levels concatenated, per image and head; its gradient reaches the value."""
    from detr.models.layers.cpu_kernels import _bordered_table

    shapes = [(5, 7), (3, 4), (1, 2)]
    value = torch.randn(2, sum(h * w for h, w in shapes), 3, 4, dtype=torch.float64, requires_grad=True)
    levels = value.split([h * w for h, w in shapes], dim=1)
    expected = torch.cat([torch.nn.functional.pad(level.view(2, h, w, 3, 4).permute(0, 3, 1, 2, 4),
                                                  (0, 0, 1, 1, 1, 1)).flatten(2, 3)
                          for level, (h, w) in zip(levels, shapes)], 2).reshape(-1, 4)
    table = _bordered_table(value, shapes)
    assert torch.equal(table, expected)
    weights = torch.randn_like(table)
    (gradient,) = torch.autograd.grad((table * weights).sum(), value)
    (expected_gradient,) = torch.autograd.grad((expected * weights).sum(), value)
    assert torch.equal(gradient, expected_gradient)


@pytest.mark.parametrize("projections", [True, False], ids=["value-projection", "none (D-FINE)"])
def test_a_channel_first_value_samples_as_the_contiguous_one_without_a_copy(projections, monkeypatch):
    """A training step's decoder hands its memory over channel-first (a transposed view of [B, C, S]): the
    attention's outputs and gradients are the contiguous memory's, and the sampling's per-head maps are views of the
    projected values (no layout copy per layer)."""
    torch.manual_seed(2)
    attention = MultiScaleDeformableAttention(16, num_heads=2, num_levels=2, num_points=2, projections=projections)
    shapes = [(5, 7), (3, 4)]
    channel_first = torch.randn(2, 16, 47).requires_grad_()
    contiguous = channel_first.detach().transpose(1, 2).contiguous().requires_grad_()
    query, reference = torch.randn(2, 6, 16), torch.rand(2, 6, 2, 2)
    copies = []
    permute = torch.Tensor.permute

    def watched(tensor, *dims):
        permuted = permute(tensor, *dims)
        if dims == (0, 2, 3, 1):
            copies.append(not permuted.is_contiguous())
        return permuted
    monkeypatch.setattr(torch.Tensor, "permute", watched)
    ours, _ = attention(query, reference, channel_first.transpose(1, 2), shapes)
    plain, _ = attention(query, reference, contiguous, shapes)
    assert copies == [False, True]
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6)
    gradient = torch.randn_like(ours)
    ours.backward(gradient)
    plain.backward(gradient)
    torch.testing.assert_close(channel_first.grad.transpose(1, 2), contiguous.grad, rtol=1e-5, atol=1e-6)
