"""Tracking over HTTP: a whole video uploaded and tracked (``POST /track``, :func:`track_upload`), and frame streams
whose frames are posted one by one and keep their tracker (``/track/sessions``, :class:`TrackSessions`).

Both run the one tracking path (:mod:`detr.inference.tracking`: the Predictor, then a tracker of Roboflow's
``trackers``) on the server's model thread, one batch of frames at a time between the ``/predict`` batches, so a
long video never holds the model for more than one forward pass. Every video is bounded (:class:`TrackLimits`):
its bytes, its frames and the seconds its tracking may take, each a ``detr-serve`` option; a video past a limit is
refused with a 4xx JSON naming the limit and its option. An upload is written to a temporary file (FFmpeg needs to
seek in an mp4) and decoded with PyAV (:func:`detr.data.video.open_frames`), frame by frame.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detr.data.video import DEFAULT_FRAME_RATE, Frame, VideoSourceError, open_frames
from detr.inference.prediction import Prediction
from detr.inference.track_outputs import TrackRun, add_to_tracks, mot_lines, run_record
from detr.inference.tracking import (
    DEFAULT_TRACKER,
    TRACKERS,
    TrackerError,
    assign_tracks,
    build_tracker,
    detection_threshold,
    track_frames,
)
from detr.serving.inputs import RequestError, parse_choice
from detr.serving.service import DetectionService

#: The largest video upload: 100 MiB, minutes of a 720p H.264 video.
DEFAULT_MAX_VIDEO_BYTES = 100 * 2**20
#: The most frames one video (an upload, or a session's stream) may have: a minute at 30 frames/s.
DEFAULT_MAX_VIDEO_FRAMES = 1800
#: The most seconds tracking one upload may take (decoding and predicting), from its last byte to its answer.
DEFAULT_MAX_TRACK_SECONDS = 300.0
#: The most frame-stream sessions open at once.
DEFAULT_MAX_TRACK_SESSIONS = 16
#: Seconds a session may wait for its next frame before it is closed.
DEFAULT_SESSION_IDLE_SECONDS = 60.0
#: What ``POST /track`` answers: ``tracks`` (tracks.json's record) or ``mot`` (tracks.txt's MOTChallenge lines).
TRACK_FORMATS = ("tracks", "mot")

#: Runs a function on the model thread (:meth:`detr.serving.batching.DynamicBatcher.run_exclusive`).
ModelThread = Callable[[Callable[[], Any]], Awaitable[Any]]


@dataclass(frozen=True)
class TrackLimits:
    """The bounds of one tracked video; each is a ``detr-serve`` option, named in the refusal.

    Attributes:
        max_bytes: the largest upload, bytes (``--max-video-mb``; 413 ``body_too_large``).
        max_frames: the most frames of a video or a session (``--max-video-frames``; 413 ``too_many_frames``).
        max_seconds: the most seconds an upload's tracking may take (``--max-track-seconds``; 408
            ``track_timeout``).
        max_sessions: the most frame-stream sessions open at once (``--max-track-sessions``; 503
            ``too_many_sessions``).
        session_idle: seconds a session may wait for its next frame before it is closed (``--session-idle``).
    """

    max_bytes: int = DEFAULT_MAX_VIDEO_BYTES
    max_frames: int = DEFAULT_MAX_VIDEO_FRAMES
    max_seconds: float = DEFAULT_MAX_TRACK_SECONDS
    max_sessions: int = DEFAULT_MAX_TRACK_SESSIONS
    session_idle: float = DEFAULT_SESSION_IDLE_SECONDS

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_frames < 1 or self.max_sessions < 1:
            raise ValueError(f"max_bytes, max_frames and max_sessions must be >= 1, got {self.max_bytes}, "
                             f"{self.max_frames}, {self.max_sessions}")
        if not (self.max_seconds > 0 and self.session_idle > 0):  # NaN fails this too
            raise ValueError(f"max_seconds and session_idle are seconds > 0, got {self.max_seconds}, "
                             f"{self.session_idle}")

    def too_many_frames(self, count: int | str) -> RequestError:
        return RequestError(413, "too_many_frames", f"the video has {count} frames, more than this server's limit "
                            f"of {self.max_frames} (--max-video-frames); send a shorter clip or fewer frames a "
                            "second")


def parse_tracker(value: str | None) -> str:
    """The ``tracker`` query parameter: one of :data:`detr.inference.tracking.TRACKERS`; ``DEFAULT_TRACKER`` when
    absent (422 ``unknown_tracker``)."""
    return parse_choice("tracker", value, TRACKERS, DEFAULT_TRACKER)


def parse_track_format(value: str | None) -> str:
    """The ``format`` query parameter of ``POST /track``: one of :data:`TRACK_FORMATS`; "tracks" when absent (422
    ``unknown_format``)."""
    return parse_choice("format", value, TRACK_FORMATS, "tracks")


def parse_frame_rate(value: str | None) -> float:
    """The ``frame_rate`` query parameter of a session: the stream's frames per second (> 0, at most 1000), which
    the tracker's motion model and lost-track buffer count in; 30 when absent.

    Raises:
        RequestError: 422 ``bad_frame_rate``.
    """
    if value is None:
        return DEFAULT_FRAME_RATE
    try:
        rate = float(value)
    except ValueError:
        rate = math.nan
    if not 0 < rate <= 1000:  # NaN fails this too
        raise RequestError(422, "bad_frame_rate", f"frame_rate is the stream's frames per second, a number in "
                           f"(0, 1000]; got {value!r}")
    return rate


def _unavailable(error: Exception) -> RequestError:
    """The server lacks the video or tracking extra: the client cannot fix that, the operator can."""
    return RequestError(501, "tracking_unavailable", f"this server cannot track: {error}")


@dataclass
class TrackedVideo:
    """An upload's tracks: ``run`` (frames, skipped, failed, tracks), its ``frame_rate`` and MOTChallenge ``lines``."""

    run: TrackRun
    frame_rate: float
    lines: list[str] = field(default_factory=list)


