"""The criterion's parts (detr/loss/parts.py): composed by SetCriterion, named and weighted by themselves."""

from __future__ import annotations

import pytest
import torch

from detr.loss.build import build_criterion
from detr.loss.criterion import LossPart, SetCriterion
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import DenoisingLoss, DenseLoss
from detr.models.detr_family import DetrConfig
from detr.models.layers.denoising import DenoisingMeta
from detr.models.outputs import DenoisingOutput, DenseOutput, DetectorOutput
from tests.helpers import model_output


def _outputs_and_targets() -> tuple[DetectorOutput, list[dict[str, torch.Tensor]]]:
    """One image, 3 sigmoid queries over 2 classes, and a 2 × 2 dense grid whose cell 0 holds the target."""
    torch.manual_seed(0)
    centers = torch.tensor([[[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]]])
    dense = DenseOutput(logits=torch.randn(1, 4, 2), boxes=torch.rand(1, 4, 4) * 0.5 + 0.2, centers=centers,
                        valid=torch.ones(1, 4, dtype=torch.bool))
    outputs = model_output(logits=torch.randn(1, 3, 2), boxes=torch.rand(1, 3, 4) * 0.5 + 0.2, dense=dense)
    return outputs, [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.25, 0.25, 0.2, 0.2]])}]


def _sigmoid_criterion(**kwargs) -> SetCriterion:
    return SetCriterion(2, HungarianMatcher(class_head="sigmoid"), class_head="sigmoid", num_decoder_layers=2, **kwargs)


class Constant(LossPart):
    """A toy part: one term, reading no output field."""

    output_field = "constant"

    def __init__(self) -> None:
        super().__init__()
        self.weight_dict = {"loss_constant": 3.0}

    def forward(self, outputs, targets, num_boxes, context=None):
        return {"loss_constant": num_boxes * 0 + 7.0}


def test_the_builder_adds_the_parts_the_config_asks_for():
    config = DetrConfig(num_classes=2, num_decoder_layers=2, query_type="anchor", class_head="sigmoid",
                        denoising=True, dense_aux_head=True)
    built = build_criterion(config, loss_bbox=4.0, focal_alpha=0.3)
    parts = _sigmoid_criterion(loss_bbox=4.0, focal_alpha=0.3, parts=[
        DenoisingLoss(2, class_head="sigmoid", loss_bbox=4.0, focal_alpha=0.3),
        DenseLoss(loss_bbox=4.0, focal_alpha=0.3)])
    assert list(built.weight_dict.items()) == list(parts.weight_dict.items())
    assert [type(p) for p in built.parts] == [DenoisingLoss, DenseLoss]
    assert built.weight_dict["loss_bbox_dn_0"] == 4.0 and built.weight_dict["loss_giou_dense"] == 2.0
    outputs, targets = _outputs_and_targets()
    a, b = built(outputs, targets), parts(outputs, targets)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_parts_terms_and_weights_join_the_set_loss():
    outputs, targets = _outputs_and_targets()
    criterion = _sigmoid_criterion(parts=[DenseLoss(), Constant()])
    losses = criterion(outputs, targets)
    assert list(criterion.weight_dict) == ["loss_ce", "loss_bbox", "loss_giou", "loss_ce_0", "loss_bbox_0",
                                           "loss_giou_0", "loss_ce_dense", "loss_bbox_dense", "loss_giou_dense",
                                           "loss_constant"]
    assert losses["loss_constant"].item() == 7.0
    torch.testing.assert_close(losses["loss_ce_dense"], DenseLoss()(outputs, targets)["loss_ce_dense"])
    plain = _sigmoid_criterion()(model_output(outputs.logits, outputs.boxes), targets)
    assert all(torch.equal(plain[k], losses[k]) for k in plain)  # the set loss does not depend on the parts


def test_outputs_a_missing_part_reads_are_refused():
    outputs, targets = _outputs_and_targets()
    with pytest.raises(ValueError, match=r"dense.*DenseLoss.*build_criterion"):
        _sigmoid_criterion()(outputs, targets)
    outputs.denoising = DenoisingOutput(outputs.logits, outputs.boxes, [], DenoisingMeta(1, 1))
    with pytest.raises(ValueError, match=r"denoising.*DenoisingLoss"):
        _sigmoid_criterion(parts=[DenseLoss()])(outputs, targets)


def test_parts_without_their_outputs_give_zeros_under_their_names():
    outputs, targets = _outputs_and_targets()
    outputs.dense = None
    for part in (DenoisingLoss(3), DenseLoss()):
        losses = part(outputs, targets, torch.tensor(1.0))
        assert list(losses) == list(part.weight_dict) and all(float(v) == 0 for v in losses.values())
    assert list(DenoisingLoss(3).weight_dict)[::3] == ["loss_ce_dn", "loss_ce_dn_0", "loss_ce_dn_1"]


def test_inconsistent_parts_are_refused():
    with pytest.raises(ValueError, match="two parts read 'dense'"):
        _sigmoid_criterion(parts=[DenseLoss(), DenseLoss()])
    with pytest.raises(ValueError, match="class_head='softmax'"):
        _sigmoid_criterion(parts=[DenoisingLoss(2)])
    with pytest.raises(ValueError, match="class_head must be"):  # the one place the word is checked
        DetrConfig(class_head="focal")
