"""COCO keypoints through the data set: read, moved with the boxes by every transform, mirrored by flips, checked."""

from __future__ import annotations

import json
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch

from detr.data.coco import AnnotationFileError, CocoDetection
from detr.data.collate import collate_detection
from detr.data.dense_o2o import Mosaic, mix_batch
from detr.data.keypoints import (
    annotation_keypoints_problem,
    flip_index_from_names,
    flip_index_from_pairs,
    flip_pairs_from_index,
    mirror_name,
)
from detr.data.transforms import (
    HorizontalFlip,
    box_params,
    keypoint_params,
    make_eval_transform,
    make_rfdetr_train_transform,
    make_rtdetr_train_transform,
    make_square_transform,
    make_train_transform,
)
from tests.helpers import COCO_PERSON_KEYPOINTS as COCO_PERSON

# a "hand" of three points (left, tip, right) and a "stick" of two points without a mirror
CATEGORIES = [
    {"id": 1, "name": "hand", "keypoints": ["left_finger", "tip", "right_finger"], "skeleton": [[1, 2], [2, 3]]},
    {"id": 2, "name": "stick", "keypoints": ["top", "bottom"], "skeleton": [[1, 2]]},
    {"id": 3, "name": "ball"},
]


def hand(ann_id: int, image_id: int, points: list[float], bbox: list[float] | None = None) -> dict:
    return {"id": ann_id, "image_id": image_id, "category_id": 1, "bbox": bbox or [10, 10, 40, 20], "iscrowd": 0,
            "keypoints": points, "num_keypoints": sum(1 for v in points[2::3] if v > 0)}


def make_dataset(root: Path, images: list[dict], annotations: list[dict], categories: list[dict]) -> tuple[Path, Path]:
    """The images (one colour each) and their json in ``root``; returns (images folder, json)."""
    from PIL import Image

    (root / "images").mkdir(parents=True, exist_ok=True)
    for image in images:
        Image.new("RGB", (image["width"], image["height"]), (90, 120, 200)).save(root / "images" / image["file_name"])
    json_file = root / "instances.json"
    json_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return root / "images", json_file


def keypoint_set(tmp_path: Path, annotations: list[dict] | None = None) -> tuple[Path, Path]:
    """One 60 x 40 image: a hand (points left, tip, right), a stick, a ball."""
    annotations = annotations if annotations is not None else [
        hand(1, 1, [12, 14, 2, 30, 12, 1, 48, 28, 2]),
        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [5, 5, 4, 30], "keypoints": [7, 5, 2, 7, 35, 2],
         "num_keypoints": 2},
        {"id": 3, "image_id": 1, "category_id": 3, "bbox": [50, 30, 5, 5]},
    ]
    return make_dataset(tmp_path, [{"id": 1, "file_name": "a.png", "height": 40, "width": 60}], annotations,
                        categories=CATEGORIES)


def test_the_mirror_of_coco_person_points_comes_from_their_names() -> None:
    index = flip_index_from_names(COCO_PERSON)
    assert index == (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)
    assert flip_pairs_from_index(index)[:2] == [[1, 2], [3, 4]]
    assert flip_index_from_pairs(flip_pairs_from_index(index), 17) == index
    assert mirror_name("Left Ear") == "Right Ear" and mirror_name("hand_right") == "hand_left"
    assert mirror_name("leftover") == "leftover"


@pytest.mark.parametrize("pairs", [[[0, 0]], [[0, 5]], [[0, 1], [1, 2]], ["ab"]])
def test_bad_flip_pairs_are_refused(pairs: list) -> None:
    with pytest.raises(ValueError, match="flip pair"):
        flip_index_from_pairs(pairs, 3)


def test_keypoints_come_out_as_the_json_gives_them_and_are_normalised_by_collate(tmp_path: Path) -> None:
    dataset = CocoDetection(*keypoint_set(tmp_path), keypoints=True)
    assert dataset.num_keypoints == 3
    _, target = dataset[0]
    keypoints = target["keypoints_pixels"]
    assert keypoints.shape == (3, 3, 3) and keypoints.dtype == torch.float32
    assert keypoints[0].tolist() == [[12, 14, 2], [30, 12, 1], [48, 28, 2]]
    assert keypoints[1].tolist() == [[7, 5, 2], [7, 35, 2], [0, 0, 0]]  # two points, padded to three
    assert keypoints[2].tolist() == [[0, 0, 0]] * 3  # a category without keypoints
    _, _, (batched,) = collate_detection([dataset[0]])
    assert "keypoints_pixels" not in batched
    assert torch.allclose(batched["keypoints"][0, 0], torch.tensor([12 / 60, 14 / 40, 2]))


