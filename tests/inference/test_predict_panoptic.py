"""Panoptic inference: the Predictor's instance masks and panoptic segmentations, and tools/predict.py --task
panoptic (COCO panoptic PNGs + json, drawn segments, unreadable files skipped, detection models refused)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr.categories import coco_panoptic_category_map, coco_panoptic_is_thing
from detr.data.collate import pad_images
from detr.inference.postprocess_masks import PostProcessMasks, PostProcessPanoptic, rgb_to_id_map
from detr.inference.predictor import Predictor
from detr.models.config import ModelMeta
from detr.visualize.drawing import draw_panoptic
from tests.helpers import PERSON, TREE, load_script, tiny_coco_panoptic

pytestmark = pytest.mark.usefixtures("one_thread")

PHOTOS = Path(__file__).resolve().parents[2] / "data" / "photos"
SMALL = ["--min-size", "64", "--max-size", "100", "--device", "cpu"]


@pytest.fixture(scope="module")
def panoptic_checkpoint(tmp_path_factory) -> Path:
    """The tiny model as a file in the authors' panoptic layout (the detector under ``detr.``)."""
    path = tmp_path_factory.mktemp("checkpoints") / "tiny-panoptic.pth"
    torch.save({"model": tiny_coco_panoptic().state_dict()}, path)
    return path


def random_images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), rng.integers(0, 256, (70, 50, 3), dtype=np.uint8)]


def test_predictor_masks_and_panoptic_match_the_postprocessors():
    model = tiny_coco_panoptic()
    model.meta = ModelMeta(category_map=coco_panoptic_category_map(), is_thing=coco_panoptic_is_thing())
    predictor = Predictor(model, device="cpu", batch_size=2, min_size=64, max_size=100, threshold=0.5)
    arrays = random_images()
    predictions = predictor.predict(arrays, task="panoptic")

    inputs = [predictor.preprocess(array) for array in arrays]  # the same batch, post-processed by hand
    with torch.no_grad():
        outputs = model(*pad_images(inputs))
    processed = torch.tensor([list(t.shape[1:]) for t in inputs])
    originals = torch.tensor([list(a.shape[:2]) for a in arrays])
    masks = PostProcessMasks()(outputs, processed, originals)
    panoptic = PostProcessPanoptic(coco_panoptic_is_thing(), category_ids=coco_panoptic_category_map().category_ids)(
        outputs, processed, originals)

    segment_count = 0
    for prediction, array, image_masks, expected in zip(predictions, arrays, masks, panoptic):
        height, width = array.shape[:2]
        assert len(prediction) > 0
        assert prediction.masks.dtype == torch.bool and prediction.masks.shape == (len(prediction), height, width)
        assert torch.equal(prediction.masks, image_masks[prediction.query_indices])  # selected detections only
        assert prediction.panoptic.id_map.shape == (height, width)
        assert torch.equal(prediction.panoptic.id_map, expected["id_map"])
        segments = prediction.panoptic.segments_info
        assert [{k: v for k, v in s.items() if k != "label_name"} for s in segments] == expected["segments_info"]
        assert sorted(s["id"] for s in segments) == sorted(set(prediction.panoptic.id_map.unique().tolist()) - {0})
        assert {s["label_name"] for s in segments} <= {"person", "tree-merged"}
        assert all(s["category_id"] in (PERSON, TREE) for s in segments)  # COCO ids (equal to the labels here)
        segment_count += len(segments)
        drawn = draw_panoptic(array, prediction.panoptic)
        assert drawn.shape == (3, height, width) and not torch.equal(drawn, torch.from_numpy(array).permute(2, 0, 1))
    assert segment_count > 0

    above = predictions[0].above(0.99)  # masks follow the detections they belong to
    assert len(above.masks) == len(above) and above.panoptic is predictions[0].panoptic
    detections = predictor.predict(arrays[0])[0]  # detection task: masks, no panoptic
    assert detections.masks is not None and detections.panoptic is None


def test_panoptic_needs_a_mask_model_or_is_thing(tiny_model):
    predictor = Predictor(tiny_model, device="cpu", min_size=64, max_size=100)
    image = random_images()[0]
    assert predictor.predict(image)[0].masks is None  # detection models: unchanged
    with pytest.raises(ValueError, match="cannot do task .panoptic.; load a checkpoint with masks"):
        predictor.predict(image, task="panoptic")
    # an exported file's refusal is tested on real files: tests/serving/test_service.py

    unlabelled = tiny_coco_panoptic()  # a panoptic model whose checkpoint does not say what is stuff
    with pytest.raises(ValueError, match="is_thing"):
        Predictor(unlabelled, device="cpu", min_size=64, max_size=100).predict_panoptic(image)
    with_flags = Predictor(unlabelled, device="cpu", min_size=64, max_size=100, is_thing=[True] * 250)
    assert all(s["isthing"] for s in with_flags.predict_panoptic(image)[0].panoptic.segments_info)


