"""CocoEvaluator against pycocotools run by hand on the same predictions, and faster-coco-eval (the default
where installed) against pycocotools on every statistic: hand-made cases, COCO's own annotations with
perturbed ground truth as detections, and 5,000 images × 100 detections."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools.cocoeval import COCOeval

from detr.categories import CategoryMap
from detr.evaluation import STAT_NAMES, CocoEvaluator, resolve_backend
from detr.evaluation.analysis import analyze, load_ground_truth
from tests.helpers import REPO, coco_ground_truth, load_script

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


def _both_backends(coco_gt, detections: dict[int, dict[str, torch.Tensor]], category_map=None) -> dict:
    """CocoEvaluation per backend of the same detections (per image id)."""
    evaluations = {}
    for backend in ("pycocotools", "faster_coco_eval"):
        evaluator = CocoEvaluator(coco_gt, category_map=category_map, backend=backend)
        evaluator.update(list(detections), list(detections.values()))
        evaluations[backend] = evaluator.compute()
        assert evaluations[backend].backend == backend
    return evaluations


def _assert_same_numbers(evaluations: dict) -> None:
    """Every COCOeval statistic (AP, AP50, AP75, APs/m/l, AR1/10/100, ARs/m/l), the precision and recall
    arrays and the per-class table of faster-coco-eval equal pycocotools' to 1e-12."""
    fast, reference = evaluations["faster_coco_eval"], evaluations["pycocotools"]
    np.testing.assert_allclose(fast.coco_eval.stats[:12], reference.coco_eval.stats, rtol=0, atol=1e-12)
    for key in ("precision", "recall", "scores"):
        np.testing.assert_allclose(fast.coco_eval.eval[key], reference.coco_eval.eval[key], rtol=0, atol=1e-12,
                                   err_msg=key)
    assert fast.stats == pytest.approx(reference.stats, rel=0, abs=1e-12)
    assert len(fast.per_class) == len(reference.per_class)
    for fast_row, reference_row in zip(fast.per_class, reference.per_class):
        fast_row, reference_row = dict(fast_row), dict(reference_row)
        for key in ("AP", "AP50", "AP75"):
            assert fast_row.pop(key) == pytest.approx(reference_row.pop(key), rel=0, abs=1e-12), key
        assert fast_row == reference_row  # category id, name, number of objects
    assert fast.summary == reference.summary
    assert fast.results == reference.results and fast.image_ids == reference.image_ids


def test_auto_backend_is_faster_coco_eval_where_installed(monkeypatch) -> None:
    try:
        import faster_coco_eval  # noqa: F401

        installed = "faster_coco_eval"
    except ImportError:
        installed = "pycocotools"
    assert resolve_backend("auto") == installed
    assert CocoEvaluator(coco_ground_truth(_hand_made_ground_truth())).backend == installed  # the default
    assert resolve_backend("pycocotools") == "pycocotools"
    monkeypatch.setitem(sys.modules, "faster_coco_eval", None)  # as if not installed: import raises ImportError
    assert resolve_backend("auto") == "pycocotools"
    with pytest.raises(ValueError, match="pip install faster-coco-eval"):
        resolve_backend("faster_coco_eval")
    with pytest.raises(ValueError, match="'auto', 'pycocotools', 'faster_coco_eval'"):
        resolve_backend("fast")


def test_faster_coco_eval_agrees_with_pycocotools() -> None:
    pytest.importorskip("faster_coco_eval")
    dataset, detections = _random_dataset_and_detections(seed=0)
    evaluations = _both_backends(coco_ground_truth(dataset), detections)
    assert 0.05 < evaluations["pycocotools"].stats["AP"] < 0.95  # a non-trivial case
    _assert_same_numbers(evaluations)


