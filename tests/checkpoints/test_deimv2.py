"""transformers' DEIMv2 directories in: the same logits and boxes as
``Deimv2ForObjectDetection`` itself on the same random weights and two real photos, for an N-like model (B0, two
levels, the hybrid encoder), an Atto/Femto/Pico-like one (the lite encoder, no gate, SiLU query positions) and a
three-level B4 one, S-X-like ones (a tiny DINOv3 ViT with the spatial tuning adapter), COCO's 80 labels and a
few; back out to transformers; what this project does not build is refused."""

from __future__ import annotations

import json

import pytest
import torch

import detr
from detr.checkpoints import CheckpointError, save_huggingface
from tests.helpers_deimv2 import hf_dinov3_model, hf_model
from tests.helpers_rtdetr import square_photos

transformers = pytest.importorskip("transformers")
load_file = pytest.importorskip("safetensors.torch").load_file

TOLERANCE = 1e-4
SIDE = 128  # a multiple of 32, small enough for a fast test
LITE = {"encoder_type": "lite", "use_gateway": False, "decoder_activation_function": "silu",
        "hidden_expansion": 0.34, "depth_mult": 0.5}


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    return square_photos(SIDE)


def differences(model, hf, images: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        theirs = hf(pixel_values=images)
        ours = model(images, torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool))
    assert ours.logits.shape == theirs.logits.shape and ours.boxes.shape == theirs.pred_boxes.shape
    assert ours.boxes[0].std(dim=0).max() > 1e-3  # queries differ: the comparison is not between constants
    return float((ours.logits - theirs.logits).abs().max()), float((ours.boxes - theirs.pred_boxes).abs().max())


@pytest.mark.parametrize("backbone, num_labels, levels, learnable_affine, options", [
    ("hgnetv2_b0", 80, 2, True, {}),
    ("hgnetv2_b0", 3, 2, True, LITE),
    ("hgnetv2_b4", 5, 3, False, {"decoder_n_points": [3, 6, 3], "hidden_expansion": 0.5, "depth_mult": 0.34}),
])
def test_transformers_directory_loads_with_the_same_outputs(tmp_path, photos, backbone, num_labels, levels,
                                                            learnable_affine, options):
    hf = hf_model(backbone, num_labels, levels=levels, learnable_affine=learnable_affine, **options)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    config = model.config
    assert (config.family, config.backbone, config.num_classes) == ("deimv2", backbone, num_labels)
    assert (config.num_feature_levels, config.backbone_learnable_affine) == (levels, learnable_affine)
    lite = options.get("encoder_type") == "lite"
    assert (config.lite_encoder, config.decoder_gateway) == (lite, not lite)
    assert config.num_encoder_layers == (0 if lite else 1)  # the lite encoder has no AIFI, whatever the file says
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    assert model.stride == (8 if levels == 3 else 16)
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


@pytest.mark.parametrize("options", [{}, LITE], ids=["hybrid", "lite"])
def test_written_directories_load_in_transformers_with_the_same_outputs(tmp_path, photos, options):
    """Back out through ``save_huggingface`` (the family's writer): transformers' ``from_pretrained`` reads every
    weight the directory it wrote itself holds, and predicts what this project's model predicts."""
    hf = hf_model("hgnetv2_b0", 6, seed=3, **options)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    save_huggingface(model, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "deimv2"
    again = transformers.Deimv2ForObjectDetection.from_pretrained(tmp_path / "ours").eval()
    assert (again.config.encoder_type, again.config.use_gateway) == (hf.config.encoder_type, hf.config.use_gateway)
    assert set(load_file(tmp_path / "ours" / "model.safetensors")) == set(
        load_file(tmp_path / "theirs" / "model.safetensors"))
    logits_diff, boxes_diff = differences(model, again, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)
    assert transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours").size["height"] == 640


@pytest.mark.parametrize("change, message", [
    ({"share_bbox_head": True}, "share_bbox_head"),
    ({"encoder_has_trailing_conv": False}, "encoder_has_trailing_conv"),
    ({"decoder_activation_function": "gelu"}, "decoder_activation_function"),
    ({"backbone_config": {"model_type": "resnet"}}, "HGNetV2"),
    ({"backbone_config": {"model_type": "dinov3_vit", "out_indices": [3, 4]}}, "out_indices"),
])
def test_settings_this_model_cannot_reproduce_are_refused(tmp_path, change, message):
    hf_model("hgnetv2_b0", 3).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message) as raised:
        detr.load_checkpoint(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("num_labels, options", [
    (80, {}),
    (3, {"gated_mlp": True, "use_gateway": False, "decoder_activation_function": "silu"}),
], ids=["S-like", "gated"])
def test_dinov3_directories_load_and_write_back_with_the_same_outputs(tmp_path, photos, num_labels, options):
    """DEIMv2 S-X: the DINOv3 ViT (RoPE, register tokens, layer scales; plain or gated MLP) and the spatial tuning
    adapter, the fusion blocks without their trailing 3×3; in, and back out to ``from_pretrained``."""
    hf = hf_dinov3_model(num_labels, seed=5, **options)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    config = model.config
    assert (config.backbone, config.vit.width, config.vit.depth, config.vit.out_layers) == ("dinov3_vit", 32, 4,
                                                                                            (1, 2, 3))
    assert (config.vit.gated_mlp, config.csp_trailing_conv, config.adapter_channels) == (
        bool(options), False, 8)
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)
    save_huggingface(model, tmp_path / "ours")
    again = transformers.Deimv2ForObjectDetection.from_pretrained(tmp_path / "ours").eval()
    assert set(load_file(tmp_path / "ours" / "model.safetensors")) == set(
        load_file(tmp_path / "theirs" / "model.safetensors"))
    logits_diff, boxes_diff = differences(model, again, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_dinov3_settings_this_model_cannot_reproduce_are_refused(tmp_path):
    hf_dinov3_model(3).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["backbone_config"]["key_bias"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="key_bias") as raised:
        detr.load_checkpoint(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value) and "\n" not in str(raised.value)


def test_a_processor_with_mean_and_std_is_refused(tmp_path):
    hf_model("hgnetv2_b0", 3).save_pretrained(tmp_path)
    transformers.RTDetrImageProcessor(do_normalize=True).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="do_normalize") as raised:
        detr.load_checkpoint(tmp_path)
    assert "preprocessor_config.json" in str(raised.value) and "\n" not in str(raised.value)
