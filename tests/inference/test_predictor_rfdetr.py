"""The Predictor on a transformers RF-DETR directory gives what transformers' own pipeline gives on the same photos:
``RfDetrImageProcessor`` at a square size (bilinear on floats, ImageNet mean and std) → ``RfDetrForObjectDetection``
→ ``post_process_object_detection`` (the top num_queries (query, class) pairs by sigmoid score, above the
threshold); with ``RfDetrForInstanceSegmentation``, each detection's mask too. The Predictor clips boxes to the
image; transformers does not, so its boxes are clipped here before comparing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import detr
from tests.helpers import REPO
from tests.helpers_rfdetr import hf_model

transformers = pytest.importorskip("transformers")

PHOTOS = ("chelsea.png", "000000039769.png")  # square and 4:3, both resized to the square
SIZE = 112  # a multiple of 14 × 2 windows, small enough for a fast test
THRESHOLD = 0.5


def _run(tmp_path, masks: bool):
    hf = hf_model(80, masks=masks, seed=1)
    hf.save_pretrained(tmp_path)
    transformers.RfDetrImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(tmp_path)
    processor = transformers.RfDetrImageProcessor.from_pretrained(tmp_path)
    predictor = detr.Predictor.from_checkpoint(tmp_path, device="cpu", batch_size=len(PHOTOS))
    spec = predictor.input_spec
    assert (spec.resize, spec.size, spec.interpolation) == ("square", SIZE, "float_bilinear")
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
        assert prediction.query_indices.max() < predictor.model.num_queries
    return predictions, outputs, sizes


def test_predictor_equals_transformers_processor_and_post_processing(tmp_path):
    predictions, _, _ = _run(tmp_path, masks=False)
    assert all(prediction.masks is None for prediction in predictions)


def test_instance_masks_match_transformers_masks(tmp_path):
    """Each detection's mask against transformers' rule for the same query (its mask logits, bilinear to the
    image, > 0): the Predictor thresholds at the input size and resizes the binary mask (nearest), so only
    pixels on a mask's border may differ."""
    predictions, outputs, sizes = _run(tmp_path, masks=True)
    for index, (prediction, (height, width)) in enumerate(zip(predictions, sizes)):
        logits = outputs.pred_masks[index, prediction.query_indices]
        theirs = F.interpolate(logits[:, None], size=(height, width), mode="bilinear", align_corners=False)[:, 0] > 0
        assert prediction.masks.shape == theirs.shape and prediction.masks.dtype == torch.bool
        agreement = (prediction.masks == theirs).float().mean(dim=(1, 2))
        assert agreement.min() >= 0.97, agreement
        assert theirs.any(dim=(1, 2)).any()  # some mask is not empty: the comparison is not between blanks
