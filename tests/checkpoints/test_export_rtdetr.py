"""The real-time DETRs out of PyTorch: RT-DETR, RT-DETRv2 (discrete sampling) and D-FINE exported at their fixed
square (static height and width, dynamic batch) to ONNX, OpenVINO IR and torch.export programs, each file equal
to the model; the Predictor and detr-predict on a file give the PyTorch model's top-k detections on real photos;
post-processing in the graph is the family's top-k over (query, class) pairs."""

from __future__ import annotations

import json

import pytest
import torch

import detr
from detr import PostProcess
from detr.checkpoints.export import DeployModel, example_inputs, export, load_program, metadata, prepare_for_export
from detr.commands import export as export_command
from detr.commands import predict
from detr.inference.images import to_rgb_array
from detr.inference.predictor import Predictor
from tests.helpers import REPO
from tests.helpers_dfine import hf_model as hf_dfine
from tests.helpers_rtdetr import hf_model as hf_rtdetr

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

PHOTOS = [REPO / "data" / "photos" / "chelsea.png", REPO / "data" / "photos" / "astronaut.png"]
SIDE = 128  # the square the files are exported at: a multiple of 32, small enough for a fast export


def _directory(tmp_path, family: str, **options):
    """A tiny transformers RT-DETR / D-FINE saved with an image processor of a SIDE square, and its path."""
    import transformers

    if family == "dfine":
        hf_dfine("hgnetv2_b0", 5, **options).save_pretrained(tmp_path)
    else:
        hf_rtdetr("resnet18", 5, **options).save_pretrained(tmp_path)
    transformers.RTDetrImageProcessor(size={"height": SIDE, "width": SIDE}).save_pretrained(tmp_path)
    return tmp_path


def _assert_same_detections(reference: Predictor, deployed: Predictor) -> None:
    ours, theirs = reference.predict(PHOTOS, all_queries=True), deployed.predict(PHOTOS, all_queries=True)
    for a, b in zip(ours, theirs):
        assert len(a.scores) == reference.model.detections_per_image  # the family's top-k, not one per query
        assert torch.equal(torch.as_tensor(a.labels), torch.as_tensor(b.labels))
        assert torch.equal(torch.as_tensor(a.query_indices), torch.as_tensor(b.query_indices))
        assert (torch.as_tensor(a.scores) - torch.as_tensor(b.scores)).abs().max() <= 1e-4
        assert (torch.as_tensor(a.boxes) - torch.as_tensor(b.boxes)).abs().max() <= 1e-2  # pixels


def test_postprocessing_in_the_graph_is_the_family_top_k(tmp_path):
    model = detr.load_checkpoint(_directory(tmp_path, "rtdetr"))
    prepared = prepare_for_export(model)
    images, mask, orig_sizes = example_inputs(prepared, postprocess=True, square=SIDE)
    with torch.no_grad():
        scores, labels, boxes = DeployModel(prepared, postprocess=True)(images, mask, orig_sizes)
        expected = PostProcess(top_k=model.detections_per_image)(model(images, mask), orig_sizes)
    assert scores.shape == (len(images), model.detections_per_image)
    for index, image in enumerate(expected):
        assert torch.equal(labels[index], image["labels"])
        torch.testing.assert_close(scores[index], image["scores"], atol=1e-5, rtol=0)
        torch.testing.assert_close(boxes[index], image["boxes"], atol=1e-3, rtol=0)
    values = {key: json.loads(value) for key, value in metadata(model, postprocess=True).items()}
    assert values["detr.static_input_size"] == [SIDE, SIDE]
    assert values["detr.detections_per_image"] == model.detections_per_image
    assert values["detr.input_spec"]["resize"] == "square" and values["detr.input_spec"]["size"] == SIDE


