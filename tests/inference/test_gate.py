"""detr.inference.gate and detr-export --evaluate: the AP of the exported file itself, beside its latency, against
the PyTorch model on a COCO-format set; a file that loses AP fails the gate."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detr import Predictor
from detr.inference.gate import accuracy_gate
from tests.helpers import load_script, save_project_checkpoint
from tests.serving.helpers import spread_out_model

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO / "data" / "photos"
FILES = sorted(path.name for path in PHOTOS.glob("*.png"))[:3]
SCORE = 0.2


@pytest.fixture(scope="module")
def own_ground_truth(tmp_path_factory):
    """A COCO-format set whose objects are what the tiny model itself finds above SCORE on three real photos:
    its every detection above SCORE is right and every one below is wrong, so its box AP is 100, and a model
    that finds other boxes scores far less."""
    folder = tmp_path_factory.mktemp("gate")
    model = spread_out_model().eval()
    predictor = Predictor(model, device="cpu", threshold=SCORE)
    images, annotations = [], []
    for image_id, name in enumerate(FILES, start=1):
        prediction = predictor.predict(PHOTOS / name)[0]
        height, width = prediction.image_size
        images.append({"id": image_id, "file_name": name, "height": height, "width": width})
        for box, label in zip(prediction.boxes.tolist(), prediction.labels.tolist()):
            x0, y0, x1, y1 = box
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "iscrowd": 0,
                                "category_id": model.meta.category_map.category_ids[label],
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    assert len(annotations) >= 3, "the model must find something on the photos for the gate to mean anything"
    categories = [{"id": i, "name": n} for i, n in zip(model.meta.category_map.category_ids,
                                                         model.meta.category_map.names)]
    path = folder / "own.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    checkpoint = save_project_checkpoint(model, folder / "tiny.ckpt", model.meta.eval_size, model.meta.category_map)
    return checkpoint, path


def test_export_with_evaluate_prints_the_files_ap_beside_pytorchs(own_ground_truth, tmp_path, capsys):
    checkpoint, annotations = own_ground_truth
    out = tmp_path / "tiny.onnx"
    status = load_script("tools/export.py").main([str(checkpoint), "--out", str(out), "--evaluate", str(PHOTOS),
                                                  str(annotations)])
    printed = capsys.readouterr().out
    assert status == 0 and out.is_file(), printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith(("pytorch", "tiny"))}
    assert set(rows) == {"pytorch", "tiny.onnx:"}
    assert float(rows["pytorch"][3]) == pytest.approx(100.0, abs=0.01)  # its own detections: AP 100
    assert float(rows["tiny.onnx:"][3]) == pytest.approx(100.0, abs=0.01)  # the file: the same AP
    assert "accuracy gate on 3 images" in printed and "size MB" in printed


def test_a_file_that_loses_ap_fails_the_gate(own_ground_truth, tmp_path):
    checkpoint, annotations = own_ground_truth
    reference = Predictor.from_checkpoint(checkpoint, device="cpu")
    other = Predictor(spread_out_model(seed=1), device="cpu")  # other weights: other boxes
    report = accuracy_gate(reference, {tmp_path / "other.onnx": other}, PHOTOS, annotations, progress=False)
    assert report.reference.ap == pytest.approx(100.0, abs=0.01)
    assert report.artifacts[0].ap < 50 and not report.passed and report.failed == report.artifacts
    assert report.reference.latency_median > 0
    # N11: the PyTorch row's size is its weights' (fp32), not a training checkpoint's beside the exported file
    assert report.reference.size_bytes == 4 * sum(p.numel() for p in reference.model.state_dict().values()
                                                  if p.is_floating_point())
    lenient = accuracy_gate(reference, {tmp_path / "other.onnx": other}, PHOTOS, annotations, progress=False,
                            max_ap_drop=100.0)
    assert lenient.passed


def test_an_fp16_predictor_is_gated_against_fp32(own_ground_truth):
    """The gate takes any Predictor: the same checkpoint under float16 autocast, here on the CPU, against its fp32
    self (what a GPU session measures on a real model)."""
    checkpoint, annotations = own_ground_truth
    reference = Predictor.from_checkpoint(checkpoint, device="cpu")
    half = Predictor.from_checkpoint(checkpoint, device="cpu", precision="fp16")
    report = accuracy_gate(reference, {checkpoint: half}, PHOTOS, annotations, progress=False)
    assert report.passed and "cpu, fp16" in report.artifacts[0].name
    assert report.artifacts[0].ap == pytest.approx(report.reference.ap, abs=1.0)


def test_the_gate_names_what_is_missing(own_ground_truth, tmp_path):
    checkpoint, annotations = own_ground_truth
    reference = Predictor.from_checkpoint(checkpoint, device="cpu")
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        accuracy_gate(reference, {}, PHOTOS, tmp_path / "nothing.json")
    with pytest.raises(FileNotFoundError, match=r"3 images of .*own.json are not in"):
        accuracy_gate(reference, {}, tmp_path, annotations)


def test_int8_files_are_written_beside_the_fp32_one_and_gated_too(own_ground_truth, tmp_path):
    pytest.importorskip("openvino")
    if importlib.util.find_spec("nncf") is None:
        pytest.skip("nncf is not installed")
    checkpoint, annotations = own_ground_truth
    out = tmp_path / "tiny.xml"
    # a lenient gate: the tiny random model's AP under INT8 is not the point here, the table and files are.
    # NNCF runs in a process of its own, as a user runs detr-export: it leaves threads and native state behind in
    # the process that imported it, which the rest of the suite should not share.
    run = subprocess.run([
        sys.executable, str(REPO / "tools" / "export.py"), str(checkpoint), "--format", "openvino", "--out", str(out),
        "--int8", "--calibration", str(PHOTOS), "--evaluate", str(PHOTOS), str(annotations), "--max-ap-drop", "100"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=1200)
    printed = run.stdout
    assert run.returncode == 0, printed + run.stderr
    # N11: NNCF's ~150 INFO lines and progress bars stay off the console; the command says what it does
    assert "nncf" not in (printed + run.stderr).lower().replace("(convolutions, nncf)", "")
    assert "quantising to INT8 (convolutions, NNCF) on" in printed and len((printed + run.stderr).splitlines()) < 40
    assert out.is_file() and (tmp_path / "tiny-int8.xml").is_file() and (tmp_path / "tiny-int8.bin").is_file()
    count = len([p for p in PHOTOS.iterdir() if p.suffix in (".png", ".jpg")])
    assert f"tiny-int8.xml: INT8 convolutions calibrated on {count} images" in printed
    rows = [line for line in printed.splitlines() if line.startswith(("pytorch", "tiny"))]
    assert [row.split(":")[0] for row in rows[1:]] == ["tiny.xml", "tiny-int8.xml"]
    assert "openvino (CPU, int8)" in rows[2]


def test_int8_needs_calibration_images_and_a_quantisable_format(tmp_path, capsys):
    export = load_script("tools/export.py").main
    with pytest.raises(SystemExit):
        export(["detr-r50", "--out", str(tmp_path / "m.onnx"), "--int8"])
    assert "--int8 needs --calibration IMAGES" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export(["detr-r50", "--format", "pt2", "--out", str(tmp_path / "m.pt2"), "--int8", "--calibration", "x"])
    assert "--int8 quantises an .onnx or .xml file" in capsys.readouterr().err


def test_int8_scope_all_quantises_the_matrix_products_too(own_ground_truth, tmp_path, capsys):
    """--int8-scope all (for ViT models, whose arithmetic is matrix products): the INT8 file's matrix products read
    dequantised int8 inputs, where the default scope keeps them fp32."""
    onnx = pytest.importorskip("onnx")
    checkpoint, _ = own_ground_truth
    export = load_script("tools/export.py").main

    def quantised_products(path: Path) -> int:
        graph = onnx.load(path).graph
        dequantised = {output for node in graph.node if node.op_type == "DequantizeLinear" for output in node.output}
        return sum(node.op_type in ("MatMul", "Gemm") and node.input[0] in dequantised for node in graph.node)

    for scope, folder in (("convolutions", tmp_path / "convolutions"), ("all", tmp_path / "all")):
        folder.mkdir()
        assert export([str(checkpoint), "--format", "onnx", "--out", str(folder / "tiny.onnx"), "--int8",
                       "--int8-scope", scope, "--calibration", str(PHOTOS), "--calibration-size", "2"]) == 0
    assert "INT8 convolutions and matrix products calibrated on 2 images" in capsys.readouterr().out
    assert quantised_products(tmp_path / "convolutions" / "tiny-int8.onnx") == 0
    assert quantised_products(tmp_path / "all" / "tiny-int8.onnx") > 0


@pytest.mark.parametrize("max_ap_drop", [float("nan"), -1.0, float("inf")])
def test_an_ap_drop_that_is_not_a_bound_is_refused_before_any_evaluation(max_ap_drop):
    """EX7: max_ap_drop NaN passed every file (no drop is greater than NaN): the gate was off, exit 0."""
    from detr.inference.gate import GateReport, GateRow

    with pytest.raises(ValueError, match="max_ap_drop is in AP points"):
        accuracy_gate(None, {}, "never-read", "never-read.json", max_ap_drop=max_ap_drop)  # type: ignore[arg-type]
    row = GateRow(name="model", path=None, ap=40.0, ap50=60.0, latency_median=1.0, latency_p95=1.0)
    with pytest.raises(ValueError, match="max_ap_drop"):
        GateReport(reference=row, max_ap_drop=max_ap_drop)


def test_the_gate_reads_images_by_the_data_sets_file_name_rule(tmp_path: Path) -> None:
    """A file_name outside the images folder is refused before any model runs, naming the json and the image."""
    (tmp_path / "images").mkdir()
    annotations = tmp_path / "instances.json"
    annotations.write_text(json.dumps({
        "images": [{"id": 3, "file_name": "../secret.jpg", "height": 8, "width": 8}],
        "annotations": [{"id": 1, "image_id": 3, "bbox": [1, 1, 2, 2], "category_id": 1, "area": 4, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "thing"}]}))
    with pytest.raises(ValueError, match=r"instances.json': image file_name '\.\./secret.jpg' \(image id 3\)"):
        accuracy_gate(None, {}, tmp_path / "images", annotations, progress=False)  # type: ignore[arg-type]
