"""detr.data.shape_clips: a clip is the same every time, its objects keep their ids, cross each other and pass
behind the occluder (their visibility drops), and the ground truth reads as MOTChallenge's gt.txt."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from detr.data.shape_clips import ClipConfig, mot_ground_truth_lines, render_clip

CONFIG = ClipConfig(num_frames=60, num_objects=4, crossing_pairs=2, seed=1)


def test_a_clip_is_the_same_every_time_and_ids_are_stable():
    frames, truth = render_clip(CONFIG)
    again, truth_again = render_clip(CONFIG)
    assert all(np.array_equal(a, b) for a, b in zip(frames, again)) and truth == truth_again
    assert len(frames) == 60 and frames[0].shape == (128, 192, 3)
    assert all([o.track_id for o in objects] == [1, 2, 3, 4] for objects in truth)
    classes = {o.track_id: o.category_id for objects in truth for o in objects}
    assert all(classes[o.track_id] == o.category_id for objects in truth for o in objects)


def test_objects_are_hidden_by_each_other_and_by_the_occluder():
    _, truth = render_clip(CONFIG)
    visibility = np.array([[o.visibility for o in objects] for objects in truth])  # [frames, objects]
    assert (visibility < 0.5).any(axis=0).sum() >= 3  # most objects are half hidden at some point
    assert (visibility > 0.99).all(axis=1).any()  # and all of them in plain view in some frame
    # the head-on pairs start on one row, at the two sides, and pass each other
    first, last = truth[0], truth[-1]
    assert first[0].box_xyxy[0] < first[1].box_xyxy[0] and last[0].box_xyxy[0] > last[1].box_xyxy[0]


def test_ground_truth_lines_are_motchallenge():
    _, truth = render_clip(ClipConfig(num_frames=2, num_objects=2))
    lines = mot_ground_truth_lines(truth)
    assert len(lines) == 4
    frame, track_id, x, y, w, h, confidence, category, visibility = (float(v) for v in lines[0].split(","))
    x0, y0, x1, y1 = truth[0][0].box_xyxy
    assert (frame, track_id, confidence) == (1, 1, 1) and (x, y, w, h) == pytest.approx((x0, y0, x1 - x0, y1 - y0))
    assert 1 <= category <= 5 and 0 <= visibility <= 1


def test_clip_frames_make_a_coco_set_the_checker_passes(tmp_path, capsys):
    """detr-make-shapes --clips: frames of clips that are not the tests' or the benchmark's, as a detection set
    (one frame in three, objects at least a quarter visible), written once (idempotent) and passed by the checker."""
    from detr.commands.check_data import main as check_data
    from detr.commands.make_shapes import main as make_shapes
    from detr.data.shape_clips import ClipFramesConfig, write_clip_frames_dataset

    out = tmp_path / "clips"
    assert make_shapes(["--clips", "--out", str(out), "--num-train", "2", "--num-val", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    data = json.loads((out / "annotations" / "instances_train2017.json").read_text())
    config = ClipFramesConfig(num_train_clips=2, num_val_clips=1)
    assert len(data["images"]) == 2 * 30 and data["images"][0]["width"] == 192 and data["images"][0]["height"] == 128
    _, truth = render_clip(replace(config.clip, seed=1000))  # the first training clip
    expected = [list(o.box_xyxy) for o in truth[3] if o.visibility >= 0.25]  # its second image: frame 3
    boxes = [[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
             for a in data["annotations"] if a["image_id"] == 2]
    assert boxes == expected and boxes
    assert write_clip_frames_dataset(out, config) is False  # complete: kept as it is
    assert make_shapes(["--clips", "--out", str(out), "--num-train", "2", "--num-val", "1"]) == 0
    assert "nothing written" in capsys.readouterr().out
    assert check_data([str(out)]) == 0
    with pytest.raises(SystemExit):
        make_shapes(["--clips", "--keypoints", "--out", str(out)])
    assert "boxes only" in capsys.readouterr().err
