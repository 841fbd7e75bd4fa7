"""One prediction path (detr/inference/predict.py): the Predictor, ``detr predict``'s system and the explorer
turn a model's output into the same predictions, and apply one rule to images they cannot predict; detr-predict
writes them for a checkpoint of each real-time family (RF-DETR's instance masks in the json and drawn)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from detr import build_detr, build_detr_panoptic
from detr.commands import predict
from detr.data.collate import pad_images
from detr.inference.predict import NOT_FINITE, predictions_from_outputs
from detr.inference.predictor import NonFiniteOutputError, Predictor
from detr.inference.slicing import SliceSettings
from detr.lightning.options import EvaluationOptions
from detr.lightning.panoptic_system import PanopticSystem
from detr.lightning.system import DetrSystem
from detr.visualize.drawing import draw_prediction
from detr.visualize.explorer.pages import explorer_page_data
from tests.helpers import REPO, TINY, tiny_config_with
from tests.helpers_realtime import CONFIGS, tiny_checkpoint

SIZES = {"min_size": 64, "max_size": 96}
ARRAYS = [np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
          for seed, (h, w) in enumerate([(60, 80), (90, 70)])]


def _nan_logits(model, index: int | slice):
    """Make the model's logits of the batch's image ``index`` NaN (a forward hook: the weights stay finite)."""
    def hook(module, args, output):
        output.logits[index] = float("nan")
        return output
    return model.register_forward_hook(hook)


def test_the_one_rule_for_unreadable_images_and_non_finite_outputs():
    outputs = build_detr(TINY).eval()(*pad_images([torch.randn(3, 64, 64)] * 3))
    outputs.boxes[2, 0, 0] = float("inf")
    predictions = predictions_from_outputs(
        outputs, image_sizes=[(64, 64), (0, 0), (128, 128)], input_sizes=[(64, 64)] * 3, class_head="softmax",
        category_map=None, threshold=None, errors=[None, "cannot read b.jpg", None], file_names=["a", "b", "c"])
    assert [p.error for p in predictions] == [None, "cannot read b.jpg", NOT_FINITE]
    assert len(predictions[0]) == TINY.num_queries and len(predictions[1]) == len(predictions[2]) == 0
    assert [p.file_name for p in predictions] == ["a", "b", "c"] and predictions[2].image_size == (128, 128)


@pytest.mark.parametrize("kind", ["detr", "deformable", "panoptic"])
def test_the_predictor_and_detr_predict_make_the_same_predictions(kind):
    torch.manual_seed(0)
    if kind == "panoptic":
        config = TINY.replace(hidden_dim=128, num_heads=8)
        system = PanopticSystem(detr=config, evaluation=EvaluationOptions(evaluation_dir=""), categories=[
            {"id": i, "name": f"c{i}", "isthing": int(i < 3)} for i in range(TINY.num_classes)])
    else:
        config = TINY if kind == "detr" else tiny_config_with(architecture="deformable", class_head="sigmoid",
                                                            num_points=2)
        system = DetrSystem(detr=config, evaluation=EvaluationOptions(evaluation_dir=""))
    system.eval()
    predictor = Predictor(system.model, device="cpu", **SIZES)
    task = "panoptic" if kind == "panoptic" else "detection"
    expected = predictor.predict_arrays(ARRAYS, threshold=None, task=task, masks=False)
    inputs = [predictor.preprocess(array) for array in ARRAYS]
    images, mask = pad_images(inputs)
    targets = [{"image_id": torch.tensor(i), "orig_size": torch.tensor(array.shape[:2]),
                "size": torch.tensor(tensor.shape[1:])} for i, (array, tensor) in enumerate(zip(ARRAYS, inputs))]
    with torch.no_grad():
        got = system.predict_step((images, mask, targets), 0)
    for ours, theirs in zip(got, expected):
        torch.testing.assert_close(ours.scores, theirs.scores)
        torch.testing.assert_close(ours.boxes, theirs.boxes)
        assert torch.equal(ours.labels, theirs.labels) and ours.label_names == theirs.label_names
        assert (ours.panoptic is None) == (kind != "panoptic")
        if kind == "panoptic":
            assert torch.equal(ours.panoptic.id_map, theirs.panoptic.id_map)


def test_every_caller_skips_the_image_whose_outputs_are_not_finite():
    torch.manual_seed(0)
    model = build_detr(TINY).eval()
    predictor = Predictor(model, device="cpu", **SIZES)
    handle = _nan_logits(model, 1)
    predictions = predictor.predict_arrays(ARRAYS, threshold=None)
    assert predictions[0].error is None and predictions[1].error == NOT_FINITE and len(predictions[1]) == 0
    with pytest.raises(NonFiniteOutputError) as raised:  # detr-serve's call
        predictor.predict_arrays(ARRAYS, threshold=None, check_finite=True)
    assert raised.value.indices == [1]
    handle.remove()
    handle = _nan_logits(model, slice(None))
    with pytest.raises(ValueError, match="not finite"):  # the explorer's page
        explorer_page_data(predictor, ARRAYS[0], title="a", threshold=0.5)
    handle.remove()


def test_panoptic_model_predictions_hold_masks_for_the_kept_detections():
    torch.manual_seed(0)
    model = build_detr_panoptic(TINY.replace(hidden_dim=128, num_heads=8)).eval()
    predictor = Predictor(model, device="cpu", **SIZES)
    prediction = predictor.predict_arrays(ARRAYS[:1], threshold=0.0)[0]
    assert prediction.masks is not None and prediction.masks.shape == (len(prediction), 60, 80)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_detr_predict_writes_a_real_time_checkpoints_predictions_and_drawings(family, tmp_path, capsys):
    """The json holds the Predictor's detections of every photo (the top (query, class) pairs above the
    threshold, the data set's ids, COCO xywh); with masks (RF-DETR, ``--task instances``) each one's mask as RLE,
    and the drawings show them."""
    checkpoint = tiny_checkpoint(family, tmp_path)
    photos = REPO / "data" / "photos"
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu", threshold=0.5)
    task = "instances" if predictor.predicts_masks else "detection"
    out = tmp_path / "out"
    status = predict.main([str(photos), "--checkpoint", str(checkpoint), "--out", str(out), "--device", "cpu",
                           "--threshold", "0.5", "--task", task])
    assert status == 0, capsys.readouterr().err
    written = json.loads((out / "predictions.json").read_text())
    files = sorted(path for path in photos.iterdir() if path.suffix in (".png", ".jpg"))
    expected = predictor.predict(files)
    assert sorted(path.name for path in out.glob("*.jpg")) == sorted(f"{path.stem}.jpg" for path in files)
    assert len(written) == sum(len(prediction) for prediction in expected) > 0
    for prediction in expected:
        rows = [row for row in written if row["file_name"] == prediction.file_name]
        ids = [predictor.category_map.category_ids[label] for label in prediction.labels.tolist()]
        assert [row["category_id"] for row in rows] == ids
        np.testing.assert_allclose([row["score"] for row in rows], prediction.scores.numpy(), atol=1e-3)
        boxes = prediction.boxes.numpy()
        np.testing.assert_allclose([row["bbox"] for row in rows], np.concatenate([boxes[:, :2], boxes[:, 2:] -
                                                                                 boxes[:, :2]], 1), atol=1e-2)
        assert all(("segmentation" in row) == predictor.predicts_masks for row in rows)
        if prediction.masks is not None:
            decoded = mask_utils.decode([row["segmentation"] for row in rows]).transpose(2, 0, 1)
            np.testing.assert_array_equal(decoded, prediction.masks.numpy())
    if predictor.predicts_masks:  # the drawing is the one with masks, not the boxes alone
        prediction = next(p for p in expected if p.file_name == "chelsea.png")
        image = np.array(Image.open(photos / "chelsea.png").convert("RGB"))
        drawn = np.asarray(Image.open(out / "chelsea.jpg")).astype(float)
        with_masks = draw_prediction(image, prediction).permute(1, 2, 0).numpy()
        boxes_only = draw_prediction(image, replace(prediction, masks=None)).permute(1, 2, 0).numpy()
        assert np.abs(drawn - with_masks).mean() < np.abs(drawn - boxes_only).mean() / 2


@pytest.mark.usefixtures("one_thread")
def test_detr_predict_slice_writes_the_predictors_sliced_predictions_with_masks(tmp_path, capsys):
    """``--slice SIZE --slice-overlap F`` writes what ``Predictor.predict(..., slice=...)`` returns: the tiles'
    and the whole image's detections merged, RF-DETR's instance masks pasted into the whole image."""
    checkpoint = tiny_checkpoint("rfdetr", tmp_path)
    photo = REPO / "data" / "photos" / "chelsea.png"
    out = tmp_path / "out"
    status = predict.main([str(photo), "--checkpoint", str(checkpoint), "--out", str(out), "--device", "cpu",
                           "--threshold", "0.3", "--task", "instances", "--slice", "160", "--slice-overlap", "0.25",
                           "--no-draw"])
    assert status == 0, capsys.readouterr().err
    written = json.loads((out / "predictions.json").read_text())
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu", threshold=0.3)
    (sliced,) = predictor.predict(photo, slice=SliceSettings(160, overlap=0.25))
    (whole,) = predictor.predict(photo)
    assert len(written) == len(sliced) > len(whole)  # the tiles find more than the whole image alone
    np.testing.assert_allclose(sorted(row["score"] for row in written), sorted(sliced.scores.tolist()), atol=1e-3)
    height, width = sliced.image_size
    assert sliced.masks is not None and sliced.masks.shape == (len(sliced), height, width)
    decoded = mask_utils.decode([row["segmentation"] for row in written])
    assert decoded.shape[:2] == (height, width) and int(decoded.sum()) == int(sliced.masks.sum())


@pytest.mark.usefixtures("one_thread")
def test_detr_predict_precision_fp16_writes_the_fp16_predictors_predictions(tmp_path, capsys):
    """``--precision fp16`` reaches the Predictor (float16 autocast, on the CPU here: torch 2.14 has it), and its
    scores stay close to fp32's on a tiny RT-DETR (deformable sampling under float16 included)."""
    checkpoint = tiny_checkpoint("rtdetr", tmp_path)
    photo = REPO / "data" / "photos" / "chelsea.png"
    out = tmp_path / "out"
    status = predict.main([str(photo), "--checkpoint", str(checkpoint), "--out", str(out), "--device", "cpu",
                           "--precision", "fp16", "--all-queries", "--no-draw"])
    assert status == 0, capsys.readouterr().err
    written = json.loads((out / "predictions.json").read_text())
    (half,) = Predictor.from_checkpoint(checkpoint, device="cpu", precision="fp16").predict(photo, all_queries=True)
    (full,) = Predictor.from_checkpoint(checkpoint, device="cpu").predict(photo, all_queries=True)
    assert half.scores.dtype == torch.float32 and len(written) == len(half) > 0
    np.testing.assert_allclose([row["score"] for row in written], half.scores.numpy(), atol=1e-3)
    assert (half.scores - full.scores).abs().max() < 5e-3
