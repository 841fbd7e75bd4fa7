"""PQ: hand-computed cases (void, crowd, the IoU > 0.5 rule, things/stuff split), accumulation over images, the
files route, and agreement with torchmetrics where its definition is COCO's (no void, no crowd)."""

from __future__ import annotations

import json

import pytest
import torch

from detr.evaluation.panoptic import PanopticQuality, evaluate_panoptic_files, format_panoptic_table
from detr.inference.postprocess_masks import panoptic_png

CATEGORIES = [{"id": 1, "isthing": 1}, {"id": 2, "isthing": 0}, {"id": 3, "isthing": 1}, {"id": 4, "isthing": 1}]


def rows(spec: dict[int, range], shape=(10, 10)) -> torch.Tensor:
    """Id map whose rows ``spec[id]`` carry that id (0 elsewhere)."""
    ids = torch.zeros(shape, dtype=torch.int64)
    for segment_id, row_range in spec.items():
        ids[list(row_range)] = segment_id
    return ids


def test_simple_case_by_hand():
    gt = rows({1: range(0, 5), 2: range(5, 10)})
    pred = rows({7: range(0, 6), 9: range(6, 10)})
    metric = PanopticQuality(CATEGORIES)
    metric.update(gt, [{"id": 1, "category_id": 1}, {"id": 2, "category_id": 2}],
                  pred, [{"id": 7, "category_id": 1}, {"id": 9, "category_id": 2}])
    results = metric.compute()
    thing_iou, stuff_iou = 50 / 60, 40 / 50  # person: 50 ∩ of 60 ∪; sky: 40 ∩ of 50 ∪
    assert results["Things"] == pytest.approx({"pq": thing_iou, "sq": thing_iou, "rq": 1.0, "n": 1})
    assert results["Stuff"] == pytest.approx({"pq": stuff_iou, "sq": stuff_iou, "rq": 1.0, "n": 1})
    assert results["All"]["pq"] == pytest.approx((thing_iou + stuff_iou) / 2) and results["All"]["n"] == 2
    assert results["per_class"][3] == {"pq": 0.0, "sq": 0.0, "rq": 0.0}


def test_void_crowd_and_false_positive_by_hand():
    """Row 0 void; person rows 1–3; a person crowd rows 4–6; sky rows 7–9.
    p1 person rows 0–3: union leaves out its void row → IoU 30 / 30 = 1.
    p2 person on the crowd: unmatched but ignored (all on crowd of its class).
    p3 sky rows 7–8: IoU 20 / 30. p4 car row 9: a false positive of car (no void under it)."""
    gt = rows({1: range(1, 4), 2: range(4, 7), 3: range(7, 10)})
    gt_segments = [{"id": 1, "category_id": 1, "iscrowd": 0}, {"id": 2, "category_id": 1, "iscrowd": 1},
                   {"id": 3, "category_id": 2, "iscrowd": 0}]
    pred = rows({1: range(0, 4), 2: range(4, 7), 3: range(7, 9), 4: range(9, 10)})
    pred_segments = [{"id": 1, "category_id": 1}, {"id": 2, "category_id": 1}, {"id": 3, "category_id": 2},
                     {"id": 4, "category_id": 3}]
    metric = PanopticQuality(CATEGORIES)
    metric.update(gt, gt_segments, pred, pred_segments)
    stats = metric.stats
    assert (stats[1].tp, stats[1].fp, stats[1].fn, stats[1].iou) == (1, 0, 0, 1.0)
    assert (stats[2].tp, stats[2].fp, stats[2].fn) == (1, 0, 0) and stats[2].iou == pytest.approx(2 / 3)
    assert (stats[3].tp, stats[3].fp, stats[3].fn) == (0, 1, 0)
    results = metric.compute()
    assert results["Things"] == pytest.approx({"pq": 0.5, "sq": 0.5, "rq": 0.5, "n": 2})  # person 1, car 0
    assert results["Stuff"] == pytest.approx({"pq": 2 / 3, "sq": 2 / 3, "rq": 1.0, "n": 1})
    assert results["All"]["pq"] == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_iou_of_one_half_is_no_match_and_void_predictions_are_ignored():
    gt = rows({1: range(0, 4)})  # 40 px; rows 4–9 void
    pred = rows({5: range(2, 6), 6: range(6, 10)})  # 5: 20 ∩ 40 → IoU 20 / (40 + 40 − 20 − 20 void) = 0.5
    metric = PanopticQuality(CATEGORIES)
    metric.update(gt, [{"id": 1, "category_id": 1}], pred, [{"id": 5, "category_id": 1}, {"id": 6, "category_id": 3}])
    # 5 is no match, and exactly half of it on void is still a false positive (the rule is "more than half")
    assert (metric.stats[1].tp, metric.stats[1].fn, metric.stats[1].fp) == (0, 1, 1)
    assert metric.stats[3].fp == 0  # 6 lies entirely on void: ignored
    assert metric.compute()["All"] == pytest.approx({"pq": 0.0, "sq": 0.0, "rq": 0.0, "n": 1})