def _perturbed_ground_truth(coco_gt, seed: int) -> dict[int, dict[str, torch.Tensor]]:
    """Detections made of the ground truth: every object jittered (10 % of its size), one in five with
    another class, duplicates, and boxes anywhere; scores random. Crowd regions are detected too."""
    rng = np.random.default_rng(seed)
    category_ids = coco_gt.getCatIds()
    detections = {}
    for image_id in coco_gt.getImgIds():
        image = coco_gt.imgs[image_id]
        rows = []
        for annotation in coco_gt.imgToAnns[image_id]:
            x, y, w, h = annotation["bbox"]
            for _ in range(int(rng.integers(1, 3))):
                jitter = rng.normal(0, 0.1, 4) * [w, h, w, h]
                category = annotation["category_id"] if rng.random() < 0.8 else int(rng.choice(category_ids))
                rows.append((category, [x + jitter[0], y + jitter[1], x + w + jitter[2], y + h + jitter[3]],
                             rng.uniform(0.2, 1.0)))
        for _ in range(int(rng.integers(0, 30))):
            w, h = rng.uniform(2, image["width"] / 2), rng.uniform(2, image["height"] / 2)
            x, y = rng.uniform(0, image["width"] - w), rng.uniform(0, image["height"] - h)
            rows.append((int(rng.choice(category_ids)), [x, y, x + w, y + h], rng.uniform(0.0, 0.5)))
        detections[image_id] = _detection(rows)
    return detections


def test_faster_coco_eval_equals_pycocotools_on_coco_annotations() -> None:
    """COCO val annotations (polygons, crowd regions, all three area ranges) of the bundled coco-mini set."""
    pytest.importorskip("faster_coco_eval")
    coco_gt = load_ground_truth(REPO / "data" / "coco-mini" / "annotations" / "instances_val2017.json")
    category_map = CategoryMap.from_coco_categories(coco_gt.dataset["categories"], contiguous=True)
    detections = _perturbed_ground_truth(coco_gt, seed=0)
    labelled = {image_id: {**d, "labels": torch.tensor([category_map.category_id_to_label(c)
                                                         for c in d["labels"].tolist()], dtype=torch.int64)}
                for image_id, d in detections.items()}
    evaluations = _both_backends(coco_gt, labelled, category_map)
    stats = evaluations["pycocotools"].coco_eval.stats
    assert 0.2 < stats[0] < 0.9 and min(stats) > 0  # non-trivial, and every area range has objects
    _assert_same_numbers(evaluations)
    assert all("segmentation" in a for a in coco_gt.dataset["annotations"])  # faster's copy left them alone


def test_error_analysis_is_the_same_after_either_backend() -> None:
    """analyze() reuses pycocotools' per-image matches; faster-coco-eval keeps none, so the analysis
    evaluates the results again and gets the same per-class table, TIDE errors and confusion matrix."""
    pytest.importorskip("faster_coco_eval")
    dataset, detections = _random_dataset_and_detections(seed=2)
    coco_gt = coco_ground_truth(dataset)
    analyses = {backend: analyze(coco_gt, evaluation.results, coco_eval=evaluation.coco_eval,
                                 image_ids=evaluation.image_ids)
                for backend, evaluation in _both_backends(coco_gt, detections).items()}
    fast, reference = analyses["faster_coco_eval"], analyses["pycocotools"]
    assert fast.stats == reference.stats
    assert fast.per_class == reference.per_class
    assert fast.errors.delta_ap == reference.errors.delta_ap
    np.testing.assert_array_equal(fast.confusion.matrix, reference.confusion.matrix)


@pytest.mark.slow
def test_faster_coco_eval_equals_pycocotools_on_5000_images_by_100_detections() -> None:
    """The scale of a COCO validation (benchmarks/coco_eval_speed.py times it): pycocotools takes minutes."""
    pytest.importorskip("faster_coco_eval")
    dataset, results = load_script("benchmarks/analysis_speed.py").synthetic(5000, 100)
    per_image: dict[int, list[dict]] = {}
    for entry in results:
        per_image.setdefault(entry["image_id"], []).append(entry)
    detections = {}
    for image_id, entries in per_image.items():
        boxes = torch.tensor([entry["bbox"] for entry in entries], dtype=torch.float64)
        detections[image_id] = {"labels": torch.tensor([entry["category_id"] for entry in entries]),
                                "boxes": torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1).float(),
                                "scores": torch.tensor([entry["score"] for entry in entries])}
    evaluations = _both_backends(coco_ground_truth(dataset), detections)
    assert len(evaluations["pycocotools"].results) == 500_000
    _assert_same_numbers(evaluations)


