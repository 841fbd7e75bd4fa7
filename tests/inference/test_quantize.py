"""detr.inference.quantize: calibration with the model's own preprocessing, and INT8 files that keep the model's
record and run in their runtimes (ONNX Runtime's QDQ, NNCF's OpenVINO IR) close to the fp32 file."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from detr.checkpoints.export import export_onnx
from detr.inference.images import to_rgb_array
from detr.inference.quantize import calibration_feeds, onnx_head_nodes, quantize
from tests.serving.helpers import spread_out_model

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO / "data" / "photos"


def test_calibration_images_are_prepared_as_the_model_takes_them():
    model = spread_out_model()
    feeds = calibration_feeds(model.input_spec, [PHOTOS], limit=2)
    assert len(feeds) == 2
    first = sorted(p for p in PHOTOS.iterdir() if p.suffix in (".png", ".jpg"))[0]
    expected = model.input_spec.prepare(to_rgb_array(first))[None].numpy()
    np.testing.assert_array_equal(feeds[0]["images"], expected)
    assert feeds[0]["padding_mask"].shape == (1, *expected.shape[-2:]) and not feeds[0]["padding_mask"].any()
    assert min(expected.shape[-2:]) == model.meta.eval_size[0]  # the model's own eval resize
    with pytest.raises(ValueError, match="not an image file"):
        calibration_feeds(model.input_spec, [PHOTOS / "*.tiff"])


def test_int8_onnx_keeps_the_record_and_stays_close_to_fp32(tmp_path):
    from detr.checkpoints.onnx import OnnxDetector, read_onnx_metadata

    model = spread_out_model().eval()
    path = export_onnx(model, tmp_path / "tiny.onnx")
    feeds = calibration_feeds(model.input_spec, [PHOTOS])
    int8 = quantize(path, tmp_path / "tiny-int8.onnx", feeds)
    assert read_onnx_metadata(int8)["category_map"] == read_onnx_metadata(path)["category_map"]
    assert read_onnx_metadata(int8)["precision"] == "int8"
    graph = onnx.load(str(int8)).graph
    assert any(node.op_type == "QuantizeLinear" for node in graph.node)  # QDQ around the convolutions
    assert len(onnx_head_nodes(onnx.load(str(path)))) == 2  # the class and box heads' last layers
    detector, reference = OnnxDetector(int8), OnnxDetector(path)
    assert detector.backend.endswith("int8)")
    images = torch.from_numpy(feeds[0]["images"])
    mask = torch.from_numpy(feeds[0]["padding_mask"])
    got, want = detector(images, mask), reference(images, mask)
    assert torch.isfinite(got.logits).all() and (got.boxes - want.boxes).abs().max() < 0.1


def test_int8_openvino_ir_runs_as_int8(tmp_path):
    pytest.importorskip("openvino")
    if importlib.util.find_spec("nncf") is None:
        pytest.skip("nncf is not installed")
    from detr.checkpoints.export import export_openvino
    from detr.checkpoints.openvino import OpenVinoDetector

    model = spread_out_model().eval()
    xml = export_openvino(model, tmp_path / "tiny.xml")
    # NNCF quantises in a process of its own: it leaves threads and native state behind in the process that
    # imported it, which the rest of the suite should not share
    quantise = ("import sys\nfrom pathlib import Path\n"
                "from detr.checkpoints.openvino import OpenVinoDetector\n"
                "from detr.inference.quantize import calibration_feeds, quantize\n"
                "xml, photos = Path(sys.argv[1]), Path(sys.argv[2])\n"
                "feeds = calibration_feeds(OpenVinoDetector(xml).input_spec, [photos])\n"
                "quantize(xml, xml.with_name('tiny-int8.xml'), feeds)\n")
    run = subprocess.run([sys.executable, "-c", quantise, str(xml), str(PHOTOS)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)
    assert run.returncode == 0, run.stderr
    int8 = tmp_path / "tiny-int8.xml"
    detector = OpenVinoDetector(int8)
    assert detector.backend == "openvino (CPU, int8)" and detector.meta.eval_size == model.meta.eval_size
    feeds = calibration_feeds(model.input_spec, [PHOTOS])
    images = torch.from_numpy(feeds[1]["images"])
    mask = torch.from_numpy(feeds[1]["padding_mask"])
    got, want = detector(images, mask), OpenVinoDetector(xml)(images, mask)
    assert torch.isfinite(got.logits).all() and (got.boxes - want.boxes).abs().max() < 0.1
    with pytest.raises(ValueError, match="an .onnx or .xml file"):
        quantize(tmp_path / "tiny.pt2", tmp_path / "x.pt2", feeds)


def test_int8_onnx_of_a_real_time_model_keeps_its_square_and_runs(tmp_path):
    """A real-time family's file (static square, no padding mask needed) quantises like the others: calibrated at
    its square, the INT8 file keeps the square in its record and predicts close to the fp32 file."""
    from detr.checkpoints.onnx import OnnxDetector, read_onnx_metadata
    from tests.helpers_realtime import tiny_model

    model = tiny_model("rtdetr")
    path = export_onnx(model, tmp_path / "rtdetr.onnx")
    feeds = calibration_feeds(model.input_spec, [PHOTOS], limit=3)
    assert {feed["images"].shape[-2:] for feed in feeds} == {(model.input_spec.size, model.input_spec.size)}
    int8 = quantize(path, tmp_path / "rtdetr-int8.onnx", feeds)
    record, fp32_record = read_onnx_metadata(int8), read_onnx_metadata(path)
    assert record["precision"] == "int8" and record["static_input_size"] == fp32_record["static_input_size"]
    images, mask = torch.from_numpy(feeds[0]["images"]), torch.from_numpy(feeds[0]["padding_mask"])
    got, want = OnnxDetector(int8)(images, mask), OnnxDetector(path)(images, mask)
    assert got.boxes.shape == want.boxes.shape and torch.isfinite(got.logits).all()
    # query selection is a top-k over the encoder's cells: INT8 rounding can exchange a proposal at the cut (random
    # weights make near-ties common), so the boxes are compared as sets: most fp32 boxes have an INT8 box near them
    nearest = (want.boxes[0][:, None] - got.boxes[0][None]).abs().amax(-1).amin(1)
    assert (nearest < 0.1).float().mean() >= 0.75, nearest