def test_statistics_accumulate_over_images_before_averaging():
    metric = PanopticQuality(CATEGORIES)
    gt = rows({1: range(0, 10)})
    metric.update(gt, [{"id": 1, "category_id": 1}], gt, [{"id": 1, "category_id": 1}])  # perfect
    metric.update(gt, [{"id": 1, "category_id": 1}], rows({1: range(0, 10)}), [{"id": 1, "category_id": 3}])
    assert metric.num_images == 2
    person = metric.compute()["per_class"][1]
    assert person == pytest.approx({"pq": 1 / 1.5, "sq": 1.0, "rq": 1 / 1.5})  # tp 1, fn 1


def test_inconsistent_predictions_are_refused():
    metric = PanopticQuality(CATEGORIES)
    gt, segments = rows({1: range(0, 10)}), [{"id": 1, "category_id": 1}]
    with pytest.raises(ValueError, match="not in the segments list"):
        metric.update(gt, segments, rows({2: range(0, 10)}), segments)
    with pytest.raises(ValueError, match="not in the id map"):
        metric.update(gt, segments, gt, segments + [{"id": 3, "category_id": 1}])
    with pytest.raises(ValueError, match="unknown category_id"):
        metric.update(gt, segments, gt, [{"id": 1, "category_id": 99}])


