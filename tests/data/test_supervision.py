"""supervision's DetectionDataset in and out (detr.data.supervision): our YOLO and VOC readers' data sets are the
ones supervision reads from the same folders; a DetectionDataset written as COCO json reads back (by supervision
and by our data set) with the same boxes, names and masks. (`import detr` without supervision:
tests/test_imports.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detr.data.coco import load_coco_json
from detr.data.supervision import (
    coco_from_detection_dataset,
    detection_dataset_from_coco,
    load_detection_dataset,
    write_coco_json,
)
from tests.helpers import write_voc_set, write_yolo_set

sv = pytest.importorskip("supervision")


def objects(dataset) -> dict[str, list[tuple[str, tuple[float, ...]]]]:
    """DetectionDataset → {image file name: sorted [(class name, xyxy)]}."""
    found = {}
    for path in dataset.image_paths:
        detections = dataset.annotations[path]
        names = [dataset.classes[int(class_id)] for class_id in detections.class_id] if len(detections) else []
        found[Path(path).name] = sorted((name, tuple(np.round(box, 3).tolist()))
                                        for name, box in zip(names, detections.xyxy))
    return found


def test_a_yolo_split_reads_as_supervision_reads_it(tmp_path: Path) -> None:
    write_yolo_set(tmp_path)
    ours = load_detection_dataset(tmp_path, split="val")
    theirs = sv.DetectionDataset.from_yolo(images_directory_path=str(tmp_path / "images" / "val"),
                                           annotations_directory_path=str(tmp_path / "labels" / "val"),
                                           data_yaml_path=str(tmp_path / "data.yaml"))
    assert ours.classes == theirs.classes
    assert objects(ours) == objects(theirs)


def test_a_voc_split_reads_as_supervision_reads_it(tmp_path: Path) -> None:
    """Difficult objects are crowd boxes in our reading, left out of a DetectionDataset; the rest agree."""
    write_voc_set(tmp_path)
    ours = load_detection_dataset(tmp_path, split="val")
    theirs = sv.DetectionDataset.from_pascal_voc(images_directory_path=str(tmp_path / "JPEGImages"),
                                                 annotations_directory_path=str(tmp_path / "Annotations"))
    assert objects(ours)["2008_000003.jpg"] == objects(theirs)["2008_000003.jpg"] == [("cat", (4.0, 5.0, 64.0, 48.0))]


def _dataset_with_masks(tmp_path: Path):
    from PIL import Image

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths = [tmp_path / "a" / "x.png", tmp_path / "b" / "x.png", tmp_path / "a" / "empty.png"]
    for path in paths:
        Image.new("RGB", (40, 30)).save(path)
    mask = np.zeros((2, 30, 40), dtype=bool)
    mask[0, 2:10, 3:13] = True
    mask[1, 15:30, 20:40] = True
    annotations = {
        str(paths[0]): sv.Detections(xyxy=np.array([[3, 2, 13, 10], [20, 15, 40, 30]], dtype=np.float32),
                                     class_id=np.array([1, 0]), mask=mask),
        str(paths[1]): sv.Detections(xyxy=np.array([[3, 2, 13, 10], [20, 15, 40, 30]], dtype=np.float32),
                                     class_id=np.array([0, 0]), mask=mask),
        str(paths[2]): sv.Detections.empty(),
    }
    return sv.DetectionDataset(classes=["circle", "square"], images=[str(path) for path in paths],
                               annotations=annotations)


def test_a_detection_dataset_round_trips_through_coco(tmp_path: Path) -> None:
    """Same-named images in two folders stay apart (file names relative to their common folder); boxes, class
    names and masks come back; the written json is what supervision's own from_coco reads as the same data set."""
    dataset = _dataset_with_masks(tmp_path)
    data, images_dir = coco_from_detection_dataset(dataset)
    assert images_dir == tmp_path.resolve()
    assert [image["file_name"] for image in data["images"]] == ["a/x.png", "b/x.png", "a/empty.png"]
    assert data["categories"] == [{"id": 0, "name": "circle"}, {"id": 1, "name": "square"}]
    assert data["annotations"][0]["bbox"] == [3.0, 2.0, 10.0, 8.0] and data["annotations"][0]["area"] == 80.0

    back = detection_dataset_from_coco(data, images_dir, masks=True)
    assert back.classes == dataset.classes
    for original, path in zip(dataset.image_paths, back.image_paths):
        assert Path(path).resolve() == Path(original).resolve()
        np.testing.assert_array_equal(back.annotations[path].xyxy, dataset.annotations[original].xyxy)
        np.testing.assert_array_equal(back.annotations[path].class_id, dataset.annotations[original].class_id)
        if len(dataset.annotations[original]):
            np.testing.assert_array_equal(back.annotations[path].mask, dataset.annotations[original].mask)

    out = tmp_path / "instances.json"
    assert write_coco_json(dataset, out) == images_dir
    theirs = sv.DetectionDataset.from_coco(images_directory_path=str(images_dir), annotations_path=str(out),
                                           force_masks=True)
    assert theirs.classes == dataset.classes
    for original, path in zip(dataset.image_paths, theirs.image_paths):
        np.testing.assert_allclose(theirs.annotations[path].xyxy, dataset.annotations[original].xyxy)
        if len(dataset.annotations[original]):
            np.testing.assert_array_equal(theirs.annotations[path].mask, dataset.annotations[original].mask)


