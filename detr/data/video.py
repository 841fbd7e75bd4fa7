"""Video in and out: the frames of a video file, a folder of frames, a webcam or a stream (RTSP, HTTP), and a video
written frame by frame. Decoding and encoding are PyAV's (``av``, FFmpeg's libraries; the ``video`` extra:
``pip install detr-lightning[video]``), imported only when a video is opened.

:func:`open_frames` is the one entry: ``for frame in open_frames(source): frame.array`` yields ``uint8`` RGB
``[H, W, 3]`` arrays in order, each with its index in the source (0-based, counting frames that could not be
decoded) and its time in seconds. A frame that cannot be decoded (a corrupt packet of a video, an unreadable file
of a folder) is skipped and counted in :attr:`FrameSource.skipped`, never fatal; a source that cannot be opened at
all raises :class:`VideoSourceError` (a ``ValueError``) naming it and the fix.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from detr.data.images import ImageLoadError, list_image_files, load_rgb_image

logger = logging.getLogger(__name__)

#: What a stream address starts with: ``rtsp://``, ``http://``, ``udp://`` ... (a scheme, then ``://``).
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: The frame rate assumed for a folder of frames, and for a stream that does not say.
DEFAULT_FRAME_RATE = 30.0
#: How long opening or reading a stream (network, webcam) may wait before it fails, seconds.
STREAM_TIMEOUT = 10.0


class VideoSourceError(ValueError):
    """A video source that cannot be opened (missing, not a video, a stream that does not answer, PyAV missing)."""


@dataclass
class Frame:
    """One decoded frame: ``array`` ``uint8`` RGB ``[H, W, 3]``; ``index``: its position in the source (0-based;
    frames that could not be decoded keep their numbers); ``time``: seconds from the start of the source."""

    index: int
    array: np.ndarray
    time: float


class FrameSource:
    """The frames of one source, in order (iterate it once). Build it with :func:`open_frames`.

    Attributes:
        source: what was opened (a path, a URL, or the webcam's device).
        frame_rate: frames per second (the container's; :data:`DEFAULT_FRAME_RATE` for a folder or a stream that
            does not say).
        frame_count: how many frames the source holds when known (a file, a folder), else None (a stream).
        skipped: how many frames could not be decoded and were skipped so far.
        size: ``(height, width)`` of the frames when known before decoding, else None.
    """

    def __init__(self, source: str, decode: Callable[[FrameSource], Iterator[Frame]], *, frame_rate: float,
                 frame_count: int | None, size: tuple[int, int] | None = None,
                 close: Callable[[], None] | None = None) -> None:
        self.source = source
        self.frame_rate = float(frame_rate)
        self.frame_count = frame_count
        self.size = size
        self.skipped = 0
        self._frames = decode(self)  # a generator: nothing is decoded before the first frame is asked for
        self._close = close

    def __iter__(self) -> Iterator[Frame]:
        return self._frames

    def close(self) -> None:
        """Release the file or the stream (also done when the frames run out)."""
        if self._close is not None:
            self._close()
            self._close = None

    def __enter__(self) -> FrameSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_frames(source: str | int | Path) -> FrameSource:
    """Open a video source.

    Args:
        source: a video file (mp4, avi, mkv, mov, webm ... whatever FFmpeg reads), a folder of image files (its
            images in name order, :func:`detr.data.images.list_image_files`), a webcam's index (``0`` or ``"0"``:
            ``/dev/video0`` through video4linux on Linux, AVFoundation's device 0 on macOS, DirectShow's
            ``video=0`` on Windows) or a stream's URL (``rtsp://``, ``http(s)://``, ``udp://`` ...).

    Raises:
        VideoSourceError: the source does not exist, is not a video, does not answer (a stream waits at most
            :data:`STREAM_TIMEOUT` seconds), or PyAV is not installed.
    """
    text = str(source)
    if isinstance(source, int) or text.isdigit():
        return _open_av(_webcam_device(int(text)), webcam=True)
    if _URL.match(text):
        return _open_av(text, stream=True)
    path = Path(text)
    if path.is_dir():
        return _open_folder(path)
    if not path.is_file():
        raise VideoSourceError(f"video source {text!r} is not a video file, a folder of frames, a webcam index or a "
                               "stream URL (rtsp://, http://): check the path")
    return _open_av(text)


def _open_folder(folder: Path) -> FrameSource:
    try:
        paths = list_image_files(folder)
    except ValueError as error:
        raise VideoSourceError(f"video source {folder}: {error}") from None
    def frames(source: FrameSource) -> Iterator[Frame]:
        for index, path in enumerate(paths):
            try:
                array = load_rgb_image(path)
            except ImageLoadError as error:
                source.skipped += 1
                logger.warning("skipping frame %d (%s): %s", index, path, error.__cause__ or error)
                continue
            yield Frame(index, array, index / source.frame_rate)

    return FrameSource(str(folder), frames, frame_rate=DEFAULT_FRAME_RATE, frame_count=len(paths))


def _webcam_device(index: int) -> tuple[str, str]:
    """FFmpeg's input and format of webcam ``index`` on this platform."""
    if sys.platform == "darwin":
        return str(index), "avfoundation"
    if sys.platform == "win32":
        return f"video={index}", "dshow"
    return f"/dev/video{index}", "v4l2"


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise VideoSourceError("reading video needs PyAV: pip install 'detr-lightning[video]' (or pip install av)") \
            from None
    return av