def test_files_route_reads_pngs_and_jsons(tmp_path):
    gt = rows({1: range(1, 4), 2: range(4, 7), 3: range(7, 10)})
    pred = rows({1: range(0, 4), 2: range(4, 7), 3: range(7, 9), 4: range(9, 10)})
    gt_segments = [{"id": 1, "category_id": 1, "iscrowd": 0, "area": 30}, {"id": 2, "category_id": 1, "iscrowd": 1,
                    "area": 30}, {"id": 3, "category_id": 2, "iscrowd": 0, "area": 30}]
    pred_segments = [{"id": 1, "category_id": 1}, {"id": 2, "category_id": 1}, {"id": 3, "category_id": 2},
                     {"id": 4, "category_id": 3}]
    for name, ids, segments in (("gt", gt, gt_segments), ("pred", pred, pred_segments)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "000001.png").write_bytes(panoptic_png(ids * 1000))  # ids > 255 exercise G and B
        for segment in segments:
            segment["id"] *= 1000
        annotation = {"image_id": 1, "file_name": "000001.png", "segments_info": segments}
        (tmp_path / f"{name}.json").write_text(json.dumps({"annotations": [annotation], "categories": CATEGORIES}))
    results = evaluate_panoptic_files(tmp_path / "gt.json", tmp_path / "pred.json")
    assert results["All"]["pq"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    table = format_panoptic_table(results)
    assert "Things" in table and " 55.6" in table


def random_panoptic(generator: torch.Generator) -> tuple[torch.Tensor, list[dict]]:
    """A 24 × 24 id map of 4 × 4 blocks: ids 1–6 things (category 1, 3 or 4), id 7 stuff (category 2)."""
    ids = torch.randint(1, 8, (6, 6), generator=generator).repeat_interleave(4, 0).repeat_interleave(4, 1)
    categories = [(1, 3, 4)[int(torch.randint(0, 3, (1,), generator=generator))] for _ in range(6)] + [2]
    return ids, [{"id": i + 1, "category_id": c} for i, c in enumerate(categories)]


def test_agrees_with_torchmetrics_without_void_or_crowd():
    """torchmetrics' PanopticQuality shares COCO's definition when nothing is void and nothing is crowd."""
    torchmetrics = pytest.importorskip("torchmetrics.detection")
    generator = torch.Generator().manual_seed(0)
    ours = PanopticQuality(CATEGORIES)
    theirs = torchmetrics.PanopticQuality(things={1, 3, 4}, stuffs={2}, return_sq_and_rq=True)
    for _ in range(4):
        (gt, gt_segments), (pred, pred_segments) = random_panoptic(generator), random_panoptic(generator)
        gt[:8] = pred[:8]  # a shared region, so that some segments match
        gt_segments = [pred_segments[i] if i + 1 in pred[:8] else s for i, s in enumerate(gt_segments)]
        gt_segments = [s for s in gt_segments if s["id"] in gt]
        pred_segments = [s for s in pred_segments if s["id"] in pred]
        ours.update(gt, gt_segments, pred, pred_segments)
        theirs.update(_category_instance(pred, pred_segments)[None], _category_instance(gt, gt_segments)[None])
    pq, sq, rq = theirs.compute().tolist()
    results = ours.compute()["All"]
    assert results["n"] > 1 and 0 < results["pq"] < 1
    assert (results["pq"], results["sq"], results["rq"]) == pytest.approx((pq, sq, rq), abs=1e-6)


def _category_instance(ids: torch.Tensor, segments: list[dict]) -> torch.Tensor:
    """torchmetrics' input: [H, W, 2] (category, instance id)."""
    category = torch.zeros_like(ids)
    for segment in segments:
        category[ids == segment["id"]] = segment["category_id"]
    return torch.stack([category, ids], dim=-1)


def test_merged_statistics_of_split_images_equal_one_metric_over_all():
    """What the panoptic system computes on rank 0: every process's statistics summed give the PQ of one
    metric that saw every image."""
    generator = torch.Generator().manual_seed(1)
    whole, parts = PanopticQuality(CATEGORIES), [PanopticQuality(CATEGORIES) for _ in range(3)]
    for index in range(6):
        (gt, gt_segments), (pred, pred_segments) = random_panoptic(generator), random_panoptic(generator)
        gt[:12] = pred[:12]
        gt_segments = [pred_segments[i] if i + 1 in pred[:12] else s for i, s in enumerate(gt_segments)]
        gt_segments = [s for s in gt_segments if s["id"] in gt]
        pred_segments = [s for s in pred_segments if s["id"] in pred]
        for metric in (whole, parts[index % 3]):
            metric.update(gt, gt_segments, pred, pred_segments)
    merged = PanopticQuality.merged(parts)
    assert merged.num_images == 6 and [part.num_images for part in parts] == [2, 2, 2]
    merged_results, whole_results = merged.compute(), whole.compute()
    assert 0 < whole_results["All"]["pq"] < 1
    for name in ("All", "Things", "Stuff"):
        assert merged_results[name] == pytest.approx(whole_results[name], abs=1e-12)


def test_a_segment_id_listed_twice_is_named_as_the_jsons_fault(tmp_path):
    """A duplicated segment id was blamed on the PNG (or counted once, silently)."""
    metric = PanopticQuality(CATEGORIES)
    gt, segments = rows({1: range(0, 10)}), [{"id": 1, "category_id": 1}]
    for twice_gt, twice_pred in ((segments * 2, segments), (segments, segments * 2)):
        with pytest.raises(ValueError, match=r"segments_info lists segment id\(s\) \[1\] twice: the json is at fault"):
            metric.update(gt, twice_gt, gt, twice_pred)
    for name, listed in (("gt", segments * 2), ("pred", segments)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "000001.png").write_bytes(panoptic_png(gt))
        annotation = {"image_id": 1, "file_name": "000001.png", "segments_info": listed}
        (tmp_path / f"{name}.json").write_text(json.dumps({"annotations": [annotation], "categories": CATEGORIES}))
    with pytest.raises(ValueError, match=f"image 1 of '{tmp_path / 'gt.json'}' and .*: the ground-truth segments_info"):
        evaluate_panoptic_files(tmp_path / "gt.json", tmp_path / "pred.json")


def test_png_file_names_follow_the_data_sets_rule(tmp_path):
    """A PNG name outside its folder is refused; backslashes are separators."""
    gt, segments = rows({1: range(0, 10)}), [{"id": 1, "category_id": 1}]
    (tmp_path / "gt" / "sub").mkdir(parents=True)
    (tmp_path / "gt" / "sub" / "000001.png").write_bytes(panoptic_png(gt))
    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "000001.png").write_bytes(panoptic_png(gt))
    for name, file_name in (("gt", "sub\\000001.png"), ("pred", "000001.png")):
        annotation = {"image_id": 1, "file_name": file_name, "segments_info": segments}
        (tmp_path / f"{name}.json").write_text(json.dumps({"annotations": [annotation], "categories": CATEGORIES}))
    assert evaluate_panoptic_files(tmp_path / "gt.json", tmp_path / "pred.json")["All"]["pq"] == pytest.approx(1.0)
    annotation["file_name"] = "../pred/000001.png"
    (tmp_path / "pred.json").write_text(json.dumps({"annotations": [annotation], "categories": CATEGORIES}))
    with pytest.raises(ValueError, match=r"pred.json': panoptic PNG file_name '\.\./pred/000001.png' \(image id 1\)"):
        evaluate_panoptic_files(tmp_path / "gt.json", tmp_path / "pred.json")
