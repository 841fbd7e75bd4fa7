"""detr.inference.gate and detr-export --evaluate: the AP of the exported file itself, beside its latency, against
the PyTorch model on a COCO-format set; a file that loses AP fails the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detr import Predictor
from detr.inference.gate import accuracy_gate
from tests.helpers import load_script, save_project_checkpoint
from tests.serving.helpers import spread_out_model

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

PHOTOS = Path(__file__).resolve().parents[2] / "data" / "photos"
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
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith(("pytorch", "onnx"))}
    assert set(rows) == {"pytorch", "onnxruntime"}
    assert float(rows["pytorch"][3]) == pytest.approx(100.0, abs=0.01)  # its own detections: AP 100
    assert float(rows["onnxruntime"][2]) == pytest.approx(100.0, abs=0.01)  # the file: the same AP
    assert "accuracy gate on 3 images" in printed and "size MB" in printed


def test_a_file_that_loses_ap_fails_the_gate(own_ground_truth, tmp_path):
    checkpoint, annotations = own_ground_truth
    reference = Predictor.from_checkpoint(checkpoint, device="cpu")
    other = Predictor(spread_out_model(seed=1), device="cpu")  # other weights: other boxes
    report = accuracy_gate(reference, {tmp_path / "other.onnx": other}, PHOTOS, annotations, progress=False)
    assert report.reference.ap == pytest.approx(100.0, abs=0.01)
    assert report.artifacts[0].ap < 50 and not report.passed and report.failed == report.artifacts
    assert report.reference.latency_median > 0 and report.reference.size_bytes is None
    lenient = accuracy_gate(reference, {tmp_path / "other.onnx": other}, PHOTOS, annotations, progress=False,
                            max_ap_drop=100.0)
    assert lenient.passed


def test_the_gate_names_what_is_missing(own_ground_truth, tmp_path):
    checkpoint, annotations = own_ground_truth
    reference = Predictor.from_checkpoint(checkpoint, device="cpu")
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        accuracy_gate(reference, {}, PHOTOS, tmp_path / "nothing.json")
    with pytest.raises(FileNotFoundError, match=r"3 images of .*own.json are not in"):
        accuracy_gate(reference, {}, tmp_path, annotations)