def test_the_written_json_is_a_data_set_detr_trains_on(tmp_path: Path) -> None:
    """The json and its folder pass the COCO data set's reading: the objects' pixel boxes and labels."""
    from detr.data.coco import CocoDetection

    dataset = _dataset_with_masks(tmp_path)
    out = tmp_path / "instances.json"
    images_dir = write_coco_json(dataset, out)
    coco = CocoDetection(images_dir, out)
    _, target = coco[0]
    first = dataset.annotations[dataset.image_paths[0]]
    np.testing.assert_allclose(target["boxes_xyxy"].numpy(), first.xyxy)
    assert target["labels"].tolist() == first.class_id.tolist()
    assert load_coco_json(out)["images"][1]["file_name"] == "b/x.png"


def test_a_coco_json_needs_its_images_folder(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"images": [], "annotations": [], "categories": []}')
    with pytest.raises(ValueError, match="pass images=FOLDER"):
        load_detection_dataset(tmp_path / "x.json")



def test_supervisions_yolo_reading_converts_to_our_yolo_reading(tmp_path: Path) -> None:
    """A DetectionDataset that supervision read from a YOLO folder, converted here, is the COCO dict our own reader
    makes of that folder: the same files, sizes, class names and pixel boxes."""
    from detr.data.yolo import read_yolo_split

    write_yolo_set(tmp_path)
    theirs = sv.DetectionDataset.from_yolo(images_directory_path=str(tmp_path / "images" / "val"),
                                           annotations_directory_path=str(tmp_path / "labels" / "val"),
                                           data_yaml_path=str(tmp_path / "data.yaml"))
    data, images_dir = coco_from_detection_dataset(theirs)
    ours = read_yolo_split(tmp_path, "val")
    assert images_dir == ours.images_dir.resolve()

    def boxes(coco: dict) -> dict[str, list]:
        names = {category["id"]: category["name"] for category in coco["categories"]}
        images = {image["id"]: image for image in coco["images"]}
        found = {(image["file_name"], image["width"], image["height"]): [] for image in images.values()}
        for annotation in coco["annotations"]:
            image = images[annotation["image_id"]]
            found[(image["file_name"], image["width"], image["height"])].append(
                (names[annotation["category_id"]], [round(value, 3) for value in annotation["bbox"]]))
        return {key: sorted(value) for key, value in found.items()}

    assert boxes(data) == boxes(ours.data)
