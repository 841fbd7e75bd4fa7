"""Hugging Face transformers DETR directories in and out: same outputs as transformers on a padded batch of
two real photos, for timm and transformers ResNet backbones, DC5, learned positions and several label counts."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import detr
from detr import build_detr
from detr.checkpoints import CheckpointError
from detr.checkpoints.formats import ExportError
from detr.checkpoints.huggingface import save_pretrained, to_huggingface_state_dict
from detr.data.collate import pad_images
from detr.models.config import ModelMeta
from tests.helpers import detr_outputs, huggingface_outputs, randomise, tiny_config_with

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ROOT / "data" / "photos"
TOLERANCE = 1e-4
TINY_TRANSFORMER = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10, dropout=0.0)
RESNET_SPECS = {"resnet18": ("basic", [2, 2, 2, 2], [64, 128, 256, 512]),
                "resnet50": ("bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048])}


@pytest.fixture(scope="module")
def photo_batch():
    """Two photos of different sizes, ImageNet-normalised, zero-padded bottom/right; mask True on padding."""
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    tensors = []
    for name, size in (("chelsea.png", (144, 96)), ("astronaut.png", (112, 128))):  # (width, height)
        image = Image.open(PHOTOS / name).convert("RGB").resize(size, Image.BILINEAR)
        tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255
        tensors.append((tensor - mean) / std)
    images, padding_mask = pad_images(tensors)
    assert padding_mask[0].any() and padding_mask[1].any()  # each image is padded on one side
    return images, padding_mask


def _hf_model(num_labels: int, backbone: str = "resnet18", *, timm: bool = True, dilation: bool = False,
              position: str = "sine", seed: int = 0):
    common = dict(TINY_TRANSFORMER, num_labels=num_labels, position_embedding_type=position,
                  id2label={i: f"thing {i}" for i in range(num_labels)})
    if timm:
        config = transformers.DetrConfig(backbone=backbone, use_timm_backbone=True, use_pretrained_backbone=False,
                                         dilation=dilation, **common)
    else:
        layer_type, depths, widths = RESNET_SPECS[backbone]
        resnet = transformers.ResNetConfig(layer_type=layer_type, depths=depths, hidden_sizes=widths,
                                           out_features=["stage4"])
        config = transformers.DetrConfig(backbone_config=resnet, use_timm_backbone=False, **common)
    model = transformers.DetrForObjectDetection(config).eval()
    randomise(model, seed)
    return model


def _assert_same(ours, theirs):
    (logits, boxes), (hf_logits, hf_boxes) = ours, theirs
    assert logits.shape == hf_logits.shape and boxes.shape == hf_boxes.shape
    assert boxes[0].std(dim=0).max() > 1e-3  # queries differ: the comparison is not between constants
    assert (logits - hf_logits).abs().max() <= TOLERANCE
    assert (boxes - hf_boxes).abs().max() <= TOLERANCE


@pytest.mark.parametrize("backbone, timm, dilation, position, num_labels", [
    ("resnet18", True, False, "sine", 5),
    ("resnet18", False, False, "sine", 3),
    ("resnet18", True, False, "learned", 1),
    ("resnet50", True, True, "sine", 91),
    ("resnet50", False, False, "sine", 20),
])
def test_transformers_directory_loads_with_the_same_outputs(tmp_path, photo_batch, backbone, timm, dilation,
                                                            position, num_labels):
    from safetensors.torch import load_file

    hf = _hf_model(num_labels, backbone, timm=timm, dilation=dilation, position=position)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    assert model.config.backbone == backbone and model.config.dilation == dilation
    assert model.config.position_encoding == position and model.num_classes == num_labels
    assert model.meta.category_map.names == tuple(f"thing {i}" for i in range(num_labels))
    _assert_same(detr_outputs(model, *photo_batch), huggingface_outputs(hf, *photo_batch))
    # and the names back: exactly the tensors transformers wrote
    on_disk = load_file(str(tmp_path / "model.safetensors"))
    backbone_format = "timm" if timm else "transformers"
    exported = to_huggingface_state_dict(model.state_dict(), backbone_format)
    assert exported.keys() == on_disk.keys()
    assert all(torch.equal(exported[k], v) for k, v in on_disk.items())
    # and the whole directory back, config included: transformers builds the same model from it
    save_pretrained(model, tmp_path / "again", backbone_format=backbone_format)
    again = transformers.DetrForObjectDetection.from_pretrained(tmp_path / "again").eval()
    assert again.config.dilation == dilation and again.config.id2label == hf.config.id2label
    _assert_same(huggingface_outputs(again, *photo_batch), huggingface_outputs(hf, *photo_batch))


@pytest.mark.parametrize("backbone, dilation", [("resnet50", False), ("resnet101", False), ("resnet50", True),
                                               ("resnet101", True)], ids=["R50", "R101", "R50-DC5", "R101-DC5"])
def test_the_papers_backbones_give_transformers_outputs_to_float_rounding(tmp_path, photo_batch, backbone, dilation):
    """The released models' backbones (R50, R101, their DC5), loaded through load_checkpoint, give transformers'
    logits and boxes to 1e-5: the CPU training paths (NHWC frozen stages, folded norms) stay out of inference,
    whose convolutions must round as the reference's do."""
    hf = _hf_model(91, backbone, dilation=dilation)
    hf.save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    assert model.config.backbone == backbone and model.config.dilation == dilation
    (logits, boxes), (hf_logits, hf_boxes) = detr_outputs(model, *photo_batch), huggingface_outputs(hf, *photo_batch)
    assert boxes[0].std(dim=0).max() > 1e-3 and logits.abs().max() > 0.1  # not constants
    assert (logits - hf_logits).abs().max() <= 1e-5
    assert (boxes - hf_boxes).abs().max() <= 1e-5