def test_progress_bar_leaves_the_numbers_alone(capsys) -> None:
    dataset, detections = _random_dataset_and_detections(seed=1)
    stats = []
    for progress in (False, True):
        evaluator = CocoEvaluator(coco_ground_truth(dataset), backend="pycocotools", progress=progress)
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


def _two_process_compute(rank: int, port: int, out: str, fail_on_rank_zero: bool) -> None:
    """One of two gloo processes: rank 0 predicts images 1-10, rank 1 images 10-20 (10 twice, as the
    distributed sampler repeats an image); records what compute gave this rank, or the error it raised."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        dataset, detections = _random_dataset_and_detections(seed=3)
        evaluator = CocoEvaluator(coco_ground_truth(dataset), backend="pycocotools")
        runs = []
        run_cocoeval = evaluator._run_cocoeval

        def counted(*args):
            runs.append(rank)
            if fail_on_rank_zero:
                raise ValueError("broken ground truth")
            return run_cocoeval(*args)

        evaluator._run_cocoeval = counted
        mine = range(1, 11) if rank == 0 else range(10, 21)
        evaluator.update(list(mine), [detections[i] for i in mine])
        try:
            evaluation = evaluator.compute()
            record = {"stats": evaluation.stats, "image_ids": evaluation.image_ids, "runs": len(runs),
                      "num_results": len(evaluation.results), "per_class": evaluation.per_class}
        except Exception as error:
            record = {"error": f"{type(error).__name__}: {error}", "runs": len(runs)}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fail_on_rank_zero", [False, True])
def test_two_processes_gather_to_rank_zero_evaluate_once_and_share_the_numbers(tmp_path, fail_on_rank_zero) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_two_process_compute, args=(port, str(tmp_path), fail_on_rank_zero), nprocs=2,
                       start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    if fail_on_rank_zero:  # rank 1 does not wait forever for numbers that never come
        assert ranks[0] == {"error": "ValueError: broken ground truth", "runs": 1}
        assert ranks[1] == {"error": "RuntimeError: COCO evaluation failed on rank 0: ValueError: broken ground "
                                     "truth", "runs": 0}
        return
    dataset, detections = _random_dataset_and_detections(seed=3)
    single = CocoEvaluator(coco_ground_truth(dataset), backend="pycocotools")
    single.update(list(detections), list(detections.values()))
    expected = single.compute()
    assert [record["runs"] for record in ranks] == [1, 0]  # COCOeval ran once, on rank 0
    assert ranks[0]["num_results"] == len(expected.results) and ranks[1]["num_results"] == 0
    for record in ranks:
        assert record["image_ids"] == list(range(1, 21))  # image 10 once
        assert record["stats"] == expected.stats
        assert record["per_class"] == expected.per_class


def test_garbage_collection_is_paused_inside_and_restored_after(monkeypatch) -> None:
    import gc

    from detr.evaluation.coco_evaluator import garbage_collection_paused

    states = []
    dataset, detections = _random_dataset_and_detections(seed=4)
    evaluator = CocoEvaluator(coco_ground_truth(dataset))
    run_cocoeval = evaluator._run_cocoeval

    def recorded(*args):
        states.append(gc.isenabled())
        return run_cocoeval(*args)

    monkeypatch.setattr(evaluator, "_run_cocoeval", recorded)
    evaluator.update(list(detections), list(detections.values()))
    assert gc.isenabled()
    evaluator.compute()
    assert states == [False] and gc.isenabled()
    with pytest.raises(RuntimeError), garbage_collection_paused():
        raise RuntimeError("an evaluation that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with garbage_collection_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def _random_masks(generator: torch.Generator, count: int, height: int, width: int) -> torch.Tensor:
    """``count`` bool masks [count, H, W]: random rectangles with random pixels flipped inside them."""
    masks = torch.zeros(count, height, width, dtype=torch.bool)
    for mask in masks:
        y0, x0 = (int(torch.randint(0, size // 2, (1,), generator=generator)) for size in (height, width))
        y1 = y0 + 4 + int(torch.randint(0, height - y0 - 4, (1,), generator=generator))
        x1 = x0 + 4 + int(torch.randint(0, width - x0 - 4, (1,), generator=generator))
        mask[y0:y1, x0:x1] = torch.rand(y1 - y0, x1 - x0, generator=generator) > 0.1
    return masks


def _mask_case(seed: int) -> tuple[list[dict], list[list[dict]], dict[int, dict[str, torch.Tensor]]]:
    """Per image: its COCO entry, its ground-truth annotations (RLE; one crowd region in image 1) and
    detections with masks: the ground truth's masks eroded or shifted, plus false positives."""
    from detr.evaluation.coco_evaluator import masks_to_rle

    generator = torch.Generator().manual_seed(seed)
    images, annotations, detections = [], [], {}
    for image_id in range(1, 7):
        height, width = 40 + 7 * image_id, 60 - 3 * image_id
        images.append({"id": image_id, "height": height, "width": width})
        count = image_id % 4
        gt_masks = _random_masks(generator, count, height, width)
        labels = [CATEGORIES[int(i)]["id"] for i in torch.randint(0, 3, (count,), generator=generator)]
        annotations.append([
            {"image_id": image_id, "category_id": label, "segmentation": rle, "area": float(mask.sum()),
             "bbox": [0.0, 0.0, float(width), float(height)], "iscrowd": int(image_id == 1 and k == 0)}
            for k, (label, mask, rle) in enumerate(zip(labels, gt_masks, masks_to_rle(gt_masks)))])
        shifted = torch.roll(gt_masks, shifts=int(torch.randint(-3, 4, (1,), generator=generator)), dims=-1)
        noise = _random_masks(generator, 3, height, width)
        masks = torch.cat([shifted & (torch.rand(shifted.shape, generator=generator) > 0.2), noise])
        detection_labels = labels + [CATEGORIES[int(i)]["id"] for i in torch.randint(0, 3, (3,), generator=generator)]
        detections[image_id] = {"scores": torch.rand(len(masks), generator=generator),
                                "labels": torch.tensor(detection_labels, dtype=torch.int64),
                                "boxes": torch.zeros(len(masks), 4), "masks": masks}
    return images, annotations, detections


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_mask_ap_equals_pycocotools_segm_on_both_backends(backend) -> None:
    """Mask AP (every system's val/mask_AP) comes from the box AP's evaluator, ground truth given image
    by image, and equals pycocotools' COCOeval "segm" run by hand to 1e-12 on every statistic."""
    from detr.evaluation.coco_evaluator import detections_to_mask_results

    images, annotations, detections = _mask_case(seed=5)
    evaluator = CocoEvaluator(iou_type="segm", categories=CATEGORIES, backend=backend)
    for image, image_annotations in zip(images, annotations):  # batches of one; image 3 twice (sampler padding)
        evaluator.add_ground_truth([image], [image_annotations])
        evaluator.update([image["id"]], [detections[image["id"]]])
    evaluator.add_ground_truth([images[2]], [annotations[2]])
    evaluator.update([3], [detections[3]])
    evaluation = evaluator.compute()

    dataset = {"images": images, "categories": CATEGORIES,
               "annotations": [dict(a, id=i + 1) for i, a in enumerate(a for per in annotations for a in per)]}
    results = [r for image_id, detection in detections.items() for r in detections_to_mask_results(image_id, detection)]
    gt = coco_ground_truth(dataset)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iouType="segm")
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    assert evaluation.backend == backend and evaluation.image_ids == [1, 2, 3, 4, 5, 6]
    assert 0.05 < evaluation.stats["AP"] < 0.95  # a case with real hits and misses
    expected = dict(zip(STAT_NAMES, (float(coco_eval.stats[i]) for i in (0, 1, 2, 3, 4, 5, 8))))
    for name in STAT_NAMES:
        assert evaluation.stats[name] == pytest.approx(expected[name], abs=1e-12), name
    assert [row["category_id"] for row in evaluation.per_class] == [3, 7, 12]


