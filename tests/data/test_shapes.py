"""The synthetic shapes set: deterministic, COCO layout, exact boxes, idempotent writer and CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detr.data.checker import check_dataset, has_errors
from detr.data.coco import CocoDetection
from detr.data.shapes import (
    ALL_SHAPES,
    SHAPE_NAMES,
    ShapesConfig,
    render_shapes_image,
    shape_polygon,
    shapes_dataset_is_complete,
    write_shapes_dataset,
)
from tests.helpers import load_script

TINY = ShapesConfig(num_train=12, num_val=4, image_size=64, min_object_size=8, max_object_size=24,
                    empty_fraction=0.25)


def test_layout_and_determinism(tmp_path: Path) -> None:
    assert write_shapes_dataset(tmp_path / "a", TINY)
    assert write_shapes_dataset(tmp_path / "b", TINY)
    for split in ("train2017", "val2017"):
        json_a = (tmp_path / "a" / "annotations" / f"instances_{split}.json").read_bytes()
        assert json_a == (tmp_path / "b" / "annotations" / f"instances_{split}.json").read_bytes()
        data = json.loads(json_a)
        assert len(data["images"]) == (12 if split == "train2017" else 4)
        assert [c["name"] for c in data["categories"]] == list(SHAPE_NAMES)
        for image in data["images"]:
            file_a = tmp_path / "a" / split / image["file_name"]
            assert file_a.read_bytes() == (tmp_path / "b" / split / image["file_name"]).read_bytes()
            assert Image.open(file_a).size == (64, 64)
    other = ShapesConfig(**{**TINY.__dict__, "seed": 1})
    write_shapes_dataset(tmp_path / "c", other)
    assert (tmp_path / "c" / "train2017" / "000000000001.jpg").read_bytes() != (
        tmp_path / "a" / "train2017" / "000000000001.jpg").read_bytes()


def test_objects_are_varied_and_boxes_exact() -> None:
    counts, categories, empty = [], set(), 0
    for index in range(40):
        pixels, objects = render_shapes_image(np.random.default_rng([0, 0, index]), TINY)
        assert pixels.shape == (64, 64, 3) and pixels.dtype == np.uint8
        counts.append(len(objects))
        empty += not objects
        for shape in objects:
            categories.add(shape.category_id)
            x, y, w, h = shape.bbox_xywh
            assert 0 <= x and 0 <= y and x + w <= 64 and y + h <= 64 and w > 0 and h > 0
            polygon = np.array(shape.polygon).reshape(-1, 2)
            # the box is the rendered extent of the polygon (within the rasteriser's pixel)
            assert abs(polygon[:, 0].min() - x) <= 1.01 and abs(polygon[:, 0].max() - (x + w)) <= 1.01
            assert abs(polygon[:, 1].min() - y) <= 1.01 and abs(polygon[:, 1].max() - (y + h)) <= 1.01
            assert 0 < shape.area <= w * h
    assert categories == set(range(1, len(SHAPE_NAMES) + 1))
    assert max(counts) <= TINY.max_objects and empty >= 3 and len(set(counts)) >= 4


def test_shape_polygons() -> None:
    for name in ALL_SHAPES:
        polygon = shape_polygon(name, (10.0, 20.0), 5.0, 0.3, 0.5)
        assert np.linalg.norm(polygon - [10, 20], axis=1).max() <= 5.0 + 1e-9
    with pytest.raises(ValueError, match="unknown shape"):
        shape_polygon("octagon", (0.0, 0.0), 1.0, 0.0, 1.0)


def test_a_second_set_with_other_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``shapes`` picks the classes (a fine-tune's target set: two of the default's and three new ones): the
    json's categories follow its order, every class is drawn, the parameters record it, and the default set's
    json records no ``shapes`` (the sets written before it stay complete)."""
    names = ("circle", "triangle", "cross", "arrow", "semicircle")
    config = ShapesConfig(**{**TINY.__dict__, "num_train": 30, "shapes": names})
    write_shapes_dataset(tmp_path / "new", config)
    data = json.loads((tmp_path / "new" / "annotations" / "instances_train2017.json").read_text())
    assert [(c["id"], c["name"]) for c in data["categories"]] == list(enumerate(names, start=1))
    assert {a["category_id"] for a in data["annotations"]} == set(range(1, 6))
    assert data["info"]["parameters"]["shapes"] == list(names)
    assert shapes_dataset_is_complete(tmp_path / "new", config)
    assert not shapes_dataset_is_complete(tmp_path / "new", ShapesConfig(**{**TINY.__dict__, "num_train": 30}))
    write_shapes_dataset(tmp_path / "default", TINY)
    default = json.loads((tmp_path / "default" / "annotations" / "instances_train2017.json").read_text())
    assert "shapes" not in default["info"]["parameters"]
    with pytest.raises(ValueError, match="distinct names"):
        ShapesConfig(shapes=("circle", "circle"))
    module = load_script("tools/make_shapes.py")
    with pytest.raises(SystemExit):
        module.main(["--out", str(tmp_path / "bad"), "--shapes", "circle,octagon"])
    assert "octagon is not one" in capsys.readouterr().err