def test_in_memory_key_names_bin_file_and_processor_size(tmp_path, photo_batch):
    """transformers 5 renames keys in memory (backbone.model, o_proj, mlp.fc1); a state dict saved from memory
    as pytorch_model.bin reads too, and preprocessor_config.json gives the eval resize."""
    hf = _hf_model(4, seed=1)
    hf.config.save_pretrained(tmp_path)
    state = hf.state_dict()
    assert any(".o_proj." in key for key in state) and any(".mlp.fc1." in key for key in state)
    torch.save(state, tmp_path / "pytorch_model.bin")
    transformers.DetrImageProcessor(size={"shortest_edge": 512, "longest_edge": 853}).save_pretrained(tmp_path)
    model = detr.load_checkpoint(tmp_path)
    assert model.meta.eval_size == (512, 853)
    _assert_same(detr_outputs(model, *photo_batch), huggingface_outputs(hf, *photo_batch))


def _our_model(seed: int = 0, **config):
    torch.manual_seed(seed)
    model = build_detr(tiny_config_with(dropout=0.0), **config).eval()
    randomise(model, seed)
    return model


@pytest.mark.parametrize("backbone_format, config", [
    ("timm", dict()),
    ("transformers", dict(num_classes=2)),
    ("timm", dict(position_encoding="learned", num_classes=7)),
])
def test_saved_directory_loads_in_transformers_with_the_same_outputs(tmp_path, photo_batch, backbone_format, config):
    model = _our_model(**config)
    model.meta = ModelMeta(category_map=detr.CategoryMap(tuple(range(model.num_classes)),
                                                         tuple(f"kind {i}" for i in range(model.num_classes))))
    save_pretrained(model, tmp_path, backbone_format=backbone_format)
    hf, info = transformers.DetrForObjectDetection.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert hf.config.id2label[model.num_classes - 1] == f"kind {model.num_classes - 1}"
    _assert_same(detr_outputs(model, *photo_batch), huggingface_outputs(hf.eval(), *photo_batch))
    again = detr.load_checkpoint(tmp_path)  # and back: the same weights
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())
    assert again.meta.category_map == model.meta.category_map and again.meta.eval_size == (800, 1333)


@pytest.mark.parametrize("config, backbone_format, reason", [
    (dict(query_type="anchor"), "timm", "query_type='anchor'"),
    (dict(class_head="sigmoid"), "timm", "class_head='sigmoid'"),
    (dict(pre_norm=True), "timm", "pre_norm"),
    (dict(backbone_norm="group_norm"), "timm", "group norm"),
    (dict(backbone_last_stage="layer3"), "timm", "layer4"),
    (dict(backbone="resnet50", dilation=True), "transformers", "no dilation"),
])
def test_models_without_a_transformers_equivalent_are_refused(tmp_path, config, backbone_format, reason):
    model = build_detr(tiny_config_with(num_decoder_layers=1), **config)
    with pytest.raises(ExportError, match=reason):
        save_pretrained(model, tmp_path / "out", backbone_format=backbone_format)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_folded_batch_norm_is_refused(tmp_path):
    model = _our_model().optimize_for_inference()
    with pytest.raises(ExportError, match="folded"):
        save_pretrained(model, tmp_path)


