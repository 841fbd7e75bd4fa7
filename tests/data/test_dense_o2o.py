"""DEIM's dense one-to-one (detr.data.dense_o2o): the mosaic puts four images and their boxes in their quadrants
(coco-mini's images against their resized selves) and, after the authors' random affine, every kept box still
bounds its drawn object (pixels of one colour per object); MixUp blends each image with the previous one at
β in [0.45, 0.55] and concatenates their targets; both follow DEIM's epochs; the data module builds them for
``--data.augmentation deim`` and its persistent loader worker sees the epoch change."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

from detr.data.coco import CocoDetection
from detr.data.collate import collate_detection
from detr.data.dense_o2o import DenseO2OTransform, MixUpCollate, Mosaic, mix_batch, shortest_side_shape
from detr.data.training_epoch import SharedEpoch
from detr.data.transforms import make_square_transform

REPO = Path(__file__).resolve().parents[2]
COCO_MINI = REPO / "data" / "coco-mini"


class ColouredRectangles:
    """A data set whose every draw is a new black image with three filled rectangles, each object a new label and
    its own colour (labels count up from ``first_label`` until :meth:`restart`): raw_sample(i) as CocoDetection's
    (pixels, boxes_xyxy, labels); ``drawn`` counts the calls."""

    def __init__(self, count: int, seed: int = 0, first_label: int = 0) -> None:
        self.count, self.rng, self.drawn = count, np.random.default_rng(seed), 0
        self.first_label = self.next_label = first_label

    def restart(self) -> None:
        self.next_label = self.first_label

    def __len__(self) -> int:
        return self.count

    def raw_sample(self, index: int) -> SimpleNamespace:
        self.drawn += 1
        height, width = (int(v) for v in self.rng.integers(160, 320, 2))
        pixels = np.zeros((height, width, 3), np.uint8)
        boxes, labels = [], []
        while len(boxes) < 3:
            w, h = (int(v) for v in self.rng.integers(40, 80, 2))
            x, y = int(self.rng.integers(0, width - w)), int(self.rng.integers(0, height - h))
            if any(x < b[2] + 4 and b[0] < x + w + 4 and y < b[3] + 4 and b[1] < y + h + 4 for b in boxes):
                continue  # apart, so that every object's pixels are all in view
            pixels[y:y + h, x:x + w] = colour(self.next_label)
            boxes.append([x, y, x + w, y + h])
            labels.append(self.next_label)
            self.next_label += 1
        return SimpleNamespace(pixels=pixels, boxes_xyxy=np.array(boxes, np.float32), labels=np.array(labels, np.int64))


def colour(label: int) -> tuple[int, int, int]:
    """Distinct for labels 0-23."""
    label %= 24
    return (40 + 9 * label, 255 - 7 * label, 100 + 5 * (label % 20))


def identity_mosaic(cell_size: int, samples) -> Mosaic:
    return Mosaic(cell_size, samples, rotation=0.0, translation=0.0, scale=(1.0, 1.0), seed=0)


class Recorded:
    """``samples`` that remembers which indices were drawn."""

    def __init__(self, samples) -> None:
        self.samples, self.indices = samples, []

    def __len__(self) -> int:
        return len(self.samples)

    def raw_sample(self, index: int):
        self.indices.append(index)
        return self.samples.raw_sample(index)


@pytest.fixture(scope="module")
def coco_mini() -> CocoDetection:
    return CocoDetection(COCO_MINI / "train2017", COCO_MINI / "annotations" / "instances_train2017.json")


def test_the_mosaic_puts_four_images_and_their_boxes_in_their_quadrants(coco_mini: CocoDetection) -> None:
    """With the affine left out: the canvas is twice the largest resized side; each quadrant's top-left holds its
    image resized to a shortest side of 160, the rest of the quadrant is black, each image's boxes are its
    resized boxes moved by the quadrant's corner, the sample's first."""
    source = Recorded(coco_mini)
    mosaic = identity_mosaic(160, source)
    primary = coco_mini.raw_sample(5)
    out = mosaic(image=primary.pixels, bboxes=primary.boxes_xyxy, labels=primary.labels)
    parts = [primary] + [coco_mini.raw_sample(index) for index in source.indices]
    assert len(source.indices) == 3
    shapes = [shortest_side_shape(*part.pixels.shape[:2], 160) for part in parts]
    cell_height, cell_width = max(h for h, _ in shapes), max(w for _, w in shapes)
    canvas = out["image"]
    assert canvas.shape == (2 * cell_height, 2 * cell_width, 3)
    boxes, labels = np.asarray(out["bboxes"]), np.asarray(out["labels"])
    start = 0
    for quadrant, (part, (height, width)) in enumerate(zip(parts, shapes)):
        assert min(height, width) == 160
        left, top = (quadrant % 2) * cell_width, (quadrant // 2) * cell_height
        cell = canvas[top:top + cell_height, left:left + cell_width]
        resized = cv2.resize(part.pixels, (width, height), interpolation=cv2.INTER_LINEAR)
        np.testing.assert_array_equal(cell[:height, :width], resized)
        assert cell[height:].sum() == 0 and cell[:, width:].sum() == 0
        scale = np.array([width / part.pixels.shape[1], height / part.pixels.shape[0]] * 2)
        expected = part.boxes_xyxy * scale + [left, top, left, top]
        big = (expected[:, 2:] - expected[:, :2] >= 1).all(axis=1)  # a box under 1 px after the resize is dropped
        count = int(big.sum())
        np.testing.assert_allclose(boxes[start:start + count], expected[big], atol=1e-3)
        assert labels[start:start + count].tolist() == part.labels[big].tolist()
        start += count
    assert start == len(boxes) > len(primary.boxes_xyxy)


def test_after_the_authors_affine_every_kept_box_bounds_its_drawn_object() -> None:
    """Rotation up to 10°, shift up to 10 %, scale 0.5-1.5 (nearest neighbour, so each object keeps its colour): a
    box kept holds every visible pixel of its object and is close to their extent; an object that stays well in
    view keeps its box."""
    source = ColouredRectangles(6, seed=1)
    mosaic = Mosaic(120, source, seed=3)
    checked = 0
    for _ in range(8):
        source.restart()
        primary = source.raw_sample(0)
        out = mosaic(image=primary.pixels, bboxes=primary.boxes_xyxy, labels=primary.labels)
        image, boxes = out["image"], np.asarray(out["bboxes"])
        kept = {int(label): box for label, box in zip(out["labels"], boxes)}
        assert len(kept) == len(boxes)
        for label in range(12):
            ys, xs = np.nonzero((image == colour(label)).all(axis=-1))
            if label not in kept:
                assert len(xs) < 40  # dropped: out of view
                continue
            box = kept[label]
            if len(xs) < 200:
                continue  # mostly out of view: too few pixels to measure
            extent = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
            assert (extent[:2] >= box[:2] - 2).all() and (extent[2:] <= box[2:] + 2).all(), (label, box, extent)
            inter = np.prod(np.clip(np.minimum(box[2:], extent[2:]) - np.maximum(box[:2], extent[:2]), 0, None))
            union = np.prod(box[2:] - box[:2]) + np.prod(extent[2:] - extent[:2]) - inter
            assert inter / union > 0.75, (label, box, extent)
            checked += 1
    assert checked > 20


def test_mixup_blends_each_image_with_the_previous_one_and_joins_their_targets() -> None:
    images = torch.stack([torch.full((3, 8, 8), value) for value in (0.2, 0.6, 1.0)])
    targets = [{"boxes": torch.rand(n, 4), "labels": torch.arange(n) + 10 * i, "image_id": torch.tensor(i)}
               for i, n in enumerate((1, 2, 3))]
    padding = torch.zeros(3, 8, 8, dtype=torch.bool)
    mixed, mask, out = mix_batch(images, padding, targets, 0.47)
    for i, previous in enumerate((2, 0, 1)):
        expected = 0.47 * images[i] + 0.53 * images[previous]
        torch.testing.assert_close(mixed[i], expected)
        assert out[i]["labels"].tolist() == targets[i]["labels"].tolist() + targets[previous]["labels"].tolist()
        torch.testing.assert_close(out[i]["boxes"], torch.cat([targets[i]["boxes"], targets[previous]["boxes"]]))
        assert int(out[i]["image_id"]) == i
    assert not mask.any()

    epoch = SharedEpoch(3)
    collate = MixUpCollate(lambda samples: (images.clone(), padding, [dict(t) for t in targets]), prob=1.0,
                           epochs=(1, 4), epoch=epoch)
    torch.manual_seed(0)
    betas = []
    for _ in range(20):
        batch_images, _, batch_targets = collate([])
        # image 1 = β·0.6 + (1 − β)·0.2
        betas.append(float((batch_images[1, 0, 0, 0] - 0.2) / 0.4))
        assert len(batch_targets[0]["labels"]) == 1 + 3
    assert 0.45 - 1e-6 <= min(betas) < max(betas) <= 0.55 + 1e-6
    for stopped in (0, 4):  # before and from the end of mixup_epochs: the batch as collated
        epoch.set(stopped)
        batch_images, _, batch_targets = collate([])
        torch.testing.assert_close(batch_images, images)
        assert [len(t["labels"]) for t in batch_targets] == [1, 2, 3]
    epoch.set(3)
    half = MixUpCollate(collate.collate, prob=0.5, epochs=(1, 4), epoch=epoch)
    mixed_count = sum(len(half([])[2][0]["labels"]) > 1 for _ in range(200))
    assert 70 < mixed_count < 130


def test_the_policy_follows_deim_epochs() -> None:
    """Epochs [1, 3) with stop 4: epoch 0 and 4 are the plain flip and resize; epochs 1-2 mosaic (each mosaic draws
    three images) at mosaic_prob; epoch 3 RT-DETR's augmentations, no mosaic."""
    source = ColouredRectangles(4, first_label=3)
    epoch = SharedEpoch(0)
    transform = DenseO2OTransform(64, epoch=epoch, mosaic_epochs=(1, 3), stop_epoch=4, mosaic_prob=0.5, seed=0)
    transform.draw_from(source)
    plain = make_square_transform(64, train=False)
    sample = ColouredRectangles(1).raw_sample(0)  # labels 0, 1, 2; the drawn images' from 3
    arguments = {"image": sample.pixels, "bboxes": sample.boxes_xyxy, "labels": sample.labels}
    reference = plain(**arguments)["image"]

    def run(at: int, times: int = 40) -> tuple[int, int]:
        """(mosaics, outputs that are not the plain flip and resize) over ``times`` samples at epoch ``at``."""
        epoch.set(at)
        source.drawn, changed = 0, 0
        for _ in range(times):
            image = transform(**arguments)["image"]
            changed += not any(torch.allclose(image, version, atol=1e-6) for version in (reference, reference.flip(-1)))
        assert source.drawn % 3 == 0
        return source.drawn // 3, changed

    assert run(0) == (0, 0) and run(4) == (0, 0)
    mosaics, _ = run(1)
    assert 10 < mosaics < 30
    assert run(2)[0] > 10
    mosaics, changed = run(3)
    assert mosaics == 0 and changed > 10
    epoch.set(1)
    transform.mosaic_prob = 1.0
    out = transform(**arguments)
    assert out["image"].shape == (3, 64, 64)
    assert set(np.asarray(out["labels"]).tolist()) - set(sample.labels.tolist())  # other images' objects


