"""detr-serve's ?prompt= (in-process, FastAPI's TestClient): a Grounding DINO checkpoint answers /predict with the
Predictor's boxes, scores and phrases for the prompt; a prompted model without one, or a model that reads none
given one, is a 422 JSON naming ?prompt=; the endpoints that take no prompt refuse a prompted model by name."""

from __future__ import annotations

import pytest
import torch

from detr.inference.predictor import Predictor
from detr.serving.app import create_app
from detr.serving.service import DetectionService
from tests.helpers import REPO

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("httpx")  # FastAPI's TestClient
from fastapi.testclient import TestClient  # noqa: E402


PHOTO = REPO / "data" / "photos" / "000000039769.png"
PROMPT = "a cat. a remote control."


def _client(predictor: Predictor, name: str) -> TestClient:
    return TestClient(create_app(DetectionService(predictor, model_name=name)))


def _refused(response, kind: str, named: str) -> None:
    assert response.status_code == 422, response.text
    assert response.json()["error"] == kind and named in response.json()["detail"], response.json()


def test_prompt_gives_the_predictors_boxes_scores_and_phrases(grounding_directory):
    predictor = Predictor.from_checkpoint(grounding_directory, device="cpu")
    expected = predictor.predict(PHOTO, prompt=PROMPT, threshold=0.1, text_threshold=0.3)[0]
    with _client(predictor, "gdino") as http:
        response = http.post("/predict", params={"prompt": PROMPT, "threshold": 0.1, "text_threshold": 0.3},
                             content=PHOTO.read_bytes())
        assert response.status_code == 200, response.text
        body = response.json()
        assert http.get("/health").json()["prompted"] is True
    assert body["prompt"] == PROMPT and body["phrases"] == ["a cat", "a remote control"]
    detections = body["detections"]
    assert len(detections) == len(expected) > 0
    assert [d["category_name"] for d in detections] == expected.label_names
    assert [d["label"] for d in detections] == expected.labels.tolist()
    torch.testing.assert_close(torch.tensor([d["score"] for d in detections]), expected.scores, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor([d["box_xyxy"] for d in detections]), expected.boxes, atol=1e-3,
                               rtol=0)


def test_a_prompted_model_without_a_prompt_names_it(grounding_directory):
    with _client(Predictor.from_checkpoint(grounding_directory, device="cpu"), "gdino") as http:
        _refused(http.post("/predict", content=PHOTO.read_bytes()), "prompt_required", "?prompt=")
        _refused(http.post("/predict", params={"prompt": "a cat.. a dog."}, content=PHOTO.read_bytes()),
                 "bad_prompt", "empty phrase")
        _refused(http.post("/predict", params={"prompt": PROMPT, "text_threshold": 2},
                           content=PHOTO.read_bytes()), "bad_text_threshold", "text_threshold")
        _refused(http.post("/predict", params={"prompt": PROMPT, "slice": 64}, content=PHOTO.read_bytes()),
                 "bad_prompt", "slice")
        for endpoint in ("/explore", "/track", "/track/sessions"):
            _refused(http.post(endpoint, content=PHOTO.read_bytes()), "prompt_unsupported", "/predict?prompt=")


def test_a_model_that_reads_no_prompt_refuses_one():
    from detr.models.build import build_detr
    from tests.helpers import TINY

    with _client(Predictor(build_detr(TINY), device="cpu"), "tiny") as http:
        _refused(http.post("/predict", params={"prompt": PROMPT}, content=PHOTO.read_bytes()), "prompt_not_read",
                 "?prompt=")
        assert http.get("/health").json()["prompted"] is False
