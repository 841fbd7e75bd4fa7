"""transformers' RT-DETR and RT-DETRv2 directories in: the same logits and boxes as ``RTDetrForObjectDetection``
and ``RTDetrV2ForObjectDetection`` themselves on the same random weights and two real photos, for basic-block
(R18) and bottleneck (R50) backbones, COCO's 80 labels and a few, RT-DETRv2's offset scale and discrete
sampling; the decoder cut short at inference equals transformers' intermediate layer; what this project's
RT-DETR cannot reproduce is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import detr
from detr.checkpoints import CheckpointError
from tests.helpers import REPO, randomise

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TOLERANCE = 1e-4
SIDE = 128  # a multiple of 32, small enough for a fast test
#: A small decoder and encoder (widths 64, 4 heads) on the real ResNet-vd depths, 3 decoder layers as R18's.
TINY = {"encoder_hidden_dim": 64, "d_model": 64, "encoder_ffn_dim": 96, "decoder_ffn_dim": 128,
        "decoder_in_channels": [64] * 3, "decoder_layers": 3, "num_queries": 30, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4}
BACKBONES = {"resnet18": ("basic", [2, 2, 2, 2], [64, 128, 256, 512]),
             "resnet50": ("bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048])}


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """chelsea and astronaut, resized to SIDE × SIDE (PIL bilinear) and scaled to [0, 1]: [2, 3, SIDE, SIDE]."""
    images = [np.asarray(Image.open(REPO / "data" / "photos" / name).convert("RGB").resize((SIDE, SIDE),
                                                                                            Image.BILINEAR))
              for name in ("chelsea.png", "astronaut.png")]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255


def hf_model(backbone: str = "resnet18", num_labels: int = 80, *, version: int = 1, seed: int = 0, **options):
    """A transformers RT-DETR (version 1) or RT-DETRv2 (2) with random weights everywhere (transformers' init
    starts every query at the same box), RT-DETRv2's 1 / points buffer kept as it is."""
    layer_type, depths, widths = BACKBONES[backbone]
    resnet = transformers.RTDetrResNetConfig(layer_type=layer_type, depths=depths, hidden_sizes=widths,
                                             out_indices=[2, 3, 4])
    config_class, model_class = ((transformers.RTDetrConfig, transformers.RTDetrForObjectDetection) if version == 1
                                 else (transformers.RTDetrV2Config, transformers.RTDetrV2ForObjectDetection))
    config = config_class(backbone_config=resnet, encoder_in_channels=widths[1:], num_labels=num_labels,
                          id2label={i: f"thing {i}" for i in range(num_labels)}, **{**TINY, **options})
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomise(model, seed)
    if version == 2:
        with torch.no_grad():
            for layer in model.model.decoder.layers:
                layer.encoder_attn.n_points_scale.fill_(1.0 / config.decoder_n_points)
    return model


def differences(model, hf, images: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        theirs = hf(pixel_values=images)
        ours = model(images, torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool))
    assert ours.logits.shape == theirs.logits.shape and ours.boxes.shape == theirs.pred_boxes.shape
    assert ours.boxes[0].std(dim=0).max() > 1e-3  # queries differ: the comparison is not between constants
    return float((ours.logits - theirs.logits).abs().max()), float((ours.boxes - theirs.pred_boxes).abs().max())


@pytest.mark.parametrize("version, backbone, num_labels, options", [
    (1, "resnet18", 80, {}),
    (1, "resnet18", 3, {}),
    (1, "resnet50", 80, {}),
    (1, "resnet50", 2, {}),
    (2, "resnet18", 80, {}),
    (2, "resnet50", 5, {}),
    (2, "resnet18", 4, {"decoder_method": "discrete", "decoder_offset_scale": 0.7}),
])
def test_transformers_directory_loads_with_the_same_outputs(tmp_path, photos, version, backbone, num_labels,
                                                            options):
    hf = hf_model(backbone, num_labels, version=version, **options)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    config = model.config
    assert (config.architecture, config.backbone, config.num_classes) == ("rtdetr", backbone, num_labels)
    assert (config.num_decoder_layers, config.num_queries, config.hidden_dim) == (3, 30, 64)
    assert config.sampling_method == ("discrete" if options else "bilinear")
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_a_wider_encoder_and_its_own_ffn_load(tmp_path, photos):
    """R101's layout: the encoder wider than the decoder (384 and 256 there) and its own FFN width; CSP blocks
    at half width (RT-DETRv2-S's expansion 0.5)."""
    hf = hf_model("resnet18", 6, encoder_hidden_dim=96, decoder_in_channels=[96] * 3, encoder_ffn_dim=160,
                  hidden_expansion=0.5)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    assert (model.config.encoder_hidden_dim, model.config.encoder_dim_feedforward) == (96, 160)
    assert model.config.csp_expansion == 0.5
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_a_shorter_decoder_at_inference_is_transformers_intermediate_layer(tmp_path, photos):
    """The speed knob: running the first two of three layers gives layer 2's predictions, which transformers
    computes on the way (its intermediate logits and reference boxes)."""
    hf = hf_model("resnet18", 7)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path).set_inference_layers(2)
    with torch.no_grad():
        theirs = hf(pixel_values=photos)
        ours = model(photos, torch.zeros(2, SIDE, SIDE, dtype=torch.bool))
    assert len(ours.aux) == 1
    assert float((ours.logits - theirs.intermediate_logits[:, 1]).abs().max()) <= TOLERANCE
    assert float((ours.boxes - theirs.intermediate_reference_points[:, 1]).abs().max()) <= TOLERANCE
    with pytest.raises(ValueError, match="num_layers must be in 1..3"):
        model.set_inference_layers(4)


def test_the_processor_size_becomes_the_square_input(tmp_path):
    hf_model("resnet18", 2).save_pretrained(tmp_path)
    transformers.RTDetrImageProcessor(size={"height": 320, "width": 320}).save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    spec = model.input_spec
    assert (spec.resize, spec.size, spec.mean, spec.std) == ("square", 320, None, None)
    processor = json.loads((tmp_path / "preprocessor_config.json").read_text())
    processor["size"] = {"height": 320, "width": 480}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(CheckpointError, match="square"):
        detr.load_checkpoint(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"learn_initial_query": True}, "learn_initial_query"),
    ({"decoder_attention_heads": 2}, "decoder_attention_heads"),
    ({"activation_function": "relu"}, "activation_function"),
])
def test_settings_this_model_cannot_reproduce_are_refused(tmp_path, change, message):
    hf_model("resnet18", 2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        detr.load_checkpoint(tmp_path)
