"""The rfdetr package's files (``{"model": state_dict, "args": ...}``, roboflow/rf-detr): written here from a tiny
transformers RF-DETR's weights, which transformers saves in the authors' keys, they load with the configuration their
``args`` (a Namespace or a dict, with ``model_config``) or their released model's name gives, and the same outputs."""

from __future__ import annotations

import argparse

import pytest
import torch

import detr
from detr.checkpoints.formats import CheckpointError
from tests.helpers_rfdetr import hf_model
from tests.helpers_rtdetr import square_photos

pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.usefixtures("one_thread")

#: DINOv2's 64-wide heads (the package's encoders; the heads are not in its args): a ViT 128 wide, 2 heads.
VIT = {"hidden_size": 128, "num_attention_heads": 2}
#: What the package's args record of :data:`tests.helpers_rfdetr.TINY` (the rest is read off the weights).
ARGS = {"encoder": "dinov2_windowed_small", "out_feature_indexes": [1, 2, 4], "num_windows": 2, "sa_nheads": 4,
        "ca_nheads": 8, "resolution": 112, "projector_scale": ["P4"], "num_classes": 4, "group_detr": 3,
        "dec_layers": 2, "num_queries": 20, "hidden_dim": 64, "patch_size": 14, "positional_encoding_size": 4}


def _authors_weights(hf, tmp_path) -> dict[str, torch.Tensor]:
    """The model's weights in the authors' keys: transformers writes them so."""
    hf.save_pretrained(tmp_path / "hf")
    return safetensors_torch.load_file(str(tmp_path / "hf" / "model.safetensors"))


def _max_differences(model, hf, size: int) -> list[float]:
    images = square_photos(size)
    with torch.no_grad():
        ours = model.eval()(images, torch.zeros(len(images), size, size, dtype=torch.bool))
        theirs = hf(pixel_values=images)
    differences = [(ours.logits - theirs.logits).abs().max().item(),
                   (ours.boxes - theirs.pred_boxes).abs().max().item()]
    if ours.masks is not None:
        differences.append((ours.masks - theirs.pred_masks).abs().max().item())
    return differences


@pytest.mark.parametrize("masks", [False, True], ids=["detection", "instance masks"])
def test_a_file_with_namespace_args_loads_with_the_same_outputs(tmp_path, masks):
    hf = hf_model(5, vit=VIT, masks=masks)
    path = tmp_path / "checkpoint_best_total.pth"
    names = ["cat", "dog", "bird", "fish"]  # 5 logits: labels 1..4 are the data set's classes, 0 unused
    torch.save({"model": _authors_weights(hf, tmp_path),
                "args": argparse.Namespace(**ARGS, class_names=names, segmentation_head=masks)}, path)
    model = detr.load_checkpoint(path)
    config = model.config
    assert (config.vit.width, config.vit.heads, config.vit.out_indices, config.vit.num_windows) == (
        128, 2, (1, 2, 4), 2)
    assert (config.num_queries, config.query_groups, config.num_classes, config.num_points) == (20, 3, 5, 4)
    assert model.predicts_masks == masks and model.meta.eval_size == (112, 112)
    assert model.meta.category_map.names == ("N/A", *names) and model.meta.category_map.category_ids == (0, 1, 2, 3, 4)
    assert max(_max_differences(model, hf, 112)) <= 1e-4


def test_a_lightning_era_file_reads_model_config_and_a_release_its_presets(tmp_path):
    """The package's newer files store args as a dict and model_config beside it; a released file (rf-detr-nano.pth)
    may store neither: its model's preset fills in what the weights do not show."""
    hf = hf_model(91, vit={"hidden_size": 64, "num_attention_heads": 1, "num_hidden_layers": 12,
                           "out_indices": [3, 6, 9, 12], "patch_size": 16, "image_size": 64},
                  decoder_self_attention_heads=8, decoder_cross_attention_heads=16)
    weights = _authors_weights(hf, tmp_path)
    released = tmp_path / "rf-detr-nano.pth"
    torch.save({"model": weights}, released)
    model = detr.load_checkpoint(released)
    assert model.config.vit.out_indices == (3, 6, 9, 12) and model.config.vit.patch_size == 16
    assert model.meta.eval_size == (384, 384) and model.meta.category_map.names[1] == "person"  # COCO's ids
    assert max(_max_differences(model, hf, 128)) <= 1e-4
    renamed = tmp_path / "mine.pth"
    torch.save({"model": weights, "model_name": "RFDETRNano", "args": {"epochs": 3},
                "model_config": {"resolution": 320, "num_windows": 2}}, renamed)
    assert detr.load_checkpoint(renamed).meta.eval_size == (320, 320)


def test_settings_the_file_lacks_or_this_model_cannot_build_are_refused_in_one_line(tmp_path):
    weights = _authors_weights(hf_model(3, vit=VIT), tmp_path)
    path = tmp_path / "finetuned.pth"
    torch.save({"model": weights}, path)
    with pytest.raises(CheckpointError, match=r"finetuned\.pth: the file records no \['out_feature_indexes'"):
        detr.load_checkpoint(path)
    for change, message in (({"encoder": "dinov2_registers_windowed_small"}, "without register tokens"),
                            ({"projector_scale": ["P3", "P5"]}, "projector_scale")):
        torch.save({"model": weights, "args": argparse.Namespace(**{**ARGS, **change})}, path)
        with pytest.raises(CheckpointError, match=message) as refusal:
            detr.load_checkpoint(path)
        assert "\n" not in str(refusal.value)
