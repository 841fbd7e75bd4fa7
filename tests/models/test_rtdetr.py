"""RT-DETR's parts: ResNet-vd's strides and channels, the sin-cos positions and RT-DETRv2's discrete sampling
against transformers' functions, the anchors, RepVGG re-parameterisation, batched = per-image, the inference
depth, the sampling points it reports, the input contract and the config's checks."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.models.deformable.config import DeformableConfig
from detr.models.layers.cell_anchors import gather_cells
from detr.models.layers.deformable_attention import deformable_sampling
from detr.models.rtdetr.config import RTDETRConfig
from detr.models.rtdetr.decoder import anchors_for
from detr.models.rtdetr.hybrid_encoder import RepVggBlock, sincos_position_embedding
from detr.models.rtdetr.resnet_vd import ResNetVd

TINY_RTDETR = RTDETRConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=4, dim_feedforward=48,
                           num_decoder_layers=3, num_queries=20, num_classes=5, dropout=0.0, num_points=2,
                           denoising=True, num_encoder_layers=6, num_feature_levels=4)


def _model(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_detr(TINY_RTDETR.replace(**changes)).eval()
    with torch.no_grad():  # the authors' init starts every box head at zero: give the boxes something to refine
        for head in model.decoder.dec_bbox_head:
            head.layers[-1].weight.normal_(0, 0.1)
    return model


def _images(batch: int = 2, side: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.rand(batch, 3, side, side), torch.zeros(batch, side, side, dtype=torch.bool)


@pytest.mark.parametrize("name, channels", [("resnet18", [128, 256, 512]), ("resnet50", [512, 1024, 2048])])
def test_resnet_vd_returns_strides_8_16_32(name, channels):
    backbone = ResNetVd(name).eval()
    with torch.no_grad():
        features = backbone(torch.rand(1, 3, 64, 96))
    assert backbone.out_channels == channels
    assert [tuple(f.shape[1:]) for f in features] == [(c, 64 // s, 96 // s) for c, s in zip(channels, (8, 16, 32))]


@pytest.mark.parametrize("height, width", [(4, 4), (3, 5)])
def test_sincos_positions_are_transformers(height, width):
    rt_detr = pytest.importorskip("transformers.models.rt_detr.modeling_rt_detr")
    expected = rt_detr.build_2d_sinusoidal_position_embedding(height, width, 32, 10000.0)
    assert torch.equal(sincos_position_embedding(height, width, 32)[0], expected)


def test_discrete_sampling_reads_the_cells_transformers_reads():
    rt_detr_v2 = pytest.importorskip("transformers.models.rt_detr_v2.modeling_rt_detr_v2")
    torch.manual_seed(0)
    shapes = [(6, 8), (3, 4)]
    value = torch.randn(2, 6 * 8 + 3 * 4, 4, 8)  # [B, S, H, D]
    locations = torch.rand(2, 5, 4, 2, 3, 2) * 1.2 - 0.1  # some outside the map: clamped to its border
    weights = torch.rand(2, 5, 4, 2, 3).flatten(-2).softmax(-1).view(2, 5, 4, 2, 3)
    ours = deformable_sampling(value, shapes, locations, weights, method="discrete")
    theirs = rt_detr_v2.multi_scale_deformable_attention_v2(value, shapes, locations.flatten(3, 4),
                                                            weights.flatten(3), [3, 3], method="discrete")
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_anchors_cover_each_level_and_the_border_ones_are_invalid():
    anchors, valid = anchors_for([(4, 4), (2, 2)])
    assert anchors.shape == (1, 20, 4) and valid.shape == (1, 20, 1)
    boxes = anchors[valid[..., 0]].sigmoid()
    assert torch.allclose(boxes[0], torch.tensor([0.125, 0.125, 0.05, 0.05]))  # cell (0, 0) of the finest level
    assert torch.allclose(anchors[0, -1].sigmoid(), torch.tensor([0.75, 0.75, 0.1, 0.1]))  # level 1: twice the size
    outside = anchors_for([(64, 64)])  # a cell centre at 0.5 / 64 < 1 %: invalid, its logits the largest float
    assert not outside[1][0, 0, 0] and outside[0][0, 0, 0] == torch.finfo(torch.float32).max


def test_repvgg_reparameterised_is_the_same_function():
    torch.manual_seed(0)
    block = RepVggBlock(8)
    with torch.no_grad():
        for norm in (block.conv1.norm, block.conv2.norm):
            norm.running_mean.normal_(0, 0.2)
            norm.running_var.uniform_(0.5, 1.5)
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.2)
    block.eval()
    x = torch.randn(2, 8, 7, 9)
    with torch.no_grad():
        expected = block(x)
        block.reparameterize()
        assert torch.allclose(block(x), expected, atol=1e-5)
    assert not hasattr(block, "conv1") and block.fused.kernel_size == (3, 3)


def test_optimized_model_predicts_the_same():
    model = _model()
    images, mask = _images()
    with torch.no_grad():
        expected = model(images, mask)
        model.optimize_for_inference()
        optimized = model(images, mask)
    assert torch.allclose(optimized.logits, expected.logits, atol=1e-4)
    assert torch.allclose(optimized.boxes, expected.boxes, atol=1e-4)


@pytest.mark.parametrize("sampling_method", ["bilinear", "discrete"])  # discrete: one image once failed a view
def test_batched_is_per_image_and_every_layer_is_reported(sampling_method):
    model = _model(sampling_method=sampling_method)
    images, mask = _images()
    with torch.no_grad():
        batched = model(images, mask)
        single = [model(images[i:i + 1], mask[i:i + 1]) for i in range(2)]
    assert batched.logits.shape == (2, 20, 5) and batched.boxes.shape == (2, 20, 4) and len(batched.aux) == 2
    assert batched.proposals.logits.shape == (2, 20, 5) and batched.class_head == "sigmoid"
    for i, one in enumerate(single):
        assert torch.allclose(batched.logits[i], one.logits[0], atol=1e-4)
        assert torch.allclose(batched.boxes[i], one.boxes[0], atol=1e-5)
    assert batched.boxes.min() >= 0 and batched.boxes.max() <= 1 and batched.boxes[0].std(0).max() > 1e-3


def test_a_shorter_decoder_gives_the_earlier_layer():
    model = _model()
    images, mask = _images()
    with torch.no_grad():
        full = model(images, mask)
        model.set_inference_layers(2)
        short = model(images, mask)
    assert len(short.aux) == 1
    assert torch.allclose(short.logits, full.aux[1].logits) and torch.allclose(short.boxes, full.aux[1].boxes)
    with pytest.raises(ValueError, match="1..3"):
        model.set_inference_layers(0)


def test_sampling_points_are_reported_per_layer_level_and_head():
    model = _model(num_feature_levels=4)
    images, mask = _images(1, 128)
    with torch.no_grad():
        output = model(images, mask, return_attention=True)
    sampling = output.sampling
    assert sampling.locations.shape == (3, 1, 20, 4, 4, 2, 2) and sampling.weights.shape == (3, 1, 20, 4, 4, 2)
    assert sampling.spatial_shapes.tolist() == [[16, 16], [8, 8], [4, 4], [2, 2]]
    assert sampling.strides == (8, 16, 32, 64)
    assert torch.allclose(sampling.weights.sum((-1, -2)), torch.ones(3, 1, 20, 4))


def test_input_contract_is_a_square_without_mean_and_std():
    model = _model()
    spec = model.input_spec
    assert (spec.resize, spec.size, spec.mean, spec.std, spec.interpolation) == ("square", 640, None, None,
                                                                                  "antialiased")
    assert model.detections_per_image == 20 and model.describe().startswith("RT-DETR, resnet18-vd, 3 decoder")
    assert model.exportable  # at its fixed square (tests/checkpoints/test_export_rtdetr.py)
    with pytest.raises(ValueError, match="multiples of 32"):
        model(torch.rand(1, 3, 100, 96), torch.zeros(1, 100, 96, dtype=torch.bool))


def test_discrete_sampling_and_offset_scale_change_the_predictions_only_through_the_decoder():
    images, mask = _images()
    with torch.no_grad():
        plain = _model()(images, mask)
        discrete = _model(sampling_method="discrete", sampling_offset_scale=0.25)(images, mask)
    assert torch.equal(plain.proposals.boxes, discrete.proposals.boxes)  # same weights, same encoder
    assert not torch.allclose(plain.boxes, discrete.boxes)


@pytest.mark.parametrize("changes, message", [
    ({"num_feature_levels": 2}, "num_feature_levels must be at least 3"),
    ({"class_head": "softmax"}, "class_head"),
    ({"box_refine": True}, "unknown model option"),
    ({"hidden_dim": 30}, "divisible"),
])
def test_config_refuses_what_the_model_lacks(changes, message):
    with pytest.raises(ValueError, match=message):
        TINY_RTDETR.replace(**changes)


def test_rtdetr_options_are_rtdetr_s_config_s_only():
    with pytest.raises(ValueError, match="unknown model option.*sampling_method"):
        DeformableConfig.from_dict({"sampling_method": "discrete"})


def test_the_memory_is_channel_first_with_gradients_and_contiguous_without():
    """The decoder's memory [B, S, C]: channel-first in a training step (the sampling's maps are views of it),
    contiguous in inference (the embedding bag's rows); the same values."""
    model = build_detr(RTDETRConfig(backbone="resnet18", num_classes=3, num_queries=10, num_decoder_layers=1))
    features = model.encoder(model.backbone(torch.randn(1, 3, 64, 64)))
    memory, shapes = model.decoder.flatten_levels(features)
    with torch.no_grad():
        inference, same_shapes = model.decoder.flatten_levels(features)
    assert shapes == same_shapes and memory.shape == inference.shape == (1, sum(h * w for h, w in shapes), 256)
    assert memory.transpose(1, 2).is_contiguous() and inference.is_contiguous()
    assert torch.equal(memory, inference)


def _selection_and_gradients(model: torch.nn.Module, memory: torch.Tensor, shapes: list[tuple[int, int]]
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The query selection's outputs and the gradients of a loss on them (the memory's and the selection
    heads')."""
    memory = memory.detach().requires_grad_()
    content, box_logits, class_logits = model.decoder.select_queries(memory, shapes)
    (box_logits.sin().sum() + class_logits.cos().sum()).backward()
    heads = [model.decoder.enc_output, model.decoder.enc_score_head, model.decoder.enc_bbox_head]
    gradients = [memory.grad] + [parameter.grad.clone() for head in heads for parameter in head.parameters()]
    model.zero_grad()
    return [content, box_logits, class_logits], gradients


def test_a_training_selection_trains_the_selected_rows_as_the_full_pass_does():
    """In a training step the query selection scores every cell without gradients and runs the selected rows
    again with them: the same content, box and class logits as the full pass with gradients (what eval mode with
    gradients still runs), and the same gradients for the memory and the selection's heads (float64: exact to
    rounding). Cells outside the selection get no gradient either way."""
    model = _model(num_queries=7).double()
    images, _ = _images(batch=2, side=64)
    with torch.no_grad():
        memory, shapes = model.decoder.flatten_levels(model.encoder(model.backbone(images.double())))
    model.train()
    outputs, gradients = _selection_and_gradients(model, memory, shapes)
    model.eval()
    full_outputs, full_gradients = _selection_and_gradients(model, memory, shapes)
    for ours, full in zip(outputs + gradients, full_outputs + full_gradients):
        torch.testing.assert_close(ours, full, rtol=1e-10, atol=1e-12)
    touched = gradients[0].abs().sum(-1) > 0  # [B, S]: the selected cells only
    assert touched.sum(1).tolist() == [7, 7]


def test_channel_first_cells_are_gathered_with_their_gradient_in_that_layout():
    """A training step's memory is channel-first (a transposed view of [B, C, S]); its selected rows are the
    contiguous memory's, and their gradient comes back channel-first too, as the value projections' gradients it
    is summed with (torch sums two layouts several times slower than one)."""
    channel_first = torch.randn(2, 8, 30)
    memory = channel_first.transpose(1, 2).requires_grad_()
    index = torch.tensor([[3, 0, 29], [5, 5, 1]])
    rows = gather_cells(memory, index)
    assert torch.equal(rows, gather_cells(memory.detach().contiguous(), index))
    (gradient,) = torch.autograd.grad((rows * torch.randn_like(rows)).sum(), memory)
    assert gradient.transpose(1, 2).is_contiguous()
    assert (gradient.abs().sum(-1) > 0).sum(1).tolist() == [3, 2]
