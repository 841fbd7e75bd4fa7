"""Write interactive attention-explorer pages: one self-contained HTML file per image.

    detr-explore photo.jpg --checkpoint detr-r50-e632da11.pth --out explorer/
    detr-explore data/photos/*.png --checkpoint RUN/checkpoints/last.ckpt --out explorer/ --threshold 0.5
    detr-explore --video clip.mp4 --frame 40 --tracks tracks/tracks.json --checkpoint C --out explorer/
    detr-explore photo.jpg --checkpoint grounding-dino-tiny/ --prompt "a cat. a remote control." --out explorer/

Open <out>/<image stem>.html (or <out>/index.html for several images) in any browser; no server or
network is needed. An image that cannot be read or run is reported and skipped (exit status 1), the
other pages are written. The page shows every query's box, decoder cross-attention per layer and head, top-5
classes, boxes per decoder layer, and encoder self-attention for any clicked pixel; for a Deformable DETR, the
clicked query's sampling points per level and head, sized by their weights, instead of the maps.
With --video and --frame N (1-based, as tracks.txt numbers frames), the page is that frame's; with --tracks (the
tracks.json detr-track wrote; --video defaults to its source) each track's box is labelled with its id and drawn
with its trail (--trail frames), and a tracked query's attention is a click away as for any query.
--prompt names what an open-vocabulary checkpoint (a transformers Grounding DINO directory) detects; its pages also
show the clicked query's attention over the prompt's tokens, grouped by phrase, per decoder layer and head.
The pages themselves: detr.visualize.explorer.
"""

from __future__ import annotations

import argparse
import logging
import sys

from detr.inference.command_line import (
    add_checkpoint_argument,
    add_resize_arguments,
    device_argument,
    one_line_errors,
    positive_int,
    probability,
)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="*", metavar="IMAGE")
    add_checkpoint_argument(parser)
    parser.add_argument("--video", default=None,
                        help="a video (file, folder of frames, stream) to open one frame of, with --frame")
    parser.add_argument("--frame", type=positive_int, default=None, help="the frame of --video to explore, 1-based")
    parser.add_argument("--tracks", default=None,
                        help="detr-track's tracks.json: draw the frame's tracks (ids and trails); --video defaults to "
                             "its source")
    parser.add_argument("--trail", type=positive_int, default=30, metavar="FRAMES",
                        help="frames of each track's trail drawn (default 30)")
    parser.add_argument("--out", required=True, help="output folder for the pages")
    parser.add_argument("--threshold", type=probability, default=None,
                        help="initial score threshold of the box display (default: the checkpoint's validated one, "
                             "else 0.7)")
    parser.add_argument("--prompt", default=None,
                        help="what an open-vocabulary checkpoint detects, phrases ended by '.': \"a cat. a remote "
                             "control.\" (a Grounding DINO directory needs it, other checkpoints refuse it)")
    add_resize_arguments(parser)
    parser.add_argument("--device", type=device_argument, default=None, help="default: CUDA when available, else CPU")
    args = parser.parse_args(argv)
    video_mode = args.video is not None or args.tracks is not None or args.frame is not None
    if args.images and video_mode:
        parser.error("give images, or --video/--tracks with --frame, not both")
    if not args.images and not video_mode:
        parser.error("give at least one IMAGE, or --video V --frame N (with --tracks tracks.json for its tracks)")
    if video_mode and args.prompt is not None:
        parser.error("--prompt goes with images, not with --video/--tracks")
    if video_mode and args.frame is None:
        parser.error("--video and --tracks need --frame N, the frame to explore (1-based, as in tracks.txt)")
    from detr.checkpoints import load_checkpoint  # after --help: torch
    from detr.checkpoints.deployed import is_deployed
    from detr.checkpoints.formats import CheckpointError
    from detr.visualize.explorer import write_attention_explorer

    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if is_deployed(args.checkpoint):  # one line, not the PyTorch loader's "not a checkpoint torch can read"
        raise CheckpointError(f"{args.checkpoint} is an exported file: it returns no attention, which the explorer "
                              "shows; pass the PyTorch checkpoint it was exported from")
    if video_mode:
        from detr.data.video import VideoSourceError
        from detr.visualize.explorer.tracks import TrackFileError, read_tracks, write_frame_explorer

        try:
            record = read_tracks(args.tracks) if args.tracks is not None else None
            video = args.video if args.video is not None else record.get("source")  # type: ignore[union-attr]
            if not video:
                parser.error(f"{args.tracks} does not name its video: pass --video")
            page = write_frame_explorer(load_checkpoint(args.checkpoint), video, args.frame, args.out, tracks=record,
                                        trail_length=args.trail, threshold=args.threshold, min_size=args.min_size,
                                        max_size=args.max_size, device=args.device)
        except (TrackFileError, VideoSourceError) as error:  # the message names the option or source and the fix
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"{page} ({page.stat().st_size / 2**20:.1f} MiB)")
        return 0
    model = load_checkpoint(args.checkpoint)
    errors: list[tuple[str, str]] = []
    try:
        pages = write_attention_explorer(
            model, args.images, args.out, threshold=args.threshold, min_size=args.min_size, max_size=args.max_size,
            device=args.device, errors=errors, prompt=args.prompt,
        )
    except ValueError as error:  # the model and the prompt disagree (checked before any image; those are skipped)
        parser.error(f"--prompt with {args.checkpoint}: {error}")
    for page in pages:
        print(f"{page} ({page.stat().st_size / 2**20:.1f} MiB)")
    if errors:  # each was logged with its reason as it was skipped
        print(f"skipped {len(errors)} image(s): {', '.join(image for image, _ in errors)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