def test_mosaic_refuses_masks() -> None:
    source = ColouredRectangles(2)
    sample = source.raw_sample(0)
    with pytest.raises(ValueError, match="boxes only"):
        identity_mosaic(64, source)(image=sample.pixels, bboxes=sample.boxes_xyxy, labels=sample.labels,
                                    masks=np.zeros((3, *sample.pixels.shape[:2]), np.uint8))


def test_the_data_module_trains_deim_batches_and_its_persistent_worker_sees_the_epoch(tmp_path: Path) -> None:
    """``--data.augmentation deim`` on coco-mini with one persistent worker: at epoch 0 (mosaic and MixUp always
    on) every image carries more boxes than its own file has; once the epoch moves past both ranges the same
    worker gives each image its own boxes only (the flip and the square resize)."""
    from detr.lightning.datamodule import DetrDataModule

    data = DetrDataModule(root=str(COCO_MINI), square_size=64, augmentation="deim", batch_size=4, num_workers=1,
                          persistent_workers=True, mosaic_epochs=[0, 1], mosaic_prob=1.0, mixup_prob=1.0,
                          mixup_epochs=[0, 1], augmentation_stop_epoch=2)
    loader = data.train_dataloader()
    assert isinstance(loader.collate_fn, MixUpCollate)
    own = {image_id: len(data.train_dataset.raw_sample(index).labels)
           for index, image_id in enumerate(data.train_dataset.ids)}
    extra = []
    for _, _, targets in [next(iter(loader))]:
        extra += [len(t["labels"]) - own[int(t["image_id"])] for t in targets]
    assert all(count > 0 for count in extra)
    data.epoch.set(2)
    for _, _, targets in [next(iter(loader))]:
        assert all(len(t["labels"]) <= own[int(t["image_id"])] for t in targets)


