"""What every family's transformers reader checks alike (detr.checkpoints' readers by model_type): a config.json
that disagrees with its weights is named in one line, a folder without preprocessor_config.json says which size
it runs at, and a model_type no reader reads lists those that are read."""

from __future__ import annotations

import json
import logging

import pytest

import detr
from detr import build_detr
from detr.checkpoints import HUGGINGFACE_READERS, CheckpointError, load_checkpoint, save_huggingface
from tests.helpers import TINY
from tests.helpers_realtime import CONFIGS, tiny_model

pytest.importorskip("safetensors")

FAMILIES = list(CONFIGS)
#: the side each family's folder runs at without preprocessor_config.json
DEFAULT_SIDES = {"rtdetr": 640, "dfine": 640, "deimv2": 640, "rfdetr": 560}


def _folder(tmp_path, family: str):
    model = build_detr(TINY.replace(pretrained_backbone=False)) if family == "detr" else tiny_model(family)
    return save_huggingface(model, tmp_path / family)


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("family, key, value", [
    *((family, key, value) for family in FAMILIES
      for key, value in (("d_model", 64), ("decoder_ffn_dim", 40), ("decoder_layers", 3))),
    ("detr", "d_model", 64), ("detr", "num_queries", 7),
])
def test_a_config_json_that_disagrees_with_its_weights_is_named_in_one_line(tmp_path, family, key, value):
    folder = _folder(tmp_path, family)
    _edit_config(folder, **{key: value})
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    message = str(error.value)
    assert "\n" not in message and len(message) < 600, message
    assert "config.json does not fit the weights" in message and f"{key} " in message, message


def test_any_other_shape_mismatch_is_one_line(tmp_path):
    folder = _folder(tmp_path, "rtdetr")
    with pytest.raises(CheckpointError, match=r"tensor\(s\) have other shapes than the model's") as error:
        load_checkpoint(folder, dim_feedforward=40)  # an override that contradicts every decoder layer
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_without_its_processor_config_says_which_size_it_runs_at(tmp_path, caplog, family):
    folder = _folder(tmp_path, family)
    (folder / "preprocessor_config.json").unlink()
    with caplog.at_level(logging.WARNING, logger="detr.checkpoints"):
        model = load_checkpoint(folder)
    side = DEFAULT_SIDES[family]
    assert model.input_spec.size == side
    assert f"has no preprocessor_config.json: images are resized to the family's default {side} x {side}" \
        in caplog.text


def test_with_its_processor_config_nothing_is_said(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="detr.checkpoints"):
        model = load_checkpoint(_folder(tmp_path, "rtdetr"))
    assert model.input_spec.size == 160 and "preprocessor_config" not in caplog.text


@pytest.mark.parametrize("model_type, name", [("conditional_detr", "Conditional DETR"), ("dab-detr", "DAB-DETR"),
                                              ("yolos", "YOLOS"), ("table-transformer", "Table Transformer"),
                                              ("florence2", None)])
def test_a_model_type_no_reader_reads_lists_those_read(tmp_path, model_type, name):
    folder = _folder(tmp_path, "rtdetr")
    _edit_config(folder, model_type=model_type)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    message = str(error.value)
    assert f"model_type {model_type!r}" in message and "does not implement" in message
    assert name is None or f"({name})" in message
    # every model_type that a reader reads is listed, from the readers' table
    assert all(repr(known) in message for known in HUGGINGFACE_READERS)
    assert {"detr", "deformable_detr", "rt_detr", "rt_detr_v2", "d_fine", "deimv2", "rf_detr", "lw_detr"} <= \
        set(HUGGINGFACE_READERS)


def test_every_family_still_loads_by_its_model_type(tmp_path):
    for family in ["detr", *FAMILIES]:
        assert detr.load_checkpoint(_folder(tmp_path, family)).config.architecture == family
