"""detr.inference.tracking and Predictor.track: a video's frames through the Predictor, batched, each detection
given a track by Roboflow's trackers, with thresholds from the predictor's own; the ids follow the objects."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from detr.data.shape_clips import ClipConfig, write_clip
from detr.inference.prediction import Prediction
from detr.inference.predictor import Predictor
from detr.inference.tracking import TRACKERS, TrackerError, build_tracker, detection_threshold
from tests.helpers_tracking import REPLAY_THRESHOLD, ReplayDetector

pytest.importorskip("av")
pytest.importorskip("trackers")
pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = ClipConfig(num_frames=40, num_objects=3, crossing_pairs=1, seed=2)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    return path, write_clip(path, CONFIG)


def replaying(truth, **options) -> Predictor:
    return Predictor(ReplayDetector(truth, height=CONFIG.height, width=CONFIG.width, drop=0.0, false_positive=0.0),
                     device="cpu", **options)


@pytest.mark.parametrize("tracker", TRACKERS)
def test_every_tracker_gives_each_object_one_id_through_the_clip(clip, tracker):
    path, truth = clip
    predictions = list(replaying(truth, batch_size=3).track(path, tracker=tracker))
    assert [p.image_id for p in predictions] == list(range(1, CONFIG.num_frames + 1))
    assert all(p.track_ids is not None and len(p.track_ids) == len(p) for p in predictions)
    # each true object (matched by its box centre's nearest tracked box) keeps one id over its visible frames
    ids_of_object: dict[int, Counter] = {}
    for prediction, objects in zip(predictions, truth):
        tracked = prediction.track_ids >= 0
        if not tracked.any():
            continue
        centres = (prediction.boxes[tracked, :2] + prediction.boxes[tracked, 2:]) / 2
        for o in objects:
            if o.visibility < 0.9:
                continue
            x0, y0, x1, y1 = o.box_xyxy
            distance = (centres - torch.tensor([(x0 + x1) / 2, (y0 + y1) / 2])).norm(dim=1)
            if distance.min() < 4:
                track_id = int(prediction.track_ids[tracked][distance.argmin()])
                ids_of_object.setdefault(o.track_id, Counter())[track_id] += 1
    assert len(ids_of_object) == CONFIG.num_objects
    for counts in ids_of_object.values():
        assert counts.most_common(1)[0][1] >= 0.9 * sum(counts.values())  # one id for nearly all its frames
    assert len({counts.most_common(1)[0][0] for counts in ids_of_object.values()}) == CONFIG.num_objects


def test_batched_tracking_is_per_frame_tracking(clip):
    path, truth = clip
    one = list(replaying(truth, batch_size=1).track(path))
    four = list(replaying(truth, batch_size=4).track(path))
    assert all(torch.equal(a.track_ids, b.track_ids) and torch.allclose(a.boxes, b.boxes) for a, b in zip(one, four))


def test_thresholds_default_from_the_predictors():
    tracker = build_tracker("bytetrack", threshold=0.4, frame_rate=25)
    assert tracker.track_activation_threshold == tracker.high_conf_det_threshold == 0.4
    assert build_tracker("sort", threshold=0.4, frame_rate=25).track_activation_threshold == 0.4
    assert detection_threshold("sort", 0.6) == 0.6 and detection_threshold("bytetrack", 0.6) == pytest.approx(0.1)


def test_a_track_starts_above_the_predictors_threshold_only(clip):
    path, truth = clip
    predictions = list(replaying(truth).track(path, tracker="sort"))
    scores = torch.cat([p.scores for p in predictions])
    assert replaying(truth).threshold == REPLAY_THRESHOLD and (scores > REPLAY_THRESHOLD).all()


def test_an_unknown_tracker_is_refused_naming_the_choices():
    with pytest.raises(TrackerError, match="bytetrack, sort, ocsort, botsort"):
        build_tracker("deepsort", threshold=0.5, frame_rate=25)


def test_above_keeps_the_track_ids_of_what_it_keeps():
    prediction = Prediction(boxes=torch.zeros(3, 4), scores=torch.tensor([0.9, 0.2, 0.6]),
                            labels=torch.zeros(3, dtype=torch.int64), label_names=["a"] * 3,
                            query_indices=torch.arange(3), image_size=(8, 8), track_ids=torch.tensor([4, -1, 7]))
    assert prediction.above(0.5).track_ids.tolist() == [4, 7]
