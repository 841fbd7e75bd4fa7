"""detr-serve's tracking (detr/serving/tracking.py) in-process with FastAPI's TestClient: a video upload gives the
tracks detr-track writes for the same clip, a frame stream posted frame by frame gives Predictor.track's ids, and
every bound (bytes, frames, seconds, open sessions, idle time) is refused with a 4xx JSON naming its option.

The detector is tests/helpers_tracking.py's ReplayDetector (as tests/commands/test_track.py's): it replays the
clip's ground truth frame after frame, degraded, through the real Predictor, so that the same clip gives the same
detections whichever way its frames arrive."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
from PIL import Image

from detr.data.shape_clips import ClipConfig, render_clip, write_clip
from detr.data.video import open_frames
from detr.inference.predictor import Predictor
from detr.inference.track_outputs import track_video
from detr.serving import DetectionService, create_app
from detr.serving.tracking import TrackLimits
from tests.helpers_tracking import ReplayDetector

pytest.importorskip("av")
pytest.importorskip("trackers")
pytest.importorskip("httpx")  # FastAPI's TestClient
from fastapi.testclient import TestClient  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = ClipConfig(num_frames=30, num_objects=3, crossing_pairs=1, seed=1)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    return path, write_clip(path, CONFIG)


def replay_predictor(truth, batch_size: int = 1) -> Predictor:
    """A new stand-in detector for the clip, from its first frame."""
    return Predictor(ReplayDetector(truth, height=CONFIG.height, width=CONFIG.width), device="cpu",
                     batch_size=batch_size)


def client(truth, max_pixels: int = 40_000_000, **limits) -> TestClient:
    service = DetectionService(replay_predictor(truth, batch_size=4), model_name="replay")
    return TestClient(create_app(service, max_pixels=max_pixels, track_limits=TrackLimits(**limits)))


def refusal(response, status: int, kind: str, option: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == kind and option in body["detail"], body


def test_an_upload_gets_the_tracks_detr_track_writes(clip, tmp_path):
    path, truth = clip
    run = track_video(replay_predictor(truth), path, tmp_path / "out", draw=False)
    written = json.loads((tmp_path / "out" / "tracks.json").read_text())
    with client(truth) as http:
        answer = http.post("/track", content=path.read_bytes())
    assert answer.status_code == 200, answer.text
    record = answer.json()
    assert record["model"] == "replay" and record["tracker"] == "botsort" and record["threshold"] == 0.5  # the default
    assert record["frames"] == run.frames == CONFIG.num_frames and record["skipped_frames"] == 0
    assert record["tracks"] == written["tracks"] and len(record["tracks"]) >= CONFIG.num_objects
    assert record["categories"] == written["categories"]
    with client(truth) as http:  # the MOTChallenge lines, the video as a multipart field as curl -F video=@ sends it
        answer = http.post("/track?format=mot&tracker=botsort", files={"video": ("clip.mp4", path.read_bytes())})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    assert answer.text.splitlines() == (tmp_path / "out" / "tracks.txt").read_text().splitlines()


def test_a_frame_stream_keeps_its_tracker_state(clip):
    path, truth = clip
    expected = list(replay_predictor(truth).track(path))
    frames, _ = render_clip(CONFIG)
    with client(truth) as http:
        opened = http.post("/track/sessions?frame_rate=25")
        assert opened.status_code == 201, opened.text
        session = opened.json()["session"]
        assert opened.json()["tracker"] == "botsort" and opened.json()["max_frames"] == 1800
        for number, (pixels, prediction) in enumerate(zip(frames, expected), start=1):
            image = io.BytesIO()
            Image.fromarray(pixels).save(image, format="PNG")
            answer = http.post(f"/track/sessions/{session}/frames", content=image.getvalue())
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["frame"] == number and body["session"] == session
            assert [d["track_id"] for d in body["detections"]] == prediction.track_ids.tolist()
            np.testing.assert_allclose(np.array([d["box_xyxy"] for d in body["detections"]]).reshape(-1, 4),
                                       prediction.boxes.numpy(), atol=1e-3)
        closed = http.delete(f"/track/sessions/{session}")
        assert closed.status_code == 200 and closed.json()["frames"] == CONFIG.num_frames
        tracked_ids = {i for p in expected for i in p.track_ids.tolist() if i > 0}
        assert {t["id"] for t in closed.json()["tracks"]} == tracked_ids
        refusal(http.post(f"/track/sessions/{session}/frames", content=image.getvalue()), 404, "unknown_session",
                "POST /track/sessions")


def test_each_bound_is_refused_naming_its_option(clip):
    path, truth = clip
    data = path.read_bytes()
    with client(truth, max_bytes=len(data) - 1) as http:
        refusal(http.post("/track", content=data), 413, "body_too_large", "--max-video-mb")
        assert http.post("/predict", content=b"").json()["error"] == "empty_body"  # the server goes on
    with client(truth, max_frames=CONFIG.num_frames - 1) as http:
        refusal(http.post("/track", content=data), 413, "too_many_frames", "--max-video-frames")  # the mp4's header
    mkv = path.with_suffix(".mkv")  # a Matroska file does not say how many frames it has: counted while decoding
    write_clip(mkv, CONFIG)
    with client(truth, max_frames=CONFIG.num_frames - 1) as http:
        refusal(http.post("/track", content=mkv.read_bytes()), 413, "too_many_frames", "--max-video-frames")
        assert http.post("/track/sessions").status_code == 201  # the server goes on
    with client(truth, max_pixels=CONFIG.height * CONFIG.width - 1) as http:  # each frame is checked as an image
        refusal(http.post("/track", content=data), 413, "image_too_large", "--max-pixels")
    with client(truth, max_seconds=1e-9) as http:
        refusal(http.post("/track", content=data), 408, "track_timeout", "--max-track-seconds")
    with client(truth) as http:
        refusal(http.post("/track", content=b"not a video at all"), 400, "not_a_video", "mp4")
        refusal(http.post("/track", content=b""), 400, "empty_body", "'video'")
        refusal(http.post("/track?tracker=deepsort", content=data), 422, "unknown_tracker", "bytetrack")
        refusal(http.post("/track?format=xml", content=data), 422, "unknown_format", "mot")
        refusal(http.post("/track/sessions?frame_rate=0"), 422, "bad_frame_rate", "frame_rate")


def test_sessions_are_capped_and_close_when_idle(clip):
    _, truth = clip
    frame = io.BytesIO()
    Image.fromarray(render_clip(ClipConfig(num_frames=1, num_objects=1, crossing_pairs=0))[0][0]).save(frame, "PNG")
    with client(truth, max_sessions=1, max_frames=2, session_idle=0.5) as http:
        first = http.post("/track/sessions").json()["session"]
        refusal(http.post("/track/sessions"), 503, "too_many_sessions", "--max-track-sessions")
        for _ in range(2):
            assert http.post(f"/track/sessions/{first}/frames", content=frame.getvalue()).status_code == 200
        refusal(http.post(f"/track/sessions/{first}/frames", content=frame.getvalue()), 413, "too_many_frames",
                "--max-video-frames")
        time.sleep(0.6)
        refusal(http.post(f"/track/sessions/{first}/frames", content=frame.getvalue()), 404, "unknown_session",
                "--session-idle")
        assert http.get("/stats").json()["track_sessions"] == {"open": 0, "expired": 1}
        assert http.post("/track/sessions").status_code == 201  # the idle one's place is free again


def test_the_tracked_upload_decodes_every_frame_once(clip):
    """The upload is decoded once, frame by frame: the frames the detector saw are the clip's."""
    path, truth = clip
    service = DetectionService(replay_predictor(truth, batch_size=4), model_name="replay")
    with TestClient(create_app(service)) as http:
        assert http.post("/track", content=path.read_bytes()).status_code == 200
    with open_frames(path) as frames:
        assert service.predictor.model.frame == sum(1 for _ in frames) == CONFIG.num_frames


def test_detr_serve_passes_its_tracking_options(clip, monkeypatch):
    """Each bound is a detr-serve option: what the command line says reaches the app."""
    import detr.commands.serve as serve_command
    import detr.serving as serving

    _, truth = clip
    served = {}
    monkeypatch.setattr(serving, "load_service",
                        lambda *args, **kwargs: DetectionService(replay_predictor(truth), model_name="replay"))
    monkeypatch.setattr(serving, "serve", lambda app, **kwargs: served.update(app=app))
    assert serve_command.main(["--checkpoint", "replay.ckpt", "--max-video-mb", "1.5", "--max-video-frames", "7",
                               "--max-track-seconds", "9", "--max-track-sessions", "2", "--session-idle", "4"]) == 0
    limits = served["app"].state.track_sessions.limits
    assert limits == TrackLimits(max_bytes=int(1.5 * 2**20), max_frames=7, max_seconds=9.0, max_sessions=2,
                                 session_idle=4.0)
    assert serve_command.main(["--checkpoint", "replay.ckpt"]) == 0  # the defaults
    assert served["app"].state.track_sessions.limits == TrackLimits()
