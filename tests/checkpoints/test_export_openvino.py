"""detr-export --format openvino and detr.checkpoints.openvino: the IR reproduces the PyTorch model at any batch
and image size, carries the model's record, runs through detr.Predictor and detr-predict as an .onnx does, and
fails loudly when damaged. Checked against OpenVINO itself (its Core reads and runs the file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detr import CategoryMap, PostProcess, Predictor, build_detr, load_checkpoint
from detr.checkpoints.export import export
from detr.checkpoints.formats import CheckpointError
from tests.helpers import TINY, load_script, padded, save_project_checkpoint

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ROOT / "data" / "photos"
CATEGORIES = CategoryMap((1, 3, 5, 7, 9), ("circle", "square", "triangle", "star", "cross"))
EVAL_SIZE = (160, 240)  # a small eval resize, recorded in the checkpoint and carried into the IR

pytest.importorskip("onnxscript")
ov = pytest.importorskip("openvino")

from detr.checkpoints.openvino import OpenVinoDetector, cpu_has_bf16


@pytest.fixture(scope="module")
def tiny_ir(tmp_path_factory):
    """The tiny model as a project checkpoint, exported to OpenVINO by tools/export.py (verified there)."""
    folder = tmp_path_factory.mktemp("openvino")
    torch.manual_seed(0)
    checkpoint = save_project_checkpoint(build_detr(TINY, dropout=0.0), folder / "tiny.ckpt", EVAL_SIZE, CATEGORIES)
    xml = folder / "tiny.xml"
    assert load_script("tools/export.py").main([str(checkpoint), "--format", "openvino", "--out", str(xml)]) == 0
    return checkpoint, xml


def test_the_ir_is_openvinos_own_and_carries_the_models_record(tiny_ir):
    _, xml = tiny_ir
    assert xml.with_suffix(".bin").is_file()
    assert not list(xml.parent.glob(".openvino-*")), "the intermediate ONNX file is removed"
    model = ov.Core().read_model(str(xml))  # OpenVINO itself reads it
    assert [i.get_any_name() for i in model.inputs] == ["images", "padding_mask"]
    assert json.loads(model.get_rt_info(["detr", "class_head"]).astype(str)) == "softmax"
    detector = OpenVinoDetector(xml)
    assert detector.meta.category_map == CATEGORIES and detector.meta.eval_size == EVAL_SIZE
    assert (detector.input_spec.size, detector.input_spec.max_size) == EVAL_SIZE
    assert detector.num_classes == 5 and detector.config.hidden_dim == TINY.hidden_dim
    assert detector.backend == "openvino (CPU, fp32)"
    # the weights stay fp32 (OpenVINO compresses them to fp16 unless told not to)
    assert xml.with_suffix(".bin").stat().st_size > 4 * sum(p.numel() for p in build_detr(TINY).parameters()) * 0.9


@pytest.mark.parametrize("sizes", [[(70, 100)], [(96, 128), (64, 200), (130, 66)]])
def test_one_ir_serves_every_batch_and_image_size(tiny_ir, sizes):
    model = load_checkpoint(tiny_ir[0]).eval()
    torch.manual_seed(len(sizes))
    images, mask = padded([torch.randn(3, h, w) for h, w in sizes])
    with torch.no_grad():
        expected = model(images, mask)
    got = OpenVinoDetector(tiny_ir[1])(images, mask)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(got.boxes, expected.boxes, atol=1e-5, rtol=0)


def test_detr_predict_on_the_ir_writes_the_predictions_of_the_pytorch_model(tiny_ir, tmp_path, capsys):
    checkpoint, xml = tiny_ir
    predict = load_script("tools/predict.py").main
    for name, source in (("torch", checkpoint), ("openvino", xml)):
        status = predict([str(PHOTOS), "--checkpoint", str(source), "--out", str(tmp_path / name), "--all-queries",
                          "--device", "cpu", "--batch-size", "2", "--no-draw"])
        assert status == 0
    assert "backend: openvino (CPU, fp32)" in capsys.readouterr().out
    torch_results = json.loads((tmp_path / "torch" / "predictions.json").read_text())
    ir_results = json.loads((tmp_path / "openvino" / "predictions.json").read_text())
    assert len(ir_results) == len(torch_results) == 5 * TINY.num_queries
    for a, b in zip(torch_results, ir_results):
        assert (a["file_name"], a["category_id"]) == (b["file_name"], b["category_id"])
        assert max(abs(x - y) for x, y in zip(a["bbox"], b["bbox"])) <= 0.1  # pixels (the json rounds to 0.01)
        assert abs(a["score"] - b["score"]) <= 1e-4


def test_predictor_refuses_what_the_ir_cannot_do(tiny_ir):
    predictor = Predictor.from_checkpoint(tiny_ir[1], device="cpu")
    assert predictor.category_map == CATEGORIES
    with pytest.raises(ValueError, match="attention maps are not available from the OpenVINO file"):
        predictor.predict(PHOTOS / "chelsea.png", return_attention=True)
    with pytest.raises(ValueError, match="mask head"):
        predictor.predict(PHOTOS / "chelsea.png", task="panoptic")
    with pytest.raises(ValueError, match="architecture is fixed"):
        Predictor.from_checkpoint(tiny_ir[1], num_heads=4)
    if not cpu_has_bf16():  # bf16 is a choice, never a silent fallback
        with pytest.raises(ValueError, match="bfloat16 instructions"):
            Predictor.from_checkpoint(tiny_ir[1], precision="bf16")


def test_postprocessed_ir_matches_postprocess(tmp_path):
    torch.manual_seed(0)
    model = build_detr(TINY, dropout=0.0).eval()
    assert export(model, tmp_path / "tiny.xml", format="openvino", postprocess=True).passed
    torch.manual_seed(6)
    images, mask = padded([torch.randn(3, 100, 150), torch.randn(3, 140, 90)])
    orig_sizes = torch.tensor([[200, 300], [700, 450]])
    got = OpenVinoDetector(tmp_path / "tiny.xml").detect(images, mask, orig_sizes)
    with torch.no_grad():
        expected = PostProcess()(model(images, mask), orig_sizes)
    for index, result in enumerate(expected):
        torch.testing.assert_close(got["scores"][index], result["scores"], atol=1e-5, rtol=0)
        assert torch.equal(got["labels"][index], result["labels"])
        torch.testing.assert_close(got["boxes"][index], result["boxes"], atol=0.01, rtol=0)


@pytest.mark.parametrize("damage", ["missing weights", "truncated", "text"])
def test_a_damaged_ir_is_named_with_the_fix(tiny_ir, tmp_path, capsys, damage):
    xml = tmp_path / "broken.xml"
    data = tiny_ir[1].read_bytes()
    xml.write_bytes({"missing weights": data, "truncated": data[: len(data) // 3],
                     "text": b"this is not a model\n"}[damage])
    if damage != "missing weights":
        (tmp_path / "broken.bin").write_bytes(tiny_ir[1].with_suffix(".bin").read_bytes())
    with pytest.raises(CheckpointError, match=r"broken\.xml.*detr-export"):
        OpenVinoDetector(xml)
    status = load_script("tools/predict.py").main([str(PHOTOS / "chelsea.png"), "--checkpoint", str(xml),
                                                   "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 1 and "broken.xml" in err and "Traceback" not in err


def test_export_command_refuses_a_suffix_that_is_not_the_formats(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script("tools/export.py").main(["detr-r50", "--format", "openvino", "--out", str(tmp_path / "m.onnx")])
    assert "--out must end in .xml for --format openvino" in capsys.readouterr().err


def test_import_detr_needs_no_openvino():
    code = ("import sys, detr, detr.checkpoints.export, detr.checkpoints.openvino, detr.inference.predictor; "
            "assert 'openvino' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_file_without_weights_beside_it_is_not_a_traceback_in_the_predictor(tiny_ir, tmp_path):
    xml = tmp_path / "alone.xml"
    xml.write_bytes(tiny_ir[1].read_bytes())
    with pytest.raises(CheckpointError, match="alone.xml"):
        Predictor.from_checkpoint(Path(xml), device="cpu")


def test_exported_files_keep_the_threshold_the_models_validation_found(tmp_path):
    """An export dropped the checkpoint's validated score threshold, so its files predicted at the authors' 0.7
    (a sigmoid-head model's good detections score 0.4-0.7)."""
    import dataclasses

    from detr.checkpoints.export import export_onnx, export_openvino

    model = build_detr(TINY, dropout=0.0).eval()
    model.meta = dataclasses.replace(model.meta, category_map=CATEGORIES, score_threshold=0.42)
    for path in (export_onnx(model, tmp_path / "tiny.onnx"), export_openvino(model, tmp_path / "tiny.xml")):
        predictor = Predictor.from_checkpoint(path, device="cpu")
        assert predictor.threshold == pytest.approx(0.42), path
        assert predictor.threshold_source == "the checkpoint's validation: best F1"
