"""detr.data.shape_clips: a clip is the same every time, its objects keep their ids, cross each other and pass
behind the occluder (their visibility drops), and the ground truth reads as MOTChallenge's gt.txt."""

from __future__ import annotations

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
