"""RT-DETR's and D-FINE's training augmentations (detr.data.transforms: RandomZoomOut, RandomIoUCrop,
photometric_distort, make_rtdetr_train_transform), the multi-scale collate and the stop epoch
(detr.data.collate.MultiScaleCollate, detr.data.training_epoch), on coco-mini's images and boxes and the photos."""

from __future__ import annotations

from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from detr.data.coco import CocoDetection
from detr.data.collate import MultiScaleCollate, collate_detection
from detr.data.images import decode_image
from detr.data.training_epoch import SharedEpoch, StopAtEpoch
from detr.data.transforms import (
    RandomIoUCrop,
    RandomZoomOut,
    make_rtdetr_train_transform,
    make_square_transform,
    photometric_distort,
    reseed_transform,
)

REPO = Path(__file__).resolve().parents[2]
COCO_MINI = REPO / "data" / "coco-mini"
PHOTO = REPO / "data" / "photos" / "astronaut.png"
BOXES_XYXY = A.BboxParams(format="pascal_voc", label_fields=["labels"], min_width=1.0, min_height=1.0)


@pytest.fixture(scope="module")
def coco_samples() -> list:
    """The first eight training images of coco-mini with their boxes (1 to 26 per image)."""
    dataset = CocoDetection(COCO_MINI / "train2017", COCO_MINI / "annotations" / "instances_train2017.json")
    return [dataset.raw_sample(index) for index in range(8)]


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return decode_image(PHOTO).pixels


def seeded(transforms: list, seed: int, bbox_params: A.BboxParams | None = BOXES_XYXY) -> A.Compose:
    compose = A.Compose(transforms, bbox_params=bbox_params)
    reseed_transform(compose, seed)
    return compose


def coordinate_image(height: int, width: int) -> np.ndarray:
    """float32 [H, W, 3]: channel 0 = x, channel 1 = y, so a crop's pixels say where it came from."""
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([xs, ys, np.zeros_like(xs)], axis=-1)


def test_zoom_out_puts_the_image_on_a_larger_black_canvas(photo: np.ndarray) -> None:
    height, width = photo.shape[:2]
    boxes = np.array([[0, 0, width, height], [100, 50, 300, 400]], np.float32)
    zoom = seeded([RandomZoomOut(p=1.0)], seed=0)
    ratios = []
    for _ in range(8):
        out = zoom(image=photo, bboxes=boxes, labels=[0, 1])
        canvas, moved = out["image"], np.asarray(out["bboxes"])
        ratios.append(canvas.shape[1] / width)
        assert width <= canvas.shape[1] < 4 * width + 1 and height <= canvas.shape[0] < 4 * height + 1
        assert abs(canvas.shape[1] / width - canvas.shape[0] / height) < 2 / min(height, width)  # one ratio
        left, top = moved[0, :2]
        np.testing.assert_allclose(moved - [left, top, left, top], boxes, atol=1e-3)  # moved, not resized
        left, top = int(round(left)), int(round(top))
        placed = canvas[top:top + height, left:left + width]
        np.testing.assert_array_equal(placed, photo)
        outside = canvas.astype(np.int64).sum() - placed.astype(np.int64).sum()
        assert outside == 0  # fill 0 everywhere else
    assert max(ratios) > 2  # drawn from (1, 4)


def test_iou_crop_keeps_the_boxes_whose_centres_it_holds(coco_samples: list) -> None:
    """With minimum IoUs {0.7, 1}: each crop holds a box centre and has IoU >= 0.7 with one such box; exactly the
    boxes with their centre strictly inside survive, clipped to the crop; the "1" draws leave the image as it is."""
    crop = seeded([RandomIoUCrop(min_ious=(0.7, 1.0), p=1.0)], seed=1)
    cropped = whole = 0
    for sample in coco_samples:
        height, width = sample.pixels.shape[:2]
        boxes = sample.boxes_xyxy
        for _ in range(6):
            out = crop(image=coordinate_image(height, width), bboxes=boxes, labels=np.arange(len(boxes)))
            image, kept = out["image"], np.asarray(out["labels"]).astype(int)
            left, top = int(image[0, 0, 0]), int(image[0, 0, 1])
            right, bottom = left + image.shape[1], top + image.shape[0]
            if (left, top, right, bottom) == (0, 0, width, height):
                whole += 1
                assert kept.tolist() == list(range(len(boxes)))
                continue
            cropped += 1
            assert image.shape[1] >= int(0.3 * width) and image.shape[0] >= int(0.3 * height)
            assert 0.5 <= image.shape[1] / image.shape[0] <= 2.0
            centres = (boxes[:, :2] + boxes[:, 2:]) / 2
            inside = ((left < centres[:, 0]) & (centres[:, 0] < right) & (top < centres[:, 1])
                      & (centres[:, 1] < bottom))
            clipped = np.clip(boxes, [left, top, left, top], [right, bottom, right, bottom])
            big_enough = (clipped[:, 2:] - clipped[:, :2] >= 1).all(axis=1)
            assert kept.tolist() == np.flatnonzero(inside & big_enough).tolist()
            np.testing.assert_allclose(np.asarray(out["bboxes"]), clipped[kept] - [left, top, left, top], atol=1e-3)
            window = torch.tensor([[left, top, right, bottom]], dtype=torch.float32)
            assert box_iou(torch.from_numpy(boxes[inside]), window).max() >= 0.7 - 1e-6
    assert cropped > 5 and whole > 5


