"""D-FINE's parts: HGNetV2's strides and channels for every size, the weighting function (the paper's W(n)), the
decoding of edge distances, the shared attention's points per level against one count, batched = per-image,
the inference depth, the sampling points it reports, the input contract and the config's checks."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.models.detr_family import DetrConfig
from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.models.dfine.decoder import distance_to_box, edge_distances, weighting_function
from detr.models.dfine.hgnetv2 import SIZES, HGNetV2, LearnableAffineBlock
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, deformable_sampling
from detr.models.rtdetr.config import RTDETRConfig

TINY_DFINE = DFINEConfig(class_head="sigmoid", backbone="hgnetv2_b0", hidden_dim=32, num_heads=4, dim_feedforward=48,
                         num_decoder_layers=3, num_queries=20, num_classes=5, dropout=0.0, num_feature_levels=3,
                         csp_expansion=0.5, csp_depth_multiplier=0.34, backbone_learnable_affine=True,
                         denoising=True, num_encoder_layers=6, backbone_norm='frozen_batch_norm',
                         decoder=DistributionDecoder(num_points_per_level=(2, 3, 1), max_num_bins=8))


def _model(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_detr(TINY_DFINE.replace(**changes)).eval()
    with torch.no_grad():  # the authors' init starts every box head at zero: give the boxes something to refine
        for head in [model.decoder.pre_bbox_head, *model.decoder.dec_bbox_head]:
            head.layers[-1].weight.normal_(0, 0.1)
    return model


def _images(batch: int = 2, side: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.rand(batch, 3, side, side), torch.zeros(batch, side, side, dtype=torch.bool)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_hgnetv2_returns_the_last_stages_at_strides_8_16_32(name):
    backbone = HGNetV2(name).eval()
    with torch.no_grad():
        features = backbone(torch.rand(1, 3, 64, 96))
    channels = [stage.out_channels for stage in SIZES[name].stages[1:]]
    assert backbone.out_channels == channels
    assert [tuple(f.shape[1:]) for f in features] == [(c, 64 // s, 96 // s) for c, s in zip(channels, (8, 16, 32))]


def test_the_weighting_function_is_the_papers():
    """W(n) for N = 8, up 0.5, reg_scale 4 (§3.2): a = up · c = 2, step = (a + 1)^(2 / (N - 2)); symmetric,
    0 in the middle, ±(step^i - 1) beside it, ±2a at the ends, increasing."""
    values = weighting_function(8, torch.tensor([0.5]), torch.tensor([4.0]))
    step = 3.0 ** (2 / 6)
    expected = [-4.0, -(step ** 3 - 1), -(step ** 2 - 1), -(step - 1), 0.0, step - 1, step ** 2 - 1, step ** 3 - 1, 4.0]
    assert torch.allclose(values, torch.tensor(expected), atol=1e-6)
    assert torch.all(values[1:] > values[:-1])


def test_zero_distances_keep_the_initial_box_and_one_edge_moves_alone():
    initial = torch.tensor([[[0.5, 0.4, 0.2, 0.4]]])
    scale = torch.tensor([4.0])
    assert torch.allclose(distance_to_box(initial, torch.zeros(1, 1, 4), scale), initial)
    # the right edge moves by d · w / reg_scale: centre by half of it, width by all of it
    moved = distance_to_box(initial, torch.tensor([[[0.0, 0.0, 2.0, 0.0]]]), scale)
    assert torch.allclose(moved, torch.tensor([[[0.55, 0.4, 0.3, 0.4]]]))
    # a distribution peaked on the middle bin (W = 0) is no move; uniform logits give W's mean (0, it is odd)
    project = weighting_function(8, torch.tensor([0.5]), scale)
    peaked = torch.full((1, 1, 4, 9), -30.0)
    peaked[..., 4] = 30.0
    assert torch.allclose(edge_distances(peaked.flatten(2), project), torch.zeros(1, 1, 4), atol=1e-6)
    assert torch.allclose(edge_distances(torch.zeros(1, 1, 36), project), torch.zeros(1, 1, 4), atol=1e-6)


def test_points_per_level_equal_one_count_when_the_counts_agree():
    """The path for a count per level (D-FINE's: points concatenated over levels, each offset over its level's
    count) computes what one count computes when the counts agree."""
    torch.manual_seed(0)
    attention = MultiScaleDeformableAttention(16, 2, 2, 3, projections=False)
    shapes = [(4, 4), (2, 2)]
    query, value = torch.randn(2, 5, 16), torch.randn(2, 20, 2, 8)
    boxes = torch.rand(2, 5, 1, 4) * 0.5 + 0.25
    with torch.no_grad():
        torch.nn.init.normal_(attention.sampling_offsets.weight, std=0.1)
        locations, weights = attention.sampling(query, boxes, shapes)  # [B, Q, H, L, P, 2]
        flat_locations, flat_weights = attention._sampling_per_level_counts(query, boxes)  # [B, Q, H, L·P, 2]
    assert torch.allclose(flat_locations, locations.flatten(3, 4), atol=1e-6)
    assert torch.allclose(flat_weights, weights.flatten(3, 4))
    assert torch.allclose(deformable_sampling(value, shapes, flat_locations, flat_weights, points_per_level=(3, 3)),
                          deformable_sampling(value, shapes, locations, weights), atol=1e-6)


def test_uneven_points_report_padded_sampling_with_zero_weight():
    attention = MultiScaleDeformableAttention(16, 2, 3, (2, 3, 1), projections=False)
    shapes = [(4, 4), (2, 2), (1, 1)]
    output, (locations, weights) = attention(torch.randn(1, 5, 16), torch.rand(1, 5, 1, 4), torch.randn(1, 21, 16),
                                             shapes, return_sampling=True)
    assert output.shape == (1, 5, 16) and locations.shape == (1, 5, 2, 3, 3, 2) and weights.shape == (1, 5, 2, 3, 3)
    assert torch.all(weights[..., 0, 2] == 0) and torch.all(weights[..., 2, 1:] == 0)
    assert torch.allclose(weights.sum((-2, -1)), torch.ones(1, 5, 2))


def test_batched_equals_per_image_and_the_contract_holds():
    model = _model()
    images, mask = _images()
    with torch.no_grad():
        batched = model(images, mask)
        single = [model(images[i:i + 1], mask[i:i + 1]) for i in range(2)]
    assert batched.logits.shape == (2, 20, 5) and len(batched.aux) == 2 and batched.proposals is not None
    for index, output in enumerate(single):
        assert torch.allclose(batched.logits[index], output.logits[0], atol=1e-5)
        assert torch.allclose(batched.boxes[index], output.boxes[0], atol=1e-5)
    assert model.input_spec.resize == "square" and model.input_spec.mean is None
    assert model.detections_per_image == 20 and model.stride == 8 and "D-FINE" in model.describe()


def test_a_shorter_decoder_predicts_with_its_last_layer():
    model = _model()
    images, mask = _images(1)
    with torch.no_grad():
        full = model(images, mask)
        model.set_inference_layers(2)
        short = model(images, mask)
    assert torch.allclose(short.logits, full.aux[1].logits) and torch.allclose(short.boxes, full.aux[1].boxes)


def test_two_levels_read_strides_16_and_32():
    model = _model(num_feature_levels=2, decoder={"num_points_per_level": None}, num_points=3)
    images, mask = _images(1)
    with torch.no_grad():
        output = model(images, mask, return_attention=True)
    assert model.stride == 16 and output.sampling.spatial_shapes.tolist() == [[4, 4], [2, 2]]
    assert output.sampling.strides == (16, 32)


@pytest.mark.parametrize("decoder_activation, decoder_mlp_activation", [("relu", "relu"), ("silu", "silu"),
                                                                      ("silu", "relu")])
def test_deims_silu_reaches_the_feed_forward_networks_and_every_decoder_mlp(decoder_activation,
                                                                         decoder_mlp_activation):
    """DEIM's ``activation`` / ``mlp_act``: the layers' feed-forward networks take ``decoder_activation``; the
    query positions, the encoder's box head, the first layer's box head, the distribution heads and the quality
    heads take ``decoder_mlp_activation``."""
    model = _model(decoder={"activation": decoder_activation, "mlp_activation": decoder_mlp_activation})
    functions = {"relu": torch.nn.functional.relu, "silu": torch.nn.functional.silu}
    decoder = model.decoder
    mlps = [decoder.query_pos_head, decoder.enc_bbox_head, decoder.pre_bbox_head, *decoder.dec_bbox_head,
            *(quality.reg_conf for quality in decoder.decoder.lqe_layers)]
    assert all(mlp.activation is functions[decoder_mlp_activation] for mlp in mlps)
    assert all(layer.activation is functions[decoder_activation] for layer in decoder.decoder.layers)
    images, mask = _images(1)
    with torch.no_grad():  # the same weights under ReLU predict otherwise
        silu = model(images, mask)
        relu = _model()
        relu.load_state_dict(model.state_dict())
        plain = relu(images, mask)
    assert torch.equal(silu.logits, plain.logits) == (decoder_activation == decoder_mlp_activation == "relu")


@pytest.mark.parametrize("changes, message", [
    ({"decoder": {"mlp_activation": "gelu"}}, "mlp_activation"),
    ({"backbone": "resnet50"}, "not one of dfine's: hgnetv2_b0"),
    ({"num_feature_levels": 4, "decoder": {"num_points_per_level": None}}, "num_feature_levels must be 2 or 3"),
    ({"decoder": {"num_points_per_level": (3, 6)}}, "num_points_per_level"),
    ({"decoder": {"max_num_bins": 7}}, "max_num_bins"),
])
def test_the_config_refuses_what_dfine_cannot_build(changes, message):
    with pytest.raises(ValueError, match=message):
        TINY_DFINE.replace(**changes)


def test_dfine_options_are_dfine_s_config_s_only():
    with pytest.raises(ValueError, match="unknown model option.*decoder"):
        RTDETRConfig.from_dict({"decoder": {"max_num_bins": 16}})
    with pytest.raises(ValueError, match="not one of rtdetr's"):
        RTDETRConfig(class_head="sigmoid", backbone="hgnetv2_b0", num_feature_levels=3, num_queries=100,
                     dim_feedforward=2048, dropout=0.1, num_encoder_layers=6, denoising=False)


def test_optimize_for_inference_keeps_the_outputs():
    """Every BatchNorm folded (HGNetV2's and the encoder's), RepVGG blocks re-parameterised, channels last."""
    model = _model()
    images, mask = _images(1)
    with torch.no_grad():
        before = model(images, mask)
        model.optimize_for_inference()
        after = model(images, mask)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) or type(m).__name__ == "FrozenBatchNorm2d"
                   for m in model.backbone.modules())
    assert torch.allclose(before.logits, after.logits, atol=1e-4) and torch.allclose(before.boxes, after.boxes, atol=1e-4)


def test_folding_moves_positive_affine_scales_into_the_convolutions_and_keeps_hgnetv2s_maps():
    """A positive LAB scale goes into the convolution before the ReLU (s · relu(y) = relu(s · y)); a negative one
    cannot and stays a multiplication."""
    torch.manual_seed(0)
    backbone = HGNetV2("hgnetv2_b0", learnable_affine=True).eval()
    labs = [module for module in backbone.modules() if isinstance(module, LearnableAffineBlock)]
    with torch.no_grad():
        for index, lab in enumerate(labs):
            lab.scale.fill_(-0.9 if index % 3 == 0 else 1.1)
            lab.bias.normal_(0, 0.1)
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = backbone(images)
        backbone.fold_batch_norms()
        after = backbone(images)
    assert [lab.scale_folded for lab in labs] == [index % 3 != 0 for index in range(len(labs))]
    for expected, got in zip(before, after):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
