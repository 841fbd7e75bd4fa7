"""The mask head on the anchor-query detector with a sigmoid class head (the shapes demo's box model): masks
for the matching queries only, the same boxes and classes as the detector, sigmoid scores in the panoptic
post-processing, the mask loss with query groups, and the mask stage's frozen detector in eval mode."""

from __future__ import annotations

import pytest
import torch

from detr.inference.postprocess_masks import PostProcessPanoptic
from detr.loss.criterion import SetCriterion
from detr.loss.masks import MaskLoss
from detr.loss.matcher import HungarianMatcher
from detr.models import build_detr
from detr.models.segmentation import DETRPanoptic
from tests.helpers import model_output, tiny_config_with

ANCHOR = tiny_config_with(backbone_last_stage="layer3", backbone_norm="batch_norm", hidden_dim=128, num_heads=8,
                          num_queries=5, num_classes=3, query_type="anchor", class_head="sigmoid", denoising=True,
                          denoising_groups=2, query_groups=2, dense_aux_head=True, dropout=0.0)


def _batch() -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 64, 64, generator=generator)
    padding_mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    padding_mask[1, :, 48:] = True
    masks = torch.zeros(2, 64, 64, dtype=torch.bool)
    masks[0, 8:24, 8:24] = True
    masks[1, 30:60, 20:40] = True
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.7, 0.3, 0.5]]),
                "masks": masks},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.4, 0.4, 0.2, 0.2]]), "masks": masks[:1, :, :48]}]
    return images, padding_mask, targets


def test_masks_for_the_matching_queries_only_and_the_detectors_own_predictions():
    torch.manual_seed(0)
    model = DETRPanoptic(build_detr(ANCHOR))
    images, padding_mask, targets = _batch()
    model.train()
    out = model(images, padding_mask, targets=targets)
    assert out.logits.shape == (2, 2 * 5, 3)  # two query groups in training, no no-object logit
    assert out.masks.shape == (2, 5, 16, 16)  # group 1: the queries inference decodes
    assert out.denoising is not None and out.dense is not None
    model.eval()
    with torch.no_grad():
        out, plain = model(images, padding_mask), model.detr(images, padding_mask)
    assert out.masks.shape == (2, 5, 16, 16)
    torch.testing.assert_close(out.logits, plain.logits)
    torch.testing.assert_close(out.boxes, plain.boxes)


def test_sigmoid_panoptic_scores_are_the_best_class_sigmoid():
    logits = torch.full((1, 3, 2), -10.0)
    logits[0, 0, 1] = 2.5   # sigmoid 0.924: kept at 0.85
    logits[0, 1, 0] = 0.5   # sigmoid 0.622: kept at 0.5 only
    masks = torch.full((1, 3, 4, 4), -5.0)
    masks[0, 0, :2] = 5.0
    masks[0, 1, 2:] = 5.0
    outputs = model_output(logits=logits, masks=masks)
    sizes = torch.tensor([[16, 16]])
    strict = PostProcessPanoptic([True, False], threshold=0.85, class_head="sigmoid")(outputs, sizes)[0]
    assert [(s["label"], round(s["score"], 3)) for s in strict["segments_info"]] == [(1, 0.924)]
    loose = PostProcessPanoptic([True, False], threshold=0.5, class_head="sigmoid")(outputs, sizes)[0]
    assert [s["label"] for s in loose["segments_info"]] == [1, 0]
    assert loose["id_map"][:8].eq(1).all() and loose["id_map"][8:].eq(2).all()
    with pytest.raises(ValueError, match="no-object"):
        PostProcessPanoptic([True, False], class_head="softmax")(outputs, sizes)  # 2 logits: no no-object column
    with pytest.raises(ValueError, match="sigmoid head"):
        PostProcessPanoptic([True], class_head="sigmoid")(outputs, sizes)


def test_mask_loss_with_query_groups_uses_group_one():
    torch.manual_seed(0)
    images, padding_mask, targets = _batch()
    criterion = SetCriterion(3, HungarianMatcher(class_head="sigmoid", group_size=5), class_head="sigmoid",
                             num_decoder_layers=1, parts=[MaskLoss()])
    generator = torch.Generator().manual_seed(1)
    outputs = model_output(logits=torch.randn(2, 10, 3, generator=generator),  # 2 groups of 5 queries
                           boxes=torch.rand(2, 10, 4, generator=generator) * 0.5 + 0.25,
                           masks=torch.randn(2, 5, 16, 16, generator=generator))
    losses = criterion(outputs, targets)
    assert all(torch.isfinite(value) for value in losses.values())
    group_one = model_output(outputs.logits[:, :5], outputs.boxes[:, :5], masks=outputs.masks)
    alone = criterion(group_one, targets)
    torch.testing.assert_close(losses["loss_mask"], alone["loss_mask"])
    torch.testing.assert_close(losses["loss_dice"], alone["loss_dice"])