def test_idempotent_and_detects_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "shapes"
    assert write_shapes_dataset(root, TINY)
    assert shapes_dataset_is_complete(root, TINY)
    assert not write_shapes_dataset(root, TINY)  # complete: nothing written
    (root / "val2017" / "000000000002.jpg").unlink()
    assert not shapes_dataset_is_complete(root, TINY)
    assert write_shapes_dataset(root, TINY)
    assert not shapes_dataset_is_complete(root, ShapesConfig(**{**TINY.__dict__, "num_val": 5}))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="min_object_size"):
        ShapesConfig(min_object_size=50, max_object_size=20)
    with pytest.raises(ValueError, match="image_size"):
        ShapesConfig(image_size=8)


def test_reads_as_coco_and_passes_the_checker(tmp_path: Path) -> None:
    write_shapes_dataset(tmp_path, TINY)
    dataset = CocoDetection(tmp_path / "train2017", tmp_path / "annotations" / "instances_train2017.json")
    assert dataset.category_map.num_classes == len(SHAPE_NAMES) and dataset.category_map.names == SHAPE_NAMES
    image, target = dataset[0]
    assert image.shape == (3, 64, 64)
    problems = check_dataset(tmp_path / "val2017", tmp_path / "annotations" / "instances_val2017.json")
    assert not has_errors(problems), problems


def test_make_shapes_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script("tools/make_shapes.py")
    argv = ["--out", str(tmp_path / "s"), "--num-train", "3", "--num-val", "2", "--image-size", "32",
            "--min-object-size", "6", "--max-object-size", "16"]
    assert module.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert module.main(argv) == 0
    assert "already complete" in capsys.readouterr().out
    assert len(list((tmp_path / "s" / "train2017").glob("*.jpg"))) == 3
    assert module.main([*argv, "--masks", "rle"]) == 0  # other parameters: written again
    written = json.loads((tmp_path / "s" / "annotations" / "instances_val2017.json").read_text())
    assert all(isinstance(a["segmentation"], dict) for a in written["annotations"])
    assert module.main([*argv, "--keypoints"]) == 0  # the keypoint set: written again, with its points
    written = json.loads((tmp_path / "s" / "annotations" / "instances_val2017.json").read_text())
    assert written["info"]["parameters"]["keypoints"] is True and "skeleton" in written["categories"][0]
    assert all("keypoints" in a for a in written["annotations"])


