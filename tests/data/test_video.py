"""detr.data.video: a written video reads back frame by frame, from a file, a folder of frames and a stream served on
127.0.0.1; a frame that cannot be decoded is skipped and counted; a source that cannot be opened is one error naming
it."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detr.data.video import VideoSourceError, _webcam_device, open_frames, write_video

pytest.importorskip("av")


def numbered_frames(count: int = 12, height: int = 48, width: int = 64) -> list[np.ndarray]:
    """Frames whose brightness says their number (16 * i), so that the order read back shows."""
    return [np.full((height, width, 3), 16 * i, dtype=np.uint8) for i in range(count)]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "clip.mp4", numbered_frames(), frame_rate=10)


def brightness(frames) -> list[int]:
    return [int(round(frame.array.mean() / 16)) for frame in frames]


def test_a_written_video_reads_back_in_order_with_its_rate_and_times(clip):
    with open_frames(clip) as source:
        frames = list(source)
        assert (source.frame_rate, source.frame_count, source.size, source.skipped) == (10.0, 12, (48, 64), 0)
    assert brightness(frames) == list(range(12))
    assert [frame.index for frame in frames] == list(range(12))
    assert [frame.time for frame in frames] == pytest.approx([i / 10 for i in range(12)])
    assert frames[0].array.dtype == np.uint8 and frames[0].array.shape == (48, 64, 3)


def test_a_stream_served_on_localhost_reads_as_the_file(clip):
    """The RTSP/HTTP path: the same file served over HTTP on 127.0.0.1 and opened by its URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(clip.parent))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with open_frames(f"http://127.0.0.1:{server.server_address[1]}/{clip.name}") as source:
            assert source.frame_count is None  # a stream does not say
            assert brightness(source) == list(range(12))
    finally:
        server.shutdown()


def test_a_folder_of_frames_skips_and_counts_an_unreadable_one(tmp_path):
    for index, frame in enumerate(numbered_frames(5)):
        Image.fromarray(frame).save(tmp_path / f"{index:03d}.png")
    (tmp_path / "002.png").write_bytes(b"not a png")
    source = open_frames(tmp_path)
    frames = list(source)
    assert [frame.index for frame in frames] == [0, 1, 3, 4]  # the lost frame keeps its number
    assert brightness(frames) == [0, 1, 3, 4]
    assert source.skipped == 1 and source.frame_count == 5


def test_corrupt_packets_are_skipped_and_counted_not_fatal(tmp_path):
    frames = [np.full((48, 64, 3), 8 * i, dtype=np.uint8) for i in range(30)]
    for index, frame in enumerate(frames):  # a moving square: every frame's packet holds picture data
        frame[10:30, 2 * index : 2 * index + 20] = 255
    data = bytearray(write_video(tmp_path / "clip.mp4", frames, frame_rate=10).read_bytes())
    pictures = data.find(b"mdat") + 8  # the frames' data, after the index (an mp4 written with faststart)
    where = pictures + int(0.6 * (len(data) - pictures))
    data[where : where + 64] = b"\xff" * 64  # a few frames' packets destroyed
    (tmp_path / "bad.mp4").write_bytes(bytes(data))
    source = open_frames(tmp_path / "bad.mp4")
    read = list(source)
    assert source.skipped >= 1
    assert 20 <= len(read) < 30 and len(read) + source.skipped <= 30
    assert [frame.index for frame in read] == sorted({frame.index for frame in read})


@pytest.mark.parametrize(("source", "says"), [
    ("missing.mp4", "is not a video file, a folder of frames"),
    ("not_a_video.mp4", "check that it is a video FFmpeg can read"),
    ("http://127.0.0.1:1/clip.mp4", "check the address and that the server is running"),
    ("empty_folder", "video source"),
])
def test_a_source_that_cannot_be_opened_is_one_error_naming_it(tmp_path, monkeypatch, source, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not_a_video.mp4").write_text("hello")
    (tmp_path / "empty_folder").mkdir()
    with pytest.raises(VideoSourceError, match=says) as error:
        open_frames(source)
    assert source in str(error.value)


def test_a_webcam_index_opens_the_platforms_camera_device(monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    assert _webcam_device(2) == ("/dev/video2", "v4l2")
    with pytest.raises(VideoSourceError, match="cannot open webcam /dev/video99"):
        open_frames("99")


def test_an_odd_sized_video_is_cropped_to_even_sides(tmp_path):
    path = write_video(tmp_path / "odd.mp4", [np.zeros((33, 47, 3), np.uint8)] * 3, frame_rate=5)
    assert open_frames(path).size == (32, 46)
