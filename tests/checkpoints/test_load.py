"""Loading released-layout, plain, Lightning and hostile checkpoint files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from detr import CategoryMap, build_detr, load_checkpoint
from detr.checkpoints import CheckpointError, infer_model_config, save_checkpoint
from detr.checkpoints.formats import INFERRED_FIELDS
from detr.models.config import ModelMeta
from detr.models.segmentation import DETRPanoptic, build_detr_panoptic
from tests.helpers import tiny_config_with

LAYOUT = json.loads((Path(__file__).resolve().parents[1] / "data" / "official_detr_state_dict_layout.json").read_text())


def official_state_dict(backbone: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values in exactly the authors' key layout and shapes (as in their release files)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in LAYOUT[backbone].items():
        value = torch.randn(shape, generator=generator) * 0.02
        if key.endswith("running_var"):
            value = value.abs() + 1.0
        state[key] = value
    return state


@pytest.mark.parametrize("backbone", ["resnet18", "resnet50"])
def test_release_file_loads_exact_weights_and_runs(tmp_path, backbone):
    state = official_state_dict(backbone)
    path = tmp_path / f"detr-{backbone}-e632da11.pth"
    torch.save({"model": state, "args": {"lr": 1e-4}, "epoch": 499}, path)
    model = load_checkpoint(path)
    assert not model.training
    assert model.config.backbone == backbone and model.config.num_classes == 91 and not model.config.dilation
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert model.meta.category_map == CategoryMap.coco() and model.meta.category_map.names[17] == "cat"
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool))
    assert out.logits.shape == (1, 100, 92)


def test_dc5_follows_the_file_name_or_override(tmp_path):
    config = infer_model_config(official_state_dict("resnet50"), "detr-r50-dc5-f0fb7ef5.pth")
    assert config.dilation is True and config.backbone == "resnet50"
    path = tmp_path / "renamed.pth"
    torch.save(official_state_dict("resnet18"), path)  # a plain state dict
    assert load_checkpoint(path, num_encoder_layers=6).config.dilation is False


def test_r101_layout_is_recognised():
    config = infer_model_config({k: torch.empty(v) for k, v in LAYOUT["resnet101"].items()}, "detr-r101.pth")
    assert config.backbone == "resnet101" and config.num_queries == 100 and config.dim_feedforward == 2048


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-checkpoint",))


@pytest.mark.parametrize("zip_format", [True, False])
def test_malicious_pickle_is_refused(tmp_path, monkeypatch, zip_format):
    """K3: the refusal quoted torch's advice to retry with weights_only=False (for a file that carries code,
    that is the attack) and the training command called the file truncated: it says the file carries code."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pth"
    torch.save({"model": Exploit()}, path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(CheckpointError, match="refused") as error:
        load_checkpoint(path)
    message = str(error.value)
    assert f"refused to load {path}: it carries code (a call of {os.system.__module__}.system)" in message
    assert "weights_only=False" not in message and "truncated" not in message and "\n" not in message
    assert not (tmp_path / "pwned-by-checkpoint").exists()


class TrainingScriptRecord:
    """An object of a training script's own class, pickled beside the weights."""


def test_an_unknown_python_object_beside_the_weights_is_named(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save({"model": official_state_dict("resnet18"), "record": TrainingScriptRecord()}, path)
    with pytest.raises(CheckpointError, match=r"holds a Python object \(.*TrainingScriptRecord\)") as error:
        load_checkpoint(path)
    assert "carries code" not in str(error.value)


def test_wrong_layout_names_missing_and_unexpected_keys(tmp_path):
    state = official_state_dict("resnet18")
    state["extra_head.weight"] = torch.zeros(3)
    del state["transformer.decoder.norm.weight"]
    path = tmp_path / "other.pth"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert "transformer.decoder.norm.weight" in str(error.value) and "extra_head.weight" in str(error.value)


def test_not_a_detr_file(tmp_path):
    path = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError, match="not a DETR checkpoint") as error:
        load_checkpoint(path)
    assert "resnet.pth" in str(error.value) and "class_embed.weight" in str(error.value)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pth")


def test_lightning_checkpoint_with_config_and_categories(tmp_path, tiny_config):
    model = build_detr(tiny_config, backbone_norm="group_norm")
    categories = CategoryMap((3, 7, 9, 11, 12), ("a", "b", "c", "d", "e"))
    checkpoint = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                  "detr": {"model_config": model.config.to_dict(), "category_map": categories.to_dict()},
                  "epoch": 3}
    path = tmp_path / "last.ckpt"
    torch.save(checkpoint, path)
    loaded = load_checkpoint(path)
    assert loaded.meta.category_map == categories and loaded.config.backbone_norm == "group_norm"
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("file_name", ["model.ckpt", "model.pth"])
def test_meta_survives_save_and_load(tmp_path, tiny_config, file_name):
    model = build_detr(tiny_config)
    meta = ModelMeta(category_map=CategoryMap((3, 7, 9, 11, 12), ("a", "b", "c", "d", "e")), eval_size=(160, 240),
                     score_threshold=0.42)
    model.meta = meta
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / file_name))
    assert loaded.meta == meta and loaded.config == model.config
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_panoptic_meta_survives_save_and_load(tmp_path):
    model = build_detr_panoptic(tiny_config_with(hidden_dim=128, num_heads=8))
    meta = ModelMeta(category_map=CategoryMap((1, 2, 3, 4, 5), ("a", "b", "c", "d", "sky")), eval_size=(96, 160),
                     is_thing=(True, True, True, True, False), panoptic_threshold=0.3, panoptic_overlap_threshold=0.8)
    model.meta = meta
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "panoptic.ckpt"))
    assert isinstance(loaded, DETRPanoptic) and loaded.meta == meta
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_model_meta_dict_round_trip_and_checks():
    meta = ModelMeta(category_map=CategoryMap((4, 9), ("cat", "dog")), eval_size=[320, 512], is_thing=[True, False],
                     panoptic_threshold=0.5)
    assert meta.eval_size == (320, 512) and meta.is_thing == (True, False)  # lists become tuples
    assert ModelMeta.from_dict(meta.to_dict()) == meta
    assert ModelMeta.from_dict({"model_config": {}, "category_map": None}) == ModelMeta()
    assert meta.replace(panoptic_threshold=None).to_dict()["panoptic_postprocess"] is None
    with pytest.raises(ValueError, match="is_thing has 3 entries"):
        meta.replace(is_thing=(True, True, False))


