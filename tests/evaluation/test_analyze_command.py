"""The detr-analyze command (detr.commands.analyze) end to end on data/coco-mini (real COCO images and annotations) with made-up results,
and on a real-time model's predictions (the top (query, class) pairs detr-predict writes, one query under two
classes); the report opened in headless Chromium (skipped without Chromium unless CI is set)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.commands import analyze as analyze_tool
from detr.evaluation.analysis import analyze, evaluate_results, load_ground_truth, load_results
from detr.inference.outputs import predict_files
from detr.inference.predictor import Predictor
from detr.visualize.analysis_report import write_analysis_report
from tests.browser import DevToolsPipe, Page, artifacts_dir
from tests.helpers_realtime import tiny_model

REPO = Path(__file__).resolve().parents[2]
COCO_MINI = REPO / "data" / "coco-mini"
GT_JSON = COCO_MINI / "annotations" / "instances_val2017.json"


def made_up_results(ground_truth: dict, seed: int = 0) -> list[dict]:
    """A detector's results on ``ground_truth``: most objects found with jittered boxes, some with the wrong
    class, some badly placed, some twice, some missed, and a few boxes on nothing; with file names and
    numbered image ids (1, 2, ...), as detr-predict writes for file names that are not numbers."""
    rng = np.random.default_rng(seed)
    categories = [c["id"] for c in ground_truth["categories"]]
    images = {image["id"]: image for image in ground_truth["images"]}
    numbered = {image_id: n + 1 for n, image_id in enumerate(sorted(images))}
    results = []

    def add(image_id: int, category_id: int, box: list[float], score: float) -> None:
        results.append({"image_id": numbered[image_id], "file_name": images[image_id]["file_name"],
                        "category_id": int(category_id), "bbox": [float(v) for v in box], "score": score})

    for annotation in ground_truth["annotations"]:
        if annotation["iscrowd"] or rng.random() < 0.1:
            continue
        x, y, w, h = annotation["bbox"]
        spread = 0.4 if rng.random() < 0.15 else 0.06
        jitter = rng.normal(0, spread, 4) * [w, h, w, h]
        category = annotation["category_id"] if rng.random() > 0.1 else int(rng.choice(categories))
        add(annotation["image_id"], category, [x + jitter[0], y + jitter[1], max(1.0, w + jitter[2]),
                                               max(1.0, h + jitter[3])], float(rng.uniform(0.3, 1.0)))
        if rng.random() < 0.1:
            add(annotation["image_id"], annotation["category_id"], [x + 1, y, w, h], float(rng.uniform(0.2, 0.9)))
    for image in images.values():
        for _ in range(3):
            add(image["id"], int(rng.choice(categories)), [float(rng.uniform(0, image["width"] - 60)),
                float(rng.uniform(0, image["height"] - 60)), 50.0, 50.0], float(rng.uniform(0.0, 0.6)))
    return results


@pytest.fixture(scope="module")
def results_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("results") / "predictions.json"
    path.write_text(json.dumps(made_up_results(json.loads(GT_JSON.read_text()))))
    return path


def test_analyze_tool_on_coco_mini(results_file: Path, tmp_path: Path, capsys) -> None:
    # only five of the images are there: the other cases are skipped and listed
    images = tmp_path / "images"
    images.mkdir()
    for path in sorted((COCO_MINI / "val2017").glob("*.jpg"))[:5]:
        shutil.copy(path, images / path.name)
    arguments = [str(GT_JSON), str(results_file), "--images", str(images), "--out", str(tmp_path / "out")]
    assert analyze_tool.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "classification" in printed and "report:" in printed
    out = tmp_path / "out"
    page = (out / "report.html").read_text()
    assert "not found under" in page
    numbers = json.loads((out / "analysis.json").read_text())
    assert numbers["num_images"] == 50 and numbers["num_objects"] == 377  # 382 boxes, 5 of them crowd
    for error_type in ("cls", "loc", "dupe", "bkg", "missed"):
        assert numbers["errors"]["counts"][error_type] > 0 and numbers["errors"]["dAP"][error_type] > 0
    assert list(out.glob("worst_*.png"))  # drawn from the images that are there

    # the same numbers whether the results name their images by file_name or by the ground truth's id
    coco_gt = load_ground_truth(GT_JSON)
    by_id = {image["file_name"]: image_id for image_id, image in coco_gt.imgs.items()}
    entries = json.loads(results_file.read_text())
    for entry in entries:
        entry["image_id"] = by_id[entry.pop("file_name")]
    again = analyze(coco_gt, load_results(entries, coco_gt))
    assert again.stats["AP50"] == pytest.approx(numbers["stats"]["AP50"])
    assert again.errors.counts == numbers["errors"]["counts"]


@pytest.mark.usefixtures("one_thread")
def test_analyze_tool_on_a_real_time_models_predictions(tmp_path: Path, capsys) -> None:
    """A tiny RT-DETR (COCO's 80 classes) predicts coco-mini's 50 images as detr-predict does (every (query, class)
    pair of its top 12, COCO ids); a hook puts its first queries on up to 3 objects of each image, each scored as the
    object's class and, lower, as a class the image does not have: one query, two detections. The analysis counts
    those as true positives and classification errors, every other detection as background, as COCOeval scores them."""
    ground_truth = json.loads(GT_JSON.read_text())
    categories = CategoryMap.from_coco_categories(ground_truth["categories"], contiguous=True)
    checkpoint = save_checkpoint(tiny_model("rtdetr", category_map=categories), tmp_path / "rtdetr.ckpt")
    images = sorted((COCO_MINI / "val2017").glob("*.jpg"))
    by_file = {image["file_name"]: image for image in ground_truth["images"]}
    objects = {image["id"]: [] for image in ground_truth["images"]}
    for annotation in ground_truth["annotations"]:
        if not annotation["iscrowd"]:
            objects[annotation["image_id"]].append(annotation)
    planted = [objects[by_file[path.name]["id"]][:3] for path in images]  # the objects found, image by image

    def plant(module, args, output):  # one image per forward (batch size 1), in the order of `images`
        image = by_file[images[len(calls)].name]
        calls.append(image["id"])
        present = {categories.category_id_to_label(a["category_id"]) for a in objects[image["id"]]}
        absent = min(set(range(categories.num_classes)) - present)
        for query, annotation in enumerate(planted[len(calls) - 1]):
            x, y, w, h = annotation["bbox"]
            output.boxes[0, query] = torch.tensor([(x + w / 2) / image["width"], (y + h / 2) / image["height"],
                                                   w / image["width"], h / image["height"]])
            output.logits[0, query] = -10.0
            output.logits[0, query, categories.category_id_to_label(annotation["category_id"])] = 8.0
            output.logits[0, query, absent] = 4.0
        return output

    calls: list[int] = []
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu")
    predictor.model.register_forward_hook(plant)
    run = predict_files(predictor, images, tmp_path / "predictions", all_queries=True, draw=False)
    results = json.loads(run.predictions_json.read_text())
    per_image = Counter(row["image_id"] for row in results)
    assert len(per_image) == 50 and set(per_image.values()) == {12}  # the top num_queries pairs, COCO's image ids
    found = sum(len(p) for p in planted)
    boxes = Counter((row["image_id"], tuple(row["bbox"])) for row in results)
    assert sum(n == 2 for n in boxes.values()) == found  # each planted query twice, under two classes

    out = tmp_path / "analysis"
    assert analyze_tool.main([str(GT_JSON), str(run.predictions_json), "--out", str(out)]) == 0
    assert "report:" in capsys.readouterr().out and (out / "report.html").is_file()
    numbers = json.loads((out / "analysis.json").read_text())
    assert (numbers["num_images"], numbers["num_detections"], numbers["num_objects"]) == (50, 600, 377)
    counts = numbers["errors"]["counts"]
    assert counts["cls"] == found and counts["missed"] == 377 - found
    assert counts["bkg"] == 600 - 2 * found and counts["loc"] == counts["both"] == counts["dupe"] == 0
    coco_gt = load_ground_truth(GT_JSON)
    stats = evaluate_results(coco_gt, load_results(run.predictions_json, coco_gt)).stats
    assert numbers["stats"]["AP50"] == pytest.approx(stats[1]) and 0 < stats[1] < 1
    # every false positive (at most 0.98) scores below every true positive (0.9997): removing them gains nothing
    delta = numbers["errors"]["dAP"]
    assert delta["cls"] == delta["bkg"] == delta["false_positives"] == 0 and delta["missed"] > 0


def test_analyze_tool_refuses_results_of_other_images(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"image_id": 123456789, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.5}]))
    with pytest.raises(SystemExit):
        analyze_tool.main([str(GT_JSON), str(bad), "--out", str(tmp_path / "out")])


def test_analyze_tool_refuses_non_finite_scores(tmp_path: Path, capsys) -> None:
    """json reads NaN and Infinity; an Infinity score would rank first and a NaN one anywhere: the AP would
    be made up, so the file is refused, naming the entries."""
    image_id = json.loads(GT_JSON.read_text())["images"][0]["id"]
    entries = [{"image_id": image_id, "category_id": 1, "bbox": [0, 0, 5, 5], "score": score}
               for score in (float("nan"), 0.5, float("inf"), float("-inf"))]
    bad = tmp_path / "scores.json"
    bad.write_text(json.dumps(entries))
    with pytest.raises(SystemExit):
        analyze_tool.main([str(GT_JSON), str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "scores.json" in err and "3 entries" in err and "[0, 2, 3]" in err and "score" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [[], [{"image_id": 0, "category_id": 999, "bbox": [0, 0, 5, 5], "score": 0.5}]])
def test_analyze_tool_says_there_is_nothing_to_analyse(tmp_path: Path, capsys, content) -> None:
    for entry in content:
        entry["image_id"] = json.loads(GT_JSON.read_text())["images"][0]["id"]
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(content))
    assert analyze_tool.main([str(GT_JSON), str(empty), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "empty.json" in captured.err and "nothing to analyse" in captured.err
    assert "AP" not in captured.out and not (tmp_path / "out").exists()


def test_report_in_chromium(chromium: str, results_file: Path, tmp_path: Path) -> None:
    coco_gt = load_ground_truth(GT_JSON)
    analysis = analyze(coco_gt, load_results(results_file, coco_gt))
    page_path = write_analysis_report(analysis, tmp_path / "report", images_dir=COCO_MINI / "val2017", gallery_size=4)
    artifacts = artifacts_dir()
    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(page_path.as_uri())
        images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0, "
                               "i.src.startsWith('data:image/png;base64,')])")
        alts = [alt for alt, _, _ in images]
        assert all(loaded and embedded for _, loaded, embedded in images), images
        for alt in ("dAP per error type", "precision-recall over all classes", "precision-recall per class",
                    "confusion matrix heat map", "worst classification cases", "worst missed ground truth cases"):
            assert alt in alts
        # nothing is fetched from anywhere but the page itself (offline)
        assert page.evaluate("performance.getEntriesByType('resource').filter(r => !r.name.startsWith('data:'))"
                             ".length") == 0
        assert page.evaluate("document.querySelectorAll('#errors table tr').length") == 1 + 8
        assert page.evaluate("document.querySelectorAll('#classes table tr').length") == 1 + 80
        assert "person" in page.evaluate("document.querySelector('#confusion table').textContent")
        (artifacts / "analysis_report_chromium.png").write_bytes(page.screenshot())
        assert page.errors() == []
    finally:
        browser.close()


def _refusal(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        analyze_tool.main(list(argv))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_analyze_tool_names_unreadable_and_unlabelled_inputs(tmp_path: Path, capsys) -> None:
    """A truncated results json and a ground truth without annotations were tracebacks (a JSONDecodeError; an
    IndexError deep in the matching)."""
    ground_truth = json.loads(GT_JSON.read_text())
    image_id = ground_truth["images"][0]["id"]
    results = tmp_path / "predictions.json"
    results.write_text(json.dumps([{"image_id": image_id, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.5}]))
    out = str(tmp_path / "out")

    truncated = tmp_path / "cut.json"
    truncated.write_text(results.read_text()[:40])
    err = _refusal(capsys, str(GT_JSON), str(truncated), "--out", out)
    assert "cut.json is not valid json" in err and "truncated" in err

    unlabelled = tmp_path / "test_images.json"
    unlabelled.write_text(json.dumps({key: ground_truth[key] for key in ("images", "categories")}))
    err = _refusal(capsys, str(unlabelled), str(results), "--out", out)
    assert "test_images.json has no annotations" in err and "ground-truth boxes" in err

    (tmp_path / "gt_cut.json").write_text(GT_JSON.read_text()[:100])
    assert "gt_cut.json is not valid json" in _refusal(capsys, str(tmp_path / "gt_cut.json"), str(results), "--out", out)
    assert "absent.json does not exist" in _refusal(capsys, str(tmp_path / "absent.json"), str(results), "--out", out)
    assert not (tmp_path / "out").exists()


def test_analyze_tool_refuses_boxes_of_negative_width(tmp_path: Path, capsys) -> None:
    """Boxes of negative width were scored silently (AP 0): refused in one line with the count and an example."""
    image_id = json.loads(GT_JSON.read_text())["images"][0]["id"]
    entries = [{"image_id": image_id, "category_id": 1, "bbox": bbox, "score": 0.5}
               for bbox in ([10, 10, 5, 5], [30, 10, -20, 5], [40, 40, 5, -1])]
    bad = tmp_path / "negative.json"
    bad.write_text(json.dumps(entries))
    err = _refusal(capsys, str(GT_JSON), str(bad), "--out", str(tmp_path / "out"))
    assert "negative.json: 2 entries have a bbox of negative width or height (entry 1: bbox [30, 10, -20, 5]" in err
    [line] = [line for line in err.splitlines() if "error:" in line]  # one line, after argparse's usage
    assert "and 1 more" in line and "[x, y, width, height]" in line
    assert not (tmp_path / "out").exists()


def test_results_cut_at_a_score_threshold_are_named(caplog) -> None:
    """A thresholded predictions.json scored AP 41.7 where every query scored 53.0, without a word."""
    ground_truth = json.loads(GT_JSON.read_text())
    coco_gt = load_ground_truth(GT_JSON)
    every = made_up_results(ground_truth)
    with caplog.at_level("WARNING", logger="detr.evaluation.analysis"):
        load_results(every, coco_gt)
    assert "cut at a score threshold" not in caplog.text
    with caplog.at_level("WARNING", logger="detr.evaluation.analysis"):
        load_results([entry for entry in every if entry["score"] >= 0.7], coco_gt)
    assert "look cut at a score threshold: the lowest score is 0.7" in caplog.text
    assert "detr-predict --all-queries" in caplog.text
    caplog.clear()
    # every query of every image (the same count each) is not cut, however high its lowest score
    image_ids = coco_gt.getImgIds()
    fixed = [{"image_id": i, "category_id": 1, "bbox": [1, 1, 5, 5], "score": 0.5} for i in image_ids for _ in range(3)]
    with caplog.at_level("WARNING", logger="detr.evaluation.analysis"):
        load_results(fixed, coco_gt)
    assert "cut at a score threshold" not in caplog.text
