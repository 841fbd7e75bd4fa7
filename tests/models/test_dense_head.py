"""dense_aux_head: the training-only one-to-many head on the encoder output."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import generalized_box_iou, sigmoid_focal_loss

from detr import build_detr
from detr.box_ops import cxcywh_to_xyxy
from detr.loss.criterion import SetCriterion
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import DenseLoss, dense_assignment
from detr.models.outputs import DenseOutput
from tests.helpers import model_output, tiny_config_with

TINY = tiny_config_with(num_queries=5, num_classes=3, dropout=0.0, backbone_last_stage="layer3", class_head="sigmoid")


def _grid_centers(height: int, width: int, cols_real: int | None = None) -> torch.Tensor:
    cols_real = cols_real or width
    y, x = torch.meshgrid((torch.arange(height) + 0.5) / height, (torch.arange(width) + 0.5) / cols_real, indexing="ij")
    return torch.stack([x, y], dim=-1).flatten(0, 1)[None]  # [1, HW, 2]


def test_assignment_covers_boxes_keeps_small_objects_and_prefers_the_smaller_box():
    centers = _grid_centers(4, 4)  # centres at 0.125, 0.375, 0.625, 0.875
    valid = torch.ones(1, 16, dtype=torch.bool)
    targets = [{"labels": torch.tensor([0, 1, 2]),
                "boxes": torch.tensor([[0.5, 0.5, 0.9, 0.9],     # big: covers the 2 × 2 middle ... and more
                                       [0.375, 0.375, 0.2, 0.2],  # covers the centre (0.375, 0.375) only
                                       [0.9, 0.1, 0.02, 0.02]])}]  # tiny: no cell centre inside
    assigned = dense_assignment(centers, valid, targets).view(4, 4)
    assert assigned[1, 1] == 1  # inside both the big box and box 1: the smaller wins
    assert assigned[0, 3] == 2  # the tiny box still gets the cell holding its centre
    inside_big = (centers[0, :, 0] - 0.5).abs().lt(0.45) & (centers[0, :, 1] - 0.5).abs().lt(0.45)
    expected = torch.where(inside_big, 0, -1).view(4, 4)
    expected[1, 1], expected[0, 3] = 1, 2
    assert torch.equal(assigned, expected)


def test_assignment_ignores_padding_cells_and_empty_images():
    centers = _grid_centers(2, 4, cols_real=2)  # the right two columns are padding
    valid = torch.tensor([[True, True, False, False, True, True, False, False]])
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.99, 0.3, 0.02, 0.5]])}]
    assigned = dense_assignment(centers, valid, targets)
    # no real cell centre inside: only the real cell nearest the box centre, not the padding cell under it
    assert assigned.tolist() == [[-1, 0, -1, -1, -1, -1, -1, -1]]
    empty = dense_assignment(centers, valid, [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}])
    assert (empty == -1).all()


@pytest.mark.parametrize("query_type", ["learned", "anchor"])
def test_dense_head_trains_with_the_model_and_is_skipped_at_inference(query_type):
    torch.manual_seed(0)
    model = build_detr(TINY, query_type=query_type, dense_aux_head=True)
    torch.manual_seed(0)
    plain = build_detr(TINY, query_type=query_type)
    images = torch.randn(2, 3, 128, 128)
    mask = torch.zeros(2, 128, 128, dtype=torch.bool)
    mask[1, :, 96:] = True
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.6, 0.6, 0.05, 0.05]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    model.train()
    out = model(images, mask, targets=targets)
    dense = out.dense
    assert dense.logits.shape == (2, 64, 3) and dense.boxes.shape == (2, 64, 4)
    assert dense.valid[1].view(8, 8)[:, 6:].logical_not().all()  # padded columns
    criterion = SetCriterion(3, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid", num_decoder_layers=2,
                             parts=[DenseLoss()])
    losses = criterion(out, targets)
    assert {"loss_ce_dense", "loss_bbox_dense", "loss_giou_dense"} <= set(criterion.weight_dict)
    sum(losses[name] * weight for name, weight in criterion.weight_dict.items()).backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []
    # Inference: the head does not run; every other weight is the plain model's, so outputs are equal.
    model.eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("dense_head.")})
    plain.eval()
    with torch.no_grad():
        got, expected = model(images, mask), plain(images, mask)
    assert got.dense is None
    torch.testing.assert_close(got.boxes, expected.boxes)
    with pytest.raises(ValueError, match="DenseLoss"):
        SetCriterion(3, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid", num_decoder_layers=2)(out, targets)


def test_dense_losses_by_hand():
    dense_loss = DenseLoss()
    centers = _grid_centers(2, 2)  # (0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)
    logits = torch.tensor([[[1.0, -1.0], [0.5, 0.2], [-2.0, 0.3], [0.0, 0.0]]])
    boxes = torch.tensor([[[0.3, 0.3, 0.3, 0.3], [0.7, 0.3, 0.2, 0.2], [0.2, 0.8, 0.1, 0.1], [0.5, 0.5, 0.5, 0.5]]])
    dense = DenseOutput(logits=logits, boxes=boxes, centers=centers, valid=torch.ones(1, 4, dtype=torch.bool))
    target_box = torch.tensor([[0.25, 0.25, 0.2, 0.2]])  # holds cell 0 only
    targets = [{"labels": torch.tensor([1]), "boxes": target_box}]
    losses = dense_loss(model_output(logits=torch.zeros(1, 1, 2), dense=dense), targets)
    onehot = torch.zeros(1, 4, 2)
    onehot[0, 0, 1] = 1
    torch.testing.assert_close(losses["loss_ce_dense"], sigmoid_focal_loss(logits, onehot, reduction="sum") / 1)
    torch.testing.assert_close(losses["loss_bbox_dense"], (boxes[0, 0] - target_box[0]).abs().sum())
    giou = generalized_box_iou(cxcywh_to_xyxy(boxes[0, :1]), cxcywh_to_xyxy(target_box))[0, 0]
    torch.testing.assert_close(losses["loss_giou_dense"], 1 - giou)
    zeros = dense_loss(model_output(logits=torch.zeros(1, 1, 2)), targets)
    assert all(float(v) == 0 for v in zeros.values())
