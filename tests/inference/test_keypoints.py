"""Keypoints after the model: normalised points to pixels per kept detection, Prediction.keypoints, and the
predictions json in COCO's keypoint results format (read back by pycocotools and scored by OKS AP)."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest
import torch

from detr import CategoryMap
from detr.evaluation.keypoints import evaluate_keypoints
from detr.inference.outputs import predictions_to_coco_results
from detr.inference.postprocess_keypoints import add_keypoints, keypoints_to_pixels
from detr.inference.prediction import Prediction, select_detections
from tests.helpers import coco_ground_truth


def test_normalised_keypoints_scale_like_boxes_and_keep_their_score() -> None:
    keypoints = torch.tensor([[[[0.5, 0.25, 0.9], [1.2, -0.1, 0.1]]]])  # [B=1, Q=1, K=2, 3]
    sizes = torch.tensor([[40, 60]])  # height, width
    expected = torch.tensor([[[[30.0, 10.0, 0.9], [72.0, -4.0, 0.1]]]])
    assert torch.allclose(keypoints_to_pixels(keypoints, sizes), expected)
    assert torch.allclose(keypoints_to_pixels(keypoints, sizes, clip=True)[0, 0, 1], torch.tensor([60.0, 0.0, 0.1]))
    with pytest.raises(ValueError, match=r"\[batch, queries, keypoints, 3\]"):
        keypoints_to_pixels(keypoints[0], sizes)


def test_each_kept_detection_takes_the_points_of_its_query() -> None:
    pixels = torch.arange(2 * 3 * 2 * 3, dtype=torch.float32).reshape(2, 3, 2, 3)
    results = [{"scores": torch.tensor([0.9, 0.2]), "labels": torch.tensor([0, 1]), "queries": torch.tensor([2, 0]),
                "boxes": torch.zeros(2, 4)},
               {"scores": torch.tensor([0.5]), "labels": torch.tensor([0]), "queries": torch.tensor([1]),
                "boxes": torch.zeros(1, 4)}]
    with_points = add_keypoints(results, pixels)
    assert torch.equal(with_points[0]["keypoints"], pixels[0, [2, 0]])
    assert torch.equal(with_points[1]["keypoints"], pixels[1, [1]])
    prediction = select_detections(with_points[0], image_size=(40, 60), category_map=None, threshold=0.5)
    assert torch.equal(prediction.keypoints, pixels[0, [2]])
    assert prediction.above(0.95).keypoints.shape == (0, 2, 3)
    plain = select_detections(results[0], image_size=(40, 60), category_map=None, threshold=None)
    assert plain.keypoints is None  # a model without keypoints: the field stays empty


def test_the_predictions_json_holds_coco_keypoint_results_that_oks_ap_reads() -> None:
    category_map = CategoryMap(category_ids=(1, 2), names=("hand", "ball"))
    points = torch.tensor([[[10.0, 12.0, 0.9], [30.0, 12.0, 0.8], [20.0, 30.0, 0.2]]])
    prediction = Prediction(boxes=torch.tensor([[5.0, 5.0, 35.0, 35.0]]), scores=torch.tensor([0.75]),
                            labels=torch.tensor([0]), label_names=["hand"], query_indices=torch.tensor([4]),
                            image_size=(40, 60), image_id=1, keypoints=points)
    counted = replace(prediction, keypoint_counts=(2, 0))  # the hand's two points, the ball none
    results = predictions_to_coco_results([counted], category_map=category_map)
    assert results[0]["keypoints"] == [10.0, 12.0, 0.9, 30.0, 12.0, 0.8]  # the hand's two points, rounded
    assert predictions_to_coco_results([prediction], category_map=category_map)[0]["keypoints"][6:] == [20, 30, 0.2]
    ground_truth = coco_ground_truth({
        "images": [{"id": 1, "file_name": "a.png", "height": 40, "width": 60}],
        "categories": [{"id": 1, "name": "hand", "keypoints": ["left", "right"], "skeleton": [[1, 2]]},
                       {"id": 2, "name": "ball"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 30, 30], "area": 900.0,
                         "iscrowd": 0, "keypoints": [10, 12, 2, 30, 12, 2], "num_keypoints": 2}]})
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = evaluate_keypoints(ground_truth, results, sigmas={1: [0.05, 0.05]})
    assert evaluation.stats["AP"] == pytest.approx(1.0)


def test_each_detection_writes_as_many_points_as_the_model_gives_its_class() -> None:
    """A keypoint model's classes have their own counts (its schema's): the json lists each detection's own points,
    not the K_max the tensor pads to, and a class without keypoints gets none, as the data's json would."""
    points = torch.arange(3 * 3 * 3, dtype=torch.float32).reshape(3, 3, 3) / 100 + 1
    result = {"scores": torch.tensor([0.9, 0.8, 0.7]), "labels": torch.tensor([0, 1, 2]),
              "queries": torch.tensor([0, 1, 2]), "boxes": torch.tensor([[1.0, 1.0, 9.0, 9.0]] * 3),
              "keypoints": points}
    prediction = select_detections(result, image_size=(40, 60), category_map=None, threshold=None,
                                   keypoint_counts=(3, 1, 0))
    assert [tuple(prediction.detection_keypoints(i).shape) for i in range(3)] == [(3, 3), (1, 3), (0, 3)]
    assert prediction.above(0.85).keypoint_counts == (3, 1, 0)
    prediction.image_id = 1
    category_map = CategoryMap(category_ids=(5, 6, 7), names=("star", "circle", "sky"))
    results = predictions_to_coco_results([prediction], category_map=category_map)
    assert [len(entry.get("keypoints", [])) for entry in results] == [9, 3, 0]
    assert results[1]["keypoints"] == [round(float(v), 2) for v in points[1, 0]]
    assert [len(entry["keypoints"]) for entry in predictions_to_coco_results(
        [replace(prediction, keypoint_counts=None)], category_map=category_map)] == [9, 9, 9]
