"""TH2: a score threshold read from a file (a checkpoint's record, a transformers config.json, an exported
file's metadata) is checked once, in ModelMeta, wherever it is read: a threshold of 5, NaN or -0.5 was used as
"the checkpoint's validation: best F1" and found nothing (exit 0) where config.json refused the same value."""

from __future__ import annotations

import json
import math

import pytest
import torch

from detr import build_detr, load_checkpoint
from detr.checkpoints.formats import CheckpointError
from detr.checkpoints.huggingface import save_pretrained
from detr.inference.predictor import Predictor
from detr.models.config import ModelMeta, check_threshold
from tests.helpers import TINY

BAD = [5.0, math.nan, -0.5, math.inf, 0.0, 1.0]


@pytest.mark.parametrize("threshold", BAD + ["0.3", True])
def test_the_record_refuses_a_threshold_that_is_not_one(threshold) -> None:
    with pytest.raises(ValueError, match="score_threshold must be a number between 0 and 1"):
        ModelMeta(score_threshold=threshold)
    for name in ("panoptic_threshold", "panoptic_overlap_threshold"):
        if threshold not in (0.0, 1.0):
            with pytest.raises(ValueError, match=f"{name} must be a number in"):
                ModelMeta(**{name: threshold})
    check_threshold("score_threshold", 0.35)
    assert ModelMeta(panoptic_threshold=0.0, panoptic_overlap_threshold=1.0).panoptic_overlap_threshold == 1.0


@pytest.mark.parametrize("threshold", [5.0, math.nan, -0.5])
def test_a_checkpoint_with_a_threshold_out_of_range_is_refused(tmp_path, threshold) -> None:
    model = build_detr(TINY)
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "detr": {"model_config": model.config.to_dict(), "category_map": None, "score_threshold": threshold}},
               path)
    with pytest.raises(CheckpointError, match=rf"{path}.*score_threshold must be a number between 0 and 1"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="score_threshold"):
        Predictor.from_checkpoint(path, device="cpu")


@pytest.mark.parametrize("threshold", ["NaN", "-0.5", "5"])
def test_a_config_json_with_a_threshold_out_of_range_is_refused(tmp_path, threshold) -> None:
    save_pretrained(build_detr(TINY), tmp_path)
    text = (tmp_path / "config.json").read_text()
    config = json.loads(text)
    config["score_threshold"] = 0.25
    (tmp_path / "config.json").write_text(json.dumps(config).replace("0.25", threshold))
    with pytest.raises(CheckpointError, match=r"config\.json: score_threshold must be a number between 0 and 1"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("threshold", ["NaN", "-0.5", "5"])
def test_an_exported_file_with_a_threshold_out_of_range_is_refused(tmp_path, threshold) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from detr.checkpoints.onnx import OnnxDetector

    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["pred_logits"])], "tiny",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("pred_logits", TensorProto.FLOAT, [1, 3, 32, 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    properties = {"detr.outputs": '"raw"', "detr.class_head": '"softmax"', "detr.num_classes": "5",
                  "detr.category_map": "null", "detr.eval_size": "null", "detr.min_image_size": "32",
                  "detr.model_config": json.dumps(TINY.to_dict()), "detr.score_threshold": threshold}
    helper.set_model_props(model, properties)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    with pytest.raises(CheckpointError, match=rf"{path}: .*score_threshold must be a number between 0 and 1"):
        OnnxDetector(path)