async def track_upload(data: bytes, service: DetectionService, on_model_thread: ModelThread, *, tracker: str,
                       threshold: float, limits: TrackLimits, max_pixels: int) -> TrackedVideo:
    """Track the objects of an uploaded video (any container and codec FFmpeg reads).

    Args:
        data: the video file's bytes.
        on_model_thread: runs a function on the model thread; each call decodes and predicts at most one batch.
        tracker, threshold: :func:`detr.inference.tracking.track_frames`'.
        max_pixels: the most pixels a frame may have (``--max-pixels``).

    Raises:
        RequestError: 400 ``not_a_video``; 413 ``too_many_frames`` (read from the container's header when it says,
            else counted while decoding) or ``image_too_large``; 422 ``image_too_thin``; 408 ``track_timeout``;
            501 ``tracking_unavailable`` (PyAV or ``trackers`` not installed).
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="detr-track-") as folder:
        path = Path(folder) / "upload"
        await asyncio.to_thread(path.write_bytes, data)
        del data
        try:
            frames = await asyncio.to_thread(open_frames, path)
        except VideoSourceError as error:
            if "PyAV" in str(error):
                raise _unavailable(error) from error
            raise RequestError(400, "not_a_video", "the upload is not a video FFmpeg can read: send an mp4, mkv, "
                               "avi, webm or mov file") from error
        with frames:
            if frames.frame_count is not None and frames.frame_count > limits.max_frames:
                raise limits.too_many_frames(frames.frame_count)
            if frames.size is not None:
                _check_frame(service, frames.size, max_pixels)
            tracked = TrackedVideo(TrackRun(), frame_rate=frames.frame_rate)
            category_ids = _category_ids(service)
            steps = track_frames(service.predictor, _bounded(frames, limits, service, max_pixels), tracker=tracker,
                                 threshold=threshold, frame_rate=frames.frame_rate)
            try:
                while True:
                    if time.monotonic() - start > limits.max_seconds:
                        raise RequestError(408, "track_timeout", f"tracking took more than this server's limit of "
                                           f"{limits.max_seconds:g} s (--max-track-seconds) after "
                                           f"{tracked.run.frames} frames; send a shorter clip")
                    step = await on_model_thread(lambda: next(steps, None))
                    if step is None:
                        break
                    _, prediction = step
                    tracked.run.frames += 1
                    tracked.run.failed += prediction.error is not None
                    tracked.lines.extend(mot_lines(prediction, category_ids))
                    add_to_tracks(tracked.run.tracks, prediction, category_ids)
            except TrackerError as error:
                raise _unavailable(error) from error
            finally:
                await on_model_thread(steps.close)  # the generator belongs to the model thread
            tracked.run.skipped = frames.skipped
            tracked.run.seconds = time.monotonic() - start
    return tracked


def _bounded(frames: Iterator[Frame], limits: TrackLimits, service: DetectionService,
             max_pixels: int) -> Iterator[Frame]:
    """The frames, refused past ``limits.max_frames`` (a container that did not say, or said less) or when a frame
    is too large or too thin (a stream whose size changes)."""
    checked = None
    for count, frame in enumerate(frames, start=1):
        if count > limits.max_frames:
            raise limits.too_many_frames(f"more than {limits.max_frames}")
        if frame.array.shape[:2] != checked:
            checked = frame.array.shape[:2]
            _check_frame(service, checked, max_pixels)
        yield frame


def _check_frame(service: DetectionService, size: tuple[int, int], max_pixels: int) -> None:
    height, width = size
    if height * width > max_pixels:
        raise RequestError(413, "image_too_large", f"the video's frames have {width}×{height} = {width * height} "
                           f"pixels, more than the server's limit of {max_pixels} (--max-pixels); scale it down first")
    try:
        service.check_image(np.empty((height, width, 1), dtype=np.uint8))  # only its shape is read
    except ValueError as error:
        raise RequestError(422, "image_too_thin", str(error)) from error


def _category_ids(service: DetectionService) -> list[int] | None:
    category_map = service.predictor.category_map
    return list(category_map.category_ids) if category_map is not None else None


def tracks_json(tracked: TrackedVideo, service: DetectionService, *, source: str, tracker: str,
                threshold: float) -> dict[str, Any]:
    """``POST /track``'s answer: tracks.json's record (:func:`detr.inference.track_outputs.run_record`) and the
    model's name."""
    record = run_record(tracked.run, source=source, tracker=tracker, frame_rate=tracked.frame_rate,
                        threshold=threshold, predictor=service.predictor)
    return {"model": service.model_name, **record}