def test_the_data_module_refuses_deim_settings_it_cannot_train(tmp_path: Path) -> None:
    from detr.lightning.datamodule import DetrDataModule

    for settings, message in (({"augmentation": "deim"}, "--data.square_size"),
                              ({"augmentation": "deim", "square_size": 64, "masks": True}, "--data.masks"),
                              ({"augmentation": "deim", "square_size": 64, "mosaic_epochs": [4]}, "--data.mosaic_epochs"),
                              ({"augmentation": "deim", "square_size": 64, "mixup_prob": 2}, "--data.mixup_prob"),
                              ({"augmentation": "deim", "square_size": 64, "mosaic_epochs": [4, 60],
                                "augmentation_stop_epoch": 50}, "augmentation_stop_epoch")):
        with pytest.raises(ValueError, match=message) as error:
            DetrDataModule(root=str(COCO_MINI), **settings)
        assert "\n" not in str(error.value)


def test_collate_detection_is_what_mixup_wraps_by_default() -> None:
    """Without multi-scale batches the data module's MixUp wraps the plain collate."""
    from detr.lightning.datamodule import DetrDataModule

    data = DetrDataModule(root=str(COCO_MINI), square_size=64, augmentation="deim", num_workers=0)
    assert data.train_dataloader().collate_fn.collate is collate_detection


