"""detr.inference.slicing: tiles that cover the image, boxes and masks mapped back, duplicates merged, and the
Predictor's ``slice=`` on a tiny model whose every query predicts one known box."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from pycocotools.cocoeval import COCOeval

from detr import build_detr_panoptic
from detr.inference.prediction import Prediction
from detr.inference.predictor import Predictor
from detr.inference.slicing import SliceSettings, merge_detections, predict_sliced, tile_starts, tile_windows
from tests.helpers import coco_ground_truth, fixed_box_model, tiny_config_with


def prediction(boxes, scores, labels, size, masks=None, keypoints=None) -> Prediction:
    labels = torch.tensor(labels, dtype=torch.int64)
    return Prediction(boxes=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                      scores=torch.tensor(scores, dtype=torch.float32), labels=labels,
                      label_names=[f"class {int(label)}" for label in labels],
                      query_indices=torch.arange(len(labels)), image_size=size, masks=masks,
                      keypoints=None if keypoints is None else torch.tensor(keypoints, dtype=torch.float32))


@pytest.mark.parametrize(("height", "width", "size", "overlap"),
                         [(1000, 700, 256, 0.2), (513, 512, 256, 0.0), (300, 1200, 320, 0.5), (257, 256, 256, 0.9)])
def test_tiles_cover_the_image_overlap_as_asked_and_end_at_the_border(height, width, size, overlap):
    windows = tile_windows(height, width, size, overlap)
    covered = np.zeros((height, width), dtype=bool)
    for x0, y0, x1, y1 in windows:
        assert (x1 - x0, y1 - y0) == (min(size, width), min(size, height))
        assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
        covered[y0:y1, x0:x1] = True
    assert covered.all()
    for length in (height, width):
        tile = min(size, length)
        starts = tile_starts(length, tile, overlap)
        assert starts[0] == 0 and starts[-1] + tile == length
        assert all(0 < b - a <= tile * (1 - overlap) for a, b in zip(starts, starts[1:]))  # overlap >= asked


def test_an_image_smaller_than_a_tile_is_one_tile_and_no_whole_image_pass():
    assert tile_windows(100, 80, 256, 0.2) == [(0, 0, 80, 100)]
    assert SliceSettings(256).count(100, 80) == 1
    assert SliceSettings(64).count(100, 80) == len(tile_windows(100, 80, 64, 0.2)) + 1


@pytest.mark.parametrize("bad", [dict(size=0), dict(size=64, overlap=1.0), dict(size=64, overlap=float("nan")),
                                 dict(size=64, merge="wbf"), dict(size=64, iou_threshold=1.5)])
def test_settings_refuse_what_cannot_slice(bad):
    with pytest.raises(ValueError, match="slice"):
        SliceSettings(**bad)


def test_boxes_are_mapped_back_by_their_tile_origin():
    """A stub model that sees one object at a fixed place in every input: each tile's box comes back at its
    window's offset, and the merge keeps them (distinct objects)."""
    array = np.zeros((200, 300, 3), dtype=np.uint8)
    settings = SliceSettings(100, overlap=0.0, whole_image=False)

    def predict_batch(tiles):
        return [prediction([[10, 20, 30, 40]], [0.9], [1], tile.shape[:2]) for tile in tiles]

    (merged,) = predict_sliced([array], settings, predict_batch, batch_size=4)
    expected = sorted([x0 + 10, y0 + 20, x0 + 30, y0 + 40] for x0, y0, _, _ in tile_windows(200, 300, 100, 0.0))
    assert sorted(merged.boxes.tolist()) == expected
    assert merged.image_size == (200, 300)


