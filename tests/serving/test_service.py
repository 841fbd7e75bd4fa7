"""DetectionService in-process on the other kinds of checkpoint detr-serve takes: a panoptic model (every task,
segments and the COCO panoptic PNG in the JSON) and exported files (.onnx through ONNX Runtime, .xml through
OpenVINO); results equal the
Predictor's, a batch of mixed sizes gives what each image gives alone, and non-finite outputs fail only the
images they belong to; a keypoint prediction's points go into its detections' JSON."""

from __future__ import annotations

import base64
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr.categories import coco_panoptic_category_map, coco_panoptic_is_thing
from detr.checkpoints import save_checkpoint
from detr.inference.postprocess_masks import rgb_to_id_map
from detr.inference.prediction import Prediction
from detr.inference.predictor import NonFiniteOutputError, Predictor
from detr.models.config import ModelMeta
from detr.serving import DetectionService, Job, load_service
from detr.serving.inputs import decode_image_bytes
from detr.serving.service import ModelOutputError, prediction_json
from tests.helpers import tiny_coco_panoptic
from tests.serving.helpers import spread_out_model

pytestmark = pytest.mark.usefixtures("one_thread")

PHOTOS = Path(__file__).resolve().parents[2] / "data" / "photos"


def png_of(data_url: str) -> np.ndarray:
    assert data_url.startswith("data:image/png;base64,")
    return np.array(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


def test_panoptic_model_serves_every_task(tmp_path: Path) -> None:
    model = tiny_coco_panoptic()
    model.meta = ModelMeta(category_map=coco_panoptic_category_map(), is_thing=coco_panoptic_is_thing(),
                           eval_size=(64, 100))
    checkpoint = save_checkpoint(model, tmp_path / "panoptic.ckpt")
    service = load_service(checkpoint, device="cpu", threshold=0.5)
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu", threshold=0.5)
    pixels = decode_image_bytes((PHOTOS / "chelsea.png").read_bytes())
    jobs = [Job(pixels, 0.5, task) for task in ("detection", "instances", "panoptic")]
    responses = service.run_batch(jobs)
    expected = predictor.predict(pixels, task="panoptic")[0]
    assert len(expected) > 0 and expected.panoptic.segments_info
    for response in responses:
        assert [d["query"] for d in response["detections"]] == expected.query_indices.tolist()
        for detection, mask in zip(response["detections"], expected.masks):
            np.testing.assert_array_equal(png_of(detection["mask"]) > 0, mask.numpy())
    panoptic = responses[2]["panoptic"]
    assert "panoptic" not in responses[0] and "panoptic" not in responses[1]
    assert [s["id"] for s in panoptic["segments"]] == [s["id"] for s in expected.panoptic.segments_info]
    assert panoptic["segments"][0]["label_name"] == expected.panoptic.segments_info[0]["label_name"]
    id_map = rgb_to_id_map(torch.from_numpy(png_of(panoptic["png"])))
    assert torch.equal(id_map, expected.panoptic.id_map)


def test_a_batch_of_mixed_sizes_gives_what_each_image_gives_alone(tmp_path: Path) -> None:
    checkpoint = save_checkpoint(spread_out_model(), tmp_path / "tiny.ckpt")
    service = load_service(checkpoint, device="cpu", threshold=0.3)
    photos = [decode_image_bytes((PHOTOS / name).read_bytes()) for name in ("chelsea.png", "astronaut.png")]
    jobs = [Job(photos[0], 0.3, "detection"), Job(photos[1], 0.3, "detection"), Job(photos[0], 0.6, "detection"),
            Job(photos[0], 0.3, "detection")]
    together = service.run_batch(jobs)
    alone = [service.run_batch([job])[0] for job in jobs]
    for batched, single in zip(together, alone):
        assert [d["query"] for d in batched["detections"]] == [d["query"] for d in single["detections"]]
        np.testing.assert_allclose([d["score"] for d in batched["detections"]],
                                   [d["score"] for d in single["detections"]], atol=1e-5)
    assert together[2]["threshold"] == 0.6 and len(together[2]["detections"]) < len(together[0]["detections"])


@pytest.mark.slow  # the ONNX export: ~30 s on 2 shared cores
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_exported_file_is_served_through_its_runtime(tmp_path: Path, runtime: str) -> None:
    pytest.importorskip(runtime)
    pytest.importorskip("onnxscript")
    from detr.checkpoints.export import export_onnx, export_openvino

    name = "tiny.onnx" if runtime == "onnxruntime" else "tiny.xml"
    path = (export_onnx if runtime == "onnxruntime" else export_openvino)(spread_out_model(), tmp_path / name)
    service = load_service(path, device="cpu", threshold=0.3)
    assert service.predictor.backend.startswith(runtime)
    pixels = decode_image_bytes((PHOTOS / "chelsea.png").read_bytes())
    response = service.run_batch([Job(pixels, 0.3, "detection")])[0]
    expected = Predictor.from_checkpoint(path, device="cpu", threshold=0.3).predict(pixels)[0]
    assert response["model"] == name and response["detections"]
    assert [d["query"] for d in response["detections"]] == expected.query_indices.tolist()
    assert [d["category_name"] for d in response["detections"]] == expected.label_names
    np.testing.assert_allclose([d["score"] for d in response["detections"]], expected.scores.numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="ONNX" if runtime == "onnxruntime" else "OpenVINO"):
        service.check_task("panoptic")


def test_non_finite_outputs_fail_only_their_images(tmp_path: Path, monkeypatch) -> None:
    """When the model's outputs are not finite for some images of a group only, those images fail (500) and
    the others are run again and answered as usual."""
    service = DetectionService(Predictor(spread_out_model(), device="cpu", threshold=0.3), model_name="tiny")
    pixels = decode_image_bytes((PHOTOS / "chelsea.png").read_bytes())
    expected = service.run_batch([Job(pixels, 0.3, "detection")])[0]
    predict_arrays = service.predictor.predict_arrays
    calls = []

    def second_image_not_finite(arrays, **options):
        calls.append(len(arrays))
        if len(arrays) == 3:
            raise NonFiniteOutputError([1], len(arrays))
        return predict_arrays(arrays, **options)

    monkeypatch.setattr(service.predictor, "predict_arrays", second_image_not_finite)
    results = service.run_batch([Job(pixels, 0.3, "detection")] * 3)
    assert calls == [3, 1, 1]
    assert isinstance(results[1], ModelOutputError) and "not finite" in str(results[1])
    assert results[0] == expected and results[2] == expected


def test_the_json_of_a_keypoint_prediction_holds_each_detections_points() -> None:
    points = torch.tensor([[[10.0, 12.0, 0.75], [30.0, 12.0, 0.25]], [[50.0, 5.0, 0.5], [0.0, 0.0, 0.0]]])
    prediction = Prediction(boxes=torch.tensor([[5.0, 5.0, 35.0, 35.0], [45.0, 2.0, 60.0, 12.0]]),
                            scores=torch.tensor([0.75, 0.5]), labels=torch.tensor([0, 1]),
                            label_names=["class 0", "class 1"], query_indices=torch.tensor([4, 7]),
                            image_size=(40, 64), keypoints=points)
    response = prediction_json(prediction, category_map=None, model_name="tiny", task="detection", threshold=0.3)
    assert [d["keypoints"] for d in response["detections"]] == points.tolist()
    counted = prediction_json(replace(prediction, keypoint_counts=(2, 1)), category_map=None, model_name="tiny",
                              task="detection", threshold=0.3)  # each class's own points, as the model gives them
    assert [d["keypoints"] for d in counted["detections"]] == [points[0].tolist(), points[1, :1].tolist()]
    assert response["detections"][0]["box_xyxy"] == [5, 5, 35, 35]
    plain = prediction_json(replace(prediction, keypoints=None), category_map=None, model_name="tiny",
                            task="detection", threshold=0.3)
    assert all("keypoints" not in d for d in plain["detections"])
