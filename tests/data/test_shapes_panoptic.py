"""Panoptic annotations of the synthetic shapes: the same images as the detection set, masks that agree with
the detection annotations, a complete and consistent COCO panoptic layout (ground truth scores PQ 1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.data.shapes_panoptic import BACKGROUND_ID, write_shapes_panoptic
from detr.evaluation.panoptic import evaluate_panoptic_files

CONFIG = ShapesConfig(num_train=4, num_val=3, image_size=48, min_object_size=8, max_object_size=20, max_objects=4)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    write_shapes_dataset(root, CONFIG)
    assert write_shapes_panoptic(root, CONFIG)
    return root


def test_layout_and_consistency_with_the_detection_set(root):
    panoptic = json.loads((root / "annotations" / "panoptic_val2017.json").read_text())
    instances = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    assert [c["id"] for c in panoptic["categories"] if c["isthing"]] == [c["id"] for c in instances["categories"]]
    assert panoptic["images"] == [{k: v for k, v in image.items() if k != "license"} for image in instances["images"]]
    for annotation in panoptic["annotations"]:
        png = root / "annotations" / "panoptic_val2017" / annotation["file_name"]
        rgb = np.asarray(Image.open(png)).astype(np.int64)
        ids = rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]
        segments = annotation["segments_info"]
        assert sorted(np.unique(ids).tolist()) == sorted(s["id"] for s in segments)  # nothing void
        assert sum(s["area"] for s in segments) == CONFIG.image_size ** 2
        assert [s["category_id"] for s in segments][-1] == BACKGROUND_ID
        shapes = [a for a in instances["annotations"] if a["image_id"] == annotation["image_id"]]
        things = [s for s in segments if s["category_id"] != BACKGROUND_ID]
        assert [s["category_id"] for s in things] == [a["category_id"] for a in shapes]
        for segment, shape in zip(things, shapes):  # the mask is the drawn shape
            assert segment["area"] == shape["area"] and segment["bbox"] == shape["bbox"]


def test_ground_truth_scores_pq_one_and_rewrite_is_idempotent(root):
    annotations = root / "annotations"
    results = evaluate_panoptic_files(annotations / "panoptic_train2017.json", annotations / "panoptic_train2017.json")
    assert results["All"]["pq"] == 1.0 and results["Stuff"]["n"] == 1
    assert not write_shapes_panoptic(root, CONFIG)


def test_make_shapes_cli_writes_panoptic_annotations(tmp_path, capsys):
    from tests.helpers import load_script

    module = load_script("tools/make_shapes.py")
    argv = ["--out", str(tmp_path / "s"), "--num-train", "2", "--num-val", "1", "--image-size", "32",
            "--min-object-size", "6", "--max-object-size", "16", "--panoptic"]
    assert module.main(argv) == 0
    assert "panoptic" in capsys.readouterr().out
    assert len(list((tmp_path / "s" / "annotations" / "panoptic_train2017").glob("*.png"))) == 2
