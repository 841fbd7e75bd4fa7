"""The authors' augmentation in albumentations: scales, max side, rounding, and boxes that follow the pixels."""

from __future__ import annotations

import albumentations as A
import numpy as np
import pytest
import torch

from detr.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    RandomSizeCrop,
    ShortestSideResize,
    make_eval_transform,
    make_normalize_transform,
    make_train_transform,
    reseed_transform,
    resize_shape,
)


def authors_get_size(image_size: tuple[int, int], size: int, max_size: int | None) -> tuple[int, int]:
    """facebookresearch/detr datasets/transforms.py get_size_with_aspect_ratio, verbatim logic."""
    w, h = image_size
    if max_size is not None:
        min_original_size = float(min((w, h)))
        max_original_size = float(max((w, h)))
        if max_original_size / min_original_size * size > max_size:
            size = int(round(max_size * min_original_size / max_original_size))
    if (w <= h and w == size) or (h <= w and h == size):
        return (h, w)
    if w < h:
        ow = size
        oh = int(size * h / w)
    else:
        oh = size
        ow = int(size * w / h)
    return (oh, ow)


def denormalize(image: torch.Tensor) -> np.ndarray:
    """float [3, h, w] normalised → float [h, w, 3] in 0..255."""
    pixels = image.permute(1, 2, 0).numpy()
    return (pixels * np.array(IMAGENET_STD, np.float32) + np.array(IMAGENET_MEAN, np.float32)) * 255


# Three coloured rectangles on black; label = index into COLOURS.
COLOURS = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255)], np.uint8)
BOXES = np.array([[10, 15, 60, 55], [150, 20, 210, 100], [75, 125, 280, 165]], np.float32)


def scene(height: int = 180, width: int = 320) -> np.ndarray:
    image = np.zeros((height, width, 3), np.uint8)
    for colour, (x0, y0, x1, y1) in zip(COLOURS, BOXES.astype(int), strict=True):
        image[y0:y1, x0:x1] = colour
    return image


def assert_boxes_on_their_colours(out: dict) -> None:
    """Every surviving box covers pixels of its own colour; every colour still visible has its box."""
    pixels = denormalize(out["image"])
    boxes = np.asarray(out["bboxes"], np.float32).reshape(-1, 4)
    labels = np.asarray(out["labels"]).reshape(-1).astype(np.int64)  # a list of ints comes back as floats
    h, w = pixels.shape[:2]
    assert len(boxes) == len(labels)
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= w + 1e-3).all()
    assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= h + 1e-3).all()
    assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
    for box, label in zip(boxes, labels, strict=True):
        x0, y0, x1, y1 = box
        # shrink by 2 px (interpolation blurs the edges), keep at least one pixel
        inner = pixels[int(np.ceil(y0)) + 2 : max(int(y1) - 2, int(np.ceil(y0)) + 3),
                       int(np.ceil(x0)) + 2 : max(int(x1) - 2, int(np.ceil(x0)) + 3)]
        if inner.size == 0 or min(x1 - x0, y1 - y0) < 6:
            continue
        assert np.abs(inner.mean((0, 1)) - COLOURS[label]).max() < 40, (box, label, inner.mean((0, 1)))
    for label, colour in enumerate(COLOURS):
        visible = (np.abs(pixels[::2, ::2] - colour).max(-1) < 30).sum()
        if visible > 15:  # clearly visible → its box must have survived
            assert label in labels.tolist(), (label, visible)


def test_resize_shape_matches_authors() -> None:
    for h in (1, 7, 100, 333, 427, 480, 640, 800, 1000, 2000):
        for w in (1, 9, 100, 333, 426, 480, 640, 799, 1333, 3000):
            for size in (64, 480, 800):
                for max_size in (None, 1333, 900):
                    if max_size is not None and max_size < size:
                        continue
                    assert resize_shape(h, w, size, max_size) == authors_get_size((w, h), size, max_size)
    assert resize_shape(480, 640, 800, 1333) == (800, 1066)
    assert resize_shape(100, 1000, 800, 1333) == (133, 1330)  # long side capped: short = round(1333 * 100 / 1000)
    with pytest.raises(ValueError):
        resize_shape(0, 10, 800, 1333)


