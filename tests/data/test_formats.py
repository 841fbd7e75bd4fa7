"""A data set's format told from its path alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from detr.data.formats import dataset_splits, detect_format
from tests.helpers import write_voc_set, write_yolo_set


def test_each_format_is_told_from_its_path(tmp_path: Path) -> None:
    data_yaml = write_yolo_set(tmp_path / "yolo")
    assert detect_format(data_yaml) == detect_format(data_yaml.parent) == "yolo"
    assert dataset_splits(data_yaml, "yolo") == ["train", "val"]
    assert detect_format(write_voc_set(tmp_path / "voc")) == "voc"
    (tmp_path / "coco" / "annotations").mkdir(parents=True)
    (tmp_path / "coco" / "train.json").write_text("{}")
    assert detect_format(tmp_path / "coco") == detect_format(tmp_path / "coco" / "train.json") == "coco"
    with pytest.raises(ValueError, match="does not exist"):
        detect_format(tmp_path / "nowhere")
    (tmp_path / "photos").mkdir()
    with pytest.raises(ValueError, match="cannot tell the format of .*photos"):
        detect_format(tmp_path / "photos")
    with pytest.raises(ValueError, match=r"looks like a split folder of a YOLO data set .* pass the data\.yaml"):
        detect_format(tmp_path / "yolo" / "images" / "train")
