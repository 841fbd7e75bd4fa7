"""OKS AP equals pycocotools' keypoint COCOeval, with each category's own sigmas."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detr.categories import CategoryMap
from detr.evaluation.keypoints import (
    COCO_PERSON_SIGMAS,
    KEYPOINT_STAT_NAMES,
    MissingSigmasError,
    evaluate_keypoints,
    keypoints_to_results,
)
from tests.helpers import coco_ground_truth


def person_like_set(seed: int, categories: dict[int, int] | None = None, num_images: int = 16
                    ) -> tuple[dict, list[dict]]:
    """COCO-person-shaped ground truth (objects of every size, points inside their box, some hidden, some not
    labelled, some objects with no labelled point, crowd regions) and random predictions: noisy copies of most
    objects (noise from a tenth to a half of the object's size), missed objects and false positives, random
    scores. ``categories``: {category id: K} (default: one person category of 17 points)."""
    rng = np.random.default_rng(seed)
    categories = categories or {1: 17}
    images, annotations, results = [], [], []
    for image_id in range(1, num_images + 1):
        images.append({"id": image_id, "file_name": f"{image_id}.jpg", "height": 480, "width": 640})
        for _ in range(int(rng.integers(0, 6))):
            category_id = int(rng.choice(list(categories)))
            count = categories[category_id]
            side = float(np.exp(rng.uniform(np.log(12), np.log(300))))  # small, medium and large objects
            w, h = side * rng.uniform(0.4, 1.0), side
            x, y = rng.uniform(0, 640 - w), rng.uniform(0, 480 - h)
            points = np.stack([rng.uniform(x, x + w, count), rng.uniform(y, y + h, count),
                               rng.choice([0, 1, 2], count, p=[0.3, 0.2, 0.5])], axis=1)
            if rng.random() < 0.1:
                points[:, 2] = 0  # an object without labelled points: ignored by OKS AP
            points[points[:, 2] == 0, :2] = 0
            crowd = int(rng.random() < 0.05)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category_id,
                                "bbox": [x, y, w, h], "area": w * h * 0.7, "iscrowd": crowd,
                                "keypoints": points.round(2).reshape(-1).tolist(),
                                "num_keypoints": 0 if crowd else int((points[:, 2] > 0).sum())})
            if crowd:
                annotations[-1]["keypoints"] = [0] * (3 * count)
            if rng.random() < 0.85:
                guess = points[:, :2] + rng.normal(0, rng.uniform(0.1, 0.5) * np.sqrt(w * h) / 4, (count, 2))
                results.append({"image_id": image_id, "category_id": category_id, "score": float(rng.random()),
                                "keypoints": np.concatenate([guess, rng.random((count, 1))], 1).reshape(-1).tolist()})
        for _ in range(int(rng.integers(0, 4))):  # false positives anywhere
            category_id = int(rng.choice(list(categories)))
            count = categories[category_id]
            guess = np.stack([rng.uniform(0, 640, count), rng.uniform(0, 480, count), rng.random(count)], 1)
            results.append({"image_id": image_id, "category_id": category_id, "score": float(rng.random()),
                            "keypoints": guess.reshape(-1).tolist()})
    named = [{"id": c, "name": f"thing{c}", "keypoints": [f"p{k}" for k in range(count)], "skeleton": []}
             for c, count in categories.items()]
    return {"images": images, "annotations": annotations, "categories": named}, results


def pycocotools_stats(coco_gt: COCO, results: list[dict], sigmas: np.ndarray, category_ids: list[int]) -> np.ndarray:
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(coco_gt, coco_gt.loadRes([dict(r) for r in results]), iouType="keypoints")
        coco_eval.params.kpt_oks_sigmas = sigmas
        coco_eval.params.catIds = category_ids
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    return coco_eval.stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oks_ap_equals_pycocotools_on_person_shaped_data(seed: int) -> None:
    data, results = person_like_set(seed)
    coco_gt = coco_ground_truth(data)
    ours = evaluate_keypoints(coco_gt, results)
    expected = pycocotools_stats(coco_gt, results, np.array(COCO_PERSON_SIGMAS), [1])
    assert [ours.stats[name] for name in KEYPOINT_STAT_NAMES] == expected.tolist()
    assert 0.0 < ours.stats["AP"] < 1.0  # a meaningful fixture: neither nothing nor everything found
    assert ours.per_class[0]["AP"] == pytest.approx(ours.stats["AP"])
    assert "Average Precision" in ours.summary


def test_each_category_is_scored_with_its_own_sigmas() -> None:
    data, results = person_like_set(5, categories={1: 17, 2: 4}, num_images=24)
    coco_gt = coco_ground_truth(data)
    hand_sigmas = [0.05, 0.05, 0.08, 0.08]
    ours = evaluate_keypoints(coco_gt, results, sigmas={1: COCO_PERSON_SIGMAS, 2: hand_sigmas})
    per_category = {1: pycocotools_stats(coco_gt, [r for r in results if r["category_id"] == 1],
                                         np.array(COCO_PERSON_SIGMAS), [1]),
                    2: pycocotools_stats(coco_gt, [r for r in results if r["category_id"] == 2],
                                         np.array(hand_sigmas), [2])}
    for row in ours.per_class:
        assert row["AP"] == pytest.approx(per_category[row["category_id"]][0], abs=1e-12)
    assert ours.stats["AP"] == pytest.approx(np.mean([stats[0] for stats in per_category.values()]), abs=1e-12)


def test_other_counts_need_sigmas_and_the_error_says_how() -> None:
    data, results = person_like_set(0, categories={3: 4}, num_images=2)
    with pytest.raises(MissingSigmasError, match=r"category 3 has 4 keypoints.*sigmas=\{3: \[4 numbers\]\}"):
        evaluate_keypoints(coco_ground_truth(data), results)
    with pytest.raises(MissingSigmasError, match="4 keypoints but 2 sigmas"):
        evaluate_keypoints(coco_ground_truth(data), results, sigmas={3: [0.1, 0.1]})
    assert evaluate_keypoints(coco_ground_truth(data), results, sigmas=[0.05] * 4).stats["AP"] >= 0


def test_a_result_of_the_wrong_length_is_refused() -> None:
    data, _ = person_like_set(0, num_images=1)
    bad = [{"image_id": 1, "category_id": 1, "keypoints": [1.0, 2.0, 1.0] * 4, "score": 0.5}]
    with pytest.raises(ValueError, match="12 numbers, but that category has 17 keypoints"):
        evaluate_keypoints(coco_ground_truth(data), bad)


def test_detections_become_keypoint_results_cut_to_each_categorys_count() -> None:
    category_map = CategoryMap.from_coco_categories([{"id": 4, "name": "hand"}, {"id": 9, "name": "ball"}],
                                                    contiguous=True)
    detection = {"scores": torch.tensor([0.9, 0.4]), "labels": torch.tensor([0, 1]),
                 "keypoints": torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3) + 0.123456}
    results = keypoints_to_results(7, detection, category_map, {4: 2}, rounded=True)
    assert results == [{"image_id": 7, "category_id": 4, "keypoints": [0.12, 1.12, 2.12346, 3.12, 4.12, 5.12346],
                        "score": 0.9}]


def test_the_coco_evaluator_gives_the_same_oks_ap_batch_by_batch() -> None:
    """CocoEvaluator(iou_type="keypoints"), fed per image as a training loop would, equals pycocotools."""
    from detr.evaluation.coco_evaluator import CocoEvaluator

    data, results = person_like_set(3)
    coco_gt = coco_ground_truth(data)
    evaluator = CocoEvaluator(coco_gt, iou_type="keypoints")
    assert evaluator.backend == "pycocotools"
    for image in data["images"]:
        mine = [r for r in results if r["image_id"] == image["id"]]
        evaluator.update([image["id"]], [{
            "scores": torch.tensor([r["score"] for r in mine]).reshape(-1),
            "labels": torch.tensor([r["category_id"] for r in mine], dtype=torch.int64).reshape(-1),
            "keypoints": torch.tensor([r["keypoints"] for r in mine], dtype=torch.float64).reshape(-1, 17, 3)}])
    evaluation = evaluator.compute()
    expected = pycocotools_stats(coco_gt, results, np.array(COCO_PERSON_SIGMAS), [1])
    assert list(evaluation.stats) == list(KEYPOINT_STAT_NAMES)
    assert [evaluation.stats[name] for name in KEYPOINT_STAT_NAMES] == expected.tolist()
    assert "AR50" in evaluation.stats_table()
    with pytest.raises(MissingSigmasError):
        CocoEvaluator(coco_ground_truth(person_like_set(0, categories={3: 4}, num_images=1)[0]), iou_type="keypoints")
    with pytest.raises(ValueError, match="no 'keypoints'"):
        CocoEvaluator(coco_gt, iou_type="keypoints").update(
            [1], [{"scores": torch.ones(1), "labels": torch.ones(1, dtype=torch.int64)}])