def test_eval_transform_size_and_normalisation() -> None:
    image = np.full((480, 640, 3), 128, np.uint8)
    out = make_eval_transform()(image=image, bboxes=np.zeros((0, 4), np.float32), labels=[])
    assert out["image"].dtype == torch.float32 and tuple(out["image"].shape) == (3, 800, 1066)
    expected = (128 / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(out["image"].mean((1, 2)).numpy(), expected, atol=1e-4)
    out = make_eval_transform()(image=np.zeros((200, 2000, 3), np.uint8), bboxes=[], labels=[])
    assert tuple(out["image"].shape[1:]) == (133, 1330)  # short = round(1333 * 200 / 2000), long truncated


def test_eval_transform_scales_boxes() -> None:
    out = make_eval_transform(min_size=100, max_size=1000)(image=scene(), bboxes=BOXES, labels=np.arange(3))
    scale = 100 / 180
    np.testing.assert_allclose(np.asarray(out["bboxes"]), BOXES * np.array([177 / 320, scale, 177 / 320, scale]),
                               atol=1e-3)
    assert_boxes_on_their_colours(out)


def test_shortest_side_resize_component() -> None:
    transform = A.Compose([ShortestSideResize([100, 150], max_size=200)], seed=0)
    seen = set()
    for _ in range(20):
        out = transform(image=np.zeros((300, 500, 3), np.uint8))
        seen.add(out["image"].shape[:2])
    assert seen == {resize_shape(300, 500, 100, 200), resize_shape(300, 500, 150, 200)}
    with pytest.raises(ValueError, match="max_size"):
        ShortestSideResize([800], max_size=500)


def test_random_size_crop_component_drops_and_clips_boxes() -> None:
    crop = A.Compose([RandomSizeCrop(50, 50)], bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"],
                                                                        min_width=1e-3, min_height=1e-3), seed=1)
    image = np.zeros((100, 100, 3), np.uint8)
    corners = np.array([[0, 0, 10, 10], [90, 90, 100, 100], [30, 30, 70, 70]], np.float32)
    dropped_some = False
    for _ in range(30):
        out = crop(image=image, bboxes=corners, labels=[0, 1, 2])
        assert out["image"].shape[:2] == (50, 50)
        labels = [int(v) for v in out["labels"]]
        assert not {0, 1} <= set(labels)  # a 50 px crop cannot hold both opposite corners
        dropped_some |= len(labels) < 3
        boxes = np.asarray(out["bboxes"]).reshape(-1, 4)
        assert (boxes >= 0).all() and (boxes <= 50).all()
        if 2 in labels:  # the centre box is clipped, not dropped, when partly visible
            box = boxes[labels.index(2)]
            assert box[2] > box[0] and box[3] > box[1]
    assert dropped_some


def test_crop_sizes_follow_parameters() -> None:
    crop = A.Compose([RandomSizeCrop(384, 600)], seed=0)
    sizes = {crop(image=np.zeros((500, 1000, 3), np.uint8))["image"].shape[:2] for _ in range(40)}
    assert all(384 <= h <= 500 and 384 <= w <= 600 for h, w in sizes)
    assert len(sizes) > 5
    small = A.Compose([RandomSizeCrop(384, 600)], seed=0)(image=np.zeros((100, 200, 3), np.uint8))
    assert small["image"].shape[:2] == (100, 200)  # sides below min_size are kept whole


def test_train_transform_scales_and_max_side() -> None:
    scales = tuple(range(480, 801, 32))
    transform = make_train_transform(seed=0)
    image = np.zeros((427, 640, 3), np.uint8)
    shortest = set()
    for _ in range(40):
        out = transform(image=image, bboxes=np.zeros((0, 4), np.float32), labels=[])
        h, w = out["image"].shape[1:]
        shortest.add(min(h, w))
        # the final step is always the multi-scale resize: short side in scales unless the long side is capped
        assert min(h, w) in scales or max(h, w) >= 1333 - 2
        assert max(h, w) <= 1333 + 1  # the authors' rounding can pass the cap by < 1 px * aspect / 2
    assert len(shortest) >= 5


def test_train_transform_boxes_follow_flip_resize_and_crop() -> None:
    transform = make_train_transform(scales=(128, 160, 192), max_size=400, crop_resize_scales=(150, 180, 200),
                                     crop_min_size=64, crop_max_size=150, seed=3)
    image = scene()
    flipped = lost = 0
    for _ in range(60):
        out = transform(image=image, bboxes=BOXES, labels=np.arange(3))
        assert_boxes_on_their_colours(out)
        labels = [int(v) for v in out["labels"]]
        lost += len(labels) < 3
        if 0 in labels:  # red sits on the left of the scene; after a flip it is on the right
            box = np.asarray(out["bboxes"])[labels.index(0)]
            flipped += box[0] > out["image"].shape[2] / 2
    assert flipped > 5 and lost > 5  # both the flip and the box-dropping crop were exercised


def test_train_transform_with_no_boxes_and_reseed() -> None:
    transform = make_train_transform(scales=(64, 80), max_size=120, crop_resize_scales=(64,), crop_min_size=32,
                                     crop_max_size=64)
    image = np.random.default_rng(0).integers(0, 255, (90, 120, 3), dtype=np.uint8)
    out = transform(image=image, bboxes=np.zeros((0, 4), np.float32), labels=np.zeros(0, np.int64))
    assert len(out["bboxes"]) == 0 and len(out["labels"]) == 0

    def run(seed: int) -> list[tuple[int, ...]]:
        reseed_transform(transform, seed)
        return [tuple(transform(image=image, bboxes=[], labels=[])["image"].shape) for _ in range(8)]

    assert run(5) == run(5)
    assert run(5) != run(6) or run(5) != run(7)


def test_normalize_transform_keeps_size() -> None:
    out = make_normalize_transform()(image=np.zeros((33, 47, 3), np.uint8), bboxes=[[1, 2, 3, 4]], labels=[7])
    assert tuple(out["image"].shape) == (3, 33, 47)
    np.testing.assert_allclose(np.asarray(out["bboxes"]), [[1, 2, 3, 4]], atol=1e-4)
