"""CocoEvaluator against pycocotools run by hand on the same predictions."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import numpy as np
import pytest
import torch
from pycocotools.cocoeval import COCOeval

from detr.categories import CategoryMap
from detr.evaluation import STAT_NAMES, CocoEvaluator
from tests.helpers import coco_ground_truth

CATEGORIES = [{"id": 3, "name": "circle"}, {"id": 7, "name": "square"}, {"id": 12, "name": "triangle"}]


def _hand_made_ground_truth() -> dict:
    """Three images: two objects; one object plus a crowd region; no objects at all."""
    images = [
        {"id": 10, "width": 200, "height": 100, "file_name": "a.jpg"},
        {"id": 11, "width": 120, "height": 160, "file_name": "b.jpg"},
        {"id": 12, "width": 64, "height": 64, "file_name": "empty.jpg"},
    ]
    boxes = [  # image, category, xywh, crowd
        (10, 3, [10.0, 10.0, 50.0, 40.0], 0),
        (10, 7, [100.0, 20.0, 80.0, 70.0], 0),
        (11, 12, [5.0, 5.0, 20.0, 20.0], 0),
        (11, 7, [40.0, 60.0, 70.0, 90.0], 1),
    ]
    annotations = [
        {"id": i + 1, "image_id": im, "category_id": c, "bbox": b, "area": b[2] * b[3], "iscrowd": crowd}
        for i, (im, c, b, crowd) in enumerate(boxes)
    ]
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}


def _pycocotools_stats(dataset: dict, results: list[dict], image_ids: list[int]) -> list[float]:
    gt = coco_ground_truth(dataset)
    with contextlib.redirect_stdout(io.StringIO()):
        dt = gt.loadRes(copy.deepcopy(results))
        coco_eval = COCOeval(gt, dt, iouType="bbox")
        coco_eval.params.imgIds = image_ids
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    return [float(v) for v in coco_eval.stats]


def _detection(rows: list[tuple[int, list[float], float]]) -> dict[str, torch.Tensor]:
    """rows of (model label, xyxy pixels, score) → post-processed detection dict."""
    return {
        "labels": torch.tensor([r[0] for r in rows], dtype=torch.int64),
        "boxes": torch.tensor([r[1] for r in rows], dtype=torch.float32).reshape(-1, 4),
        "scores": torch.tensor([r[2] for r in rows], dtype=torch.float32),
    }


def test_hand_made_predictions_match_pycocotools_with_crowd_and_empty_image() -> None:
    dataset = _hand_made_ground_truth()
    category_map = CategoryMap.from_coco_categories(CATEGORIES, contiguous=True)  # labels 0,1,2 -> 3,7,12
    evaluator = CocoEvaluator(coco_ground_truth(dataset), category_map=category_map)
    evaluator.update(
        torch.tensor([10, 11]),
        [
            _detection([(0, [12, 11, 58, 52], 0.9), (1, [100, 20, 180, 90], 0.8), (2, [0, 0, 30, 30], 0.3)]),
            # the square on the crowd region must be ignored, not a false positive
            _detection([(2, [5, 5, 25, 25], 0.95), (1, [42, 62, 108, 148], 0.7), (0, [60, 0, 100, 30], 0.2)]),
        ],
    )
    evaluator.update([12], [_detection([(1, [10, 10, 30, 30], 0.5)])])  # false positive on an empty image
    evaluator.update([10], [_detection([])])  # a repeated image (sampler padding) is counted once
    evaluation = evaluator.compute()

    assert evaluation.image_ids == [10, 11, 12]
    assert set(evaluation.stats) == set(STAT_NAMES)
    assert {r["category_id"] for r in evaluation.results} == {3, 7, 12}  # data set ids, not labels
    square = [r for r in evaluation.results if r["image_id"] == 10 and r["category_id"] == 7]
    assert square[0]["bbox"] == pytest.approx([100.0, 20.0, 80.0, 70.0])  # xyxy -> xywh

    # the same predictions written by hand in COCO results format
    hand_results = [
        {"image_id": 10, "category_id": 3, "bbox": [12, 11, 46, 41], "score": 0.9},
        {"image_id": 10, "category_id": 7, "bbox": [100, 20, 80, 70], "score": 0.8},
        {"image_id": 10, "category_id": 12, "bbox": [0, 0, 30, 30], "score": 0.3},
        {"image_id": 11, "category_id": 12, "bbox": [5, 5, 20, 20], "score": 0.95},
        {"image_id": 11, "category_id": 7, "bbox": [42, 62, 66, 86], "score": 0.7},
        {"image_id": 11, "category_id": 3, "bbox": [60, 0, 40, 30], "score": 0.2},
        {"image_id": 12, "category_id": 7, "bbox": [10, 10, 20, 20], "score": 0.5},
    ]
    expected = _pycocotools_stats(dataset, hand_results, [10, 11, 12])
    for name, index in zip(STAT_NAMES, (0, 1, 2, 3, 4, 5, 8)):
        assert evaluation.stats[name] == pytest.approx(expected[index], abs=1e-12), name
    # checks independent of pycocotools: the crowd match is ignored, the empty image's false
    # positive (score 0.5) ranks below the true square (0.8), so every class keeps AP50 = 1.
    per_class = {row["category_id"]: row for row in evaluation.per_class}
    assert all(per_class[c]["AP50"] == pytest.approx(1.0) for c in (3, 7, 12))
    assert per_class[7]["num_instances"] == 1  # the crowd region is not an instance
    assert "square" in evaluation.per_class_table()


def test_false_positive_on_empty_image_lowers_precision_as_pycocotools_does() -> None:
    dataset = _hand_made_ground_truth()
    evaluator = CocoEvaluator(coco_ground_truth(dataset))  # no map: labels are category ids
    evaluator.update([10], [_detection([(3, [10, 10, 60, 50], 0.5), (7, [100, 20, 180, 90], 0.5)])])
    evaluator.update([12], [_detection([(3, [0, 0, 20, 20], 0.99)])])  # outranks the true circle
    evaluation = evaluator.compute()
    hand_results = [
        {"image_id": 10, "category_id": 3, "bbox": [10, 10, 50, 40], "score": 0.5},
        {"image_id": 10, "category_id": 7, "bbox": [100, 20, 80, 70], "score": 0.5},
        {"image_id": 12, "category_id": 3, "bbox": [0, 0, 20, 20], "score": 0.99},
    ]
    expected = _pycocotools_stats(dataset, hand_results, [10, 12])
    assert evaluation.stats["AP"] == pytest.approx(expected[0], abs=1e-12)
    per_class = {row["category_id"]: row for row in evaluation.per_class}
    # circle: precision 1/2 at recall 1 -> 101-point interpolated AP 0.5; square perfect; triangle absent
    assert per_class[3]["AP"] == pytest.approx(0.5)
    assert per_class[7]["AP"] == pytest.approx(1.0)
    assert per_class[12]["AP"] == -1.0


def test_no_detections_and_unknown_image() -> None:
    dataset = _hand_made_ground_truth()
    evaluator = CocoEvaluator(coco_ground_truth(dataset))
    assert evaluator.compute().stats["AP"] == -1.0  # nothing predicted
    evaluator.update([10, 12], [_detection([]), _detection([])])
    assert evaluator.compute().stats["AP"] == 0.0  # predicted, found nothing
    with pytest.raises(ValueError, match="image id 99"):
        evaluator.update([99], [_detection([])])
    evaluator.reset()
    assert evaluator.num_images == 0


def _random_dataset_and_detections(seed: int) -> tuple[dict, dict[int, dict[str, torch.Tensor]]]:
    rng = np.random.default_rng(seed)
    images, annotations, detections = [], [], {}
    for image_id in range(1, 21):
        width, height = int(rng.integers(64, 400)), int(rng.integers(64, 400))
        images.append({"id": image_id, "width": width, "height": height})
        rows = []
        for _ in range(int(rng.integers(0, 6))):
            w, h = rng.uniform(4, width / 2), rng.uniform(4, height / 2)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            category = int(rng.choice([3, 7, 12]))
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                 "bbox": [x, y, w, h], "area": w * h, "iscrowd": int(rng.random() < 0.1)}
            )
            jitter = rng.normal(0, 0.1 * min(w, h), size=4)
            rows.append((category, [x + jitter[0], y + jitter[1], x + w + jitter[2], y + h + jitter[3]], rng.random()))
        for _ in range(int(rng.integers(0, 8))):  # background false positives
            x, y = rng.uniform(0, width - 10), rng.uniform(0, height - 10)
            rows.append((int(rng.choice([3, 7, 12])), [x, y, x + 10, y + 10], rng.random()))
        detections[image_id] = _detection(rows)
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}, detections


def test_faster_coco_eval_agrees_with_pycocotools() -> None:
    pytest.importorskip("faster_coco_eval")
    dataset, detections = _random_dataset_and_detections(seed=0)
    stats = {}
    for backend in ("pycocotools", "faster_coco_eval"):
        evaluator = CocoEvaluator(coco_ground_truth(dataset), backend=backend)
        evaluator.update(list(detections), list(detections.values()))
        stats[backend] = evaluator.compute()
    assert 0.05 < stats["pycocotools"].stats["AP"] < 0.95  # a non-trivial case
    for name in STAT_NAMES:
        assert stats["faster_coco_eval"].stats[name] == pytest.approx(stats["pycocotools"].stats[name], abs=1e-4)
    for fast, reference in zip(stats["faster_coco_eval"].per_class, stats["pycocotools"].per_class):
        assert fast["AP"] == pytest.approx(reference["AP"], abs=1e-4)


def test_progress_bar_leaves_the_numbers_alone(capsys) -> None:
    dataset, detections = _random_dataset_and_detections(seed=1)
    stats = []
    for progress in (False, True):
        evaluator = CocoEvaluator(coco_ground_truth(dataset), progress=progress)
        evaluator.update(list(detections), list(detections.values()))
        stats.append(evaluator.compute().stats)
    assert stats[0] == stats[1]
    assert "COCO eval" in capsys.readouterr().err


def test_write_outputs(tmp_path) -> None:
    dataset = _hand_made_ground_truth()
    evaluator = CocoEvaluator(coco_ground_truth(dataset))
    evaluator.update([10], [_detection([(3, [10, 10, 60, 50], 0.5)])])
    paths = evaluator.compute().write(tmp_path)
    predictions = json.loads(paths["predictions"].read_text())
    assert predictions == [{"image_id": 10, "category_id": 3, "bbox": [10.0, 10.0, 50.0, 40.0], "score": 0.5}]
    assert set(json.loads(paths["metrics"].read_text())) == set(STAT_NAMES)
