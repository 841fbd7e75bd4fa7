"""Detect objects in image files with a DETR checkpoint.

    detr-predict data/photos more/*.jpg one.png --checkpoint detr-r50 --out outputs/pred
    detr-predict --checkpoint list      # the released models' names
    detr-predict data/photos --checkpoint detr-r50-panoptic --task panoptic --out outputs/pan
    detr-predict aerial/*.jpg --checkpoint run/checkpoints/best.ckpt --slice 640 --out outputs/tiles
    detr-predict photos --checkpoint grounding-dino-tiny/ --prompt "a cat. a remote control." --out outputs/cats

Writes OUT/predictions.json (one COCO results json with file names, the data set's category ids) and
OUT/<name>.jpg with boxes, names and scores drawn. A file that cannot be read or predicted (too thin to
resize, outputs not finite) is reported and skipped; the exit status is then 1 and the skipped files are listed.
With --task panoptic (a panoptic checkpoint) it also writes OUT/panoptic/<name>.png (COCO panoptic PNGs,
id = R + 256*G + 256^2*B) and OUT/panoptic.json (COCO panoptic results), and draws the segments; with
--task instances predictions.json also holds each detection's mask (COCO RLE "segmentation"), drawn too.
OUT belongs to one run: a second run into it is refused while the first writes, and afterwards unless
--overwrite, which deletes the earlier run's files (drawings included; OUT/outputs.txt lists them) first.
--prompt names what an open-vocabulary checkpoint (a transformers Grounding DINO directory) detects; each box
is drawn with the prompt's words it was found for, and predictions.json's category_id is the prompt's phrase
(0-based). --slice SIZE predicts overlapping tiles of each image and the whole image, and merges them (small objects on
large images: docs/guides/large-images.md).
Ctrl-C or SIGTERM stops the run with predictions.json holding the images done so far (exit status 130 or 143).
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from pathlib import Path

from tqdm import tqdm  # light (no torch); a module attribute that tests replace
from tqdm.contrib.logging import logging_redirect_tqdm

from detr.inference.command_line import (
    Terminated,
    add_checkpoint_argument,
    add_precision_argument,
    add_resize_arguments,
    add_slice_arguments,
    device_argument,
    interrupted_status,
    positive_int,
    probability,
    report_skipped,
    sigterm_as_interrupt,
    slice_settings,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders or glob patterns")
    add_checkpoint_argument(parser, onnx=True)
    parser.add_argument("--out", required=True, help="output folder (one run's: see --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the outputs of an earlier run in --out (deletes its json and drawings)")
    parser.add_argument("--threshold", type=probability, default=None,
                        help="score threshold (default: the one the checkpoint's validation found best, else 0.7; "
                             "0.25 with --prompt)")
    parser.add_argument("--prompt", default=None,
                        help='what to detect, for an open-vocabulary checkpoint: "a cat. a remote control."')
    parser.add_argument("--text-threshold", type=probability, default=0.25,
                        help="with --prompt: the score a word needs to be part of a box's phrase (default 0.25)")
    parser.add_argument("--all-queries", action="store_true", help="write every query to the json (for COCO eval)")
    add_resize_arguments(parser)
    add_slice_arguments(parser)
    parser.add_argument("--device", type=device_argument, default=None,
                        help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_precision_argument(parser)
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--no-draw", action="store_true", help="write only the json (and panoptic PNGs)")
    parser.add_argument("--task", choices=("detection", "instances", "panoptic"), default="detection",
                        help="instances: masks in predictions.json and drawn (a checkpoint with masks: "
                             "detr-r50-panoptic, RF-DETR's instance segmentation); panoptic: also segment each "
                             "image (a panoptic checkpoint, e.g. detr-r50-panoptic)")
    parser.add_argument("--panoptic-threshold", type=probability, default=None,
                        help="class probability a query needs to get a panoptic segment (default: the one the "
                             "checkpoint's training run validated with, else the authors' 0.85)")
    parser.add_argument("--panoptic-overlap", type=probability, default=None,
                        help="drop a thing segment that keeps less than this share of its own mask (Mask2Former's "
                             "filter, e.g. 0.8; default: the checkpoint's training run's, else none)")
    args = parser.parse_args(argv)
    # after parsing, so that --help does not wait for torch
    from detr.checkpoints.formats import CheckpointError
    from detr.inference.outputs import collect_image_paths, predict_files
    from detr.inference.predictor import Predictor
    from detr.output_folder import OutputFolderError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    try:
        paths = collect_image_paths(args.inputs)
    except ValueError as error:
        parser.error(str(error))
    try:
        predictor = Predictor.from_checkpoint(
            args.checkpoint, device=args.device, precision=args.precision, threshold=args.threshold,
            batch_size=args.batch_size, min_size=args.min_size, max_size=args.max_size,
            panoptic_threshold=args.panoptic_threshold, panoptic_overlap_threshold=args.panoptic_overlap,
        )
    except CheckpointError as error:  # the message names the file and the fix; a traceback would bury it
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        predictor.check_task(args.task)
    except ValueError as error:
        parser.error(f"--task {args.task} with {args.checkpoint}: {error}")
    try:
        predictor.check_prompt(args.prompt, task=args.task, slice=slice_settings(args))
    except ValueError as error:
        parser.error(f"--prompt with {args.checkpoint}: {error}")
    try:
        tiles = predictor.check_slice(slice_settings(args), task=args.task)
    except ValueError as error:
        parser.error(f"--slice {args.slice} with --task {args.task}: {error}")
    print(f"backend: {predictor.backend}; threshold {predictor.threshold:g} ({predictor.threshold_source})")
    batches = -(-len(paths) // args.batch_size)
    try:
        # warnings about skipped files print above the progress bar
        with sigterm_as_interrupt(), logging_redirect_tqdm():
            run = predict_files(
                predictor, paths, args.out, all_queries=args.all_queries, draw=not args.no_draw,
                progress=partial(tqdm, total=batches, unit="batch", desc="predict"), task=args.task,
                overwrite=args.overwrite, overwrite_flag="--overwrite", elsewhere="another --out", slice=tiles,
                prompt=args.prompt, text_threshold=args.text_threshold,
            )
    except OutputFolderError as error:
        parser.error(str(error))
    except KeyboardInterrupt as stop:  # predict_files wrote what was done and released --out
        print(f"\n{'SIGTERM' if isinstance(stop, Terminated) else 'Ctrl-C'}: stopped; the images predicted so far "
              f"are in {args.out}/predictions.json", file=sys.stderr)
        return interrupted_status(stop)
    except OSError as error:  # a full disk, a folder that became read-only: what was done is kept, the cause named
        saved = Path(args.out) / "predictions.json"
        kept = (f"{saved} holds the images predicted before it" if saved.is_file() else
                f"{saved} could not be written either")
        where = f" writing {error.filename}" if error.filename else ""
        print(f"error: {error.strerror or error}{where}: the run stopped there; {kept}", file=sys.stderr)
        return 1
    detections = sum(len(p.above(predictor.threshold)) for p in run.predictions)
    written = (f"; every query written ({sum(len(p) for p in run.predictions)}, --all-queries)" if args.all_queries
               else "")
    print(f"{len(run.predictions)} images, {detections} detections above {predictor.threshold:g}{written} -> "
          f"{run.predictions_json}")
    if run.panoptic_json is not None:
        segments = sum(len(p.panoptic.segments_info) for p in run.predictions if p.panoptic is not None)
        print(f"{segments} panoptic segments -> {run.panoptic_json} and {run.panoptic_json.parent / 'panoptic'}")
    return report_skipped(run.skipped)


if __name__ == "__main__":
    sys.exit(main())