def test_inputs_are_batched_by_shape_at_most_batch_size():
    array = np.zeros((300, 500, 3), dtype=np.uint8)
    calls = []

    def predict_batch(tiles):
        calls.append([tile.shape for tile in tiles])
        return [prediction([], [], [], tile.shape[:2]) for tile in tiles]

    predict_sliced([array, array], SliceSettings(200), predict_batch, batch_size=3)
    assert all(len(set(call)) == 1 and len(call) <= 3 for call in calls)  # one shape per batch: no padding
    assert sum(map(len, calls)) == 2 * SliceSettings(200).count(300, 500)


def test_merge_removes_the_duplicate_of_an_object_seen_by_two_tiles():
    # one object at x 90..110 of a 200-px-wide image, seen by the tiles [0, 120) and [80, 200); another class
    # at the same place is another object
    left = prediction([[90, 10, 110, 30], [90, 10, 110, 30]], [0.9, 0.6], [1, 2], (50, 120))
    right = prediction([[10, 10, 30.5, 30]], [0.8], [1], (50, 120))
    merged = merge_detections([((0, 0, 120, 50), left), ((80, 0, 200, 50), right)], image_size=(50, 200),
                              settings=SliceSettings(120))
    assert merged.labels.tolist() == [1, 2] and merged.scores.tolist() == pytest.approx([0.9, 0.6])
    assert merged.boxes[0].tolist() == [90, 10, 110, 30]


def test_nmm_joins_a_cut_part_into_the_whole_box():
    whole = prediction([[40, 10, 100, 30]], [0.9], [0], (50, 120))
    cut = prediction([[0, 10, 20, 30]], [0.7], [0], (50, 120))  # x 80..100 in the image: inside the whole box
    parts = [((0, 0, 120, 50), whole), ((80, 0, 200, 50), cut)]
    assert len(merge_detections(parts, image_size=(50, 200), settings=SliceSettings(120))) == 2  # IoU 1/3
    merged = merge_detections(parts, image_size=(50, 200), settings=SliceSettings(120, merge="nmm"))
    assert merged.boxes.tolist() == [[40, 10, 100, 30]] and merged.scores.tolist() == pytest.approx([0.9])


def test_drop_cut_removes_the_part_cut_by_an_inner_edge_and_keeps_the_border():
    # a 200 x 50 image, tiles [0, 120) and [80, 200) (overlap 40 px): an object at x 100..116 is cut by the left
    # tile's right edge (x 100..120 clipped) and whole in the right tile; one at the image's left border is kept
    left = prediction([[100, 10, 120, 30], [0, 10, 10, 30]], [0.95, 0.9], [1, 1], (50, 120))
    right = prediction([[20, 10, 36, 30]], [0.8], [1], (50, 120))
    parts = [((0, 0, 120, 50), left), ((80, 0, 200, 50), right)]
    plain = merge_detections(parts, image_size=(50, 200), settings=SliceSettings(120, overlap=1 / 3))
    assert sorted(plain.boxes.tolist()) == [[0, 10, 10, 30], [100, 10, 120, 30]]  # NMS kept the cut box (best score)
    dropped = merge_detections(parts, image_size=(50, 200), settings=SliceSettings(120, overlap=1 / 3, drop_cut=True))
    assert sorted(dropped.boxes.tolist()) == [[0, 10, 10, 30], [100, 10, 116, 30]]


def test_masks_are_pasted_into_the_whole_image():
    mask = torch.zeros(1, 50, 60, dtype=torch.bool)
    mask[0, 5:15, 10:20] = True
    tile = prediction([[10, 5, 20, 15]], [0.9], [0], (50, 60), masks=mask)
    merged = merge_detections([((100, 30, 160, 80), tile)], image_size=(100, 200), settings=SliceSettings(60))
    assert merged.masks.shape == (1, 100, 200)
    expected = torch.zeros(100, 200, dtype=torch.bool)
    expected[35:45, 110:120] = True
    assert torch.equal(merged.masks[0], expected)
    assert merged.boxes.tolist() == [[110, 35, 120, 45]]


def corners(box, score=0.9):
    """Two keypoints of a box: its top-left and bottom-right corners, pixel x, y and a score."""
    x0, y0, x1, y1 = box
    return [[x0, y0, score], [x1, y1, score]]


