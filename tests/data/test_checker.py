"""The dataset checker finds every bad input (missing, corrupt or mislabelled files and annotations) on a
broken copy, each named by file and annotation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detr.categories import COCO_CATEGORIES, CategoryMap
from detr.checkpoints import save_checkpoint
from detr.commands import check_data
from detr.data.checker import (
    CheckpointClasses,
    Problem,
    check_dataset,
    checkpoint_class_problems,
    format_problems,
    has_errors,
    reading_workers,
)
from detr.models.build import build_detr
from detr.models.config import ModelMeta
from tests.helpers import tiny_config_with

REPO = Path(__file__).resolve().parents[2]


def ann(ann_id: int, image_id: int, bbox: list[float], category_id: int = 1, iscrowd: int = 0) -> dict:
    return {"id": ann_id, "image_id": image_id, "bbox": bbox, "category_id": category_id, "iscrowd": iscrowd,
            "area": bbox[2] * bbox[3]}


def write_clean(root: Path) -> tuple[Path, Path]:
    images_dir = root / "images"
    images_dir.mkdir(parents=True)
    images = []
    for image_id, (name, mode) in enumerate([("ok.jpg", "RGB"), ("gray.png", "L"), ("rgba.png", "RGBA"),
                                             ("cmyk.jpg", "CMYK")], start=1):
        Image.new(mode, (60, 40)).save(images_dir / name)
        images.append({"id": image_id, "file_name": name, "height": 40, "width": 60})
    annotations = [ann(i, i, [1, 1, 10, 10]) for i in range(1, 5)]
    categories = [{"id": 1, "name": "thing"}, {"id": 2, "name": "other"}]
    annotations.append(ann(5, 1, [20, 20, 5, 5], 2))
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return images_dir, path


def write_broken(root: Path) -> tuple[Path, Path]:
    """Every bad input the checker knows, one per image file."""
    images_dir, path = write_clean(root)
    data = json.loads(path.read_text())
    data["categories"].append({"id": 5, "name": "gap"})  # ids 1, 2, 5: a gap, and 5 is unused
    rng = np.random.default_rng(0)

    def add_image(image_id: int, name: str, height: int = 40, width: int = 60) -> None:
        data["images"].append({"id": image_id, "file_name": name, "height": height, "width": width})

    add_image(10, "missing.jpg")
    Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(images_dir / "truncated.jpg")
    raw = (images_dir / "truncated.jpg").read_bytes()
    (images_dir / "truncated.jpg").write_bytes(raw[: len(raw) // 2])
    add_image(11, "truncated.jpg")
    (images_dir / "text.jpg").write_text("hello")
    add_image(12, "text.jpg")
    for image_id, name in [(13, "empty.jpg"), (14, "zero.jpg"), (15, "outside.jpg"), (16, "crowd.jpg"),
                           (17, "unknown_category.jpg"), (18, "many.jpg")]:
        Image.new("RGB", (60, 40)).save(images_dir / name)
        add_image(image_id, name)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (60, 40)).save(images_dir / "rotated.jpg", exif=exif.tobytes())  # displayed 40 x 60
    add_image(19, "rotated.jpg", height=40, width=60)  # json describes the stored, un-rotated pixels
    data["images"].append({"id": 1, "file_name": "duplicate.jpg", "height": 40, "width": 60})
    data["annotations"] += [
        ann(100, 10, [1, 1, 5, 5]), ann(101, 11, [1, 1, 5, 5]), ann(102, 12, [1, 1, 5, 5]),
        ann(103, 14, [1, 1, 0, 5]),                  # zero width
        ann(104, 15, [50, 30, 20, 20]),              # partly outside
        ann(105, 16, [0, 0, 60, 40], iscrowd=1), ann(106, 16, [1, 1, 5, 5]),
        ann(107, 17, [1, 1, 5, 5], category_id=99),  # not in categories
        ann(108, 18, [1, 1, 5, 5]), ann(109, 18, [10, 10, 5, 5]), ann(110, 18, [20, 20, 5, 5]),
        ann(1, 15, [1, 1, 5, 5]),                    # duplicate annotation id
        ann(111, 999, [1, 1, 5, 5]),                 # unknown image
        {"id": 112, "image_id": 13, "bbox": [1, 2, 3], "category_id": 1},  # malformed bbox
    ]
    path.write_text(json.dumps(data))
    return images_dir, path


def find(problems: list[Problem], kind: str) -> list[Problem]:
    return [p for p in problems if p.kind == kind]


def test_clean_dataset_has_no_errors(tmp_path: Path) -> None:
    problems = check_dataset(*write_clean(tmp_path))
    assert not has_errors(problems), format_problems(problems)
    assert [p.kind for p in problems] == ["summary"]  # grayscale, RGBA and CMYK are fine


def test_broken_copy_every_problem_named(tmp_path: Path) -> None:
    problems = check_dataset(*write_broken(tmp_path), num_queries=2)
    expected = {  # kind: (severity, file, annotation id)
        "missing_image": ("error", "missing.jpg", None),
        "zero_size_box": ("error", "zero.jpg", 103),
        "box_outside_image": ("error", "outside.jpg", 104),
        "unknown_category": ("error", "unknown_category.jpg", 107),
        "image_size_mismatch": ("error", "rotated.jpg", None),
        "too_many_objects": ("error", "many.jpg", None),
        "duplicate_annotation_id": ("error", "outside.jpg", 1),
        "duplicate_image_id": ("error", "duplicate.jpg", None),
        "unknown_image_id": ("error", None, 111),
        "invalid_bbox": ("error", "empty.jpg", 112),
        "crowd": ("warning", "crowd.jpg", 105),
        "category_id_gap": ("warning", None, None),
        "unused_category": ("warning", None, None),
    }
    for kind, (severity, file_name, annotation_id) in expected.items():
        found = find(problems, kind)
        assert len(found) == 1, (kind, found)
        assert (found[0].severity, found[0].file_name, found[0].annotation_id) == (severity, file_name, annotation_id)
    unreadable = {p.file_name: p.message for p in find(problems, "unreadable_image")}
    assert set(unreadable) == {"truncated.jpg", "text.jpg"}
    assert "truncated" in unreadable["truncated.jpg"] and "not an image" in unreadable["text.jpg"]
    assert all("remove the image from the annotation json" in message for message in unreadable.values())
    assert "EXIF orientation 6" in find(problems, "image_size_mismatch")[0].message
    [no_boxes] = find(problems, "no_boxes")  # one line for the kind, naming the first files
    assert no_boxes.message.startswith("3 of 14 images have no (non-crowd) box")
    assert "'empty.jpg'" in no_boxes.message and "'zero.jpg'" in no_boxes.message
    assert "most objects in one image: 3" in find(problems, "summary")[0].message
    assert has_errors(problems)
    # errors first, then warnings, then the summary
    order = [p.severity for p in problems]
    assert order == sorted(order, key=["error", "warning", "info"].index)


def test_quick_mode_reads_headers_only(tmp_path: Path) -> None:
    problems = check_dataset(*write_broken(tmp_path), decode_images=False)
    assert {p.file_name for p in find(problems, "unreadable_image")} == {"text.jpg"}  # truncation needs a decode
    assert find(problems, "image_size_mismatch")[0].file_name == "rotated.jpg"


def test_cli_exit_codes_and_readable_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    images_dir, path = write_clean(tmp_path / "clean")
    assert check_data.main([str(images_dir), str(path)]) == 0
    assert "OK" in capsys.readouterr().out
    images_dir, path = write_broken(tmp_path / "broken")
    assert check_data.main([str(images_dir), str(path), "--num-queries", "2"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "missing_image" in out and "[zero.jpg, annotation 103]" in out
    assert "unknown_category (1):" in out


def test_swapped_arguments_are_named_with_the_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`detr-check-data JSON IMAGES` said of the existing images folder that it "does not exist"."""
    images_dir, path = write_clean(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        check_data.main([str(path), str(images_dir)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "IMAGES_DIR comes first" in err and f"swap them: detr-check-data {images_dir} {path}" in err
    assert "does not exist" not in err


def test_malformed_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"images": [}')
    problems = check_dataset(tmp_path, path)
    assert [p.kind for p in problems] == ["invalid_json"]
    assert "bad.json" in problems[0].message and "line 1 column 13" in problems[0].message
    assert check_data.main([str(tmp_path), str(path)]) == 1
    assert "line 1 column 13" in capsys.readouterr().out


def test_not_coco(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"annotations": []}')
    kinds = [p.kind for p in check_dataset(tmp_path, path)]
    assert kinds == ["not_coco", "not_coco"]


def test_real_coco_mini_passes() -> None:
    root = REPO / "data" / "coco-mini"
    problems = check_dataset(root / "val2017", root / "annotations" / "instances_val2017.json",
                             decode_images=False)
    assert not has_errors(problems), format_problems(problems)
    [crowd] = find(problems, "crowd")
    [no_boxes] = find(problems, "no_boxes")
    assert crowd.message.startswith("5 crowd annotations") and no_boxes.message.startswith("2 of ")


def test_facts_about_many_items_are_one_line_per_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """coco-mini printed 63 separate unused_category lines (and a set with 10 empty images 10 no_boxes lines):
    one line per kind, with the count and the first few."""
    root = REPO / "data" / "coco-mini"
    assert check_data.main([str(root / "val2017"), str(root / "annotations" / "instances_val2017.json"),
                            "--quick", "--min-images-per-class", "0"]) == 0
    out = capsys.readouterr().out
    for kind in ("unused_category", "no_boxes", "crowd"):
        lines = [line for line in out.splitlines() if f"warning: {kind}" in line]
        assert len(lines) == 1, (kind, out)
    unused = next(line for line in out.splitlines() if "warning: unused_category" in line)
    assert " categories have no annotation: " in unused and " more" in unused


@pytest.mark.parametrize("decode_images", [True, False])
@pytest.mark.parametrize("orientation", [6, 3])
def test_a_square_photo_with_an_exif_rotation_is_flagged(tmp_path: Path, decode_images: bool,
                                                         orientation: int) -> None:
    # A square image's width and height read the same in the stored and in the displayed frame, so the size
    # check cannot tell which frame its boxes were drawn in; the EXIF tag alone says the pixels are turned.
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.new("RGB", (48, 48), (30, 30, 30)).save(images_dir / "square.jpg", exif=exif.tobytes())
    Image.new("RGB", (48, 48)).save(images_dir / "plain.jpg")
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "square.jpg", "height": 48, "width": 48},
                   {"id": 2, "file_name": "plain.jpg", "height": 48, "width": 48}],
        "annotations": [ann(1, 1, [2, 30, 10, 10]), ann(2, 2, [2, 30, 10, 10])],
        "categories": [{"id": 1, "name": "thing"}]}))
    problems = check_dataset(images_dir, path, decode_images=decode_images)
    flagged = [p for p in problems if p.kind == "exif_orientation"]
    assert [(p.severity, p.file_name) for p in flagged] == [("warning", "square.jpg")]
    assert f"EXIF orientation {orientation}" in flagged[0].message and "displayed" in flagged[0].message
    assert "exif_transpose" in flagged[0].message  # the fix: apply the tag to the pixels, and the boxes with it
    assert not has_errors(problems)