def _open_av(source: str | tuple[str, str], *, stream: bool = False, webcam: bool = False) -> FrameSource:
    av = _av()
    name, form = source if isinstance(source, tuple) else (source, None)
    options = {"rtsp_transport": "tcp"} if name.startswith("rtsp") else {}
    try:
        container = av.open(name, format=form, options=options,
                            timeout=STREAM_TIMEOUT if stream or webcam else None)
    except av.error.FFmpegError as error:
        what = "webcam" if webcam else "stream" if stream else "video file"
        raise VideoSourceError(f"cannot open {what} {name}: {error.strerror or error}; "
                               + ("check the camera's index and that no other program holds it" if webcam else
                                  "check the address and that the server is running" if stream else
                                  "check that it is a video FFmpeg can read")) from None
    if not container.streams.video:
        container.close()
        raise VideoSourceError(f"{name} holds no video stream (audio only?): pass a video")
    video = container.streams.video[0]
    video.thread_type = "AUTO"  # frame- and slice-threaded decoding
    rate = video.average_rate or video.guessed_rate
    frame_rate = float(rate) if rate else DEFAULT_FRAME_RATE
    count = int(video.frames) if video.frames and not (stream or webcam) else None
    size = (int(video.height), int(video.width)) if video.height and video.width else None
    time_base = video.time_base or Fraction(1, 1)

    def frames(source: FrameSource) -> Iterator[Frame]:
        index = 0
        try:
            for packet in container.demux(video):
                try:
                    decoded = packet.decode()
                except av.error.FFmpegError as error:  # a corrupt packet: its frame is lost, the rest goes on
                    source.skipped += 1
                    logger.warning("skipping frame %d of %s: %s", index, name, error.strerror or error)
                    index += 1
                    continue
                for frame in decoded:
                    time = float(frame.pts * time_base) if frame.pts is not None else index / frame_rate
                    yield Frame(index, frame.to_ndarray(format="rgb24"), time)
                    index += 1
        finally:
            source.close()

    return FrameSource(name, frames, frame_rate=frame_rate, frame_count=count, size=size, close=container.close)


class VideoWriter:
    """Write ``uint8`` RGB ``[H, W, 3]`` frames to a video file (H.264 in an mp4 or mkv, MPEG-4 Part 2 in an avi, VP8
    in a webm), frame by frame: what was written before a stop plays once :meth:`close` ran (it flushes the encoder
    and finishes the container; use it as a context manager). All frames must have the first one's size; odd
    sizes are cropped by one pixel (H.264's 4:2:0 needs even sides)."""

    def __init__(self, path: str | Path, *, frame_rate: float) -> None:
        av = _av()
        self.path = Path(path)
        self.frame_rate = frame_rate
        # an mp4's index first (faststart): it plays, and streams over HTTP, before the whole file has arrived
        options = {"movflags": "+faststart"} if self.path.suffix.lower() in (".mp4", ".mov") else {}
        self._container = av.open(str(self.path), "w", options=options)
        self._stream: Any = None
        self._av = av
        self.frames = 0

    def write(self, array: np.ndarray) -> None:
        """Append one frame."""
        if self._stream is None:
            codec = {".avi": "mpeg4", ".webm": "libvpx"}.get(self.path.suffix.lower(), "libx264")
            rate = Fraction(self.frame_rate).limit_denominator(1001)
            self._stream = self._container.add_stream(codec, rate=rate)
            self._stream.height, self._stream.width = array.shape[0] // 2 * 2, array.shape[1] // 2 * 2
            self._stream.pix_fmt = "yuv420p"
            if codec == "libx264":
                self._stream.options = {"crf": "20", "preset": "veryfast"}
        height, width = self._stream.height, self._stream.width
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(array[:height, :width]), format="rgb24")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder and finish the file (a second call does nothing)."""
        if self._container is None:
            return
        try:
            if self._stream is not None:
                for packet in self._stream.encode():
                    self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_video(path: str | Path, frames: Iterator[np.ndarray] | list[np.ndarray], *, frame_rate: float) -> Path:
    """Write ``frames`` (``uint8`` RGB ``[H, W, 3]``) to the video file ``path`` (:class:`VideoWriter`)."""
    with VideoWriter(path, frame_rate=frame_rate) as writer:
        for array in frames:
            writer.write(array)
    return Path(path)
