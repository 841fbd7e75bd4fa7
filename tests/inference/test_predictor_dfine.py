"""The Predictor on a transformers D-FINE directory gives what transformers' own pipeline gives on the same
photos: ``RTDetrImageProcessor`` (the processor D-FINE's hub models ship: a 640 square, antialiased bilinear,
pixels / 255) → ``DFineForObjectDetection`` → ``post_process_object_detection`` (the top num_queries (query,
class) pairs by sigmoid score, above the threshold). The Predictor clips boxes to the image; transformers does
not, so its boxes are clipped here before comparing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import detr
from detr.checkpoints.export import pair_rows
from tests.helpers import REPO
from tests.helpers_dfine import hf_model

transformers = pytest.importorskip("transformers")

PHOTOS = ("chelsea.png", "000000039769.png")  # square and 4:3, both upscaled or downscaled to 640
THRESHOLD = 0.5


def test_predictor_equals_transformers_processor_and_post_processing(tmp_path):
    hf = hf_model("hgnetv2_b0", 80, seed=1, decoder_n_points=[3, 6, 3], hidden_expansion=0.5, depth_mult=0.34)
    hf.save_pretrained(tmp_path)
    transformers.RTDetrImageProcessor().save_pretrained(tmp_path)  # the hub's: 640 × 640, no mean/std
    processor = transformers.RTDetrImageProcessor.from_pretrained(tmp_path)
    predictor = detr.Predictor.from_checkpoint(tmp_path, device="cpu", batch_size=len(PHOTOS))
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
        clipped = torch.stack([theirs["boxes"][:, 0].clamp(0, width), theirs["boxes"][:, 1].clamp(0, height),
                               theirs["boxes"][:, 2].clamp(0, width), theirs["boxes"][:, 3].clamp(0, height)], -1)
        # two detections of one class whose scores tie to 1e-6 may come in either order (random weights make such
        # ties): rows are paired one to one before they are compared, as export verification pairs them
        ours = (prediction.labels[None, :, None].float(), prediction.scores[None, :, None], prediction.boxes[None])
        labels, scores, boxes = (rows[0] for rows in pair_rows(
            (theirs["labels"][None, :, None].float(), theirs["scores"][None, :, None], clipped[None]), ours))
        assert torch.equal(labels[:, 0], theirs["labels"].float())
        assert float((scores[:, 0] - theirs["scores"]).abs().max()) <= 1e-4
        assert float((boxes - clipped).abs().max()) <= 1e-2  # pixels, of images up to 640 wide
        assert prediction.query_indices.max() < predictor.model.num_queries
