"""RF-DETR's parts: the windowed ViT (windows round-trip, windowed blocks see only their window and a global block
sees the image, the position table interpolated to other sizes), the box update, batched = per-image, the masks'
shape, the sampling points it reports, the input contract and the config's checks."""

from __future__ import annotations

import pytest
import torch

from detr import build_detr
from detr.models.rfdetr.config import RFDETRConfig, WindowedViTSize
from detr.models.detr_family import DetrConfig
from detr.models.rfdetr.decoder import refine_boxes
from detr.models.rfdetr.vit import WindowedViT

TINY_RFDETR = RFDETRConfig(backbone="dinov2_windowed", class_head="sigmoid", num_feature_levels=1, hidden_dim=32,
                           num_heads=4, cross_attention_heads=8, dim_feedforward=48, num_decoder_layers=2,
                           num_queries=12, num_classes=5, dropout=0.0, projector_blocks=1, mask_dim_feedforward=16,
                           num_points=4, query_groups=1,
                           vit=WindowedViTSize(width=24, depth=3, heads=3, out_indices=(1, 3), num_windows=2,
                                               position_size=56, mlp_dim=96))


def _model(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_detr(TINY_RFDETR.replace(**changes)).eval()
    with torch.no_grad():  # the authors' init starts every box delta at zero: give the boxes something to move
        for head in (model.decoder.box_head, *model.decoder.enc_box_head):
            head.layers[-1].weight.normal_(0, 0.1)
        model.decoder.reference_points.weight.normal_(0, 0.1)
    return model


def _images(batch: int = 2, side: int = 56) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.rand(batch, 3, side, side), torch.zeros(batch, side, side, dtype=torch.bool)


def test_windows_split_and_join_back_to_the_patch_grid():
    vit = WindowedViT(12, 1, 3, out_indices=(1,), num_windows=2, patch_size=14, position_size=56)
    grid = torch.arange(2 * 6 * 6 * 12, dtype=torch.float32).view(2, 6 * 6, 12)  # 6 × 6 patches
    tokens = torch.cat([torch.zeros(2, 1, 12), grid], dim=1)
    windows = vit._partition(tokens, 6, 6)
    assert windows.shape == (2 * 4, 1 + 3 * 3, 12)
    assert torch.equal(windows[1, 1:4, 0], torch.tensor([3.0, 4.0, 5.0]) * 12)  # window (0, 1): row 0, columns 3-5
    assert torch.equal(vit._unpartition(windows[:, 1:], 2, 6, 6), grid.view(2, 6, 6, 12).permute(0, 3, 1, 2))


@pytest.mark.parametrize("out_indices, local", [((2,), True), ((1, 2), False)])
def test_windowed_blocks_see_only_their_window_and_a_global_block_sees_the_image(out_indices, local):
    """Stage 2 after two windowed blocks ((2,): blocks 0 and 1 windowed) keeps the top-left window's features when
    the bottom-right quadrant changes; with block 1 global ((1, 2)), it does not."""
    torch.manual_seed(0)
    vit = WindowedViT(12, 2, 3, out_indices=out_indices, num_windows=2, patch_size=14, position_size=56).eval()
    image = torch.rand(1, 3, 56, 56)
    changed = image.clone()
    changed[..., 28:, 28:] = torch.rand(3, 28, 28)
    with torch.no_grad():
        before, after = vit(image)[-1], vit(changed)[-1]
    assert before.shape == (1, 12, 4, 4)
    assert not torch.allclose(before[..., 2:, 2:], after[..., 2:, 2:])
    assert torch.allclose(before[..., :2, :2], after[..., :2, :2], atol=1e-6) == local


def test_the_position_table_is_used_as_learned_and_interpolated_elsewhere():
    vit = WindowedViT(12, 1, 3, out_indices=(1,), num_windows=1, patch_size=14, position_size=56)
    assert vit.positions(4, 4) is vit.position_embeddings
    resized = vit.positions(6, 8)
    assert resized.shape == (1, 1 + 6 * 8, 12)
    assert torch.equal(resized[:, 0], vit.position_embeddings[:, 0])  # [CLS] keeps its own


def test_training_masks_come_as_factors_of_the_evaluation_masks():
    """In training every layer and the proposals carry their masks as factors (pixel × query features + bias); the
    last layer's factors multiply out to the masks evaluation returns (one query group: the same queries)."""
    model = _model(instance_masks=True, query_groups=1)
    images, mask = _images()
    with torch.no_grad():
        dense = model(images, mask).masks
        trained = model.train()(images, mask)
    assert trained.masks is None
    factors = trained.mask_features
    product = torch.einsum("bqc,bchw->bqhw", factors.queries, factors.pixels) + factors.bias
    assert torch.allclose(product, dense, atol=1e-4)
    assert all(layer.mask_features.pixels.shape == (2, 32, 14, 14) for layer in trained.layers)
    proposals = trained.proposals.mask_features
    assert proposals.queries.shape == (2, 12, 32) and proposals.pixels.shape == (2, 32, 14, 14)


def test_zero_deltas_keep_the_box_and_the_size_scales_by_exp():
    boxes = torch.tensor([[0.5, 0.4, 0.2, 0.1]])
    assert torch.equal(refine_boxes(boxes, torch.zeros(1, 4)), boxes)
    moved = refine_boxes(boxes, torch.tensor([[1.0, -1.0, 0.0, 1.0]]))
    assert torch.allclose(moved, torch.tensor([[0.7, 0.3, 0.2, 0.1 * torch.e]]))


def test_batched_equals_per_image_and_the_contract_holds():
    model = _model(instance_masks=True)
    images, mask = _images()
    with torch.no_grad():
        batched = model(images, mask)
        single = [model(images[i:i + 1], mask[i:i + 1]) for i in range(2)]
    for i in range(2):
        assert torch.allclose(batched.logits[i], single[i].logits[0], atol=1e-5)
        assert torch.allclose(batched.boxes[i], single[i].boxes[0], atol=1e-5)
        assert torch.allclose(batched.masks[i], single[i].masks[0], atol=1e-4)
    assert batched.logits.shape == (2, 12, 5) and batched.masks.shape == (2, 12, 14, 14)
    assert len(batched.aux) == 1 and batched.proposals.boxes.shape == (2, 12, 4)
    assert batched.boxes[0].std(dim=0).max() > 1e-3
    assert (model.class_head, model.detections_per_image, model.stride, model.min_image_size) == ("sigmoid", 12, 14, 28)
    spec = model.input_spec
    assert (spec.resize, spec.size, spec.mean is not None) == ("square", 560, True)
    assert model.predicts_masks and "instance masks" in model.describe()
    assert not _model().predicts_masks


def test_sampling_points_are_reported_per_layer_around_the_reference_boxes():
    model = _model()
    with torch.no_grad():
        output = model(*_images(1), return_attention=True)
    sampling = output.sampling
    assert sampling.locations.shape == (2, 1, 12, 8, 1, 4, 2)  # layers, B, Q, cross heads, one level, points
    assert torch.allclose(sampling.weights.sum(dim=(-2, -1)), torch.ones(2, 1, 12, 8))
    assert sampling.spatial_shapes.tolist() == [[4, 4]] and sampling.strides == (14,)


def test_sides_that_do_not_divide_by_patch_times_windows_or_differ_are_refused():
    with pytest.raises(ValueError, match="patch_size × num_windows"):
        _model()(*_images(1, side=42))
    with pytest.raises(ValueError, match="square"):
        _model()(torch.rand(1, 3, 56, 112), torch.zeros(1, 56, 112, dtype=torch.bool))


@pytest.mark.parametrize("changes, message", [
    ({"num_feature_levels": 2}, "num_feature_levels=1"),
    ({"class_head": "softmax"}, "class_head='sigmoid'"),
    ({"vit": {"out_indices": (3, 1)}}, "vit.out_indices"),
    ({"vit": {"out_indices": (1, 4)}}, "vit.out_indices"),
    ({"cross_attention_heads": 5}, "cross_attention_heads"),
    ({"backbone": "resnet50"}, "dinov2_windowed"),
])
def test_the_config_refuses_what_rfdetr_cannot_build(changes, message):
    with pytest.raises(ValueError, match=message):
        TINY_RFDETR.replace(**changes)


def test_rfdetr_options_are_rfdetr_s_config_s_only():
    with pytest.raises(ValueError, match="unknown model option.*vit"):
        DetrConfig.from_dict({"vit": {"num_windows": 2}})
    with pytest.raises(ValueError, match="not one of detr's"):
        DetrConfig(backbone="dinov2_windowed")


def test_lwdetr_projects_one_level_per_scale_and_its_windowed_blocks_stay_local():
    model = _model(backbone="lwdetr_vit", vit={"window_blocks": (0, 1, 2), "out_indices": (2, 3)},
                   projector_scales=(2.0, 0.5),
                   num_feature_levels=2, projector_norm="batch_norm")
    assert model.stride == 7 and "LW-DETR" in model.describe()
    with torch.no_grad():
        output = model(*_images(1), return_attention=True)
        image = torch.rand(1, 3, 56, 56)
        changed = image.clone()
        changed[..., 28:, 28:] = torch.rand(3, 28, 28)
        before, after = model.backbone(image)[-1], model.backbone(changed)[-1]
    # each level at its projector's scale of the patch: strides 7 and 28, not a doubling from level to level
    assert output.sampling.spatial_shapes.tolist() == [[8, 8], [2, 2]] and output.sampling.strides == (7, 28)
    assert torch.allclose(before[..., :2, :2], after[..., :2, :2], atol=1e-6)  # blocks 0-2 windowed
    assert not torch.allclose(before[..., 2:, 2:], after[..., 2:, 2:])


def test_group_detr_groups_decode_apart_in_training_and_inference_keeps_the_first():
    """Three groups in training: G · Q predictions (and encoder proposals); each group's predictions depend on its
    own queries and encoder heads only (self-attention within the group); eval mode decodes group 1 alone, equal to
    its training predictions (no dropout)."""
    model = _model(query_groups=3)
    images, mask = _images()
    model.train()
    with torch.no_grad():
        grouped = model(images, mask)
        assert grouped.logits.shape == (2, 36, 5) and grouped.proposals.boxes.shape == (2, 36, 4)
        assert len(grouped.aux) == 1 and grouped.aux[0].boxes.shape == (2, 36, 4)
        model.decoder.query_embed.weight[24:].normal_()  # group 3's content queries
        model.decoder.enc_class_head[2].weight.normal_()  # and its encoder heads
        changed = model(images, mask)
        assert torch.allclose(changed.logits[:, :24], grouped.logits[:, :24], atol=1e-5)
        assert not torch.allclose(changed.logits[:, 24:], grouped.logits[:, 24:])
        alone = model.eval()(images, mask)
    assert alone.logits.shape == (2, 12, 5)
    assert torch.allclose(alone.logits, grouped.logits[:, :12], atol=1e-5)
    assert torch.allclose(alone.boxes, grouped.boxes[:, :12], atol=1e-6)


def test_the_proposals_train_the_encoder_heads_and_the_decoder_starts_from_them_detached():
    model = _model(query_groups=2).train()
    images, mask = _images()
    output = model(images, mask)
    output.logits.sum().backward()  # the decoder's output: no gradient into the encoder box head (detached start)
    assert all(p.grad is None or not p.grad.any() for head in model.decoder.enc_box_head for p in head.parameters())
    model.zero_grad()
    output = model(images, mask)
    output.proposals.boxes.sum().backward()
    assert all(head.layers[-1].weight.grad.abs().sum() > 0 for head in model.decoder.enc_box_head)


def test_inference_mode_keeps_the_size_constants_and_a_weight_change_recomputes_them():
    """Under inference mode the proposal cells and the interpolated position table are kept per size; the outputs
    equal a plain forward's, and changing the position table in place is seen by the next call."""
    from tests.helpers_realtime import tiny_model

    model = tiny_model("rfdetr")  # a 4 × 4 position table read at 8 × 8 patches: interpolated
    images, mask = torch.rand(2, 3, 112, 112, generator=torch.Generator().manual_seed(0)), torch.zeros(
        2, 112, 112, dtype=torch.bool)
    for _ in range(2):
        with torch.no_grad():
            plain = model(images, mask)
        with torch.inference_mode():
            kept, again = model(images, mask), model(images, mask)
        assert torch.equal(plain.logits, kept.logits) and torch.equal(kept.logits, again.logits)
        assert torch.equal(plain.boxes, again.boxes) and torch.equal(plain.masks, again.masks)
        with torch.no_grad():
            model.backbone.position_embeddings.mul_(3.0)  # the second round must see the new table
    assert len(model.backbone._positions._kept) == 2 and len(model.decoder.proposals._kept) == 1


def test_a_training_selection_trains_each_groups_selected_rows_as_the_full_pass_does():
    """In a training step each query group's selection scores every cell without gradients and runs its selected
    rows again with them: the same boxes, logits and features as the full pass with gradients (what eval mode with
    gradients runs), and the same gradients for the memory and the group's heads (float64: exact to rounding)."""
    model = _model(query_groups=2, num_queries=5).double().train()
    memory, shapes = torch.randn(2, 36, 32, dtype=torch.float64), [(6, 6)]
    group = 1
    heads = [model.decoder.enc_output[group], model.decoder.enc_output_norm[group],
             model.decoder.enc_class_head[group], model.decoder.enc_box_head[group]]

    def selection_and_gradients() -> list[torch.Tensor]:
        cells = memory.clone().requires_grad_()
        boxes, logits, selected = model.decoder.select(cells, shapes, group)
        (boxes.sin().sum() + logits.cos().sum() + selected.tanh().sum()).backward()
        gradients = [cells.grad] + [parameter.grad.clone() for head in heads for parameter in head.parameters()]
        model.zero_grad()
        return [boxes, logits, selected, *gradients]

    trained = selection_and_gradients()
    model.eval()
    for ours, full in zip(trained, selection_and_gradients()):
        torch.testing.assert_close(ours, full, rtol=1e-10, atol=1e-12)
    assert ((trained[3].abs().sum(-1) > 0).sum(1) <= 5).all()  # the memory's gradient: the selected cells only