@pytest.mark.parametrize("merge", ["nms", "nmm"])
def test_keypoints_are_shifted_with_their_boxes_and_kept_with_the_kept_box(merge):
    # a 200 x 50 image, tiles [0, 120) and [80, 200) and the whole image: one object at x 90..110 seen whole by
    # both tiles (the left tile's copy scores best), its cut part x 80..100 in the whole image's pass scored lower;
    # another object only in the right tile. Every detection's points are its box's corners, so the kept points
    # must be the kept box's (with NMM the group's best box's, not the enclosing box's).
    left = prediction([[90, 10, 110, 30]], [0.9], [1], (50, 120), keypoints=[corners([90, 10, 110, 30], 0.9)])
    right = prediction([[10, 10, 30, 30], [60, 5, 70, 15]], [0.8, 0.7], [1, 1], (50, 120),
                       keypoints=[corners([10, 10, 30, 30], 0.8), corners([60, 5, 70, 15], 0.7)])
    whole = prediction([[80, 10, 100, 30]], [0.6], [1], (50, 200), keypoints=[corners([80, 10, 100, 30], 0.6)])
    parts = [((0, 0, 120, 50), left), ((80, 0, 200, 50), right), ((0, 0, 200, 50), whole)]
    merged = merge_detections(parts, image_size=(50, 200), settings=SliceSettings(120, merge=merge,
                                                                                  iou_threshold=0.3))
    assert merged.scores.tolist() == pytest.approx([0.9, 0.7])
    torch.testing.assert_close(merged.keypoints, torch.tensor([corners([90, 10, 110, 30], 0.9),
                                                               corners([140, 5, 150, 15], 0.7)]))
    if merge == "nms":
        assert torch.equal(merged.keypoints[:, :, :2].flatten(1), merged.boxes)
    else:  # the enclosing box of the object's three copies, with the best copy's points
        assert merged.boxes[0].tolist() == [80, 10, 110, 30]
    assert merge_detections([((0, 0, 120, 50), prediction([[1, 1, 5, 5]], [0.9], [0], (50, 120)))],
                            image_size=(50, 200), settings=SliceSettings(120)).keypoints is None


def test_keypoints_follow_drop_cut_and_an_empty_merge():
    left = prediction([[100, 10, 120, 30], [0, 10, 10, 30]], [0.95, 0.9], [1, 1], (50, 120),
                      keypoints=[corners([100, 10, 120, 30]), corners([0, 10, 10, 30])])
    right = prediction([[20, 10, 36, 30]], [0.8], [1], (50, 120), keypoints=[corners([20, 10, 36, 30])])
    parts = [((0, 0, 120, 50), left), ((80, 0, 200, 50), right)]
    dropped = merge_detections(parts, image_size=(50, 200), settings=SliceSettings(120, overlap=1 / 3, drop_cut=True))
    assert sorted(dropped.keypoints[:, :, :2].flatten(1).tolist()) == [[0, 10, 10, 30], [100, 10, 116, 30]]
    nothing = replace(prediction([], [], [], (50, 120)), keypoints=torch.zeros(0, 2, 3))
    empty = merge_detections([((0, 0, 120, 50), nothing), ((80, 0, 200, 50), nothing)], image_size=(50, 200),
                             settings=SliceSettings(120))
    assert len(empty) == 0 and empty.keypoints.shape == (0, 2, 3)


