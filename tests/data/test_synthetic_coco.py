import json
import os

import pytest

from detr.commands.make_synthetic_coco import main
from detr.data.checker import check_dataset, has_errors
from detr.data.coco import CocoDetection
from detr.data.synthetic_coco import SyntheticCocoConfig, write_synthetic_coco


def test_a_small_set_is_a_valid_coco_set_with_coco_categories(tmp_path):
    json_file = write_synthetic_coco(tmp_path, SyntheticCocoConfig(num_images=30, boxes_per_image=5, seed=1))
    data = json.loads(json_file.read_text())
    assert len(data["images"]) == 30 and len(data["categories"]) == 80
    assert {c["id"] for c in data["categories"]} == {c for c in range(1, 91)} - {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}
    assert 50 < len(data["annotations"]) < 250  # Poisson(5) per image
    assert all("segmentation" not in a for a in data["annotations"])
    dataset = CocoDetection(tmp_path / "train2017", json_file)
    assert len(dataset) == 30
    sample = dataset.raw_sample(0)
    assert sample.pixels.shape[:2] == (data["images"][0]["height"], data["images"][0]["width"])
    assert not has_errors(check_dataset(tmp_path / "train2017", json_file))
    # Every file is a hard link to one of the few encoded JPEGs.
    assert os.stat(tmp_path / "train2017" / data["images"][0]["file_name"]).st_nlink > 1
    assert sorted(os.listdir(tmp_path / "train2017")) == sorted(i["file_name"] for i in data["images"])


def test_polygons_and_own_category_ids(tmp_path):
    json_file = write_synthetic_coco(tmp_path, SyntheticCocoConfig(num_images=4, boxes_per_image=3, polygons=True,
                                                                   category_ids=(7, 9)), split="val2017")
    data = json.loads(json_file.read_text())
    assert [c["id"] for c in data["categories"]] == [7, 9]
    for annotation in data["annotations"]:
        x, y, w, h = annotation["bbox"]
        assert annotation["segmentation"] == [[x, y, x + w, y, x + w, y + h, x, y + h]]
        assert annotation["category_id"] in (7, 9)


def test_bad_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="num_images"):
        write_synthetic_coco(tmp_path, SyntheticCocoConfig(num_images=0))
    with pytest.raises(ValueError, match="category_ids"):
        write_synthetic_coco(tmp_path, SyntheticCocoConfig(num_images=2, category_ids=(1, 1)))


def test_command_writes_train_and_val(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--images", "12", "--val-images", "3", "--boxes-per-image", "2"]) == 0
    assert len(os.listdir(tmp_path / "train2017")) == 12 and len(os.listdir(tmp_path / "val2017")) == 3
    assert (tmp_path / "annotations" / "instances_val2017.json").is_file()
    assert "wrote 12 images" in capsys.readouterr().out
