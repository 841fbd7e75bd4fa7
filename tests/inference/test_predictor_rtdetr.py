"""The Predictor on a transformers RT-DETR directory gives what transformers' own pipeline gives on the same
photos: ``RTDetrImageProcessor`` (a 640 square, antialiased bilinear, pixels / 255) → the model →
``post_process_object_detection`` (the top num_queries (query, class) pairs by sigmoid score, above the
threshold). The Predictor clips boxes to the image (its predictions are drawn and written); transformers does
not, so its boxes are clipped here before comparing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import detr
from tests.helpers import REPO
from tests.helpers_rtdetr import hf_model

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchvision")

PHOTOS = ("chelsea.png", "astronaut.png", "000000039769.png")  # upscaled in both directions, square, 4:3
THRESHOLD = 0.5


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    path = tmp_path_factory.mktemp("rtdetr")
    hf = hf_model("resnet18", 80, seed=1)
    hf.save_pretrained(path)
    transformers.RTDetrImageProcessor().save_pretrained(path)  # the hub's: 640 × 640, no mean/std
    return path, hf


def test_predictor_equals_transformers_processor_and_post_processing(directory):
    path, hf = directory
    processor = transformers.RTDetrImageProcessor.from_pretrained(path)
    predictor = detr.Predictor.from_checkpoint(path, device="cpu", batch_size=len(PHOTOS))  # optimized, as users get it
    assert (predictor.input_spec.resize, predictor.input_spec.size) == ("square", 640)
    images = [np.asarray(Image.open(REPO / "data" / "photos" / name).convert("RGB")) for name in PHOTOS]
    predictions = predictor.predict(images, threshold=THRESHOLD)
    with torch.no_grad():
        inputs = processor(images=[Image.fromarray(image) for image in images], return_tensors="pt")
        outputs = hf(**inputs)
    sizes = [image.shape[:2] for image in images]
    expected = processor.post_process_object_detection(outputs, threshold=THRESHOLD, target_sizes=sizes)
    for prediction, theirs, (height, width) in zip(predictions, expected, sizes):
        assert len(prediction.scores) == len(theirs["scores"]) > 0
        assert torch.equal(prediction.labels, theirs["labels"])
        assert float((prediction.scores - theirs["scores"]).abs().max()) <= 1e-4
        clipped = torch.stack([theirs["boxes"][:, 0].clamp(0, width), theirs["boxes"][:, 1].clamp(0, height),
                               theirs["boxes"][:, 2].clamp(0, width), theirs["boxes"][:, 3].clamp(0, height)], -1)
        assert float((prediction.boxes - clipped).abs().max()) <= 1e-2  # pixels, of images up to 640 wide
        # top-k over queries × classes: each detection names the query it came from
        assert prediction.query_indices.max() < predictor.model.num_queries


def test_detr_predict_runs_on_a_transformers_directory(directory, tmp_path):
    from detr.commands import predict

    path, _ = directory
    status = predict.main([str(REPO / "data" / "photos" / PHOTOS[0]), "--checkpoint", str(path), "--out",
                           str(tmp_path), "--device", "cpu", "--threshold", str(THRESHOLD)])
    written = json.loads((tmp_path / "predictions.json").read_text())
    assert status == 0 and (tmp_path / "chelsea.jpg").is_file()
    # COCO results, one per (query, class) pair above the threshold, in the photo's pixels
    assert len(written) > 0 and all(row["score"] > THRESHOLD and row["file_name"] == PHOTOS[0] for row in written)
    assert max(row["bbox"][0] + row["bbox"][2] for row in written) <= 451 + 1e-3
