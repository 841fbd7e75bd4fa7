"""Detect and track objects through a video with a DETR checkpoint.

    detr-track clip.mp4 --checkpoint run/checkpoints/best.ckpt --out outputs/tracks
    detr-track frames/ --checkpoint C --out OUT --tracker sort          # a folder of frames, in name order
    detr-track 0 --checkpoint C --out OUT                               # webcam 0
    detr-track rtsp://camera.local/stream --checkpoint C --out OUT      # a stream (rtsp, http ...)

Writes OUT/tracks.txt (MOTChallenge: frame, id, x, y, w, h, score, class, -1, -1; frames 1-based, the data set's
category ids), OUT/tracks.json (every track's class and boxes, and the run's settings) and OUT/tracks.mp4 (each
track's box, id and trail drawn; --no-draw leaves it out). Video needs the `video` extra (PyAV), tracking the
`tracking` extra (Roboflow's trackers): pip install 'detr-lightning[video,tracking]'.
The tracker's thresholds come from the checkpoint's score threshold (the one its validation found best, else 0.7;
--threshold overrides it): a detection above it can start a track; ByteTrack, OC-SORT and BoT-SORT also use
detections down to a sixth of it to keep tracks they have (docs/measurements/tracking.md compares the trackers).
A frame that cannot be decoded is skipped and counted. Ctrl-C or SIGTERM stops the run keeping what was written
(the frames done, in all three files; exit status 130 or 143). OUT belongs to one run: see --overwrite.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tqdm import tqdm  # light (no torch); a module attribute that tests replace
from tqdm.contrib.logging import logging_redirect_tqdm

from detr.inference.command_line import (
    Terminated,
    add_checkpoint_argument,
    add_precision_argument,
    add_resize_arguments,
    device_argument,
    interrupted_status,
    one_line_errors,
    positive_int,
    probability,
    sigterm_as_interrupt,
)

#: ``--tracker``'s choices and default (:data:`detr.inference.tracking.TRACKERS` and ``DEFAULT_TRACKER``, written
#: here so that ``--help`` does not import torch).
TRACKER_CHOICES = ("bytetrack", "sort", "ocsort", "botsort")
DEFAULT_TRACKER = "botsort"


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="SOURCE",
                        help="a video file (mp4, avi, mkv ...), a folder of frames, a webcam index (0) or a stream "
                             "URL (rtsp://, http://)")
    add_checkpoint_argument(parser, onnx=True)
    parser.add_argument("--out", required=True, help="output folder (one run's: see --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the outputs of an earlier run in --out (deletes its tracks.* files)")
    parser.add_argument("--tracker", choices=TRACKER_CHOICES, default=DEFAULT_TRACKER,
                        help="Roboflow trackers' BoT-SORT (default), ByteTrack, SORT or OC-SORT")
    parser.add_argument("--threshold", type=probability, default=None,
                        help="score a detection needs to start a track (default: the one the checkpoint's "
                             "validation found best, else 0.7)")
    parser.add_argument("--trail", type=positive_int, default=30, metavar="FRAMES",
                        help="frames of each track's trail drawn (default 30)")
    parser.add_argument("--no-draw", action="store_true", help="write only tracks.txt and tracks.json")
    add_resize_arguments(parser)
    parser.add_argument("--device", type=device_argument, default=None,
                        help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_precision_argument(parser)
    parser.add_argument("--batch-size", type=positive_int, default=1, help="frames per forward pass")
    args = parser.parse_args(argv)
    # after parsing, so that --help does not wait for torch
    from detr.data.video import VideoSourceError
    from detr.inference.predictor import Predictor
    from detr.inference.track_outputs import track_video
    from detr.inference.tracking import TrackerError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    predictor = Predictor.from_checkpoint(
        args.checkpoint, device=args.device, precision=args.precision, threshold=args.threshold,
        batch_size=args.batch_size, min_size=args.min_size, max_size=args.max_size)
    print(f"backend: {predictor.backend}; tracker {args.tracker}, threshold {predictor.threshold:g} "
          f"({predictor.threshold_source})")
    bar = None

    def progress(frames, total):
        nonlocal bar
        bar = tqdm(frames, total=total, unit="frame", desc="track")
        return bar

    try:
        with sigterm_as_interrupt(), logging_redirect_tqdm():  # skipped frames' warnings print above the bar
            run = track_video(predictor, args.source, args.out, tracker=args.tracker, draw=not args.no_draw,
                              trail_length=args.trail, progress=progress, overwrite=args.overwrite,
                              overwrite_flag="--overwrite", elsewhere="another --out")
    except (VideoSourceError, TrackerError) as error:  # the message names the source or the package, and the fix
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # track_video wrote what was done and released --out
        print(f"\n{'SIGTERM' if isinstance(stop, Terminated) else 'Ctrl-C'}: stopped; the frames tracked so far "
              f"are in {args.out}/tracks.txt, tracks.json" + ("" if args.no_draw else " and tracks.mp4"),
              file=sys.stderr)
        return interrupted_status(stop)
    finally:
        if bar is not None:
            bar.close()
    skipped = f", {run.skipped} skipped (could not be decoded)" if run.skipped else ""
    failed = f", {run.failed} without predictions (outputs not finite)" if run.failed else ""
    print(f"{run.frames} frames{skipped}{failed} in {run.seconds:.1f} s ({run.frame_rate:.1f} frames/s), "
          f"{len(run.tracks)} tracks -> {run.tracks_txt}, {run.tracks_json}" + (f", {run.video}" if run.video else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
