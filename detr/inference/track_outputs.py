"""What a tracking run writes (``detr-track``, :func:`track_video`), into an output folder it claims
(:func:`detr.output_folder.claim_output_folder`: one run per folder, a previous run's files replaced only when asked):

- ``tracks.txt``: MOTChallenge results, one line per tracked detection ``frame, id, x, y, w, h, score, class, -1,
  -1`` (frames 1-based, pixel ``xywh``, ``class`` the data set's category id), appended frame by frame;
- ``tracks.json``: the run (source, tracker, threshold, frame rate, frames read and skipped) and every track:
  its id, class, first and last frame, and its boxes ``[frame, x, y, w, h, score]``;
- ``tracks.mp4``: the video with each track's box, id and trail drawn (:func:`detr.visualize.drawing.draw_tracks`).

A run that stops (Ctrl-C, SIGTERM, an error) keeps what it wrote: ``tracks.txt`` holds every frame done (each
frame's lines written at once), the video is finished up to the last frame drawn, and ``tracks.json`` is written
(whole, :func:`detr.atomic_files.write_text_atomically`) with the frames done.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detr.atomic_files import write_text_atomically
from detr.data.video import Frame, VideoWriter, open_frames
from detr.inference.prediction import Prediction
from detr.inference.predictor import Predictor
from detr.inference.tracking import DEFAULT_TRACKER, track_frames
from detr.output_folder import claim_output_folder
from detr.visualize.drawing import draw_tracks

#: The files every tracking run writes: a folder holding one holds a previous run's outputs.
TRACK_FILES = ("tracks.txt", "tracks.json", "tracks.mp4")


@dataclass
class TrackRun:
    """What :func:`track_video` did: ``frames`` predicted, ``skipped`` (not decodable) and ``failed`` (outputs not
    finite) frames, ``tracks`` (id → its record in tracks.json), ``seconds`` spent, and the written files."""

    frames: int = 0
    skipped: int = 0
    failed: int = 0
    tracks: dict[int, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    tracks_txt: Path | None = None
    tracks_json: Path | None = None
    video: Path | None = None

    @property
    def frame_rate(self) -> float:
        """Frames predicted per second of the run."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def mot_lines(prediction: Prediction, category_ids: Iterable[int] | None = None) -> list[str]:
    """MOTChallenge result lines of one tracked frame (``prediction.image_id``: the frame number, 1-based): the
    detections in a track only; ``category_ids`` maps labels to the data set's ids (None: the label)."""
    if prediction.track_ids is None:
        raise ValueError("the prediction has no track ids: make it with Predictor.track")
    ids = list(category_ids) if category_ids is not None else None
    lines = []
    for (x0, y0, x1, y1), score, label, track_id in zip(prediction.boxes.tolist(), prediction.scores.tolist(),
                                                        prediction.labels.tolist(), prediction.track_ids.tolist()):
        if track_id >= 0:
            category = ids[label] if ids is not None else label
            lines.append(f"{prediction.image_id},{track_id},{x0:.2f},{y0:.2f},{x1 - x0:.2f},{y1 - y0:.2f},"
                         f"{score:.4f},{category},-1,-1")
    return lines