def test_predict_sliced_carries_the_tiles_keypoints_into_the_image():
    # a stand-in model that finds one object at the centre of every input, its points at the box's corners
    def predict_batch(tiles):
        out = []
        for tile in tiles:
            height, width = tile.shape[:2]
            box = [width / 2 - 4, height / 2 - 4, width / 2 + 4, height / 2 + 4]
            out.append(prediction([box], [0.9 if (height, width) == (60, 60) else 0.5], [0], (height, width),
                                  keypoints=[corners(box)]))
        return out

    image = np.zeros((60, 200, 3), dtype=np.uint8)
    merged = predict_sliced([image], SliceSettings(60, overlap=0.0), predict_batch, batch_size=4)[0]
    assert len(merged) == 5  # four tiles' objects, the whole image's one (at x 96..104, between tiles 60 and 120)
    torch.testing.assert_close(merged.keypoints[:, :, :2].flatten(1), merged.boxes)
    assert sorted(merged.boxes[:, 0].tolist()) == [26, 86, 96, 146, 166]


def test_a_tile_whose_outputs_are_not_finite_fails_its_image():
    bad = Prediction(boxes=torch.zeros(0, 4), scores=torch.zeros(0), labels=torch.zeros(0, dtype=torch.int64),
                     label_names=[], query_indices=torch.zeros(0, dtype=torch.int64), image_size=(50, 60),
                     error="not finite")
    good = prediction([[1, 1, 5, 5]], [0.9], [0], (50, 60))
    merged = merge_detections([((0, 0, 60, 50), good), ((40, 0, 100, 50), bad)], image_size=(50, 100),
                              settings=SliceSettings(60))
    assert merged.error == "not finite" and len(merged) == 0


@pytest.fixture
def centre_box_predictor(tiny_config):
    """Every query of every input predicts one box: the centre fifth of the input (class 2)."""
    model = fixed_box_model(tiny_config, (0.5, 0.5, 0.2, 0.2), label=2)
    return Predictor(model, device="cpu", batch_size=3, min_size=64, max_size=100, optimize=False)


def test_predictor_slices_maps_back_and_adds_the_whole_image(centre_box_predictor):
    """A box at each tile's centre, one fifth of the tile, and one at the image's centre, one fifth of the image
    (the whole-image pass: what is too large for a tile); the queries' identical boxes merge into one per input."""
    height, width = 240, 400
    array = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    settings = SliceSettings(160, overlap=0.25)
    (sliced,) = centre_box_predictor.predict(array, slice=settings, threshold=0.5)
    windows = tile_windows(height, width, 160, 0.25)
    expected = [[(x0 + x1) / 2 - 16, (y0 + y1) / 2 - 16, (x0 + x1) / 2 + 16, (y0 + y1) / 2 + 16]
                for x0, y0, x1, y1 in windows]
    expected.append([width * 0.4, height * 0.4, width * 0.6, height * 0.6])
    assert len(sliced) == len(expected) and set(sliced.labels.tolist()) == {2}
    assert torch.allclose(torch.tensor(sorted(sliced.boxes.tolist())), torch.tensor(sorted(expected)), atol=0.05)
    # an int is the tile size with the defaults; no slice is the whole image alone
    assert len(centre_box_predictor.predict(array, slice=160, threshold=0.5)[0]) == len(tile_windows(240, 400, 160,
                                                                                                     0.2)) + 1
    (whole,) = centre_box_predictor.predict(array, threshold=0.5)
    assert torch.allclose(whole.boxes, torch.tensor([expected[-1]]), atol=0.05)