def test_instance_masks_are_the_drawn_pixels(tmp_path: Path) -> None:
    """mask_format="rle" writes what was drawn, pixel for pixel, and the set trains masks (CocoDetection decodes
    them); the default polygons rasterise to nearly the same masks, and the default json records no mask_format
    (the sets written before it stay complete, byte for byte)."""
    from pycocotools import mask as mask_utils

    write_shapes_dataset(tmp_path / "polygons", TINY)
    rle = ShapesConfig(**{**TINY.__dict__, "mask_format": "rle"})
    write_shapes_dataset(tmp_path / "rle", rle)
    polygons = json.loads((tmp_path / "polygons" / "annotations" / "instances_train2017.json").read_text())
    written = json.loads((tmp_path / "rle" / "annotations" / "instances_train2017.json").read_text())
    assert "mask_format" not in polygons["info"]["parameters"] and written["info"]["parameters"]["mask_format"] == "rle"
    assert shapes_dataset_is_complete(tmp_path / "rle", rle) and not shapes_dataset_is_complete(tmp_path / "rle", TINY)

    annotations = iter(written["annotations"])
    polygon_annotations = iter(polygons["annotations"])
    ious = []
    for index in range(TINY.num_train):
        drawn: list[np.ndarray] = []
        render_shapes_image(np.random.default_rng([TINY.seed, 0, index]), TINY, masks=drawn)
        for mask in drawn:
            annotation, polygon = next(annotations), next(polygon_annotations)
            decoded = mask_utils.decode(annotation["segmentation"]).astype(bool)
            assert (decoded == mask).all() and annotation["area"] == decoded.sum()
            assert annotation["segmentation"]["size"] == [64, 64]
            rasterised = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polygon["segmentation"], 64, 64)))
            ious.append((rasterised.astype(bool) & mask).sum() / (rasterised.astype(bool) | mask).sum())
    assert min(ious) > 0.6 and np.mean(ious) > 0.8  # PIL fills the edge pixels pycocotools leaves: 8 px shapes lose most
    dataset = CocoDetection(tmp_path / "rle" / "train2017", tmp_path / "rle" / "annotations" / "instances_train2017.json",
                            masks=True)
    sample = dataset.raw_sample(1)
    assert sample.masks.shape == (len(sample.boxes_xyxy), 64, 64)
    assert not has_errors(check_dataset(tmp_path / "rle" / "train2017",
                                        tmp_path / "rle" / "annotations" / "instances_train2017.json"))


KEYPOINTS = ShapesConfig(num_train=6, num_val=2, image_size=96, min_object_size=16, max_object_size=40,
                         keypoints=True, shapes=ALL_SHAPES)


def test_keypoints_are_the_shapes_corners_inside_their_boxes_and_the_set_passes_the_checks(tmp_path: Path) -> None:
    write_shapes_dataset(tmp_path, KEYPOINTS)
    data = json.loads((tmp_path / "annotations" / "instances_train2017.json").read_text())
    counts = {c["id"]: len(c["keypoints"]) for c in data["categories"]}
    assert counts == {1: 1, 2: 4, 3: 3, 4: 2, 5: 5, 6: 4, 7: 5, 8: 3, 9: 5, 10: 6}
    visibility = []
    for annotation in data["annotations"]:
        points = np.array(annotation["keypoints"]).reshape(-1, 3)
        assert len(points) == counts[annotation["category_id"]]
        x, y, w, h = annotation["bbox"]
        assert (points[:, 0] >= x - 1).all() and (points[:, 0] <= x + w + 1).all()
        assert (points[:, 1] >= y - 1).all() and (points[:, 1] <= y + h + 1).all()
        assert annotation["num_keypoints"] == len(points)
        visibility += points[:, 2].tolist()
    assert set(visibility) == {1, 2}  # some covered, most visible
    assert not has_errors(check_dataset(tmp_path / "train2017", tmp_path / "annotations" /
                                        "instances_train2017.json"))
    dataset = CocoDetection(tmp_path / "train2017", tmp_path / "annotations" / "instances_train2017.json",
                            keypoints=True)
    assert dataset.num_keypoints == 6


def test_a_square_is_numbered_from_its_top_corner_clockwise_and_mirrors_to_n_minus_k() -> None:
    from detr.data.shapes_keypoints import keypoint_category_fields, shape_keypoints

    polygon = shape_polygon("square", (50.0, 50.0), 10.0, 0.1, 0.5)
    points = shape_keypoints("square", polygon, (50.0, 50.0)) - 0.5
    angles = np.degrees(np.arctan2(points[:, 0] - 50, -(points[:, 1] - 50))) % 360
    assert min(angles[0], 360 - angles[0]) <= 45  # the corner nearest twelve o'clock first
    assert (np.diff((angles - angles[0]) % 360) > 0).all()  # then clockwise
    assert keypoint_category_fields("square")["flip_pairs"] == [[1, 3]]
    assert keypoint_category_fields("ellipse")["keypoints"] == ["left_end", "right_end"]


def test_without_keypoints_the_set_is_what_it_was(tmp_path: Path) -> None:
    """The option leaves every existing set byte for byte as before: no parameter, field or random draw added."""
    write_shapes_dataset(tmp_path, TINY)
    data = json.loads((tmp_path / "annotations" / "instances_train2017.json").read_text())
    assert "keypoints" not in data["info"]["parameters"] and "keypoints" not in data["categories"][0]
    assert all("keypoints" not in annotation for annotation in data["annotations"])
