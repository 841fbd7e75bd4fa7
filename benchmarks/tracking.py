"""The trackers of ``detr-track`` compared on synthetic clips: MOTA, IDF1, identity switches, precision, recall and
frames per second, per tracker, against per-frame detection with naive ids (each detection takes the id of the
previous frame's box it overlaps most, IoU >= 0.3, else a new one).

    python benchmarks/tracking.py                              # the replayed detector (below), 8 clips
    python benchmarks/tracking.py --clips 8 --noise 3 --drop 0.15 --false-positive 0.2
    python benchmarks/tracking.py --checkpoint tests/fixtures/tracking/demo_shapes_tracking.pt   # a trained model
    python benchmarks/tracking.py --figure docs/images/tracking.jpg \
        --checkpoint tests/fixtures/tracking/demo_shapes_tracking.pt     # the README's drawn frames, then stops

The clips are :mod:`detr.data.shape_clips`' (moving shapes crossing head-on and passing behind an occluder; seed =
clip number), written as H.264 into ``--data`` and read back through ``detr.data.video``, as detr-track reads a
video. The detector is, by default, tests/helpers_tracking.py's ReplayDetector: the ground truth degraded as a
detector degrades it (box noise, missed and false detections, low scores for half-hidden objects) and fed through
the real Predictor path, so that the trackers are compared on detections of known quality; ``--checkpoint`` runs a
model instead (configs/demo_shapes_tracking_cpu.yaml's, trained on other clips' frames, is
tests/fixtures/tracking/demo_shapes_tracking.pt).

Scoring is motmetrics' (MOTA, IDF1, switches) on the ground truth of every object at least ``--min-visibility``
visible; a tracked box that matches (IoU >= 0.5) only a less visible object is left out, neither right nor wrong
(MOTChallenge's way with objects it does not evaluate). The IoU distances are torchvision's: motmetrics 1.4's own
uses ``np.asfarray``, which NumPy 2 removed. Prints a Markdown table; docs/measurements/tracking.md shows one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import box_iou

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers_tracking, run as a script from a clone

from detr.data.shape_clips import ClipConfig, ClipObject, write_clip  # noqa: E402
from detr.data.video import open_frames  # noqa: E402
from detr.inference.predictor import Predictor  # noqa: E402
from detr.inference.track_outputs import mot_lines  # noqa: E402
from detr.inference.tracking import TRACKERS, track_frames  # noqa: E402

#: IoU a tracked box needs with a ground-truth box to match it (MOTChallenge's 0.5).
MATCH_IOU = 0.5
#: The naive ids' IoU with the previous frame's box.
NAIVE_IOU = 0.3


def parse_mot(lines: list[str]) -> dict[int, list[tuple[int, list[float], float]]]:
    """MOTChallenge lines → frame → [(id, [x, y, w, h], column 9: visibility for ground truth)]."""
    frames: dict[int, list[tuple[int, list[float], float]]] = {}
    for line in lines:
        values = [float(v) for v in line.split(",")]
        frames.setdefault(int(values[0]), []).append((int(values[1]), values[2:6], values[8]))
    return frames


def _xyxy(boxes: list[list[float]]) -> torch.Tensor:
    xywh = torch.tensor(boxes, dtype=torch.float64).reshape(-1, 4)
    return torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)


def mot_scores(truth: list[list[ClipObject]], track_lines: list[str], *, min_visibility: float = 0.5) -> dict:
    """motmetrics' MOTA, IDF1, identity switches, precision and recall of MOTChallenge ``track_lines`` on a clip's
    ground truth (module docstring: objects below ``min_visibility`` are not evaluated)."""
    import motmetrics

    tracks = parse_mot(track_lines)
    accumulator = motmetrics.MOTAccumulator(auto_id=True)
    for frame, objects in enumerate(truth, start=1):
        evaluated = [o for o in objects if o.visibility >= min_visibility]
        hidden = [o for o in objects if o.visibility < min_visibility]
        hypotheses = tracks.get(frame, [])
        boxes = _xyxy([h[1] for h in hypotheses])
        if hidden and hypotheses:  # a box on an object not evaluated, and on no evaluated one: left out
            on_hidden = box_iou(boxes, torch.tensor([o.box_xyxy for o in hidden], dtype=torch.float64)) >= MATCH_IOU
            on_evaluated = (box_iou(boxes, torch.tensor([o.box_xyxy for o in evaluated], dtype=torch.float64))
                            >= MATCH_IOU) if evaluated else torch.zeros_like(on_hidden[:, :1])
            keep = ~(on_hidden.any(1) & ~on_evaluated.any(1))
            hypotheses = [h for h, k in zip(hypotheses, keep.tolist()) if k]
            boxes = boxes[keep]
        if evaluated and hypotheses:
            iou = box_iou(torch.tensor([o.box_xyxy for o in evaluated], dtype=torch.float64), boxes).numpy()
            distances = np.where(iou >= MATCH_IOU, 1 - iou, np.nan)
        else:
            distances = np.zeros((len(evaluated), len(hypotheses)))
        accumulator.update([o.track_id for o in evaluated], [h[0] for h in hypotheses], distances)
    summary = motmetrics.metrics.create().compute(
        accumulator, metrics=["mota", "idf1", "num_switches", "precision", "recall"], name="clip")
    row = summary.iloc[0]
    return {"MOTA": 100 * float(row["mota"]), "IDF1": 100 * float(row["idf1"]), "IDSW": int(row["num_switches"]),
            "precision": 100 * float(row["precision"]), "recall": 100 * float(row["recall"])}


def naive_track_lines(predictor: Predictor, source: str | Path) -> list[str]:
    """Per-frame detection (the predictor's threshold) with naive ids: each detection, in score order, takes the id
    of the previous frame's box it overlaps most (IoU >= :data:`NAIVE_IOU`, each id once), else a new one."""
    lines, previous, previous_ids, next_id = [], torch.zeros(0, 4), [], 1
    frames = list(open_frames(source))
    predictions = [prediction for start in range(0, len(frames), predictor.batch_size)
                   for prediction in predictor.predict_arrays(
                       [frame.array for frame in frames[start : start + predictor.batch_size]],
                       threshold=predictor.threshold)]
    for frame, prediction in zip(frames, predictions):
        order = prediction.scores.argsort(descending=True)
        ids = torch.zeros(len(prediction), dtype=torch.int64)
        iou = box_iou(prediction.boxes, previous) if len(previous) else torch.zeros(len(prediction), 0)
        taken: set[int] = set()
        for index in order.tolist():
            candidates = [j for j in iou[index].argsort(descending=True).tolist()
                          if iou[index, j] >= NAIVE_IOU and j not in taken]
            if candidates:
                taken.add(candidates[0])
                ids[index] = previous_ids[candidates[0]]
            else:
                ids[index], next_id = next_id, next_id + 1
        previous, previous_ids = prediction.boxes, ids.tolist()
        prediction.image_id, prediction.track_ids = frame.index + 1, ids
        lines += mot_lines(prediction)
    return lines


def tracker_lines(predictor: Predictor, source: str | Path, tracker: str) -> list[str]:
    """``detr-track``'s MOTChallenge lines of ``source`` with ``tracker``."""
    with open_frames(source) as frames:
        return [line for _, prediction in track_frames(predictor, frames, tracker=tracker,
                                                       frame_rate=frames.frame_rate)
                for line in mot_lines(prediction)]


def draw_figure(path: Path, folder: Path, frames: tuple[int, ...] = (25, 50, 75), checkpoint: str | None = None
                ) -> Path:
    """Three frames (0-based) of detr-track's drawn video of a 384 x 256 clip, side by side, with ByteTrack and
    the replayed detector or the ``checkpoint``'s model: the README's figure."""
    from PIL import Image

    from detr.inference.track_outputs import track_video
    from tests.helpers_tracking import ReplayDetector

    config = ClipConfig(num_frames=max(frames) + 1, height=256, width=384, num_objects=6, crossing_pairs=2,
                        min_object_size=40, max_object_size=64, max_speed=6, occluder_width=28, seed=0)
    clip = folder / "figure_clip.mp4"
    truth = write_clip(clip, config)
    predictor = (Predictor.from_checkpoint(checkpoint, device="cpu") if checkpoint is not None else
                 Predictor(ReplayDetector(truth, height=config.height, width=config.width), device="cpu"))
    track_video(predictor, clip, folder / "figure", overwrite=True)
    with open_frames(folder / "figure" / "tracks.mp4") as video:
        drawn = [frame.array for frame in video if frame.index in frames]
    Image.fromarray(np.concatenate(drawn, axis=1)).save(path, quality=90)
    return path


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--frames", type=int, default=120, help="frames per clip")
    parser.add_argument("--objects", type=int, default=6)
    parser.add_argument("--data", type=Path, default=Path("outputs/tracking_clips"))
    parser.add_argument("--trackers", nargs="+", default=list(TRACKERS), choices=TRACKERS)
    parser.add_argument("--checkpoint", default=None, help="a model to detect with (default: the replayed detector)")
    parser.add_argument("--noise", type=float, default=1.5, help="replayed detector: box noise, px")
    parser.add_argument("--drop", type=float, default=0.05, help="replayed detector: share of missed detections")
    parser.add_argument("--false-positive", type=float, default=0.05,
                        help="replayed detector: chance of a false box per frame")
    parser.add_argument("--min-visibility", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--figure", type=Path, default=None, help="write the README's figure here and stop")
    args = parser.parse_args(argv)
    if args.figure is not None:
        args.data.mkdir(parents=True, exist_ok=True)
        print(draw_figure(args.figure, args.data, checkpoint=args.checkpoint))
        return []

    def predictor(truth: list[list[ClipObject]], config: ClipConfig, seed: int) -> Predictor:
        if args.checkpoint is not None:
            return Predictor.from_checkpoint(args.checkpoint, device="cpu", batch_size=args.batch_size)
        from tests.helpers_tracking import ReplayDetector

        return Predictor(ReplayDetector(truth, height=config.height, width=config.width, noise=args.noise,
                                        drop=args.drop, false_positive=args.false_positive, seed=seed),
                         device="cpu", batch_size=args.batch_size)

    methods = ["naive ids", *args.trackers]
    totals = {method: {"MOTA": [], "IDF1": [], "IDSW": 0, "precision": [], "recall": [], "frames": 0, "seconds": 0.0}
              for method in methods}
    args.data.mkdir(parents=True, exist_ok=True)
    for clip in range(args.clips):
        config = ClipConfig(num_frames=args.frames, num_objects=args.objects,
                            crossing_pairs=min(2, args.objects // 2), seed=clip)
        path = args.data / f"clip{clip:02d}.mp4"
        truth = write_clip(path, config)
        for method in methods:
            start = time.perf_counter()
            lines = (naive_track_lines(predictor(truth, config, clip), path) if method == "naive ids" else
                     tracker_lines(predictor(truth, config, clip), path, method))
            seconds = time.perf_counter() - start
            scores = mot_scores(truth, lines, min_visibility=args.min_visibility)
            total = totals[method]
            for key in ("MOTA", "IDF1", "precision", "recall"):
                total[key].append(scores[key])
            total["IDSW"] += scores["IDSW"]
            total["frames"] += args.frames
            total["seconds"] += seconds
    rows = [{"method": method, **{key: float(np.mean(totals[method][key]))
                                  for key in ("MOTA", "IDF1", "precision", "recall")},
             "IDSW": totals[method]["IDSW"], "fps": totals[method]["frames"] / totals[method]["seconds"]}
            for method in methods]
    detector = args.checkpoint or (f"replayed ground truth (noise {args.noise:g} px, drop {args.drop:g}, "
                                   f"false positive {args.false_positive:g})")
    print(f"{args.clips} clips of {args.frames} frames, {args.objects} objects; detector: {detector}\n")
    print("| tracker | MOTA | IDF1 | ID switches | precision | recall | frames/s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        fps = "—" if row["method"] == "naive ids" else f"{row['fps']:.0f}"  # no tracker: its loop is not comparable
        print(f"| {row['method']} | {row['MOTA']:.1f} | {row['IDF1']:.1f} | {row['IDSW']} | {row['precision']:.1f} "
              f"| {row['recall']:.1f} | {fps} |")
    return rows


if __name__ == "__main__":
    main()