def test_predictor_refuses_attention_and_panoptic_with_slicing(centre_box_predictor):
    array = np.zeros((64, 64, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="attention maps are not supported with slicing"):
        centre_box_predictor.predict(array, slice=32, return_attention=True)
    with pytest.raises(ValueError, match="slice size"):
        centre_box_predictor.predict(array, slice=0)


def test_predictor_refuses_panoptic_with_slicing(tiny_config):
    torch.manual_seed(0)
    model = build_detr_panoptic(tiny_config.replace(hidden_dim=128, num_heads=8)).eval()
    predictor = Predictor(model, device="cpu", min_size=64, max_size=96, is_thing=[True] * 3 + [False] * 2)
    with pytest.raises(ValueError, match="task 'panoptic' is not supported with slicing"):
        predictor.predict(np.zeros((64, 64, 3), dtype=np.uint8), slice=32, task="panoptic")


class QuarterBoxes(torch.nn.Module):
    """A box head whose query ``q`` predicts the centre half of the input's quarter ``q`` (normalised ``cxcywh``),
    whatever the decoder says: four queries, four fixed places in any input."""

    def __init__(self) -> None:
        super().__init__()
        centres = [(0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)]
        self.logits = torch.nn.Parameter(torch.logit(torch.tensor([[x, y, 0.25, 0.25] for x, y in centres])))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [L, B, Q, D] -> [L, B, Q, 4] logits
        return self.logits.expand(*hidden.shape[:-1], 4)


def ap50(dataset: dict, prediction: Prediction) -> float:
    """COCO AP50 (pycocotools, in points) of one image's ``prediction``, labels as category ids."""
    ground_truth = coco_ground_truth(dataset)
    results = [{"image_id": 1, "category_id": int(label), "score": float(score), "bbox": [x0, y0, x1 - x0, y1 - y0]}
               for (x0, y0, x1, y1), score, label in zip(prediction.boxes.tolist(), prediction.scores.tolist(),
                                                          prediction.labels.tolist())]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(ground_truth, ground_truth.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return 100 * evaluation.stats[1]


def test_slicing_finds_more_than_twice_the_ap50_of_the_whole_image_when_the_queries_run_out():
    """Slicing finds at least twice the whole image's AP50, shown on a deterministic stand-in: a model with four
    queries, each answering one quarter of any input (:class:`QuarterBoxes`), at a 128-px input, on a 256-px canvas of twenty objects: sixteen small
    32-px squares, one at the centre of each quarter of each 128-px tile, and four large 64-px ones, one at the
    centre of each quarter of the canvas. The whole image at the model's size has four queries for twenty
    objects and finds the four large ones (AP50 about 20); the four tiles find the sixteen small ones at their
    own scale and the whole-image pass the large ones (AP50 100). What a trained model sees is a benchmark
    figure (docs/measurements/slicing.md); this is the geometry: queries and scale multiplied by the tiles."""
    model = fixed_box_model(tiny_config_with(num_queries=4), (0.5, 0.5, 0.2, 0.2), label=1)
    model.bbox_embed = QuarterBoxes()
    predictor = Predictor(model, device="cpu", batch_size=5, min_size=128, max_size=128, optimize=False)
    canvas = np.zeros((256, 256, 3), dtype=np.uint8)
    small = [(x - 16, y - 16, 32, 32) for y in range(32, 256, 64) for x in range(32, 256, 64)]
    large = [(x - 32, y - 32, 64, 64) for y in (64, 192) for x in (64, 192)]
    for x, y, w, h in small + large:
        canvas[y : y + h, x : x + w] = 255 if w == 32 else 128
    dataset = {"images": [{"id": 1, "width": 256, "height": 256, "file_name": "canvas.png"}],
               "categories": [{"id": 1, "name": "square"}],
               "annotations": [{"id": i + 1, "image_id": 1, "category_id": 1, "bbox": list(box),
                                "area": box[2] * box[3], "iscrowd": 0} for i, box in enumerate(small + large)]}

    (whole,) = predictor.predict(canvas, all_queries=True)
    (sliced,) = predictor.predict(canvas, all_queries=True, slice=SliceSettings(128, overlap=0.0))
    (tiles_only,) = predictor.predict(canvas, all_queries=True, slice=SliceSettings(128, overlap=0.0,
                                                                                     whole_image=False))
    assert (len(whole), len(tiles_only), len(sliced)) == (4, 16, 20)
    assert ap50(dataset, whole) == pytest.approx(20, abs=1.5)
    assert ap50(dataset, tiles_only) == pytest.approx(80, abs=1.5)
    assert ap50(dataset, sliced) == pytest.approx(100)
    assert ap50(dataset, sliced) >= 2 * ap50(dataset, whole)
