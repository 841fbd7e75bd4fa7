"""Every input is checked before the first step: ``detr fit`` runs the data checker with the model's
num_queries, corrupt validation images fail at start-up, dropped and clipped boxes are counted, and
models, ids and checkpoint files that cannot work are refused with a message that names them."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from detr import build_detr, load_checkpoint
from detr.checkpoints import CheckpointError, read_checkpoint
from detr.data.checker import check_dataset
from detr.data.coco import AnnotationFileError, CocoDetection
from detr.lightning import DetrSystem
from detr.lightning.cli import main
from detr.lightning.data_checks import DataCheckError
from tests.helpers import TINY, tiny_fit_args

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


@pytest.fixture
def shapes(tiny_shapes_root, tmp_path) -> Path:
    """A private copy of the tiny shapes set, to break."""
    root = tmp_path / "shapes"
    shutil.copytree(tiny_shapes_root, root)
    return root


def _edit_json(root: Path, split: str, edit) -> Path:
    path = root / "annotations" / f"instances_{split}2017.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _kinds(problems, severity="error") -> set[str]:
    return {p.kind for p in problems if p.severity == severity}


# ------------------------------------------------------------------------------------------------ checker
def test_a_file_without_annotations_is_an_error(shapes) -> None:
    json_file = _edit_json(shapes, "train", lambda data: data.update(annotations=[]))
    assert "no_annotations" in _kinds(check_dataset(shapes / "train2017", json_file))


def test_boxes_written_as_xyxy_are_an_error(shapes) -> None:
    def to_xyxy(data):
        for annotation in data["annotations"]:
            x, y, w, h = annotation["bbox"]
            annotation["bbox"] = [x, y, x + w, y + h]

    json_file = _edit_json(shapes, "train", to_xyxy)
    assert "boxes_look_like_xyxy" in _kinds(check_dataset(shapes / "train2017", json_file))


def test_string_image_ids_are_refused_with_the_id(shapes) -> None:
    def stringify(data):
        data["images"][0]["id"] = "first"
        for annotation in data["annotations"]:
            if annotation["image_id"] == 1:
                annotation["image_id"] = "first"

    json_file = _edit_json(shapes, "train", stringify)
    assert "non_integer_image_id" in _kinds(check_dataset(shapes / "train2017", json_file))
    with pytest.raises(AnnotationFileError, match="images\\[0\\] has id 'first'; image ids must be integers"):
        CocoDetection(shapes / "train2017", json_file)


def test_facts_about_many_items_are_one_log_line_per_kind(caplog) -> None:
    """`detr fit` logged 63 separate unused_category lines on coco-mini."""
    from detr.lightning.data_checks import report_problems

    root = Path(__file__).resolve().parents[2] / "data" / "coco-mini"
    json_file = root / "annotations" / "instances_val2017.json"
    problems = check_dataset(root / "val2017", json_file, decode_images=False)
    with caplog.at_level(logging.WARNING, logger="detr.lightning.data_checks"):
        assert report_problems("val", CocoDetection(root / "val2017", json_file), problems) == []
    assert sum("unused_category" in record.getMessage() for record in caplog.records) == 1
    assert len(caplog.records) <= 6, [record.getMessage() for record in caplog.records]  # a line per kind


def test_boxes_in_normalised_units_stop_fit(shapes) -> None:
    """0-1 boxes were a warning: fit trained on dots in the corner of each image."""
    from detr.lightning.data_checks import report_problems

    def normalise(data):
        sizes = {image["id"]: (image["width"], image["height"]) for image in data["images"]}
        for annotation in data["annotations"]:
            width, height = sizes[annotation["image_id"]]
            x, y, w, h = annotation["bbox"]
            annotation["bbox"] = [x / width, y / height, w / width, h / height]

    json_file = _edit_json(shapes, "train", normalise)
    fatal = report_problems("train", CocoDetection(shapes / "train2017", json_file),
                            check_dataset(shapes / "train2017", json_file, decode_images=False))
    assert [p.kind for p in fatal][:1] == ["boxes_look_normalised"]


# ---------------------------------------------------------------------------------------- detr fit checks
def test_fit_refuses_a_file_without_annotations(shapes, tmp_path) -> None:
    _edit_json(shapes, "train", lambda data: data.update(annotations=[]))
    with pytest.raises(DataCheckError, match="(?s)train split.*no_annotations"):
        main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=1"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_fit_checks_objects_per_image_against_the_models_num_queries(tiny_shapes_root, tmp_path) -> None:
    with pytest.raises(DataCheckError, match="(?s)too_many_objects.*num_queries=2"):
        main(tiny_fit_args(tiny_shapes_root, tmp_path / "run", "--trainer.max_steps=1", "--model.detr.num_queries=2"))


def test_fit_finds_a_corrupt_validation_image_before_the_first_step(shapes, tmp_path) -> None:
    broken = sorted((shapes / "val2017").glob("*.jpg"))[1]
    original = broken.read_bytes()
    broken.write_bytes(original[:300])  # truncated: the header still reads
    with pytest.raises(DataCheckError, match=f"(?s)val split.*unreadable_image.*{broken.name}"):
        main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=1"))
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed at setup, not after an epoch

    broken.write_bytes(original)  # fixed: the failed run does not own the folder, the next one may use it
    main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=1"))
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    # What the checks read is remembered beside each json, for the next run on the data (a good file only).
    for split in ("train", "val"):
        cache = json.loads((shapes / "annotations" / f"instances_{split}2017.json.imagecache").read_text())
        assert len(cache["entries"]) == len(list((shapes / f"{split}2017").glob("*.jpg")))
        assert all(entry[2] == (split == "val") for entry in cache["entries"].values())  # val: fully decoded


def test_fit_leaves_bad_images_out_with_skip_bad_images(shapes, tmp_path, caplog) -> None:
    broken = sorted((shapes / "val2017").glob("*.jpg"))[1]
    broken.write_bytes(b"not an image")
    with caplog.at_level(logging.WARNING, logger="detr"):
        main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=2", "--data.skip_bad_images=true"))
    assert "val: 1 bad image file(s) left out (skip_bad_images), 3 of 4 images remain" in caplog.text


def test_fit_trains_through_a_truncated_training_image(shapes, tmp_path, caplog) -> None:
    # The start-up check reads training images' headers only (a full decode of a large set is slow), so a JPEG
    # cut in half passes it; found mid-run, it is replaced by another image instead of ending the run.
    broken = sorted((shapes / "train2017").glob("*.jpg"))[2]
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="detr"):
        main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=4"))  # two epochs: every image twice
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    named = [r.getMessage() for r in caplog.records if broken.name in r.getMessage()]
    assert len(named) == 3, named  # the file once when it fails, then once in each epoch's count
    assert "truncated" in named[0] and "detr-check-data" in named[0]
    assert "epoch 0: 1 training image could not be loaded" in named[1] and "epoch 1" in named[2]
    assert "--data_check.train_images decode" in named[1]  # how to find every such file before the first step


def test_fit_names_a_square_training_image_with_an_exif_rotation(shapes, tmp_path, caplog) -> None:
    # Turned 90 degrees, a square image keeps its width and height, so the size check passes whichever frame its
    # boxes were drawn in; the run must say which file carries the tag and in which frame its boxes must be.
    photo = sorted((shapes / "train2017").glob("*.jpg"))[0]
    exif = Image.Exif()
    exif[0x0112] = 6
    with Image.open(photo) as image:
        assert image.width == image.height
        image.save(photo, exif=exif.tobytes())
    with caplog.at_level(logging.WARNING, logger="detr"):
        main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=1"))
    named = [r.getMessage() for r in caplog.records if photo.name in r.getMessage()]
    assert len(named) == 1 and "train: exif_orientation" in named[0] and "EXIF orientation 6" in named[0]
    assert "displayed" in named[0] and "exif_transpose" in named[0]


def test_fit_counts_the_boxes_it_drops_and_clips(shapes, tmp_path, caplog) -> None:
    def damage(data):
        data["annotations"][0]["bbox"][2] = 0  # zero width: dropped
        data["annotations"][1]["bbox"][2] += 100  # reaches past the 64-px image: clipped

    _edit_json(shapes, "train", damage)
    with caplog.at_level(logging.WARNING, logger="detr"):
        main(tiny_fit_args(shapes, tmp_path / "run", "--trainer.max_steps=1"))
    assert "train: 1 box(es) dropped" in caplog.text and "and 1 clipped" in caplog.text
    # the tiny set's classes are on a few images each: named for the training split (what a fine-tune learns from)
    assert re.search(r"train: few_images_per_class: \d categories have boxes on fewer than 10 images", caplog.text)
    assert "val: few_images_per_class" not in caplog.text


# ---------------------------------------------------------------------------------------------- the model
@pytest.mark.parametrize("num_queries", [0, -3])
def test_num_queries_below_one_is_refused_at_build_time(num_queries) -> None:
    with pytest.raises(ValueError, match=f"num_queries must be an integer >= 1.*got {num_queries}"):
        build_detr(TINY, num_queries=num_queries)
    with pytest.raises(ValueError, match="num_queries must be"):
        DetrSystem(detr=TINY.replace(num_queries=num_queries))


# ---------------------------------------------------------------------------------------------- checkpoints
def test_a_text_file_as_checkpoint_is_a_checkpoint_error_naming_it(tmp_path) -> None:
    path = tmp_path / "model.pth"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 166\n")
    with pytest.raises(CheckpointError, match=f"{path} is not a checkpoint torch can read"):
        read_checkpoint(path)


def test_a_plain_state_dict_without_category_map_or_eval_size_warns(tiny_model, tmp_path, caplog) -> None:
    path = tmp_path / "plain.pth"
    torch.save(tiny_model.state_dict(), path)
    with caplog.at_level(logging.WARNING, logger="detr.checkpoints"):
        model = load_checkpoint(path)
    assert model.meta.category_map is None
    assert "plain state dict of a 5-class model without a category map or eval size" in caplog.text
    assert "category ids 0..4" in caplog.text and "800/1333" in caplog.text
