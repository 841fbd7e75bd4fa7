"""One frame of a tracked video in the explorer (detr/visualize/explorer/tracks.py, detr-explore --video --frame
--tracks): the page's data holds the frame's tracks, each matched to the query whose box it is, with its trail; the
frame is the video's; what the command cannot use is one ``error:`` line.

The tracks are made by detr-track's own path (track_video) with a tiny random DETR that returns attention (the
explorer needs it), on a clip the test writes: its queries predict nearly the same boxes every frame, which
ByteTrack links into tracks."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import detr.commands.explore as explore_command
from detr.checkpoints import save_checkpoint
from detr.data.shape_clips import ClipConfig, render_clip, write_clip
from detr.inference.predictor import Predictor
from detr.inference.track_outputs import track_video
from detr.visualize.explorer import write_frame_explorer
from detr.visualize.explorer.tracks import TrackFileError, frame_tracks, video_frame
from tests.helpers import error_lines
from tests.serving.helpers import spread_out_model

pytest.importorskip("av")
pytest.importorskip("trackers")
pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = ClipConfig(num_frames=8, num_objects=2, crossing_pairs=1, seed=2)
DATA_BLOCK = re.compile(r'<script type="application/json" id="explorer-data">(.*?)</script>', re.S)
THRESHOLD = 0.5


def page_data(path) -> dict:
    return json.loads(DATA_BLOCK.search(path.read_text(encoding="utf-8")).group(1))


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A clip (mp4), a model, and the tracks.json detr-track's path writes for them."""
    folder = tmp_path_factory.mktemp("tracked")
    video = folder / "clip.mp4"
    write_clip(video, CONFIG)
    model = spread_out_model()
    track_video(Predictor(model, device="cpu", threshold=THRESHOLD), video, folder / "out", draw=False)
    record = json.loads((folder / "out" / "tracks.json").read_text())
    assert record["tracks"], "the tiny model's boxes should form tracks"
    return video, model, record, folder / "out" / "tracks.json"


def test_the_page_holds_the_frames_tracks_on_their_queries(tracked, tmp_path):
    video, model, record, _ = tracked
    frame = 6
    page = write_frame_explorer(model, video, frame, tmp_path, tracks=record, trail_length=4, threshold=THRESHOLD,
                                device="cpu")
    assert page.name == "clip_frame000006.html"
    data = page_data(page)
    tracks = data["tracks"]
    assert (tracks["frame"], tracks["tracker"], tracks["trail_length"]) == (frame, record["tracker"], 4)
    expected = {t["id"] for t in record["tracks"] if any(box[0] == frame for box in t["boxes"])}
    assert {t["id"] for t in tracks["tracks"]} == expected and expected
    width, height = data["image"]["original_width"], data["image"]["original_height"]
    assert (height, width) == (CONFIG.height, CONFIG.width)
    queries = [t["query"] for t in tracks["tracks"]]
    assert None not in queries and len(set(queries)) == len(queries)  # same model, same resize: every box a query's
    for track in tracks["tracks"]:
        cx, cy, w, h = data["boxes"][-1][track["query"]]
        query_box = np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0, 1) * [width, height, width, height]
        # tracks.json rounds to 0.01 px, the page to 1e-6 of the side; predictions are clipped to the frame
        np.testing.assert_allclose(track["box_xyxy"], query_box, atol=0.05)
        assert 1 <= len(track["trail"]) <= 4
        x0, y0, x1, y1 = track["box_xyxy"]
        assert track["trail"][-1] == pytest.approx([(x0 + x1) / 2, (y0 + y1) / 2], abs=0.02)  # ends at this frame
    # the attention of every query is there as on any page
    assert data["num_queries"] == 12 and "decoder" in data


def test_a_track_without_its_query_is_drawn_from_the_file(tracked):
    _, _, record, _ = tracked
    tracks = frame_tracks(record, 3, trail_length=30)
    assert tracks and all(t["query"] is None and len(t["trail"]) <= 3 for t in tracks)


def test_the_frame_is_the_videos(tracked):
    video, _, _, _ = tracked
    frames, _ = render_clip(CONFIG)
    decoded = video_frame(video, 3)
    assert decoded.shape == frames[2].shape
    assert np.abs(decoded.astype(int) - frames[2]).mean() < np.abs(decoded.astype(int) - frames[6]).mean()
    with pytest.raises(TrackFileError, match="has only 8 frames"):
        video_frame(video, 9)


def test_detr_explore_opens_a_frame_of_a_tracked_video(tracked, tmp_path, capsys):
    video, model, _, tracks_json = tracked
    checkpoint = save_checkpoint(model, tmp_path / "tiny.ckpt")
    out = tmp_path / "pages"
    # --video defaults to tracks.json's source
    assert explore_command.main(["--tracks", str(tracks_json), "--frame", "4", "--checkpoint", str(checkpoint),
                                 "--out", str(out), "--threshold", str(THRESHOLD), "--device", "cpu"]) == 0
    assert page_data(out / "clip_frame000004.html")["tracks"]["frame"] == 4
    capsys.readouterr()
    assert explore_command.main(["--video", str(video), "--frame", "99", "--tracks", str(tracks_json),
                                 "--checkpoint", str(checkpoint), "--out", str(out)]) == 2
    # the package's INFO lines ("loaded ...") come first when an earlier test in this process turned them on
    assert error_lines(capsys.readouterr().err) == ["error: --frame 99: " + str(video) + " has only 8 frames"]
    (tmp_path / "bad.json").write_text("{}")
    assert explore_command.main(["--video", str(video), "--frame", "1", "--tracks", str(tmp_path / "bad.json"),
                                 "--checkpoint", str(checkpoint), "--out", str(out)]) == 2
    (error,) = error_lines(capsys.readouterr().err)
    assert error.startswith("error: --tracks ")
    with pytest.raises(SystemExit):
        explore_command.main(["--video", str(video), "--checkpoint", str(checkpoint), "--out", str(out)])
    assert "--frame N" in capsys.readouterr().err