def test_a_mosaic_that_draws_an_unreadable_file_skips_like_any_unreadable_sample(tmp_path: Path) -> None:
    """A file that breaks mid-run and is drawn into a mosaic: the sample is replaced with a warning naming that
    file (skip_unreadable, as the training set sets it), not a crash."""
    import json
    import shutil

    images = tmp_path / "images"
    shutil.copytree(COCO_MINI / "train2017", images)
    data = json.loads((COCO_MINI / "annotations" / "instances_train2017.json").read_text())
    broken = images / data["images"][1]["file_name"]
    epoch = SharedEpoch(0)
    transform = DenseO2OTransform(64, epoch=epoch, mosaic_epochs=(0, 1), mosaic_prob=1.0, seed=0)
    dataset = CocoDetection(images, COCO_MINI / "annotations" / "instances_train2017.json", transform=transform,
                            coco_data=data, skip_unreadable=True)
    transform.draw_from(dataset)
    broken.write_bytes(b"not an image")  # after the start-up check, as a file truncated mid-run
    skipped = []
    for index in range(12):
        skipped += dataset[index][1].get("skipped_files", [])
    assert str(broken) in skipped
    epoch.set(1)  # no mosaic: only the broken file's own index is replaced
    assert dataset[2][1].get("skipped_files") is None
