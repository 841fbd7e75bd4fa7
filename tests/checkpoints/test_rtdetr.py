"""transformers' RT-DETR and RT-DETRv2 directories in: the same logits and boxes as ``RTDetrForObjectDetection``
and ``RTDetrV2ForObjectDetection`` themselves on the same random weights and two real photos, for basic-block
(R18) and bottleneck (R50) backbones, COCO's 80 labels and a few, RT-DETRv2's offset scale and discrete
sampling; the decoder cut short at inference equals transformers' intermediate layer; what this project's
RT-DETR cannot reproduce is refused."""

from __future__ import annotations

import json

import pytest
import torch

import detr
from detr.categories import CategoryMap
from detr.checkpoints import CheckpointError, save_huggingface
from detr.models.config import ModelMeta
from tests.helpers_rtdetr import hf_model, square_photos

transformers = pytest.importorskip("transformers")
load_file = pytest.importorskip("safetensors.torch").load_file

TOLERANCE = 1e-4
SIDE = 128  # a multiple of 32, small enough for a fast test


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
    assert (config.family, config.backbone, config.num_classes) == ("rtdetr", backbone, num_labels)
    assert (config.num_decoder_layers, config.num_queries, config.hidden_dim) == (3, 30, 64)
    assert config.sampling_method == ("discrete" if options else "bilinear")
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_a_flag_transformers_ignores_is_accepted(tmp_path, photos):
    # RTDetrResNet reads downsample_in_bottleneck in bottleneck blocks only: R18's basic blocks build the same model
    hf = hf_model("resnet18", 3, backbone_options={"downsample_in_bottleneck": True})
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["backbone_config"]["downsample_in_bottleneck"]
    logits_diff, boxes_diff = differences(detr.load_checkpoint(tmp_path), hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_the_flag_is_refused_where_transformers_reads_it(tmp_path):
    hf_model("resnet50", 3, backbone_options={"downsample_in_bottleneck": True}).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="downsample_in_bottleneck"):
        detr.load_checkpoint(tmp_path)


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


#: Keys of the authors' RT-DETRv2 models (lyuwenyu/RT-DETR, rtdetrv2_pytorch: PResNet, HybridEncoder,
#: RTDETRTransformerv2), one per kind of module.
AUTHORS_KEYS = (
    "backbone.conv1.conv1_1.conv.weight", "backbone.conv1.conv1_3.norm.running_var",
    "backbone.res_layers.0.blocks.0.short.conv.weight", "backbone.res_layers.1.blocks.0.short.conv.conv.weight",
    "backbone.res_layers.3.blocks.1.branch2b.norm.weight", "encoder.input_proj.2.conv.weight",
    "encoder.encoder.0.layers.0.self_attn.in_proj_weight", "encoder.encoder.0.layers.0.linear2.weight",
    "encoder.fpn_blocks.1.bottlenecks.2.conv2.norm.running_mean", "encoder.pan_blocks.0.conv2.conv.weight",
    "encoder.lateral_convs.0.conv.weight", "encoder.downsample_convs.1.norm.bias", "decoder.input_proj.0.conv.weight",
    "decoder.decoder.layers.2.cross_attn.sampling_offsets.weight", "decoder.decoder.layers.0.self_attn.out_proj.bias",
    "decoder.decoder.layers.1.norm3.weight", "decoder.query_pos_head.layers.1.weight", "decoder.enc_output.proj.weight",
    "decoder.enc_score_head.bias", "decoder.enc_bbox_head.layers.2.weight", "decoder.dec_score_head.2.weight",
    "decoder.dec_bbox_head.0.layers.1.bias", "decoder.denoising_class_embed.weight",
)


def _v1_spelling(key: str) -> str:
    """RT-DETR (v1)'s names of the encoder's input projections and the encoder output head: indices, not names."""
    for ours, theirs in ((".conv.", ".0."), (".norm.", ".1.")):
        if key.startswith("encoder.input_proj."):
            key = key.replace(ours, theirs)
    return key.replace("decoder.enc_output.proj.", "decoder.enc_output.0.").replace("decoder.enc_output.norm.",
                                                                                     "decoder.enc_output.1.")