@dataclass
class TrackSession:
    """One frame stream: its tracker's state, the frames seen, the tracks so far, and when it was last used."""

    id: str
    tracker: str
    threshold: float
    frame_rate: float
    state: Any
    frames: int = 0
    tracks: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one frame at a time, in order

    def describe(self, limits: TrackLimits) -> dict[str, Any]:
        return {"session": self.id, "tracker": self.tracker, "threshold": self.threshold,
                "frame_rate": self.frame_rate, "frames": self.frames, "max_frames": limits.max_frames,
                "idle_timeout": limits.session_idle}


class TrackSessions:
    """The open frame-stream sessions: at most ``limits.max_sessions``; one idle for ``limits.session_idle``
    seconds is closed (checked whenever a session is opened or used, and by :meth:`expire`)."""

    def __init__(self, service: DetectionService, limits: TrackLimits) -> None:
        self.service, self.limits = service, limits
        self.sessions: dict[str, TrackSession] = {}
        self.expired = 0

    def expire(self) -> None:
        """Close the sessions idle for longer than ``limits.session_idle``."""
        now = time.monotonic()
        for key, session in list(self.sessions.items()):
            if now - session.last_used > self.limits.session_idle and not session.lock.locked():
                del self.sessions[key]
                self.expired += 1

    def open(self, *, tracker: str, threshold: float, frame_rate: float) -> TrackSession:
        """A new session.

        Raises:
            RequestError: 503 ``too_many_sessions``; 501 ``tracking_unavailable``.
        """
        self.expire()
        if len(self.sessions) >= self.limits.max_sessions:
            raise RequestError(503, "too_many_sessions", f"{len(self.sessions)} tracking sessions are open, this "
                               f"server's limit (--max-track-sessions {self.limits.max_sessions}); close one "
                               f"(DELETE /track/sessions/ID) or retry after {self.limits.session_idle:g} s, when "
                               "idle ones close")
        try:
            state = build_tracker(tracker, threshold=threshold, frame_rate=frame_rate)
        except TrackerError as error:
            raise _unavailable(error) from error
        session = TrackSession(secrets.token_hex(8), tracker, threshold, frame_rate, state)
        self.sessions[session.id] = session
        return session

    def get(self, key: str) -> TrackSession:
        """The open session ``key``.

        Raises:
            RequestError: 404 ``unknown_session`` (never opened, closed, or idle too long).
        """
        self.expire()
        session = self.sessions.get(key)
        if session is None:
            raise RequestError(404, "unknown_session", f"no open tracking session {key!r}: it was closed, or idle "
                               f"for more than {self.limits.session_idle:g} s (--session-idle); open a new one with "
                               "POST /track/sessions")
        session.last_used = time.monotonic()
        return session

    def close(self, key: str) -> TrackSession:
        """Close session ``key`` and return it (404 ``unknown_session`` as :meth:`get`)."""
        session = self.get(key)
        del self.sessions[key]
        return session

    async def track_frame(self, session: TrackSession, pixels: np.ndarray,
                          on_model_thread: ModelThread) -> Prediction:
        """The session's next frame (``uint8`` RGB ``[H, W, 3]``) detected and tracked: its prediction with track ids
        and ``image_id`` its number in the stream (1-based).

        Raises:
            RequestError: 413 ``too_many_frames`` (the session had ``limits.max_frames`` already).
        """
        async with session.lock:
            if session.frames >= self.limits.max_frames:
                raise self.limits.too_many_frames(f"more than {self.limits.max_frames}")
            frame = Frame(session.frames, pixels, session.frames / session.frame_rate)
            predictor = self.service.predictor

            def run() -> Prediction:
                low = detection_threshold(session.tracker, session.threshold)
                prediction, = predictor.predict_arrays([pixels], threshold=low)
                prediction.image_id = frame.index + 1
                return assign_tracks(session.state, prediction, frame, high=session.threshold,
                                     needs_frame=session.tracker == "botsort")

            prediction = await on_model_thread(run)
            session.frames += 1
            session.last_used = time.monotonic()
            add_to_tracks(session.tracks, prediction, _category_ids(self.service))
            return prediction
