"""detr-serve on a checkpoint of each real-time family (RT-DETR, D-FINE, DEIMv2 on DINOv3, RF-DETR with instance
masks), one server process per family: /predict on a photo equals the Predictor on the same file (queries, labels,
category ids, scores, boxes, and each detection's mask for the model that predicts masks), and /health lists the
tasks the model can do (instances only with masks; panoptic for none of them: no things and stuff)."""

from __future__ import annotations

import base64
import io
import json
import urllib.request

import numpy as np
import pytest
from PIL import Image

from detr.inference.predictor import Predictor
from tests.helpers import REPO
from tests.helpers_realtime import CONFIGS, tiny_checkpoint

PHOTO = REPO / "data" / "photos" / "chelsea.png"
THRESHOLD = 0.5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def served(request, load_tools, tmp_path_factory):
    """(checkpoint, running server) of one family; pytest runs every test of a family before the next starts."""
    folder = tmp_path_factory.mktemp(request.param)
    checkpoint = tiny_checkpoint(request.param, folder)
    with load_tools.running_server(checkpoint, folder / "server.log", "--threshold", str(THRESHOLD),
                                   threads=1) as server:
        yield checkpoint, server


def _post(url: str, body: bytes) -> dict:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/octet-stream"},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        return json.loads(response.read())


def _png(data_url: str) -> np.ndarray:
    assert data_url.startswith("data:image/png;base64,")
    return np.array(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


def test_served_detections_equal_the_predictor(served) -> None:
    checkpoint, server = served
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu", threshold=THRESHOLD)
    expected = predictor.predict(PHOTO)[0]
    response = _post(server.url + "/predict", PHOTO.read_bytes())
    assert response["model"] == checkpoint.name and response["image"] == {"width": 451, "height": 300}
    detections = response["detections"]
    assert len(detections) > 0, "the photo gave no detection to compare"
    assert [d["query"] for d in detections] == expected.query_indices.tolist()
    assert [d["label"] for d in detections] == expected.labels.tolist()
    assert [d["category_id"] for d in detections] == [predictor.category_map.category_ids[label]
                                                      for label in expected.labels.tolist()]
    assert [d["category_name"] for d in detections] == expected.label_names
    np.testing.assert_allclose([d["score"] for d in detections], expected.scores.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose([d["box_xyxy"] for d in detections], expected.boxes.numpy(), rtol=0, atol=1e-3)
    # the top-k (query, class) pairs: a query may be detected as two classes
    assert len(detections) <= predictor.model.detections_per_image
    if predictor.predicts_masks:
        assert expected.masks is not None and expected.masks.any()
        for detection, mask in zip(detections, expected.masks):
            np.testing.assert_array_equal(_png(detection["mask"]) > 0, mask.numpy())
    else:
        assert all("mask" not in d for d in detections)


def test_health_lists_the_tasks_the_model_can_do(served) -> None:
    checkpoint, server = served
    with urllib.request.urlopen(server.url + "/health", timeout=30) as response:
        health = json.loads(response.read())
    masks = Predictor.from_checkpoint(checkpoint, device="cpu").predicts_masks
    assert health["tasks"] == (["detection", "instances"] if masks else ["detection"])
    assert health["description"]
