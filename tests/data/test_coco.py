"""The COCO data set: box conversion, crowd, categories, and every bad input named by its file."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from detr.categories import COCO_CATEGORIES, CategoryMap
from detr.data.coco import (
    AnnotationFileError,
    CocoDetection,
    ImageSizeMismatchError,
    category_map_from_categories,
    coco_boxes_to_xyxy,
    load_coco_json,
)
from detr.data.coco_index import CocoIndex
from detr.data.collate import collate_detection
from detr.data.images import ImageLoadError
from detr.data.transforms import make_train_transform

CATEGORIES = [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}]  # not COCO's → contiguous labels 0, 1


def write_image(path: Path, height: int = 40, width: int = 60, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    colour: Any = {"RGB": (90, 120, 200), "L": 128, "RGBA": (10, 20, 30, 128), "CMYK": (0, 255, 255, 0)}[mode]
    Image.new(mode, (width, height), colour).save(path, **({"quality": 95} if path.suffix == ".jpg" else {}))


def make_dataset(root: Path, images: list[dict], annotations: list[dict], categories: list[dict] = CATEGORIES,
                 write_files: bool = True) -> tuple[Path, Path]:
    """images: dicts with id, file_name, height, width (+ optional 'mode'); returns (images_dir, json)."""
    images_dir = root / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    if write_files:
        for image in images:
            write_image(images_dir / image["file_name"], image["height"], image["width"], image.pop("mode", "RGB"))
    for image in images:
        image.pop("mode", None)
    annotations_file = root / "instances.json"
    annotations_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return images_dir, annotations_file


def ann(ann_id: int, image_id: int, bbox: list[float], category_id: int = 3, iscrowd: int = 0) -> dict:
    return {"id": ann_id, "image_id": image_id, "bbox": bbox, "category_id": category_id, "iscrowd": iscrowd,
            "area": bbox[2] * bbox[3]}


def basic(tmp_path: Path) -> tuple[Path, Path]:
    images = [{"id": 1, "file_name": "a.jpg", "height": 40, "width": 60},
              {"id": 2, "file_name": "b.jpg", "height": 30, "width": 30}]
    annotations = [
        ann(10, 1, [5, 6, 10, 20], 3),
        ann(11, 1, [50, 30, 20, 20], 7),    # partly outside: clamped to x1=60, y1=40
        ann(12, 1, [1, 1, 0, 10], 3),       # zero width: dropped
        ann(13, 1, [0, 0, 60, 40], 7, 1),   # crowd: not a training target
        ann(14, 1, [70, 50, 5, 5], 3),      # entirely outside: emptied by the clamp, dropped
    ]
    return make_dataset(tmp_path, images, annotations)


def test_boxes_crowd_zero_size_and_clamping(tmp_path: Path) -> None:
    dataset = CocoDetection(*basic(tmp_path))
    assert len(dataset) == 2 and dataset.ids == [1, 2]
    raw = dataset.raw_sample(0)
    np.testing.assert_allclose(raw.boxes_xyxy, [[5, 6, 15, 26], [50, 30, 60, 40]])
    assert raw.labels.tolist() == [0, 1] and raw.labels.dtype == np.int64
    image, target = dataset[0]
    assert image.shape == (3, 40, 60) and image.dtype == torch.float32
    torch.testing.assert_close(target["boxes_xyxy"], torch.tensor([[5.0, 6, 15, 26], [50, 30, 60, 40]]))
    assert target["labels"].tolist() == [0, 1] and int(target["image_id"]) == 1
    assert target["orig_size"].tolist() == [40, 60] and target["size"].tolist() == [40, 60]
    # the crowd box stays in the evaluation ground truth
    assert {a["id"] for a in dataset.coco.imgToAnns[1]} == {10, 11, 12, 13, 14}
    assert dataset.coco.anns[13]["iscrowd"] == 1


def test_image_without_annotations(tmp_path: Path) -> None:
    dataset = CocoDetection(*basic(tmp_path))
    image, target = dataset[1]
    assert target["boxes_xyxy"].shape == (0, 4) and target["labels"].shape == (0,)
    images, mask, targets = collate_detection([dataset[0], dataset[1]])
    assert targets[1]["boxes"].shape == (0, 4)


def test_coco_boxes_to_xyxy() -> None:
    boxes, keep = coco_boxes_to_xyxy(np.array([[-5, -5, 10, 10], [0, 0, 0, 5], [8, 8, 10, 10]]), 10, 12)
    np.testing.assert_allclose(boxes, [[0, 0, 5, 5], [0, 0, 0, 5], [8, 8, 12, 10]])
    assert keep.tolist() == [True, False, True]
    boxes, keep = coco_boxes_to_xyxy(np.zeros((0, 4)), 10, 10)
    assert boxes.shape == (0, 4) and keep.shape == (0,)


def test_category_maps() -> None:
    coco_categories = [{"id": i, "name": n} for i, n in COCO_CATEGORIES]
    assert category_map_from_categories(coco_categories) == CategoryMap.coco()  # raw ids, 91 classes
    assert category_map_from_categories(coco_categories, "contiguous").num_classes == 80
    custom = category_map_from_categories(CATEGORIES)
    assert custom.category_ids == (3, 7) and custom.names == ("cat", "dog")
    assert category_map_from_categories(CATEGORIES, "raw").num_classes == 8
    with pytest.raises(ValueError, match="category_ids"):
        category_map_from_categories(CATEGORIES, "sorted")  # type: ignore[arg-type]


def test_raw_category_ids_for_coco(tmp_path: Path) -> None:
    categories = [{"id": i, "name": n} for i, n in COCO_CATEGORIES]
    images = [{"id": 5, "file_name": "x.png", "height": 20, "width": 20}]
    dataset = CocoDetection(*make_dataset(tmp_path, images, [ann(1, 5, [1, 1, 5, 5], 90)], categories))
    assert dataset.category_map.num_classes == 91
    assert dataset[0][1]["labels"].tolist() == [90]


def test_category_map_of_another_split_must_cover_this_one(tmp_path: Path) -> None:
    images_dir, annotations_file = basic(tmp_path)
    other = CategoryMap(category_ids=(3,), names=("cat",))
    with pytest.raises(ValueError, match="category id 7"):
        CocoDetection(images_dir, annotations_file, category_map=other)


def test_unknown_category_id_names_file_and_annotation(tmp_path: Path) -> None:
    images = [{"id": 1, "file_name": "a.jpg", "height": 40, "width": 60}]
    images_dir, annotations_file = make_dataset(tmp_path, images, [ann(77, 1, [1, 1, 5, 5], category_id=99)])
    with pytest.raises(AnnotationFileError) as info:
        CocoDetection(images_dir, annotations_file)
    message = str(info.value)
    assert str(annotations_file) in message and "annotation 77" in message and "'a.jpg'" in message
    assert "category_id 99" in message and "detr-check-data" in message


def test_other_invalid_annotations(tmp_path: Path) -> None:
    images = [{"id": 1, "file_name": "a.jpg", "height": 40, "width": 60}]
    bad = [ann(1, 1, [1, 1, 5, 5]), ann(1, 1, [1, 1, 5, 5]), ann(2, 42, [1, 1, 5, 5]),
           {"id": 3, "image_id": 1, "bbox": [1, "x", 2, 2], "category_id": 3}]
    images_dir, annotations_file = make_dataset(tmp_path, images, bad)
    with pytest.raises(AnnotationFileError) as info:
        CocoDetection(images_dir, annotations_file)
    message = str(info.value)
    assert "annotation id 1 is used twice" in message and "image id 42" in message and "annotation 3" in message


def test_malformed_json_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"images": [],\n  "annotations": [,]\n}')
    with pytest.raises(AnnotationFileError) as info:
        load_coco_json(path)
    message = str(info.value)
    assert "broken.json" in message and "line 2 column 19" in message and "character" in message
    with pytest.raises(AnnotationFileError, match="broken.json"):
        CocoDetection(tmp_path, path)
    with pytest.raises(AnnotationFileError, match="does not exist"):
        load_coco_json(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(AnnotationFileError, match="list"):
        load_coco_json(tmp_path / "list.json")
    (tmp_path / "partial.json").write_text('{"images": []}')
    with pytest.raises(AnnotationFileError, match="'categories'"):
        CocoDetection(tmp_path, tmp_path / "partial.json")


def test_grayscale_rgba_cmyk_images(tmp_path: Path) -> None:
    images = [{"id": 1, "file_name": "gray.png", "height": 20, "width": 30, "mode": "L"},
              {"id": 2, "file_name": "rgba.png", "height": 20, "width": 30, "mode": "RGBA"},
              {"id": 3, "file_name": "cmyk.jpg", "height": 20, "width": 30, "mode": "CMYK"}]
    dataset = CocoDetection(*make_dataset(tmp_path, images, [ann(1, 3, [2, 2, 10, 10])]))
    images_batch, _, targets = collate_detection([dataset[i] for i in range(3)])
    assert images_batch.shape == (3, 3, 20, 30)
    assert targets[2]["labels"].tolist() == [0]


def make_exif_rotated(tmp_path: Path, json_in_displayed_frame: bool) -> tuple[Path, Path]:
    """A photo stored 60x40 (w x h) with EXIF orientation 6 (displayed 40x60) and a red object.

    The object is stored at x 5..25, y 25..35; displayed (rotated 90 degrees clockwise) it covers
    x 5..15, y 5..25. The annotation is that displayed box.
    """
    stored = np.full((40, 60, 3), 30, np.uint8)
    stored[25:35, 5:25] = (255, 0, 0)
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(images_dir / "photo.jpg", exif=exif.tobytes(), quality=95)
    height, width = (60, 40) if json_in_displayed_frame else (40, 60)
    images = [{"id": 1, "file_name": "photo.jpg", "height": height, "width": width}]
    return make_dataset(tmp_path, images, [ann(1, 1, [5, 5, 10, 20])], write_files=False)


def test_exif_rotated_photo_boxes_follow_the_rotation(tmp_path: Path) -> None:
    dataset = CocoDetection(*make_exif_rotated(tmp_path, json_in_displayed_frame=True))
    raw = dataset.raw_sample(0)
    assert raw.pixels.shape == (60, 40, 3)
    x0, y0, x1, y1 = raw.boxes_xyxy[0].astype(int)
    inside = raw.pixels[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1].reshape(-1, 3).mean(0)
    assert inside[0] > 200 and inside[1] < 60  # the box sits on the red object
    # and still does after flip / resize / crop
    dataset.transform = make_train_transform(scales=(64, 80), max_size=200, crop_resize_scales=(60,),
                                             crop_min_size=50, crop_max_size=60, seed=0)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    for _ in range(10):
        image, target = dataset[0]
        pixels = (image.permute(1, 2, 0).numpy() * std + mean) * 255
        for box in target["boxes_xyxy"].numpy():
            x0, y0, x1, y1 = box
            if min(x1 - x0, y1 - y0) < 6:
                continue
            patch = pixels[int(np.ceil(y0)) + 2 : int(y1) - 2, int(np.ceil(x0)) + 2 : int(x1) - 2].reshape(-1, 3)
            assert patch.mean(0)[0] > 180 and patch.mean(0)[1] < 80


def test_exif_rotated_photo_annotated_on_stored_pixels_is_an_error(tmp_path: Path) -> None:
    dataset = CocoDetection(*make_exif_rotated(tmp_path, json_in_displayed_frame=False))
    with pytest.raises(ImageSizeMismatchError) as info:
        dataset[0]
    message = str(info.value)
    assert "photo.jpg" in message and "instances.json" in message and "EXIF orientation 6" in message


def corrupt_files(tmp_path: Path) -> tuple[Path, Path]:
    images = [{"id": i, "file_name": f"{i}.jpg", "height": 40, "width": 60} for i in range(1, 5)]
    images_dir, annotations_file = make_dataset(tmp_path, images, [ann(i, i, [1, 1, 9, 9]) for i in range(1, 5)])
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(images_dir / "2.jpg")
    data = (images_dir / "2.jpg").read_bytes()
    (images_dir / "2.jpg").write_bytes(data[: len(data) // 2])  # truncated JPEG
    (images_dir / "3.jpg").write_text("not an image")  # a text file named .jpg
    return images_dir, annotations_file


def test_missing_image_fails_at_start_naming_file_and_json(tmp_path: Path) -> None:
    images_dir, annotations_file = basic(tmp_path)
    (images_dir / "b.jpg").unlink()
    with pytest.raises(ImageLoadError) as info:
        CocoDetection(images_dir, annotations_file)
    assert "b.jpg" in str(info.value) and str(annotations_file) in str(info.value)
    assert "skip_bad_images" in str(info.value)


def test_missing_image_skipped_with_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    images_dir, annotations_file = basic(tmp_path)
    (images_dir / "b.jpg").unlink()
    with caplog.at_level(logging.WARNING, logger="detr.data.coco"):
        dataset = CocoDetection(images_dir, annotations_file, skip_bad_images=True)
    assert dataset.ids == [1] and "b.jpg" in caplog.text and "skipping 1 image" in caplog.text


@pytest.mark.parametrize(("file_name", "reason"), [("2.jpg", "truncated"), ("3.jpg", "not an image")])
def test_bad_file_through_dataloader_names_the_file(tmp_path: Path, file_name: str, reason: str) -> None:
    dataset = CocoDetection(*corrupt_files(tmp_path))
    loader = DataLoader(dataset, batch_size=4, num_workers=0, collate_fn=collate_detection)
    with pytest.raises(ImageLoadError, match=reason) as info:
        next(iter(DataLoader(torch.utils.data.Subset(dataset, [dataset.ids.index(int(file_name[0]))]),
                             num_workers=0, collate_fn=collate_detection)))
    assert file_name in str(info.value) and "instances.json" in str(info.value)
    with pytest.raises(ImageLoadError):
        next(iter(loader))


def test_file_deleted_after_start_through_dataloader(tmp_path: Path) -> None:
    images_dir, annotations_file = basic(tmp_path)
    dataset = CocoDetection(images_dir, annotations_file)
    (images_dir / "a.jpg").unlink()
    with pytest.raises(ImageLoadError, match="a.jpg.*does not exist"):
        next(iter(DataLoader(dataset, batch_size=2, num_workers=0, collate_fn=collate_detection)))


def test_worker_error_names_the_file(tmp_path: Path) -> None:
    dataset = CocoDetection(*corrupt_files(tmp_path))
    loader = DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=collate_detection)
    with pytest.raises(ImageLoadError) as info:  # re-raised in the main process with its type
        next(iter(loader))
    assert "2.jpg" in str(info.value) and "instances.json" in str(info.value)


def test_skip_bad_images_counts_and_substitutes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dataset = CocoDetection(*corrupt_files(tmp_path), skip_bad_images=True)
    with caplog.at_level(logging.WARNING, logger="detr.data.coco"):
        batches = list(DataLoader(dataset, batch_size=4, num_workers=0, collate_fn=collate_detection))
    targets = batches[0][2]
    assert len(targets) == 4  # bad images replaced, the batch keeps its size
    assert [int(t["image_id"]) for t in targets] == [1, 4, 4, 4]
    assert dataset.num_skipped == 3  # 2.jpg, 3.jpg, then 3.jpg again on the way from index 2
    assert "2.jpg" in caplog.text and "3.jpg" in caplog.text
    assert len(caplog.records) == 2  # once per file, though 3.jpg was skipped twice


def test_transform_failure_names_the_file(tmp_path: Path) -> None:
    def broken(**kwargs: Any) -> dict:
        raise KeyError("boom")

    dataset = CocoDetection(*basic(tmp_path), transform=broken)
    with pytest.raises(RuntimeError, match=r"a\.jpg.*instances\.json.*boom"):
        dataset[0]


def test_a_data_set_error_gives_data_set_advice(tmp_path: Path) -> None:
    dataset = CocoDetection(*corrupt_files(tmp_path))
    with pytest.raises(ImageLoadError) as info:
        dataset.raw_sample(dataset.ids.index(2))
    message = str(info.value)
    assert "2.jpg" in message and "instances.json" in message and "truncated" in message
    assert "remove the image from the annotation json" in message and "skip_bad_images" in message


def test_skip_unreadable_warns_once_per_file_and_marks_the_substitute(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # What the training set does mid-run: a file that fails to decode is replaced, each file is named once
    # (not once per epoch), and the sample that took its place says whom it replaced, for the epoch's count.
    dataset = CocoDetection(*corrupt_files(tmp_path), skip_unreadable=True)
    loader = DataLoader(dataset, batch_size=4, num_workers=0, collate_fn=collate_detection)
    with caplog.at_level(logging.WARNING, logger="detr.data.coco"):
        first = list(loader)[0][2]
        second = list(loader)[0][2]
    assert [int(t["image_id"]) for t in first] == [1, 4, 4, 4]
    assert [t.get("skipped_files", []) for t in first][1:3] == [[str(tmp_path / "images" / "2.jpg"),
                                                                  str(tmp_path / "images" / "3.jpg")],
                                                                 [str(tmp_path / "images" / "3.jpg")]]
    assert "skipped_files" in second[1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "2.jpg" in warnings[0] and "3.jpg" in warnings[1]
    assert "truncated" in warnings[0] and "detr-check-data" in warnings[0]
    caplog.clear()
    copy = pickle.loads(pickle.dumps(dataset))  # what a DataLoader worker of the next epoch loads
    with caplog.at_level(logging.WARNING, logger="detr.data.coco"):
        copy[1]
    assert not caplog.records  # the set of named files travels with the data set
    with pytest.raises(ImageLoadError, match="gone.jpg'; restore them"):  # a file missing at start-up still stops
        CocoDetection(tmp_path / "images", tmp_path / "instances.json", skip_unreadable=True,
                      coco_data={**json.loads((tmp_path / "instances.json").read_text()),
                                 "images": [{"id": 9, "file_name": "gone.jpg"}], "annotations": []})


@pytest.mark.parametrize("file_name", ["../outside.jpg", "sub/../../outside.jpg", "..\\outside.jpg", "ABSOLUTE"])
def test_a_file_name_outside_the_images_folder_is_refused(tmp_path: Path, file_name: str) -> None:
    """'../../x.jpg' or an absolute path was read from outside the images folder and trained on."""
    write_image(tmp_path / "outside.jpg")
    if file_name == "ABSOLUTE":
        file_name = str(tmp_path / "outside.jpg")
    images_dir, annotations_file = make_dataset(tmp_path, [{"id": 5, "file_name": file_name, "height": 40,
                                                            "width": 60}], [ann(1, 5, [1, 1, 5, 5])],
                                                write_files=False)
    with pytest.raises(AnnotationFileError) as error:
        CocoDetection(images_dir, annotations_file)
    message = str(error.value)
    assert str(annotations_file) in message and "(image id 5)" in message and "\n" not in message
    assert "relative to the images folder" in message


def test_windows_file_names_are_read_with_backslashes_as_separators(tmp_path: Path) -> None:
    """'sub\\000001.jpg' was reported as a missing image."""
    images_dir, annotations_file = make_dataset(tmp_path, [{"id": 1, "file_name": "sub/a.jpg", "height": 40,
                                                            "width": 60}], [ann(1, 1, [1, 1, 5, 5])])
    data = json.loads(annotations_file.read_text())
    data["images"][0]["file_name"] = "sub\\a.jpg"
    annotations_file.write_text(json.dumps(data))
    dataset = CocoDetection(images_dir, annotations_file)
    assert dataset.image_path(0) == images_dir / "sub" / "a.jpg"
    assert dataset[0][1]["labels"].tolist() == [0]


def test_a_mask_that_cannot_be_decoded_names_the_annotation_and_the_image(tmp_path: Path) -> None:
    """A corrupt RLE ended fit at step 1 with a pycocotools traceback that named no annotation: refused when the
    data set is built, and named (annotation id, image file) if one is ever decoded."""
    square = [[1, 1, 11, 1, 11, 11, 1, 11]]
    annotations = [{**ann(10, 1, [1, 1, 10, 10]), "segmentation": square},
                   {**ann(11, 1, [20, 20, 10, 10]), "segmentation": {"size": [40, 60], "counts": "garbage!!"}}]
    images_dir, annotations_file = make_dataset(
        tmp_path, [{"id": 1, "file_name": "a.jpg", "height": 40, "width": 60}], annotations)
    with pytest.raises(AnnotationFileError, match="annotation 11 has a compressed RLE 'counts' string that is corrupt"):
        CocoDetection(images_dir, annotations_file, masks=True)
    # a data set built before the file went bad (or a decode the start-up check cannot foresee)
    data = json.loads(annotations_file.read_text())
    data["annotations"][1]["segmentation"] = square
    annotations_file.write_text(json.dumps(data))
    dataset = CocoDetection(images_dir, annotations_file, masks=True)
    data["annotations"][1]["segmentation"] = {"size": [40, 60], "counts": "garbage!!"}
    dataset.index = CocoIndex.from_coco_dict(data, segmentations=True)
    with pytest.raises(AnnotationFileError) as error:
        dataset[0]
    message = str(error.value)
    assert message.startswith(f"annotation 11 of image file '{images_dir / 'a.jpg'}' in '{annotations_file}'")
    assert "cannot be decoded" in message and "--data.masks false" in message
