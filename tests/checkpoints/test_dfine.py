"""transformers' D-FINE directories in: the same logits and boxes as ``DFineForObjectDetection`` itself on the same
random weights and two real photos, for an N/S-like model (HGNetV2-B0 with learnable affine blocks, points
(3, 6, 3), or two levels as D-FINE N) and an L-like one (B4), COCO's 80 labels and a few, discrete sampling; back
out to transformers; the authors' release layout; what this project's D-FINE cannot reproduce is refused."""

from __future__ import annotations

import json

import pytest
import torch

import detr
from detr.categories import CategoryMap
from detr.checkpoints import CheckpointError, ExportError, save_huggingface
from detr.models.config import ModelMeta
from tests.helpers_dfine import hf_model
from tests.helpers_rtdetr import square_photos

transformers = pytest.importorskip("transformers")
load_file = pytest.importorskip("safetensors.torch").load_file

TOLERANCE = 1e-4
SIDE = 128  # a multiple of 32, small enough for a fast test
N_S = {"decoder_n_points": [3, 6, 3], "hidden_expansion": 0.5, "depth_mult": 0.34}


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
    ("hgnetv2_b0", 80, 3, True, N_S),
    ("hgnetv2_b0", 3, 2, True, {"decoder_n_points": 6, "hidden_expansion": 0.34, "depth_mult": 0.5}),
    ("hgnetv2_b4", 80, 3, False, {"decoder_n_points": [3, 6, 3]}),
    ("hgnetv2_b0", 4, 3, False, {"decoder_n_points": [3, 6, 3], "decoder_method": "discrete"}),
])
def test_transformers_directory_loads_with_the_same_outputs(tmp_path, photos, backbone, num_labels, levels,
                                                            learnable_affine, options):
    hf = hf_model(backbone, num_labels, levels=levels, learnable_affine=learnable_affine, **options)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    config = model.config
    assert (config.family, config.backbone, config.num_classes) == ("dfine", backbone, num_labels)
    assert (config.num_feature_levels, config.backbone_learnable_affine) == (levels, learnable_affine)
    assert (config.num_decoder_layers, config.num_queries, config.hidden_dim) == (3, 30, 64)
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    assert model.stride == (8 if levels == 3 else 16)
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_written_directories_load_in_transformers_with_the_same_outputs(tmp_path, photos):
    """Back out through ``save_huggingface`` (the family's writer): transformers' ``from_pretrained`` reads every
    weight the directory it wrote itself holds, and predicts what this project's model predicts."""
    hf = hf_model("hgnetv2_b0", 6, seed=3, **N_S)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    # the data set's category ids and the validated threshold go out and come back (transformers keeps them)
    record = ModelMeta(category_map=CategoryMap(tuple(range(3, 9)), tuple(f"c{i}" for i in range(6))),
                       score_threshold=0.35)
    model.meta = record
    save_huggingface(model, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "d_fine"
    again = transformers.DFineForObjectDetection.from_pretrained(tmp_path / "ours").eval()
    assert set(load_file(tmp_path / "ours" / "model.safetensors")) == set(
        load_file(tmp_path / "theirs" / "model.safetensors"))
    logits_diff, boxes_diff = differences(model, again, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)
    assert transformers.RTDetrImageProcessor.from_pretrained(tmp_path / "ours").size["height"] == 640
    again.save_pretrained(tmp_path / "resaved")
    for directory in ("ours", "resaved"):
        meta = detr.load_checkpoint(tmp_path / directory).meta
        assert (meta.category_map, meta.score_threshold) == (record.category_map, 0.35), directory


def test_the_authors_release_layout_loads_with_transformers_outputs(tmp_path, photos):
    """``{"ema": {"module": ...}}`` of Peterande/D-FINE: this project's keys plus the buffers it recomputes (the
    anchors, the points scale, the transformer's copies of up and reg_scale); the configuration, points per level
    and the encoder's expansion and depth included, comes from the weights."""
    hf = hf_model("hgnetv2_b0", 80, seed=2, encoder_attention_heads=8, decoder_attention_heads=8, **N_S)
    hf.save_pretrained(tmp_path / "hf")
    loaded = detr.load_checkpoint(tmp_path / "hf")
    state = loaded.state_dict()
    module = {**state, "decoder.anchors": torch.zeros(1, 336, 4), "decoder.valid_mask": torch.ones(1, 336, 1),
              "decoder.up": state["decoder.decoder.up"], "decoder.reg_scale": state["decoder.decoder.reg_scale"],
              **{f"decoder.decoder.layers.{i}.cross_attn.num_points_scale":
                 torch.tensor([1 / n for n in (3, 6, 3) for _ in range(n)]) for i in range(3)}}
    path = tmp_path / "dfine_hgnetv2_s_coco.pth"
    torch.save({"ema": {"module": module, "updates": 1000},
                "model": {key: torch.zeros_like(value) for key, value in state.items()}}, path)
    model = detr.load_checkpoint(path, num_queries=30)
    assert model.config == loaded.config.replace(num_heads=8, csp_expansion=model.config.csp_expansion,
                                                 csp_depth_multiplier=model.config.csp_depth_multiplier)
    assert model.config.decoder.num_points_per_level == (3, 6, 3)
    assert model.meta.category_map.names[0] == "person"
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_a_silu_decoder_loads_with_the_same_outputs_and_goes_back_out(tmp_path, photos):
    """``decoder_activation_function="silu"`` (transformers' SiLU in the decoder layers' feed-forward networks, as
    DEIM's): read as ``decoder_activation="silu"`` with transformers' outputs (ReLU there would not give them),
    and written back with it."""
    hf = hf_model("hgnetv2_b0", 5, seed=5, decoder_activation_function="silu", **N_S)
    hf.save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs")
    assert (model.config.decoder.activation, model.config.decoder.mlp_activation) == ("silu", "relu")
    logits_diff, boxes_diff = differences(model, hf, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)
    relu = detr.load_checkpoint(tmp_path / "theirs", decoder={"activation": "relu"})
    assert max(differences(relu, hf, photos)) > 100 * TOLERANCE  # the activation is what made them agree
    save_huggingface(model, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["decoder_activation_function"] == "silu"
    again = transformers.DFineForObjectDetection.from_pretrained(tmp_path / "ours").eval()
    logits_diff, boxes_diff = differences(model, again, photos)
    assert logits_diff <= TOLERANCE and boxes_diff <= TOLERANCE, (logits_diff, boxes_diff)


def test_silu_heads_are_not_written_as_transformers_relu_heads(tmp_path):
    """DEIM's SiLU MLP heads (``decoder_mlp_activation``) have no transformers setting: the writer refuses them."""
    hf_model("hgnetv2_b0", 3, **N_S).save_pretrained(tmp_path / "theirs")
    model = detr.load_checkpoint(tmp_path / "theirs", decoder={"activation": "silu", "mlp_activation": "silu"})
    with pytest.raises(ExportError, match=r"decoder\.mlp_activation"):
        save_huggingface(model, tmp_path / "ours")


@pytest.mark.parametrize("change, message", [
    ({"eval_idx": 1}, "eval_idx"),
    ({"learn_initial_query": True}, "learn_initial_query"),
    ({"decoder_activation_function": "gelu"}, "decoder_activation_function"),
    ({"backbone_config": {"model_type": "hgnet_v2", "stem_channels": [3, 8, 8]}}, "none of the sizes"),
])
def test_settings_this_model_cannot_reproduce_are_refused(tmp_path, change, message):
    hf_model("hgnetv2_b0", 3, **N_S).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message) as raised:
        detr.load_checkpoint(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value) and "\n" not in str(raised.value)


def test_detr_convert_turns_an_authors_file_into_a_transformers_directory(tmp_path):
    """The authors' .pth → detr-convert → transformers, with their 300 queries and 8 heads (which their files do
    not record) and COCO's category names."""
    from detr.commands import convert

    hf = hf_model("hgnetv2_b0", 80, seed=4, num_queries=300, encoder_attention_heads=8, decoder_attention_heads=8,
                  **N_S)
    hf.save_pretrained(tmp_path / "hf")
    state = detr.load_checkpoint(tmp_path / "hf").state_dict()
    torch.save({"ema": {"module": {**state, **{f"decoder.decoder.layers.{i}.cross_attn.num_points_scale":
                                               torch.tensor([1 / n for n in (3, 6, 3) for _ in range(n)])
                                               for i in range(3)}}}}, tmp_path / "authors.pth")
    assert convert.main([str(tmp_path / "authors.pth"), "--to-huggingface", str(tmp_path / "converted")]) == 0
    converted = transformers.DFineForObjectDetection.from_pretrained(tmp_path / "converted").eval()
    assert converted.config.id2label[0] == "person"
    images = square_photos(160)[:1]  # 525 cells for the 300 queries
    with torch.no_grad():
        assert torch.allclose(converted(pixel_values=images).logits, hf(pixel_values=images).logits, atol=TOLERANCE)