def test_iou_crop_leaves_an_image_without_boxes_as_it_is(photo: np.ndarray) -> None:
    out = seeded([RandomIoUCrop(p=1.0)], seed=0)(image=photo, bboxes=np.zeros((0, 4), np.float32), labels=[])
    np.testing.assert_array_equal(out["image"], photo)
    with pytest.raises(ValueError, match="must include 1.0"):
        RandomIoUCrop(min_ious=(0.3, 0.5))


def test_photometric_distortion_stays_uint8_and_draws_each_step_on_its_own(photo: np.ndarray) -> None:
    np.testing.assert_array_equal(seeded([photometric_distort(p=0.0)], 0, None)(image=photo)["image"], photo)
    distort = seeded([photometric_distort(p=0.5)], seed=0, bbox_params=None)
    unchanged = 0
    for _ in range(200):
        out = distort(image=photo)["image"]
        assert out.dtype == np.uint8 and out.shape == photo.shape
        unchanged += np.array_equal(out, photo)
    # all five steps skipped (or the channels permuted into their own order): 0.5^4 × (0.5 + 0.5 / 6) ≈ 3.6 %.
    # Steps that decided alike (one generator seed each) would leave about half the images unchanged.
    assert unchanged < 20


def test_reseeded_steps_draw_from_one_stream() -> None:
    """Two p = 0.5 flips of a reseeded pipeline take all four combinations (albumentations' own
    set_random_seed gives both the same seed: they would always agree)."""
    image = np.arange(12, dtype=np.uint8).reshape(3, 4, 1)
    flips = seeded([A.HorizontalFlip(p=0.5), A.VerticalFlip(p=0.5)], seed=4, bbox_params=None)
    counts: dict[tuple[bool, bool], int] = {}
    for _ in range(400):
        out = flips(image=image)["image"]
        key = (bool(out[0, 0, 0] in (3, 11)), bool(out[0, 0, 0] in (8, 11)))  # (mirrored, upside down)
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 4 and min(counts.values()) > 60


def test_the_pipeline_keeps_every_box_on_its_object(coco_samples: list) -> None:
    """coco-mini's images and boxes through the whole pipeline: each box also travels as a mask of its pixels, and
    every surviving box is still the bounding box of its mask, inside the square and at least 1 px a side."""
    size = 320
    transform = make_rtdetr_train_transform(size, seed=7)
    checked = 0
    for sample in coco_samples:
        boxes = sample.boxes_xyxy[:12]
        masks = []
        for x0, y0, x1, y1 in boxes:
            mask = np.zeros(sample.pixels.shape[:2], np.uint8)
            mask[int(y0):int(np.ceil(y1)), int(x0):int(np.ceil(x1))] = 1
            masks.append(mask)
        for _ in range(3):
            out = transform(image=sample.pixels, masks=masks, bboxes=boxes, labels=np.arange(len(boxes)))
            image, kept = out["image"], np.asarray(out["labels"]).astype(int)
            out_boxes = np.asarray(out["bboxes"], np.float32).reshape(-1, 4)
            assert image.shape == (3, size, size) and image.dtype == torch.float32
            assert 0 <= image.min() and image.max() <= 1
            assert len(out_boxes) == len(kept) and len(set(kept.tolist())) == len(kept)
            assert (out_boxes >= 0).all() and (out_boxes <= size).all()
            assert (out_boxes[:, 2:] - out_boxes[:, :2] >= 1 - 1e-4).all()
            for box, index in zip(out_boxes, kept, strict=True):
                ys, xs = np.nonzero(np.asarray(out["masks"][index]))
                if min(box[2] - box[0], box[3] - box[1]) < 4 or len(xs) == 0:
                    continue  # a thin box's mask may vanish in the nearest-neighbour resize
                from_mask = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
                np.testing.assert_allclose(box, from_mask, atol=4.0)  # a pixel, times up to ~3 of upscaling
                checked += 1
    assert checked > 40