@pytest.mark.parametrize("layout", ["ema", "model_v1"])
def test_the_authors_release_layouts_load_with_transformers_outputs(tmp_path, photos, layout):
    """``{"ema": {"module": ...}}`` (preferred to the "model" beside it: the averaged weights are the released
    ones; with RT-DETRv2's anchor and points-scale buffers) and ``{"model": ...}`` in RT-DETR v1's spelling.
    The weights cannot show the number of heads: the authors' 8, which the reader assumes."""
    hf = hf_model("resnet18", 80, seed=2, encoder_attention_heads=8, decoder_attention_heads=8)
    hf.save_pretrained(tmp_path / "hf")
    state = detr.load_checkpoint(tmp_path / "hf").state_dict()
    assert set(AUTHORS_KEYS) <= set(state)
    if layout == "ema":
        module = {**state, "decoder.anchors": torch.zeros(1, 336, 4), "decoder.valid_mask": torch.ones(1, 336, 1),
                  **{f"decoder.decoder.layers.{i}.cross_attn.num_points_scale": torch.full((12,), 0.25)
                     for i in range(3)}}
        checkpoint = {"ema": {"module": module, "updates": 1000},
                      "model": {key: torch.zeros_like(value) for key, value in state.items()}, "last_epoch": 71}
    else:
        checkpoint = {"model": {_v1_spelling(key): value for key, value in state.items()}}
    path = tmp_path / "rtdetr_r18vd_6x_coco.pth"
    torch.save(checkpoint, path)
    model = detr.load_checkpoint(path, num_queries=30)
    config = model.config
    assert (config.backbone, config.num_decoder_layers, config.hidden_dim, config.num_classes) == ("resnet18", 3, 64, 80)
    assert model.meta.category_map.category_ids[:3] == (1, 2, 3) and model.meta.category_map.names[0] == "person"
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)



@pytest.mark.parametrize("version, options", [(1, {}), (2, {"decoder_method": "discrete", "decoder_offset_scale": 0.7})])
def test_written_directories_load_in_transformers_with_the_same_outputs(tmp_path, photos, version, options):
    """Back out through ``save_huggingface`` (the family's writer): transformers' ``from_pretrained`` reads every
    weight the directory it wrote itself holds, and predicts what this project's model predicts."""
    hf = hf_model("resnet18", 6, version=version, seed=3, **options)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    # the data set's category ids and the validated threshold go out and come back (transformers keeps them)
    record = ModelMeta(category_map=CategoryMap(tuple(range(3, 9)), tuple(f"c{i}" for i in range(6))),
                       score_threshold=0.35)
    model.meta = record
    save_huggingface(model, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == ("rt_detr" if version == 1 else "rt_detr_v2")
    model_class = transformers.RTDetrForObjectDetection if version == 1 else transformers.RTDetrV2ForObjectDetection
    again = model_class.from_pretrained(tmp_path / "ours").eval()
    assert set(load_file(tmp_path / "ours" / "model.safetensors")) == set(
        load_file(tmp_path / "theirs" / "model.safetensors"))
    logits_diff, boxes_diff = differences(model, again, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)
    assert transformers.RTDetrImageProcessor.from_pretrained(tmp_path / "ours").size["height"] == 640
    again.save_pretrained(tmp_path / "resaved")
    for directory in ("ours", "resaved"):
        meta = detr.load_checkpoint(tmp_path / directory).meta
        assert (meta.category_map, meta.score_threshold) == (record.category_map, 0.35), directory



def test_detr_convert_turns_an_authors_file_into_a_transformers_directory(tmp_path, photos):
    """The conversion users want from the authors' release: their .pth → detr-convert → transformers, with
    the authors' 300 queries and 8 heads (which their files do not record) and COCO's category names."""
    from detr.commands import convert

    hf = hf_model("resnet18", 80, seed=4, num_queries=300, encoder_attention_heads=8, decoder_attention_heads=8)
    hf.save_pretrained(tmp_path / "hf")
    torch.save({"ema": {"module": detr.load_checkpoint(tmp_path / "hf").state_dict()}}, tmp_path / "authors.pth")
    assert convert.main([str(tmp_path / "authors.pth"), "--to-huggingface", str(tmp_path / "converted")]) == 0
    converted = transformers.RTDetrForObjectDetection.from_pretrained(tmp_path / "converted").eval()
    assert converted.config.id2label[0] == "person" and converted.config.num_queries == 300
    with torch.no_grad():
        ours, theirs = converted(pixel_values=photos), hf(pixel_values=photos)
    assert float((ours.logits - theirs.logits).abs().max()) <= TOLERANCE
    assert float((ours.pred_boxes - theirs.pred_boxes).abs().max()) <= TOLERANCE