def test_segm_needs_categories_and_takes_ground_truth_only_without_coco_gt() -> None:
    with pytest.raises(ValueError, match="categories"):
        CocoEvaluator(iou_type="segm")
    with pytest.raises(ValueError, match="iou_type"):
        CocoEvaluator(iou_type="keypoints", categories=CATEGORIES)
    evaluator = CocoEvaluator(coco_ground_truth(_hand_made_ground_truth()))
    with pytest.raises(ValueError, match="add_ground_truth"):
        evaluator.add_ground_truth([{"id": 1, "height": 2, "width": 2}], [[]])
    per_image = CocoEvaluator(iou_type="segm", categories=CATEGORIES)
    with pytest.raises(ValueError, match="image id 4 is not in the ground truth added so far"):
        per_image.update([4], [_detection([])])


def test_the_best_f1_threshold_from_the_accumulated_tables() -> None:
    """CocoEvaluation.best_threshold (a model's own default threshold): one class, two
    objects found at scores 0.9 and 0.6, false positives at 0.95 and 0.3 / 0.2 (the low ones after the last
    hit). Above 0.9 only a false positive: F1 0; 0.6 < t <= 0.9: one hit of two with the 0.95 false
    positive (F1 0.5); t <= 0.6: both hits (F1 0.8 with the interpolated precision 2/3): 0.6 is best and
    the highest of the equal ones below it."""
    images = [{"id": 1, "width": 100, "height": 100}, {"id": 2, "width": 100, "height": 100}]
    dataset = {"images": images, "categories": CATEGORIES[:1], "annotations": [
        {"id": 1, "image_id": 1, "category_id": 3, "bbox": [10.0, 10.0, 30.0, 30.0], "area": 900.0, "iscrowd": 0},
        {"id": 2, "image_id": 2, "category_id": 3, "bbox": [50.0, 50.0, 30.0, 30.0], "area": 900.0, "iscrowd": 0}]}
    evaluator = CocoEvaluator(coco_ground_truth(dataset), backend="pycocotools")
    evaluator.update([1, 2], [
        _detection([(3, [10.0, 10.0, 40.0, 40.0], 0.9), (3, [60.0, 0.0, 90.0, 30.0], 0.95),
                    (3, [0.0, 60.0, 30.0, 90.0], 0.3)]),
        _detection([(3, [50.0, 50.0, 80.0, 80.0], 0.6), (3, [0.0, 0.0, 20.0, 20.0], 0.2)])])
    evaluation = evaluator.compute()
    assert evaluation.best_threshold == pytest.approx(0.6)
    fast = CocoEvaluator(coco_ground_truth(dataset), backend="faster_coco_eval")
    fast.update([1, 2], [_detection([(3, [10.0, 10.0, 40.0, 40.0], 0.9), (3, [60.0, 0.0, 90.0, 30.0], 0.95),
                                     (3, [0.0, 60.0, 30.0, 90.0], 0.3)]),
                         _detection([(3, [50.0, 50.0, 80.0, 80.0], 0.6), (3, [0.0, 0.0, 20.0, 20.0], 0.2)])])
    assert fast.compute().best_threshold == evaluation.best_threshold  # the same tables on either backend


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_no_best_threshold_where_f1_is_zero_at_every_threshold(backend) -> None:
    """TH3: a validation whose detections all miss recorded 0.95 (the highest of equal F1s of 0) as the
    model's best threshold; there is none."""
    images = [{"id": 1, "width": 100, "height": 100}]
    dataset = {"images": images, "categories": CATEGORIES[:1], "annotations": [
        {"id": 1, "image_id": 1, "category_id": 3, "bbox": [10.0, 10.0, 30.0, 30.0], "area": 900.0, "iscrowd": 0}]}
    evaluator = CocoEvaluator(coco_ground_truth(dataset), backend=backend)
    evaluator.update([1], [_detection([(3, [60.0, 60.0, 90.0, 90.0], 0.9), (3, [0.0, 70.0, 20.0, 90.0], 0.4)])])
    assert evaluator.compute().best_threshold is None


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_mask_ap_on_coco_polygons_equals_pycocotools_segm(backend) -> None:
    """Mask AP of detections on coco-mini's own polygons (and crowd RLE) as the ground truth json gives them: each
    object's mask shifted and thinned, plus masks of other objects under wrong labels, scored as pycocotools'
    COCOeval("segm") scores the same results, to 1e-12."""
    from pycocotools import mask as mask_utils

    from detr.evaluation.coco_evaluator import detections_to_mask_results

    gt = coco_ground_truth(json.loads((REPO / "data/coco-mini/annotations/instances_train2017.json").read_text()))
    generator = torch.Generator().manual_seed(3)
    evaluator = CocoEvaluator(gt, iou_type="segm", backend=backend)
    results = []
    for image_id in sorted(gt.getImgIds())[:20]:
        annotations = [a for a in gt.imgToAnns[image_id] if not a["iscrowd"]]
        if not annotations:
            continue
        masks = torch.from_numpy(np.stack([gt.annToMask(a) for a in annotations])).bool()
        shift = [int(v) for v in torch.randint(-3, 4, (2,), generator=generator)]
        moved = torch.roll(masks, shifts=shift, dims=(1, 2)) & (torch.rand(masks.shape, generator=generator) > 0.1)
        labels = [a["category_id"] for a in annotations]
        wrong = [labels[(i + 1) % len(labels)] for i in range(len(labels))]
        detection = {"masks": torch.cat([moved, masks]), "labels": torch.tensor(labels + wrong),
                     "scores": torch.rand(2 * len(labels), generator=generator), "boxes": torch.zeros(2 * len(labels), 4)}
        evaluator.update([image_id], [detection])
        results += detections_to_mask_results(image_id, detection)
    evaluation = evaluator.compute()

    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iouType="segm")
        coco_eval.params.imgIds = evaluation.image_ids
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    assert any(isinstance(a["segmentation"], dict) for a in gt.dataset["annotations"])  # crowd RLE among polygons
    assert 0.1 < evaluation.stats["AP"] < 0.9
    assert mask_utils.area(evaluation.results[0]["segmentation"]) > 0
    expected = dict(zip(STAT_NAMES, (float(coco_eval.stats[i]) for i in (0, 1, 2, 3, 4, 5, 8))))
    for name in STAT_NAMES:
        assert evaluation.stats[name] == pytest.approx(expected[name], abs=1e-12), name


