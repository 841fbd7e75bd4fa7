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


def _keypoint_prediction() -> Prediction:
    # two detections of a 3-point class and a 2-point class (its third slot unused: (0, 0) scored 0)
    points = torch.tensor([[[10.0, 12.0, 0.9], [30.0, 12.0, 0.3], [20.0, 30.0, 0.7]],
                           [[50.0, 5.0, 0.8], [55.0, 9.0, 0.6], [0.0, 0.0, 0.0]]])
    return Prediction(boxes=torch.tensor([[5.0, 5.0, 35.0, 35.0], [45.0, 2.0, 60.0, 12.0]]),
                      scores=torch.tensor([0.75, 0.5]), labels=torch.tensor([0, 1]), label_names=["hand", "pen"],
                      query_indices=torch.tensor([4, 7]), image_size=(40, 64), keypoints=points)


def test_keypoints_go_to_supervision_key_points_row_for_row_and_come_back() -> None:
    prediction = _keypoint_prediction()
    detections, key_points = prediction.to_supervision(), prediction.to_supervision_keypoints()
    assert isinstance(key_points, sv.KeyPoints) and len(key_points) == len(detections) == 2
    np.testing.assert_array_equal(key_points.xy, prediction.keypoints[..., :2].numpy())
    np.testing.assert_array_equal(key_points.keypoint_confidence, prediction.keypoints[..., 2].numpy())
    assert key_points.visible.tolist() == [[True, False, True], [True, True, False]]
    np.testing.assert_array_equal(key_points.class_id, detections.class_id)
    np.testing.assert_array_equal(key_points.detection_confidence, detections.confidence)
    assert key_points.data["class_name"].tolist() == ["hand", "pen"]

    back = Prediction.from_supervision(detections, keypoints=key_points, image_size=prediction.image_size)
    _assert_same(back, prediction)
    assert torch.equal(back.keypoints, prediction.keypoints)
    assert Prediction.from_supervision(detections, image_size=prediction.image_size).keypoints is None

    chosen = detections.confidence > 0.6  # one index selects the same objects of both
    kept = Prediction.from_supervision(detections[chosen], keypoints=key_points[chosen],
                                       image_size=prediction.image_size)
    assert torch.equal(kept.keypoints, prediction.above(0.6).keypoints)
    # supervision's own reading: the box around the visible points, the (0, 0) slot left out
    assert key_points.as_detections().xyxy.tolist() == [[10, 12, 20, 30], [50, 5, 55, 9]]
    only_visible = sv.KeyPoints(xy=key_points.xy, visible=key_points.visible)
    assert Prediction.from_supervision(detections, keypoints=only_visible,
                                       image_size=prediction.image_size).keypoints[..., 2].tolist() == \
        [[1, 0, 1], [1, 1, 0]]

    canvas = np.zeros((40, 64, 3), dtype=np.uint8)
    drawn = sv.EdgeAnnotator(edges=[(1, 2), (2, 3)]).annotate(sv.VertexAnnotator().annotate(canvas.copy(),
                                                                                            key_points), key_points)
    assert drawn.shape == canvas.shape and drawn.any()


def test_key_points_of_no_detections_and_of_a_model_without_keypoints() -> None:
    prediction = _keypoint_prediction()
    empty = prediction.above(0.99).to_supervision_keypoints()
    assert len(empty) == 0 and empty.xy.shape == (0, 3, 2)
    back = Prediction.from_supervision(sv.Detections.empty(), keypoints=empty, image_size=(40, 64))
    assert back.keypoints.shape == (0, 3, 3)
    boxes_only = Prediction.from_supervision(prediction.to_supervision(), image_size=(40, 64))
    with pytest.raises(ValueError, match="no keypoints.*to_supervision\\(\\)"):
        boxes_only.to_supervision_keypoints()
    with pytest.raises(ValueError, match="keypoints holds 1 objects but detections 2"):
        Prediction.from_supervision(prediction.to_supervision(), image_size=(40, 64),
                                    keypoints=prediction.to_supervision_keypoints()[np.array([True, False])])