def run_tool(inputs: list[str], checkpoint: Path, out: Path, *extra: str) -> int:
    return load_script("tools/predict.py").main(
        [*inputs, "--checkpoint", str(checkpoint), "--out", str(out), *SMALL, *extra])


def test_predict_tool_writes_coco_panoptic(tmp_path, panoptic_checkpoint):
    photos = [PHOTOS / "astronaut.png", PHOTOS / "chelsea.png"]
    out = tmp_path / "out"
    assert run_tool([str(p) for p in photos], panoptic_checkpoint, out, "--task", "panoptic", "--batch-size", "2") == 0

    document = json.loads((out / "panoptic.json").read_text())
    categories = {c["id"]: c for c in document["categories"]}
    assert len(categories) == 133 and categories[PERSON]["isthing"] == 1 and categories[TREE]["isthing"] == 0
    annotations = document["annotations"]
    assert [a["file_name"] for a in annotations] == ["astronaut.png", "chelsea.png"]
    assert len({a["image_id"] for a in annotations}) == 2

    predictor = Predictor.from_checkpoint(panoptic_checkpoint, device="cpu", batch_size=2, min_size=64, max_size=100)
    expected = predictor.predict_panoptic(photos)
    for annotation, photo, prediction in zip(annotations, photos, expected):
        png = out / "panoptic" / annotation["file_name"]
        ids = rgb_to_id_map(torch.from_numpy(np.array(Image.open(png).convert("RGB"))))
        assert torch.equal(ids, prediction.panoptic.id_map)
        assert sorted(s["id"] for s in annotation["segments_info"]) == sorted(set(ids.unique().tolist()) - {0})
        for segment in annotation["segments_info"]:
            assert segment["category_id"] in categories and segment["area"] == int((ids == segment["id"]).sum())
        drawn = Image.open(out / f"{photo.stem}.jpg")
        assert drawn.size == Image.open(photo).size
    assert sum(len(a["segments_info"]) for a in annotations) > 0
    assert json.loads((out / "predictions.json").read_text())  # the detections are written as for detection


def test_predict_tool_panoptic_skips_a_bad_image(tmp_path, panoptic_checkpoint, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(PHOTOS / "chelsea.png", folder / "a.png")
    (folder / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    shutil.copy(PHOTOS / "astronaut.png", folder / "c.png")
    out = tmp_path / "out"
    assert run_tool([str(folder)], panoptic_checkpoint, out, "--task", "panoptic") == 1
    assert "b.jpg" in capsys.readouterr().err
    document = json.loads((out / "panoptic.json").read_text())
    assert [a["image_file_name"] for a in document["annotations"]] == ["a.png", "c.png"]
    assert sorted(p.name for p in (out / "panoptic").iterdir()) == ["a.png", "c.png"]
    assert sorted(p.name for p in out.glob("*.jpg")) == ["a.jpg", "c.jpg"]


def test_predict_tool_refuses_panoptic_with_a_detection_checkpoint(tmp_path, tiny_model, capsys):
    checkpoint = tmp_path / "detector.pth"
    torch.save({"model": tiny_model.state_dict()}, checkpoint)
    with pytest.raises(SystemExit) as exit_info:
        run_tool([str(PHOTOS / "chelsea.png")], checkpoint, tmp_path / "out", "--task", "panoptic")
    assert exit_info.value.code == 2
    assert "cannot do task 'panoptic'; load a checkpoint with masks" in capsys.readouterr().err
    assert not (tmp_path / "out" / "panoptic.json").exists()


def test_predict_tool_instances_writes_rle_masks(tmp_path, panoptic_checkpoint):
    from pycocotools import mask as mask_utils

    photo = PHOTOS / "chelsea.png"
    out = tmp_path / "out"
    assert run_tool([str(photo)], panoptic_checkpoint, out, "--task", "instances", "--threshold", "0.5") == 0
    results = json.loads((out / "predictions.json").read_text())
    predictor = Predictor.from_checkpoint(panoptic_checkpoint, device="cpu", min_size=64, max_size=100, threshold=0.5)
    expected = predictor.predict(photo, task="instances")[0]
    assert len(results) == len(expected) > 0
    for result, mask in zip(results, expected.masks):
        decoded = mask_utils.decode({"size": result["segmentation"]["size"],
                                     "counts": result["segmentation"]["counts"].encode("ascii")})
        assert decoded.shape == (300, 451) and np.array_equal(decoded.astype(bool), mask.numpy())
    assert not (out / "panoptic.json").exists()