# deformable_detr, rt_detr, d_fine, deimv2, rf_detr and lw_detr read: their own tests
@pytest.mark.parametrize("model_type", ["yolos", "conditional_detr"])
def test_other_model_types_are_named_in_the_error(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(CheckpointError, match=f"model_type '{model_type}'"):
        detr.load_checkpoint(tmp_path)


def test_a_directory_without_config_or_weights_is_explained(tmp_path):
    with pytest.raises(CheckpointError, match="without config.json"):
        detr.load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "detr", "architectures": ["DetrForSegmentation"]}))
    with pytest.raises(CheckpointError, match="DetrForSegmentation"):
        detr.load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "detr", "backbone": "resnet18"}))
    with pytest.raises(CheckpointError, match="no weights"):
        detr.load_checkpoint(tmp_path)


def test_predictor_names_labels_from_id2label(tmp_path):
    hf = _hf_model(3, seed=2)
    hf.save_pretrained(tmp_path)
    predictor = detr.Predictor.from_checkpoint(tmp_path, device="cpu", min_size=96, max_size=160)
    (prediction,) = predictor.predict(PHOTOS / "chelsea.png", all_queries=True)
    assert len(prediction) == 10 and set(prediction.label_names) <= {"thing 0", "thing 1", "thing 2"}


