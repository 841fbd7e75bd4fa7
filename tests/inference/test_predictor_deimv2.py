"""The Predictor on a transformers DEIMv2 directory gives what transformers' own pipeline gives on the same photos:
the processor DEIMv2's hub models ship (``AutoImageProcessor`` of model_type "deimv2": RT-DETR's, a 640 square,
pixels / 255) → ``Deimv2ForObjectDetection`` → ``post_process_object_detection``. The Predictor runs the model
optimised (BatchNorms folded, RepVGG blocks fused) and clips boxes to the image; transformers does not clip, so its
boxes are clipped here before comparing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import detr
from tests.helpers import REPO
from tests.helpers_deimv2 import hf_model

transformers = pytest.importorskip("transformers")

PHOTOS = ("chelsea.png", "000000039769.png")  # square and 4:3, both upscaled or downscaled to 640
THRESHOLD = 0.5


@pytest.mark.parametrize("options", [{}, {"encoder_type": "lite", "use_gateway": False}], ids=["hybrid", "lite"])
def test_predictor_equals_transformers_processor_and_post_processing(tmp_path, options):
    hf = hf_model("hgnetv2_b0", 80, seed=1, **options)
    hf.save_pretrained(tmp_path)
    transformers.RTDetrImageProcessor().save_pretrained(tmp_path)  # the hub's: 640 × 640, no mean/std
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
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
        assert torch.equal(prediction.labels, theirs["labels"])
        assert float((prediction.scores - theirs["scores"]).abs().max()) <= 1e-4
        clipped = torch.stack([theirs["boxes"][:, 0].clamp(0, width), theirs["boxes"][:, 1].clamp(0, height),
                               theirs["boxes"][:, 2].clamp(0, width), theirs["boxes"][:, 3].clamp(0, height)], -1)
        assert float((prediction.boxes - clipped).abs().max()) <= 1e-2  # pixels, of images up to 640 wide
        assert prediction.query_indices.max() < predictor.model.num_queries
