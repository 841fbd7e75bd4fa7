"""The Pascal VOC reader: 1-based inclusive corners as COCO pixel boxes, difficult objects as crowd (ignored), the
same boxes and names as supervision reads; a malformed xml named by its file and line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detr.data.converted import LabelFileError
from detr.data.formats import dataset_splits, detect_format
from detr.data.voc import read_voc_split
from tests.helpers import VOC_IMAGES, write_voc_set


def test_corners_become_coco_boxes_and_difficult_objects_are_ignored(tmp_path: Path) -> None:
    split = read_voc_split(write_voc_set(tmp_path), "train")
    assert split.problems == [] and split.images_dir == tmp_path / "JPEGImages"
    assert split.source == tmp_path / "ImageSets" / "Main" / "train.txt"
    assert [c["name"] for c in split.data["categories"]] == ["cat", "dog", "person"]  # every split's classes
    dog, person = split.data["annotations"]
    assert dog["bbox"] == [0, 0, 32, 24] and dog["iscrowd"] == 0  # xmin 1 .. xmax 32: the first 32 pixels
    assert person["bbox"] == [9, 4, 31, 41] and person["iscrowd"] == 1 and person["difficult"] == 1
    assert [(i["file_name"], i["width"], i["height"]) for i in split.data["images"]] == [
        ("2008_000001.jpg", 64, 48), ("2008_000002.jpg", 48, 64)]
    assert detect_format(tmp_path) == "voc" and dataset_splits(tmp_path, "voc") == ["train", "val"]


def test_boxes_and_names_match_supervision(tmp_path: Path) -> None:
    sv = pytest.importorskip("supervision")
    root = write_voc_set(tmp_path)
    theirs = sv.DetectionDataset.from_pascal_voc(str(root / "JPEGImages"), str(root / "Annotations"))
    ours = {}
    for split_name in VOC_IMAGES:
        split = read_voc_split(root, split_name)
        names = {c["id"]: c["name"] for c in split.data["categories"]}
        files = {i["id"]: i["file_name"] for i in split.data["images"]}
        for image_id, file_name in files.items():
            ours[file_name] = [(names[a["category_id"]], [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                                                          a["bbox"][1] + a["bbox"][3]])
                               for a in split.data["annotations"] if a["image_id"] == image_id]
    compared = 0
    for path, _, detections in theirs:
        expected = [(theirs.classes[c], list(box)) for c, box in zip(detections.class_id, detections.xyxy)]
        found = ours[Path(path).name]
        assert [n for n, _ in found] == [n for n, _ in expected]
        np.testing.assert_allclose([b for _, b in found] or np.zeros((0, 4)),
                                   [b for _, b in expected] or np.zeros((0, 4)))
        compared += 1
    assert compared == sum(len(images) for images in VOC_IMAGES.values())


def test_a_malformed_xml_and_a_bad_object_are_named(tmp_path: Path) -> None:
    root = write_voc_set(tmp_path)
    broken = root / "Annotations" / "2008_000002.xml"
    broken.write_text("<annotation>\n<filename>2008_000002.jpg</filename>\n<object><name>dog</object>\n")
    (root / "Annotations" / "2008_000001.xml").write_text(
        "<annotation><filename>2008_000001.jpg</filename><object><name>dog</name><bndbox><xmin>30</xmin>"
        "<ymin>1</ymin><xmax>3</xmax><ymax>9</ymax></bndbox></object></annotation>")
    split = read_voc_split(root, "train")
    kinds = {problem.kind: problem for problem in split.problems}
    assert kinds["invalid_xml"].path == broken and kinds["invalid_xml"].line == 3
    assert str(kinds["invalid_xml"]).startswith(f"{broken}:3: not well-formed XML")
    assert "xmin <= xmax" in kinds["invalid_bbox"].message
    with pytest.raises(LabelFileError, match="2 label problem"):
        split.require_clean()


def test_a_missing_split_file_says_what_to_write(tmp_path: Path) -> None:
    root = write_voc_set(tmp_path)
    with pytest.raises(LabelFileError, match=r"no test\.txt: list the test split's image ids"):
        read_voc_split(root, "test")
    (root / "ImageSets" / "Main" / "train.txt").rename(root / "ImageSets" / "Main" / "trainval.txt")
    assert read_voc_split(root, "train").source.name == "trainval.txt"


def test_a_filename_without_its_suffix_finds_the_image_of_its_id(tmp_path: Path) -> None:
    root = write_voc_set(tmp_path)
    xml_file = root / "Annotations" / "2008_000003.xml"
    xml_file.write_text(xml_file.read_text().replace("<filename>2008_000003.jpg<", "<filename>2008_000003<"))
    assert read_voc_split(root, "val").data["images"][0]["file_name"] == "2008_000003.jpg"


def test_without_image_sets_every_xml_is_the_train_split(tmp_path: Path) -> None:
    import shutil

    root = write_voc_set(tmp_path)
    shutil.rmtree(root / "ImageSets")
    split = read_voc_split(root, "train")
    assert len(split.data["images"]) == 3 and split.source == root / "Annotations"
    assert dataset_splits(root, "voc") == ["train"]
    with pytest.raises(LabelFileError, match=r"no ImageSets/Main/: .* write ImageSets/Main/val\.txt"):
        read_voc_split(root, "val")
