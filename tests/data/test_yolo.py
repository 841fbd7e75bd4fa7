"""The YOLO reader: the fixture's boxes and polygons as COCO pixel boxes, the same as supervision reads them; every
bad line named by its file and line; names as a list or a dict; splits as folders or list files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detr.data.converted import LabelFileError
from detr.data.yolo import label_path, read_layout, read_yolo_split, write_yolo
from tests.helpers import YOLO_IMAGES, YOLO_NAMES, write_yolo_set


def boxes_by_file(split) -> dict[str, list[tuple[str, list[float]]]]:
    """file name → [(class name, xyxy pixels)] of a converted split, in label order."""
    names = {category["id"]: category["name"] for category in split.data["categories"]}
    files = {image["id"]: image["file_name"] for image in split.data["images"]}
    found: dict[str, list] = {name: [] for name in files.values()}
    for annotation in split.data["annotations"]:
        x, y, w, h = annotation["bbox"]
        found[files[annotation["image_id"]]].append((names[annotation["category_id"]], [x, y, x + w, y + h]))
    return found


@pytest.mark.parametrize("names_as_dict", [False, True], ids=["names-list", "names-dict"])
@pytest.mark.parametrize("list_files", [False, True], ids=["folders", "list-files"])
def test_the_fixture_reads_as_pixel_boxes(tmp_path: Path, names_as_dict: bool, list_files: bool) -> None:
    data_yaml = write_yolo_set(tmp_path, names_as_dict=names_as_dict, list_files=list_files)
    split = read_yolo_split(data_yaml, "train")
    assert split.problems == []
    assert split.images_dir == tmp_path / "images" / "train"
    assert [c["name"] for c in split.data["categories"]] == YOLO_NAMES
    assert sorted(image["file_name"] for image in split.data["images"]) == sorted(YOLO_IMAGES["train"])
    sizes = {image["file_name"]: (image["width"], image["height"]) for image in split.data["images"]}
    assert sizes["sub/c.png"] == (48, 64)  # from the file's header
    found = boxes_by_file(split)
    assert found["a.png"] == [("cat", [24.0, 12.0, 40.0, 36.0]), ("bird", [12.0, 6.0, 20.0, 18.0])]
    assert found["b.jpg"] == [] and found["sub/c.png"] == []  # empty label file; no label file
    polygon = next(a for a in split.data["annotations"] if "segmentation" in a)
    assert polygon["segmentation"] == [[16.0, 12.0, 48.0, 12.0, 48.0, 36.0, 16.0, 36.0]]
    assert polygon["bbox"] == [16.0, 12.0, 32.0, 24.0] and polygon["area"] == 32 * 24


def test_boxes_and_names_match_supervision(tmp_path: Path) -> None:
    """supervision's DetectionDataset.from_yolo on the same folders finds the same boxes and class names."""
    sv = pytest.importorskip("supervision")
    data_yaml = write_yolo_set(tmp_path)
    for split_name in YOLO_IMAGES:
        ours = boxes_by_file(read_yolo_split(data_yaml, split_name))
        theirs = sv.DetectionDataset.from_yolo(str(tmp_path / "images" / split_name),
                                               str(tmp_path / "labels" / split_name), str(data_yaml))
        compared = 0
        for path, _, detections in theirs:
            name = Path(path).relative_to(tmp_path / "images" / split_name).as_posix()
            if name not in ours:  # supervision does not look into subfolders
                continue
            expected = [(theirs.classes[c], list(box)) for c, box in zip(detections.class_id, detections.xyxy)]
            assert [n for n, _ in ours[name]] == [n for n, _ in expected], name
            np.testing.assert_allclose([b for _, b in ours[name]] or np.zeros((0, 4)),
                                       [b for _, b in expected] or np.zeros((0, 4)), atol=1e-3, err_msg=name)
            compared += 1
        assert compared == len([n for n in YOLO_IMAGES[split_name] if "/" not in n])