def test_category_map_round_trip_and_coco_gaps():
    coco = CategoryMap.coco()
    assert coco.num_classes == 91 and coco.names[12] == "N/A" and coco.label_to_category_id(90) == 90
    contiguous = CategoryMap.from_coco_categories([{"id": 5, "name": "x"}, {"id": 2, "name": "y"}], contiguous=True)
    assert contiguous.names == ("y", "x") and contiguous.category_id_to_label(5) == 1
    assert CategoryMap.from_dict(json.loads(json.dumps(contiguous.to_dict()))) == contiguous
    assert contiguous.label_to_category_id(torch.tensor([1, 0])).tolist() == [5, 2]


DEMO_SIZES = tiny_config_with(backbone_last_stage="layer3", backbone_norm="batch_norm", num_queries=6, num_classes=4)


@pytest.mark.parametrize("options, overrides", [
    ({"query_type": "anchor"}, {}),
    ({"class_head": "sigmoid", "trained": True}, {"class_head": "sigmoid"}),  # ambiguous shape: override
    ({"query_type": "anchor", "denoising": True}, {}),
    ({"dense_aux_head": True}, {}),
    ({"query_type": "anchor", "query_groups": 3}, {"query_groups": 3}),
    ({"query_type": "anchor", "anchor_local_attention": 0.5}, {}),
    ({"query_type": "anchor", "class_head": "sigmoid", "denoising": True, "dense_aux_head": True, "trained": True},
     {}),  # the demo's combination; the denoising and dense heads' class count shows the sigmoid head
    ({"backbone_last_stage": "layer2", "query_type": "anchor", "class_head": "sigmoid", "denoising": True,
      "dense_aux_head": True, "trained": True}, {}),  # the demo's model as it is: cut after layer2, no layer3
], ids=["anchor", "sigmoid", "denoising", "dense-aux-head", "query-groups", "local-attention",
        "demo", "demo-cut-after-layer2"])
