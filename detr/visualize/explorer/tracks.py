"""One frame of a tracked video in the explorer: the frame's page (every query's attention, as for an image) with the
tracks of ``detr-track``'s ``tracks.json`` drawn on it: each track's box labelled with its id, and its trail (the
centres of its boxes over the frames before).

Frames are numbered from 1, as tracks.json and tracks.txt number them (MOTChallenge's). A track's box is matched to
the query whose final box overlaps it most (IoU at least :data:`MATCH_IOU`, one query per track): run with the
checkpoint and resize that made the tracks, the frame's detections are the same boxes, so each tracked query's box
on the page carries its track id; a track without a matching query (another checkpoint, another resize) is drawn
from tracks.json alone.

The page data's ``tracks`` key (absent on other pages)::

    tracks: {frame (1-based), source (the video), tracker, trail_length (frames),
             tracks: [{id, category_id, label_name, score, box_xyxy (pixels of the original frame),
                       query (the matched query's index, or null), trail: [[x, y], ...] (box centres, original
                       pixels, oldest first, ending at this frame)}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torchvision.ops import box_convert, box_iou

from detr.categories import CategoryMap
from detr.data.video import open_frames
from detr.inference.predictor import Predictor
from detr.models.detector import Detector
from detr.visualize.explorer.pages import explorer_page_data
from detr.visualize.explorer.render import render_explorer_html

#: The IoU a query's final box needs with a track's box to be taken for it.
MATCH_IOU = 0.5


class TrackFileError(ValueError):
    """A tracks.json that cannot be read, or a frame the video or the tracks do not have."""


def read_tracks(path: str | Path) -> dict[str, Any]:
    """``detr-track``'s tracks.json (:mod:`detr.inference.track_outputs`), checked.

    Raises:
        TrackFileError: the file is missing, not JSON, or not a tracks.json (no ``tracks`` list).
    """
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise TrackFileError(f"--tracks {path}: cannot read it ({error.strerror}); pass the tracks.json that "
                             "detr-track wrote") from None
    except json.JSONDecodeError as error:
        raise TrackFileError(f"--tracks {path}: not JSON ({error}); pass the tracks.json that detr-track wrote") \
            from None
    if not isinstance(record, dict) or not isinstance(record.get("tracks"), list):
        raise TrackFileError(f"--tracks {path}: not a tracks.json (it has no 'tracks' list); pass the tracks.json "
                             "that detr-track wrote")
    return record


def video_frame(source: str | int | Path, frame: int) -> np.ndarray:
    """Frame ``frame`` (1-based) of a video, a folder of frames or a stream: ``uint8`` RGB ``[H, W, 3]``.

    Raises:
        TrackFileError: the source has fewer frames, or that frame could not be decoded.
        detr.data.video.VideoSourceError: the source cannot be opened.
    """
    if frame < 1:
        raise TrackFileError(f"--frame {frame}: frames are numbered from 1, as in tracks.txt and tracks.json")
    with open_frames(source) as frames:
        count = 0
        for decoded in frames:
            count = decoded.index + 1
            if decoded.index == frame - 1:
                return decoded.array
            if decoded.index >= frame:
                break
        if frames.skipped and count >= frame:
            raise TrackFileError(f"--frame {frame}: that frame of {source} could not be decoded; choose another")
    raise TrackFileError(f"--frame {frame}: {source} has only {count} frames")


def frame_tracks(record: Mapping[str, Any], frame: int, *, trail_length: int = 30) -> list[dict[str, Any]]:
    """The tracks of tracks.json ``record`` that have a box in ``frame`` (1-based): each with its box there
    (``box_xyxy``, original pixels), score, class and ``trail`` (its box centres in the ``trail_length`` frames up to
    this one, oldest first); ``query`` None until :func:`match_queries`."""
    found = []
    for track in record["tracks"]:
        boxes = [box for box in track["boxes"] if frame - trail_length < box[0] <= frame]
        if not boxes or boxes[-1][0] != frame:
            continue
        _, x, y, w, h, score = boxes[-1]
        found.append({"id": int(track["id"]), "category_id": track.get("category_id"),
                      "label_name": str(track.get("label_name", "")), "score": float(score),
                      "box_xyxy": [x, y, x + w, y + h], "query": None,
                      "trail": [[round(bx + bw / 2, 2), round(by + bh / 2, 2)] for _, bx, by, bw, bh, _ in boxes]})
    return found


def match_queries(tracks: list[dict[str, Any]], data: Mapping[str, Any]) -> None:
    """Set each track's ``query``: the query of the explorer ``data`` (:func:`detr.visualize.explorer.explorer_data`)
    whose final box has the highest IoU with the track's box, at least :data:`MATCH_IOU`, each query taken once."""
    if not tracks:
        return
    size = torch.tensor([data["image"]["original_width"], data["image"]["original_height"]] * 2, dtype=torch.float64)
    # clipped to the frame, as the predictions that made the tracks are
    queries = box_convert(torch.tensor(data["boxes"][-1], dtype=torch.float64), "cxcywh", "xyxy").clamp(0, 1) * size
    iou = box_iou(torch.tensor([t["box_xyxy"] for t in tracks], dtype=torch.float64), queries).numpy()
    for row, column in zip(*linear_sum_assignment(-iou)):
        if iou[row, column] >= MATCH_IOU:
            tracks[row]["query"] = int(column)