def test_the_pipeline_is_reproducible_with_a_seed(coco_samples: list) -> None:
    def run(seed: int) -> list:
        transform = make_rtdetr_train_transform(256, seed=seed)
        return [transform(image=s.pixels, bboxes=s.boxes_xyxy, labels=s.labels) for s in coco_samples[:4]]

    first, again, other = run(3), run(3), run(4)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a["image"], b["image"]) and np.array_equal(np.asarray(a["bboxes"]), np.asarray(b["bboxes"]))
    assert any(not torch.equal(a["image"], c["image"]) for a, c in zip(first, other, strict=True))


def test_without_augment_it_is_the_flip_and_the_resize(coco_samples: list) -> None:
    plain = make_rtdetr_train_transform(192, augment=False, seed=0)
    resize = make_square_transform(192, train=False)
    flipped = 0
    for sample in coco_samples:
        for _ in range(2):
            out = plain(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels)["image"]
            reference = resize(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels)["image"]
            mirrored = not torch.allclose(out, reference, atol=2 / 255)
            flipped += mirrored
            if mirrored:
                torch.testing.assert_close(out, reference.flip(-1), atol=2 / 255, rtol=0)
    assert 0 < flipped < 16


def test_stop_at_epoch_switches_with_the_shared_epoch(coco_samples: list) -> None:
    epoch = SharedEpoch()
    switch = StopAtEpoch(make_rtdetr_train_transform(128), make_square_transform(128, train=False), stop_epoch=2,
                         epoch=epoch)
    sample = coco_samples[1]
    reference = make_square_transform(128, train=False)(image=sample.pixels, bboxes=sample.boxes_xyxy,
                                                          labels=sample.labels)["image"]
    reseed_transform(switch, 0)
    before = [switch(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels)["image"] for _ in range(4)]
    assert not all(torch.equal(image, reference) for image in before)
    epoch.set(2)
    assert torch.equal(switch(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels)["image"], reference)


def square_samples(count: int, side: int) -> list:
    generator = torch.Generator().manual_seed(0)
    return [(torch.rand(3, side, side, generator=generator),
             {"boxes_xyxy": torch.tensor([[8.0, 16.0, 40.0, 60.0]]), "labels": torch.tensor([index]),
              "size": torch.tensor([side, side])}) for index in range(count)]


def test_multi_scale_batches_take_the_drawn_square() -> None:
    samples = square_samples(2, 64)
    base_images, _, base_targets = collate_detection(samples)
    collate = MultiScaleCollate([32, 64, 96, 96])
    torch.manual_seed(0)
    sides = []
    for _ in range(40):
        images, mask, targets = collate(samples)
        side = images.shape[-1]
        sides.append(side)
        assert images.shape == (2, 3, side, side) and mask.shape == (2, side, side) and not mask.any()
        torch.testing.assert_close(images, F.interpolate(base_images, size=(side, side), mode="nearest"))
        for target, base in zip(targets, base_targets, strict=True):
            assert target["size"].tolist() == [side, side]
            torch.testing.assert_close(target["boxes"], base["boxes"])  # normalised: the same boxes
    assert set(sides) == {32, 64, 96} and sides.count(96) > sides.count(32)  # 96 listed twice
    torch.manual_seed(0)
    assert [collate(samples)[0].shape[-1] for _ in range(40)] == sides  # torch's generator: seeded, reproducible


def test_multi_scale_stops_at_the_stop_epoch() -> None:
    epoch = SharedEpoch(3)
    collate = MultiScaleCollate([32, 96], stop_epoch=3, epoch=epoch)
    samples = square_samples(2, 64)
    assert {collate(samples)[0].shape[-1] for _ in range(10)} == {64}
    epoch.set(2)
    assert {collate(samples)[0].shape[-1] for _ in range(20)} == {32, 96}
