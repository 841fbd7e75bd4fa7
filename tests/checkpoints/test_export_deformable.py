"""Deformable DETR out of PyTorch: ONNX files that ONNX Runtime runs with the model's outputs (the deformable
attention's grid_sample included) at sizes other than the traced one, the Predictor on the PyTorch model
and on the ONNX file; torch.export programs (detr-export --format pt2) of the plain, box-refinement and
two-stage models, equal to the model; and detr-predict on a Deformable DETR checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from detr import build_detr
from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.checkpoints.export import DeployModel, export, load_program, prepare_for_export
from detr.commands import export as export_command
from detr.commands import predict
from detr.data.collate import pad_images
from detr.inference.images import to_rgb_array
from detr.inference.postprocess import PostProcess
from detr.inference.predictor import Predictor
from tests.helpers import REPO, randomise, tiny_config_with

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
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
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


@pytest.mark.slow  # the ONNX exporter
def test_the_gather_kernel_exports_without_grid_sample_and_the_same_outputs(tmp_path, capsys):
    """--sampling-kernel gather: no GridSample in the file (TensorRT's has been wrong), and ONNX Runtime gives the
    model's logits and boxes (computed with grid_sample) to 1e-4, as the default export does (the test above)."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from detr.checkpoints.onnx import OnnxDetector

    model = _model(box_refine=True, two_stage=True)
    save_checkpoint(model, tmp_path / "model.pth")
    path = tmp_path / "gather.onnx"
    assert export_command.main([str(tmp_path / "model.pth"), "--out", str(path), "--sampling-kernel", "gather"]) == 0, (
        capsys.readouterr().err)
    operators = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "GridSample" not in operators and "GatherElements" in operators
    images, mask = photo_batch(model)
    with torch.no_grad():
        expected = model(images, mask)
    got = OnnxDetector(path)(images, mask)
    assert (got.logits - expected.logits).abs().max() < 1e-4 and (got.boxes - expected.boxes).abs().max() < 1e-4


def photo_batch(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Two photos of different shapes at the model's eval size (160 / 224), padded, and the mask."""
    predictor = Predictor(model, device="cpu")
    return pad_images([predictor.preprocess(to_rgb_array(PHOTOS / name)) for name in ("chelsea.png", "astronaut.png")])


# about 20 s each on the shared 2-core machine (torch.export's trace): the plain model is the quick guard
SLOW = pytest.mark.slow


@pytest.mark.parametrize("changes", [pytest.param({}, id="plain"),
                                     pytest.param({"box_refine": True}, id="box_refine", marks=SLOW),
                                     pytest.param({"box_refine": True, "two_stage": True}, id="two_stage", marks=SLOW)])
def test_detr_export_pt2_program_equals_the_model(tmp_path, capsys, changes):
    """detr-export --format pt2 traces and verifies the model; the loaded program gives, on two padded photos,
    the outputs of the model it traced (BatchNorm folded) to the bit, and the model's own within 1e-5."""
    model = _model(**changes)
    checkpoint = save_checkpoint(model, tmp_path / "deformable.ckpt")
    path = tmp_path / "deformable.pt2"
    assert export_command.main([str(checkpoint), "--format", "pt2", "--out", str(path)]) == 0
    assert "single image (a third size)" in capsys.readouterr().out  # the verification's table
    program, meta = load_program(path)
    assert meta["outputs"] == "raw" and meta["class_head"] == "sigmoid"
    assert meta["model_config"]["two_stage"] == changes.get("two_stage", False)
    images, mask = photo_batch(model)
    assert mask[:, -1, :].any() or mask[:, :, -1].any()  # one photo is padded
    with torch.no_grad():
        logits, boxes = program(images, mask)
        folded = DeployModel(prepare_for_export(model))(images, mask)
        eager = model(images, mask)
    assert torch.equal(logits, folded[0]) and torch.equal(boxes, folded[1])
    assert float((logits - eager.logits).abs().max()) <= 1e-5
    assert float((boxes - eager.boxes).abs().max()) <= 1e-5


@SLOW
def test_pt2_program_with_postprocessing_scores_as_postprocess(tmp_path):
    model = _model(box_refine=True, two_stage=True)
    verification = export(model, tmp_path / "deformable.pt2", format="pt2", postprocess=True)
    assert verification.passed
    program, meta = load_program(tmp_path / "deformable.pt2")
    assert meta["outputs"] == "postprocessed"
    images, mask = photo_batch(model)
    orig_sizes = torch.tensor([[300, 451], [512, 512]])
    with torch.no_grad():
        scores, labels, boxes = program(images, mask, orig_sizes)
        expected = PostProcess(class_head="sigmoid")(model(images, mask), orig_sizes)
    for index, result in enumerate(expected):
        torch.testing.assert_close(scores[index], result["scores"], atol=1e-5, rtol=0)
        assert torch.equal(labels[index], result["labels"])
        torch.testing.assert_close(boxes[index], result["boxes"], atol=1e-2, rtol=0)


def test_detr_predict_runs_a_deformable_checkpoint(tmp_path):
    checkpoint = save_checkpoint(_model(box_refine=True), tmp_path / "deformable.ckpt")
    out = tmp_path / "predictions"
    status = predict.main([str(PHOTOS / "chelsea.png"), "--checkpoint", str(checkpoint), "--out", str(out),
                           "--threshold", "0.0", "--device", "cpu"])
    assert status == 0
    results = json.loads((out / "predictions.json").read_text())
    assert len(results) == DEFORMABLE.num_queries and {r["category_id"] for r in results} <= set(range(5))