def test_without_the_option_no_keypoints_are_read(tmp_path: Path) -> None:
    _, target = CocoDetection(*keypoint_set(tmp_path))[0]
    assert "keypoints_pixels" not in target


def test_a_resize_scales_keypoints_as_it_scales_boxes(tmp_path: Path) -> None:
    dataset = CocoDetection(*keypoint_set(tmp_path), keypoints=True, transform=make_eval_transform(min_size=80))
    _, target = dataset[0]
    assert tuple(target["size"].tolist()) == (80, 120)
    assert torch.allclose(target["keypoints_pixels"][0, :, :2], torch.tensor([[24.0, 28], [60, 24], [96, 56]]))
    assert torch.allclose(target["boxes_xyxy"][0], torch.tensor([20.0, 20, 100, 60]))


def test_a_flip_mirrors_points_as_boxes_and_swaps_left_and_right(tmp_path: Path) -> None:
    flip = A.Compose([HorizontalFlip(p=1.0), A.ToTensorV2()], bbox_params=box_params(),
                     keypoint_params=keypoint_params())
    dataset = CocoDetection(*keypoint_set(tmp_path), keypoints=True, transform=flip)
    _, target = dataset[0]
    # left_finger (12, 14) → x 48 and becomes the right finger; the tip stays the tip; the stick has no mirror
    assert target["keypoints_pixels"][0].tolist() == [[12, 28, 2], [30, 12, 1], [48, 14, 2]]
    assert target["keypoints_pixels"][1].tolist() == [[53, 5, 2], [53, 35, 2], [0, 0, 0]]
    assert torch.allclose(target["boxes_xyxy"][0], torch.tensor([10.0, 10, 50, 30]))  # 60 - [50, 30]: the same mirror


def test_flip_pairs_given_by_the_category_win_over_the_names(tmp_path: Path) -> None:
    CATEGORIES[1]["flip_pairs"] = [[0, 1]]  # a stick mirrored top ↔ bottom (made up, to see which rule is used)
    try:
        flip = A.Compose([HorizontalFlip(p=1.0), A.ToTensorV2()], bbox_params=box_params(),
                         keypoint_params=keypoint_params())
        _, target = CocoDetection(*keypoint_set(tmp_path), keypoints=True, transform=flip)[0]
    finally:
        del CATEGORIES[1]["flip_pairs"]
    assert target["keypoints_pixels"][1, :2].tolist() == [[53, 35, 2], [53, 5, 2]]


def test_two_flips_leave_left_and_right_in_place(tmp_path: Path) -> None:
    flips = A.Compose([HorizontalFlip(p=1.0), HorizontalFlip(p=1.0), A.ToTensorV2()], bbox_params=box_params(),
                      keypoint_params=keypoint_params())
    _, target = CocoDetection(*keypoint_set(tmp_path), keypoints=True, transform=flips)[0]
    assert target["keypoints_pixels"][0].tolist() == [[12, 14, 2], [30, 12, 1], [48, 28, 2]]


def test_a_crop_makes_the_points_it_cuts_off_not_labelled_and_drops_keypoints_with_their_box(tmp_path: Path) -> None:
    crop = A.Compose([A.Crop(x_min=0, y_min=0, x_max=40, y_max=40), A.ToTensorV2()], bbox_params=box_params(),
                     keypoint_params=keypoint_params())
    _, target = CocoDetection(*keypoint_set(tmp_path), keypoints=True, transform=crop)[0]
    assert target["labels"].tolist() == [0, 1]  # the ball at x 50..55 is cropped away, with its (empty) keypoints
    assert target["keypoints_pixels"].shape == (2, 3, 3)
    assert target["keypoints_pixels"][0].tolist() == [[12, 14, 2], [30, 12, 1], [0, 0, 0]]  # x 48 is outside