def test_convert_tool_writes_a_directory(tmp_path, photo_batch, capsys):
    model = _our_model(seed=3, num_heads=8, num_classes=91)  # a file in the authors' format: 8 heads
    torch.save({"model": model.state_dict()}, tmp_path / "tiny.pth")
    spec = importlib.util.spec_from_file_location("tool_convert", ROOT / "tools" / "convert.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(tmp_path / "tiny.pth"), "--to-huggingface", str(tmp_path / "hf")]) == 0
    hf = transformers.DetrForObjectDetection.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.id2label[17] == "cat"  # a 91-class file without a map is COCO's
    _assert_same(detr_outputs(model, *photo_batch), huggingface_outputs(hf, *photo_batch))

    torch.save({"model": _our_model(query_type="anchor").state_dict()}, tmp_path / "anchor.pth")
    assert tool.main([str(tmp_path / "anchor.pth"), "--to-huggingface", str(tmp_path / "no")]) == 1
    assert "query_type='anchor'" in capsys.readouterr().err


def test_the_data_sets_category_ids_survive_the_round_trip(tmp_path):
    """transformers numbers labels 0..K-1: a model trained on category ids 3, 7, 9 predicted 0, 1, 2 once
    converted (and its predictions json named categories the data set does not have)."""
    from detr.categories import CategoryMap
    from detr.inference.outputs import predictions_to_coco_results

    model = _our_model(num_classes=3)
    category_map = CategoryMap((3, 7, 9), ("circle", "square", "triangle"))
    model.meta = ModelMeta(category_map=category_map, score_threshold=0.35)  # and the validated threshold
    save_pretrained(model, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["category_ids"] == [3, 7, 9]
    # transformers keeps the field through its own save_pretrained (a user's fine-tune, the hub)
    hf = transformers.DetrForObjectDetection.from_pretrained(tmp_path / "ours")
    assert hf.config.id2label == {0: "circle", 1: "square", 2: "triangle"}
    hf.save_pretrained(tmp_path / "theirs")
    for directory in ("ours", "theirs"):
        meta = detr.load_checkpoint(tmp_path / directory).meta
        assert meta.category_map == category_map and meta.score_threshold == 0.35, directory

    predictor = detr.Predictor.from_checkpoint(tmp_path / "theirs", device="cpu", min_size=96, max_size=160)
    assert predictor.threshold == 0.35
    (prediction,) = predictor.predict(PHOTOS / "chelsea.png", all_queries=True)
    prediction.image_id = 1
    results = predictions_to_coco_results([prediction], category_map=predictor.category_map)  # as detr-predict
    written = {result["category_id"] for result in results}
    assert written and written <= {3, 7, 9}


@pytest.mark.parametrize("threshold", [1.5, 0, "0.3", True])
def test_a_score_threshold_outside_zero_to_one_is_refused(tmp_path, threshold):
    save_pretrained(_our_model(num_classes=3), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["score_threshold"] = threshold
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: score_threshold must be a number between 0 and 1"):
        detr.load_checkpoint(tmp_path)


@pytest.mark.parametrize("category_ids", [[1, 2], [1, 1, 2], ["1", "2", "3"], "1,2,3"])
def test_category_ids_that_do_not_fit_the_labels_are_refused(tmp_path, category_ids):
    save_pretrained(_our_model(num_classes=3), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["category_ids"] = category_ids
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: category_ids must list one distinct integer"):
        detr.load_checkpoint(tmp_path)


def test_saved_files_get_the_usual_mode(tmp_path):
    """safetensors writes its file 0600 (a private temporary file renamed); a model directory is for sharing."""
    save_pretrained(_our_model(), tmp_path)
    expected = 0o666 & ~_umask()
    for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == expected, name


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("cut", ["truncated", "empty", "text"])
def test_a_corrupt_safetensors_file_is_named(tmp_path, cut):
    save_pretrained(_our_model(), tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "text": b"not a safetensors file"}[cut])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(save_pretrained|download)"):
        detr.load_checkpoint(tmp_path)


def test_id2label_beyond_the_class_count_is_refused(tmp_path):
    model = _our_model(num_classes=3)
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "cat", "1": "dog", "5": "fish", "7": "bird"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json.*id2label.*\[5, 7\].*3 classes"):
        detr.load_checkpoint(tmp_path)


def test_id2label_gaps_are_named_in_a_warning(tmp_path, caplog):
    model = _our_model(num_classes=3)
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "cat", "2": "fish"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="detr.checkpoints.huggingface"):
        loaded = detr.load_checkpoint(tmp_path)
    assert loaded.meta.category_map.names == ("cat", "LABEL_1", "fish")
    assert "config.json" in caplog.text and "[1]" in caplog.text


def test_weights_with_fewer_layers_than_config_json_states_are_refused(tmp_path):
    save_pretrained(_our_model(), tmp_path)  # 2 decoder layers
    safetensors_torch = pytest.importorskip("safetensors.torch")
    weights = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    cut = {key: value for key, value in weights.items() if not key.startswith("model.decoder.layers.1.")}
    safetensors_torch.save_file(cut, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"config\.json states decoder_layers=2 but .* hold 1 decoder layer"):
        detr.load_checkpoint(tmp_path)


def test_a_directory_without_its_preprocessor_config_says_which_size_it_predicts_at(tmp_path, caplog):
    """Without preprocessor_config.json the resize fell back to 800 / 1333 without a word (a model trained at
    128 px then predicted at 800)."""
    model = _our_model()
    model.meta = ModelMeta(eval_size=(128, 160))
    save_pretrained(model, tmp_path)
    with caplog.at_level("WARNING", logger="detr.checkpoints.huggingface"):
        assert detr.load_checkpoint(tmp_path).meta.eval_size == (128, 160)
    assert "preprocessor_config" not in caplog.text
    (tmp_path / "preprocessor_config.json").unlink()
    with caplog.at_level("WARNING", logger="detr.checkpoints.huggingface"):
        assert detr.load_checkpoint(tmp_path).meta.eval_size is None
    assert f"{tmp_path} has no preprocessor_config.json" in caplog.text
    assert "shortest side 800 px, longest at most 1333" in caplog.text and "--min-size" in caplog.text


def test_a_block_flag_transformers_ignores_is_accepted_and_one_it_reads_is_refused(tmp_path):
    # transformers' ResNet reads downsample_in_bottleneck in bottleneck blocks only (as RTDetrResNet)
    save_pretrained(_our_model(), tmp_path, backbone_format="transformers")  # ResNet-18: basic blocks
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["backbone_config"]["downsample_in_bottleneck"] = True
    path.write_text(json.dumps(config))
    assert detr.load_checkpoint(tmp_path).config.backbone == "resnet18"
    config["backbone_config"].update(layer_type="bottleneck", depths=[3, 4, 6, 3])
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="downsample_in_bottleneck"):
        detr.load_checkpoint(tmp_path)