@pytest.mark.slow  # about a minute: the ONNX exporter
def test_rtdetr_onnx_file_gives_the_model_detections_through_the_predictor_and_detr_predict(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    source = _directory(tmp_path / "hf", "rtdetr")
    path = tmp_path / "rtdetr.onnx"
    assert export_command.main([str(source), "--format", "onnx", "--out", str(path)]) == 0
    assert "verified" in capsys.readouterr().out
    deployed = Predictor.from_checkpoint(path, device="cpu")
    assert deployed.model.static_input_size == (SIDE, SIDE) and deployed.input_spec.size == SIDE
    _assert_same_detections(Predictor.from_checkpoint(source, device="cpu"), deployed)
    with pytest.raises(ValueError, match=f"takes images of {SIDE} × {SIDE} pixels only"):
        deployed.model(torch.rand(1, 3, SIDE + 32, SIDE), torch.zeros(1, SIDE + 32, SIDE, dtype=torch.bool))
    results = {}
    for name, checkpoint in (("torch", source), ("onnx", path)):
        assert predict.main([str(PHOTOS[0]), "--checkpoint", str(checkpoint), "--out", str(tmp_path / name),
                             "--all-queries", "--device", "cpu", "--no-draw"]) == 0
        results[name] = json.loads((tmp_path / name / "predictions.json").read_text())
    assert len(results["onnx"]) == len(results["torch"]) == deployed.model.detections_per_image
    for a, b in zip(results["torch"], results["onnx"]):
        assert a["category_id"] == b["category_id"] and abs(a["score"] - b["score"]) <= 1e-4
        assert max(abs(x - y) for x, y in zip(a["bbox"], b["bbox"])) <= 0.02  # pixels (the json rounds to 0.01)


@pytest.mark.slow  # about a minute: the ONNX exporter
def test_dfine_onnx_file_gives_the_model_detections(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = detr.load_checkpoint(_directory(tmp_path / "hf", "dfine"))
    path = tmp_path / "dfine.onnx"
    verification = export(model, path)  # raises unless within the fp32 tolerances
    assert verification.passed
    _assert_same_detections(Predictor(model, device="cpu"), Predictor.from_checkpoint(path, device="cpu"))


@pytest.mark.slow  # about a minute: the ONNX exporter, then OpenVINO's conversion
def test_rtdetrv2_discrete_sampling_openvino_file_with_postprocessing_is_the_model_top_k(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("onnxscript")
    model = detr.load_checkpoint(_directory(tmp_path / "hf", "rtdetr", version=2, decoder_method="discrete"))
    assert model.config.sampling_method == "discrete"
    path = tmp_path / "rtdetrv2.xml"
    assert export(model, path, format="openvino", postprocess=True).passed
    deployed = detr.checkpoints.deployed.open_deployed(path)
    arrays = [to_rgb_array(photo) for photo in PHOTOS]
    images, mask, _ = model.input_spec.batch(arrays)
    orig_sizes = torch.tensor([array.shape[:2] for array in arrays])
    got = deployed.detect(images, mask, orig_sizes)
    with torch.no_grad():
        expected = PostProcess(top_k=model.detections_per_image)(model.eval()(images, mask), orig_sizes)
    for index, image in enumerate(expected):
        assert torch.equal(got["labels"][index], image["labels"])
        assert (got["scores"][index] - image["scores"]).abs().max() <= 1e-4
        assert (got["boxes"][index] - image["boxes"]).abs().max() <= 1e-2  # pixels


@pytest.mark.slow  # torch.export alone: tens of seconds
def test_dfine_program_with_the_gather_kernel_equals_the_model(tmp_path):
    model = detr.load_checkpoint(_directory(tmp_path / "hf", "dfine"))
    path = tmp_path / "dfine.pt2"
    assert export(model, path, format="pt2", bilinear_kernel="gather").passed
    program, values = load_program(path)
    assert values["static_input_size"] == [SIDE, SIDE]
    images, mask = example_inputs(model, postprocess=False, square=SIDE, batch_sizes=[(1, 1)] * 3)
    with torch.no_grad():
        expected, got = model.eval()(images, mask), program(images, mask)
    assert (got[0] - expected.logits).abs().max() <= 1e-3 and (got[1] - expected.boxes).abs().max() <= 1e-4
