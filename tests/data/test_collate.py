"""Batching: bottom/right zero padding, True-on-padding mask, normalised cxcywh boxes of the unpadded image."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_convert

from detr.data.collate import collate_detection, normalize_boxes, pad_images


def sample(height: int, width: int, boxes_xyxy: list[list[float]], image_id: int) -> tuple[torch.Tensor, dict]:
    image = torch.rand(3, height, width) + 1.0  # never zero, so padding is recognisable
    target = {
        "boxes_xyxy": torch.tensor(boxes_xyxy, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.arange(len(boxes_xyxy), dtype=torch.int64),
        "image_id": torch.tensor(image_id),
        "orig_size": torch.tensor([height * 2, width * 2]),
        "size": torch.tensor([height, width]),
    }
    return image, target


def test_padding_and_mask() -> None:
    samples = [sample(20, 30, [[0, 0, 10, 10]], 1), sample(25, 12, [], 2)]
    images, mask, targets = collate_detection(samples)
    assert images.shape == (2, 3, 25, 30) and mask.shape == (2, 25, 30) and mask.dtype == torch.bool
    torch.testing.assert_close(images[0, :, :20, :30], samples[0][0])
    torch.testing.assert_close(images[1, :, :25, :12], samples[1][0])
    assert (images[0, :, 20:] == 0).all() and (images[1, :, :, 12:] == 0).all()
    assert not mask[0, :20, :30].any() and mask[0, 20:].all()
    assert not mask[1, :, :12].any() and mask[1, :, 12:].all()
    assert [int(t["image_id"]) for t in targets] == [1, 2]


def test_boxes_become_normalised_cxcywh_of_the_unpadded_image() -> None:
    images, _, targets = collate_detection([sample(100, 50, [[10, 20, 30, 60]], 1), sample(200, 300, [], 2)])
    assert "boxes_xyxy" not in targets[0]
    torch.testing.assert_close(targets[0]["boxes"], torch.tensor([[20 / 50, 40 / 100, 20 / 50, 40 / 100]]))
    assert targets[1]["boxes"].shape == (0, 4) and targets[1]["boxes"].dtype == torch.float32
    assert targets[1]["labels"].shape == (0,) and targets[1]["labels"].dtype == torch.int64
    assert targets[0]["orig_size"].tolist() == [200, 100] and targets[0]["size"].tolist() == [100, 50]


def test_round_trip_to_pixels() -> None:
    boxes = torch.tensor([[1.5, 2.0, 40.0, 33.0], [0.0, 0.0, 64.0, 48.0]])
    normalised = normalize_boxes(boxes, torch.tensor([48, 64]))
    back = box_convert(normalised, "cxcywh", "xyxy") * torch.tensor([64, 48, 64, 48])
    torch.testing.assert_close(back, boxes)


def test_predict_samples_pass_file_name() -> None:
    image = torch.rand(3, 8, 9)
    target = {"image_id": torch.tensor(0), "orig_size": torch.tensor([8, 9]), "size": torch.tensor([8, 9]),
              "file_name": "a.jpg"}
    images, mask, targets = collate_detection([(image, target)])
    assert images.shape == (1, 3, 8, 9) and not mask.any()
    assert targets[0]["file_name"] == "a.jpg" and "boxes" not in targets[0]


def test_pad_images_errors() -> None:
    with pytest.raises(ValueError, match="zero images"):
        pad_images([])
    with pytest.raises(ValueError, match="same C"):
        pad_images([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)])