def test_every_bad_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    data_yaml = write_yolo_set(tmp_path)
    bad = tmp_path / "labels" / "train" / "a.txt"
    bad.write_text("\ufeff0 0.5 0.5 0.25 0.5\n0 0.5 0.5 0.25\n7 0.5 0.5 0.1 0.1\n1 12 30 40 20\n2 0.5 0.5 0 0.1\n"
                   "x 0.5 0.5 0.1 0.1\n1 0.1 0.1 0.2\n")
    split = read_yolo_split(data_yaml, "train")
    problems = {problem.line: problem for problem in split.problems}
    assert sorted(problems) == [2, 3, 4, 5, 6, 7]
    assert all(problem.path == bad for problem in split.problems)
    assert problems[2].kind == "invalid_label_line" and "class cx cy w h" in problems[2].message
    assert problems[3].kind == "unknown_class" and "ids 0..2" in problems[3].message
    assert problems[4].kind == "coordinates_outside" and "not pixels" in problems[4].message
    assert problems[5].kind == "zero_size_box"
    assert str(problems[2]).startswith(f"{bad}:2: ")
    assert len(boxes_by_file(split)["a.png"]) == 1  # the good line is kept
    with pytest.raises(LabelFileError, match=r"6 label problem\(s\): .*a\.txt:2: .*detr-check-data"):
        split.require_clean()


def test_a_yaml_without_names_or_with_a_wrong_nc_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "data.yaml").write_text("train: images/train\n")
    with pytest.raises(LabelFileError, match=r"data\.yaml' has no 'names'"):
        read_layout(tmp_path)
    (tmp_path / "data.yaml").write_text("train: images/train\nnc: 3\nnames: [a, b]\n")
    with pytest.raises(LabelFileError, match=r"nc is 3 but 'names' lists 2"):
        read_layout(tmp_path)
    (tmp_path / "data.yaml").write_text("names: [a\n")
    with pytest.raises(LabelFileError, match=r"data\.yaml:\d+: not valid YAML"):
        read_layout(tmp_path)
    (tmp_path / "images").mkdir()
    with pytest.raises(LabelFileError, match="holds no data.yaml"):
        read_layout(tmp_path / "images")


def test_roboflow_relative_entries_and_label_paths(tmp_path: Path) -> None:
    """Roboflow writes `train: ../train/images` beside the yaml; Ultralytics reads it without the ../."""
    write_yolo_set(tmp_path)
    (tmp_path / "data.yaml").write_text("train: ../images/train\nval: ../images/val\nnames: [cat, dog, bird]\n")
    assert read_layout(tmp_path).splits["train"] == [tmp_path / "images" / "train"]
    assert label_path(Path("/d/images/x/images/a.b.jpg")) == Path("/d/images/x/labels/a.b.txt")


def test_coco_to_yolo_and_back_keeps_the_boxes(tmp_path: Path) -> None:
    data_yaml = write_yolo_set(tmp_path / "in")
    split = read_yolo_split(data_yaml, "train")
    split.data["annotations"][0]["iscrowd"] = 1  # no YOLO form: left out
    counts = write_yolo(split.data, split.images_dir, tmp_path / "out", "train")
    assert counts == {"images": 4, "boxes": 3, "polygons": 0, "crowd_left_out": 1}
    again = read_yolo_split(tmp_path / "out", "train")
    before, after = boxes_by_file(split), boxes_by_file(again)
    before["a.png"] = before["a.png"][1:]
    assert after.keys() == before.keys()
    for name in before:
        assert [n for n, _ in after[name]] == [n for n, _ in before[name]]
        np.testing.assert_allclose([b for _, b in after[name]] or np.zeros((0, 4)),
                                   [b for _, b in before[name]] or np.zeros((0, 4)), atol=1e-3)