def test_a_full_decode_of_a_large_set_runs_on_every_core_unless_told() -> None:
    # The complete check (detr-check-data, CheckData(train_images="decode")) must not be a serial pass over
    # a large set; small sets and header reads stay in the process, where a pool would cost more than it saves.
    assert reading_workers(None, 10_000, decode_images=True) == len(os.sched_getaffinity(0))
    assert reading_workers(None, 10, decode_images=True) == 0
    assert reading_workers(None, 10_000, decode_images=False) == 0
    assert reading_workers(3, 10, decode_images=True) == 3 and reading_workers(0, 10_000, decode_images=True) == 0


def test_cli_cache_remembers_good_files_and_finds_the_same_problems(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    images_dir, path = write_broken(tmp_path)
    assert check_data.main([str(images_dir), str(path), "--num-queries", "2", "--cache"]) == 1
    first = capsys.readouterr().out
    assert Path(f"{path}.imagecache").is_file()
    assert check_data.main([str(images_dir), str(path), "--num-queries", "2", "--cache"]) == 1
    assert capsys.readouterr().out == first


def test_segmentations_are_checked_one_line_each(tmp_path: Path) -> None:
    """Polygons of too few points or odd length, an RLE of another size, a mask covering nothing, a mask away from
    its box and an annotation without segmentation among others: one readable line each."""
    images_dir, path = write_clean(tmp_path)  # 60 x 40 images, boxes [1, 1, 10, 10]
    data = json.loads(path.read_text())
    square = [1, 1, 11, 1, 11, 11, 1, 11]
    segmentations = {1: [square], 2: [[1, 1, 11, 1, 11]], 3: [[1, 1, 11, 11]],
                     4: {"size": [60, 40], "counts": [2400]}, 5: [[100, 100, 110, 100, 110, 110]]}
    for annotation in data["annotations"]:
        annotation["segmentation"] = segmentations[annotation["id"]]
    data["annotations"].append({**ann(6, 2, [1, 1, 10, 10]), "segmentation": [[40, 20, 50, 20, 50, 30, 40, 30]]})
    data["annotations"].append(ann(7, 3, [1, 1, 10, 10]))
    path.write_text(json.dumps(data))
    problems = check_dataset(images_dir, path)

    lines = [str(p) for p in problems if "segmentation" in p.kind or "mask" in p.kind]
    assert lines == [
        "error: invalid_segmentation [gray.png, annotation 2]: the segmentation has polygon 0 of odd length 5 (it "
        "lists x, y pairs); training with masks refuses the file and mask AP cannot be computed: fix or redraw it",
        "error: invalid_segmentation [rgba.png, annotation 3]: the segmentation has polygon 0 with 2 point(s); a "
        "polygon needs at least 3; training with masks refuses the file and mask AP cannot be computed: fix or "
        "redraw it",
        "error: invalid_segmentation [cmyk.jpg, annotation 4]: the segmentation has an RLE of size [60, 40] "
        "(height, width) on an image of 40x60; training with masks refuses the file and mask AP cannot be "
        "computed: fix or redraw it",
        "error: empty_mask [ok.jpg, annotation 5]: the segmentation covers no pixel of the image (a polygon outside "
        "it, or of no area): fix or remove the annotation",
        "warning: mask_box_mismatch [gray.png, annotation 6]: the mask's extent [40.0, 20.0, 10.0, 10.0] and the "
        "bbox [1, 1, 10, 10] overlap by IoU 0.00: one of them is off (shifted, or another object's)",
        "warning: missing_segmentation: 1 annotation(s) have no 'segmentation' while the others have one (ids 7): "
        "training with masks (--data.masks true) refuses the file and evaluation reports box AP only",
    ]
    assert not [p for p in problems if p.annotation_id == 1 and "mask" in p.kind + p.message]


def write_boxes(root: Path, boxes: list[list[float]], *, size: tuple[int, int] = (480, 640),
                categories: list[dict] | None = None, category_ids: list[int] | None = None) -> tuple[Path, Path]:
    """One blank ``size`` (height, width) image per box, each box on its own image."""
    images_dir = root / "images"
    images_dir.mkdir(parents=True)
    height, width = size
    images, annotations = [], []
    for index, bbox in enumerate(boxes, start=1):
        Image.new("L", (width, height)).save(images_dir / f"{index}.png")
        images.append({"id": index, "file_name": f"{index}.png", "height": height, "width": width})
        category_id = category_ids[index - 1] if category_ids else 1
        annotations.append(ann(index, index, bbox, category_id))
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": categories or [{"id": 1, "name": "thing"}]}))
    return images_dir, path


def test_boxes_written_as_corners_are_named_with_the_conversion(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # [x1, y1, x2, y2] corners on a 640 x 480 image; one stray box (x2 < x1) does not hide the rest.
    corners = [[400, 300, 600, 450], [100, 50, 200, 120], [350, 10, 500, 90], [20, 260, 90, 470],
               [300, 200, 620, 400], [10, 10, 50, 40], [500, 100, 630, 300], [200, 300, 400, 460],
               [450, 350, 640, 480], [60, 60, 300, 200], [600, 400, 20, 30]]
    images_dir, path = write_boxes(tmp_path, corners)
    flagged = find(check_dataset(images_dir, path, decode_images=False), "boxes_look_like_xyxy")
    assert [p.severity for p in flagged] == ["error"]
    assert flagged[0].message.startswith(f"bbox looks like [x1, y1, x2, y2] in '{path}'")
    assert "COCO wants [x, y, width, height]: convert with width = x2 - x1, height = y2 - y1" in flagged[0].message
    assert check_data.main([str(images_dir), str(path), "--quick"]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "error: boxes_look_like_xyxy" in line]
    assert len(lines) == 1 and "convert with" in lines[0]
    # the same boxes as [x, y, width, height] (the widths of the corners) stay inside: nothing to say
    xywh = [[x1, y1, abs(x2 - x1), abs(y2 - y1)] for x1, y1, x2, y2 in corners[:-1]]
    images_dir, path = write_boxes(tmp_path / "xywh", xywh)
    assert not find(check_dataset(images_dir, path, decode_images=False), "boxes_look_like_xyxy")


def test_boxes_in_normalised_units_are_an_error_that_comes_first(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A json of 0-1 boxes gave 122 mask warnings, then a boxes_look_normalised warning, then "OK" (exit 0):
    the box units are an error, listed first, and the mask warnings they cause are counted in it, not listed."""
    normalised = [[0.1, 0.2, 0.3, 0.25], [0.5, 0.5, 0.4, 0.3], [0.0, 0.7, 0.2, 0.3], [0.62, 0.05, 0.1, 0.1]]
    images_dir, path = write_boxes(tmp_path, normalised)
    data = json.loads(path.read_text())
    for annotation, (x, y, w, h) in zip(data["annotations"], normalised):  # the masks are in pixels
        x, y, w, h = x * 640, y * 480, w * 640, h * 480
        annotation["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    path.write_text(json.dumps(data))
    problems = check_dataset(images_dir, path, decode_images=False)
    flagged = find(problems, "boxes_look_normalised")
    assert [p.severity for p in flagged] == ["error"] and problems[0] is flagged[0]
    assert "YOLO-style" in flagged[0].message and "COCO wants pixels" in flagged[0].message
    assert str(path) in flagged[0].message and "explains the 4 masks that disagree" in flagged[0].message
    assert not find(problems, "mask_box_mismatch")
    assert check_data.main([str(images_dir), str(path), "--quick"]) == 1
    out = capsys.readouterr().out
    assert sum("error: boxes_look_normalised" in line for line in out.splitlines()) == 1
    assert "FAIL" in out and "OK" not in out
    # a 1-pixel box on a 16-pixel image is a box, not a unit
    images_dir, path = write_boxes(tmp_path / "small", [[0.5, 0.5, 0.5, 0.5]], size=(16, 16))
    assert not find(check_dataset(images_dir, path, decode_images=False), "boxes_look_normalised")


def test_the_verdict_is_never_ok_with_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    images_dir, path = write_clean(tmp_path)
    monkeypatch.setattr("detr.data.checker.check_dataset",
                        lambda *args, **kwargs: [Problem("error", "anything", "a finding of any kind")])
    assert check_data.main([str(images_dir), str(path), "--quick"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "OK" not in out


def test_a_corrupt_rle_is_an_error_naming_annotation_and_image(tmp_path: Path) -> None:
    """A corrupt compressed RLE passed with a warning (pycocotools' area of garbage), then fit died at step 1."""
    images_dir, path = write_clean(tmp_path)
    data = json.loads(path.read_text())
    for annotation in data["annotations"]:
        annotation["segmentation"] = [[1, 1, 11, 1, 11, 11, 1, 11]]
    data["annotations"][1]["segmentation"] = {"size": [40, 60], "counts": "garbage!!"}
    path.write_text(json.dumps(data))
    [problem] = [p for p in check_dataset(images_dir, path) if p.severity == "error"]
    assert (problem.severity, problem.kind, problem.file_name, problem.annotation_id) == (
        "error", "invalid_segmentation", "gray.png", 2)
    assert "compressed RLE 'counts' string that is corrupt" in problem.message


def test_file_names_outside_the_images_folder_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'../../x.jpg' or an absolute path was read from outside the images folder and the check said OK."""
    images_dir, path = write_clean(tmp_path / "data")
    Image.new("RGB", (60, 40)).save(tmp_path / "outside.jpg")
    for name in ("../../outside.jpg", str(tmp_path / "outside.jpg"), "..\\..\\outside.jpg"):
        data = json.loads(path.read_text())
        data["images"][0]["file_name"] = name
        path.write_text(json.dumps(data))
        [problem] = [p for p in check_dataset(images_dir, path) if p.severity == "error"]
        assert problem.kind == "unsafe_file_name" and "(image id 1)" in problem.message
        assert str(path) in problem.message and "relative to the images folder" in problem.message
        assert check_data.main([str(images_dir), str(path)]) == 1
        assert "FAIL" in capsys.readouterr().out


def test_windows_file_names_are_read_with_backslashes_as_separators(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """'sub\\000001.jpg' was reported as a missing image."""
    images_dir, path = write_clean(tmp_path)
    (images_dir / "sub").mkdir()
    (images_dir / "ok.jpg").rename(images_dir / "sub" / "ok.jpg")
    data = json.loads(path.read_text())
    data["images"][0]["file_name"] = "sub\\ok.jpg"
    path.write_text(json.dumps(data))
    problems = check_dataset(images_dir, path)
    assert not has_errors(problems), format_problems(problems)
    [note] = find(problems, "backslash_file_names")
    assert "'sub\\ok.jpg'" in note.message and "read as '/'" in note.message
    assert check_data.main([str(images_dir), str(path)]) == 0
    assert "backslash_file_names" in capsys.readouterr().out


def test_categories_with_few_images_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    categories = [{"id": i, "name": f"class{i}"} for i in range(1, 13)]
    category_ids = [1] * 4 + list(range(2, 13))  # class1 on 4 images, the others on one each
    images_dir, path = write_boxes(tmp_path, [[10, 10, 20, 20]] * len(category_ids), categories=categories,
                                   category_ids=category_ids)
    assert not find(check_dataset(images_dir, path, decode_images=False), "few_images_per_class")  # off by default
    flagged = find(check_dataset(images_dir, path, decode_images=False, min_images_per_class=3),
                   "few_images_per_class")
    assert [p.severity for p in flagged] == ["warning"]
    message = flagged[0].message
    assert message.startswith(f"11 categories have boxes on fewer than 3 images in '{path}': 'class2' (id 2): 1")
    assert "and 3 more" in message and "'class1'" not in message  # 8 named; class1 has enough
    assert check_data.main([str(images_dir), str(path), "--quick", "--min-images-per-class", "5"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "warning: few_images_per_class" in line]
    assert len(lines) == 1 and lines[0].strip().startswith("warning: few_images_per_class: 12 categories")


def test_checkpoint_classes_against_the_json() -> None:
    coco = CategoryMap.from_coco_categories([{"id": i, "name": n} for i, n in COCO_CATEGORIES], contiguous=True)
    checkpoint = CheckpointClasses("dfine.pth", 80, coco)
    # COCO's own json (raw ids, 91 labels), the 80 names renumbered, or swapped: each class keeps its row by name
    swapped = dict(enumerate(coco.names))
    swapped[0], swapped[1] = coco.names[1], coco.names[0]
    for categories in ({i: n for i, n in COCO_CATEGORIES}, dict(enumerate(coco.names)), swapped):
        assert checkpoint_class_problems(categories, checkpoint, "coco.json") == []
    # new classes: their rows start fresh, which is fine
    [problem] = checkpoint_class_problems({1: "crack", 2: "dent"}, checkpoint, "parts.json")
    assert (problem.severity, problem.kind) == ("warning", "checkpoint_class_head")
    assert "dfine.pth knows none of the 2 classes of 'parts.json': the class rows start fresh" in problem.message
    # some known (by name, any case), some new
    [problem] = checkpoint_class_problems({1: "Car", 2: "person", 3: "crack"}, checkpoint, "street.json")
    assert "was not trained on 1 of the 3 classes of 'street.json': 'crack'" in problem.message
    assert "than the 2 whose rows carry over by name" in problem.message
    # a checkpoint that names no classes: matched by label and count
    unnamed = CheckpointClasses("detr.pth", 80)
    [problem] = checkpoint_class_problems({i: n for i, n in COCO_CATEGORIES}, unnamed, "coco.json")
    assert "pass --data.category_ids contiguous to keep its head" in problem.message
    assert checkpoint_class_problems(dict(enumerate(coco.names)), unnamed, "yolo.json") == []


def test_checkpoint_classes_that_match_no_single_row_by_name_are_errors() -> None:
    """The names detr fit refuses to match by name (detr.checkpoints.finetune.check_class_match) are an error here."""
    checkpoint = CheckpointClasses("parts.ckpt", 3, CategoryMap((1, 2, 3), ("dent", "crack", "Dent")))
    [problem] = checkpoint_class_problems({1: "dent", 2: "scratch"}, checkpoint, "parts.json")
    assert (problem.severity, problem.kind) == ("error", "checkpoint_class_names")
    assert "the checkpoint names 2 classes 'dent' (its labels 0, 2)" in problem.message
    [problem] = checkpoint_class_problems({1: "crack", 2: "scratch", 3: "Crack"}, checkpoint, "parts.json")
    assert "the data names 2 classes 'crack' (labels 0, 2" in problem.message and "merge them" in problem.message
    assert checkpoint_class_problems({1: "crack"}, checkpoint, "parts.json") == []  # its 'dent' is not the data's


def test_cli_reads_the_checkpoint_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_detr(tiny_config_with(num_classes=2))
    model.meta = ModelMeta(category_map=CategoryMap((1, 2), ("dent", "crack")))
    checkpoint = save_checkpoint(model, tmp_path / "parts.ckpt")
    categories = [{"id": 1, "name": "crack"}, {"id": 2, "name": "scratch"}]
    images_dir, path = write_boxes(tmp_path / "data", [[10, 10, 20, 20]] * 2, categories=categories,
                                   category_ids=[1, 2])
    assert check_data.main([str(images_dir), str(path), "--quick", "--checkpoint", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "warning: checkpoint_class_head" in line]
    assert len(lines) == 1 and f"{checkpoint} was not trained on 1 of the 2 classes" in lines[0]
    # N14: the checks counted against the paper's 100 queries, not the checkpoint's
    assert model.config.num_queries != 100 and f"(num_queries={model.config.num_queries})" in out
    assert check_data.main([str(images_dir), str(path), "--quick", "--checkpoint", str(checkpoint),
                            "--num-queries", "7"]) == 0
    assert "(num_queries=7)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        check_data.main([str(images_dir), str(path), "--checkpoint", str(tmp_path / "missing.ckpt")])
    assert "--checkpoint" in capsys.readouterr().err


def test_real_coco_mini_raises_none_of_the_fine_tune_checks() -> None:
    root = REPO / "data" / "coco-mini"
    for split in ("train", "val"):
        problems = check_dataset(root / f"{split}2017", root / "annotations" / f"instances_{split}2017.json",
                                 decode_images=False, checkpoint=CheckpointClasses("detr-r50", 91, CategoryMap.coco()))
        kinds = {p.kind for p in problems}
        assert not kinds & {"boxes_look_like_xyxy", "boxes_look_normalised", "checkpoint_class_head",
                            "few_images_per_class"}, format_problems(problems)


def test_cli_checks_a_yolo_or_voc_data_set_from_one_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """detr-check-data took COCO only; a data.yaml, a YOLO folder or a VOC folder alone is enough now, each split
    checked, each bad label line named by its file and line."""
    from tests.helpers import write_voc_set, write_yolo_set

    data_yaml = write_yolo_set(tmp_path / "yolo")
    for source in (data_yaml, data_yaml.parent):
        assert check_data.main([str(source), "--min-images-per-class", "0"]) == 0
        out = capsys.readouterr().out
        assert "yolo train split" in out and "yolo val split" in out and "OK" in out
    (tmp_path / "yolo" / "labels" / "val" / "f.txt").write_text("0 0.5 0.5 0.2\n5 0.5 0.5 0.1 0.1\n")
    assert check_data.main([str(data_yaml), "--split", "val"]) == 1
    out = capsys.readouterr().out
    assert "train split" not in out and "FAIL" in out
    assert f"invalid_label_line [{tmp_path / 'yolo' / 'labels' / 'val' / 'f.txt'}:1]" in out
    assert "unknown_class" in out and "f.txt:2]" in out
    voc = write_voc_set(tmp_path / "voc")
    assert check_data.main([str(voc), "--min-images-per-class", "0"]) == 0
    assert "voc val split" in capsys.readouterr().out
    assert check_data.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    shapes = tmp_path / "shapes"  # a folder in COCO's layout: each split's json
    write_shapes_dataset(shapes, ShapesConfig(num_train=2, num_val=2, image_size=64, min_object_size=12,
                                              max_object_size=32))
    assert check_data.main([str(shapes), "--min-images-per-class", "0"]) == 0
    out = capsys.readouterr().out
    assert "coco train split" in out and "coco val split" in out


def test_keypoint_annotations_are_checked_naming_file_and_annotation(tmp_path: Path) -> None:
    images_dir, path = write_clean(tmp_path)
    data = json.loads(path.read_text())
    data["categories"][0].update(keypoints=["left_eye", "right_eye"], skeleton=[[1, 2]])
    data["categories"][1].update(keypoints=["a"], skeleton=[[1, 3]])  # an edge to a point it does not have
    good = [10, 10, 2, 20, 10, 1]
    data["annotations"][0].update(keypoints=good, num_keypoints=2)
    data["annotations"][1].update(keypoints=[10, 10, 2], num_keypoints=1)  # 1 point of 2
    data["annotations"][2].update(keypoints=[10, 10, 5, 20, 10, 2])  # v = 5
    data["annotations"][3].update(keypoints=good, num_keypoints=1)  # 2 labelled
    data["annotations"].append({**ann(6, 1, [1, 1, 10, 10]), "keypoints": [10, 10, 2, 70, 10, 2], "num_keypoints": 2})
    path.write_text(json.dumps(data))
    problems = [p for p in check_dataset(images_dir, path, decode_images=False) if "keypoint" in p.kind]
    found = {(p.kind, p.file_name, p.annotation_id): p.message for p in problems}
    assert ("invalid_category_keypoints", None, None) in found
    assert "3 x 2 = 6" in found[("invalid_keypoints", "gray.png", 2)]
    assert "visibility [5]" in found[("invalid_keypoints", "rgba.png", 3)]
    assert "set num_keypoints to 2" in found[("invalid_keypoints", "cmyk.jpg", 4)]
    assert "1 (70, 10)" in found[("keypoint_outside_image", "ok.jpg", 6)]
    assert all(p.severity == "error" for p in problems) and len(problems) == 5