def test_the_mask_stage_runs_a_frozen_anchor_detector_in_eval_mode():
    from detr.lightning.panoptic_system import PanopticSystem
    categories = [{"id": 1, "isthing": 1}, {"id": 2, "isthing": 1}, {"id": 3, "isthing": 0}]
    system = PanopticSystem(masks=True, freeze_detr=True, categories=categories, panoptic_threshold=0.5,
                            detr=ANCHOR)
    system.train()
    assert system.model.training and not system.model.detr.training
    assert system.model.mask_head.training
    # no denoising or dense terms (the frozen detector does not produce them): the mask terms only
    assert [type(part) for part in system.criterion.parts] == [MaskLoss]
    assert system.postprocess_panoptic.class_head == "sigmoid" and system.postprocess_panoptic.threshold == 0.5
    images, padding_mask, targets = _batch()
    outputs = system(images, padding_mask, targets)
    assert outputs.logits.shape == (2, 5, 3) and outputs.denoising is None
    losses = system.compute_losses(outputs, targets)
    losses["loss"].backward()
    assert all(p.grad is None for p in system.model.detr.parameters())
    assert any(p.grad is not None for p in system.model.mask_head.parameters())



def test_anchor_attention_maps_start_centred_on_each_querys_box():
    """Anchor detectors get positions on both sides of the attention map (``bbox_attention.position.*``, absent from
    the authors' learned-query layout): with the content logits zeroed, each query's map peaks at the cell
    nearest its predicted box centre, so different boxes give different maps."""
    torch.manual_seed(0)
    model = DETRPanoptic(build_detr(ANCHOR)).eval()
    assert any(key.startswith("bbox_attention.position.") for key in model.state_dict())
    authors = DETRPanoptic(build_detr(tiny_config_with(backbone_last_stage="layer3", hidden_dim=128, num_heads=8,
                                                       num_decoder_layers=1, dim_feedforward=2048, num_queries=5,
                                                       num_classes=3)))
    assert authors.bbox_attention.position is None
    assert not any(".position." in key for key in authors.state_dict())
    height = width = 16
    pos = model.detr.backbone[1](torch.zeros(1, height, width, dtype=torch.bool))
    boxes = torch.tensor([[[0.2, 0.3, 0.1, 0.1], [0.8, 0.6, 0.2, 0.2], [0.5, 0.9, 0.3, 0.1]]])
    with torch.no_grad():
        spatial = model.bbox_attention.position(boxes, pos)  # [1, 3, heads, h, w]
        attention = model.bbox_attention(torch.zeros(1, 3, 128), torch.zeros(1, 128, height, width), None, spatial)
    assert attention.shape == (1, 3, 8, height, width)
    peak = attention[0].sum(1).flatten(1).argmax(-1)
    rows, cols = peak // width, peak % width
    torch.testing.assert_close(cols.float(), (boxes[0, :, 0] * width).floor(), atol=1.0, rtol=0)
    torch.testing.assert_close(rows.float(), (boxes[0, :, 1] * height).floor(), atol=1.0, rtol=0)


def test_anchor_mask_head_gets_attention_as_a_density_of_each_images_cells():
    """Anchor detectors' attention maps enter the mask head × heads × the image's unpadded cells (a uniform
    map is 1 everywhere, the same padded or not); the authors' learned-query path passes the weights as they
    are (their function, their checkpoints)."""
    from detr.models.segmentation import attention_density

    heads, padding = 8, torch.zeros(2, 4, 6, dtype=torch.bool)
    padding[1, :, 3:] = True  # image 1: 4 × 3 cells
    uniform = torch.stack([torch.full((1, heads, 4, 6), 1 / (heads * 24)),
                           torch.cat([torch.full((1, heads, 4, 3), 1 / (heads * 12)), torch.zeros(1, heads, 4, 3)], -1)])
    density = attention_density(uniform, padding)
    torch.testing.assert_close(density[0], torch.ones(1, heads, 4, 6))
    torch.testing.assert_close(density[1][..., :3], torch.ones(1, heads, 4, 3))

    images, padding_mask, _ = _batch()
    for config, scaled in ((ANCHOR, True), (ANCHOR.replace(query_type="learned", class_head="softmax", denoising=False,
                                                          query_groups=1, dense_aux_head=False), False)):
        model = DETRPanoptic(build_detr(config)).eval()
        seen = {}
        model.mask_head.register_forward_pre_hook(lambda module, args: seen.update(attention=args[1]))
        with torch.no_grad():
            model(images, padding_mask)
        totals = seen["attention"].sum((2, 3, 4))  # [B, Q]
        cells = torch.tensor([16, 12]) * heads if scaled else torch.ones(2)  # stride 16: 4 × 4 and 4 × 3 cells
        torch.testing.assert_close(totals, cells[:, None].float().expand_as(totals), rtol=1e-5, atol=1e-3)