def test_points_outside_the_image_in_the_json_are_not_labelled(tmp_path: Path) -> None:
    images_dir, json_file = keypoint_set(tmp_path, [hand(1, 1, [-3, 14, 2, 30, 12, 2, 48, 41, 2])])
    _, target = CocoDetection(images_dir, json_file, keypoints=True)[0]
    assert target["keypoints_pixels"][0].tolist() == [[0, 0, 0], [30, 12, 2], [0, 0, 0]]


@pytest.mark.parametrize("make", [
    lambda: make_train_transform(scales=[32, 48], max_size=80, crop_resize_scales=[40], crop_min_size=20,
                                 crop_max_size=30, seed=1),
    lambda: make_rtdetr_train_transform(48, seed=2),
    lambda: make_rfdetr_train_transform(48, crop_resize_scales=[40], crop_min_size=20, crop_max_size=30, seed=3),
    lambda: make_square_transform(48, train=True, seed=4),
], ids=["detr", "rtdetr", "rfdetr", "square"])
def test_every_training_pipeline_carries_keypoints_inside_the_image(tmp_path: Path, make) -> None:
    dataset = CocoDetection(*keypoint_set(tmp_path), keypoints=True, transform=make())
    for _ in range(12):
        image, target = dataset[0]
        keypoints = target["keypoints_pixels"]
        assert keypoints.shape == (len(target["labels"]), 3, 3)
        labelled = keypoints[..., 2] > 0
        height, width = image.shape[-2:]
        assert (keypoints[..., 0][labelled] <= width).all() and (keypoints[..., 1][labelled] <= height).all()
        boxes = target["boxes_xyxy"]  # a labelled point stays within its box, which moved (and was clipped) alike
        for row in range(len(boxes)):
            points = keypoints[row, labelled[row], :2]
            assert ((points >= boxes[row, :2] - 1e-3) & (points <= boxes[row, 2:] + 1e-3)).all()


def test_bad_keypoints_fail_at_start_up_naming_the_annotation(tmp_path: Path) -> None:
    bad = hand(7, 1, [12, 14, 2, 30, 12, 3, 48, 28, 2])
    with pytest.raises(AnnotationFileError, match=r"annotation 7: .*visibility \[3\]"):
        CocoDetection(*keypoint_set(tmp_path, [bad]), keypoints=True)


def test_a_json_without_keypoint_categories_says_how_to_train_without(tmp_path: Path) -> None:
    images_dir, json_file = make_dataset(tmp_path, [{"id": 1, "file_name": "a.png", "height": 40, "width": 60}], [],
                                         categories=[{"id": 1, "name": "ball"}])
    with pytest.raises(AnnotationFileError, match="no category with 'keypoints'.*--data.keypoints false"):
        CocoDetection(images_dir, json_file, keypoints=True)


@pytest.mark.parametrize(("annotation", "count", "message"), [
    ({"keypoints": [1, 2, 2, 3, 4]}, None, "5 numbers"),
    ({"keypoints": [1, 2, 2]}, 2, "3 x 2 = 6"),
    ({"keypoints": [1, 2, 2], "num_keypoints": 0}, 1, "set num_keypoints to 1"),
    ({"keypoints": "x"}, 1, "not a list"),
])
def test_annotation_keypoint_problems_say_the_fix(annotation: dict, count: int | None, message: str) -> None:
    assert message in annotation_keypoints_problem(annotation, count)


def test_mosaic_refuses_keypoints_and_mixup_carries_them() -> None:
    with pytest.raises(ValueError, match="train keypoints with another"):
        Mosaic(16)(image=np.zeros((8, 8, 3), np.uint8), bboxes=[], labels=[], keypoints=np.zeros((0, 3)))
    targets = [{"boxes": torch.rand(n, 4), "labels": torch.zeros(n, dtype=torch.int64),
                "keypoints": torch.rand(n, 3, 3)} for n in (1, 2)]
    _, _, mixed = mix_batch(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.bool), targets, 0.5)
    assert mixed[0]["keypoints"].shape == (3, 3, 3)
    assert torch.equal(mixed[0]["keypoints"][1:], targets[1]["keypoints"])
