"""RF-DETR with the GroupPose keypoint head (the rfdetr package's ``RFDETRKeypointPreview``): its preset against the
package's config, its recipe's criterion on a tiny keypoint model, and the config's refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from detr.loss.build import build_criterion
from detr.models.build import build_detr, recipe_for
from detr.models.family import family_named
from tests.helpers_rfdetr import KEYPOINT_COUNTS, TINY_KEYPOINT_RFDETR
from tests.helpers_rfdetr_package import package_config

pytestmark = pytest.mark.usefixtures("one_thread")

COUNTS, TINY = KEYPOINT_COUNTS, TINY_KEYPOINT_RFDETR


def test_the_preview_preset_is_the_package_s_keypoint_preview():
    ours = family_named("rfdetr").presets["rfdetr_keypoint_preview"]()
    theirs = package_config("RFDETRKeypointPreviewConfig", pretrain_weights=None)
    vit = ours.vit
    assert (vit.out_indices, vit.num_windows, vit.patch_size, vit.position_size) == (
        tuple(theirs.out_feature_indexes), theirs.num_windows, theirs.patch_size,
        theirs.positional_encoding_size * theirs.patch_size)
    assert theirs.resolution == vit.position_size and theirs.encoder == "dinov2_windowed_small" and vit.width == 384
    assert (ours.hidden_dim, ours.num_heads, ours.cross_attention_heads, ours.num_points) == (
        theirs.hidden_dim, theirs.sa_nheads, theirs.ca_nheads, theirs.dec_n_points)
    assert (ours.num_decoder_layers, ours.num_queries, ours.num_classes, ours.query_groups) == (
        theirs.dec_layers, theirs.num_queries, theirs.num_classes + 1, theirs.group_detr)
    assert ours.num_keypoints_per_class == tuple(theirs.num_keypoints_per_class)
    assert (ours.keypoint_dim_divisor, ours.keypoint_cross_attention, ours.keypoint_inter_instance_attention) == (
        theirs.grouppose_keypoint_dim_downscale, theirs.keypoint_cross_attn, theirs.inter_instance_kp_attn)
    assert ours.keypoint_projector == (theirs.dual_projector and theirs.dual_projector_kp_only)
    assert ours.keypoint_trace_alpha == theirs.postprocess_trace_alpha
    train = package_config("KeypointTrainConfig", dataset_dir=".", output_dir=".")
    loss = recipe_for(ours).loss
    assert (loss.loss_ce, loss.loss_keypoint_l1, loss.loss_keypoint_findable, loss.loss_keypoint_visible,
            loss.loss_keypoint_nll) == (train.cls_loss_coef, train.keypoint_l1_loss_coef,
                                        train.keypoint_findable_loss_coef, train.keypoint_visible_loss_coef,
                                        train.keypoint_nll_loss_coef)


def _targets() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    targets = []
    for labels in ([1, 2], [0, 1, 2]):
        count = len(labels)
        keypoints = torch.rand(count, max(COUNTS), 3, generator=generator)
        keypoints[..., 2] = torch.randint(0, 3, (count, max(COUNTS)), generator=generator).float()
        targets.append({"labels": torch.tensor(labels), "keypoints": keypoints,
                        "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3]]).repeat(count, 1)})
    return targets


def test_the_recipe_s_criterion_trains_the_keypoints_of_every_layer_and_the_proposals():
    model = build_detr(TINY).train()
    criterion = build_criterion(TINY)
    assert criterion.matcher.keypoint_schema.counts == COUNTS and criterion.matcher.keypoint_costs == (1, 1, 1, 1)
    outputs = model(torch.randn(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.bool))
    losses = criterion(outputs, _targets(), torch.tensor(5.0))
    for suffix in ("", "_0", "_enc"):
        for term in ("l1", "findable", "visible", "nll"):
            assert losses[f"loss_keypoints_{term}{suffix}"] > 0
    assert criterion.weight_dict["loss_ce"] == 2.0 and criterion.weight_dict["loss_keypoints_nll_enc"] == 1.0
    total = sum(criterion.weight_dict[name] * value for name, value in losses.items() if name in criterion.weight_dict)
    total.backward()
    head = model.decoder.keypoint_head
    for parameter in (head.predictor.layers[-1].weight, head.encoder_predictors[1].layers[-1].weight,
                      head.layers[0].kp_cross_attn.value_proj.weight, model.keypoint_projector[0].conv1.conv.weight):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_keypoints_per_class": (), "keypoint_projector": True}, "keypoint_projector=True"),
    ({"num_keypoints_per_class": (0, 1, 2, 3, 4)}, "raise num_classes"),
    ({"num_keypoints_per_class": (0, 0)}, "at least one above 0"),
    ({"keypoint_dim_divisor": 3}, "keypoint_dim_divisor"),
    ({"instance_masks": True}, "instance masks or keypoints"),
])
def test_a_keypoint_config_the_model_cannot_build_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **changes)
