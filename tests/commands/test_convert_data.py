"""detr-convert-data: YOLO and VOC → COCO json that supervision reads as the same boxes and names as it reads the
source; COCO json → YOLO and back; a bad label stops the conversion naming its file and line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detr.commands import convert_data
from detr.data.checker import check_dataset, format_problems, has_errors
from tests.helpers import VOC_IMAGES, YOLO_IMAGES, write_voc_set, write_yolo_set


def _by_name(dataset) -> dict[str, list[tuple[str, list[float]]]]:
    """supervision data set → {file name: [(class name, xyxy)]}, sorted."""
    return {Path(path).name: sorted((dataset.classes[c], [round(float(v), 3) for v in box])
                                    for c, box in zip(detections.class_id, detections.xyxy))
            for path, _, detections in dataset}


@pytest.mark.parametrize("source", ["yolo", "voc"])
def test_supervision_reads_the_json_as_it_reads_the_source(tmp_path: Path, source: str, capsys) -> None:
    sv = pytest.importorskip("supervision")
    if source == "yolo":
        data = write_yolo_set(tmp_path / "data")
        theirs = sv.DetectionDataset.from_yolo(str(tmp_path / "data" / "images" / "val"),
                                               str(tmp_path / "data" / "labels" / "val"), str(data))
        images = tmp_path / "data" / "images" / "val"
    else:
        data = write_voc_set(tmp_path / "data")
        theirs = sv.DetectionDataset.from_pascal_voc(str(data / "JPEGImages"), str(data / "Annotations"))
        images = data / "JPEGImages"
    out = tmp_path / "val.json"
    assert convert_data.main([str(data), "--split", "val", "--out", str(out)]) == 0
    assert f"relative to {images}" in capsys.readouterr().out
    problems = check_dataset(images, out, min_images_per_class=0)
    assert not has_errors(problems), format_problems(problems)
    ours = _by_name(sv.DetectionDataset.from_coco(str(images), str(out)))
    expected = _by_name(theirs)
    if source == "voc":  # supervision reads every xml; the json holds the val split, difficult boxes as crowd
        expected = {name: boxes for name, boxes in expected.items() if name in ours}
    assert ours == expected and len(ours) == len((YOLO_IMAGES if source == "yolo" else VOC_IMAGES)["val"])


def test_coco_json_to_yolo_and_back(tmp_path: Path, capsys) -> None:
    data_yaml = write_yolo_set(tmp_path / "data")
    json_file = tmp_path / "train.json"
    assert convert_data.main([str(data_yaml), "--out", str(json_file)]) == 0
    assert convert_data.main([str(json_file), "--images", str(tmp_path / "data" / "images" / "train"), "--to", "yolo",
                              "--out", str(tmp_path / "yolo")]) == 0
    assert "wrote 4 images and 4 objects to" in capsys.readouterr().out
    again = tmp_path / "again.json"
    assert convert_data.main([str(tmp_path / "yolo"), "--out", str(again)]) == 0
    import json

    first, second = json.loads(json_file.read_text()), json.loads(again.read_text())
    assert [c["name"] for c in first["categories"]] == [c["name"] for c in second["categories"]]
    assert [i["file_name"] for i in first["images"]] == [i["file_name"] for i in second["images"]]
    np.testing.assert_allclose([a["bbox"] for a in second["annotations"]], [a["bbox"] for a in first["annotations"]],
                               atol=1e-3)


def test_a_bad_label_stops_the_conversion_naming_its_line(tmp_path: Path, capsys) -> None:
    data_yaml = write_yolo_set(tmp_path / "data")
    bad = tmp_path / "data" / "labels" / "train" / "a.txt"
    bad.write_text("0 0.5 0.5 0.25 0.5\n9 0.5 0.5 0.1 0.1\n")
    assert convert_data.main([str(data_yaml), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{bad}:2: class 9" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
    assert convert_data.main([str(data_yaml), "--out", str(tmp_path / "x.json"), "--skip-bad-labels"]) == 0
    assert f"left out: {bad}:2" in capsys.readouterr().err


def test_polygons_go_to_yolo_segmentation_lines_and_back(tmp_path: Path, capsys) -> None:
    data_yaml = write_yolo_set(tmp_path / "data")
    json_file = tmp_path / "train.json"
    assert convert_data.main([str(data_yaml), "--out", str(json_file)]) == 0
    assert convert_data.main([str(json_file), "--images", str(tmp_path / "data" / "images" / "train"), "--to", "yolo",
                              "--segments", "--out", str(tmp_path / "yolo")]) == 0
    assert "(1 as polygons)" in capsys.readouterr().out
    assert (tmp_path / "yolo" / "labels" / "train" / "d.txt").read_text().splitlines()[0] == (
        "1 0.250000 0.250000 0.750000 0.250000 0.750000 0.750000 0.250000 0.750000")


def test_what_a_coco_source_needs_is_named(tmp_path: Path, capsys) -> None:
    (tmp_path / "coco" / "annotations").mkdir(parents=True)
    assert convert_data.main([str(tmp_path / "coco"), "--to", "yolo", "--out", str(tmp_path / "y")]) == 2
    assert "pass one of its instances jsons" in capsys.readouterr().err
    (tmp_path / "a.json").write_text("{}")
    assert convert_data.main([str(tmp_path / "a.json"), "--to", "yolo", "--out", str(tmp_path / "y")]) == 2
    assert "pass --images FOLDER" in capsys.readouterr().err
    assert convert_data.main([str(tmp_path / "a.json"), "--out", str(tmp_path / "b.json")]) == 2
    assert "is COCO already" in capsys.readouterr().err


def test_coco_keypoints_go_to_yolo_pose_and_back(tmp_path: Path, capsys) -> None:
    """A COCO json with person keypoints (names, skeleton, left/right) → YOLO-pose (kpt_shape, flip_idx,
    kpt_names) → a COCO json with the same points and names; the skeleton has no YOLO form."""
    import json

    from PIL import Image

    from tests.helpers import COCO_PERSON_KEYPOINTS as COCO_PERSON

    (tmp_path / "images").mkdir()
    Image.new("RGB", (200, 100)).save(tmp_path / "images" / "a.png")
    points = [v for k in range(17) for v in ((10 + 10 * k, 50, 2) if k % 4 else (0, 0, 0))]
    data = {"images": [{"id": 1, "file_name": "a.png", "height": 100, "width": 200}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 20, 180, 60], "area": 10800,
                             "iscrowd": 0, "keypoints": points, "num_keypoints": 12}],
            "categories": [{"id": 1, "name": "person", "keypoints": COCO_PERSON, "skeleton": [[16, 14], [14, 12]]}]}
    (tmp_path / "person.json").write_text(json.dumps(data))
    assert convert_data.main([str(tmp_path / "person.json"), "--images", str(tmp_path / "images"), "--to", "yolo",
                              "--out", str(tmp_path / "yolo")]) == 0
    assert convert_data.main([str(tmp_path / "yolo"), "--out", str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["annotations"][0]["keypoints"] == pytest.approx(points, abs=1e-3)
    assert again["annotations"][0]["num_keypoints"] == 12
    category = again["categories"][0]
    assert category["keypoints"] == COCO_PERSON and [1, 2] in category["flip_pairs"]
    capsys.readouterr()
