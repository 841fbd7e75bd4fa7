"""RF-DETR and LW-DETR out of PyTorch: exported at their fixed square (static height and width, dynamic batch) to
ONNX, OpenVINO IR and torch.export programs, each file equal to the model, instance masks included (``pred_masks``;
post-processed, the kept pairs' ``mask_logits``); the Predictor and detr-predict on an RF-DETR ``.onnx`` give the
PyTorch model's detections and masks on real photos."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import detr
from detr import PostProcess
from detr.checkpoints.deployed import open_deployed
from detr.checkpoints.export import DeployModel, example_inputs, export, load_program, metadata, prepare_for_export
from detr.commands import export as export_command
from detr.inference.postprocess import top_k_pairs
from detr.inference.predictor import Predictor
from detr.models.family import config_from_dict
from tests.helpers import REPO
from tests.helpers_realtime import tiny_model
from tests.helpers_rfdetr import hf_lwdetr, hf_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

PHOTOS = [REPO / "data" / "photos" / "chelsea.png", REPO / "data" / "photos" / "astronaut.png"]
SIDE = 112  # the square the files are exported at: a multiple of patch 14 × 2 windows (and of LW-DETR's 14 × 4)
#: What every exported output is held to here (max abs difference; boxes normalised).
TOLERANCE = 1e-4


def _directory(tmp_path, masks: bool = False, lwdetr: bool = False):
    """A tiny transformers RF-DETR (or LW-DETR) saved with an image processor of a SIDE square, and its path."""
    import transformers

    if lwdetr:
        hf_lwdetr(5).save_pretrained(tmp_path)
        transformers.DeformableDetrImageProcessor(size={"height": SIDE, "width": SIDE}).save_pretrained(tmp_path)
    else:
        hf_model(5, masks=masks).save_pretrained(tmp_path)
        transformers.RfDetrImageProcessor(size={"height": SIDE, "width": SIDE}).save_pretrained(tmp_path)
    return tmp_path


def _assert_within(verification) -> None:
    for check, outputs in verification.differences.items():
        for name, difference in outputs.items():
            assert difference <= (0.0 if name == "labels" else TOLERANCE), (check, name, difference)


def test_postprocessing_in_the_graph_keeps_the_top_k_pairs_and_their_masks():
    model = tiny_model("rfdetr")
    assert model.exportable and model.predicts_masks
    prepared = prepare_for_export(model)
    images, mask, orig_sizes = example_inputs(prepared, postprocess=True, square=112)
    module = DeployModel(prepared, postprocess=True)
    assert module.output_names == ["scores", "labels", "boxes", "mask_logits"]
    assert DeployModel(prepared).output_names == ["pred_logits", "pred_boxes", "pred_masks"]
    with torch.no_grad():
        scores, labels, boxes, masks = module(images, mask, orig_sizes)
        outputs = prepared(images, mask)  # the kernel the file has (grid_sample), so that the masks are equal
        expected = PostProcess(top_k=model.detections_per_image)(outputs, orig_sizes)
    assert masks.shape == (len(images), model.detections_per_image, 112 // 4, 112 // 4)
    for index, image in enumerate(expected):
        assert torch.equal(labels[index], image["labels"])
        torch.testing.assert_close(scores[index], image["scores"], atol=1e-5, rtol=0)
        torch.testing.assert_close(boxes[index], image["boxes"], atol=1e-3, rtol=0)
    _, _, queries = top_k_pairs(outputs.logits, model.detections_per_image)
    for index, image_queries in enumerate(queries):  # each kept pair's mask is its query's
        assert torch.equal(masks[index], outputs.masks[index, image_queries])


def test_the_metadata_rebuilds_the_models_config_and_says_it_predicts_masks():
    model = tiny_model("rfdetr")
    values = {key: json.loads(value) for key, value in metadata(model, postprocess=False).items()}
    assert values["detr.predicts_masks"] is True and values["detr.static_input_size"] == [112, 112]
    assert config_from_dict(values["detr.model_config"]) == model.config  # the ViT's stages (a tuple) included


@pytest.mark.slow  # about a minute: the ONNX exporter
def test_rfdetr_onnx_file_with_masks_gives_the_model_detections_and_masks_through_the_predictor(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    source = _directory(tmp_path / "hf", masks=True)
    path = tmp_path / "rfdetr.onnx"
    assert export_command.main([str(source), "--format", "onnx", "--out", str(path)]) == 0
    assert "verified" in capsys.readouterr().out
    model = detr.load_checkpoint(source)
    deployed = open_deployed(path)
    assert deployed.predicts_masks and deployed.static_input_size == (SIDE, SIDE)
    images, mask = example_inputs(model, postprocess=False, square=SIDE, batch_sizes=[(1, 1)] * 2, seed=3)
    with torch.no_grad():
        expected = model.eval()(images, mask)
    got = deployed(images, mask)
    assert (got.logits - expected.logits).abs().max() <= TOLERANCE
    assert (got.boxes - expected.boxes).abs().max() <= TOLERANCE
    assert (got.masks - expected.masks).abs().max() <= TOLERANCE
    reference, files = Predictor.from_checkpoint(source, device="cpu"), Predictor.from_checkpoint(path, device="cpu")
    assert files.predicts_masks
    for a, b in zip(reference.predict(PHOTOS, all_queries=True), files.predict(PHOTOS, all_queries=True)):
        assert len(a.scores) == model.detections_per_image
        assert torch.equal(torch.as_tensor(a.labels), torch.as_tensor(b.labels))
        assert (torch.as_tensor(a.scores) - torch.as_tensor(b.scores)).abs().max() <= 1e-4
        assert (torch.as_tensor(a.boxes) - torch.as_tensor(b.boxes)).abs().max() <= 1e-2  # pixels
        assert a.masks is not None and b.masks is not None and a.masks.shape == b.masks.shape
        assert (a.masks != b.masks).float().mean() <= 1e-3  # a logit within 1e-4 of 0 may flip a pixel


@pytest.mark.slow  # about two minutes: the ONNX exporter, then OpenVINO's conversion
def test_rfdetr_openvino_file_with_postprocessing_is_the_model_top_k_with_masks(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("onnxscript")
    model = tiny_model("rfdetr")
    path = tmp_path / "rfdetr.xml"
    verification = export(model, path, format="openvino", postprocess=True)
    assert set(verification.tolerances) == {"scores", "labels", "boxes", "mask_logits"}
    _assert_within(verification)
    images, mask, orig_sizes = example_inputs(model, postprocess=True, square=112, seed=4)
    got = open_deployed(path).detect(images, mask, orig_sizes)
    with torch.no_grad():
        expected = DeployModel(prepare_for_export(model), postprocess=True)(images, mask, orig_sizes)
    for name, want in zip(("scores", "labels", "boxes", "mask_logits"), expected):
        np.testing.assert_allclose(got[name].numpy(), want.numpy(), atol=1e-3 if name == "boxes" else 1e-4)


@pytest.mark.slow  # torch.export alone: tens of seconds
@pytest.mark.parametrize("lwdetr", [False, True], ids=["rfdetr", "lwdetr"])
def test_program_with_the_gather_kernel_equals_the_model(tmp_path, lwdetr):
    model = detr.load_checkpoint(_directory(tmp_path / "hf", lwdetr=lwdetr))
    path = tmp_path / "model.pt2"
    _assert_within(export(model, path, format="pt2", bilinear_kernel="gather"))
    program, values = load_program(path)
    assert values["static_input_size"] == [SIDE, SIDE] and values["predicts_masks"] is False
    images, mask = example_inputs(model, postprocess=False, square=SIDE, batch_sizes=[(1, 1)] * 3)
    with torch.no_grad():
        expected, got = model.eval()(images, mask), program(images, mask)
    assert len(got) == 2
    assert (got[0] - expected.logits).abs().max() <= TOLERANCE and (got[1] - expected.boxes).abs().max() <= TOLERANCE


@pytest.mark.slow  # about a minute: the ONNX exporter
def test_lwdetr_onnx_file_equals_the_model(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = detr.load_checkpoint(_directory(tmp_path / "hf", lwdetr=True))
    _assert_within(export(model, tmp_path / "lwdetr.onnx"))
