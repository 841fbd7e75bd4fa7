"""Error analysis (detr.evaluation.analysis, detr.evaluation.tide) on hand-built cases with exact values."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
from pycocotools.coco import COCO

from detr.evaluation.analysis import ResultsFileError, analyze, evaluate_results, load_results, worst_cases
from detr.evaluation.tide import ERROR_TYPES, class_average_precision
from tests.helpers import coco_ground_truth

A, B = 1, 2
BOX = [10.0, 10.0, 100.0, 100.0]


def _ground_truth(objects: list[tuple[int, int, list[float]]], num_images: int = 8) -> COCO:
    images = [{"id": i, "width": 400, "height": 400, "file_name": f"{i:04d}.jpg"} for i in range(1, num_images + 1)]
    annotations = [{"id": n + 1, "image_id": im, "category_id": c, "bbox": b, "area": b[2] * b[3], "iscrowd": 0}
                   for n, (im, c, b) in enumerate(objects)]
    return coco_ground_truth({"images": images, "annotations": annotations,
                  "categories": [{"id": A, "name": "apple"}, {"id": B, "name": "banana"}]})


def _det(image_id: int, category_id: int, box: list[float], score: float) -> dict:
    return {"image_id": image_id, "category_id": category_id, "bbox": box, "score": score}


# Every case starts from the same perfect detections: two objects per class, found with scores 0.9 and
# 0.6. The one error (score 0.8) sits between them, so it costs AP whenever it is a false positive.
BASE_OBJECTS = [(1, A, BOX), (2, B, BOX), (4, A, BOX), (5, B, BOX)]
BASE_DETS = [_det(1, A, BOX, 0.9), _det(2, B, BOX, 0.9), _det(4, A, BOX, 0.6), _det(5, B, BOX, 0.6)]
# AP of a class ranked TP, FP, TP over two objects: 51 recall points at precision 1, 50 at 2/3.
TP_FP_TP = (51 + 50 * 2 / 3) / 101
SHIFTED = [60.0, 10.0, 100.0, 100.0]  # IoU 1/3 with BOX

CASES = {
    # one prediction of the wrong class on a third apple: apples lose recall, bananas a false positive
    "cls": ([(3, A, BOX)], [_det(3, B, BOX, 0.8)], 1 - (67 / 101 + TP_FP_TP) / 2),
    # a badly localised apple on a third apple: ranked TP, FP, TP over three apples
    "loc": ([(6, A, BOX)], [_det(6, A, SHIFTED, 0.8)], (1 - 56 / 101) / 2),
    # a banana box half over the first apple (IoU 1/3, no banana there)
    "both": ([], [_det(1, B, SHIFTED, 0.8)], (1 - TP_FP_TP) / 2),
    # a second apple on the first apple, scored below the first
    "dupe": ([], [_det(1, A, [12.0, 10.0, 100.0, 100.0], 0.8)], (1 - TP_FP_TP) / 2),
    # an apple where there is nothing
    "bkg": ([], [_det(1, A, [250.0, 250.0, 50.0, 50.0], 0.8)], (1 - TP_FP_TP) / 2),
    # a third apple nobody found: recall 2/3 at precision 1
    "missed": ([(6, A, BOX)], [], (1 - 67 / 101) / 2),
}


def _analysis(objects: list, dets: list, **kwargs):
    coco_gt = _ground_truth(BASE_OBJECTS + objects)
    return analyze(coco_gt, BASE_DETS + dets, **kwargs), coco_gt


def test_perfect_detections_have_no_errors() -> None:
    analysis, _ = _analysis([], [])
    assert analysis.errors.ap == pytest.approx(1.0)
    assert all(analysis.errors.counts[t] == 0 for t in ERROR_TYPES)
    assert all(analysis.errors.delta_ap[t] == 0 for t in analysis.errors.delta_ap)


@pytest.mark.parametrize("error_type", list(CASES))
def test_one_error_moves_only_its_own_dap(error_type: str) -> None:
    objects, dets, expected = CASES[error_type]
    analysis, _ = _analysis(objects, dets)
    errors = analysis.errors
    assert errors.ap == pytest.approx(analysis.stats["AP50"], abs=1e-12)  # the base is COCOeval's AP50
    assert errors.ap + expected == pytest.approx(1.0)  # the fix makes the detector perfect
    for other in ERROR_TYPES:
        assert errors.counts[other] == (1 if other == error_type else 0), other
        assert errors.delta_ap[other] == pytest.approx(expected if other == error_type else 0.0, abs=1e-12), other
    affected = errors.most_affected(error_type)
    assert affected and affected[0][1] > 0


def test_class_dap_is_the_class_ap_gain() -> None:
    objects, dets, _ = CASES["cls"]
    analysis, _ = _analysis(objects, dets)
    by_name = {row["name"]: row for row in analysis.per_class}
    assert by_name["apple"]["dAP"]["cls"] == pytest.approx(1 - 67 / 101)
    assert by_name["banana"]["dAP"]["cls"] == pytest.approx(1 - TP_FP_TP)
    assert by_name["banana"]["errors"]["cls"] == 1 and by_name["apple"]["errors"]["cls"] == 0
    # the special errors: perfect precision fixes the banana false positive, perfect recall the apple
    assert analysis.errors.delta_ap["false_positives"] == pytest.approx((1 - TP_FP_TP) / 2)
    assert analysis.errors.delta_ap["false_negatives"] == pytest.approx((1 - 67 / 101) / 2)


def test_only_the_best_of_two_fixes_counts_and_a_fixable_object_is_not_missed() -> None:
    # two apples half over the third apple: fixing localisation recovers it once; the other is removed
    analysis, _ = _analysis([(6, A, BOX)], [_det(6, A, SHIFTED, 0.8), _det(6, A, [10.0, 60.0, 100.0, 100.0], 0.7)])
    assert analysis.errors.counts["loc"] == 2 and analysis.errors.counts["missed"] == 0
    assert analysis.errors.ap + analysis.errors.delta_ap["loc"] == pytest.approx(1.0)


def test_confusion_matrix_hand_built() -> None:
    # all six errors at once; rows apple, banana, background; columns apple, banana, missed
    objects = [(3, A, BOX), (6, A, BOX), (7, A, BOX)]
    dets = [_det(3, B, BOX, 0.8), _det(6, A, SHIFTED, 0.8), _det(1, B, SHIFTED, 0.8),
            _det(1, A, [12.0, 10.0, 100.0, 100.0], 0.8), _det(1, A, [250.0, 250.0, 50.0, 50.0], 0.8)]
    analysis, _ = _analysis(objects, dets)
    expected = [[2, 1, 2],   # apples: 2 found, 1 called banana, 2 missed (image 6 badly localised, image 7)
                [0, 2, 0],
                [3, 1, 0]]   # background: the localisation error, the duplicate, the empty-space apple; the banana
    assert analysis.confusion.matrix.tolist() == expected
    assert analysis.confusion.confusions() == [("apple", "banana", 1)]
    # above 0.7 the 0.6 detections are gone: they become missed objects
    strict = analyze(_ground_truth(BASE_OBJECTS + objects), BASE_DETS + dets, score_threshold=0.7).confusion
    assert strict.matrix.tolist() == [[1, 1, 3], [0, 1, 1], [3, 1, 0]]
    # at IoU 0.75 the duplicate (IoU 0.96) still overlaps enough; IoUs COCOeval did not use are refused
    strict_iou = analyze(_ground_truth(BASE_OBJECTS + objects), BASE_DETS + dets, confusion_iou=0.75).confusion
    assert strict_iou.matrix.tolist() == expected
    with pytest.raises(ValueError, match="not one COCOeval evaluated"):
        analyze(_ground_truth(BASE_OBJECTS + objects), BASE_DETS + dets, confusion_iou=0.3)


def test_pr_curves_are_cocoeval_precision() -> None:
    rng = np.random.default_rng(0)
    objects, dets = _random_case(rng, num_images=20)
    coco_gt = _ground_truth(objects, num_images=20)
    coco_eval = evaluate_results(coco_gt, dets)
    analysis = analyze(coco_gt, coco_eval=coco_eval)
    precision = coco_eval.eval["precision"]
    np.testing.assert_array_equal(analysis.precision["0.5"], precision[0, :, :, 0, 2].T)
    np.testing.assert_array_equal(analysis.precision["0.75"], precision[5, :, :, 0, 2].T)
    assert analysis.overall_precision("0.5").mean() == pytest.approx(coco_eval.stats[1])
    assert analysis.overall_precision("0.75").mean() == pytest.approx(coco_eval.stats[2])
    for row, k in zip(analysis.per_class, range(2)):
        assert row["AP"] == pytest.approx(precision[:, :, k, 0, 2].mean())
        assert row["AR100"] == pytest.approx(coco_eval.eval["recall"][:, k, 0, 2].mean())
    # the AP the error oracles recompute is COCOeval's, class by class
    np.testing.assert_allclose(analysis.errors.class_ap, precision[0, :, :, 0, 2].mean(axis=0), atol=1e-12)


def test_class_average_precision_matches_cocoeval_ranking_rules() -> None:
    # ties keep input order; a class without ground truth but with detections scores 0 (tidecv's rule)
    ap = class_average_precision(np.array([0, 0, 0, 1]), np.array([0.5, 0.5, 0.4, 0.9]),
                                 np.array([True, False, True, False]), np.array([2, 0]))
    assert ap[0] == pytest.approx(TP_FP_TP)  # TP, FP, TP; the other tie order (FP, TP, TP) gives 2/3
    assert ap[1] == 0.0


def _random_case(rng: np.random.Generator, num_images: int) -> tuple[list, list]:
    objects, dets = [], []
    for image_id in range(1, num_images + 1):
        for _ in range(rng.integers(1, 5)):
            x, y = rng.uniform(0, 250, size=2)
            w, h = rng.uniform(20, 140, size=2)
            category = int(rng.integers(1, 3))
            objects.append((image_id, category, [x, y, w, h]))
            for _ in range(rng.integers(0, 3)):  # near misses, duplicates, class flips
                jitter = rng.normal(0, 0.25, size=4) * [w, h, w, h]
                flipped = category if rng.random() < 0.7 else 3 - category
                dets.append(_det(image_id, flipped, [x + jitter[0], y + jitter[1], max(w + jitter[2], 2.0),
                                                     max(h + jitter[3], 2.0)], float(rng.random())))
        for _ in range(rng.integers(0, 3)):  # background
            dets.append(_det(image_id, int(rng.integers(1, 3)), [*rng.uniform(0, 300, size=2), 30.0, 30.0],
                             float(rng.random())))
    return objects, dets


def test_matches_tidecv_on_random_detections() -> None:
    tidecv = pytest.importorskip("tidecv")
    rng = np.random.default_rng(3)
    objects, dets = _random_case(rng, num_images=40)
    analysis = analyze(_ground_truth(objects, num_images=40), dets)
    ground_truth, predictions = tidecv.Data("gt"), tidecv.Data("dets")
    for image_id, category, box in objects:
        ground_truth.add_ground_truth(image_id, category, box)
    for det in dets:
        predictions.add_detection(det["image_id"], det["category_id"], det["score"], det["bbox"])
    tide = tidecv.TIDE()
    with contextlib.redirect_stdout(io.StringIO()):
        tide.evaluate(ground_truth, predictions, mode=tidecv.TIDE.BOX, name="random")
    run = tide.runs["random"]
    assert analysis.errors.ap * 100 == pytest.approx(run.ap, abs=1e-9)
    theirs = tide.get_main_errors()["random"]
    names = {"Cls": "cls", "Loc": "loc", "Both": "both", "Dupe": "dupe", "Bkg": "bkg", "Miss": "missed"}
    for their_name, ours in names.items():
        assert analysis.errors.delta_ap[ours] * 100 == pytest.approx(theirs[their_name], abs=1e-9), ours
    for their_type, ours in zip(tidecv.TIDE._error_types, ("cls", "loc", "both", "dupe", "bkg", "missed")):
        assert analysis.errors.counts[ours] == len(run.error_dict[their_type]), ours


def test_load_results_maps_file_names_and_rejects_unknown_images() -> None:
    coco_gt = _ground_truth(BASE_OBJECTS)
    loaded = load_results([{"file_name": "0002.jpg", "image_id": 77, "category_id": B, "bbox": BOX, "score": 0.5},
                           {"image_id": 1, "category_id": 99, "bbox": BOX, "score": 0.5}], coco_gt)
    assert loaded == [{"image_id": 2, "category_id": B, "bbox": BOX, "score": 0.5}]
    with pytest.raises(ResultsFileError, match="matches no image"):
        load_results([{"image_id": 77, "category_id": A, "bbox": BOX, "score": 0.5}], coco_gt)
    with pytest.raises(ResultsFileError, match="has no score"):
        load_results([{"image_id": 1, "category_id": A, "bbox": BOX}], coco_gt)
    with pytest.raises(ResultsFileError, match=r"entries \[1\] .*not finite"):
        load_results([{"image_id": 1, "category_id": A, "bbox": BOX, "score": 0.5},
                      {"image_id": 1, "category_id": A, "bbox": [0.0, float("nan"), 5.0, 5.0], "score": 0.5}], coco_gt)


def test_worst_cases_are_most_confident_first() -> None:
    objects = [(3, A, BOX), (6, A, BOX)]
    dets = [_det(3, B, BOX, 0.8), _det(3, B, [11.0, 10.0, 100.0, 100.0], 0.85)]
    analysis, _ = _analysis(objects, dets)
    cases = worst_cases(analysis, "cls")
    assert [c.det_score for c in cases] == [0.85, 0.8]
    assert cases[0].gt_name == "apple" and cases[0].det_name == "banana" and cases[0].file_name == "0003.jpg"
    missed = worst_cases(analysis, "missed")
    assert len(missed) == 1 and missed[0].image_id == 6 and missed[0].det_box is None


def test_empty_results() -> None:
    analysis = analyze(_ground_truth(BASE_OBJECTS), [])
    assert analysis.errors.counts["missed"] == 4
    assert analysis.confusion.matrix[:2, 2].tolist() == [2, 2]
