"""Prediction ↔ supervision's Detections: a tiny model's predictions (with masks for a panoptic model) come back
unchanged through ``to_supervision`` and ``from_supervision``, and supervision's own annotators draw them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detr import build_detr, build_detr_panoptic
from detr.categories import CategoryMap
from detr.inference.prediction import Prediction
from detr.inference.predictor import Predictor
from tests.helpers import TINY

sv = pytest.importorskip("supervision")

IMAGE = np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8)
SIZES = {"min_size": 64, "max_size": 96}


def _names(names: list[str]) -> CategoryMap:
    return CategoryMap(category_ids=tuple(range(len(names))), names=tuple(names))


def _assert_same(back: Prediction, prediction: Prediction) -> None:
    torch.testing.assert_close(back.boxes, prediction.boxes)
    torch.testing.assert_close(back.scores, prediction.scores)
    assert back.labels.tolist() == prediction.labels.tolist()
    assert back.label_names == prediction.label_names
    assert back.image_size == prediction.image_size


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("panoptic", [False, True], ids=["boxes", "masks"])
def test_predictions_round_trip_through_detections(panoptic: bool) -> None:
    torch.manual_seed(0)
    model = (build_detr_panoptic(TINY.replace(hidden_dim=128, num_heads=8)) if panoptic else build_detr(TINY)).eval()
    names = _names([f"thing{index}" for index in range(TINY.num_classes)])
    prediction = Predictor(model, device="cpu", category_map=names, **SIZES).predict_arrays([IMAGE],
                                                                                           threshold=0.0)[0]
    assert len(prediction) > 0

    detections = prediction.to_supervision()
    assert isinstance(detections, sv.Detections) and len(detections) == len(prediction)
    np.testing.assert_array_equal(detections.xyxy, prediction.boxes.numpy())
    np.testing.assert_array_equal(detections.class_id, prediction.labels.numpy())
    np.testing.assert_array_equal(detections.confidence, prediction.scores.numpy())
    assert detections.data["class_name"].tolist() == prediction.label_names
    assert (detections.mask is not None) == panoptic
    if panoptic:
        np.testing.assert_array_equal(detections.mask, prediction.masks.numpy())

    back = Prediction.from_supervision(detections, image_size=prediction.image_size)
    _assert_same(back, prediction)
    if panoptic:
        assert torch.equal(back.masks, prediction.masks)
    assert back.query_indices.tolist() == [-1] * len(prediction)

    kept = detections[detections.confidence > float(prediction.scores.median())]  # supervision's own filtering
    _assert_same(Prediction.from_supervision(kept, image_size=prediction.image_size),
                 prediction.above(float(prediction.scores.median())))

    drawn = sv.LabelAnnotator().annotate(sv.BoxAnnotator().annotate(IMAGE.copy(), detections), detections)
    assert drawn.shape == IMAGE.shape and not np.array_equal(drawn, IMAGE)


def test_ground_truth_detections_score_one_and_take_names_from_the_map() -> None:
    detections = sv.Detections(xyxy=np.array([[1, 2, 10, 20]], dtype=np.float32), class_id=np.array([1]))
    prediction = Prediction.from_supervision(detections, image_size=(30, 40),
                                             category_map=_names(["cat", "dog"]))
    assert prediction.scores.tolist() == [1.0] and prediction.label_names == ["dog"]
    empty = Prediction.from_supervision(sv.Detections.empty(), image_size=(30, 40))
    assert len(empty) == 0 and empty.boxes.shape == (0, 4)
    assert len(empty.to_supervision()) == 0


def test_detections_without_class_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="no class_id"):
        Prediction.from_supervision(sv.Detections(xyxy=np.array([[1, 2, 10, 20]], dtype=np.float32)),
                                    image_size=(30, 40))
