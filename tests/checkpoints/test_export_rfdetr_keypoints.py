"""An RF-DETR keypoint model (GroupPose) out of PyTorch: the graph adds its raw keypoints (``pred_keypoints``;
post-processed, the kept pairs' ``keypoints``), the metadata records the schema and the trace α, and the Predictor
on the ONNX file gives the PyTorch model's keypoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from detr.checkpoints.deployed import open_deployed
from detr.checkpoints.export import DeployModel, example_inputs, export, metadata, prepare_for_export
from detr.inference.postprocess import top_k_pairs
from detr.inference.predictor import Predictor
from detr.models.build import build_detr
from detr.models.config import ModelMeta
from tests.helpers import randomise
from tests.helpers_rfdetr import KEYPOINT_COUNTS as COUNTS
from tests.helpers_rfdetr import TINY_KEYPOINT_RFDETR as TINY

pytestmark = pytest.mark.usefixtures("one_thread")

SIDE = 32  # patch 8 × 2 windows × 2


def _model():
    model = build_detr(TINY)
    randomise(model, 0)
    model.meta = ModelMeta(eval_size=(SIDE, SIDE))
    return model.eval()


def test_the_graph_outputs_the_keypoints_of_every_query_or_of_the_kept_pairs():
    model = prepare_for_export(_model())
    images, mask, orig_sizes = example_inputs(model, postprocess=True, square=SIDE)
    assert DeployModel(model).output_names == ["pred_logits", "pred_boxes", "pred_keypoints"]
    module = DeployModel(model, postprocess=True)
    assert module.output_names == ["scores", "labels", "boxes", "keypoints"]
    with torch.no_grad():
        *_, keypoints = module(images, mask, orig_sizes)
        outputs = model(images, mask)
    _, _, queries = top_k_pairs(outputs.logits, model.detections_per_image)
    for index, image_queries in enumerate(queries):
        assert torch.equal(keypoints[index], outputs.keypoints[index, image_queries])
    values = {key: json.loads(value) for key, value in metadata(model, postprocess=False).items()}
    assert values["detr.keypoints"] == {"num_keypoints_per_class": list(COUNTS), "trace_alpha": 0.2}


@pytest.mark.slow  # about two minutes: the ONNX exporter
def test_the_onnx_file_gives_the_model_keypoints_through_the_predictor(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = _model()
    path = export(model, tmp_path / "keypoints.onnx").path  # raises when the file differs from the model
    deployed = open_deployed(path)
    assert deployed.keypoint_schema == model.keypoint_schema and deployed.keypoint_trace_alpha == 0.2
    image = np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8)
    ours, theirs = (Predictor(detector, device="cpu").predict_arrays([image], threshold=0.0)[0]
                    for detector in (model, deployed))
    assert ours.keypoints is not None and ours.keypoints.shape == theirs.keypoints.shape
    assert torch.equal(ours.labels, theirs.labels)
    assert (ours.scores - theirs.scores).abs().max() <= 1e-4
    assert (ours.keypoints - theirs.keypoints).abs().max() <= 1e-2  # pixels, and scores in [0, 1]
