"""Deformable DETR out of PyTorch: ONNX files that ONNX Runtime runs with the model's outputs (the deformable
attention's grid_sample included) at sizes other than the traced one, the Predictor on the PyTorch model
and on the ONNX file, and detr-predict on a Deformable DETR checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from detr import build_detr
from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.checkpoints.export import export
from detr.commands import predict
from detr.inference.predictor import Predictor
from tests.helpers import REPO, randomise, tiny_config_with

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

DEFORMABLE = tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2, dropout=0.0)
PHOTOS = REPO / "data" / "photos"

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(**changes):
    torch.manual_seed(0)
    model = build_detr(DEFORMABLE, **changes).eval()
    randomise(model, 0)
    model.meta = model.meta.replace(category_map=CategoryMap(tuple(range(5)), tuple(f"c{i}" for i in range(5))),
                                    eval_size=(160, 224))
    return model


@pytest.mark.slow  # about a minute per variant: the ONNX exporter
@pytest.mark.parametrize("changes", [{}, {"box_refine": True, "two_stage": True}], ids=["plain", "two_stage"])
def test_onnx_runtime_reproduces_the_model_and_the_predictor_runs_it(tmp_path, changes):
    model = _model(**changes)
    path = tmp_path / "deformable.onnx"
    verification = export(model, path, postprocess=False)  # raises unless within the fp32 tolerances
    assert verification.passed and max(
        diff for row in verification.differences.values() for diff in row.values()) <= 1e-4
    photos = [PHOTOS / "chelsea.png", PHOTOS / "astronaut.png"]
    ours = Predictor(model, device="cpu").predict(photos, all_queries=True)
    onnx = Predictor.from_checkpoint(path, device="cpu").predict(photos, all_queries=True)
    for a, b in zip(ours, onnx):
        assert torch.equal(a.query_indices, b.query_indices)
        assert torch.allclose(torch.as_tensor(a.boxes), torch.as_tensor(b.boxes), atol=1e-2)
        assert torch.allclose(torch.as_tensor(a.scores), torch.as_tensor(b.scores), atol=1e-4)


def test_detr_predict_runs_a_deformable_checkpoint(tmp_path):
    checkpoint = save_checkpoint(_model(box_refine=True), tmp_path / "deformable.ckpt")
    out = tmp_path / "predictions"
    status = predict.main([str(PHOTOS / "chelsea.png"), "--checkpoint", str(checkpoint), "--out", str(out),
                           "--threshold", "0.0", "--device", "cpu"])
    assert status == 0
    results = json.loads((out / "predictions.json").read_text())
    assert len(results) == DEFORMABLE.num_queries and {r["category_id"] for r in results} <= set(range(5))
