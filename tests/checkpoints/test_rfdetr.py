"""transformers' RF-DETR directories in: the same logits and boxes as ``RfDetrForObjectDetection`` itself on the same
random weights and two real photos, for two configurations (2 × 2 windows, patch 14, the position table
interpolated, COCO's 80 labels; no windows, patch 16, another table size and stages, a few labels) and the masks of
``RfDetrForInstanceSegmentation``; LW-DETR (``LwDetrForObjectDetection``: its own ViT, projectors at several
scales with BatchNorms, several decoder levels); back out to transformers; what this project's RF-DETR cannot
reproduce is refused."""

from __future__ import annotations

import json

import pytest
import torch

import detr
from detr.checkpoints import CheckpointError, save_huggingface
from tests.helpers_rfdetr import hf_lwdetr, hf_model
from tests.helpers_rtdetr import square_photos

transformers = pytest.importorskip("transformers")
load_file = pytest.importorskip("safetensors.torch").load_file

TOLERANCE = 1e-4
SIDE = 112  # a multiple of 14 × 2 windows and of 16, small enough for a fast test


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    return square_photos(SIDE)


def differences(model, hf, images: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        theirs = hf(pixel_values=images)
        ours = model(images, torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool))
    assert ours.logits.shape == theirs.logits.shape and ours.boxes.shape == theirs.pred_boxes.shape
    assert ours.boxes[0].std(dim=0).max() > 1e-3  # queries differ: the comparison is not between constants
    found = {"logits": float((ours.logits - theirs.logits).abs().max()),
             "boxes": float((ours.boxes - theirs.pred_boxes).abs().max())}
    if getattr(theirs, "pred_masks", None) is not None:
        assert ours.masks.shape == theirs.pred_masks.shape
        found["masks"] = float((ours.masks - theirs.pred_masks).abs().max())
    return found


@pytest.mark.parametrize("num_labels, vit, options", [
    (80, {}, {}),
    (3, {"num_windows": 1, "patch_size": 16, "image_size": 64, "out_indices": [2, 3]},
     {"decoder_n_points": 2, "c2f_num_blocks": 1, "hidden_expansion": 0.25}),
])
def test_transformers_directory_loads_with_the_same_outputs(tmp_path, photos, num_labels, vit, options):
    hf = hf_model(num_labels, vit=vit, **options)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    config = model.config
    assert (config.family, config.num_classes, config.num_queries, config.hidden_dim) == ("rfdetr", num_labels,
                                                                                               20, 64)
    assert (config.vit.num_windows, config.vit.patch_size) == (vit.get("num_windows", 2), vit.get("patch_size", 14))
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    assert not model.predicts_masks
    found = differences(model, hf, photos)
    assert max(found.values()) <= TOLERANCE, found


def test_instance_segmentation_loads_with_the_same_masks(tmp_path, photos):
    hf = hf_model(5, masks=True, seed=2)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    assert model.predicts_masks and model.config.instance_masks
    found = differences(model, hf, photos)
    assert found["masks"] <= TOLERANCE and max(found.values()) <= TOLERANCE, found


@pytest.mark.parametrize("masks", [False, True])
def test_written_directories_load_in_transformers_with_the_same_outputs(tmp_path, photos, masks):
    """Back out through ``save_huggingface``: every weight transformers wrote comes back (the Group DETR training
    groups included), ``from_pretrained`` reads them, and predicts what this project's model predicts."""
    hf = hf_model(6, masks=masks, seed=3)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    save_huggingface(model, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (written["model_type"], written["group_detr"]) == ("rf_detr", 3)
    family = transformers.RfDetrForInstanceSegmentation if masks else transformers.RfDetrForObjectDetection
    again = family.from_pretrained(tmp_path / "ours").eval()
    theirs, ours = (load_file(tmp_path / name / "model.safetensors") for name in ("theirs", "ours"))
    assert set(ours) == set(theirs) and all(torch.equal(ours[key], theirs[key]) for key in theirs)
    found = differences(model, again, photos)
    assert max(found.values()) <= TOLERANCE, found
    assert detr.load_checkpoint(tmp_path / "ours").config == model.config
    assert transformers.RfDetrImageProcessor.from_pretrained(tmp_path / "ours").size["height"] == 560


@pytest.mark.parametrize("num_labels, vit, options", [
    (80, {}, {}),  # projectors at 2 and 0.5: strides 7 and 28
    (4, {"num_windows": 16, "window_block_indices": [0, 1], "out_indices": [1, 3], "patch_size": 7},
     {"projector_scale_factors": [1.0], "num_feature_levels": 1, "decoder_n_points": 3}),
])
def test_lwdetr_directory_loads_with_the_same_outputs(tmp_path, photos, num_labels, vit, options):
    hf = hf_lwdetr(num_labels, vit=vit, **options)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    config = model.config
    assert (config.backbone, config.projector_norm, config.num_classes) == ("lwdetr_vit", "batch_norm", num_labels)
    assert config.num_feature_levels == len(options.get("projector_scale_factors", [2.0, 0.5]))
    assert model.input_spec.interpolation == "antialiased" and "LW-DETR" in model.describe()
    found = differences(model, hf, photos)
    assert max(found.values()) <= TOLERANCE, found


def test_written_lwdetr_directories_load_in_transformers_with_the_same_outputs(tmp_path, photos):
    hf = hf_lwdetr(6, seed=3)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    save_huggingface(model, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "lw_detr"
    again = transformers.LwDetrForObjectDetection.from_pretrained(tmp_path / "ours").eval()
    theirs, ours = (load_file(tmp_path / name / "model.safetensors") for name in ("theirs", "ours"))
    assert set(ours) == set(theirs) and all(torch.equal(ours[key], theirs[key]) for key in theirs)
    found = differences(model, again, photos)
    assert max(found.values()) <= TOLERANCE, found


@pytest.mark.parametrize("change, message", [
    ({"decoder_activation_function": "gelu"}, "decoder_activation_function"),
    ({"num_feature_levels": 2}, "num_feature_levels"),
    ({"backbone_config": {"use_swiglu_ffn": True}}, "use_swiglu_ffn"),
    ({"backbone_config": {"model_type": "dinov2"}}, "rf_detr_dinov2"),
])
def test_settings_this_model_cannot_reproduce_are_refused(tmp_path, change, message):
    hf_model(3).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            config[key].update(value)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        detr.load_checkpoint(tmp_path)


def test_a_non_square_processor_size_is_refused_naming_the_fix(tmp_path):
    hf_model(3).save_pretrained(tmp_path)
    transformers.RfDetrImageProcessor().save_pretrained(tmp_path)  # the class default: shortest edge 800
    with pytest.raises(CheckpointError, match="preprocessor_config.json.*square"):
        detr.load_checkpoint(tmp_path)