def test_bare_state_dict_of_each_option_loads_with_equal_outputs(tmp_path, options, overrides):
    options = dict(options)
    trained = options.pop("trained", False)
    torch.manual_seed(0)
    model = build_detr(DEMO_SIZES, **options).eval()
    if trained:  # training moves the class bias off its init
        with torch.no_grad():
            model.class_embed.bias.add_(torch.randn_like(model.class_embed.bias))
    path = tmp_path / "bare.pth"
    torch.save(model.state_dict(), path)
    loaded = load_checkpoint(path, num_heads=2, **overrides)  # the number of heads is never visible
    assert ({key: getattr(loaded.config, key) for key in INFERRED_FIELDS}
            == {key: getattr(model.config, key) for key in INFERRED_FIELDS})
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    mask[1, :, 40:] = True
    with torch.no_grad():
        expected, got = model(images, mask), loaded(images, mask)
    assert torch.equal(got.logits, expected.logits)
    assert torch.equal(got.boxes, expected.boxes)


def test_hidden_options_fall_back_to_the_authors_defaults():
    torch.manual_seed(0)
    sigmoid = build_detr(DEMO_SIZES, class_head="sigmoid")
    with torch.no_grad():
        sigmoid.class_embed.bias.add_(1.0)
    config = infer_model_config(sigmoid.state_dict())
    assert config.class_head == "softmax" and config.num_classes == 3  # 4 logits read as 3 + no object
    grouped = build_detr(DEMO_SIZES, query_type="anchor", query_groups=3).state_dict()
    config = infer_model_config(grouped)
    assert config.num_queries == 18 and config.query_groups == 1
    with pytest.raises(CheckpointError, match="query_groups=4"):
        infer_model_config(grouped, query_groups=4)


def _without_layers(state: dict[str, torch.Tensor], stack: str, *indices: int) -> dict[str, torch.Tensor]:
    prefixes = tuple(f"transformer.{stack}.layers.{index}." for index in indices)
    return {key: value for key, value in state.items() if not key.startswith(prefixes)}


def test_a_plain_state_dict_with_other_layer_counts_warns_and_a_stated_count_must_agree(tmp_path, caplog):
    """A plain state dict records no config: a file cut after its first decoder layer looks like a 1-layer
    model. The inferred counts are named when they are not the paper's 6/6, and a stated count is checked."""
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(num_encoder_layers=1, num_decoder_layers=2))
    path = tmp_path / "cut.pth"
    torch.save(_without_layers(model.state_dict(), "decoder", 1), path)
    with caplog.at_level("WARNING", logger="detr.checkpoints"):
        loaded = load_checkpoint(path, num_heads=2)
    assert len(loaded.transformer.decoder.layers) == 1
    assert "cut.pth" in caplog.text and "1 encoder and 1 decoder layer" in caplog.text
    assert "num_encoder_layers=1, num_decoder_layers=1" in caplog.text
    with pytest.raises(CheckpointError, match=r"cut\.pth has weights for 1 decoder layer.*num_decoder_layers=2"):
        load_checkpoint(path, num_heads=2, num_decoder_layers=2)
    caplog.clear()
    with caplog.at_level("WARNING", logger="detr.checkpoints"):
        load_checkpoint(path, num_heads=2, num_encoder_layers=1, num_decoder_layers=1)
    assert "decoder layer" not in caplog.text  # stated and in agreement: nothing to warn about


def test_layer_numbers_with_a_gap_are_refused(tmp_path):
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(num_decoder_layers=4))
    path = tmp_path / "gap.pth"
    torch.save(_without_layers(model.state_dict(), "decoder", 2), path)
    with pytest.raises(CheckpointError, match=r"gap\.pth.*transformer\.decoder\.layers\. numbered \[0, 1, 3\]"):
        load_checkpoint(path, num_heads=2)