def track_video(
    predictor: Predictor,
    source: str | int | Path,
    out_dir: str | Path,
    *,
    tracker: str = DEFAULT_TRACKER,
    threshold: float | None = None,
    draw: bool = True,
    trail_length: int = 30,
    progress: Callable[[Iterable[Frame], int | None], Iterable[Frame]] | None = None,
    overwrite: bool = False,
    overwrite_flag: str = "overwrite=True",
    elsewhere: str = "another out_dir",
) -> TrackRun:
    """Track objects through ``source`` (:func:`detr.data.video.open_frames`) and write ``out_dir``'s files (module
    docstring). ``trail_length``: frames of each track's trail drawn; ``progress(frames, total)`` wraps the frames
    (e.g. a tqdm bar; ``total`` None for a stream). A frame that cannot be decoded is skipped and counted.

    Raises:
        detr.data.video.VideoSourceError: the source cannot be opened.
        detr.output_folder.OutputFolderError: ``out_dir`` is another run's, or holds a previous run's files
            without ``overwrite``.
    """
    frames = open_frames(source)
    with frames, claim_output_folder(out_dir, overwrite=overwrite, overwrite_flag=overwrite_flag,
                                     elsewhere=elsewhere, markers=TRACK_FILES) as folder:
        out = folder.folder
        run = TrackRun(tracks_txt=folder.record(out / "tracks.txt"), tracks_json=out / "tracks.json")
        category_ids = predictor.category_map.category_ids if predictor.category_map is not None else None
        video = VideoWriter(folder.record(out / "tracks.mp4"), frame_rate=frames.frame_rate) if draw else None
        run.video = video.path if video is not None else None
        trails: dict[int, list[tuple[float, float]]] = {}
        start = time.perf_counter()
        try:
            with run.tracks_txt.open("w") as text:
                iterator: Iterable[Frame] = frames if progress is None else progress(frames, frames.frame_count)
                for frame, prediction in track_frames(predictor, iterator, tracker=tracker, threshold=threshold,
                                                      frame_rate=frames.frame_rate):
                    run.frames += 1
                    run.failed += prediction.error is not None
                    lines = mot_lines(prediction, category_ids)
                    if lines:
                        text.write("\n".join(lines) + "\n")  # one write per frame, flushed: a stop keeps whole frames
                        text.flush()
                    add_to_tracks(run.tracks, prediction, category_ids)
                    if video is not None:
                        _extend_trails(trails, prediction, trail_length)
                        video.write(draw_tracks(frame.array, prediction, trails).permute(1, 2, 0).numpy())
        finally:
            run.seconds = time.perf_counter() - start
            run.skipped = frames.skipped
            if video is not None:
                video.close()
            write_text_atomically(folder.record(run.tracks_json), json.dumps(run_record(
                run, source=str(source), tracker=tracker, frame_rate=frames.frame_rate,
                threshold=predictor.threshold if threshold is None else threshold, predictor=predictor)))
    return run


def add_to_tracks(tracks: dict[int, dict[str, Any]], prediction: Prediction, category_ids: list[int] | None) -> None:
    """Add one tracked frame's detections in a track to ``tracks`` (id → its tracks.json record, module
    docstring); ``category_ids`` maps labels to the data set's ids (None: the label)."""
    assert prediction.track_ids is not None and prediction.image_id is not None
    for (x0, y0, x1, y1), score, label, name, track_id in zip(
            prediction.boxes.tolist(), prediction.scores.tolist(), prediction.labels.tolist(), prediction.label_names,
            prediction.track_ids.tolist()):
        if track_id < 0:
            continue
        track = tracks.setdefault(track_id, {
            "id": track_id, "category_id": category_ids[label] if category_ids is not None else label,
            "label_name": name, "first_frame": prediction.image_id, "boxes": []})
        track["last_frame"] = prediction.image_id
        track["boxes"].append([prediction.image_id, round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2),
                               round(score, 4)])


def _extend_trails(trails: dict[int, list[tuple[float, float]]], prediction: Prediction, length: int) -> None:
    """Each tracked box's centre appended to its track's trail (at most ``length`` points); a track not seen in
    this frame keeps its trail until it comes back or ``length`` frames pass."""
    assert prediction.track_ids is not None
    seen = set()
    for (x0, y0, x1, y1), track_id in zip(prediction.boxes.tolist(), prediction.track_ids.tolist()):
        if track_id >= 0:
            seen.add(track_id)
            trail = trails.setdefault(track_id, [])
            trail.append(((x0 + x1) / 2, (y0 + y1) / 2))
            del trail[:-length]
    for track_id in list(trails):
        if track_id not in seen:
            trails[track_id] = trails[track_id][1:]  # fades out while the track is lost
            if not trails[track_id]:
                del trails[track_id]


def run_record(run: TrackRun, *, source: str, tracker: str, frame_rate: float, threshold: float,
               predictor: Predictor) -> dict[str, Any]:
    """tracks.json's content (module docstring) for ``run`` (also ``detr-serve``'s ``POST /track`` answer)."""
    return {"source": source, "tracker": tracker, "threshold": threshold, "frame_rate": frame_rate,
            "frames": run.frames, "skipped_frames": run.skipped, "failed_frames": run.failed,
            "seconds": round(run.seconds, 3),
            "categories": ([{"id": i, "name": n} for i, n in zip(predictor.category_map.category_ids,
                                                                    predictor.category_map.names)]
                           if predictor.category_map is not None else None),
            "tracks": [run.tracks[key] for key in sorted(run.tracks)]}

