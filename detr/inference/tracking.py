"""Multi-object tracking: a video's frames through the :class:`~detr.inference.predictor.Predictor`, each frame's
detections given track ids by a tracker of Roboflow's ``trackers`` package (the ``tracking`` extra:
``pip install detr-lightning[tracking]``), imported only when tracking starts.

Frames are batched :attr:`Predictor.batch_size` at a time through the one prediction path
(:meth:`Predictor.predict_arrays`), then handed to the tracker one by one in order, with their time (so that a
skipped frame counts as time passing). The tracker's thresholds come from the predictor's score threshold ``t``
(the one the checkpoint's validation found best, else the authors' 0.7): a detection above ``t`` can start a track;
ByteTrack, OC-SORT and BoT-SORT also match detections down to ``t`` × :data:`LOW_SCORE_RATIO` to the tracks they
already have (ByteTrack's second association: 0.1 below its 0.6), so the model is asked for those too. Which
tracker, measured on synthetic clips: docs/measurements/tracking.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol

import numpy as np
import torch

from detr.data.video import Frame
from detr.inference.prediction import Prediction


class FramePredictor(Protocol):
    """What tracking asks of the :class:`~detr.inference.predictor.Predictor` (which imports this module)."""

    batch_size: int
    threshold: float

    def predict_arrays(self, arrays: Sequence[np.ndarray], *, threshold: float | None) -> list[Prediction]: ...

#: The trackers :func:`build_tracker` makes (``trackers``' ByteTrackTracker, SORTTracker, OCSORTTracker,
#: BoTSORTTracker).
TrackerName = Literal["bytetrack", "sort", "ocsort", "botsort"]
TRACKERS: tuple[str, ...] = ("bytetrack", "sort", "ocsort", "botsort")
#: The tracker every command uses unless told otherwise: BoT-SORT, the best MOTA with both trained models and both
#: replayed detectors of docs/measurements/tracking.md, and the best IDF1 with the trained models (ByteTrack's
#: second association, which ranked it first on replayed detections, brings a trained model's low-score false
#: boxes into its tracks).
DEFAULT_TRACKER = "botsort"
#: The low score threshold of the trackers with a second association, as a share of the high one (ByteTrack's
#: paper: 0.1 and 0.6).
LOW_SCORE_RATIO = 1 / 6


class TrackerError(ValueError):
    """A tracker that cannot be made: an unknown name, or Roboflow's ``trackers`` package missing."""


def build_tracker(name: str, *, threshold: float, frame_rate: float) -> Any:
    """A new tracker of ``trackers``: ``name`` one of :data:`TRACKERS`; ``threshold``: the score a detection needs to
    start a track (and, for ByteTrack, OC-SORT and BoT-SORT, to be a high-score detection); ``frame_rate``: the
    video's frames per second (its lost-track buffer, 30 frames, is counted at this rate).

    Raises:
        TrackerError: an unknown ``name``, or the ``trackers`` package is missing (naming the extra).
    """
    if name not in TRACKERS:
        raise TrackerError(f"unknown tracker {name!r}; choose one of {', '.join(TRACKERS)}")
    try:
        import trackers
    except ImportError:
        raise TrackerError("tracking needs Roboflow's trackers package: pip install 'detr-lightning[tracking]' "
                         "(or pip install trackers)") from None
    if name == "sort":
        return trackers.SORTTracker(frame_rate=frame_rate, track_activation_threshold=threshold)
    if name == "ocsort":
        return trackers.OCSORTTracker(frame_rate=frame_rate, high_conf_det_threshold=threshold)
    if name == "botsort":
        return trackers.BoTSORTTracker(frame_rate=frame_rate, track_activation_threshold=threshold,
                                       high_conf_det_threshold=threshold)
    return trackers.ByteTrackTracker(frame_rate=frame_rate, track_activation_threshold=threshold,
                                     high_conf_det_threshold=threshold)


def detection_threshold(name: str, threshold: float) -> float:
    """The score the model's detections must exceed to reach tracker ``name``: ``threshold`` for SORT (one
    association), ``threshold`` × :data:`LOW_SCORE_RATIO` for the trackers with a second, low-score association."""
    return threshold if name == "sort" else threshold * LOW_SCORE_RATIO


def track_frames(
    predictor: FramePredictor, frames: Iterable[Frame], *, tracker: str = DEFAULT_TRACKER,
    threshold: float | None = None, frame_rate: float = 30.0,
) -> Iterator[tuple[Frame, Prediction]]:
    """Detect and track: every frame with its :class:`Prediction`, whose :attr:`Prediction.track_ids` hold each
    detection's track (1, 2, ...; -1: a detection not in a track yet, e.g. a new object's first frames) and whose
    ``image_id`` is the frame's number, 1-based (MOTChallenge's).

    A prediction keeps the detections in a track and those above ``threshold`` (default the predictor's); a
    frame whose outputs are not finite has :attr:`Prediction.error` set and no detections (its time passes for
    the tracker). ``frame_rate``: the source's, for the tracker's motion model.
    """
    high = predictor.threshold if threshold is None else float(threshold)
    state = build_tracker(tracker, threshold=high, frame_rate=frame_rate)
    low = detection_threshold(tracker, high)
    batch: list[Frame] = []
    for frame in frames:
        batch.append(frame)
        if len(batch) == predictor.batch_size:
            yield from _track_batch(predictor, batch, state, low=low, high=high, needs_frame=tracker == "botsort")
            batch = []
    if batch:
        yield from _track_batch(predictor, batch, state, low=low, high=high, needs_frame=tracker == "botsort")


def _track_batch(predictor: FramePredictor, batch: list[Frame], state: Any, *, low: float, high: float,
                 needs_frame: bool) -> Iterator[tuple[Frame, Prediction]]:
    predictions = predictor.predict_arrays([frame.array for frame in batch], threshold=low)
    for frame, prediction in zip(batch, predictions):
        prediction.image_id = frame.index + 1
        yield frame, assign_tracks(state, prediction, frame, high=high, needs_frame=needs_frame)


def assign_tracks(state: Any, prediction: Prediction, frame: Frame, *, high: float,
                  needs_frame: bool = False) -> Prediction:
    """Update the tracker ``state`` with one frame's ``prediction``; the prediction with its track ids, keeping the
    detections in a track or above ``high``."""
    import supervision as sv  # trackers' own input type; a dependency of trackers

    detections = sv.Detections(
        xyxy=prediction.boxes.numpy().astype(np.float32).reshape(-1, 4),
        confidence=prediction.scores.numpy().astype(np.float32),
        class_id=prediction.labels.numpy().astype(int),
        data={"index": np.arange(len(prediction))},
    )
    tracked = state.update(detections, frame.array if needs_frame else None, timestamp=frame.time)
    track_ids = torch.full((len(prediction),), -1, dtype=torch.int64)
    if len(tracked):
        track_ids[torch.as_tensor(tracked.data["index"], dtype=torch.int64)] = torch.as_tensor(
            tracked.tracker_id, dtype=torch.int64)
        track_ids[track_ids >= 0] += 1  # trackers count from 0, MOTChallenge files from 1
    keep = (track_ids >= 0) | (prediction.scores > high)
    return replace(
        prediction,
        boxes=prediction.boxes[keep], scores=prediction.scores[keep], labels=prediction.labels[keep],
        label_names=[name for name, k in zip(prediction.label_names, keep.tolist()) if k],
        query_indices=prediction.query_indices[keep],
        masks=None if prediction.masks is None else prediction.masks[keep],
        track_ids=track_ids[keep],
    )