def add_tracks(data: dict[str, Any], record: Mapping[str, Any], frame: int, *,
               trail_length: int = 30) -> dict[str, Any]:
    """``data`` (one frame's explorer data) with the ``tracks`` key of tracks.json ``record``'s frame ``frame``
    (module docstring)."""
    tracks = frame_tracks(record, frame, trail_length=trail_length)
    match_queries(tracks, data)
    data["tracks"] = {"frame": frame, "source": str(record.get("source", "")), "tracker": record.get("tracker"),
                      "trail_length": trail_length, "tracks": tracks}
    return data


def write_frame_explorer(
    model: Detector,
    video: str | int | Path,
    frame: int,
    out_dir: str | Path,
    *,
    tracks: str | Path | Mapping[str, Any] | None = None,
    trail_length: int = 30,
    category_map: CategoryMap | None = None,
    threshold: float | None = None,
    min_size: int | None = None,
    max_size: int | None = None,
    device: str | torch.device | None = None,
) -> Path:
    """Write the explorer page of frame ``frame`` (1-based) of ``video``, with its tracks when ``tracks`` (a
    tracks.json path or its record) is given: ``out_dir/<video stem>_frame<N>.html``.

    The frame runs alone through the Predictor (as :func:`detr.visualize.explorer.write_attention_explorer` runs
    an image); ``threshold``, ``min_size``, ``max_size``, ``category_map`` and ``device`` as there: pass those that
    made the tracks so that each tracked box is a query's.

    Raises:
        TrackFileError: the tracks file is not a tracks.json, or the video has no such frame.
        ValueError: the model returns no attention (an exported file's backend).
    """
    if model.attention_kind is None:
        raise ValueError(f"{type(model).__name__} ({model.backend}) returns no attention maps or sampling points "
                         "(attention_kind None), which the explorer shows; use the PyTorch model it came from")
    record = read_tracks(tracks) if isinstance(tracks, (str, Path)) else tracks
    pixels = video_frame(video, frame)
    predictor = Predictor(model, category_map=category_map, device=device, threshold=threshold,
                          min_size=min_size, max_size=max_size)
    name = Path(str(video)).stem or "video"
    data = explorer_page_data(predictor, pixels, title=f"{Path(str(video)).name} frame {frame}",
                              threshold=predictor.threshold, model_description=model.describe())
    if record is not None:
        add_tracks(data, record, frame, trail_length=trail_length)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / f"{name}_frame{frame:06d}.html"
    page.write_text(render_explorer_html(data), encoding="utf-8")
    return page