def test_the_detections_cocoeval_scores_are_all_that_changes_its_numbers() -> None:
    """scored_detections keeps, per image and label, the 100 best (ties in the order given): COCOeval's statistics
    on those alone equal those on every detection, here 150 of one label (with tied scores), 30 of another."""
    from detr.evaluation.coco_evaluator import scored_detections

    generator = torch.Generator().manual_seed(0)
    images = [{"id": 1, "width": 200, "height": 200}]
    boxes = torch.rand(40, 2, generator=generator) * 150
    truth = torch.cat([boxes, boxes + 10 + torch.rand(40, 2, generator=generator) * 40], dim=1)  # xyxy
    annotations = [{"id": i + 1, "image_id": 1, "category_id": 3 if i < 30 else 7, "iscrowd": 0,
                    "bbox": [*b[:2].tolist(), *(b[2:] - b[:2]).tolist()], "area": float((b[2:] - b[:2]).prod())}
                   for i, b in enumerate(truth)]
    gt = coco_ground_truth({"images": images, "annotations": annotations, "categories": CATEGORIES})
    labels = torch.tensor([3] * 150 + [7] * 30)
    scores = torch.rand(180, generator=generator).mul(20).round() / 20  # many ties
    detection = {"labels": labels, "scores": scores, "boxes": truth[torch.randint(0, 40, (180,), generator=generator)]
                 + torch.randn(180, 4, generator=generator) * 3}

    keep = scored_detections(labels, scores)
    assert len(keep) == 130 and keep.tolist() == sorted(keep.tolist())
    every, scored = (CocoEvaluator(gt, backend="pycocotools") for _ in range(2))
    every.update([1], [detection])
    scored.update([1], [{key: value[keep] for key, value in detection.items()}])
    assert every.compute().stats == scored.compute().stats
