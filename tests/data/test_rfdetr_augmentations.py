"""RF-DETR's training augmentation (detr.data.transforms.make_rfdetr_train_transform: the flip, then the square
resize or DETR's crop and the square resize, ImageNet's mean and std) and its bilinear multi-scale batches
(detr.data.collate.MultiScaleCollate(mode="bilinear")), on coco-mini's images and boxes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from detr.data.coco import CocoDetection
from detr.data.collate import MultiScaleCollate, collate_detection
from detr.data.transforms import make_rfdetr_train_transform

REPO = Path(__file__).resolve().parents[2]
COCO_MINI = REPO / "data" / "coco-mini"


def test_the_square_resize_or_the_crop_each_about_half_the_time() -> None:
    """Every output is the square with ImageNet's mean and std; a draw either keeps every box at the plain resize's
    place (flipped or not) or crops (boxes moved or dropped): both happen."""
    dataset = CocoDetection(COCO_MINI / "train2017", COCO_MINI / "annotations" / "instances_train2017.json")
    sample = dataset.raw_sample(0)
    height, width = sample.pixels.shape[:2]
    size = 224
    scale = np.array([size / width, size / height, size / width, size / height], np.float32)
    plain = sample.boxes_xyxy * scale
    flipped = plain[:, [2, 1, 0, 3]] * np.array([-1, 1, -1, 1], np.float32) + np.array([size, 0, size, 0], np.float32)
    transform = make_rfdetr_train_transform(size, seed=5)
    branches = []
    for _ in range(40):
        out = transform(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=np.arange(len(sample.boxes_xyxy)))
        image, boxes = out["image"], np.asarray(out["bboxes"], np.float32).reshape(-1, 4)
        assert image.shape == (3, size, size) and image.min() < 0  # normalised: mean subtracted
        assert (boxes >= 0).all() and (boxes <= size + 1e-3).all()
        resized = len(boxes) == len(plain) and any(np.allclose(boxes, ref, atol=0.05) for ref in (plain, flipped))
        branches.append(resized)
    assert 8 <= sum(branches) <= 32  # p = 0.5 each


def test_bilinear_multi_scale_batches_are_resized_as_the_authors_loop_does() -> None:
    generator = torch.Generator().manual_seed(0)
    samples = [(torch.rand(3, 64, 64, generator=generator),
                {"boxes_xyxy": torch.tensor([[8.0, 16.0, 40.0, 60.0]]), "labels": torch.tensor([0]),
                 "size": torch.tensor([64, 64])}) for _ in range(2)]
    base, _, _ = collate_detection(samples)
    collate = MultiScaleCollate([48, 96], mode="bilinear")
    torch.manual_seed(0)
    for _ in range(6):
        images, mask, targets = collate(samples)
        side = images.shape[-1]
        torch.testing.assert_close(images, F.interpolate(base, size=(side, side), mode="bilinear", align_corners=False))
        assert mask.shape == (2, side, side) and not mask.any() and targets[0]["size"].tolist() == [side, side]
    with pytest.raises(ValueError, match="mode must be"):
        MultiScaleCollate([48], mode="bicubic")