def test_image_sizes_are_remembered_where_the_checks_keep_their_reads(tmp_path: Path) -> None:
    data_yaml = write_yolo_set(tmp_path)
    read_yolo_split(data_yaml, "val", cache=True)
    cache_file = tmp_path / "images" / "val.imagecache"
    assert cache_file.is_file()
    (tmp_path / "images" / "val" / "e.png").write_bytes(b"")  # a changed file is read again
    assert "height" not in read_yolo_split(data_yaml, "val", cache=True).data["images"][0]


def write_pose_set(root: Path, labels: str, **yaml_fields) -> Path:
    import yaml
    from PIL import Image

    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    Image.new("RGB", (100, 50)).save(root / "images" / "train" / "a.png")
    (root / "labels" / "train" / "a.txt").write_text(labels)
    fields = {"path": ".", "train": "images/train", "names": ["hand"], "kpt_shape": [3, 3], **yaml_fields}
    (root / "data.yaml").write_text(yaml.safe_dump(fields))
    return root / "data.yaml"


def test_yolo_pose_labels_become_coco_keypoints_and_round_trip(tmp_path: Path) -> None:
    data_yaml = write_pose_set(tmp_path / "in", "0 0.5 0.5 0.4 0.4 0.3 0.4 2 0.5 0.3 1 0 0 0\n",
                               flip_idx=[2, 1, 0], kpt_names={0: ["left_finger", "tip", "right_finger"]})
    split = read_yolo_split(data_yaml, "train")
    assert split.problems == []
    (annotation,) = split.data["annotations"]
    assert annotation["keypoints"] == pytest.approx([30, 20, 2, 50, 15, 1, 0, 0, 0])
    assert annotation["num_keypoints"] == 2
    (category,) = split.data["categories"]
    assert category["keypoints"] == ["left_finger", "tip", "right_finger"] and category["flip_pairs"] == [[0, 2]]

    write_yolo(split.data, split.images_dir, tmp_path / "out", "train")
    again = read_yolo_split(tmp_path / "out", "train")
    assert again.data["annotations"][0]["keypoints"] == pytest.approx(annotation["keypoints"])
    assert again.data["categories"] == split.data["categories"]


def test_yolo_pose_without_visibility_reads_points_at_zero_as_not_labelled(tmp_path: Path) -> None:
    data_yaml = write_pose_set(tmp_path, "0 0.5 0.5 0.4 0.4 0.3 0.4 0 0 0.5 0.3\n", kpt_shape=[3, 2])
    (annotation,) = read_yolo_split(data_yaml, "train").data["annotations"]
    assert annotation["keypoints"] == pytest.approx([30, 20, 2, 0, 0, 0, 50, 15, 2])
    assert read_yolo_split(data_yaml, "train").data["categories"][0]["keypoints"] == ["kpt_0", "kpt_1", "kpt_2"]


@pytest.mark.parametrize(("labels", "fields", "message"), [
    ("0 0.5 0.5 0.4 0.4\n", {}, "a box without its 3 keypoints"),
    ("0 0.5 0.5 0.4 0.4 0.3 0.4 7 0 0 0 0 0 0\n", {}, "visibility 7"),
    ("0 0.5 0.5 0.4 0.4 30 40 2 0 0 0 0 0 0\n", {}, "not within"),
])
def test_bad_pose_lines_are_named_by_file_and_line(tmp_path: Path, labels: str, fields: dict, message: str) -> None:
    (problem,) = read_yolo_split(write_pose_set(tmp_path, labels, **fields), "train").problems
    assert message in str(problem) and "a.txt" in str(problem) and problem.line == 1


@pytest.mark.parametrize(("fields", "message"), [({"kpt_shape": [3, 4]}, "kpt_shape"),
                                                 ({"flip_idx": [1, 2, 0]}, "not a mirror permutation")])
def test_a_bad_pose_yaml_says_the_fix(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(LabelFileError, match=message):
        read_layout(write_pose_set(tmp_path, "", **fields))
