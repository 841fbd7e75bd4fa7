"""Instance masks in the COCO detection set (``masks=True``): polygons and RLE decoded as pycocotools' annToMask
decodes them, moved by every training and evaluation pipeline with their boxes (coco-mini's real polygons), the boxes
the same as without masks, a flip mirrored exactly, multi-scale batches resizing them, and a json without usable
segmentations refused at start-up with the annotation and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from detr.data.coco import AnnotationFileError, CocoDetection
from detr.data.collate import MultiScaleCollate
from detr.data.instance_masks import decode_segmentations, segmentation_problem
from detr.data.transforms import (
    make_eval_transform,
    make_normalize_transform,
    make_rtdetr_train_transform,
    make_square_transform,
    make_train_transform,
)
from tests.helpers import REPO

COCO_MINI = REPO / "data" / "coco-mini"
TRAIN_JSON = COCO_MINI / "annotations" / "instances_train2017.json"

PIPELINES = {
    "train": lambda seed: make_train_transform(seed=seed),
    "eval": lambda seed: make_eval_transform(),
    "normalize": lambda seed: make_normalize_transform(),
    "square": lambda seed: make_square_transform(320, train=True, seed=seed),
    "rtdetr": lambda seed: make_rtdetr_train_transform(320, seed=seed),  # distortion, zoom-out, IoU crop, flip
}


def _dataset(transform=None, masks: bool = True, **options) -> CocoDetection:
    return CocoDetection(COCO_MINI / "train2017", TRAIN_JSON, transform=transform, masks=masks, **options)


def test_polygons_and_rle_decode_as_pycocotools_ann_to_mask() -> None:
    coco = COCO(str(TRAIN_JSON))
    annotations = coco.dataset["annotations"]
    crowd = next(a for a in annotations if a["iscrowd"])  # an uncompressed RLE
    polygons = [a for a in annotations if a["image_id"] == crowd["image_id"] and not a["iscrowd"]]
    image = coco.imgs[crowd["image_id"]]
    compressed = mask_utils.frPyObjects(crowd["segmentation"], image["height"], image["width"])
    compressed = {"size": compressed["size"], "counts": compressed["counts"].decode("ascii")}
    fields = [a["segmentation"] for a in polygons] + [crowd["segmentation"], compressed]
    masks = decode_segmentations(fields, image["height"], image["width"])

    expected = np.stack([coco.annToMask(a) for a in [*polygons, crowd, crowd]])
    assert masks.dtype == np.uint8 and masks.shape == expected.shape and (masks == expected).all()
    assert masks.reshape(len(masks), -1).any(1).all()


@pytest.mark.parametrize(("segmentation", "problem"), [
    ([], "an empty 'segmentation' list (give polygons, or an RLE)"),
    ([[1, 1, 5, 1, 5]], "polygon 0 of odd length 5"),
    ([[1, 1, 5, 5]], "polygon 0 with 2 point(s); a polygon needs at least 3"),
    ([[1, 1, 5, 1, "x", 5]], "polygon 0 that is not a list of finite numbers"),
    ({"size": [10, 20], "counts": [200]}, "an RLE of size [10, 20] (height, width) on an image of 20x10"),
    ({"size": [20, 10], "counts": [150]}, "RLE counts summing to 150 pixels, not 20 x 10 = 200"),
    ({"size": [20, 10], "counts": 7}, "RLE counts of type int"),
    (None, "no 'segmentation'"),
])
def test_unusable_segmentations_are_named(segmentation, problem) -> None:
    assert segmentation_problem(segmentation, 20, 10).startswith(problem)
    assert segmentation_problem([[1, 1, 5, 1, 5, 5]], 20, 10) is None
    assert segmentation_problem({"size": [20, 10], "counts": [150, 50]}, 20, 10) is None


def test_raw_masks_are_the_kept_boxes_annotations() -> None:
    dataset, coco = _dataset(), COCO(str(TRAIN_JSON))
    for index in range(len(dataset)):
        sample = dataset.raw_sample(index)
        annotations = [a for a in coco.imgToAnns[sample.image_id] if not a["iscrowd"]]  # all boxes here are kept
        assert len(annotations) == len(sample.boxes_xyxy) == len(sample.masks)
        for annotation, box, mask in zip(annotations, sample.boxes_xyxy, sample.masks):
            assert (mask == coco.annToMask(annotation)).all()
            x, y, w, h = annotation["bbox"]
            assert np.allclose(box, [x, y, x + w, y + h], atol=1e-3)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_masks_move_with_their_boxes_through_every_pipeline(pipeline: str) -> None:
    """Each target's mask is at the transformed size and lies inside its box (within the few pixels by which
    coco-mini's polygons reach past their boxes, scaled); the boxes and labels are those of the same pipeline
    and seed without masks."""
    with_masks, without = _dataset(PIPELINES[pipeline](7)), _dataset(PIPELINES[pipeline](7), masks=False)
    objects = 0
    for index in range(8):
        image, target = with_masks[index]
        _, plain = without[index]
        masks, boxes = target["masks"], target["boxes_xyxy"]
        assert masks.dtype == torch.bool and masks.shape == (len(boxes), *image.shape[1:])
        assert torch.equal(boxes, plain["boxes_xyxy"]) and torch.equal(target["labels"], plain["labels"])
        margin = 2 + 4 * float(target["size"].max()) / float(target["orig_size"].max())
        for mask, (x0, y0, x1, y1) in zip(masks, boxes.tolist()):
            rows, cols = mask.any(1).nonzero()[:, 0], mask.any(0).nonzero()[:, 0]
            if len(rows):  # a crop may leave a box's corner without any of its mask
                assert x0 - margin <= cols.min() and cols.max() < x1 + margin
                assert y0 - margin <= rows.min() and rows.max() < y1 + margin
                objects += 1
    assert objects > 20


def test_a_flip_mirrors_the_masks_exactly() -> None:
    flip = A.Compose([A.HorizontalFlip(p=1.0), A.ToTensorV2()],
                     bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"]))
    dataset = _dataset(flip)
    sample = dataset.raw_sample(3)
    _, target = dataset[3]
    assert torch.equal(target["masks"], torch.from_numpy(sample.masks[:, :, ::-1].copy()).bool())


def test_a_crop_drops_masks_with_their_boxes() -> None:
    crop = A.Compose([A.Crop(0, 0, 120, 90), A.ToTensorV2()],
                     bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"], min_width=1e-3,
                                              min_height=1e-3))
    dataset = _dataset(crop)
    for index in range(len(dataset)):
        sample = dataset.raw_sample(index)
        _, target = dataset[index]
        kept = (sample.boxes_xyxy[:, 0] < 120) & (sample.boxes_xyxy[:, 1] < 90)
        assert len(target["masks"]) == len(target["labels"]) == int(kept.sum())
        assert torch.equal(target["labels"], torch.from_numpy(sample.labels[kept]))
        assert torch.equal(target["masks"], torch.from_numpy(sample.masks[kept][:, :90, :120]).bool())


def test_multi_scale_batches_resize_the_masks_nearest() -> None:
    dataset = _dataset(make_square_transform(64, train=False))
    batch = [dataset[0], dataset[1]]
    _, _, targets = MultiScaleCollate([96])(batch)
    for (_, before), after in zip(batch, targets):
        assert after["masks"].shape == (len(before["masks"]), 96, 96) and after["masks"].dtype == torch.bool
        assert torch.equal(after["masks"], before["masks"].repeat_interleave(3, 1).repeat_interleave(3, 2)[:, ::2, ::2])


def test_box_only_data_has_no_masks_and_training_with_masks_needs_every_segmentation(tmp_path: Path) -> None:
    _, target = _dataset(masks=False)[0]
    assert "masks" not in target
    data = json.loads(TRAIN_JSON.read_text())
    plain = next(a for a in data["annotations"] if not a["iscrowd"])
    del plain["segmentation"]
    crowd = next(a for a in data["annotations"] if a["iscrowd"])
    del crowd["segmentation"]  # crowd regions are no targets: not needed
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnnotationFileError, match=rf"'{path}' cannot give masks: 1 annotation\(s\) without a usable "
                                                  rf"segmentation: annotation {plain['id']} has no 'segmentation'.*"
                                                  r"--data\.masks false"):
        CocoDetection(COCO_MINI / "train2017", path, masks=True)
    assert len(CocoDetection(COCO_MINI / "train2017", path)) == 50  # boxes alone: fine
